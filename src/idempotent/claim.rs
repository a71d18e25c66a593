//! Claim: taking the key, waiting out a duplicate in flight, and never leaving a ghost. What
//! the store's reply leads to is `outcome::after_claim`'s table.
//!
//! The hazard this module exists for: a claim call whose reply the gateway never sees. Redis
//! may apply the claim and the reply arrive after the store timeout, or the client may hang up
//! while the call is on the wire (dropping the session's future). Forgotten, such a *ghost*
//! claim blocks every retry for a whole lease (409s), and under fail-open it would later be
//! taken over while the forwarded request ran: a second execution.
//!
//! So the owner token is made before the call, and a claim whose outcome is unknown is
//! released by that owner in the background (owner-checked, so a claim that was never made,
//! or that is someone else's, is left alone), with a bounded number of retries. A route that
//! fails open, or observes, instead goes on under the same token, unconfirmed, and the
//! exchange settles it if it was made. A claim that was made but is refused before it is sent
//! (`admit::Unadmitted`) is given back the same way.

use std::time::Duration;

use tokio::time::Instant;

use super::context::{Claimant, Ctx, Session};
use super::ghost;
use super::reconcile::{self, Asked};
use crate::metrics::{GaugeHold, Pin, ReleaseReason};
use crate::policy::{IdempotencyPolicy, Mode, StoreFailurePolicy};
use crate::runtime::{IdempotentRoute, Route, Runtime};
use crate::store::{Claim, Lifecycle, OwnerToken, RecordKey, StoreError, Terms, Watch};

/// Claims the key. On an enforcing route, while another request holds it, waits up to the
/// route's `wait` for it to settle; an observing route claims once and never waits (it
/// forwards whatever the claim says). The wait sleeps on a [`Watch`] (woken when the holder
/// settles or releases, or when its lease runs out and the key can be taken over), never in a
/// polling loop, and holds no store connection while asleep. The access line gets the store
/// calls as store time and the rest, from the moment the key was found taken, as wait time;
/// a trace gets a `claim` span, and a `wait` span for the time waited.
///
/// A claim call that failed on a route that fails closed may have been made, its reply lost:
/// it is given back at once, or the client's retry would wait out a whole lease. A key whose
/// outcome is unknown, on an enforcing route that reconciles, is asked about (once per
/// request, see `reconcile`), and claimed again if the lookup settled it.
pub async fn claim(s: &mut Session<'_>, ctx: &mut Ctx) -> Tried {
    let observing = s.route.policy.mode == Mode::Observe;
    let mut asked = None;
    loop {
        let span = s.notes.span.as_ref().map(|span| (span.clone(), span.child("claim")));
        let started = Instant::now();
        let mut spent = Spent::default();
        let reply = if observing {
            let (reply, sent) = once(s.rt, s.route, &mut ctx.claimant).await;
            spent.last_sent = Some(sent);
            spent.store = sent.elapsed();
            reply
        } else {
            claim_or_wait(s.rt, s.route, &mut ctx.claimant, &mut spent).await
        };
        s.notes.store += spent.store;
        s.notes.wait += spent.wait;
        if let Some((span, child)) = span {
            if !spent.wait.is_zero() {
                let end = std::time::SystemTime::now();
                span.child_between("wait", end.checked_sub(spent.wait).unwrap_or(end), end);
            }
            child.end(reply.as_ref().err().map(ToString::to_string));
        }
        if let Ok(Claim::Acquired(lease)) = &reply {
            tracing::debug!(route = %s.route.name, key = ctx.claimant.record.short(), attempt = lease.attempt(), "claimed");
        }
        // A duplicate still in flight after its wait comes back when the holder is likely done.
        let retry_after = match &reply {
            Ok(Claim::InFlight { lease_left }) => retry_after(s.route, *lease_left, spent.holder_ran),
            _ => Duration::ZERO,
        };
        if let Err(e) = &reply {
            s.route.metrics.store_error();
            // The outage itself is logged once by the store (see `store::health`); this
            // request's outcome is in the access line.
            tracing::debug!(route = %s.route.name, key = ctx.claimant.record.short(), error = %e, "store failed on claim");
            if !observing && s.route.policy.on_store_error == StoreFailurePolicy::FailClosed {
                release_ghost(s.rt, s.route, &ctx.claimant);
            }
        }
        let tried = Tried { reply, sent: spent.last_sent.unwrap_or(started), retry_after, asked };
        let asks = !observing && tried.asked.is_none() && s.route.policy.reconcile.is_some();
        if !(asks && matches!(tried.reply, Ok(Claim::Unknown { .. }))) {
            return tried;
        }
        // Boxed: only a retry of an unknown outcome asks, and the lookup is the largest step.
        asked = Some(Box::pin(reconcile::on_retry(s, ctx)).await);
        if !matches!(asked, Some(Asked::Changed)) {
            return Tried { asked, ..tried };
        }
    }
}

