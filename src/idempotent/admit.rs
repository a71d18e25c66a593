//! Admit: room for one more exchange, and the caller's budget of new keys.
//!
//! Checked after the claim, so that replays and retries are never refused for load or quota.
//! A claim refused here was never sent: it is given back, with its attempt number.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::claim::{self, Held};
use super::context::Ctx;
use crate::connection::{Connection, ConnectionSlot};
use crate::error::GatewayError;
use crate::policy::scope::Scope;
use crate::runtime::Runtime;
use crate::store::{Lease, Quota, QuotaKey};

/// A claim cleared to go upstream.
#[derive(Debug)]
pub struct Admitted {
    /// The claim.
    pub lease: Lease,
    /// Whether the store confirmed the claim. `false` when the claim call failed and the route
    /// fails open: the claim may or may not exist (its reply was lost), so the exchange settles
    /// it if it does, but neither announces an attempt nor counts a lost lease.
    pub confirmed: bool,
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

/// Admits a claimed request, or gives its claim back and says why not.
pub async fn admit(
    rt: &Runtime,
    ctx: &Ctx<'_>,
    connection: &Arc<Connection>,
    scope: &Scope,
    lease: Lease,
) -> Result<Admitted, GatewayError> {
    // Held until admitted: if this future is dropped at the await below (the client went
    // away), the claim is given back instead of blocking its key.
    let held = Held::new(rt, lease);
    let refused = match slots(rt, connection) {
        None => GatewayError::Overloaded,
        Some(slots) => match new_key_budget(rt, ctx, scope, held.lease()).await {
            None => return Ok(Admitted { lease: held.take(), confirmed: true, slots }),
            Some(exceeded) => exceeded,
        },
    };
    claim::release_unsent(rt, ctx.route, held).await;
    Err(refused)
}

/// A place for one more exchange, in all and on this connection, if both have one.
pub fn slots(rt: &Runtime, connection: &Arc<Connection>) -> Option<Slots> {
    let global = Arc::clone(&rt.exchange_slots).try_acquire_owned().ok()?;
    let local = connection.exchange_slot()?;
    Some(Slots { _global: global, _connection: local })
}

/// Counts a new key against the caller's budget on this route (`max_new_keys`); the error
/// when the budget is spent. Only first attempts count: a re-run of a released key is not a
/// new key. A store that fails to count lets the request through (the claim just succeeded,
/// so the store is up; the budget is a guard against floods, not a guarantee).
async fn new_key_budget(rt: &Runtime, ctx: &Ctx<'_>, scope: &Scope, lease: &Lease) -> Option<GatewayError> {
    let route = ctx.route;
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
