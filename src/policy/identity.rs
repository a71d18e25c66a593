//! Identity: what names a route's records, and what its fingerprints hash, across change.
//!
//! A record's name is a hash of (store prefix, route, scope, key), the host being part of the
//! scope on a route that keeps each host apart; the route's name is also hashed into every
//! fingerprint. Configuration changes while records are in retention, so a setting that
//! enters a name must keep naming the records it already made: a renamed route, or a route
//! that goes from one exact host to several, would otherwise look for every retry under a new
//! name and run it again.
//!
//! The hazard that decides the design: a key has ONE name at any moment, on every gateway.
//! Looking a key up under an old and a new name in one claim is not atomic (in Redis Cluster
//! the two names land in different slots), and a gateway still running the old file in a
//! rolling deploy only ever claims the old name. So a change keeps the names records in
//! retention have, and only what is new gets a new name: a route's identity (`name`, `host`,
//! `per_host` under `[routes.idempotency.identity]`) pins the name and the host-splitting its
//! records were made under. A pin never merges tenants: two hosts' records never share a
//! name once both exist (one host at most keeps the shared names, and no two routes share an
//! identity).
//!
//! A fingerprint setting (`ignore`, `fingerprint_headers`) cannot be pinned that way: the
//! request must be judged by today's settings. `previous_fingerprint` names the settings the
//! records in retention were made under: a retry that differs from its record under today's
//! settings is judged once more under those (a second claim, only then), so an honest retry
//! still replays.

use super::fingerprint::FingerprintSpec;
use super::scope::Scope;

/// How the hosts a route serves enter its records' names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostNames {
    /// One key space for every host the route serves: a route without `hosts`, or with one
    /// exact host.
    Shared,
    /// Each host a key space of its own: a route with several hosts or a wildcard (so one
    /// tenant is never answered with another's record), or pinned with `per_host = true`.
    Apart,
    /// Each host apart, except this one (normalised), which keeps the shared names it had
    /// when it was the route's one host (`host = "..."`).
    ApartExcept(String),
}

impl HostNames {
    /// What a route's hosts give when nothing is pinned: one exact host (or none) shares,
    /// several hosts or a wildcard keep each host apart.
    pub fn default_for(exact_hosts: usize, wildcards: usize) -> Self {
        if exact_hosts + wildcards > 1 || wildcards > 0 { Self::Apart } else { Self::Shared }
    }

    /// Whether requests on `host` get a key space of their own.
    pub fn apart(&self, host: &str) -> bool {
        match self {
            Self::Shared => false,
            Self::Apart => true,
            Self::ApartExcept(kept) => kept != host,
        }
    }

    /// Whether some host is kept apart: then naming a record needs its host.
    pub fn any_apart(&self) -> bool {
        !matches!(self, Self::Shared)
    }

    /// The configuration's words, for `check` and the published policy.
    pub fn describe(&self) -> String {
        match self {
            Self::Shared => "one key space for every host".into(),
            Self::Apart => "each host apart".into(),
            Self::ApartExcept(host) => format!("each host apart, but {host} keeps the names of a one-host route"),
        }
    }
}

/// The identity a route's records are made under.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The route name in record names, budget names, the index of held keys and fingerprints:
    /// the route's own name unless pinned.
    pub name: String,
    /// How hosts enter record names.
    pub hosts: HostNames,
    /// Fingerprint settings the records in retention were made under, when they differ from
    /// the route's own (`previous_fingerprint`).
    pub previous_fingerprint: Option<FingerprintSpec>,
    /// What the route's own settings would give without a pin: requests named otherwise are
    /// counted as hits on the pin.
    pub unpinned: Unpinned,
}

/// A route's identity as its own name and hosts would make it, to tell where a pin decides.
#[derive(Debug, Clone)]
pub struct Unpinned {
    /// Whether `name` differs from the route's name.
    pub renamed: bool,
    /// The host naming the route's hosts give by default.
    pub hosts: HostNames,
}

