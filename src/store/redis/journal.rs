//! The keys this gateway claimed and answered lately, so that a data-loss alarm (`epoch`) can
//! name them: after a failover to a replica that had not caught up, the records written in the
//! last moments before it may be gone, and an operator who knows which keys can check them
//! upstream (a retry of one of them runs again, as attempt 1).
//!
//! Each entry is the record's short name (as the logs show it) and when it was written; kept
//! for [`HORIZON`], at most [`CAPACITY`] entries (the oldest go first; the alarm says how many
//! it could not name).

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::names::RecordKey;

/// How long a write is remembered: longer than a check cycle plus a failover's detection.
const HORIZON: Duration = Duration::from_secs(30);

/// The most entries kept (about 32 bytes each).
const CAPACITY: usize = 16 * 1024;

/// What was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wrote {
    /// A claim: its request is (or was) running.
    Claim,
    /// An answer, an unknown mark or a release: the claim ended.
    End,
}

/// Recent writes, oldest first.
#[derive(Default)]
pub(super) struct Journal {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    list: VecDeque<(Instant, Short, Wrote)>,
    /// Entries dropped for room while younger than the horizon, since the last alarm.
    dropped: u64,
}

/// A record's short name, as the logs write it, without an allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Short([u8; 12], u8);

impl Short {
    fn of(key: &RecordKey) -> Self {
        // A record's name ends in `:` and 64 hex digits, whose first 12 are its short form:
        // taken from the end, without searching the name for its last `:` at every write.
        let name = key.as_str().as_bytes();
        let short = match name.len().checked_sub(65) {
            Some(colon) if name[colon] == b':' => &name[colon + 1..colon + 13],
            _ => key.short().as_bytes(),
        };
        let mut bytes = [0; 12];
        let len = short.len().min(12);
        bytes[..len].copy_from_slice(&short[..len]);
        Self(bytes, len as u8)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0[..usize::from(self.1)]).into_owned()
    }
}

/// What the journal says of a window: the keys answered in it, the keys in flight (claimed,
/// not yet ended), and how many writes it could not name.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Named {
    pub ended: Vec<String>,
    pub in_flight: Vec<String>,
    pub unnamed: u64,
}

impl Journal {
    /// Notes a write of `key`.
    pub fn note(&self, wrote: Wrote, key: &RecordKey) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((at, _, _)) = entries.list.front() {
            let old = now.duration_since(*at) > HORIZON;
            if !old && entries.list.len() < CAPACITY {
                break;
            }
            entries.list.pop_front();
            if !old {
                entries.dropped += 1;
            }
        }
        entries.list.push_back((now, Short::of(key), wrote));
    }

    /// The keys whose claim ended (answered, marked unknown or released) since `from`, and
    /// those still in flight (claimed since the horizon, not ended); each key once.
    pub fn since(&self, from: Instant) -> Named {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ended = Vec::new();
        let mut claimed = Vec::new();
        // Newest first: a key's last write says where it stands.
        let mut seen = HashSet::new();
        for (at, short, wrote) in entries.list.iter().rev() {
            if !seen.insert(*short) {
                continue;
            }
            match wrote {
                Wrote::End if *at >= from => ended.push(short.text()),
                Wrote::End => {}
                Wrote::Claim => claimed.push(short.text()),
            }
        }
        ended.reverse();
        claimed.reverse();
        Named { ended, in_flight: claimed, unnamed: std::mem::take(&mut entries.dropped) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RecordKey {
        RecordKey(format!("p:s:{name}"))
    }

    #[test]
    fn the_short_form_is_the_one_the_logs_show() {
        let hashed = RecordKey(format!("app:s:{}", "0123456789abcdef".repeat(4)));
        assert_eq!(Short::of(&hashed).text(), hashed.short());
        let plain = key("plain-name");
        assert_eq!(Short::of(&plain).text(), plain.short());
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_names_what_ended_in_it_and_what_is_still_running() {
        let journal = Journal::default();
        let (old, answered, running) = (key("old"), key("answered"), key("running"));
        journal.note(Wrote::Claim, &old);
        journal.note(Wrote::End, &old);
        tokio::time::advance(Duration::from_secs(5)).await;
        let from = Instant::now();
        journal.note(Wrote::Claim, &answered);
        journal.note(Wrote::Claim, &running);
        journal.note(Wrote::End, &answered);
        let named = journal.since(from);
        assert_eq!(named.ended, vec![answered.short().to_owned()]);
        assert_eq!(named.in_flight, vec![running.short().to_owned()]);
        assert_eq!(named.unnamed, 0);
        tokio::time::advance(HORIZON + Duration::from_secs(1)).await;
        journal.note(Wrote::Claim, &key("later"));
        assert_eq!(journal.since(from).ended, Vec::<String>::new(), "past the horizon, forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_journal_counts_what_it_could_not_keep() {
        let journal = Journal::default();
        let k = key("k");
        for _ in 0..CAPACITY + 10 {
            journal.note(Wrote::End, &k);
        }
        assert_eq!(journal.since(Instant::now()).unnamed, 10);
    }
}
