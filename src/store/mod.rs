//! Store: the state of every key, shared by all gateway instances.
//!
//! Each key is a small state machine ([`State`]: in progress, completed, executed, unknown,
//! released), drawn once, with every transition, in docs/architecture.md ("The state of a
//! key"). What the store does is four narrow roles (see `roles`): the key's [`Lifecycle`],
//! [`Lookups`] of unknown outcomes, what an [`Operator`] does, the [`Quota`] of new keys;
//! each call is one atomic step in the store.
//!
//! Two engines implement every role and pass one conformance suite
//! (`tests/store_contract.rs`): [`RedisStore`] (Lua scripts, any number of instances) and
//! [`MemoryStore`] (one process). The configured one is a [`Backend`], which also times every
//! call.

mod backend;
mod health;
mod index;
mod memory;
mod record;
mod redis;
mod roles;
mod state;
mod waiters;

use std::time::Duration;

use sha2::{Digest, Sha256};
use thiserror::Error;

pub use self::backend::{Backend, CallLabel, Engine};
pub use self::index::{Cursor, IndexEntry, IndexKey, Page, unix_ms};
pub use self::memory::MemoryStore;
pub use self::record::{RecordError, StoredResponse};
pub use self::redis::{Persistence, RedisStore, Settings, Severity};
pub use self::roles::{Lifecycle, Lookups, Operator, Quota};
pub use self::state::State;
pub use self::waiters::Watch;
pub use crate::body::Payload;

use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;

/// The store's name for one (route, scope, key): a hash, so that client input never lands in
/// a Redis key name (no injection, no steering of cluster hash slots).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey(String);

impl RecordKey {
    /// Names the record of `key` sent by `scope` to `route`.
    pub fn new(prefix: &str, route: &str, scope: &Scope, key: &IdempotencyKey) -> Self {
        let mut h = Sha256::new();
        h.update(b"idemgate-record-v1\0");
        for part in [route.as_bytes(), scope.as_bytes(), key.as_str().as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        // `s:`, a record held as one string; earlier versions kept hashes under `r:`, which
        // this version neither reads nor trips over (a string command on a hash would fail).
        Self(hashed_name(prefix, ":s:", &h.finalize()))
    }

    /// The name as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short form for logs: enough to correlate, too little to be a key name.
    pub fn short(&self) -> &str {
        let hash = self.0.rsplit(':').next().unwrap_or(&self.0);
        &hash[..hash.len().min(12)]
    }
}

/// `{prefix}{kind}{hash in hex}`, in one allocation of the right size. (`format!` over
/// `hex::encode` took 3.4k instructions per request: a `char` iterator, then formatting.)
fn hashed_name(prefix: &str, kind: &str, hash: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut name = String::with_capacity(prefix.len() + kind.len() + 2 * hash.len());
    name.push_str(prefix);
    name.push_str(kind);
    for &b in hash {
        name.push(char::from(DIGITS[usize::from(b >> 4)]));
        name.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    name
}

/// The store's name for one budget of new keys: a route and a caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuotaKey(String);

impl QuotaKey {
    /// Names the budget of `scope` on `route`.
    pub fn new(prefix: &str, route: &str, scope: &Scope) -> Self {
        let mut h = Sha256::new();
        h.update(b"idemgate-quota-v1\0");
        h.update((route.len() as u64).to_be_bytes());
        h.update(route.as_bytes());
        h.update(scope.as_bytes());
        Self(hashed_name(prefix, ":q:", &h.finalize()))
    }

    /// The name as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What every store call answers, or why it failed.
pub type Result<T> = std::result::Result<T, StoreError>;

/// How long a claim holds its key: the lease, which the running request renews, and how long
/// the open claim's record is kept at most (never shorter than the lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// How long the lease lasts from the claim or its last renewal.
    pub lease: Duration,
    /// How long the record of an open claim is kept.
    pub ttl: Duration,
}

/// A random token naming the owner of one claim.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh random token, made before the claim call that uses it.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnerToken({})", hex::encode(&self.0[..4]))
    }
}

/// The right to run one request upstream. Not `Clone`: the exchange ends it exactly once,
/// by settling it ([`Lifecycle::settle`]) or releasing it ([`Lease::into_release`]). A lease that
/// is dropped instead (the process died, a bug) simply expires and is taken over.
#[derive(Debug)]
#[must_use = "a lease must be settled or released, or its key stays blocked until it expires"]
pub struct Lease {
    key: RecordKey,
    owner: OwnerToken,
    attempt: u32,
    terms: Terms,
    /// When the claim was sent, by this gateway's monotonic clock: the store applied it no
    /// earlier, so the lease ends no earlier than this plus its duration.
    sent: tokio::time::Instant,
}

