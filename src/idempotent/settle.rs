//! Settle: every write an exchange makes to its key after the claim, with its logs, counters
//! and persistence.
//!
//! While the upstream call runs, the lease is renewed every third of its duration
//! ([`Keeper::renewing`]); when the call has ended, the claim is settled with its outcome
//! (completed, executed, unknown) or released. The keeper owns the claim, and each way of
//! ending it consumes the keeper: a claim is ended once.
//!
//! The hazard is a write that fails after the upstream answered. Nothing else can settle the
//! key until its lease passes, and once it has passed, a retry takes the key over and runs
//! the request a second time. So a write that fails is tried again, with backoff, for as long
//! as the lease lasts ([`Keeper::persist`], one policy for every write: settle, unknown,
//! release): a store blip, a restart with its data kept, a Cluster slot migration or a
//! failover that ends within the lease never lets an answered request run again. Between
//! tries the lease is renewed when the store answers, which extends the window. The window is
//! kept by this gateway's own monotonic clock, never Redis's, from when the claim (or the
//! last renewal) was *sent*: the store applied it no earlier, so the lease lasts at least
//! that long, and tries go on until then. A try sent near the end may land after the lease has
//! passed; that is safe, since every write checks the state and the owner token: if a retry
//! took the key over meanwhile, the try is refused. Past the window the key stays claimed
//! until its lease passes, and the upstream's own constraint must catch a re-run.
//!
//! A try whose reply was lost may have been applied, so the next one may find the record
//! already settled. The store answers `Done` when this owner settled it with this outcome,
//! and `Lost` only when the claim is no longer there as this owner's, never taken for a
//! settle that landed. (The converse can happen: a settle that landed, whose record a lookup
//! or an operator then moved on before the next try, is reported lost: a false alarm, which
//! errs the safe way.) A lost claim is said once, as what it was ([`Keeper::lost`]): taken
//! over (another owner's claim or outcome, with a later attempt: `lease_lost`), or vanished
//! (no record, or one made afresh by a retry after the store forgot ours, which a failover to
//! a replica that had not caught up, a restart or an eviction does: `claims_vanished`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Duration;

use tokio::time::Instant;

use super::context::Claimed;
use crate::metrics::ReleaseReason;
use crate::policy::UnknownOutcomePolicy;
use crate::runtime::IdempotentRoute;
use crate::store::{EntryState, Final, Lease, Lifecycle, Records, Renewal, Sent, Settled, StoreError};

/// Keeps a claim until it ends: renews its lease while the call runs, then settles or
/// releases it; the store calls, their logs and counters.
pub struct Keeper<'a, S, R> {
    route: &'a IdempotentRoute,
    store: &'a S,
    /// Read only when the claim turns out lost, to say what became of it.
    records: &'a R,
    /// The claim was found lost and said so: it is said once, however many calls find it.
    lost_said: AtomicBool,
    /// The claim. An unconfirmed one (the claim call failed) that turns out lost was never
    /// made, and is not counted as a takeover.
    claimed: Claimed,
    /// When the lease ends at the earliest, by this gateway's clock: a lease after the claim
    /// or the last renewal was sent, since the store applied it no earlier. (Shared with the
    /// renewals that run beside the exchange's work.)
    lease_end: Mutex<Instant>,
}

impl<'a, S: Lifecycle, R: Records> Keeper<'a, S, R> {
    /// Keeping `claimed` on `route` in `store` (whose `records` say what became of a claim
    /// found lost).
    pub fn new(route: &'a IdempotentRoute, store: &'a S, records: &'a R, claimed: Claimed) -> Self {
        let lease = claimed.lease();
        let lease_end = Mutex::new(lease.sent() + lease.duration());
        Self { route, store, records, lost_said: AtomicBool::new(false), claimed, lease_end }
    }

    fn lease(&self) -> &Lease {
        self.claimed.lease()
    }

    /// Whether the store confirmed the claim.
    fn confirmed(&self) -> bool {
        self.claimed.is_confirmed()
    }

