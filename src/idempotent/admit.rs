//! Admit: room for one more exchange, and the caller's budget of new keys.
//!
//! Checked after the claim, so that replays and retries are never refused for load or quota.
//! A claim refused here was never sent: it is given back, with its attempt number.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::context::Claimed;
use super::context::{Claimant, Handler};
use super::settle;
use crate::connection::{Connection, ConnectionSlot};
use crate::error::GatewayError;
use crate::metrics::ReleaseReason;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Route, Runtime};
use crate::store::{Lease, Lifecycle, Quota, QuotaKey, Sent};

/// A claim cleared to go upstream.
#[derive(Debug)]
pub struct Admitted {
    /// The claim.
    pub claimed: Claimed,
    /// Its places under the limits, held until the exchange ends.
    pub slots: Slots,
}

/// An exchange's places under the global and the per-connection limits, held until it ends
/// (after its client, if the client goes away first).
#[derive(Debug)]
pub struct Slots {
    _global: OwnedSemaphorePermit,
    _connection: ConnectionSlot,
}

/// Admits a claimed request, or gives its claim back and says why not. An unconfirmed claim
/// (fail-open) needs only the room: the store just failed, and counting its key would too.
pub async fn admit(h: &Handler<'_>, claimant: &Claimant, claimed: Claimed) -> Result<Admitted, GatewayError> {
    let (rt, route) = (&**h.rt, h.route);
    let slots = slots(rt, h.connection);
    let lease = match claimed {
        Claimed::Confirmed(lease) => lease,
        unconfirmed @ Claimed::Unconfirmed(_) => {
            return slots.map(|slots| Admitted { claimed: unconfirmed, slots }).ok_or(GatewayError::Overloaded);
        }
    };
    // Given back unless admitted: if this future is dropped at the await below (the client went
    // away), the claim is given back instead of blocking its key.
    let held = Unadmitted::new(rt, lease);
    let refused = match slots {
        None => GatewayError::Overloaded,
        Some(slots) => match new_key_budget(rt, route, &claimant.scope, held.lease()).await {
            None => return Ok(Admitted { claimed: Claimed::Confirmed(held.take()), slots }),
            Some(exceeded) => exceeded,
        },
    };
    release_unsent(rt, route, held).await;
    Err(refused)
}

/// A place for one more exchange, in all and on this connection, if both have one.
fn slots(rt: &Runtime, connection: &Arc<Connection>) -> Option<Slots> {
    let global = Arc::clone(&rt.exchange_slots).try_acquire_owned().ok()?;
    let local = connection.exchange_slot()?;
    Some(Slots { _global: global, _connection: local })
}

/// Counts a new key against the caller's budget on this route (`max_new_keys`); the error
/// when the budget is spent. Only first attempts count: a re-run of a released key is not a
/// new key. A store that fails to count lets the request through (the claim just succeeded,
/// so the store is up; the budget is a guard against floods, not a guarantee).
async fn new_key_budget(rt: &Runtime, route: &IdempotentRoute, scope: &Scope, lease: &Lease) -> Option<GatewayError> {
    let quota = route.policy.max_new_keys?;
    if lease.attempt() != 1 {
        return None;
    }
    let budget = QuotaKey::new(rt.key_prefix(), &route.name, scope);
    match rt.store.count_new_key(&budget, quota.window).await {
        Ok((count, left)) if count > quota.count => Some(GatewayError::TooManyNewKeys { retry_after: left }),
        Ok(_) => None,
        Err(e) => {
            route.metrics.store_error();
            tracing::debug!(route = %route.name, error = %e, "cannot count a new key; letting it through");
            None
        }
    }
}

/// Releases a claim that was never forwarded (its attempt number is given back).
async fn release_unsent(rt: &Runtime, route: &Route, held: Unadmitted<'_>) {
    route.metrics.released(ReleaseReason::NotSent);
    let (key, owner, ttl) = held.take().into_release();
    if let Err(e) = rt.store.release(&key, owner, Sent::No, ttl).await {
        tracing::debug!(key = key.short(), error = %e, "cannot release a claim that was not forwarded; it expires with its lease");
    }
}

/// A lease between its claim and its exchange. Dropped while still holding it (the handler's
/// future was dropped at an await in between), it releases the claim in the background, as
/// never forwarded.
struct Unadmitted<'a> {
    rt: &'a Runtime,
    lease: Option<Lease>,
}

impl<'a> Unadmitted<'a> {
    /// Holds `lease` for the handler.
    fn new(rt: &'a Runtime, lease: Lease) -> Self {
        Self { rt, lease: Some(lease) }
    }

    /// The lease held.
    fn lease(&self) -> &Lease {
        // Present until `take`, which consumes the guard.
        self.lease.as_ref().unwrap_or_else(|| unreachable!("an Unadmitted guard always holds its lease until take"))
    }

    /// Hands the lease on (to an exchange, or to an explicit release).
    fn take(mut self) -> Lease {
        self.lease.take().unwrap_or_else(|| unreachable!("an Unadmitted guard always holds its lease until take"))
    }
}

impl Drop for Unadmitted<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let (key, owner, ttl) = lease.into_release();
            settle::release_in_background(self.rt, key, owner, ttl);
        }
    }
}
