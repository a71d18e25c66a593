//! What an operator sees and does in the memory store: records inspected, resolved and
//! purged, and the index of held records, kept as Redis keeps it (per route, by state, in
//! expiry order).

use std::sync::PoisonError;
use std::time::Duration;

use tokio::time::Instant;

use super::engine::{Data, MemoryStore};
use crate::store::entry::{Entry, EntryState, Purged, Resolved};
use crate::store::error::Result;
use crate::store::index::{Cursor, IndexEntry, IndexKey, Page, expiry_score, live_start, unix_ms};
use crate::store::names::RecordKey;
use crate::store::record::StoredResponse;
use crate::store::roles::{Index, Operator, Records};
use crate::store::state::State;

impl Records for MemoryStore {
    async fn get(&self, key: &RecordKey) -> Result<Option<Entry>> {
        let now = Instant::now();
        let inner = self.lock();
        Ok(inner.entries.get(key).map(|slot| Entry {
            state: slot.entry_state(now),
            attempt: slot.attempt,
            expires_in: slot.expires.0.saturating_duration_since(now),
            // A clone shares the body's bytes.
            answer: match &slot.data {
                Data::Completed(r) | Data::Executed(r) => Some(r.clone()),
                _ => None,
            },
        }))
    }
}

impl Operator for MemoryStore {
    async fn resolve(&self, key: &RecordKey, response: &StoredResponse, retention: Duration) -> Result<Resolved> {
        let now = Instant::now();
        let was = {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(key) else { return Ok(Resolved::Refused { state: None }) };
            let was = match slot.entry_state(now).state() {
                was @ (State::Unknown | State::Executed) => was,
                other => return Ok(Resolved::Refused { state: Some(other) }),
            };
            let old = slot.weight();
            slot.data = Data::Completed(response.compact());
            slot.settled_by = None;
            let new = slot.weight();
            inner.bytes = inner.bytes - old + new;
            inner.set_expiry(key, now + retention);
            was
        };
        self.waiters.notify(key.as_str());
        Ok(Resolved::Done { was })
    }

    async fn purge(&self, key: &RecordKey, force: bool) -> Result<Purged> {
        let released = {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(key) else { return Ok(Purged::Nothing) };
            let was = match slot.entry_state(Instant::now()) {
                EntryState::Released => return Ok(Purged::Nothing),
                // A request holds it, and may be running upstream now.
                EntryState::InProgress { lease_left } if !force && !lease_left.is_zero() => {
                    return Ok(Purged::Refused { lease_left });
                }
                state => state.state(),
            };
            let weight = slot.weight();
            slot.data = Data::Released;
            inner.bytes -= weight;
            was
        };
        self.waiters.notify(key.as_str());
        Ok(Purged::Released { was: released })
    }
}

impl Index for MemoryStore {
    async fn index(&self, index: &IndexKey, held: State, entry: &IndexEntry, expires_in: Duration) -> Result<()> {
        let mut indexes = self.indexes.lock().unwrap_or_else(PoisonError::into_inner);
        let now = unix_ms();
        // Expired entries of every index go first, so that the map holds only live ones.
        for index in indexes.values_mut() {
            let expired: Vec<String> =
                index.place.iter().filter(|(_, (_, score))| *score < now).map(|(r, _)| r.clone()).collect();
            for record in expired {
                index.remove(&record);
            }
        }
        indexes.retain(|_, index| !index.place.is_empty());
        let index = indexes.entry(index.clone()).or_default();
        index.remove(&entry.record);
        let score = expiry_score(expires_in);
        index.place.insert(entry.record.clone(), (held, score));
        index.order.insert((held, score, entry.record.clone()), entry.clone());
        Ok(())
    }

    async fn unindex(&self, index: &IndexKey, record: &RecordKey) -> Result<()> {
        let mut indexes = self.indexes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = indexes.get_mut(index) {
            index.remove(record.as_str());
        }
        Ok(())
    }

    async fn list(&self, index: &IndexKey, held: State, cursor: Option<Cursor>, limit: usize) -> Result<Page> {
        let indexes = self.indexes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(index) = indexes.get(index) else { return Ok(Page::default()) };
        let start = live_start(cursor);
        let from = (held, start.score, String::new());
        let entries: Vec<(IndexEntry, u64)> = index
            .order
            .range(from..)
            .take_while(|((h, _, _), _)| *h == held)
            .skip(usize::try_from(start.skip).unwrap_or(usize::MAX))
            .take(limit)
            .map(|((_, score, _), entry)| (entry.clone(), *score))
            .collect();
        Ok(Page::new(entries, start, limit))
    }

    async fn count(&self, index: &IndexKey, held: State) -> Result<u64> {
        let indexes = self.indexes.lock().unwrap_or_else(PoisonError::into_inner);
        let now = unix_ms();
        Ok(indexes.get(index).map_or(0, |i| i.place.values().filter(|(h, s)| *h == held && *s >= now).count() as u64))
    }
}
