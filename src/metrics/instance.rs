//! The instances of upstreams with several (`urls`): requests, failures by kind, ejections and
//! requests in flight, labelled `upstream` and `instance` (its address as configured).
//!
//! The hazard is an unbounded label: instances come and go with reloads (and, with names
//! resolved again, with DNS). Every instance the running configuration names is recorded
//! here, and [`Instances::retain`] drops the series of the others when a configuration
//! replaces it, so that churn never grows `/metrics` without bound.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

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

/// Why an exchange with an instance failed, as `kind` says it.
const KINDS: [&str; 3] = ["connect", "refused", "broken"];

/// The per-instance families, registered once.
#[derive(Default)]
pub struct Instances {
    requests: Family<Instance, Counter>,
    failures: Family<InstanceFailure, Counter>,
    ejections: Family<Instance, Counter>,
    in_flight: Family<Instance, Gauge>,
    /// The (upstream, instance) pairs with series now.
    known: Mutex<HashSet<(String, String)>>,
}

/// One instance's handles: updating them is an atomic add, no label lookup.
#[derive(Debug, Clone, Default)]
pub struct InstanceMetrics {
    /// Requests sent to it (each try of a request counts once).
    pub requests: Counter,
    /// No connection could be made.
    pub connect_failed: Counter,
    /// An HTTP/2 stream it refused, or left above a GOAWAY: not processed.
    pub refused: Counter,
    /// The exchange broke after the request may have been written.
    pub broken: Counter,
    /// Times it was left out of the balance.
    pub ejections: Counter,
    /// Requests waiting for its answer's head.
    pub in_flight: Gauge,
}

impl Instances {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "upstream_instance_requests",
            "Requests sent to each instance of an upstream with several (each try once)",
            self.requests.clone(),
        );
        registry.register(
            "upstream_instance_failures",
            "Failed exchanges by instance and kind: connect (never sent), refused (an HTTP/2 stream not processed), broken (sent; outcome unknown)",
            self.failures.clone(),
        );
        registry.register(
            "upstream_instance_ejections",
            "Times an instance was left out of the balance after failing to connect eject_after times running",
            self.ejections.clone(),
        );
        registry.register(
            "upstream_instance_in_flight",
            "Requests waiting for an instance's answer (what the balancer compares)",
            self.in_flight.clone(),
        );
    }

    /// The handles of `instance` of `upstream`, its series created (at zero) now.
    pub fn instance(&self, upstream: &str, instance: &str) -> InstanceMetrics {
        let label = Instance { upstream: upstream.to_owned(), instance: instance.to_owned() };
        let failure = |kind| {
            let label = InstanceFailure { upstream: upstream.to_owned(), instance: instance.to_owned(), kind };
            self.failures.get_or_create(&label).clone()
        };
        self.known.lock().unwrap_or_else(PoisonError::into_inner).insert((upstream.to_owned(), instance.to_owned()));
        InstanceMetrics {
            requests: self.requests.get_or_create(&label).clone(),
            connect_failed: failure(KINDS[0]),
            refused: failure(KINDS[1]),
            broken: failure(KINDS[2]),
            ejections: self.ejections.get_or_create(&label).clone(),
            in_flight: self.in_flight.get_or_create(&label).clone(),
        }
    }

    /// Drops the series of every instance not in `live` (upstream, instance).
    pub fn retain(&self, live: &HashSet<(String, String)>) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        for (upstream, instance) in known.iter().filter(|pair| !live.contains(*pair)) {
            let label = Instance { upstream: upstream.clone(), instance: instance.clone() };
            self.requests.remove(&label);
            self.ejections.remove(&label);
            self.in_flight.remove(&label);
            for kind in KINDS {
                self.failures.remove(&InstanceFailure { upstream: upstream.clone(), instance: instance.clone(), kind });
            }
        }
        known.retain(|pair| live.contains(pair));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_that_leaves_takes_its_series_with_it() {
        let mut registry = Registry::default();
        let instances = Instances::default();
        instances.register(&mut registry);
        let a = instances.instance("app", "10.0.0.5:3000");
        let _b = instances.instance("app", "10.0.0.6:3000");
        a.requests.inc();
        let text = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        let before = text(&registry);
        assert!(
            before.contains("upstream_instance_requests_total{upstream=\"app\",instance=\"10.0.0.5:3000\"} 1"),
            "{before}"
        );
        assert!(before.contains("instance=\"10.0.0.6:3000\",kind=\"refused\"} 0"), "{before}");
        instances.retain(&HashSet::from([("app".to_owned(), "10.0.0.5:3000".to_owned())]));
        let after = text(&registry);
        assert!(after.contains("10.0.0.5:3000") && !after.contains("10.0.0.6:3000"), "{after}");
        // Churn: a thousand instances come and go; the series stay those of the live ones.
        for i in 0..1000 {
            instances.instance("app", &format!("10.1.{}.{}:3000", i / 250, i % 250));
            instances.retain(&HashSet::from([("app".to_owned(), "10.0.0.5:3000".to_owned())]));
        }
        assert_eq!(text(&registry).matches("instance=").count(), after.matches("instance=").count());
    }
}
