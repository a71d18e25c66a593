//! Admit: room for one more exchange, and the caller's budget of new keys.
//!
//! Checked after the claim, so that replays and retries are never refused for load or quota.
//! A claim refused here was never sent: it is given back, with its attempt number.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::context::{Claimant, Claimed, Handler};
use super::settle;
use crate::connection::{Connection, ConnectionSlot};
use crate::error::GatewayError;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Quota, QuotaKey};

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
    // Lazy: the budget is counted at its await below, only once there is room, so that a
    // request refused for load never spends its caller's budget.
    let budget = new_key_budget(rt, route, &claimant.scope, claimed.attempt());
    let slots = slots(rt, h.connection);
    let lease = match claimed {
        Claimed::Confirmed(lease) => lease,
        unconfirmed @ Claimed::Unconfirmed(_) => {
            return slots.map(|slots| Admitted { claimed: unconfirmed, slots }).ok_or(GatewayError::Overloaded);
        }
    };
    // Given back unless admitted: if this future is dropped at the await below (the client went
    // away), the claim is given back instead of blocking its key.
    let held = settle::Unadmitted::new(rt, lease);
    let refused = match slots {
        None => GatewayError::Overloaded,
        Some(slots) => match budget.await {
            None => return Ok(Admitted { claimed: Claimed::Confirmed(held.take()), slots }),
            Some(exceeded) => exceeded,
        },
    };
    settle::release_unsent(rt, route, held).await;
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
pub(super) async fn new_key_budget(
    rt: &Runtime,
    route: &IdempotentRoute,
    scope: &Scope,
    attempt: Option<u32>,
) -> Option<GatewayError> {
    let quota = route.policy.max_new_keys?;
    if attempt != Some(1) {
        return None;
    }
    let budget = QuotaKey::new(rt.key_prefix(), &route.policy.identity.name, scope);
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
