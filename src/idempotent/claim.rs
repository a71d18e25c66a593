//! Claim: taking the key, waiting out a duplicate in flight, and never leaving a ghost.
//!
//! The hazard this module exists for: a claim call whose reply the gateway never sees. Redis
//! may apply the claim and the reply arrive after the store timeout, or the client may hang up
//! while the call is on the wire (dropping the handler's future). Forgotten, such a *ghost*
//! claim blocks every retry for a whole lease (409s), and under fail-open it would later be
//! taken over while the forwarded request ran: a second execution.
//!
//! So the owner token is made before the call, and a claim whose outcome is unknown is
//! released by that owner in the background (owner-checked, so a claim that was never made,
//! or that is someone else's, is left alone), with a bounded number of retries. The fail-open
//! path instead settles under the same token (see [`store_failed`]). A claim that was made but
//! is refused before it is sent (`settle::Unadmitted`, held by `admit`) is given back the same way.

use std::time::Duration;

use tokio::time::Instant;

use super::context::Claimed;
use super::context::{Claimant, Handler};
use crate::error::GatewayError;
use crate::metrics::{GaugeHold, Pin, ReleaseReason};
use crate::policy::{IdempotencyPolicy, StoreFailurePolicy};
use crate::runtime::{IdempotentRoute, Route, Runtime};
use crate::store::{Claim, Lease, Lifecycle, OwnerToken, RecordKey, Sent, Settled, StoreError, Terms, Watch};

/// Claims the key; while another request holds it, waits up to the route's `wait` for it to
/// settle. The wait sleeps on a [`Watch`] (woken when the holder settles or releases, or when
/// its lease runs out and the key can be taken over), never in a polling loop, and holds no
/// store connection while asleep. The access line gets the store calls as store time and the
/// rest, from the moment the key was found held, as wait time.
pub async fn claim(h: &mut Handler<'_>, claimant: &mut Claimant) -> Tried {
    let started = Instant::now();
    let mut spent = Spent::default();
    let reply = claim_or_wait(h.rt, h.route, claimant, &mut spent).await;
    h.notes.store += spent.store;
    h.notes.wait += spent.wait;
    Tried { reply, sent: spent.last_sent.unwrap_or(started), holder_ran: spent.holder_ran }
}

