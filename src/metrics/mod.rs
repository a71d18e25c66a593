//! Prometheus metrics, served by the admin listener at `/metrics`.
//!
//! Counters are resolved per route once at start, so recording an outcome on the request
//! path is an atomic increment, not a label lookup with allocations.

mod exposition;
mod instance;
mod labels;
mod route;
mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use self::instance::{InstanceMetrics, Instances};
pub use self::labels::{Outcome, Pin, Reconciliation, ReleaseReason, UPSTREAM_CLASSES, Would, status_class};
use self::route::{FirstObserved, PerLabel};
pub use self::route::{Pins, Produces, RouteMetrics};

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
struct RouteClass {
    route: String,
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteResult {
    route: String,
    result: Reconciliation,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteWould {
    route: String,
    would: Would,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RoutePin {
    route: String,
    pin: Pin,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: ReleaseReason,
}

/// The lowest bucket bound of every latency histogram, in seconds.
const LATENCY_START: f64 = 0.0005;
/// How many finite buckets a latency histogram has, each twice the one before.
const LATENCY_BUCKETS: u16 = 16;

/// The buckets of every latency histogram, in seconds: 0.5ms to about 16s, doubling.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(LATENCY_START, 2.0, LATENCY_BUCKETS))
}

/// How many upstream answers (classes 2xx to 5xx) a route needs before its p90 is used.
pub const QUANTILE_MIN_SAMPLES: u64 = 20;

/// A route's upstream answer times, counted in the buckets of its `upstream_seconds`
/// histogram, for the one quantile the request path reads (a duplicate's `Retry-After`).
///
/// prometheus-client does not expose a histogram's bucket counts (only `observe` and the
/// encoder), so the same buckets are counted here as well: one atomic increment per exchange,
/// no lock. Like the exported histogram it counts since the process started.
#[derive(Debug)]
pub struct LatencyQuantiles {
    /// Upper bounds, in seconds; the last bucket (+Inf) has none.
    bounds: Vec<f64>,
    /// One count per bound, and one more for +Inf.
    counts: Vec<AtomicU64>,
}

impl Default for LatencyQuantiles {
    fn default() -> Self {
        let bounds: Vec<f64> = exponential_buckets(LATENCY_START, 2.0, LATENCY_BUCKETS).collect();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self { bounds, counts }
    }
}

impl LatencyQuantiles {
    /// Counts one answer time.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = self.bounds.iter().position(|&bound| seconds <= bound).unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The `q` quantile (0 < q ≤ 1) as Prometheus's `histogram_quantile` estimates it from the
    /// buckets (linear within the bucket it falls in; the highest finite bound when it falls
    /// in +Inf); none with fewer than `min_samples` counted.
    pub fn quantile(&self, q: f64, min_samples: u64) -> Option<Duration> {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 || total < min_samples {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (i, &count) in counts.iter().enumerate() {
            if count > 0 && (below + count) as f64 >= rank {
                let Some(&upper) = self.bounds.get(i) else {
                    return self.bounds.last().map(|&top| Duration::from_secs_f64(top));
                };
                let lower = if i == 0 { 0.0 } else { self.bounds[i - 1] };
                let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                return Some(Duration::from_secs_f64(lower + (upper - lower) * within));
            }
            below += count;
        }
        self.bounds.last().map(|&top| Duration::from_secs_f64(top))
    }
}

/// The registry and the metric families in it.
pub struct Metrics {
    registry: Registry,
    requests: Family<RouteOutcome, Counter>,
    unmatched: Counter,
    /// Mirrors the log writer's count, brought up to date when the metrics are read.
    log_lines_dropped: Counter,
    released: Family<RouteReason, Counter>,
    lease_lost: Family<RouteLabel, Counter>,
    claims_vanished: Family<RouteLabel, Counter>,
    store_errors: Family<RouteLabel, Counter>,
    store_write_failed: Family<RouteLabel, Counter>,
    outcome_unknown: Family<RouteLabel, Counter>,
    not_stored: Family<RouteLabel, Counter>,
    reconciliations: Family<RouteResult, Counter>,
    observed: Family<RouteWould, Counter>,
    pin_hits: Family<RoutePin, Counter>,
    unknown_records: Family<RouteLabel, Gauge>,
    request_seconds: Family<RouteOutcome, Histogram>,
    upstream_seconds: Family<RouteClass, Histogram>,
    /// Each route's upstream answer times again, readable (see [`LatencyQuantiles`]); kept
    /// here, by route name, so that a reload keeps them as it keeps the histograms.
    upstream_quantiles: Mutex<HashMap<String, Arc<LatencyQuantiles>>>,
    /// Upstream exchanges running now (they outlive their clients).
    pub exchanges_running: Gauge,
    /// Duplicates waiting for the first request with their key to settle.
    pub waiting_duplicates: Gauge,
    /// 1 while the store's settings let it evict records (see `store::Settings`).
    pub store_evicts_records: Gauge,
    /// The instances of upstreams with several.
    pub instances: Arc<Instances>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("idemgate");
        let requests = Family::default();
        registry.register("requests", "Requests by route and outcome", requests.clone());
        let unmatched = Counter::default();
        registry.register("unmatched_requests", "Requests that matched no route (404)", unmatched.clone());
        let log_lines_dropped = Counter::default();
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because stderr was not read fast enough (the log buffer was full)",
            log_lines_dropped.clone(),
        );
        let released = Family::default();
        registry.register("released", "Claims released instead of stored, by reason", released.clone());
        let lease_lost = Family::default();
        registry.register(
            "lease_lost",
            "Claims found taken over by another request (a later attempt) while their request ran, each counted once; the upstream's constraint covers these",
            lease_lost.clone(),
        );
        let claims_vanished = Family::default();
        registry.register(
            "claims_vanished",
            "Claims found gone from the store while their request ran, nobody having taken them over (a failover to a replica that had not caught up, a restart, an eviction), each counted once; a retry may run the request again as attempt 1",
            claims_vanished.clone(),
        );
        let store_errors = Family::default();
        registry.register("store_errors", "Store calls that failed or timed out", store_errors.clone());
        let store_write_failed = Family::default();
        registry.register(
            "store_write_failed",
            "Upstream answers that could not be stored or released (client still answered)",
            store_write_failed.clone(),
        );
        let outcome_unknown = Family::default();
        registry.register(
            "outcome_unknown",
            "Requests sent upstream without a complete answer, whose keys are held as unknown",
            outcome_unknown.clone(),
        );
        let not_stored = Family::default();
        registry.register(
            "not_stored",
            "Responses delivered but too large to store; their keys answer response-not-stored",
            not_stored.clone(),
        );
        let reconciliations = Family::default();
        registry.register(
            "reconciliations",
            "Lookups of unknown outcomes, by result: found (replayed from now on), not_found (released), failed, too_early",
            reconciliations.clone(),
        );
        let observed = Family::default();
        registry.register(
            "observed",
            "Requests on routes in observe mode, by what enforcement would have done (first, would_replay, would_conflict, would_reject_reuse, missing_key, ...)",
            observed.clone(),
        );
        let pin_hits = Family::default();
        registry.register(
            "identity_pin_hits",
            "Keyed requests whose record was named by a pin of the route's identity (name, host) or matched only under its previous fingerprint: a pin can go once this stays 0 for a retention",
            pin_hits.clone(),
        );
        let unknown_records = Family::default();
        registry.register(
            "unknown_records",
            "Records held as unknown, by route, as the store's index counts them (refreshed at each scrape)",
            unknown_records.clone(),
        );
        let request_seconds = Family::<RouteOutcome, Histogram>::new_with_constructor(latency_histogram);
        registry.register("request_seconds", "Request duration, by route and outcome", request_seconds.clone());
        let upstream_seconds = Family::<RouteClass, Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "upstream_seconds",
            "Upstream exchange duration on idempotent routes (request sent to answer read), by route and status class",
            upstream_seconds.clone(),
        );
        let exchanges_running = Gauge::default();
        registry.register("exchanges_running", "Upstream exchanges running now", exchanges_running.clone());
        let waiting_duplicates = Gauge::default();
        registry.register(
            "waiting_duplicates",
            "Duplicates waiting for the first request with their key to settle",
            waiting_duplicates.clone(),
        );
        let store_evicts_records = Gauge::default();
        registry.register(
            "store_evicts_records",
            "1 while Redis's maxmemory-policy lets it evict records (an answer lost, its retry run again); 0 otherwise or when it cannot be read",
            store_evicts_records.clone(),
        );
        let instances = Arc::new(Instances::default());
        instances.register(&mut registry);
        Self {
            instances,
            store_evicts_records,
            request_seconds,
            upstream_seconds,
            upstream_quantiles: Mutex::default(),
            exchanges_running,
            waiting_duplicates,
            registry,
            requests,
            unmatched,
            log_lines_dropped,
            released,
            lease_lost,
            claims_vanished,
            store_errors,
            store_write_failed,
            outcome_unknown,
            not_stored,
            reconciliations,
            observed,
            pin_hits,
            unknown_records,
        }
    }
}

