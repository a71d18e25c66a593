//! Ghost: giving back, in the background, a claim no exchange will end: one whose claim call's
//! reply was lost (see `claim`), and one made but never admitted whose request went away
//! (see `admit`). Owner-checked: a claim that was never made, or that is someone else's now,
//! is left alone.

use std::time::Duration;

use crate::runtime::Runtime;
use crate::store::{Lifecycle, OwnerToken, RecordKey, Sent, Settled};

/// How often, and how far apart, a ghost release is tried before it is left to the lease.
const GHOST_TRIES: u32 = 5;
const GHOST_BACKOFF: Duration = Duration::from_millis(200);
/// How long after finding nothing to release a background release looks once more.
const GHOST_RECHECK: Duration = Duration::from_secs(1);

/// Releases `record`'s claim by `owner` in the background, as never forwarded, with a bounded
/// number of tries (see the module docs).
pub fn release_in_background(rt: &Runtime, record: RecordKey, owner: OwnerToken, ttl: Duration) {
    // Without a runtime (the process is exiting) the claim is left to its lease.
    let Ok(tasks) = tokio::runtime::Handle::try_current() else { return };
    let store = rt.lifecycle_owned();
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
        &tasks,
    );
}
