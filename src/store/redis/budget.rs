//! A cap on the bytes of large answers on their way to Redis at once.
//!
//! Until Redis has answered, a large answer being settled is held three times: the captured
//! body (the client's answer still needs it), the command the client library builds from it,
//! and that command packed for the socket, queued on the connection behind the others. Under
//! a burst of large answers Redis is the bottleneck (it copies every byte), so settles pile
//! up on the connection with two extra copies each: 1 MiB answers at 64 connections peaked
//! at 180-210 MiB, 3 MiB per answer in flight. Waiting here instead, before the command is built,
//! a settle holds only its captured body: the queue moves from the connection to this
//! semaphore, Redis stays as busy, and the copies are bounded by the budget.
//!
//! Hazard: the wait counts against the claim's lease like a slow Redis would; it is bounded
//! by the store timeout, past which the settle fails as a timed-out call (and is tried again
//! behind the answer).

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::store::error::StoreError;

/// Bytes of large answers a gateway sends to Redis at once, per store: at Redis's rate for
/// 1 MiB answers (about 0.8 ms each) 8 of them keep it busy for 6 ms, far more than a round
/// trip, and 64 connections' answers of 64 KiB (4 MiB) never wait. Measured at 64
/// connections of 1 MiB answers: peak RSS 176-198 MiB without the budget, 111-134 with
/// 16 MiB, 111-114 with 8 MiB, the same requests per second.
pub(super) const BUDGET: usize = 8 * 1024 * 1024;

/// Room is counted in KiB, so that the semaphore's count stays small.
const UNIT: usize = 1024;

pub(super) struct Budget {
    room: Semaphore,
    units: u32,
}

impl Budget {
    pub(super) fn new(bytes: usize) -> Self {
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        Self { room: Semaphore::new(units as usize), units }
    }

    /// Room for `bytes` more on their way to Redis, held until the permit is dropped; waits
    /// for it at most `within`. An answer larger than the whole budget waits for all of it.
    pub(super) async fn take(&self, bytes: usize, within: Duration) -> Result<SemaphorePermit<'_>, StoreError> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).clamp(1, self.units);
        match tokio::time::timeout(within, self.room.acquire_many(units)).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed.
            Ok(Err(closed)) => Err(StoreError::Protocol(format!("the settle budget: {closed}"))),
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_past_the_budget_wait_for_the_room_to_come_back() {
        let budget = Budget::new(4 * UNIT);
        let first = budget.take(3 * UNIT, Duration::from_secs(1)).await.expect("room for the first");
        // One more KiB fits; two more do not, until the first is done.
        let small = budget.take(UNIT, Duration::from_millis(50)).await.expect("room for a small one");
        drop(small);
        let waited = budget.take(2 * UNIT, Duration::from_millis(50)).await;
        assert!(matches!(waited, Err(StoreError::Timeout(_))), "took room that was not there");
        drop(first);
        let again = budget.take(2 * UNIT, Duration::from_millis(50)).await.expect("room once the first is done");
        drop(again);
        // Larger than the whole budget: it takes all of it rather than wait forever.
        let alone =
            budget.take(100 * UNIT, Duration::from_millis(50)).await.expect("an answer past the budget goes alone");
        assert_eq!(budget.room.available_permits(), 0, "it holds the whole budget");
        drop(alone);
    }
}