/// What a claim learned: the store's reply, and what later phases need of how it came.
pub struct Tried {
    /// The store's reply to the last claim call.
    pub reply: Result<Claim, StoreError>,
    /// When the last claim call was sent: a claim it made was applied no earlier, so a lease
    /// whose reply was lost (fail-open) is counted from here.
    pub sent: Instant,
    /// When the key was still in flight after the wait: how long the request holding it had
    /// run at least, for [`retry_after`].
    pub holder_ran: Duration,
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
    let (store, policy) = (&*rt.store, &*route.policy);
    let (first, sent) = once(rt, route, claimant).await;
    let record = &claimant.record;
    let took = sent.elapsed();
    spent.last_sent = Some(sent);
    spent.store += took;
    let mut claim = first?;
    let Claim::InFlight { lease_left } = claim else {
        return Ok(claim);
    };
    // The key is held: the wait begins. It lasts `wait` not counting the store calls that
    // look at the key again (they are store time, not wait), up to one store timeout of them
    // (a second for the memory store, which has none): a slow store cannot stretch the wait
    // much further.
    let held_since = Instant::now();
    let mut deadline = held_since + policy.wait;
    let mut store_while_waiting = Duration::ZERO;
    let extension = store.call_timeout().max(Duration::from_secs(1));
    // How long the holder has run, at least: the store keeps only its lease left, so the
    // bound is the time since its last renewal (`lease - lease_left`) at the first reply, plus
    // the time waited since. It errs towards a later `Retry-After`, never an earlier one.
    let before_first = policy.lease.saturating_sub(lease_left);
    let ran = |lease_left: Duration| (before_first + held_since.elapsed()).max(policy.lease.saturating_sub(lease_left));
    // The watch that was registered before `claim` was read: only then is sleeping on it safe,
    // since a settle between the read and a later registration would never wake us.
    let mut watch: Option<Watch> = None;
    loop {
        let Claim::InFlight { lease_left } = claim else {
            spent.wait = held_since.elapsed().saturating_sub(store_while_waiting);
            return Ok(claim);
        };
        let now = Instant::now();
        if now >= deadline {
            spent.wait = held_since.elapsed().saturating_sub(store_while_waiting);
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
            // The key is known to be held by a running request: a store error now must not
            // send this duplicate down the fail-open path (a certain second execution).
            Err(e) => {
                tracing::debug!(key = record.short(), error = %e, "store failed while waiting; answering in flight");
                spent.wait = held_since.elapsed().saturating_sub(store_while_waiting);
                spent.holder_ran = before_first + held_since.elapsed();
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
    let claim = rt.store.claim(record, &claimant.fingerprint, owner, terms).await;
    guard.armed = false;
    (claim, started)
}

/// The claim phase, as a trace shows it: a `claim` span, and a `wait` span for the time a
/// duplicate waited for the request holding its key. Without tracing, the claim alone.
pub async fn traced(h: &mut Handler<'_>, claimant: &mut Claimant) -> Tried {
    let Some(span) = h.notes.span.clone() else { return claim(h, claimant).await };
    let waited_before = h.notes.wait;
    let child = span.child("claim");
    let tried = claim(h, claimant).await;
    let waited = h.notes.wait.saturating_sub(waited_before);
    if !waited.is_zero() {
        let end = std::time::SystemTime::now();
        span.child_between("wait", end.checked_sub(waited).unwrap_or(end), end);
    }
    child.end(tried.reply.as_ref().err().map(ToString::to_string));
    tried
}

/// The claim call failed: the route's `on_store_error` decides. Fail-closed refuses;
/// fail-open goes on under this request's owner token, unconfirmed: if the claim was made
/// after all (its reply lost), the exchange settles it and retries replay its answer; if not,
/// settling finds nothing. A ghost claim never lets a retry run it twice.
pub fn store_failed(
    h: &Handler<'_>,
    claimant: &Claimant,
    error: StoreError,
    sent: Instant,
) -> Result<Claimed, GatewayError> {
    let (route, policy) = (h.route, &h.route.policy);
    route.metrics.store_error();
    // The outage itself is logged once by the store (see `store::health`); this request's
    // outcome is in the access line.
    tracing::debug!(route = %route.name, key = claimant.record.short(), error = %error, "store failed on claim");
    match policy.on_store_error {
        StoreFailurePolicy::FailClosed => {
            // The claim may have been made, its reply lost: release it, or the client's retry
            // would wait out a whole lease.
            release_ghost(h.rt, route, claimant);
            Err(GatewayError::StoreUnavailable(error))
        }
        StoreFailurePolicy::FailOpen => {
            let terms = terms(policy);
            Ok(Claimed::Unconfirmed(Lease::unconfirmed(claimant.record.clone(), claimant.owner, terms, sent)))
        }
    }
}

/// The `Retry-After` of a duplicate that found the key still in flight after its wait: when
/// the holder's lease ends at the latest (`lease_left`), or sooner when the route's upstream
/// usually answers sooner — its p90 answer time less the time the holder has already run
/// (`holder_ran`, a lower bound, see `claim_or_wait`), once the route has seen enough answers
/// for a p90 (see [`crate::metrics::QUANTILE_MIN_SAMPLES`]). At least one second.
pub fn retry_after(route: &Route, lease_left: Duration, holder_ran: Duration) -> Duration {
    let typical_left = route.metrics.upstream_p90().map(|p90| p90.saturating_sub(holder_ran));
    typical_left.map_or(lease_left, |left| left.min(lease_left)).max(Duration::from_secs(1))
}

/// Releases, in the background, the claim this request may hold after its claim call failed
/// without a reply.
pub fn release_ghost(rt: &Runtime, route: &IdempotentRoute, claimant: &Claimant) {
    route.metrics.released(ReleaseReason::Ghost);
    release_in_background(rt, claimant.record.clone(), claimant.owner, route.policy.in_progress_ttl());
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
            release_in_background(self.rt, self.record.clone(), self.owner, self.ttl);
        }
    }
}

/// How often, and how far apart, a ghost release is tried before it is left to the lease.
const GHOST_TRIES: u32 = 5;
const GHOST_BACKOFF: Duration = Duration::from_millis(200);
/// How long after finding nothing to release a background release looks once more.
const GHOST_RECHECK: Duration = Duration::from_secs(1);

/// Releases `record`'s claim by `owner` in the background, as never forwarded, with a bounded
/// number of tries (see `claim` for why a claim may need it).
pub fn release_in_background(rt: &Runtime, record: RecordKey, owner: OwnerToken, ttl: Duration) {
    // Without a runtime (the process is exiting) the claim is left to its lease.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let store = std::sync::Arc::clone(&rt.store);
    rt.exchanges.spawn_on(
        async move {
            for attempt in 1..=GHOST_TRIES {
                match store.release(&record, owner, Sent::No, ttl).await {
                    Ok(Settled::Done) => {
                        tracing::info!(key = record.short(), "released a claim whose reply was lost");
                        return;
                    }
                    // Never made, or no longer ours: nothing to release. The claim travels on
                    // another connection than this release, so it may still land: one more
                    // look after a pause catches a claim that arrives late.
                    Ok(Settled::Lost) if attempt == 1 => tokio::time::sleep(GHOST_RECHECK).await,
                    Ok(Settled::Lost) => return,
                    Err(e) if attempt == GHOST_TRIES => {
                        tracing::debug!(key = record.short(), error = %e, "cannot release a claim whose reply was lost; it expires with its lease");
                    }
                    Err(_) => tokio::time::sleep(GHOST_BACKOFF * attempt).await,
                }
            }
        },
        &runtime,
    );
}