/// What a claim learned: the store's reply, and what later phases need of how it came.
pub struct Tried {
    /// The store's reply to the last claim call.
    pub reply: Result<Claim, StoreError>,
    /// When the last claim call was sent: a claim it made was applied no earlier, so a lease
    /// whose reply was lost (fail-open) is counted from here.
    pub sent: Instant,
    /// When the key was still in flight after the wait: when a retry should come back (see
    /// [`retry_after`]).
    pub retry_after: Duration,
    /// What asking the upstream about an unknown outcome found, if it was asked.
    pub asked: Option<Asked>,
}

/// Where a claim's time went, and what it learned about the request holding the key.
#[derive(Default)]
struct Spent {
    /// In store calls.
    store: Duration,
    /// Waiting for the holder: from its claim's first reply until the wait ended, less the
    /// store calls made meanwhile.
    wait: Duration,
    /// How long the holder had run at least, when the claim ended in flight.
    holder_ran: Duration,
    /// When the last claim call was sent: a claim it made was applied no earlier.
    last_sent: Option<Instant>,
}

/// The terms of a claim on a route with `policy`.
pub fn terms(policy: &IdempotencyPolicy) -> Terms {
    Terms { lease: policy.lease, ttl: policy.in_progress_ttl() }
}

async fn claim_or_wait(
    rt: &Runtime,
    route: &IdempotentRoute,
    claimant: &mut Claimant,
    spent: &mut Spent,
) -> Result<Claim, StoreError> {
    let (store, policy) = (rt.lifecycle(), &*route.policy);
    let (first, sent) = once(rt, route, claimant).await;
    let record = &claimant.record;
    let took = sent.elapsed();
    spent.last_sent = Some(sent);
    spent.store += took;
    let mut claim = first?;
    let Claim::InFlight { lease_left } = claim else {
        return Ok(claim);
    };
    // The key is taken: the wait begins. It lasts `wait` not counting the store calls that
    // look at the key again (they are store time, not wait), up to one store timeout of them
    // (a second for the memory store, which has none): a slow store cannot stretch the wait
    // much further.
    let taken_since = Instant::now();
    let mut deadline = taken_since + policy.wait;
    let mut store_while_waiting = Duration::ZERO;
    let extension = rt.store_call_timeout().max(Duration::from_secs(1));
    // How long the holder has run, at least: the store keeps only its lease left, so the
    // bound is the time since its last renewal (`lease - lease_left`) at the first reply, plus
    // the time waited since. It errs towards a later `Retry-After`, never an earlier one.
    let before_first = policy.lease.saturating_sub(lease_left);
    let ran =
        |lease_left: Duration| (before_first + taken_since.elapsed()).max(policy.lease.saturating_sub(lease_left));
    // The watch that was registered before `claim` was read: only then is sleeping on it safe,
    // since a settle between the read and a later registration would never wake us.
    let mut watch: Option<Watch> = None;
    loop {
        let Claim::InFlight { lease_left } = claim else {
            spent.wait = taken_since.elapsed().saturating_sub(store_while_waiting);
            return Ok(claim);
        };
        let now = Instant::now();
        if now >= deadline {
            spent.wait = taken_since.elapsed().saturating_sub(store_while_waiting);
            spent.holder_ran = ran(lease_left);
            return Ok(claim);
        }
        if let Some(watch) = watch.take() {
            let _waiting = GaugeHold::new(&rt.metrics.waiting_duplicates);
            watch.changed(deadline.min(now + lease_left)).await;
        }
        watch = Some(store.watch(record));
        let (next, sent) = call(rt, route, claimant).await;
        let took = sent.elapsed();
        spent.last_sent = Some(sent);
        spent.store += took;
        deadline += took.min(extension.saturating_sub(store_while_waiting));
        store_while_waiting += took;
        claim = match next {
            Ok(next) => next,
            // The key is known to be taken by a running request: a store error now must not
            // send this duplicate down the fail-open path (a certain second execution).
            Err(e) => {
                tracing::debug!(key = record.short(), error = %e, "store failed while waiting; answering in flight");
                spent.wait = taken_since.elapsed().saturating_sub(store_while_waiting);
                spent.holder_ran = before_first + taken_since.elapsed();
                let lease_left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
                return Ok(Claim::InFlight { lease_left });
            }
        };
    }
}

