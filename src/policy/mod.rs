//! The idempotency policy of one route: everything `[routes.idempotency]` decides, parsed and
//! checked once at load so the request path reads plain values, and the three readings of a
//! request that the policy defines:
//!
//! - [`key`]: the `Idempotency-Key` header, as the IETF draft spells it;
//! - [`scope`]: whose key it is (the caller, from authentication, never from the body);
//! - [`fingerprint`]: what makes two requests the same request;
//! - [`identity`]: what names the route's records, kept across configuration changes.
//!
//! These are what a route promises its clients (`idemgate policy` publishes them), so they
//! live apart from the request path that applies them: the configuration builds them, the
//! store names records by them, the request path reads requests with them.

pub mod errors;
pub mod fingerprint;
pub mod identity;
pub mod key;
pub mod reconcile;
pub mod scope;

use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};

use self::fingerprint::FingerprintSpec;
use self::identity::Identity;
use self::key::{IdempotencyKey, KeyError};
use self::reconcile::Reconcile;
use self::scope::{MissingScope, Scope, ScopeMissing, ScopeSource};
use crate::headers::StoredHeaders;

/// What an idempotent route does, per request.
#[derive(Debug, Clone)]
pub struct IdempotencyPolicy {
    /// Whether the route enforces the policy or only observes what enforcing would do.
    pub mode: Mode,
    /// A request without a key gets 400 (else it is passed through without idempotency).
    pub required: bool,
    /// The key header.
    pub header: HeaderName,
    /// Longest accepted key.
    pub max_key_len: usize,
    /// Whose key space a request belongs to.
    pub scope: ScopeSource,
    /// What names the route's records: the route name they are made under and whether the
    /// request's host is part of the key space (on a route that serves several hosts, or a
    /// wildcard, tenants under one route never share records).
    pub identity: Identity,
    /// What a keyed request without its scope gets.
    pub on_missing_scope: MissingScope,
    /// What besides method, path, query and body goes into the fingerprint.
    pub fingerprint: FingerprintSpec,
    /// Claim duration without renewal.
    pub lease: Duration,
    /// Whether the owner renews its lease while the upstream call runs.
    pub renew: bool,
    /// How long a duplicate waits for the first request.
    pub wait: Duration,
    /// How long a completed response is replayed.
    pub retention: Duration,
    /// Which upstream statuses are stored.
    pub store_statuses: StatusSet,
    /// Largest request body accepted.
    pub max_request_body: usize,
    /// Largest response body stored.
    pub max_stored_body: usize,
    /// Which response headers are stored for replay.
    pub stored_headers: StoredHeaders,
    /// What happens when the store cannot be reached.
    pub on_store_error: StoreFailurePolicy,
    /// Header that marks replayed responses.
    pub replay_header: HeaderName,
    /// Whether operate tokens may see the start of a stored body (`GET /keys ... include=body`,
    /// the console). Off by default: bodies carry customers' data.
    pub admin_body_preview: bool,
    /// What a request that was sent but got no complete answer leaves behind.
    pub on_unknown_outcome: UnknownOutcomePolicy,
    /// Header that tells the upstream which execution of the key this is; `None` sends none.
    pub attempt_header: Option<HeaderName>,
    /// At most this many new keys per caller per window (`max_new_keys`), if set.
    pub max_new_keys: Option<Quota>,
    /// How an unknown outcome is asked of the upstream (`[routes.idempotency.reconcile]`).
    pub reconcile: Option<Reconcile>,
}

/// `mode`: whether a route enforces its policy, or forwards every request as a pass-through
/// route would and counts what enforcing would have done (to adopt the gateway on a live API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Claim, replay, refuse: the gateway's guarantees.
    Enforce,
    /// Answer every request exactly as a pass-through route would; claim keyed requests
    /// (one store round trip), settle the first one's answer, count the rest.
    Observe,
}

impl Mode {
    /// Parses `"enforce"` or `"observe"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "enforce" => Ok(Self::Enforce),
            "observe" => Ok(Self::Observe),
            other => Err(format!("{other:?} is neither \"enforce\" nor \"observe\"")),
        }
    }

    /// The configuration's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Observe => "observe",
        }
    }
}

/// A budget of new keys: `count` per `window` (`"100/s"`, `"6000/m"`, `"50/10s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Keys allowed per window.
    pub count: u64,
    /// The window.
    pub window: Duration,
}

