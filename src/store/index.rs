//! The index of records that need an operator: per route, the keys whose record is `unknown`
//! or `executed`, so that an operator can find them without knowing the key or the caller.
//!
//! Records are named by a hash (see [`RecordKey`]), so without an index nobody could list
//! them. The index is written only when a record enters one of those two states, never on the
//! first-request path; it holds the client's key, the method and path and the scope's hash,
//! never a credential. In a Redis Cluster it lives on one node per route and the record on
//! another, so it is best-effort: a write may fail while the record's succeeded, and an entry
//! may outlive its record's state. Every entry is therefore checked against its record when
//! read, and entries expire with their records (the score is the expiry).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::names::RecordKey;
use super::state::State;

/// The name of one route's index (its keys share one Cluster hash slot).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexKey(String);

impl IndexKey {
    /// The index of `route`.
    pub fn new(prefix: &str, route: &str) -> Self {
        // Route names are A-Z a-z 0-9 - _ . (config checks), so the braces are the hash tag.
        Self(format!("{prefix}:ix:{{{route}}}"))
    }

    /// The sorted set of entries in `held` (one of [`State::HELD`]), scored by expiry: the
    /// state's letter is the set's suffix.
    pub fn set(&self, held: State) -> String {
        format!("{}:{}", self.0, char::from(held.letter()))
    }

    /// The hash holding each entry's description, by record name.
    pub fn data(&self) -> String {
        format!("{}:d", self.0)
    }
}

/// One record in the index, as the request that made it described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The record's name in the store.
    pub record: String,
    /// The key as a header carries it (bare, or quoted as an sf-string): what `key=` takes.
    pub key: String,
    /// The scope's hash, in hex (what `GET /keys` takes as `scope_hash`).
    pub scope_hash: String,
    /// The request's method.
    pub method: String,
    /// The request's path and query, as the client sent them.
    pub path: String,
    /// When the record entered its state, in ms since the Unix epoch (this gateway's clock).
    pub since_unix_ms: u64,
}

impl IndexEntry {
    /// The record this entry names.
    pub fn record_key(&self) -> RecordKey {
        RecordKey(self.record.clone())
    }

    /// An entry whose description is missing: only its record is known.
    pub fn unnamed(record: String) -> Self {
        Self {
            record,
            key: String::new(),
            scope_hash: String::new(),
            method: String::new(),
            path: String::new(),
            since_unix_ms: 0,
        }
    }

    /// The entry as the store keeps it.
    pub fn encode(&self) -> String {
        // Plain strings and a number: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// An entry as the store kept it; `None` for one this version cannot read.
    pub fn decode(text: &[u8]) -> Option<Self> {
        serde_json::from_slice(text).ok()
    }
}

/// The largest score a cursor may name: integers up to 2^53 are exact in a double.
const MAX_SCORE: u64 = 1 << 53;
/// The most entries tied on one score a cursor may skip.
const MAX_SKIP: u64 = u32::MAX as u64;

/// Where a page of the index starts: the score of the last entry listed, and how many entries
/// with that score were listed (scores may tie).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The expiry score, ms since the Unix epoch.
    pub score: u64,
    /// Entries at that score already listed.
    pub skip: u64,
}

impl Cursor {
    /// The opaque text the admin API hands out.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.score, self.skip)
    }

    /// Parses a cursor the admin API handed out; `None` for one it could not have: digits
    /// only, a score a store keeps exactly (Redis scores are doubles) and a count of ties an
    /// index can hold. (Out of those bounds Redis refuses the listing: a client's mistake
    /// that must not read as the store being down.)
    pub fn decode(text: &str) -> Option<Self> {
        let (score, skip) = text.split_once('.')?;
        let number = |digits: &str| digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse::<u64>().ok())?;
        let cursor = Self { score: number(score)?, skip: number(skip)? };
        (cursor.score <= MAX_SCORE && cursor.skip <= MAX_SKIP).then_some(cursor)
    }

    /// The cursor after `entries` (scored) that followed `self`, if they filled the page.
    pub fn after(start: Option<Self>, scores: &[u64]) -> Option<Self> {
        let last = *scores.last()?;
        let tied = scores.iter().rev().take_while(|s| **s == last).count() as u64;
        let skip = match start {
            // Every entry of the page shares the start's score: skip those too.
            Some(c) if c.score == last && tied == scores.len() as u64 => c.skip + tied,
            _ => tied,
        };
        Some(Self { score: last, skip })
    }
}

/// One page of the index.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The entries, oldest expiry first, each with its score.
    pub entries: Vec<(IndexEntry, u64)>,
    /// Where the next page starts; `None` when this one was the last.
    pub next: Option<Cursor>,
}

impl Page {
    /// A page of `entries` read from `start`, asked for `limit` of them: a full page has a
    /// next one (which may be empty), a short one is the last.
    pub fn new(entries: Vec<(IndexEntry, u64)>, start: Cursor, limit: usize) -> Self {
        let next = match entries.len() < limit {
            true => None,
            false => Cursor::after(Some(start), &entries.iter().map(|(_, score)| *score).collect::<Vec<_>>()),
        };
        Self { entries, next }
    }
}

/// Now, in ms since the Unix epoch, by this gateway's clock (index scores only: they order
/// and expire entries, and every entry is checked against its record when read).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a listing really starts: entries that expired before now are skipped.
pub fn live_start(cursor: Option<Cursor>) -> Cursor {
    let now = unix_ms();
    match cursor {
        Some(c) if c.score >= now => c,
        _ => Cursor { score: now, skip: 0 },
    }
}

/// The score of an entry that expires `expires_in` from now.
pub fn expiry_score(expires_in: Duration) -> u64 {
    unix_ms().saturating_add(u64::try_from(expires_in.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_count_ties() {
        let c = Cursor { score: 1_700_000_000_123, skip: 2 };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert_eq!(Cursor::decode("x.1"), None);
        assert_eq!(Cursor::decode("12"), None);
        // Numbers no cursor handed out could hold, which Redis would refuse.
        assert_eq!(Cursor::decode("18446744073709551615.18446744073709551615"), None);
        assert_eq!(Cursor::decode("1.18446744073709551615"), None);
        assert_eq!(Cursor::decode("9007199254740993.0"), None);
        assert_eq!(Cursor::decode("+1.2"), None);
        assert_eq!(Cursor::decode("1.-2"), None);
        assert_eq!(Cursor::after(None, &[5, 6, 6]), Some(Cursor { score: 6, skip: 2 }));
        // A page wholly inside one tied score carries the earlier skip on.
        assert_eq!(Cursor::after(Some(Cursor { score: 6, skip: 2 }), &[6, 6]), Some(Cursor { score: 6, skip: 4 }));
        assert_eq!(Cursor::after(Some(Cursor { score: 6, skip: 2 }), &[6, 7]), Some(Cursor { score: 7, skip: 1 }));
        assert_eq!(Cursor::after(None, &[]), None);
    }

    #[test]
    fn entries_round_trip() {
        let e = IndexEntry {
            record: "p:s:ab".into(),
            key: "k \"1\"".into(),
            scope_hash: "00".into(),
            method: "POST".into(),
            path: "/orders?x=1".into(),
            since_unix_ms: 7,
        };
        assert_eq!(IndexEntry::decode(e.encode().as_bytes()), Some(e));
        assert_eq!(IndexEntry::decode(b"not json"), None);
    }
}