impl Lease {
    pub(crate) fn new(
        key: RecordKey,
        owner: OwnerToken,
        attempt: u32,
        terms: Terms,
        sent: tokio::time::Instant,
    ) -> Self {
        Self { key, owner, attempt, terms, sent }
    }

    /// When the claim that made this lease was sent (the lease began no earlier).
    pub fn sent(&self) -> tokio::time::Instant {
        self.sent
    }

    /// The owner token.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// How long a released tombstone is kept.
    pub fn release_ttl(&self) -> Duration {
        self.terms.ttl
    }

    /// The record this lease is for.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// 1 for the first claim, +1 for every takeover of an expired lease.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How long the lease lasts from its last renewal.
    pub fn duration(&self) -> Duration {
        self.terms.lease
    }

    /// Consumes the lease for a release: its key, owner and tombstone ttl.
    pub fn into_release(self) -> (RecordKey, OwnerToken, Duration) {
        (self.key, self.owner, self.terms.ttl)
    }
}

/// Whether a released request may have reached the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// It may have: its attempt number is used up.
    Maybe,
    /// It certainly did not (never forwarded, or the connection was refused): the next
    /// execution gets its attempt number.
    No,
}

/// How a claim that ran ends in the store.
#[derive(Debug, Clone, Copy)]
pub enum Final<'a> {
    /// The whole response, replayed to every retry.
    Response(&'a StoredResponse),
    /// The request ran and answered, but its body was too large to keep: the status and
    /// headers (the body empty), so retries learn what happened without running it again
    /// (as `response-not-stored`).
    Executed(&'a StoredResponse),
    /// The request was sent and no complete answer came back: nobody knows whether the
    /// upstream acted on it. Retries are refused until a lookup (see `reconcile`) or an
    /// operator settles the key.
    Unknown {
        /// How long from now until a lookup's "not found" can be trusted: zero when the
        /// upstream closed the connection itself, else until the upstream's timeout plus
        /// `release_after` have passed since the request was sent (it may still be running).
        trusted_in: Duration,
    },
}

impl Final<'_> {
    /// The state the record is left in.
    pub fn state(&self) -> State {
        match self {
            Self::Response(_) => State::Completed,
            Self::Executed(_) => State::Executed,
            Self::Unknown { .. } => State::Unknown,
        }
    }
}

/// The result of claiming a key.
#[derive(Debug)]
pub enum Claim {
    /// This request owns the key and runs upstream.
    Acquired(Lease),
    /// The first request finished; here is its response to replay.
    Completed(StoredResponse),
    /// The first request ran, but its body was not stored: its status and headers (a retry
    /// gets them as `response-not-stored`).
    Executed(StoredResponse),
    /// The first request was sent and its outcome is unknown; `attempt` executions may have
    /// reached the upstream.
    Unknown {
        /// Executions that may have reached the upstream.
        attempt: u32,
    },
    /// Another request holds the key and its lease is live for `lease_left`.
    InFlight { lease_left: Duration },
    /// The key was used with a different fingerprint.
    Mismatch,
}

/// What starting a lookup of an unknown record found (see [`Lookups::lookup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The lookup is this caller's; `attempt` executions may have reached the upstream.
    Started {
        /// Executions that may have reached the upstream.
        attempt: u32,
    },
    /// Another lookup holds the key for `left` more at most; its end wakes a [`Watch`].
    Busy {
        /// Time left on that lookup's lease.
        left: Duration,
    },
    /// The record is no longer unknown (or is another request's): claim it again to see.
    Moved,
}

/// What a lookup learned, to be written to its record.
#[derive(Debug, Clone, Copy)]
pub enum LookupEnd<'a> {
    /// The upstream has the request's answer: the record becomes completed with it, kept for
    /// `retention`.
    Found {
        /// The answer to replay.
        response: &'a StoredResponse,
        /// How long it is replayed.
        retention: Duration,
    },
    /// The upstream says the request never ran: released (as the next attempt) if that can
    /// be trusted by now, with a tombstone kept for `ttl`.
    NotFound {
        /// How long the released tombstone is kept.
        ttl: Duration,
    },
    /// No usable answer: the record stays unknown, free for the next lookup.
    Failed,
}

/// The result of ending a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupEnded {
    /// The record was written.
    Done,
    /// "Not found" cannot be trusted for `left` more (the upstream may still be running the
    /// request); the record stays unknown, free for the next lookup.
    TooEarly {
        /// Time until it can be trusted.
        left: Duration,
    },
    /// The lookup was no longer this caller's (an operator settled the key, or its lease
    /// passed and another lookup took over); nothing was written.
    Lost,
}

