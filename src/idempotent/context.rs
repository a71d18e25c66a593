//! What the phases of one request share, in two values, as a proxy's phases share a session
//! and a per-request context:
//!
//! - [`Session`], borrowed: made once in `Gateway::handle` and lent to every phase (the
//!   runtime, the connection, the route, the access line's notes with the request's span);
//! - [`Ctx`], owned: the request and what the phases learn of it (who claims its key, the
//!   claim, its places under the limits), made once by `identify` and moved whole into the
//!   exchange, which outlives the client (a client hanging up must not cancel a settle).
//!
//! Every phase takes `(&mut Session, &mut Ctx)`, or the `Ctx` by value once it is the last.

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use tokio::sync::OwnedSemaphorePermit;

use crate::access::Notes;
use crate::body::{self, Body};
use crate::connection::{Connection, ConnectionSlot};
use crate::policy::fingerprint::Fingerprint;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Granted, Lease, OwnerToken, RecordKey};

/// One request on an idempotent route, as the phases borrow it.
pub struct Session<'a> {
    /// The store, the exchanges, the limits, the metrics.
    pub rt: &'a Arc<Runtime>,
    /// The connection it arrived on (its peer, its exchange slots).
    pub connection: &'a Arc<Connection>,
    /// The route, with its policy.
    pub route: &'a Arc<IdempotentRoute>,
    /// What the access line will say about the request, and its span when it is traced.
    pub notes: &'a mut Notes,
}

/// An exchange's places under the global and the per-connection limits, held until it ends
/// (after its client, if the client goes away first).
#[derive(Debug)]
pub struct Slots {
    _global: OwnedSemaphorePermit,
    _connection: ConnectionSlot,
}

impl Slots {
    /// A place in all, and one on the connection.
    pub fn new(global: OwnedSemaphorePermit, connection: ConnectionSlot) -> Self {
        Self { _global: global, _connection: connection }
    }
}

/// A keyed request and what the phases learned of it, owned.
pub struct Ctx {
    /// Its head, as the upstream will get it (less what the gateway adds on the way).
    pub parts: Parts,
    /// Its whole body.
    pub body: Bytes,
    /// Who claims its key.
    pub claimant: Claimant,
    /// The claim it runs under, once the store made it (or, failing open, may have).
    pub claimed: Option<Claimed>,
    /// Its places under the exchange limits, once admitted (an observing route takes none).
    pub slots: Option<Slots>,
}

impl Ctx {
    /// The request whole again, to forward as a plain route would.
    pub fn into_request(self) -> Request<Body> {
        Request::from_parts(self.parts, body::full(self.body))
    }
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
    Confirmed(Granted),
    /// The claim call failed (a route that fails open, or one that observes): the claim may
    /// exist under this request's owner token (its reply was lost) or not at all. The
    /// exchange settles it if it does; it announces no attempt, and a lease found lost is no
    /// takeover.
    Unconfirmed(Lease),
}

impl Claimed {
    /// The lease, confirmed or not.
    pub fn lease(&self) -> &Lease {
        match self {
            Self::Confirmed(granted) => granted,
            Self::Unconfirmed(lease) => lease,
        }
    }

    /// The attempt the upstream is told: the store's count, when it confirmed the claim.
    pub fn attempt(&self) -> Option<u32> {
        match self {
            Self::Confirmed(granted) => Some(granted.attempt()),
            Self::Unconfirmed(_) => None,
        }
    }

    /// Whether the store confirmed the claim.
    pub fn is_confirmed(&self) -> bool {
        matches!(self, Self::Confirmed(_))
    }
}
