//! What the key's [`Lifecycle`](crate::store::Lifecycle) speaks: the terms of a claim, its
//! lease, how it ends, and what each call answers.

use std::time::Duration;

use super::names::{OwnerToken, RecordKey};
use super::record::StoredResponse;
use super::state::State;

/// How long a claim holds its key: the lease, which the running request renews, and how long
/// the open claim's record is kept at most (never shorter than the lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// How long the lease lasts from the claim or its last renewal.
    pub lease: Duration,
    /// How long the record of an open claim is kept.
    pub ttl: Duration,
}

/// The right to run one request upstream, by the names the store knows it under: the record
/// and the owner token of the claim. Not `Clone`: the exchange ends it exactly once, by
/// settling it ([`Lifecycle::settle`](crate::store::Lifecycle::settle)) or releasing it ([`Lease::into_release`]). A lease that
/// is dropped instead (the process died, a bug) simply expires and is taken over.
///
/// Every call a lease makes is owner-checked in the store, so a lease whose claim call failed
/// (it may have been made, its reply lost, or not at all) can be held, renewed and ended all
/// the same: if the claim was never made, nothing changes.
#[derive(Debug)]
#[must_use = "a lease must be settled or released, or its key stays blocked until it expires"]
pub struct Lease {
    // Read by the engines, which name what they write after them.
    pub(in crate::store) key: RecordKey,
    pub(in crate::store) owner: OwnerToken,
    pub(in crate::store) terms: Terms,
    /// When the claim was sent, by this gateway's monotonic clock: the store applied it no
    /// earlier, so the lease ends no earlier than this plus its duration.
    sent: tokio::time::Instant,
}

impl Lease {
    /// The lease `owner` claimed, or tried to claim, on `key`, by a call sent at `sent`.
    pub(crate) fn new(key: RecordKey, owner: OwnerToken, terms: Terms, sent: tokio::time::Instant) -> Self {
        Self { key, owner, terms, sent }
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

    /// How long the lease lasts from its last renewal.
    pub fn duration(&self) -> Duration {
        self.terms.lease
    }

    /// Consumes the lease for a release: its key, owner and tombstone ttl.
    pub fn into_release(self) -> (RecordKey, OwnerToken, Duration) {
        (self.key, self.owner, self.terms.ttl)
    }
}

/// A lease the store granted ([`Claim::Acquired`]), with its attempt number: 1 for the first
/// claim, +1 for every execution of the key that may have reached the upstream before.
#[derive(Debug)]
#[must_use = "a lease must be settled or released, or its key stays blocked until it expires"]
pub struct Granted {
    lease: Lease,
    attempt: u32,
}

impl Granted {
    pub(crate) fn new(lease: Lease, attempt: u32) -> Self {
        Self { lease, attempt }
    }

    /// The attempt number the store counted.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The lease, without its attempt number.
    pub fn into_lease(self) -> Lease {
        self.lease
    }
}

impl std::ops::Deref for Granted {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
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
    Acquired(Granted),
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
