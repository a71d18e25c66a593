//! Settle: every write to a key after its claim, with its logs, counters and persistence.
//!
//! While the upstream call runs, the lease is renewed every third of its duration
//! ([`Settle::renewing`]); when the call has ended, the claim is settled with its outcome
//! (completed, executed, unknown) or released.
//!
//! The hazard is a write that fails after the upstream answered. Nothing else can settle the
//! key until its lease passes, and once it has passed, a retry takes the key over and runs
//! the request a second time. So a write that fails is tried again, with backoff, for as long
//! as the lease lasts ([`Settle::persist`], one policy for every write: settle, unknown,
//! release): a store blip, a restart with its data kept, a Cluster slot migration or a
//! failover that ends within the lease never lets an answered request run again. Between
//! tries the lease is renewed when the store answers, which extends the window; the window is
//! kept by this gateway's own monotonic clock, never Redis's, and ends a store timeout before
//! the lease does (a try sent later could land after it). Past the window the key stays
//! claimed until its lease passes, and the upstream's own constraint must catch a re-run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::ReleaseReason;
use crate::policy::UnknownOutcomePolicy;
use crate::runtime::IdempotentRoute;
use crate::store::{Backend, Final, Lease, Renewal, Sent, Settled, Store, StoreError};

/// Settling a lease: the store calls, their logs and counters.
pub struct Settle<'a> {
    route: &'a IdempotentRoute,
    store: &'a Backend,
    /// Whether the store confirmed the claim (see `Admitted::confirmed`): an unconfirmed
    /// claim that turns out lost was never made, and is not counted as a takeover.
    confirmed: bool,
    /// When the lease ends at the latest, by this gateway's clock: from when the claim or the
    /// last renewal was sent. (Shared with the renewals that run beside the exchange's work.)
    lease_end: Mutex<Instant>,
}

impl<'a> Settle<'a> {
    /// Settling `lease` on `route` in `store`.
    pub fn new(route: &'a IdempotentRoute, store: &'a Backend, lease: &Lease, confirmed: bool) -> Self {
        // The claim's reply arrived at `acquired`; the claim itself may have been applied up to
        // a store timeout before.
        let since = lease.acquired().checked_sub(store.call_timeout()).unwrap_or_else(|| lease.acquired());
        Self { route, store, confirmed, lease_end: Mutex::new(since + lease.duration()) }
    }

