//! Admit: room for one more exchange, and the caller's budget of new keys.
//!
//! Checked after the claim, so that replays and retries are never refused for load or quota.
//! A claim refused here was never sent: it is given back, with its attempt number, and one
//! whose request goes away here is given back in the background ([`Unadmitted`]).

use std::sync::Arc;

use super::context::{Claimed, Ctx, Session, Slots};
use super::ghost;
use crate::connection::Connection;
use crate::error::GatewayError;
use crate::metrics::ReleaseReason;
use crate::policy::Mode;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Granted, Lifecycle, Quota, QuotaKey, Sent};

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
    let unadmitted = Unadmitted::new(rt, lease);
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
    // Never forwarded: its attempt number is given back.
    route.metrics.released(ReleaseReason::NotSent);
    let (key, owner, ttl) = unadmitted.take().into_lease().into_release();
    // Boxed: a refusal is the rare way out, and its release would weigh on every admission.
    if let Err(e) = Box::pin(rt.lifecycle().release(&key, owner, Sent::No, ttl)).await {
        tracing::debug!(key = key.short(), error = %e, "cannot release a claim that was not forwarded; it expires with its lease");
    }
    if observing { Admission::Throttled } else { Admission::Refused(refused) }
}

/// A place for one more exchange, in all and on this connection, if both have one.
fn slots(rt: &Runtime, connection: &Arc<Connection>) -> Option<Slots> {
    let global = Arc::clone(&rt.exchange_slots).try_acquire_owned().ok()?;
    let local = connection.exchange_slot()?;
    Some(Slots::new(global, local))
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
    match rt.quota().count_new_key(&budget, quota.window).await {
        Ok((count, left)) if count > quota.count => Some(GatewayError::TooManyNewKeys { retry_after: left }),
        Ok(_) => None,
        Err(e) => {
            route.metrics.store_error();
            tracing::debug!(route = %route.name, error = %e, "cannot count a new key; letting it through");
            None
        }
    }
}

/// A lease between its claim and its exchange. Dropped while still holding it (the session's
/// future was dropped at an await in between), it releases the claim in the background, as
/// never forwarded.
struct Unadmitted<'a> {
    rt: &'a Runtime,
    lease: Option<Granted>,
}

impl<'a> Unadmitted<'a> {
    /// Holds `lease` for the session.
    fn new(rt: &'a Runtime, lease: Granted) -> Self {
        Self { rt, lease: Some(lease) }
    }

    /// Hands the lease on (to an exchange, or to an explicit release).
    fn take(mut self) -> Granted {
        self.lease.take().unwrap_or_else(|| unreachable!("an Unadmitted guard always holds its lease until take"))
    }
}

impl Drop for Unadmitted<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let (key, owner, ttl) = lease.into_lease().into_release();
            ghost::release_in_background(self.rt, key, owner, ttl);
        }
    }
}