/// The result of an operator's resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Completed with the operator's answer; the state it had.
    Done {
        /// [`State::Unknown`] or [`State::Executed`].
        was: State,
    },
    /// Nothing changed: the record is in another state, or absent (`None`).
    Refused {
        /// Its state.
        state: Option<State>,
    },
}

/// The result of an operator's purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purged {
    /// Released; the state it had (any but [`State::Released`]).
    Released {
        /// The state it had.
        was: State,
    },
    /// Not released: a request holds the key, its lease live for `lease_left` (it may be
    /// running upstream now), and the purge was not forced.
    Refused {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// Nothing to release: no record, or one already released.
    Nothing,
}

/// The result of renewing a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease runs for its full duration again.
    Renewed,
    /// The claim is no longer ours (taken over, purged or expired from the store).
    Lost,
}

/// The result of settling or releasing a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The transition happened.
    Done,
    /// The claim was no longer ours; nothing was written.
    Lost,
}

/// What the store holds for one key, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The state, with what it holds.
    pub state: EntryState,
    /// Executions that may have reached the upstream so far.
    pub attempt: u32,
    /// Time until the record is dropped.
    pub expires_in: Duration,
}

/// The state of a record, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// A claim is open; `lease_left` is zero when it can be taken over.
    InProgress {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// A response is stored.
    Completed {
        /// The stored status code.
        status: u16,
        /// Size of the stored body.
        body_len: usize,
    },
    /// The request ran; its body was not stored.
    Executed {
        /// The status it answered with.
        status: u16,
    },
    /// The request's outcome is unknown; retries are refused.
    Unknown {
        /// Time left on the lease of the lookup of the key that is running, if one is.
        lookup: Option<Duration>,
        /// How long until a lookup's "not found" is proof that the request never ran (zero:
        /// it is already); `None` when it never will be (a record written without that time).
        trusted_in: Option<Duration>,
    },
    /// Released: the next request runs, as the next attempt.
    Released,
}

impl EntryState {
    /// The state, without what it holds.
    pub fn state(&self) -> State {
        match self {
            Self::InProgress { .. } => State::InProgress,
            Self::Completed { .. } => State::Completed,
            Self::Executed { .. } => State::Executed,
            Self::Unknown { .. } => State::Unknown,
            Self::Released => State::Released,
        }
    }
}

/// Why a store call failed. Any of these makes the route apply its `on_store_error` policy.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The store could not be reached or refused the command.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call did not finish within the configured timeout.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The store answered something this gateway cannot read.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// A Redis Cluster slot is moving or its shard has no primary yet (`ASK`, `MOVED`,
    /// `TRYAGAIN`, `CLUSTERDOWN`, left after the client's own redirections): the same call
    /// may work a moment later, or in another form.
    #[error("store slot moving: {0}")]
    Migrating(String),
    /// The memory store is at its bound and holds only open claims.
    #[error("memory store is full")]
    Full,
    /// The store answered and refused the command itself (an argument, a key of another
    /// type, a script's error): not an outage, a bug or a misconfigured store.
    #[error("store refused the command: {0}")]
    Rejected(String),
}

#[cfg(test)]
mod names {
    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use crate::policy::key;

    /// Record and budget names are what Redis holds: a change to them would orphan every
    /// record stored before it. These were computed independently (SHA-256 over the same
    /// length-prefixed parts) and match what earlier versions wrote.
    #[test]
    fn record_and_budget_names_are_pinned() {
        let header = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        headers.insert(&header, HeaderValue::from_static("order-1234"));
        let key = key::extract(&headers, &header, 255).unwrap().unwrap();
        let scope = Scope::from_hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f").unwrap();
        let record = RecordKey::new("app", "orders", &scope, &key);
        assert_eq!(record.as_str(), "app:s:a93d6ca578a5ecb796e80e15a17f7df2a74ab5f07c4e437d40c097c1ff0a0780");
        assert_eq!(record.short(), "a93d6ca578a5");
        assert_eq!(
            QuotaKey::new("app", "orders", &scope).as_str(),
            "app:q:6ec303631d1347e7a293fab359ffaa01a301ee914f3b308fb85af243fa83f69e"
        );
    }

    #[test]
    fn the_short_form_of_any_name_is_its_last_part() {
        assert_eq!(RecordKey("idem:s:0123456789abcdef".into()).short(), "0123456789ab");
        assert_eq!(RecordKey("plain".into()).short(), "plain");
        let tail = format!("{}:{}", "a".repeat(40), "b".repeat(23));
        assert_eq!(RecordKey(format!("p:{tail}")).short(), "bbbbbbbbbbbb", "the part after the last ':'");
    }
}
