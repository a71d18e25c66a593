//! The counters and histograms of one route, resolved once per route so that the request path
//! counts without a label lookup.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::labels::{Label, Outcome, Pin, Reconciliation, ReleaseReason, Would};
use super::{LatencyQuantiles, QUANTILE_MIN_SAMPLES};

/// One metric per value of a label, found by [`Label::index`].
#[derive(Clone)]
pub(super) struct PerLabel<L: Label, M = Counter> {
    metrics: Vec<M>,
    _label: std::marker::PhantomData<L>,
}

impl<L: Label, M: Clone> PerLabel<L, M> {
    pub(super) fn new(mut metric: impl FnMut(L) -> M) -> Self {
        let mut metrics: Vec<Option<M>> = vec![None; L::ALL.len()];
        for &label in L::ALL {
            metrics[label.index()] = Some(metric(label));
        }
        // Every index is filled: `index` maps ALL onto 0..len (checked by a test).
        Self { metrics: metrics.into_iter().flatten().collect(), _label: std::marker::PhantomData }
    }

    pub(super) fn get(&self, label: L) -> &M {
        &self.metrics[label.index()]
    }
}

/// A histogram whose series is registered by its first observation. A route's request
/// latency by outcome is one of these: its counts are `idemgate_requests_total`'s, registered
/// at zero, and an outcome not had yet would otherwise show as 19 lines of zeros.
#[derive(Clone)]
pub(super) struct FirstObserved {
    create: Arc<dyn Fn() -> Histogram + Send + Sync>,
    series: Arc<OnceLock<Histogram>>,
}

impl FirstObserved {
    pub(super) fn new(create: impl Fn() -> Histogram + Send + Sync + 'static) -> Self {
        Self { create: Arc::new(create), series: Arc::default() }
    }

    pub(super) fn observe(&self, value: f64) {
        self.series.get_or_init(|| (self.create)()).observe(value);
    }
}

/// What a route can produce: which outcomes it can count, and whether it has a key's
/// lifecycle and lookups at all. A label set a route cannot produce is not exposed: a plain
/// route has no `mismatch`, no lease to lose, no reconciliation.
#[derive(Debug, Clone, Copy)]
pub struct Produces {
    /// The route has `[routes.idempotency]`.
    pub idempotent: bool,
    /// Requests without a key pass through (`required = false`).
    pub keyless: bool,
    /// It counts new keys (`max_new_keys`).
    pub quota: bool,
    /// It forwards when the store fails (`on_store_error = "fail-open"`).
    pub fail_open: bool,
    /// It asks the upstream about unknown outcomes (`[routes.idempotency.reconcile]`).
    pub reconciles: bool,
    /// It only observes (`mode = "observe"`): it forwards everything and counts what
    /// enforcement would have done.
    pub observes: bool,
    /// Which pins its identity has (`[routes.idempotency.identity]`).
    pub pinned: Pins,
}

/// Which parts of a route's identity are pinned.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pins {
    /// Its name.
    pub name: bool,
    /// Its host naming.
    pub host: bool,
    /// A previous fingerprint.
    pub fingerprint: bool,
}

impl Produces {
    /// A route without idempotency.
    pub const PLAIN: Self = Self {
        idempotent: false,
        keyless: true,
        quota: false,
        fail_open: false,
        reconciles: false,
        observes: false,
        pinned: Pins { name: false, host: false, fingerprint: false },
    };

    /// Whether the route's identity has `pin`.
    pub fn pins(self, pin: Pin) -> bool {
        match pin {
            Pin::Name => self.pinned.name,
            Pin::Host => self.pinned.host,
            Pin::Fingerprint => self.pinned.fingerprint,
        }
    }

    /// Whether the route can end a request with `outcome`.
    pub fn outcome(self, outcome: Outcome) -> bool {
        if self.observes {
            // Every answer is the upstream's, or the error a pass-through route gives.
            return matches!(outcome, Outcome::Observed | Outcome::UpstreamFailed | Outcome::Internal);
        }
        match outcome {
            Outcome::Observed => false,
            Outcome::PassedThrough => self.keyless,
            Outcome::UpstreamFailed => true,
            // A plain route only forwards; everything else is the idempotent path's.
            _ if !self.idempotent => false,
            Outcome::QuotaExceeded => self.quota,
            Outcome::Bypassed => self.fail_open,
            _ => true,
        }
    }
}

