//! The state of one request as it goes through the phases: created once, after `identify`,
//! and passed on instead of a growing list of arguments.

use std::sync::Arc;
use std::time::Duration;

use crate::access::Notes;
use crate::policy::fingerprint::Fingerprint;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::runtime::IdempotentRoute;
use crate::store::{OwnerToken, RecordKey};

/// One keyed request on an idempotent route.
pub struct Ctx<'a> {
    /// The route, with its policy.
    pub route: &'a Arc<IdempotentRoute>,
    /// The store's name for the request's key.
    pub record: RecordKey,
    /// The key, as the client sent it.
    pub key: IdempotencyKey,
    /// Whose key it is.
    pub scope: Scope,
    /// What makes it this request.
    pub fingerprint: Fingerprint,
    /// The owner token of this request's claim, made before the claim call: a claim whose
    /// reply is lost can still be released by its owner.
    pub owner: OwnerToken,
    /// What the access line will say about the request.
    pub notes: &'a mut Notes,
    /// When the claim found the key still in flight after the wait: how long the request
    /// holding it had run at least (see `claim`).
    pub holder_ran: Duration,
    /// When the last claim call was sent: a claim whose reply was lost (fail-open) was
    /// applied no earlier, and its lease is counted from here.
    pub claim_sent: tokio::time::Instant,
}
