//! Admit: room for one more exchange, and the caller's budget of new keys.
//!
//! Checked after the claim, so that replays and retries are never refused for load or quota.
//! A claim refused here was never sent: it is given back, with its attempt number.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::context::{Claimed, Ctx, Session};
use super::settle;
use crate::connection::{Connection, ConnectionSlot};
use crate::error::GatewayError;
use crate::policy::Mode;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Quota, QuotaKey};

/// An exchange's places under the global and the per-connection limits, held until it ends
/// (after its client, if the client goes away first).
#[derive(Debug)]
pub struct Slots {
    _global: OwnedSemaphorePermit,
    _connection: ConnectionSlot,
}

/// Whether a claimed request goes upstream.
pub enum Admission {
    /// It goes: `ctx` holds the claim (and, enforcing, the slots).
    Admitted,
    /// Enforcing: refused for load or quota, its claim given back.
    Refused(GatewayError),
    /// Observing: past the caller's budget of new keys, where enforcing would answer 429. Its
    /// claim was given back (one caller must not fill the store); it goes unclaimed.
    Throttled,
}

/// Admits a claimed request into `ctx`, or gives its claim back and says why not. An
/// unconfirmed claim needs only the room: the store just failed, and counting its key would
/// too. An observing route takes no exchange slot (it forwards as a plain route does) and
/// only counts the budget.
pub async fn admit(s: &Session<'_>, ctx: &mut Ctx, claimed: Claimed) -> Admission {
    let (rt, route) = (&**s.rt, s.route);
    let observing = route.policy.mode == Mode::Observe;
    // Lazy: the budget is counted at its await below, only once there is room, so that a
    // request refused for load never spends its caller's budget.
    let scope = ctx.claimant.scope;
    let budget = new_key_budget(rt, route, &scope, claimed.attempt());
    let slots = if observing { None } else { Some(slots(rt, s.connection)) };
    let lease = match claimed {
        Claimed::Confirmed(lease) => lease,
        unconfirmed @ Claimed::Unconfirmed(_) => {
            if let Some(None) = slots {
                return Admission::Refused(GatewayError::Overloaded);
            }
            ctx.claimed = Some(unconfirmed);
            ctx.slots = slots.flatten();
            return Admission::Admitted;
        }
    };
    // Given back unless admitted: if this future is dropped at the await below (the client went
    // away), the claim is given back instead of blocking its key.
    let unadmitted = settle::Unadmitted::new(rt, lease);
    let refused = match slots {
        Some(None) => GatewayError::Overloaded,
        slots => match budget.await {
            None => {
                ctx.claimed = Some(Claimed::Confirmed(unadmitted.take()));
                ctx.slots = slots.flatten();
                return Admission::Admitted;
            }
            Some(exceeded) => exceeded,
        },
    };
    settle::release_unsent(rt, route, unadmitted).await;
    if observing { Admission::Throttled } else { Admission::Refused(refused) }
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
async fn new_key_budget(
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