/// Pre-resolved counters of one route.
#[derive(Clone)]
pub struct RouteMetrics {
    pub(super) outcomes: PerLabel<Outcome>,
    pub(super) released: PerLabel<ReleaseReason>,
    pub(super) lease_lost: Counter,
    pub(super) claims_vanished: Counter,
    pub(super) store_errors: Counter,
    pub(super) store_write_failed: Counter,
    pub(super) outcome_unknown: Counter,
    pub(super) not_stored: Counter,
    pub(super) reconciliations: PerLabel<Reconciliation>,
    pub(super) observed: PerLabel<Would>,
    pub(super) pin_hits: PerLabel<Pin>,
    pub(super) request_seconds: PerLabel<Outcome, FirstObserved>,
    /// One histogram per status class, resolved once: no label lookup per request.
    pub(super) upstream_seconds: Vec<(&'static str, Histogram)>,
    /// The answers of classes 2xx to 5xx again, for their p90.
    pub(super) upstream_quantiles: Arc<LatencyQuantiles>,
}

impl RouteMetrics {
    /// Records how long a request took.
    pub fn request_duration(&self, outcome: Outcome, took: std::time::Duration) {
        self.request_seconds.get(outcome).observe(took.as_secs_f64());
    }

    /// Records how long an upstream exchange took, by the status class of its answer
    /// (`"2xx"` … `"5xx"`, or `"error"`).
    pub fn upstream_latency(&self, class: &'static str, took: std::time::Duration) {
        if let Some((_, histogram)) = self.upstream_seconds.iter().find(|(c, _)| *c == class) {
            histogram.observe(took.as_secs_f64());
        }
        if matches!(class, "2xx" | "3xx" | "4xx" | "5xx") {
            self.upstream_quantiles.observe(took);
        }
    }

    /// Records how long a pass-through exchange took to its answer's head, in the histogram
    /// alone: the quantile is of keyed exchanges, which read the whole answer.
    pub fn passed_latency(&self, class: &'static str, took: std::time::Duration) {
        if let Some((_, histogram)) = self.upstream_seconds.iter().find(|(c, _)| *c == class) {
            histogram.observe(took.as_secs_f64());
        }
    }

    /// The 90th percentile of the route's upstream answer times (classes 2xx to 5xx), once
    /// at least [`QUANTILE_MIN_SAMPLES`] were seen.
    pub fn upstream_p90(&self) -> Option<Duration> {
        self.upstream_quantiles.quantile(0.9, QUANTILE_MIN_SAMPLES)
    }

    /// Counts a finished request.
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes.get(outcome).inc();
    }

    /// Counts a released claim.
    pub fn released(&self, reason: ReleaseReason) {
        self.released.get(reason).inc();
    }

    /// Counts a key held as unknown.
    pub fn outcome_unknown(&self) {
        self.outcome_unknown.inc();
    }

    /// Counts a lookup of an unknown outcome.
    pub fn reconciled(&self, result: Reconciliation) {
        self.reconciliations.get(result).inc();
    }

    /// Counts what enforcement would have done with a request a route in observe mode forwarded.
    pub fn observed(&self, would: Would) {
        self.observed.get(would).inc();
    }

    /// The counter of `would`, for a count made later (at the end of a streamed answer).
    pub fn observed_counter(&self, would: Would) -> Counter {
        self.observed.get(would).clone()
    }

    /// Counts a request whose record a pin of the route's identity named (or matched).
    pub fn pin_hit(&self, pin: Pin) {
        self.pin_hits.get(pin).inc();
    }

    /// Counts a response delivered but not stored.
    pub fn not_stored(&self) {
        self.not_stored.inc();
    }

    /// Counts a lease found taken over.
    pub fn lease_lost(&self) {
        self.lease_lost.inc();
    }

    /// Counts a claim found gone from the store while its request ran (not taken over).
    pub fn claim_vanished(&self) {
        self.claims_vanished.inc();
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