/// What a pin decided for one request's record name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinHit {
    /// The record is named under a pinned route name.
    Name,
    /// The record is named under a pinned host naming.
    Host,
}

impl Identity {
    /// The identity of a route named `route` with nothing pinned.
    pub fn unpinned(route: &str, hosts: HostNames) -> Self {
        Self {
            name: route.to_owned(),
            hosts: hosts.clone(),
            previous_fingerprint: None,
            unpinned: Unpinned { renamed: false, hosts },
        }
    }

    /// Whether naming a record needs the request's host.
    pub fn needs_host(&self) -> bool {
        // A pin only ever keeps more apart than the route's hosts would (it never merges
        // tenants), so the pinned naming says it for both.
        self.hosts.any_apart()
    }

    /// The scope a record is named under: the caller's, within `host` where hosts are apart.
    /// A request reaches a route with hosts only when it named one, so `None` is not reached
    /// where it matters (and is "" there).
    pub fn scope(&self, scope: Scope, host: Option<&str>) -> Scope {
        let host = host.unwrap_or("");
        if self.hosts.apart(host) { scope.within_host(host) } else { scope }
    }

    /// The pin that decides this request's record name, if one does.
    pub fn pin_hit(&self, host: Option<&str>) -> Option<PinHit> {
        if self.unpinned.renamed {
            return Some(PinHit::Name);
        }
        if self.hosts == self.unpinned.hosts {
            return None;
        }
        let host = host.unwrap_or("");
        (self.hosts.apart(host) != self.unpinned.hosts.apart(host)).then_some(PinHit::Host)
    }

    /// Whether any part of this identity is pinned.
    pub fn is_pinned(&self) -> bool {
        self.unpinned.renamed || self.hosts != self.unpinned.hosts || self.previous_fingerprint.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope::from_hex(&"ab".repeat(32)).unwrap()
    }

    #[test]
    fn one_exact_host_or_none_shares_and_several_or_a_wildcard_keep_hosts_apart() {
        assert_eq!(HostNames::default_for(0, 0), HostNames::Shared);
        assert_eq!(HostNames::default_for(1, 0), HostNames::Shared);
        assert_eq!(HostNames::default_for(2, 0), HostNames::Apart);
        assert_eq!(HostNames::default_for(0, 1), HostNames::Apart);
        assert_eq!(HostNames::default_for(1, 1), HostNames::Apart);
    }

    /// Adding a tenant to a one-host route with `host` pinned: the first host keeps the very
    /// scope it had, the new one gets its own, and the two never meet.
    #[test]
    fn a_kept_host_keeps_its_shared_scope_and_never_meets_another_host() {
        let one_host = Identity::unpinned("orders", HostNames::Shared);
        let mut two_hosts = Identity::unpinned("orders", HostNames::Apart);
        two_hosts.hosts = HostNames::ApartExcept("t1.example.com".into());
        let before = one_host.scope(scope(), Some("t1.example.com"));
        assert_eq!(two_hosts.scope(scope(), Some("t1.example.com")), before, "t1's records keep their names");
        let t2 = two_hosts.scope(scope(), Some("t2.example.com"));
        assert_ne!(t2, before, "t2 is never answered with t1's records");
        assert_eq!(t2, scope().within_host("t2.example.com"));
        assert_eq!(two_hosts.pin_hit(Some("t1.example.com")), Some(PinHit::Host));
        assert_eq!(two_hosts.pin_hit(Some("t2.example.com")), None);
        assert!(two_hosts.needs_host() && !one_host.needs_host());
    }

    #[test]
    fn a_pinned_name_is_a_hit_on_every_request() {
        let mut renamed = Identity::unpinned("orders", HostNames::Shared);
        renamed.unpinned.renamed = true;
        assert_eq!(renamed.pin_hit(None), Some(PinHit::Name));
        assert!(renamed.is_pinned());
        assert!(!Identity::unpinned("orders", HostNames::Shared).is_pinned());
    }
}
