//! Whether the store answers, said once per change instead of once per request.
//!
//! During an outage every request, every readiness probe and every renewal meets the same
//! error; logged each time, four seconds of Redis being down under modest traffic wrote
//! hundreds of lines and buried the one that mattered. Every store call reports here: the
//! first failure is one WARN with the error, a summary follows at most every
//! [`SUMMARY_EVERY`] while the store stays down (how many calls failed, the latest error), and
//! one INFO says when it answers again. Each request's own outcome is in the access line.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::error::StoreError;

/// The longest silence while the store stays down.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// The store's health as its calls found it.
#[derive(Default)]
pub struct Health {
    /// Read on every successful call: one relaxed load while all is well.
    down: AtomicBool,
    outage: Mutex<Option<Outage>>,
    /// Commands the store refused (it answers: no outage), and when that was last said.
    refusals: Mutex<Refusals>,
}

#[derive(Default)]
struct Refusals {
    unsaid: u64,
    said: Option<Instant>,
}

struct Outage {
    since: Instant,
    failed: u64,
    failed_since_summary: u64,
    last_summary: Instant,
}

impl Health {
    /// Notes how one store call ended; `place` says where the store is (its addresses, never
    /// credentials), asked only when a line is written.
    pub fn saw(&self, error: Option<&StoreError>, place: impl FnOnce() -> String) {
        match error {
            None if self.down.load(Ordering::Relaxed) => self.answered(&place()),
            None => {}
            Some(e) if unavailable(e) => self.failed(e, place),
            Some(e @ StoreError::Rejected(_)) => self.refused(e, place),
            // A reply the gateway could not read, a slot moving, a full memory store: the
            // store answers; each is logged where it matters.
            Some(_) => {}
        }
    }

    fn failed(&self, error: &StoreError, place: impl FnOnce() -> String) {
        let mut outage = self.outage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let Some(outage) = outage.as_mut() else {
            *outage = Some(Outage { since: now, failed: 1, failed_since_summary: 0, last_summary: now });
            self.down.store(true, Ordering::Relaxed);
            tracing::warn!(store = %place(), error = %error, "store stopped answering; requests that need it are refused (or bypass it, per route) until it is back");
            return;
        };
        outage.failed += 1;
        outage.failed_since_summary += 1;
        if now.duration_since(outage.last_summary) >= SUMMARY_EVERY {
            tracing::warn!(
                store = %place(),
                down_for = %seconds(now.duration_since(outage.since)),
                failed = outage.failed_since_summary,
                error = %error,
                "store still unavailable"
            );
            outage.last_summary = now;
            outage.failed_since_summary = 0;
        }
    }

    /// The store refused a command: said at once, then at most once per
    /// [`SUMMARY_EVERY`] with how many more there were. A command the store refuses is a
    /// bug or a misconfigured store (a disabled command, an ACL), not an outage.
    fn refused(&self, error: &StoreError, place: impl FnOnce() -> String) {
        let mut refusals = self.refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        refusals.unsaid += 1;
        let now = Instant::now();
        if refusals.said.is_some_and(|at| now.duration_since(at) < SUMMARY_EVERY) {
            return;
        }
        tracing::warn!(store = %place(), refused = refusals.unsaid, error = %error, "the store refused a command; it answers, so this is no outage: a bug, or a store that disables what the gateway needs");
        refusals.unsaid = 0;
        refusals.said = Some(now);
    }

    fn answered(&self, place: &str) {
        let mut outage = self.outage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ended) = outage.take() {
            tracing::info!(store = place, down_for = %seconds(ended.since.elapsed()), failed = ended.failed, "store answers again");
        }
        self.down.store(false, Ordering::Relaxed);
    }

    /// Whether the last calls found the store down.
    #[cfg(test)]
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

/// Errors that say the store does not answer (as opposed to answering something odd).
fn unavailable(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(_) | StoreError::Timeout(_))
}

/// A duration for people: `4.1s`, not `4.1057120000000005`.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> String {
        "redis 127.0.0.1:6379".into()
    }

    #[test]
    fn an_outage_is_entered_and_left_once() {
        let health = Health::default();
        health.saw(None, here);
        assert!(!health.is_down());
        for _ in 0..100 {
            health.saw(Some(&StoreError::Unavailable("refused".into())), here);
        }
        assert!(health.is_down());
        assert_eq!(health.outage.lock().unwrap().as_ref().map(|o| o.failed), Some(100));
        health.saw(Some(&StoreError::Protocol("odd".into())), here);
        assert_eq!(health.outage.lock().unwrap().as_ref().map(|o| o.failed), Some(100), "an odd reply is an answer");
        health.saw(None, here);
        assert!(!health.is_down());
        assert!(health.outage.lock().unwrap().is_none());
    }

    #[test]
    fn a_refused_command_is_no_outage() {
        let health = Health::default();
        for _ in 0..5 {
            health.saw(Some(&StoreError::Rejected("ERR value is out of range".into())), here);
        }
        assert!(!health.is_down());
        assert!(health.outage.lock().unwrap().is_none());
        let refusals = health.refusals.lock().unwrap();
        assert_eq!(refusals.unsaid, 4, "said once, then counted until the next summary");
    }

    #[test]
    fn durations_read_as_seconds() {
        assert_eq!(seconds(Duration::from_nanos(4_105_712_000)), "4.1s");
    }
}
