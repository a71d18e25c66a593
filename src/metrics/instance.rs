//! The instances of upstreams with several (`urls`, or a name resolved again with
//! `resolve_every`): requests, failures by kind, ejections (and why) and requests in flight,
//! labelled `upstream` and `instance` (its address as configured, or as resolved).
//!
//! The hazard is an unbounded label: instances come and go with reloads and with DNS. A
//! series lives exactly as long as some instance holds its handles: the last
//! [`InstanceMetrics`] of an (upstream, instance) pair to be dropped removes it, so that
//! churn never grows `/metrics` without bound. (The gateway a reload replaced keeps its
//! instances, and their series, until its last request finishes.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Instance {
    upstream: String,
    instance: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InstanceFailure {
    upstream: String,
    instance: String,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InstanceEjection {
    upstream: String,
    instance: String,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Lookup {
    upstream: String,
    outcome: &'static str,
}

/// Why an exchange with an instance failed, as `kind` says it.
const KINDS: [&str; 4] = ["connect", "refused", "broken", "gateway_error"];

/// Why an instance was left out, as `reason` says it: what it failed at, so many times running.
const REASONS: [&str; 3] = ["connect", "broken", "gateway_error"];

/// The per-instance families, registered once.
#[derive(Default)]
pub struct Instances {
    requests: Family<Instance, Counter>,
    failures: Family<InstanceFailure, Counter>,
    ejections: Family<Instance, Counter>,
    /// The same ejections, by why.
    ejection_reasons: Family<InstanceEjection, Counter>,
    in_flight: Family<Instance, Gauge>,
    /// Lookups of resolved upstreams' names, by outcome: as many series as upstream names.
    lookups: Family<Lookup, Counter>,
    /// The (upstream, instance) pairs with series now, and how many holders each has.
    held: Mutex<HashMap<(String, String), usize>>,
}

/// One instance's handles: updating them is an atomic add, no label lookup. Dropping the last
/// holder of a pair removes its series.
#[derive(Clone)]
pub struct InstanceMetrics {
    /// Requests sent to it (each try of a request counts once).
    pub requests: Counter,
    /// No connection could be made.
    pub connect_failed: Counter,
    /// An HTTP/2 stream it refused (`REFUSED_STREAM`): not processed.
    pub refused: Counter,
    /// The exchange broke after the request may have been written.
    pub broken: Counter,
    /// It answered 502, 503 or 504.
    pub gateway_error: Counter,
    /// Times it was left out of the balance.
    pub ejections: Counter,
    /// The same, by reason ([`REASONS`]).
    ejected_because: [(&'static str, Counter); 3],
    /// Requests waiting for its answer's head.
    pub in_flight: Gauge,
    /// Shared by every clone: the series go when the last one does.
    _holder: Arc<Holder>,
}

impl InstanceMetrics {
    /// Counts an ejection's `reason` (one of [`REASONS`]; another is not counted).
    pub fn ejected(&self, reason: &str) {
        if let Some((_, counter)) = self.ejected_because.iter().find(|(r, _)| *r == reason) {
            counter.inc();
        }
    }
}

impl std::fmt::Debug for InstanceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceMetrics")
            .field("upstream", &self._holder.upstream)
            .field("instance", &self._holder.instance)
            .finish()
    }
}

/// One holder of an (upstream, instance) pair's series.
struct Holder {
    families: Arc<Instances>,
    upstream: String,
    instance: String,
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.families.release(&self.upstream, &self.instance);
    }
}

impl Instances {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "upstream_instance_requests",
            "Requests sent to each instance of an upstream with several (each try once)",
            self.requests.clone(),
        );
        registry.register(
            "upstream_instance_failures",
            "Failed exchanges by instance and kind: connect (never sent), refused (an HTTP/2 stream not processed), broken (sent; outcome unknown), gateway_error (it answered 502, 503 or 504)",
            self.failures.clone(),
        );
        registry.register(
            "upstream_instance_ejections",
            "Times an instance was left out of the balance after failing eject_after, eject_after_broken or eject_after_gateway_errors times running",
            self.ejections.clone(),
        );
        registry.register(
            "upstream_instance_ejection_reasons",
            "Times an instance was left out of the balance, by reason: connect (eject_after), broken (eject_after_broken), gateway_error (eject_after_gateway_errors)",
            self.ejection_reasons.clone(),
        );
        registry.register(
            "upstream_instance_in_flight",
            "Requests waiting for an instance's answer (what the balancer compares)",
            self.in_flight.clone(),
        );
        registry.register(
            "upstream_lookups",
            "Lookups of the host name of upstreams with resolve_every, by outcome: changed (instances came or went), unchanged, failed (the last instances stay)",
            self.lookups.clone(),
        );
    }

    /// A lookup of `upstream`'s name ended with `outcome` (changed, unchanged or failed).
    pub fn looked_up(&self, upstream: &str, outcome: &'static str) {
        self.lookups.get_or_create(&Lookup { upstream: upstream.to_owned(), outcome }).inc();
    }

    /// The handles of `instance` of `upstream`, its series created (at zero) now unless
    /// another holder has them already.
    pub fn instance(self: &Arc<Self>, upstream: &str, instance: &str) -> InstanceMetrics {
        let label = Instance { upstream: upstream.to_owned(), instance: instance.to_owned() };
        let failure = |kind| {
            let label = InstanceFailure { upstream: upstream.to_owned(), instance: instance.to_owned(), kind };
            self.failures.get_or_create(&label).clone()
        };
        let ejected = |reason| {
            let label = InstanceEjection { upstream: upstream.to_owned(), instance: instance.to_owned(), reason };
            (reason, self.ejection_reasons.get_or_create(&label).clone())
        };
        // Counted under the lock that `release` removes under: a pair is never removed while
        // a holder is being made.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        *held.entry((upstream.to_owned(), instance.to_owned())).or_default() += 1;
        InstanceMetrics {
            requests: self.requests.get_or_create(&label).clone(),
            connect_failed: failure(KINDS[0]),
            refused: failure(KINDS[1]),
            broken: failure(KINDS[2]),
            gateway_error: failure(KINDS[3]),
            ejections: self.ejections.get_or_create(&label).clone(),
            ejected_because: REASONS.map(ejected),
            in_flight: self.in_flight.get_or_create(&label).clone(),
            _holder: Arc::new(Holder {
                families: Arc::clone(self),
                upstream: upstream.to_owned(),
                instance: instance.to_owned(),
            }),
        }
    }

    /// One holder of the pair is gone; the last takes the series with it.
    fn release(&self, upstream: &str, instance: &str) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let pair = (upstream.to_owned(), instance.to_owned());
        match held.get_mut(&pair) {
            Some(count) if *count > 1 => {
                *count -= 1;
                return;
            }
            Some(_) => {
                held.remove(&pair);
            }
            None => return,
        }
        let label = Instance { upstream: pair.0.clone(), instance: pair.1.clone() };
        self.requests.remove(&label);
        self.ejections.remove(&label);
        self.in_flight.remove(&label);
        for kind in KINDS {
            self.failures.remove(&InstanceFailure { upstream: pair.0.clone(), instance: pair.1.clone(), kind });
        }
        for reason in REASONS {
            self.ejection_reasons.remove(&InstanceEjection {
                upstream: pair.0.clone(),
                instance: pair.1.clone(),
                reason,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn an_instance_that_leaves_takes_its_series_with_it() {
        let mut registry = Registry::default();
        let instances = Arc::new(Instances::default());
        instances.register(&mut registry);
        let a = instances.instance("app", "10.0.0.5:3000");
        let b = instances.instance("app", "10.0.0.6:3000");
        a.requests.inc();
        let before = text(&registry);
        assert!(
            before.contains("upstream_instance_requests_total{upstream=\"app\",instance=\"10.0.0.5:3000\"} 1"),
            "{before}"
        );
        assert!(before.contains("instance=\"10.0.0.6:3000\",kind=\"refused\"} 0"), "{before}");
        assert!(before.contains("instance=\"10.0.0.6:3000\",reason=\"gateway_error\"} 0"), "{before}");
        drop(b);
        let after = text(&registry);
        assert!(after.contains("10.0.0.5:3000") && !after.contains("10.0.0.6:3000"), "{after}");
        // Churn: a thousand instances come and go; the series stay those of the live ones.
        for i in 0..1000 {
            let passing = instances.instance("app", &format!("10.1.{}.{}:3000", i / 250, i % 250));
            passing.requests.inc();
        }
        assert_eq!(text(&registry).matches("instance=").count(), after.matches("instance=").count());
        drop(a);
        assert_eq!(text(&registry).matches("instance=").count(), 0);
    }

    #[test]
    fn a_series_two_holders_share_stays_until_both_are_gone() {
        // A reload: the gateway being replaced and the new one both hold an instance.
        let mut registry = Registry::default();
        let instances = Arc::new(Instances::default());
        instances.register(&mut registry);
        let old = instances.instance("app", "10.0.0.5:3000");
        let new = instances.instance("app", "10.0.0.5:3000");
        old.requests.inc();
        let copy = new.clone();
        drop(old);
        drop(new);
        copy.requests.inc();
        let held = text(&registry);
        assert!(held.contains("instance=\"10.0.0.5:3000\"} 2"), "{held}");
        drop(copy);
        assert!(!text(&registry).contains("10.0.0.5:3000"));
    }
}