/// One claim, and when its last call was sent. A request that differs from the record its key
/// names, on a route that changed its fingerprint settings (`previous_fingerprint`), is
/// judged once more under the earlier settings: an honest retry of a record made before the
/// change matches there, and from then on claims under that fingerprint (the one its record
/// holds). Only a mismatch pays for the second call.
pub async fn once(
    rt: &Runtime,
    route: &IdempotentRoute,
    claimant: &mut Claimant,
) -> (Result<Claim, StoreError>, Instant) {
    let first = call(rt, route, claimant).await;
    let (Ok(Claim::Mismatch), Some(previous)) = (&first.0, claimant.previous) else { return first };
    claimant.previous = None;
    let now = std::mem::replace(&mut claimant.fingerprint, previous);
    let again = call(rt, route, claimant).await;
    match again.0 {
        Ok(Claim::Mismatch) => claimant.fingerprint = now,
        _ => route.metrics.pin_hit(Pin::Fingerprint),
    }
    again
}

/// One claim call, and when it was sent. Armed while the call is on the wire: if this
/// future is dropped there, the claim (which Redis may have applied) is released in the
/// background.
async fn call(rt: &Runtime, route: &IdempotentRoute, claimant: &Claimant) -> (Result<Claim, StoreError>, Instant) {
    let terms = terms(&route.policy);
    let (record, owner) = (&claimant.record, claimant.owner);
    let mut guard = Ghost { rt, record, owner, ttl: terms.ttl, armed: true };
    let started = Instant::now();
    let claim = rt.lifecycle().claim(record, &claimant.fingerprint, owner, terms).await;
    guard.armed = false;
    (claim, started)
}

/// The `Retry-After` of a duplicate that found the key still in flight after its wait: when
/// the holder's lease ends at the latest (`lease_left`), or sooner when the route's upstream
/// usually answers sooner — its p90 answer time less the time the holder has already run
/// (`holder_ran`, a lower bound, see `claim_or_wait`), once the route has seen enough answers
/// for a p90 (see [`crate::metrics::QUANTILE_MIN_SAMPLES`]). At least one second.
fn retry_after(route: &Route, lease_left: Duration, holder_ran: Duration) -> Duration {
    let typical_left = route.metrics.upstream_p90().map(|p90| p90.saturating_sub(holder_ran));
    typical_left.map_or(lease_left, |left| left.min(lease_left)).max(Duration::from_secs(1))
}

/// Releases, in the background, the claim this request may hold after its claim call failed
/// without a reply.
fn release_ghost(rt: &Runtime, route: &IdempotentRoute, claimant: &Claimant) {
    route.metrics.released(ReleaseReason::Ghost);
    ghost::release_in_background(rt, claimant.record.clone(), claimant.owner, route.policy.in_progress_ttl());
}

/// A claim call in flight; dropped while armed (its future was dropped mid-call), it releases
/// the claim that call may have made. Disarmed once the reply is in.
struct Ghost<'a> {
    rt: &'a Runtime,
    record: &'a RecordKey,
    owner: OwnerToken,
    ttl: Duration,
    armed: bool,
}

impl Drop for Ghost<'_> {
    fn drop(&mut self) {
        if self.armed {
            ghost::release_in_background(self.rt, self.record.clone(), self.owner, self.ttl);
        }
    }
}
