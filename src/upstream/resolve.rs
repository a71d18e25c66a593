//! An upstream whose `url` names a host looked up again every `resolve_every`: each address
//! the name resolves to is an instance (a Kubernetes headless service, `docker compose
//! --scale`, a DNS name with several A or AAAA records).
//!
//! Each instance connects to its address, while TLS and `Host` keep the configured name. An
//! address that stays keeps its instance: its pool, its load and its health. One that goes
//! takes its instance out of the set; requests already sent to it finish there, since each
//! request holds the set it was balanced over. A lookup that fails, times out or finds no
//! address changes nothing: the last set stays, and the upstream is never left without
//! instances. Until the first lookup succeeds, the set is one instance on the name itself,
//! looked up at each new connection as an upstream without `resolve_every` is.
//!
//! Hazard: the lookups run on a task of their own that holds the set weakly, so that a
//! reload, which drops the upstream once its last request is done, also ends them.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::instance::{Instance, Template};
use crate::config::MAX_INSTANCES;
use crate::metrics::Instances;

/// The longest one lookup may take before this round counts as failed: the resolver's own
/// timeouts come first on any sane system; this one bounds a resolver that never answers.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The instances of a resolved upstream, and what the lookups need.
pub(super) struct Resolved {
    /// One instance per address, sorted by address; at least one. One writer at a time:
    /// `carry_over` before the lookups start, then the lookup task alone.
    current: ArcSwap<Vec<Arc<Instance>>>,
    template: Template,
    /// The configured host, looked up.
    host: String,
    /// The configured port (or the scheme's), connected to on every address.
    port: u16,
    every: Duration,
    metrics: Option<Arc<Instances>>,
    started: AtomicBool,
}

/// What one lookup's answer did to the set.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    Unchanged,
    /// Instances came or went (their labels).
    Changed {
        added: Vec<String>,
        removed: Vec<String>,
    },
}

impl Resolved {
    /// A set of one instance, `first`, on the configured name, until the first lookup.
    pub(super) fn new(
        template: Template,
        first: Arc<Instance>,
        every: Duration,
        metrics: Option<Arc<Instances>>,
    ) -> Self {
        let host = first.authority.host().to_owned();
        let default_port = if template.scheme == http::uri::Scheme::HTTPS { 443 } else { 80 };
        let port = first.authority.port_u16().unwrap_or(default_port);
        Self {
            current: ArcSwap::from_pointee(vec![first]),
            template,
            host,
            port,
            every,
            metrics,
            started: AtomicBool::new(false),
        }
    }

    /// The instances of the moment.
    pub(super) fn current(&self) -> Arc<Vec<Arc<Instance>>> {
        self.current.load_full()
    }

    /// Starts at the addresses `before` resolved the same name and port to, if it had any.
    pub(super) fn carry_over(&self, before: &Resolved) {
        if self.host != before.host || self.port != before.port {
            return;
        }
        let addresses: Vec<SocketAddr> = before.current().iter().filter_map(|i| i.pinned).collect();
        if !addresses.is_empty() {
            self.apply(addresses);
        }
    }

    /// Makes the set one instance per address in `found` (at least one), keeping the
    /// instance of every address that stays.
    fn apply(&self, mut found: Vec<SocketAddr>) -> Change {
        found.sort_unstable();
        found.dedup();
        let resolved = found.len();
        found.truncate(MAX_INSTANCES);
        let current = self.current.load_full();
        let same = current.len() == found.len() && current.iter().zip(&found).all(|(i, a)| i.pinned == Some(*a));
        if same || found.is_empty() {
            return Change::Unchanged;
        }
        if resolved > found.len() {
            tracing::warn!(
                upstream = %self.template.upstream,
                addresses = resolved,
                "{} resolves to more addresses than an upstream takes; the first {} by address are used",
                self.host,
                MAX_INSTANCES
            );
        }
        let next: Vec<Arc<Instance>> = found
            .iter()
            .map(|address| {
                current.iter().find(|i| i.pinned == Some(*address)).cloned().unwrap_or_else(|| {
                    let label = address.to_string();
                    let metrics = self.metrics.as_ref().map(|m| m.instance(&self.template.upstream, &label));
                    let authority = current[0].authority.clone();
                    Arc::new(self.template.instance(authority, Some(*address), metrics))
                })
            })
            .collect();
        let kept: HashSet<&str> = current.iter().map(|i| i.label.as_str()).collect();
        let now: HashSet<&str> = next.iter().map(|i| i.label.as_str()).collect();
        let added = next.iter().filter(|i| !kept.contains(i.label.as_str())).map(|i| i.label.clone()).collect();
        let removed = current.iter().filter(|i| !now.contains(i.label.as_str())).map(|i| i.label.clone()).collect();
        self.current.store(Arc::new(next));
        Change::Changed { added, removed }
    }
}

