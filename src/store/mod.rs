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
mod names;
mod record;
mod redis;
mod roles;
mod state;
mod waiters;

use std::time::Duration;

use thiserror::Error;

pub use self::backend::{Backend, CallLabel, Engine};
pub use self::index::{Cursor, IndexEntry, IndexKey, Page, unix_ms};
pub use self::memory::MemoryStore;
pub use self::names::{OwnerToken, QuotaKey, RecordKey};
pub use self::record::{RecordError, StoredResponse};
pub use self::redis::{Persistence, RedisStore, Settings, Severity};
pub use self::roles::{Lifecycle, Lookups, Operator, Quota};
pub use self::state::State;
pub use self::waiters::Watch;
pub use crate::body::Payload;

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

    /// The lease of a claim whose call failed: it may have been made under `owner` (its reply
    /// was lost) or not at all, so its attempt number is unknown (0). Settling or releasing it
    /// changes the record only if the claim was made.
    pub(crate) fn unconfirmed(key: RecordKey, owner: OwnerToken, terms: Terms, sent: tokio::time::Instant) -> Self {
        Self { key, owner, attempt: 0, terms, sent }
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