/// One unit of a gauge, held until dropped: the gauge comes down on every path, also when the
/// future holding it is dropped (a client that hangs up while it waits).
pub struct GaugeHold(Gauge);

impl GaugeHold {
    /// Raises `gauge` by one until the hold is dropped.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeHold {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// Sets the count of records held as unknown on `route`.
    pub fn set_unknown_records(&self, route: &str, count: u64) {
        let gauge = self.unknown_records.get_or_create(&RouteLabel { route: route.to_owned() });
        gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counters of one route, resolved once. Each label set the route can produce is
    /// registered at once (at zero, so that `increase()` sees its first count); one it cannot
    /// produce gets a counter that is never exposed (see [`Produces`]). The request latency
    /// by outcome is registered by its first observation: what it counts is counted at zero
    /// in `idemgate_requests_total`, and a quantile needs no zero series. The upstream
    /// latency is registered at once, per class: its counts are the only ones by class.
    pub fn route(&self, route: &str, produces: Produces) -> RouteMetrics {
        let label = RouteLabel { route: route.to_owned() };
        let shown = |yes: bool, family: &Family<RouteLabel, Counter>| {
            if yes { family.get_or_create(&label).clone() } else { Counter::default() }
        };
        let idempotent = produces.idempotent;
        RouteMetrics {
            outcomes: PerLabel::new(|outcome| {
                let label = RouteOutcome { route: route.to_owned(), outcome };
                if produces.outcome(outcome) { self.requests.get_or_create(&label).clone() } else { Counter::default() }
            }),
            released: PerLabel::new(|reason| {
                let label = RouteReason { route: route.to_owned(), reason };
                if idempotent { self.released.get_or_create(&label).clone() } else { Counter::default() }
            }),
            lease_lost: shown(idempotent, &self.lease_lost),
            claims_vanished: shown(idempotent, &self.claims_vanished),
            store_errors: shown(idempotent, &self.store_errors),
            store_write_failed: shown(idempotent, &self.store_write_failed),
            outcome_unknown: shown(idempotent, &self.outcome_unknown),
            not_stored: shown(idempotent, &self.not_stored),
            reconciliations: PerLabel::new(|result| {
                let label = RouteResult { route: route.to_owned(), result };
                if produces.reconciles {
                    self.reconciliations.get_or_create(&label).clone()
                } else {
                    Counter::default()
                }
            }),
            observed: PerLabel::new(|would| {
                let label = RouteWould { route: route.to_owned(), would };
                if produces.observes { self.observed.get_or_create(&label).clone() } else { Counter::default() }
            }),
            pin_hits: PerLabel::new(|pin| {
                let label = RoutePin { route: route.to_owned(), pin };
                if produces.pins(pin) { self.pin_hits.get_or_create(&label).clone() } else { Counter::default() }
            }),
            request_seconds: PerLabel::new(|outcome| {
                let label = RouteOutcome { route: route.to_owned(), outcome };
                let family = produces.outcome(outcome).then(|| self.request_seconds.clone());
                FirstObserved::new(move || {
                    family.as_ref().map_or_else(latency_histogram, |f| f.get_or_create(&label).clone())
                })
            }),
            // Only the classes the route can produce are exposed: `abandoned` (an exchange
            // given up at shutdown) on idempotent routes, `1xx` (a bridged upgrade's 101) where
            // requests pass through; the others stay unregistered.
            upstream_seconds: UPSTREAM_CLASSES
                .iter()
                .map(|&class| {
                    let produced = match class {
                        "abandoned" => produces.idempotent,
                        "1xx" => produces.keyless || produces.observes,
                        _ => true,
                    };
                    let histogram = if produced {
                        self.upstream_seconds.get_or_create(&RouteClass { route: route.to_owned(), class }).clone()
                    } else {
                        latency_histogram()
                    };
                    (class, histogram)
                })
                .collect(),
            upstream_quantiles: Arc::clone(
                self.upstream_quantiles
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(route.to_owned())
                    .or_default(),
            ),
        }
    }

    /// Exposes the counts of spans the trace exporter dropped, by reason (`queue_full`,
    /// `export_failed`).
    pub fn register_telemetry_drops(
        &mut self,
        family: Family<
            impl EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
            Counter,
        >,
    ) {
        self.registry.register(
            "telemetry_spans_dropped",
            "Spans not exported, by reason: the queue was full (queue_full), or their export failed (export_failed: the collector down, slow or refusing)",
            family,
        );
    }

    /// Counts a request that matched no route.
    pub fn unmatched(&self) {
        self.unmatched.inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let (dropped, shown) = (crate::log_writer::dropped_lines(), self.log_lines_dropped.get());
        if dropped > shown {
            self.log_lines_dropped.inc_by(dropped - shown);
        }
        let mut out = String::new();
        // Encoding into a String only fails if a metric's own encoder fails; ours do not.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        exposition::sorted(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::labels::Label;
    use super::*;

    fn indices_are_positions<L: Label + PartialEq + std::fmt::Debug>() {
        for (i, label) in L::ALL.iter().enumerate() {
            assert_eq!(label.index(), i, "{label:?}");
        }
    }

    #[test]
    fn every_label_has_its_own_counter() {
        indices_are_positions::<Outcome>();
        indices_are_positions::<ReleaseReason>();
        indices_are_positions::<Reconciliation>();
        indices_are_positions::<Would>();
    }

    #[test]
    fn the_upstream_p90_needs_enough_answers_and_interpolates_like_prometheus() {
        let m = Metrics::default();
        let route = m.route("r", Produces::PLAIN);
        for _ in 0..19 {
            route.upstream_latency("2xx", Duration::from_millis(200));
        }
        route.upstream_latency("error", Duration::from_millis(200));
        route.upstream_latency("abandoned", Duration::from_millis(200));
        assert_eq!(route.upstream_p90(), None, "19 answers, errors and abandoned exchanges do not count");
        route.upstream_latency("5xx", Duration::from_millis(200));
        // All 20 in (0.128, 0.256]: the p90 is 90% of the way through that bucket.
        let p90 = route.upstream_p90().unwrap().as_secs_f64();
        assert!((p90 - (0.128 + 0.128 * 0.9)).abs() < 1e-9, "{p90}");
        // A reload resolves the route again and keeps what was counted.
        assert!(m.route("r", Produces::PLAIN).upstream_p90().is_some());
        assert_eq!(m.route("other", Produces::PLAIN).upstream_p90(), None);
    }

    #[test]
    fn quantiles_beyond_the_last_bucket_are_its_bound() {
        let q = LatencyQuantiles::default();
        for _ in 0..20 {
            q.observe(Duration::from_secs(100));
        }
        assert_eq!(q.quantile(0.9, 21), None, "20 counted");
        assert_eq!(q.quantile(0.9, 20), Some(Duration::from_secs_f64(LATENCY_START * 2f64.powi(15))));
        let small = LatencyQuantiles::default();
        for _ in 0..20 {
            small.observe(Duration::from_micros(100));
        }
        assert!(small.quantile(0.9, 20).unwrap() <= Duration::from_secs_f64(LATENCY_START));
    }

    #[test]
    fn outcomes_are_counted_per_route_and_exposed() {
        let m = Metrics::default();
        let orders = m.route("create-order", IDEMPOTENT);
        orders.outcome(Outcome::Replayed);
        orders.outcome(Outcome::Replayed);
        orders.outcome(Outcome::Executed);
        orders.released(ReleaseReason::Status);
        let text = m.encode();
        assert!(text.contains(r#"idemgate_requests_total{route="create-order",outcome="replayed"} 2"#), "{text}");
        assert!(text.contains(r#"idemgate_requests_total{route="create-order",outcome="executed"} 1"#), "{text}");
        assert!(text.contains(r#"idemgate_released_total{route="create-order",reason="status"} 1"#), "{text}");
    }

    const IDEMPOTENT: Produces = Produces {
        idempotent: true,
        keyless: false,
        quota: false,
        fail_open: false,
        reconciles: false,
        observes: false,
        pinned: Pins { name: false, host: false, fingerprint: false },
    };

    /// A route shows a zero series for every label set it can produce, and none it cannot:
    /// a plain route has no mismatch, lease or reconciliation; a route without a lookup no
    /// reconciliation; a fail-closed route no bypass. Counting an impossible one is harmless.
    #[test]
    fn routes_expose_only_what_they_can_produce() {
        let m = Metrics::default();
        let plain = m.route("plain", Produces::PLAIN);
        let _orders = m.route("orders", IDEMPOTENT);
        let _asks = m.route("asks", Produces { reconciles: true, fail_open: true, ..IDEMPOTENT });
        plain.outcome(Outcome::Mismatch);
        plain.lease_lost();
        let text = m.encode();
        let has = |series: &str| text.lines().any(|l| l.starts_with(series));
        assert!(has(r#"idemgate_requests_total{route="plain",outcome="passed_through"} 0"#), "{text}");
        assert!(has(r#"idemgate_requests_total{route="plain",outcome="upstream_failed"} 0"#), "{text}");
        assert!(!text.contains(r#"route="plain",outcome="mismatch""#), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("idemgate_lease_lost") && l.contains(r#"route="plain""#)),
            "{text}"
        );
        assert!(has(r#"idemgate_requests_total{route="orders",outcome="mismatch"} 0"#), "{text}");
        assert!(!text.contains(r#"route="orders",outcome="passed_through""#), "a required key never passes: {text}");
        assert!(!text.contains(r#"route="orders",outcome="bypassed""#), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("idemgate_reconciliations") && l.contains(r#"route="orders""#)));
        assert!(text.lines().any(|l| l.starts_with("idemgate_reconciliations") && l.contains(r#"route="asks""#)));
        assert!(has(r#"idemgate_requests_total{route="asks",outcome="bypassed"} 0"#), "{text}");
    }

    /// A route's request latency by outcome shows from its first observation (its count is
    /// `idemgate_requests_total`'s, at zero from the start); its upstream latency by class,
    /// whose counts are the only ones by class, from the start.
    #[test]
    fn request_latency_shows_from_its_first_observation() {
        let m = Metrics::default();
        let route = m.route("orders", IDEMPOTENT);
        let text = m.encode();
        assert!(text.contains(r#"idemgate_requests_total{route="orders",outcome="executed"} 0"#), "{text}");
        assert!(text.contains(r#"idemgate_upstream_seconds_count{route="orders",class="5xx"} 0"#), "{text}");
        assert!(!text.contains("idemgate_request_seconds_count{"), "{text}");
        route.request_duration(Outcome::Executed, Duration::from_millis(3));
        let text = m.encode();
        assert!(text.contains(r#"idemgate_request_seconds_count{route="orders",outcome="executed"} 1"#), "{text}");
        assert!(!text.contains(r#"idemgate_request_seconds_count{route="orders",outcome="replayed"}"#), "{text}");
        // A reload resolves the route again: the same series goes on counting.
        m.route("orders", IDEMPOTENT).request_duration(Outcome::Executed, Duration::from_millis(3));
        assert!(m.encode().contains(r#"idemgate_request_seconds_count{route="orders",outcome="executed"} 2"#));
    }

    /// Two registries built alike, series created in different orders, expose the same text.
    #[test]
    fn the_exposition_order_is_stable() {
        let build = |names: &[&str]| {
            let m = Metrics::default();
            for name in names {
                let route = m.route(name, IDEMPOTENT);
                route.outcome(Outcome::Executed);
            }
            m.encode()
        };
        assert_eq!(build(&["a", "b", "c", "d"]), build(&["d", "b", "c", "a"]));
    }
}
