//! When the Sentinel follower checks next.
//!
//! The hazard: a follower that sleeps out [`MIN_SPACING`] leaves a `+switch-master`
//! announcement that arrives meanwhile unread until the sleep ends, and the links on the old
//! primary. The next check is a deadline instead, which the follower waits for while it goes
//! on listening to announcements.

use std::time::Duration;

use tokio::time::Instant;

/// How often the Sentinel follower checks that its primary is still one.
const FOLLOW_CHECK: Duration = Duration::from_secs(1);
/// The least time between two checks woken by failing calls (which, under load, fail by the
/// thousand while a primary is down).
const MIN_SPACING: Duration = Duration::from_millis(250);

/// When the follower checks next: [`FOLLOW_CHECK`] after the last check ended, or, once a
/// call met a read-only or broken node, [`MIN_SPACING`] after the last check began (at once
/// if that has passed).
pub(super) struct Schedule {
    next: Instant,
    /// When the last check began.
    began: Instant,
    /// Trouble brought `next` forward since the last check: further reports change nothing
    /// until the next check, and listening to them would wake the follower once per failing
    /// call (they fail by the thousand under load while a primary is down).
    hastened: bool,
}

impl Schedule {
    /// A schedule whose first check is due at `now`.
    pub fn new(now: Instant) -> Self {
        Schedule { next: now, began: now, hastened: false }
    }

    /// When the next check is due (perhaps already).
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Whether a call's trouble could still bring the next check forward.
    pub fn hears_trouble(&self) -> bool {
        !self.hastened
    }

    /// A call met a node that is read-only or gone.
    pub fn trouble(&mut self) {
        self.next = self.next.min(self.began + MIN_SPACING);
        self.hastened = true;
    }

    /// A check ran from `began` to `ended`.
    pub fn checked(&mut self, began: Instant, ended: Instant) {
        self.began = began;
        self.next = ended + FOLLOW_CHECK;
        self.hastened = false;
    }

    /// The next check is due at `now`.
    pub fn check_now(&mut self, now: Instant) {
        self.next = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn failing_calls_bring_the_next_check_forward_to_the_spacing_and_no_further() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(t0);
        assert_eq!(schedule.next(), t0, "the first check is due at once");
        // A check from 0 to 100 ms; the next one a second after it ended.
        schedule.checked(t0, at(t0, 100));
        assert_eq!(schedule.next(), at(t0, 1100));
        // A call fails: the next check comes MIN_SPACING after the last one began.
        assert!(schedule.hears_trouble());
        schedule.trouble();
        assert_eq!(schedule.next(), at(t0, 250));
        assert!(!schedule.hears_trouble(), "the thousand calls that fail next wake nothing");
        // A slow check (the old primary answering with the store timeout): due at once after it.
        schedule.checked(at(t0, 250), at(t0, 2250));
        assert!(schedule.hears_trouble());
        schedule.trouble();
        assert_eq!(schedule.next(), at(t0, 500));
        // An announcement that could not be followed: ask at once.
        schedule.checked(at(t0, 2300), at(t0, 2310));
        schedule.check_now(at(t0, 2400));
        assert_eq!(schedule.next(), at(t0, 2400));
    }
}