    fn lease_end(&self) -> Instant {
        *self.lease_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A renewal sent at `sent` was applied: the lease now ends a lease after that, at the
    /// latest.
    fn renewed(&self, lease: &Lease, sent: Instant) {
        *self.lease_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = sent + lease.duration();
    }

    /// Runs `work` while renewing `lease` every third of its duration. A renewal runs between
    /// polls of `work` (a short pause of the exchange; the upstream's bytes wait in the
    /// socket). Once the lease is found lost, renewal stops; the exchange still finishes, and
    /// settling will find the lease lost too.
    pub async fn renewing<T>(&self, lease: &Lease, mut work: Pin<&mut impl Future<Output = T>>) -> T {
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
                    Ok(Renewal::Lost) if !self.confirmed => renewing = false,
                    Ok(Renewal::Lost) => {
                        renewing = false;
                        route.metrics.lease_lost();
                        tracing::warn!(route = %route.name, key = lease.key().short(), "lease lost while the upstream call ran; the upstream's own constraint must catch a duplicate");
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
    /// that its retry finds the answer); when it fails, [`Settle::finish`] goes on behind the
    /// answer.
    pub async fn first_try(&self, lease: &Lease, outcome: Final<'_>) -> Result<Settled, StoreError> {
        self.store.settle(lease, outcome, self.route.policy.retention).await
    }

    /// Settles the claim with its outcome, after `failed` tries the caller already made; true
    /// when the lease turned out to be lost.
    pub async fn finish(&self, lease: Lease, outcome: Final<'_>, failed: u32) -> bool {
        // Boxed: the retry loop holds a store write, a renewal and a timer, and inline it would
        // swell every exchange's state (copied whole when the exchange is spawned) although it
        // runs only after the store failed. Measured: +22k instructions per first request.
        let result =
            Box::pin(self.persist(&lease, failed, || self.store.settle(&lease, outcome, self.route.policy.retention)))
                .await;
        self.logged("settle", result)
    }

    /// The request was sent without a complete answer: hold the key as unknown (a lookup's
    /// "not found" trusted only `trusted_in` from now), or release it, as the route says.
    /// Returns what was done.
    pub async fn unknown(&self, lease: Lease, trusted_in: Duration) -> UnknownOutcomePolicy {
        match self.route.policy.on_unknown_outcome {
            UnknownOutcomePolicy::Hold => {
                self.route.metrics.outcome_unknown();
                self.finish(lease, Final::Unknown { trusted_in }, 0).await;
            }
            UnknownOutcomePolicy::Release => self.release(lease, Sent::Maybe, ReleaseReason::Unknown).await,
        }
        self.route.policy.on_unknown_outcome
    }

    /// Releases the claim: the next request with its key runs (as the next attempt, unless
    /// this one was certainly not sent).
    pub async fn release(&self, lease: Lease, sent: Sent, reason: ReleaseReason) {
        self.route.metrics.released(reason);
        let (key, owner, ttl) = (lease.key(), lease.owner(), lease.release_ttl());
        // Boxed, as in `finish`.
        let result = Box::pin(self.persist(&lease, 0, || self.store.release(key, owner, sent, ttl))).await;
        self.logged("release", result);
    }

    /// Logs and counts the end of a claim that did not go as planned; true when the lease was
    /// lost. The client is answered either way: the upstream's answer must not be lost
    /// because the store hiccuped.
    pub fn logged(&self, action: &str, result: Result<Settled, StoreError>) -> bool {
        let route = self.route;
        match result {
            Ok(Settled::Done) => false,
            // Without a confirmed claim there was nothing to lose.
            Ok(Settled::Lost) if !self.confirmed => false,
            Ok(Settled::Lost) => {
                route.metrics.lease_lost();
                tracing::warn!(route = %route.name, action, "claim was taken over before it settled; the upstream's own constraint must catch a duplicate");
                true
            }
            Err(e) => {
                route.metrics.store_write_failed();
                tracing::warn!(route = %route.name, action, error = %e, "store failed after the upstream answered, for as long as the lease allowed; the key stays claimed until its lease passes");
                false
            }
        }
    }

    /// Runs a store write after the claim, trying it again while it fails, for as long as
    /// the lease lasts (see the module docs); `failed` tries were made already. Between tries
    /// the lease is renewed when the store answers. A try that failed may have been applied
    /// all the same (its reply was lost), so `Lost` after a failed try means "written by that
    /// try, or taken over": it is reported as `Done`, not as a takeover.
    pub async fn persist<F, Fut>(&self, lease: &Lease, mut failed: u32, mut write: F) -> Result<Settled, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Settled, StoreError>>,
    {
        let mut pause = BACKOFF;
        // Renewals move the window; a store that takes renewals but never the write (a bug)
        // must not keep the exchange forever.
        let give_up = Instant::now() + lease.duration() * 3;
        loop {
            let error = match write().await {
                Ok(Settled::Lost) if failed > 0 => return Ok(Settled::Done),
                Err(e) => e,
                done => return done,
            };
            failed += 1;
            // A try sent after the window could land when the lease has passed; the last
            // pause is cut short so that one more try still goes within it.
            let now = Instant::now();
            let window_end = self.lease_end().checked_sub(self.store.call_timeout()).filter(|end| *end > now);
            let Some(window_end) = window_end.filter(|_| now < give_up) else {
                return Err(error);
            };
            tracing::debug!(route = %self.route.name, key = lease.key().short(), tries = failed, error = %error, "store write failed after the upstream answered; trying again");
            tokio::time::sleep(pause.min(window_end - now)).await;
            pause = (pause * 2).min(MAX_BACKOFF);
            if self.route.policy.renew {
                let sent = Instant::now();
                match self.store.renew(lease).await {
                    Ok(Renewal::Renewed) => self.renewed(lease, sent),
                    // Not ours any more: an earlier try was applied (its reply lost), or the
                    // claim was taken over; one more try tells which.
                    Ok(Renewal::Lost) | Err(_) => {}
                }
            }
        }
    }
}

/// The first pause between two tries of a write after the claim, doubling up to the second.
const BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