impl Quota {
    /// Parses `COUNT/UNIT` or `COUNT/DURATION`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a rate like \"100/s\", \"6000/m\" or \"50/10s\"");
        let (count, per) = text.split_once('/').ok_or_else(bad)?;
        let count: u64 = count.trim().parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
        let window = match per.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            other => humantime::parse_duration(other).map_err(|_| bad())?,
        };
        if window < Duration::from_millis(100) {
            return Err(format!("{text:?}: the window must be at least 100ms"));
        }
        Ok(Self { count, window })
    }
}

/// What happens to a key whose request was sent upstream without a complete answer coming
/// back (`on_unknown_outcome`): a timeout after the request was written, a reset, a truncated
/// body. The upstream may or may not have acted on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownOutcomePolicy {
    /// The key is held as *unknown* for the retention: retries get 502 `outcome-unknown` and
    /// nothing is forwarded until an operator releases it. Never a second execution.
    Hold,
    /// The key is released and a retry runs again: for upstreams that deduplicate on the key.
    Release,
}

impl UnknownOutcomePolicy {
    /// Parses `"hold"` or `"release"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "hold" => Ok(Self::Hold),
            "release" => Ok(Self::Release),
            other => Err(format!("{other:?} is neither \"hold\" nor \"release\"")),
        }
    }
}

impl IdempotencyPolicy {
    /// The request's key, read as this route reads it; `Ok(None)` when it sent none.
    pub fn key(&self, headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
        key::extract(headers, &self.header, self.max_key_len)
    }

    /// The caller's scope, read from this route's sources, on `host` where the route keeps
    /// hosts apart; `missing` says what a request without one of them gets (the route's
    /// `on_missing_scope` on the request path).
    pub fn scope(&self, headers: &HeaderMap, host: Option<&str>, missing: MissingScope) -> Result<Scope, ScopeMissing> {
        Ok(self.identity.scope(scope::derive(&self.scope, missing, headers)?, host))
    }

    /// How long an in-progress record may live in the store at most: long enough for the
    /// lease, and as long as the retention so that a crashed claim still answers 422 to a
    /// different body under its key until the key would have expired anyway.
    pub fn in_progress_ttl(&self) -> Duration {
        self.lease.max(self.retention)
    }
}

/// What to do when the store fails (`on_store_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailurePolicy {
    /// 503 with Retry-After; nothing is forwarded. Safe by default.
    FailClosed,
    /// Forward without idempotency, marked `Idempotency-Status: bypassed`; the upstream's own
    /// constraint is the only protection meanwhile.
    FailOpen,
}

impl StoreFailurePolicy {
    /// Parses the config values `"fail-closed"` and `"fail-open"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "fail-closed" => Ok(Self::FailClosed),
            "fail-open" => Ok(Self::FailOpen),
            other => Err(format!("{other:?} is neither \"fail-closed\" nor \"fail-open\"")),
        }
    }
}

/// A set of HTTP statuses, as a bitmap over 100..=599.
#[derive(Clone, PartialEq, Eq)]
pub struct StatusSet([u64; 8]);

impl StatusSet {
    /// No status at all.
    pub fn empty() -> Self {
        Self([0; 8])
    }

    /// Adds one status code (100..=599).
    pub fn insert(&mut self, code: u16) {
        if (100..600).contains(&code) {
            let i = usize::from(code - 100);
            self.0[i / 64] |= 1 << (i % 64);
        }
    }

