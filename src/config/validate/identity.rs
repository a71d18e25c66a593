//! `[routes.idempotency.identity]`: what names a route's records, over what its name and
//! hosts give (see `policy::identity` for why a pin exists and what it must never do).

use http::HeaderName;

use super::{Issues, header_name, valid_route_name};
use crate::config::file::IdentitySection;
use crate::config::{HostPattern, RouteConfig};
use crate::policy::fingerprint::{FingerprintSpec, JsonPointer};
use crate::policy::identity::{HostNames, Identity, Unpinned};

/// `[routes.idempotency.identity]`, over what the route's name and hosts give: a pin keeps
/// the names records in retention have, and never lets two hosts' records share one.
pub(super) fn identity(
    key: &str,
    route: &str,
    hosts: &[HostPattern],
    s: Option<&IdentitySection>,
    fingerprint: &FingerprintSpec,
    issues: &mut Issues,
) -> Option<Identity> {
    let wildcards = hosts.iter().filter(|h| h.is_wildcard()).count();
    let by_hosts = HostNames::default_for(hosts.len() - wildcards, wildcards);
    let Some(s) = s else { return Some(Identity::unpinned(route, by_hosts)) };
    let mut ok = true;
    let name = match &s.name {
        Some(name) if !valid_route_name(name) => {
            issues.add(format!("{key}.name"), format!("{name:?} must be non-empty and use only A-Z a-z 0-9 - _ ."));
            ok = false;
            route.to_owned()
        }
        Some(name) => name.clone(),
        None => route.to_owned(),
    };
    let kept = match &s.host {
        None => None,
        Some(text) => match HostPattern::parse(text) {
            Ok(HostPattern::Exact(host)) if hosts.is_empty() || hosts.iter().any(|h| h.matches(&host)) => Some(host),
            Ok(HostPattern::Exact(host)) => {
                issues.add(format!("{key}.host"), format!("{host:?} is not a host this route serves"));
                ok = false;
                None
            }
            Ok(HostPattern::Wildcard(_)) => {
                issues.add(
                    format!("{key}.host"),
                    format!("{text:?}: name the one exact host whose records keep their names, not a wildcard"),
                );
                ok = false;
                None
            }
            Err(e) => {
                issues.add(format!("{key}.host"), e);
                ok = false;
                None
            }
        },
    };
    let hosts = match (kept, s.per_host) {
        (Some(host), None | Some(true)) => HostNames::ApartExcept(host),
        (Some(_), Some(false)) => {
            issues.add(
                format!("{key}.per_host"),
                "false contradicts host, which keeps one host's names and every other host apart; leave one out",
            );
            ok = false;
            by_hosts.clone()
        }
        (None, Some(true)) => HostNames::Apart,
        (None, Some(false)) if by_hosts == HostNames::Apart => {
            issues.add(
                format!("{key}.per_host"),
                "false would let the tenants of this route's hosts share records (one would be answered with \
                 another's); to keep the records of a route that had one host, name it in host instead",
            );
            ok = false;
            by_hosts.clone()
        }
        (None, Some(false) | None) => by_hosts.clone(),
    };
    let previous_fingerprint = match &s.previous_fingerprint {
        None => None,
        Some(p) => {
            let at = format!("{key}.previous_fingerprint");
            let ignore: Vec<JsonPointer> = p
                .ignore
                .iter()
                .flatten()
                .filter_map(|text| issues.check(&format!("{at}.ignore"), JsonPointer::parse(text)))
                .collect();
            let headers: Vec<HeaderName> = p
                .fingerprint_headers
                .iter()
                .flatten()
                .filter_map(|h| header_name(issues, &format!("{at}.fingerprint_headers"), h))
                .collect();
            let previous = FingerprintSpec { ignore, headers };
            if previous == *fingerprint {
                issues.add(
                    at,
                    "is the route's own fingerprint settings: leave it out (it is for records made under other ones)",
                );
                ok = false;
            }
            Some(previous)
        }
    };
    let renamed = name != route;
    ok.then_some(Identity { name, hosts, previous_fingerprint, unpinned: Unpinned { renamed, hosts: by_hosts } })
}

/// Two routes never share an identity: their records would share names, and one route's
/// callers would be answered with the other's records.
pub(super) fn distinct(routes: &[RouteConfig], issues: &mut Issues) {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let Some(policy) = &route.idempotency else { continue };
        let name = policy.identity.name.as_str();
        if let Some((_, other)) = seen.iter().find(|(identity, _)| *identity == name) {
            let at = if policy.identity.unpinned.renamed { "idempotency.identity.name" } else { "name" };
            issues.add(
                format!("routes[{i}].{at}"),
                format!("{name:?} already names the records of route {other:?}: two routes would share records"),
            );
        } else {
            seen.push((name, &route.name));
        }
    }
}
