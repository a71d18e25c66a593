//! What the phases of one request share, in two parts, because the exchange outlives the
//! handler (a client hanging up must not cancel a settle):
//!
//! - [`Handler`], borrowed: made once in `Gateway::handle` and lent to every phase before the
//!   exchange is spawned (the runtime, the connection, the route, the access line's notes
//!   with the request's span);
//! - [`Claimant`], owned: who claims the key, made once by `identify`, read by the phases and
//!   moved whole into the exchange;
//! - [`Claimed`]: the claim an exchange runs under, confirmed by the store or not.

use std::sync::Arc;

use crate::access::Notes;
use crate::connection::Connection;
use crate::policy::fingerprint::Fingerprint;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Lease, OwnerToken, RecordKey};

/// One request on an idempotent route, as the handler holds it.
pub struct Handler<'a> {
    /// The store, the exchanges, the limits, the metrics.
    pub rt: &'a Arc<Runtime>,
    /// The connection it arrived on (its peer, its exchange slots).
    pub connection: &'a Arc<Connection>,
    /// The route, with its policy.
    pub route: &'a Arc<IdempotentRoute>,
    /// What the access line will say about the request, and its span when it is traced.
    pub notes: &'a mut Notes,
}

/// A keyed request: whose key it is, and the store's name for it.
pub struct Claimant {
    /// The store's name for the request's key.
    pub record: RecordKey,
    /// The key, as the client sent it.
    pub key: IdempotencyKey,
    /// Whose key it is.
    pub scope: Scope,
    /// What makes it this request.
    pub fingerprint: Fingerprint,
    /// What made it this request under the route's `previous_fingerprint`, where that differs:
    /// a retry of a record made before the fingerprint settings changed matches this.
    pub previous: Option<Fingerprint>,
    /// The owner token of this request's claim, made before the claim call: a claim whose
    /// reply is lost can still be released by its owner.
    pub owner: OwnerToken,
}

/// The claim an exchange runs under.
#[derive(Debug)]
pub enum Claimed {
    /// The store made it: the lease, with its attempt number.
    Confirmed(Lease),
    /// The claim call failed and the route fails open: the claim may exist under this
    /// request's owner token (its reply was lost) or not at all. The exchange settles it if it
    /// does; it announces no attempt, and a lease found lost is no takeover.
    Unconfirmed(Lease),
}

impl Claimed {
    /// The lease, confirmed or not.
    pub fn lease(&self) -> &Lease {
        match self {
            Self::Confirmed(lease) | Self::Unconfirmed(lease) => lease,
        }
    }

    /// The attempt the upstream is told: the store's count, when it confirmed the claim.
    pub fn attempt(&self) -> Option<u32> {
        match self {
            Self::Confirmed(lease) => Some(lease.attempt()),
            Self::Unconfirmed(_) => None,
        }
    }

    /// Whether the store confirmed the claim.
    pub fn is_confirmed(&self) -> bool {
        matches!(self, Self::Confirmed(_))
    }

    /// The lease, to be settled or released.
    pub fn into_lease(self) -> Lease {
        match self {
            Self::Confirmed(lease) | Self::Unconfirmed(lease) => lease,
        }
    }
}
