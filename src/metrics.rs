//! Prometheus metrics, served by the admin listener at `/metrics`.
//!
//! Counters are resolved per route once at start, so recording an outcome on the request
//! path is an atomic increment, not a label lookup with allocations.

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// How a request through a route ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Claimed and sent upstream (whatever the upstream answered).
    Executed,
    /// Answered from the store.
    Replayed,
    /// Key reused with a different request (422).
    Mismatch,
    /// First request still running after the wait (409).
    InFlight,
    /// Bad key, too large or unreadable body (400, 413).
    Rejected,
    /// Store down, route fails closed (503).
    StoreUnavailable,
    /// Store down, route fails open: forwarded without protection.
    Bypassed,
    /// Route without idempotency, or optional key absent.
    PassedThrough,
    /// Upstream unreachable, failed or timed out (502, 504).
    UpstreamFailed,
    /// A gateway bug (500).
    Internal,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Mismatch => "mismatch",
            Self::InFlight => "in_flight",
            Self::Rejected => "rejected",
            Self::StoreUnavailable => "store_unavailable",
            Self::Bypassed => "bypassed",
            Self::PassedThrough => "passed_through",
            Self::UpstreamFailed => "upstream_failed",
            Self::Internal => "internal",
        }
    }

    const ALL: [Outcome; 10] = [
        Self::Executed,
        Self::Replayed,
        Self::Mismatch,
        Self::InFlight,
        Self::Rejected,
        Self::StoreUnavailable,
        Self::Bypassed,
        Self::PassedThrough,
        Self::UpstreamFailed,
        Self::Internal,
    ];
}

/// Why a claim was released instead of completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    /// The upstream's status is not in `store_statuses` (5xx by default).
    Status,
    /// The response body is larger than `max_stored_body`.
    TooLarge,
    /// Transport failure or timeout.
    UpstreamFailed,
    /// The gateway shut down before the exchange finished.
    Shutdown,
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl ReleaseReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::TooLarge => "too_large",
            Self::UpstreamFailed => "upstream_failed",
            Self::Shutdown => "shutdown",
        }
    }
}

impl EncodeLabelValue for ReleaseReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteOutcome {
    route: String,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: ReleaseReason,
}

/// The registry and the metric families in it.
pub struct Metrics {
    registry: Registry,
    requests: Family<RouteOutcome, Counter>,
    unmatched: Counter,
    released: Family<RouteReason, Counter>,
    lease_lost: Family<RouteLabel, Counter>,
    store_errors: Family<RouteLabel, Counter>,
    store_write_failed: Family<RouteLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("idemgate");
        let requests = Family::default();
        registry.register("requests", "Requests by route and outcome", requests.clone());
        let unmatched = Counter::default();
        registry.register("unmatched_requests", "Requests that matched no route (404)", unmatched.clone());
        let released = Family::default();
        registry.register("released", "Claims released instead of stored, by reason", released.clone());
        let lease_lost = Family::default();
        registry.register(
            "lease_lost",
            "Leases found taken over or gone while their request ran; the upstream's constraint covers these",
            lease_lost.clone(),
        );
        let store_errors = Family::default();
        registry.register("store_errors", "Store calls that failed or timed out", store_errors.clone());
        let store_write_failed = Family::default();
        registry.register(
            "store_write_failed",
            "Upstream answers that could not be stored or released (client still answered)",
            store_write_failed.clone(),
        );
        Self { registry, requests, unmatched, released, lease_lost, store_errors, store_write_failed }
    }
}

impl Metrics {
    /// Counters of one route, resolved once.
    pub fn route(&self, route: &str) -> RouteMetrics {
        let label = RouteLabel { route: route.to_owned() };
        RouteMetrics {
            outcomes: Outcome::ALL
                .map(|outcome| self.requests.get_or_create(&RouteOutcome { route: route.to_owned(), outcome }).clone()),
            released: [
                ReleaseReason::Status,
                ReleaseReason::TooLarge,
                ReleaseReason::UpstreamFailed,
                ReleaseReason::Shutdown,
            ]
            .map(|reason| self.released.get_or_create(&RouteReason { route: route.to_owned(), reason }).clone()),
            lease_lost: self.lease_lost.get_or_create(&label).clone(),
            store_errors: self.store_errors.get_or_create(&label).clone(),
            store_write_failed: self.store_write_failed.get_or_create(&label).clone(),
        }
    }

    /// Exposes the store's count of detected data losses (Redis only).
    pub fn register_store_data_loss(&mut self, counter: Counter) {
        self.registry.register(
            "store_data_loss",
            "Times this gateway saw Redis lose its records (epoch marker gone); retries of earlier requests then reach the upstream",
            counter,
        );
    }

    /// Counts a request that matched no route.
    pub fn unmatched(&self) {
        self.unmatched.inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String only fails if a metric's own encoder fails; ours do not.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Pre-resolved counters of one route.
#[derive(Clone)]
pub struct RouteMetrics {
    outcomes: [Counter; 10],
    released: [Counter; 4],
    lease_lost: Counter,
    store_errors: Counter,
    store_write_failed: Counter,
}

impl RouteMetrics {
    /// Counts a finished request.
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }

    /// Counts a released claim.
    pub fn released(&self, reason: ReleaseReason) {
        self.released[reason as usize].inc();
    }

    /// Counts a lease found lost.
    pub fn lease_lost(&self) {
        self.lease_lost.inc();
    }

    /// Counts a failed store call.
    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    /// Counts an answer that could not be stored.
    pub fn store_write_failed(&self) {
        self.store_write_failed.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_per_route_and_exposed() {
        let m = Metrics::default();
        let orders = m.route("create-order");
        orders.outcome(Outcome::Replayed);
        orders.outcome(Outcome::Replayed);
        orders.outcome(Outcome::Executed);
        orders.released(ReleaseReason::Status);
        let text = m.encode();
        assert!(text.contains(r#"idemgate_requests_total{route="create-order",outcome="replayed"} 2"#), "{text}");
        assert!(text.contains(r#"idemgate_requests_total{route="create-order",outcome="executed"} 1"#), "{text}");
        assert!(text.contains(r#"idemgate_released_total{route="create-order",reason="status"} 1"#), "{text}");
    }
}