    fn lease_end(&self) -> Instant {
        *self.lease_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A renewal sent at `sent` was applied: the lease now ends no earlier than a lease
    /// after that.
    fn renewed(&self, lease: &Lease, sent: Instant) {
        let mut end = self.lease_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *end = (*end).max(sent + lease.duration());
    }

    /// Runs `work` while renewing `lease` every third of its duration. A renewal runs between
    /// polls of `work` (a short pause of the exchange; the upstream's bytes wait in the
    /// socket). Once the lease is found lost, renewal stops; the exchange still finishes, and
    /// settling will find the lease lost too.
    pub async fn renewing<T>(&self, mut work: Pin<&mut impl Future<Output = T>>) -> T {
        let lease = self.lease();
        // An unconfirmed claim (the claim call's reply was lost, fail-open) is renewed too: if
        // it was made, it must not pass while the forwarded request runs, or a retry would
        // take it over and run the request again. Renewal names the owner, so a claim that
        // was never made is found `Lost` at the first tick and left alone.
        if !self.route.policy.renew {
            return work.await;
        }
        let (route, store) = (self.route, self.store);
        let period = lease.duration() / 3;
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewing = true;
        loop {
            tokio::select! {
                out = &mut work => return out,
                // Boxed: renewals are rare, and the store call would otherwise swell every
                // exchange's state by its size.
                sent = ticks.tick(), if renewing => match Box::pin(store.renew(lease)).await {
                    Ok(Renewal::Renewed) => self.renewed(lease, sent),
                    Ok(Renewal::Lost) if !self.confirmed() => renewing = false,
                    Ok(Renewal::Lost) => {
                        renewing = false;
                        // Boxed: rare, and a store read.
                        Box::pin(self.lost("renew")).await;
                    }
                    Err(e) => {
                        route.metrics.store_error();
                        tracing::debug!(route = %route.name, key = lease.key().short(), error = %e, "lease renewal failed; retrying");
                    }
                },
            }
        }
    }

    /// One try at settling the claim with its outcome, before the client is answered (so
    /// that its retry finds the answer); when it fails, [`Keeper::finish`] goes on behind the
    /// answer.
    pub async fn first_try(&self, outcome: Final<'_>) -> Result<Settled, StoreError> {
        self.store.settle(self.lease(), outcome, self.route.policy.retention).await
    }

    /// Settles the claim with its outcome, after `failed` tries the caller already made; true
    /// when the lease turned out to be lost.
    pub async fn finish(self, outcome: Final<'_>, failed: u32) -> bool {
        // Boxed: inline, the retry loop (a store write, a renewal, a timer) would swell every
        // exchange's state although it runs only after the store failed (docs/performance.md).
        let write = || self.store.settle(self.lease(), outcome, self.route.policy.retention);
        let (result, _) = Box::pin(self.persist(failed, write)).await;
        self.logged("settle", result).await
    }

    /// The request was sent without a complete answer: hold the key as unknown (a lookup's
    /// "not found" trusted only `trusted_in` from now), or release it, as the route says.
    /// Returns what was done.
    pub async fn unknown(self, trusted_in: Duration) -> UnknownOutcomePolicy {
        let policy = self.route.policy.on_unknown_outcome;
        match policy {
            UnknownOutcomePolicy::Hold => {
                self.route.metrics.outcome_unknown();
                self.finish(Final::Unknown { trusted_in }, 0).await;
            }
            UnknownOutcomePolicy::Release => self.release(Sent::Maybe, ReleaseReason::Unknown).await,
        }
        policy
    }

    /// Releases the claim: the next request with its key runs (as the next attempt, unless
    /// this one was certainly not sent).
    pub async fn release(self, sent: Sent, reason: ReleaseReason) {
        self.route.metrics.released(reason);
        let lease = self.lease();
        let (key, owner, ttl) = (lease.key(), lease.owner(), lease.release_ttl());
        // Boxed, as in `finish`.
        let (result, failed) = Box::pin(self.persist(0, || self.store.release(key, owner, sent, ttl))).await;
        // A release is not told apart from a takeover: a first release (attempt 1, not sent)
        // deletes the record, so a try that landed leaves nothing to recognise. `Lost` after
        // a try that failed is taken as that try's work: what a release is for, letting the
        // next request run, a takeover did as well, and it kept nothing the release would have.
        let result = match result {
            Ok(Settled::Lost) if failed > 0 => Ok(Settled::Done),
            other => other,
        };
        self.logged("release", result).await;
    }

    /// Logs and counts the end of a claim that did not go as planned; true when the lease was
    /// lost. The client is answered either way: the upstream's answer must not be lost
    /// because the store hiccuped.
    pub async fn logged(&self, action: &str, result: Result<Settled, StoreError>) -> bool {
        let route = self.route;
        match result {
            Ok(Settled::Done) => false,
            // Without a confirmed claim there was nothing to lose.
            Ok(Settled::Lost) if !self.confirmed() => false,
            Ok(Settled::Lost) => {
                // Boxed: rare, and a store read.
                Box::pin(self.lost(action)).await;
                true
            }
            Err(e) => {
                route.metrics.store_write_failed();
                tracing::warn!(route = %route.name, action, error = %e, "store failed after the upstream answered, for as long as the lease allowed; the key stays claimed until its lease passes");
                false
            }
        }
    }

    /// The claim turned out not to be this owner's any more (found by `action`): said and
    /// counted once per claim, as what it was. A takeover leaves another owner's record with a
    /// later attempt; a record this gateway's claim vanished from has none, or one a retry made
    /// afresh (attempt 1 again: it found nothing). An operator's forced release shows as a
    /// release. When the store cannot be read, it is said as either.
    async fn lost(&self, action: &str) {
        if self.lost_said.swap(true, Ordering::Relaxed) {
            return;
        }
        let (route, key) = (self.route, self.lease().key());
        let ours = self.claimed.attempt().unwrap_or(1);
        let found = self.records.get(key).await;
        let vanished = match &found {
            Ok(None) => Some(true),
            Ok(Some(entry)) if entry.state == EntryState::Released => Some(false),
            Ok(Some(entry)) => Some(entry.attempt <= ours),
            Err(_) => None,
        };
        match vanished {
            Some(true) => {
                route.metrics.claim_vanished();
                tracing::warn!(route = %route.name, key = key.short(), action, attempt = ours, "claim vanished from the store before it settled (nobody took it over: a failover to a replica that had not caught up, a restart or an eviction lost it); a retry may run the request again as attempt 1, and the upstream's own constraint must catch it");
            }
            Some(false) => {
                route.metrics.lease_lost();
                tracing::warn!(route = %route.name, key = key.short(), action, attempt = ours, "claim was taken over before it settled; the upstream's own constraint must catch a duplicate");
            }
            None => {
                route.metrics.lease_lost();
                tracing::warn!(route = %route.name, key = key.short(), action, attempt = ours, "claim was taken over or vanished before it settled (the store could not say which); the upstream's own constraint must catch a duplicate");
            }
        }
    }

    /// Runs a store write after the claim, trying it again while it fails, for as long as
    /// the lease lasts (see the module docs); `failed` tries were made already. Between tries
    /// the lease is renewed when the store answers. Returns the last try's result and how many
    /// tries failed in all.
    async fn persist<F, Fut>(&self, mut failed: u32, mut write: F) -> (Result<Settled, StoreError>, u32)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Settled, StoreError>>,
    {
        let lease = self.lease();
        let mut pause = BACKOFF;
        // Renewals move the window; a store that takes renewals but never the write (a bug)
        // must not keep the exchange forever.
        let give_up = Instant::now() + lease.duration() * 3;
        loop {
            let error = match write().await {
                Err(e) => e,
                done => return (done, failed),
            };
            failed += 1;
            // The last pause is cut short so that one more try goes before the window ends.
            let now = Instant::now();
            let Some(window_end) = Some(self.lease_end()).filter(|end| *end > now && now < give_up) else {
                return (Err(error), failed);
            };
            tracing::debug!(route = %self.route.name, key = lease.key().short(), tries = failed, error = %error, "store write failed after the upstream answered; trying again");
            tokio::time::sleep(pause.min(window_end - now)).await;
            pause = (pause * 2).min(MAX_BACKOFF);
            if self.route.policy.renew {
                let sent = Instant::now();
                match self.store.renew(lease).await {
                    Ok(Renewal::Renewed) => self.renewed(lease, sent),
                    // Not ours any more: an earlier try was applied (its reply lost), or the
                    // claim was taken over; the next try tells which.
                    Ok(Renewal::Lost) | Err(_) => {}
                }
            }
        }
    }
}

/// The first pause between two tries of a write after the claim, doubling up to the second.
const BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
