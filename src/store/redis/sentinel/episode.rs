//! A stretch without a primary to follow, told once in the log.
//!
//! While there is no primary to follow, every check asks the Sentinels again, up to four
//! times a second while calls fail; a warning per ask wrote a dozen lines per failover, all
//! saying the same. An episode is told by a warning when it begins (and when the other
//! condition first shows in it, so that the log says what is wrong now, not only what was
//! wrong first), debug lines while it lasts, and one info line, with how long it lasted and
//! how many asks found nothing, once a primary that answers is followed again.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Address;

/// Why there is no primary to follow.
pub(super) enum Lack {
    /// No Sentinel named a primary: each deems it down (as they all do until they promote a
    /// replica), or did not answer (`failures`, one line per Sentinel that failed, so that a
    /// wrong CA or address says so in the log).
    Unnamed { failures: Vec<String> },
    /// The Sentinels named `primary`, and it does not answer as a primary.
    Unanswering { primary: Address, error: String },
}

/// The stretch without a primary to follow, if there is one now.
#[derive(Default)]
pub(super) struct Episode(Option<Open>);

struct Open {
    since: Instant,
    /// Asks that found no primary to follow.
    asks: u32,
    /// Whether each kind of [`Lack`] was warned of: no Sentinel named a primary, the named
    /// one does not answer.
    warned: [bool; 2],
}

impl Episode {
    /// Notes an ask that found no primary to follow, for `lack`; whether it deserves a
    /// warning (the first of its kind in the episode) rather than a debug line.
    pub fn lacked(&mut self, lack: &Lack, now: Instant) -> bool {
        let kind = match lack {
            Lack::Unnamed { .. } => 0,
            Lack::Unanswering { .. } => 1,
        };
        let open = self.0.get_or_insert(Open { since: now, asks: 0, warned: [false; 2] });
        open.asks += 1;
        !std::mem::replace(&mut open.warned[kind], true)
    }

    /// Ends the episode, if one is open: how long it lasted, and how many asks found nothing.
    pub fn ended(&mut self, now: Instant) -> Option<(Duration, u32)> {
        self.0.take().map(|open| (now.saturating_duration_since(open.since), open.asks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn an_episode_without_a_primary_warns_once_per_condition_and_ends_once() {
        let t0 = Instant::now();
        let unnamed = || Lack::Unnamed { failures: Vec::new() };
        let unanswering = || Lack::Unanswering { primary: Address { host: "a".into(), port: 1 }, error: "gone".into() };
        let mut episode = Episode::default();
        assert_eq!(episode.ended(t0), None, "nothing to end while a primary is followed");
        // The old primary dies: the Sentinels still name it, then deem it down; a dozen asks.
        assert!(episode.lacked(&unanswering(), t0), "the episode begins: a warning");
        assert!(!episode.lacked(&unanswering(), at(t0, 250)), "then debug lines");
        assert!(episode.lacked(&unnamed(), at(t0, 1000)), "a new condition in it: a warning");
        for n in 0..12 {
            assert!(!episode.lacked(&unnamed(), at(t0, 1250 + 250 * n)));
            assert!(!episode.lacked(&unanswering(), at(t0, 1250 + 250 * n)));
        }
        // The Sentinels name the promoted replica: one line, with how long and how many asks.
        assert_eq!(episode.ended(at(t0, 4500)), Some((Duration::from_millis(4500), 27)));
        assert_eq!(episode.ended(at(t0, 5000)), None, "said once");
        // The next failover is an episode of its own.
        assert!(episode.lacked(&unnamed(), at(t0, 60_000)));
        assert_eq!(episode.ended(at(t0, 61_000)), Some((Duration::from_secs(1), 1)));
    }
}
