//! Settle: every write to a key after its claim, with its logs, counters and persistence.
//!
//! While the upstream call runs, the lease is renewed every third of its duration
//! ([`Settle::renewing`]); when the call has ended, the claim is settled with its outcome
//! (completed, executed, unknown) or released. A write that fails is tried again: after the
//! upstream answered, a key left claimed until its lease passes would let a retry run the
//! request a second time.

use std::future::Future;
use std::pin::Pin;

use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::ReleaseReason;
use crate::policy::UnknownOutcomePolicy;
use crate::runtime::IdempotentRoute;
use crate::store::{Backend, Final, Lease, Renewal, Sent, Settled, Store, StoreError};

/// Settling a lease: the store calls, their logs and counters.
pub struct Settle<'a> {
    /// The route, with its policy and counters.
    pub route: &'a IdempotentRoute,
    /// The store holding the claim.
    pub store: &'a Backend,
    /// Whether the store confirmed the claim (see `Admitted::confirmed`): an unconfirmed
    /// claim that turns out lost was never made, and is not counted as a takeover.
    pub confirmed: bool,
}

impl Settle<'_> {
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
                _ = ticks.tick(), if renewing => match Box::pin(store.renew(lease)).await {
                    Ok(Renewal::Renewed) => {}
                    Ok(Renewal::Lost) if !self.confirmed => renewing = false,
                    Ok(Renewal::Lost) => {
                        renewing = false;
                        route.metrics.lease_lost();
                        tracing::warn!(route = %route.name, key = lease.key().short(), "lease lost while the upstream call ran; the upstream's own constraint must catch a duplicate");
                    }
                    Err(e) => {
                        route.metrics.store_error();
                        tracing::warn!(route = %route.name, key = lease.key().short(), error = %e, "lease renewal failed; retrying");
                    }
                },
            }
        }
    }

    /// Settles the claim with its outcome, after `failed` tries the caller already made; true
    /// when the lease turned out to be lost.
    pub async fn finish(&self, lease: Lease, outcome: Final<'_>, failed: u32) -> bool {
        let result = persist(failed, || self.store.settle(&lease, outcome, self.route.policy.retention)).await;
        self.logged("settle", result)
    }

    /// The request was sent without a complete answer: hold the key as unknown, or release
    /// it, as the route says. Returns what was done.
    pub async fn unknown(&self, lease: Lease) -> UnknownOutcomePolicy {
        match self.route.policy.on_unknown_outcome {
            UnknownOutcomePolicy::Hold => {
                self.route.metrics.outcome_unknown();
                self.finish(lease, Final::Unknown, 0).await;
            }
            UnknownOutcomePolicy::Release => self.release(lease, Sent::Maybe, ReleaseReason::Unknown).await,
        }
        self.route.policy.on_unknown_outcome
    }

    pub async fn release(&self, lease: Lease, sent: Sent, reason: ReleaseReason) {
        self.route.metrics.released(reason);
        let (key, owner, ttl) = lease.into_release();
        let result = persist(0, || self.store.release(&key, owner, sent, ttl)).await;
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
                tracing::warn!(route = %route.name, action, error = %e, "store failed after the upstream answered; the key stays claimed until its lease passes");
                false
            }
        }
    }
}

/// How often a settle or release that failed is tried, and the first pause between tries. A
/// store blip after the upstream answered must not leave the key claimed until its lease
/// passes: a retry after that would run the request again.
const SETTLE_TRIES: u32 = 4;
const SETTLE_BACKOFF: Duration = Duration::from_millis(100);

/// Runs a store call, repeating it (with a doubling pause) while it fails, up to
/// `SETTLE_TRIES` tries in all counting the `failed` ones the caller already made. A try that
/// failed may have been applied all the same (its reply was lost), so `Lost` after a failed
/// try means "settled by that try, or taken over": it is reported as `Done`, not as a
/// takeover.
async fn persist<F, Fut>(mut failed: u32, mut call: F) -> Result<Settled, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Settled, StoreError>>,
{
    let mut pause = SETTLE_BACKOFF;
    loop {
        match call().await {
            Err(_) if failed + 1 < SETTLE_TRIES => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                failed += 1;
            }
            Ok(Settled::Lost) if failed > 0 => return Ok(Settled::Done),
            result => return result,
        }
    }
}
