//! What an operator sees and does in Redis: a record inspected, resolved or purged (each one
//! script), and the index of held records (one script on the route's keys, see `index`).

use std::time::Duration;

use redis::Value;

use super::engine::RedisStore;
use super::lifecycle::Encoded;
use super::round_trip::ms;
use super::round_trip::{Reply, protocol};
use crate::store::entry::{Entry, EntryState, Purged, Resolved};
use crate::store::error::Result;
use crate::store::index::{Cursor, IndexEntry, IndexKey, Page, expiry_score, live_start, unix_ms};
use crate::store::names::RecordKey;
use crate::store::record::StoredResponse;
use crate::store::roles::{Index, Operator, Records};
use crate::store::state::State;

impl Records for RedisStore {
    async fn get(&self, key: &RecordKey) -> Result<Option<Entry>> {
        let mut items = Reply::array(self.transport.eval(&self.scripts.inspect, key.as_str(), |_| {}).await?)?;
        if items.is_empty() {
            return Ok(None);
        }
        let tag = items.tag()?;
        let attempt = items.attempt()?;
        let lease_left = Duration::from_millis(items.int()?.max(0) as u64);
        let expires_in = Duration::from_millis(items.int()?.max(0) as u64);
        let mut answer = None;
        let state = match state_of(&tag)?.ok_or_else(|| protocol("a record without a state"))? {
            State::InProgress => EntryState::InProgress { lease_left },
            State::Completed => {
                let r = items.response()?;
                let state = EntryState::Completed { status: r.status.as_u16(), body_len: r.body.len() };
                answer = Some(r);
                state
            }
            State::Executed => {
                let r = items.response()?;
                let state = EntryState::Executed { status: r.status.as_u16() };
                answer = Some(r);
                state
            }
            State::Unknown => {
                // Negative: the record keeps no trust time (written by an earlier version).
                let trusted_in = u64::try_from(items.int()?).ok().map(Duration::from_millis);
                EntryState::Unknown { lookup: Some(lease_left).filter(|left| !left.is_zero()), trusted_in }
            }
            State::Released => EntryState::Released,
        };
        Ok(Some(Entry { state, attempt, expires_in, answer }))
    }
}

impl Operator for RedisStore {
    async fn resolve(&self, key: &RecordKey, response: &StoredResponse, retention: Duration) -> Result<Resolved> {
        let reply = self.transport.eval(&self.scripts.resolve, key.as_str(), |cmd| {
            cmd.arg(Encoded(response)).arg(ms(retention)).arg(&self.channel);
        });
        let mut items = Reply::array(reply.await?)?;
        let done = items.int()? == 1;
        let state = state_of(&items.tag()?)?;
        Ok(match (done, state) {
            (true, Some(was)) => Resolved::Done { was },
            (_, state) => Resolved::Refused { state },
        })
    }

    async fn purge(&self, key: &RecordKey, force: bool) -> Result<Purged> {
        let reply = self.transport.eval(&self.scripts.purge, key.as_str(), |cmd| {
            cmd.arg(&self.channel).arg(if force { "1" } else { "0" });
        });
        let mut items = Reply::array(reply.await?)?;
        match items.tag()?.as_slice() {
            b"released" => match state_of(&items.tag()?)? {
                Some(State::Released) | None => Err(protocol("purge reply: released a released record")),
                Some(was) => Ok(Purged::Released { was }),
            },
            b"refused" => Ok(Purged::Refused { lease_left: Duration::from_millis(items.int()?.max(1) as u64) }),
            b"none" => Ok(Purged::Nothing),
            other => Err(protocol(&format!("unknown purge reply {:?}", String::from_utf8_lossy(other)))),
        }
    }
}

impl Index for RedisStore {
    async fn index(&self, index: &IndexKey, held: State, entry: &IndexEntry, expires_in: Duration) -> Result<()> {
        let score = expiry_score(expires_in);
        let description = entry.encode();
        self.eval_index(index, |cmd| {
            cmd.arg("add").arg(&[held.letter()][..]).arg(&entry.record).arg(score).arg(&description).arg(unix_ms());
        })
        .await?;
        Ok(())
    }

    async fn unindex(&self, index: &IndexKey, record: &RecordKey) -> Result<()> {
        self.eval_index(index, |cmd| {
            cmd.arg("remove").arg(record.as_str());
        })
        .await?;
        Ok(())
    }

    async fn list(&self, index: &IndexKey, held: State, cursor: Option<Cursor>, limit: usize) -> Result<Page> {
        let start = live_start(cursor);
        let reply = self.eval_index(index, |cmd| {
            cmd.arg("list").arg(&[held.letter()][..]).arg(start.score).arg(start.skip).arg(limit);
        });
        let items = match reply.await? {
            Value::Array(items) => items,
            Value::Nil => Vec::new(),
            other => return Err(protocol(&format!("index list reply {other:?}"))),
        };
        let mut found = Vec::new();
        for triple in items.chunks(3) {
            let [name, score, description] = triple else { return Err(protocol("index list reply cut short")) };
            let score = bulk(score)
                .and_then(|s| std::str::from_utf8(s).ok()?.parse::<f64>().ok())
                .ok_or_else(|| protocol("index score is not a number"))? as u64;
            match bulk(description).and_then(IndexEntry::decode) {
                Some(entry) => found.push((entry, score)),
                // No description (written half, or by another version): named, nothing else.
                None => {
                    let name =
                        bulk(name).and_then(|n| std::str::from_utf8(n).ok()).ok_or_else(|| protocol("index name"))?;
                    found.push((IndexEntry::unnamed(name.to_owned()), score));
                }
            }
        }
        Ok(Page::new(found, start, limit))
    }

    async fn count(&self, index: &IndexKey, held: State) -> Result<u64> {
        let reply = self.eval_index(index, |cmd| {
            cmd.arg("count").arg(&[held.letter()][..]).arg(unix_ms());
        });
        u64::try_from(Reply::integer(reply.await?)?).map_err(|_| protocol("index count out of range"))
    }
}

impl RedisStore {
    /// Calls the index script on `index`'s keys (the two sets of held records and the
    /// entries' data, in one hash slot); `args` appends its ARGV.
    async fn eval_index(&self, index: &IndexKey, args: impl Fn(&mut redis::Cmd) + Sync) -> Result<Value> {
        let keys = [index.set(State::Unknown), index.set(State::Executed), index.data()];
        let keys = [keys[0].as_str(), keys[1].as_str(), keys[2].as_str()];
        self.transport.eval_sized(&self.scripts.index, &keys, 0, args).await
    }
}

/// The bytes of a bulk string reply.
fn bulk(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The state a script replied with, by its letter; `None` for an absent record ("").
fn state_of(letter: &[u8]) -> Result<Option<State>> {
    match letter {
        [] => Ok(None),
        &[one] => State::from_letter(one)
            .map(Some)
            .ok_or_else(|| protocol(&format!("unknown record state {:?}", char::from(one)))),
        other => Err(protocol(&format!("unknown record state {:?}", String::from_utf8_lossy(other)))),
    }
}