    /// Takes one status code out.
    pub fn remove(&mut self, code: u16) {
        if (100..600).contains(&code) {
            let i = usize::from(code - 100);
            self.0[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Adds a whole class: `class = 2` adds 200..=299.
    pub fn insert_class(&mut self, class: u16) {
        for code in class * 100..class * 100 + 100 {
            self.insert(code);
        }
    }

    /// Builds a set from config entries: inclusions (`"2xx"`, `"201"`) first, then exclusions
    /// (`"!429"`, `"!5xx"`), whatever their order in the list.
    pub fn from_entries<S: AsRef<str>>(entries: &[S]) -> Result<Self, Vec<String>> {
        let mut set = Self::empty();
        let mut removed = Self::empty();
        let mut errors = Vec::new();
        for entry in entries {
            let text = entry.as_ref();
            let result = match text.trim().strip_prefix('!') {
                Some(excluded) => removed.insert_text(excluded),
                None => set.insert_text(text),
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
        for code in 100..600 {
            if removed.contains_code(code) {
                set.remove(code);
            }
        }
        if errors.is_empty() { Ok(set) } else { Err(errors) }
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: StatusCode) -> bool {
        self.contains_code(status.as_u16())
    }

    /// Whether the set holds `code`.
    pub fn contains_code(&self, code: u16) -> bool {
        if !(100..600).contains(&code) {
            return false;
        }
        let i = usize::from(code - 100);
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// Parses one config entry: `"2xx"` or `"201"`.
    pub fn insert_text(&mut self, text: &str) -> Result<(), String> {
        let t = text.trim().to_ascii_lowercase();
        if let Some(class) = t.strip_suffix("xx") {
            return match class.parse::<u16>() {
                Ok(c @ 1..=5) => {
                    self.insert_class(c);
                    Ok(())
                }
                _ => Err(format!("{text:?} is not a status class from \"1xx\" to \"5xx\"")),
            };
        }
        match t.parse::<u16>() {
            Ok(code @ 100..=599) => {
                self.insert(code);
                Ok(())
            }
            _ => Err(format!("{text:?} is neither a status code (100-599) nor a class like \"2xx\"")),
        }
    }
}

impl StatusSet {
    /// The set in the config's words: whole classes as `"2xx"`, a class with exceptions as
    /// `"4xx except 400, 429"`, single codes as themselves.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for class in 1..=5u16 {
            let codes: Vec<u16> = (class * 100..class * 100 + 100).collect();
            let inside: Vec<u16> = codes.iter().copied().filter(|c| self.contains_code(*c)).collect();
            if inside.is_empty() {
                continue;
            }
            let missing: Vec<u16> = codes.iter().copied().filter(|c| !self.contains_code(*c)).collect();
            let list = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
            if missing.is_empty() {
                parts.push(format!("{class}xx"));
            } else if missing.len() <= 10 {
                parts.push(format!("{class}xx except {}", list(&missing)));
            } else {
                parts.push(list(&inside));
            }
        }
        if parts.is_empty() { "none".into() } else { parts.join("; ") }
    }
}

impl std::fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count: u32 = self.0.iter().map(|word| word.count_ones()).sum();
        write!(f, "StatusSet({count} codes)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[&str]) -> StatusSet {
        let mut s = StatusSet::empty();
        for e in entries {
            s.insert_text(e).unwrap();
        }
        s
    }

    #[test]
    fn classes_and_codes() {
        let s = set(&["2xx", "409"]);
        assert!(s.contains(StatusCode::OK));
        assert!(s.contains(StatusCode::from_u16(299).unwrap()));
        assert!(s.contains(StatusCode::CONFLICT));
        assert!(!s.contains(StatusCode::BAD_REQUEST));
        assert!(!s.contains(StatusCode::INTERNAL_SERVER_ERROR));
    }

    #[test]
    fn exclusions_apply_after_inclusions() {
        let s = StatusSet::from_entries(&["!429", "2xx", "4xx", "!5xx", "500"]).unwrap();
        assert!(s.contains(StatusCode::NOT_FOUND));
        assert!(!s.contains(StatusCode::TOO_MANY_REQUESTS));
        assert!(!s.contains(StatusCode::INTERNAL_SERVER_ERROR), "an exclusion wins over an inclusion");
        assert!(StatusSet::from_entries(&["!6xx", "2xx", "x"]).unwrap_err().len() == 2);
    }

    #[test]
    fn bad_entries_are_rejected() {
        let mut s = StatusSet::empty();
        for bad in ["6xx", "0xx", "99", "600", "ok", "2x"] {
            assert!(s.insert_text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn status_sets_describe_themselves_in_config_words() {
        let default =
            StatusSet::from_entries(&["2xx", "3xx", "4xx", "!400", "!408", "!409", "!422", "!425", "!429"]).unwrap();
        assert_eq!(default.describe(), "2xx; 3xx; 4xx except 400, 408, 409, 422, 425, 429");
        assert_eq!(StatusSet::from_entries(&["201", "204"]).unwrap().describe(), "201, 204");
        assert_eq!(StatusSet::empty().describe(), "none");
    }

    #[test]
    fn quotas_parse() {
        assert_eq!(Quota::parse("100/s"), Ok(Quota { count: 100, window: Duration::from_secs(1) }));
        assert_eq!(Quota::parse("50/10s"), Ok(Quota { count: 50, window: Duration::from_secs(10) }));
        assert_eq!(Quota::parse("6000/m").unwrap().window, Duration::from_secs(60));
        for bad in ["100", "0/s", "x/s", "10/fortnight", "10/1ms"] {
            assert!(Quota::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn store_failure_policy_parses() {
        assert_eq!(StoreFailurePolicy::parse("fail-open"), Ok(StoreFailurePolicy::FailOpen));
        assert!(StoreFailurePolicy::parse("open").is_err());
    }
}
