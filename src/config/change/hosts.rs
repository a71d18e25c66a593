//! How the hosts two routes serve split their records' names, before and after: a host
//! that shared one key space and gets its own (or the reverse) has its records renamed.

use super::{Comparison, Verdict, words};
use crate::config::{HostPattern, RouteConfig};
use crate::policy::IdempotencyPolicy;
use crate::policy::identity::HostNames;

/// How each host the two routes both serve is named before and after.
pub(super) fn compare(
    out: &mut Comparison,
    (o, op): (&RouteConfig, &IdempotencyPolicy),
    (n, np): (&RouteConfig, &IdempotencyPolicy),
) {
    let (was, now) = (&op.identity.hosts, &np.identity.hosts);
    let mut split = Vec::new(); // shared before, apart now
    let mut joined = Vec::new(); // apart before, shared now
    for (host, shown) in probes(&o.hosts, &n.hosts) {
        if !(serves(&o.hosts, &host) && serves(&n.hosts, &host)) {
            continue;
        }
        match (was.apart(&host), now.apart(&host)) {
            (false, true) => split.push(shown),
            (true, false) => joined.push(shown),
            _ => {}
        }
    }
    let retention = words(op.retention);
    if let Some(first) = split.first() {
        let hosts = split.join(", ");
        if matches!(now, HostNames::ApartExcept(_)) {
            // One host keeps the shared names; the others shared them with it before, and
            // keeping them too would merge tenants from now on.
            out.add(
                Some(&n.name),
                "hosts",
                Verdict::Said,
                format!(
                    "{hosts} shared one key space with the kept host before and each gets its own now: their retries \
                     of requests answered in the last {retention} run again (keeping them would merge tenants)"
                ),
            );
        } else {
            out.refuse(
                &n.name,
                "hosts",
                format!(
                    "records of {hosts} were named without the host and would be named per host: retries of requests \
                     answered there in the last {retention} would run again"
                ),
                if first.starts_with('*') || first.starts_with("every") {
                    "a route's identity keeps at most one exact host's names: name it in [routes.idempotency.identity] \
                     host = \"...\"; the others' records start apart."
                        .to_owned()
                } else {
                    format!("keep them with [routes.idempotency.identity] host = {first:?} on route {:?}.", n.name)
                },
            );
        }
    }
    if !joined.is_empty() {
        out.refuse(
            &n.name,
            "hosts",
            format!(
                "records of {} were kept per host and would share one key space: retries of requests answered there \
                 in the last {retention} would run again",
                joined.join(", ")
            ),
            format!("keep hosts apart with [routes.idempotency.identity] per_host = true on route {:?}.", n.name),
        );
    }
    if split.is_empty() && joined.is_empty() && was != now {
        out.add(
            Some(&n.name),
            "hosts",
            Verdict::Kept,
            format!("{}; no record in retention is renamed", now.describe()),
        );
    }
}

/// One host per exact name either route lists, one that stands for each wildcard, and one for
/// every other host when either route serves every host; each with how it is shown.
fn probes(a: &[HostPattern], b: &[HostPattern]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pattern in a.iter().chain(b) {
        let probe = match pattern {
            HostPattern::Exact(name) => (name.clone(), name.clone()),
            // No exact host is written with this first label.
            HostPattern::Wildcard(suffix) => (format!("0--any{suffix}"), format!("*{suffix}")),
        };
        if !out.contains(&probe) {
            out.push(probe);
        }
    }
    if a.is_empty() || b.is_empty() {
        out.push(("0--any.invalid".into(), "every other host".into()));
    }
    out
}

/// Whether a route with `hosts` serves `host`.
fn serves(hosts: &[HostPattern], host: &str) -> bool {
    hosts.is_empty() || hosts.iter().any(|h| h.matches(host))
}