/// Starts the lookups of `resolved`, once, on the runtime of the caller.
pub(super) fn start(resolved: &Arc<Resolved>) {
    if resolved.started.swap(true, Ordering::Relaxed) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(upstream = %resolved.template.upstream, "no runtime to look {} up on; its name is looked up at each connection", resolved.host);
        return;
    };
    runtime.spawn(run(Arc::downgrade(resolved), |host, port| async move {
        tokio::net::lookup_host((host.as_str(), port)).await.map(Iterator::collect)
    }));
}

/// Looks the name up every `every` until the upstream is gone; `lookup` is the system's
/// resolver outside tests.
async fn run<L, F>(resolved: Weak<Resolved>, lookup: L)
where
    L: Fn(String, u16) -> F,
    F: Future<Output = io::Result<Vec<SocketAddr>>>,
{
    // Failures are logged when they begin and when they end, not at every round: a name
    // looked up each second while DNS is down would flood the log.
    let mut failing = false;
    loop {
        let Some((host, port, every)) = resolved.upgrade().map(|r| (r.host.clone(), r.port, r.every)) else { return };
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup(host, port)).await;
        let Some(r) = resolved.upgrade() else { return };
        let upstream = &r.template.upstream;
        let outcome = match found {
            Ok(Ok(addresses)) if !addresses.is_empty() => {
                if failing {
                    tracing::info!(upstream = %upstream, "{} resolves again", r.host);
                    failing = false;
                }
                match r.apply(addresses) {
                    Change::Unchanged => "unchanged",
                    Change::Changed { added, removed } => {
                        let instances: Vec<String> = r.current().iter().map(|i| i.label.clone()).collect();
                        tracing::info!(
                            upstream = %upstream,
                            instances = %instances.join(", "),
                            added = %added.join(", "),
                            removed = %removed.join(", "),
                            "{} resolved to another set of instances",
                            r.host
                        );
                        "changed"
                    }
                }
            }
            failed => {
                let why = match failed {
                    Ok(Ok(_)) => "it resolved to no address".to_owned(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer within {LOOKUP_TIMEOUT:?}"),
                };
                if !failing {
                    tracing::warn!(upstream = %upstream, error = %why, "cannot look {} up; its last instances stay", r.host);
                    failing = true;
                } else {
                    tracing::debug!(upstream = %upstream, error = %why, "cannot look {} up", r.host);
                }
                "failed"
            }
        };
        if let Some(metrics) = &r.metrics {
            metrics.looked_up(upstream, outcome);
        }
        drop(r);
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use http::uri::{Authority, Scheme};
    use prometheus_client::registry::Registry;

    use super::*;

    fn resolved(metrics: &Arc<Instances>) -> Arc<Resolved> {
        resolved_at(metrics, "orders.internal:3000")
    }

    fn resolved_at(metrics: &Arc<Instances>, authority: &'static str) -> Arc<Resolved> {
        let template = Template {
            upstream: "orders".into(),
            scheme: Scheme::HTTP,
            tls: crate::outbound::tls_config(crate::outbound::Roots::None).unwrap(),
            connect_timeout: Duration::from_secs(1),
            ejection: crate::config::default_ejection(),
            outliers: true,
        };
        let authority = Authority::from_static(authority);
        let first =
            Arc::new(template.instance(authority.clone(), None, Some(metrics.instance("orders", authority.as_str()))));
        Arc::new(Resolved::new(template, first, Duration::from_secs(5), Some(Arc::clone(metrics))))
    }

    fn families() -> (Registry, Arc<Instances>) {
        let mut registry = Registry::default();
        let instances = Arc::new(Instances::default());
        instances.register(&mut registry);
        (registry, instances)
    }

    fn labels(r: &Resolved) -> Vec<String> {
        r.current().iter().map(|i| i.label.clone()).collect()
    }

    fn series(registry: &Registry) -> Vec<String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        let mut found: Vec<String> = out
            .lines()
            .filter(|l| l.starts_with("upstream_instance_requests_total{"))
            .filter_map(|l| l.split("instance=\"").nth(1)?.split('"').next().map(str::to_owned))
            .collect();
        found.sort();
        found
    }

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_address_that_stays_keeps_its_instance_and_one_that_goes_takes_its_series() {
        let (registry, metrics) = families();
        let r = resolved(&metrics);
        assert_eq!(labels(&r), ["orders.internal:3000"]);
        let change = r.apply(vec![at("10.0.0.6:3000"), at("10.0.0.5:3000"), at("10.0.0.6:3000")]);
        assert_eq!(
            change,
            Change::Changed {
                added: vec!["10.0.0.5:3000".into(), "10.0.0.6:3000".into()],
                removed: vec!["orders.internal:3000".into()]
            }
        );
        // Sorted, without the duplicate; the name's own instance is gone, and its series.
        assert_eq!(labels(&r), ["10.0.0.5:3000", "10.0.0.6:3000"]);
        assert_eq!(series(&registry), ["10.0.0.5:3000", "10.0.0.6:3000"]);
        let staying = Arc::clone(&r.current()[1]);
        assert_eq!(r.apply(vec![at("10.0.0.5:3000"), at("10.0.0.6:3000")]), Change::Unchanged);
        r.apply(vec![at("10.0.0.7:3000"), at("10.0.0.6:3000")]);
        assert_eq!(labels(&r), ["10.0.0.6:3000", "10.0.0.7:3000"]);
        assert!(Arc::ptr_eq(&staying, &r.current()[0]), "the staying address kept its instance");
        assert_eq!(series(&registry), ["10.0.0.6:3000", "10.0.0.7:3000"]);
        // No address: the set stays.
        assert_eq!(r.apply(Vec::new()), Change::Unchanged);
        assert_eq!(labels(&r), ["10.0.0.6:3000", "10.0.0.7:3000"]);
    }

    #[test]
    fn a_reload_starts_at_the_addresses_the_same_name_had_and_keeps_their_series() {
        let (registry, metrics) = families();
        let before = resolved(&metrics);
        before.apply(vec![at("10.0.0.5:3000"), at("10.0.0.6:3000")]);
        before.current()[0].health.metrics.as_ref().unwrap().requests.inc();
        let after = resolved(&metrics);
        after.carry_over(&before);
        let elsewhere = resolved_at(&metrics, "payments.internal:3000");
        elsewhere.carry_over(&before);
        drop(before);
        assert_eq!(labels(&after), ["10.0.0.5:3000", "10.0.0.6:3000"]);
        assert_eq!(labels(&elsewhere), ["payments.internal:3000"], "another name carries nothing over");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        let line = "upstream_instance_requests_total{upstream=\"orders\",instance=\"10.0.0.5:3000\"} 1";
        assert!(out.contains(line), "the count went on across the reload: {out}");
    }

    #[test]
    fn more_addresses_than_an_upstream_takes_are_cut_to_the_first() {
        let (_registry, metrics) = families();
        let r = resolved(&metrics);
        let many: Vec<SocketAddr> = (0..100).map(|i| SocketAddr::from(([10, 0, 1, i], 3000))).collect();
        r.apply(many);
        assert_eq!(r.current().len(), MAX_INSTANCES);
        assert_eq!(r.current()[0].label, "10.0.1.0:3000");
    }

    #[test]
    fn an_instance_of_a_resolved_name_connects_to_its_address_and_keeps_the_name() {
        let (_registry, metrics) = families();
        let r = resolved(&metrics);
        r.apply(vec![at("[::1]:3000")]);
        let instance = &r.current()[0];
        assert_eq!(instance.label, "[::1]:3000");
        assert_eq!(instance.authority.as_str(), "orders.internal:3000");
        assert_eq!(instance.host.as_ref().map(|h| h.to_str().unwrap()), Some("orders.internal:3000"));
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_follow_the_name_keep_the_last_set_on_failure_and_end_with_the_upstream() {
        let (registry, metrics) = families();
        let r = resolved(&metrics);
        let answers: Arc<Mutex<VecDeque<io::Result<Vec<SocketAddr>>>>> = Arc::new(Mutex::new(VecDeque::from([
            Ok(vec![at("10.0.0.5:3000"), at("10.0.0.6:3000")]),
            Err(io::Error::other("SERVFAIL")),
            Ok(Vec::new()),
            Ok(vec![at("10.0.0.6:3000")]),
        ])));
        let asked: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
        let lookup = {
            let (answers, asked) = (Arc::clone(&answers), Arc::clone(&asked));
            move |host: String, port: u16| {
                asked.lock().unwrap().push((host, port));
                let answer = answers.lock().unwrap().pop_front();
                async move {
                    match answer {
                        Some(answer) => answer,
                        // Never answers: the round times out.
                        None => std::future::pending().await,
                    }
                }
            }
        };
        let task = tokio::spawn(run(Arc::downgrade(&r), lookup));
        // Rounds at 0 s, 5 s, 10 s ...; each check a moment after its round.
        let round = || tokio::time::sleep(Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(labels(&r), ["10.0.0.5:3000", "10.0.0.6:3000"]);
        round().await;
        assert_eq!(labels(&r), ["10.0.0.5:3000", "10.0.0.6:3000"], "a failed lookup keeps the set");
        round().await;
        assert_eq!(labels(&r), ["10.0.0.5:3000", "10.0.0.6:3000"], "no address keeps the set");
        round().await;
        assert_eq!(labels(&r), ["10.0.0.6:3000"]);
        assert_eq!(series(&registry), ["10.0.0.6:3000"]);
        // A resolver that never answers: the round ends at the lookup timeout, the set stays.
        round().await;
        tokio::time::sleep(LOOKUP_TIMEOUT).await;
        assert_eq!(labels(&r), ["10.0.0.6:3000"]);
        assert_eq!(asked.lock().unwrap()[0], ("orders.internal".to_owned(), 3000));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in [
            "upstream_lookups_total{upstream=\"orders\",outcome=\"changed\"} 2",
            "upstream_lookups_total{upstream=\"orders\",outcome=\"failed\"} 3",
        ] {
            assert!(out.contains(line), "{line} in\n{out}");
        }
        // The upstream goes (a reload): the lookups end, and its series with it.
        drop(r);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(task.is_finished());
        assert!(series(&registry).is_empty());
    }
}
