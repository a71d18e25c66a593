//! The audit trail in Redis: one stream, `PREFIX:audit`, shared by every gateway on the store.
//! An entry is added and the stream trimmed to its count and age in one round trip (`XADD
//! ... MAXLEN =`, then `XTRIM ... MINID =`, exact: operators' calls are few, and an exact cap
//! is the one documented); pages are read newest first with `XREVRANGE`. The stream has no
//! expiry: under a `volatile-*` eviction policy it is never evicted, under `noeviction` (the
//! one recommended) it counts against `maxmemory` like the records.

use std::time::Duration;

use redis::Value;

use super::engine::RedisStore;
use super::round_trip::{ms, protocol};
use crate::store::audit::{AuditEntry, AuditId, AuditPage};
use crate::store::error::Result;
use crate::store::index::unix_ms;
use crate::store::roles::Audit;

/// The one field of an entry: the document.
const FIELD: &str = "entry";

impl RedisStore {
    fn audit_key(&self) -> String {
        format!("{}:audit", self.prefix)
    }
}

impl Audit for RedisStore {
    async fn append(&self, document: &str, keep: u64, max_age: Duration) -> Result<()> {
        let key = self.audit_key();
        // The gateway's clock against the stream's ids (Redis's clock): a skew of seconds
        // against an age of days.
        let oldest = unix_ms().saturating_sub(ms(max_age));
        let mut pipe = redis::pipe();
        pipe.cmd("XADD").arg(&key).arg("MAXLEN").arg("=").arg(keep).arg("*").arg(FIELD).arg(document).ignore();
        pipe.cmd("XTRIM").arg(&key).arg("MINID").arg("=").arg(oldest).ignore();
        self.transport.query::<()>(pipe, None).await
    }

    async fn trail(&self, before: Option<AuditId>, limit: usize) -> Result<AuditPage> {
        // `(ID` excludes the entry itself (Redis 6.2 and newer; the gateway needs 7.0).
        let end = before.map_or_else(|| "+".to_owned(), |id| format!("({id}"));
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(self.audit_key()).arg(end).arg("-").arg("COUNT").arg(limit);
        let reply: Value = self.transport.query(cmd, None).await?;
        let items = match reply {
            Value::Array(items) => items,
            Value::Nil => Vec::new(),
            other => return Err(protocol(&format!("XREVRANGE answered {other:?}"))),
        };
        let mut entries = Vec::with_capacity(items.len());
        for item in items {
            entries.push(entry(item)?);
        }
        let next = if entries.len() == limit { entries.last().map(|e| e.id) } else { None };
        Ok(AuditPage { entries, next })
    }
}

/// One stream entry: `[id, [field, value, ...]]` (a map of fields under RESP3).
fn entry(item: Value) -> Result<AuditEntry> {
    let Value::Array(mut parts) = item else { return Err(protocol("a stream entry is not an array")) };
    let (Some(fields), Some(id)) = (parts.pop(), parts.pop()) else {
        return Err(protocol("a stream entry without its id and fields"));
    };
    let id = text(&id).and_then(AuditId::parse).ok_or_else(|| protocol("a stream entry's id"))?;
    let pairs: Vec<(Value, Value)> = match fields {
        Value::Array(flat) => {
            let mut flat = flat.into_iter();
            std::iter::from_fn(|| Some((flat.next()?, flat.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        _ => return Err(protocol("a stream entry's fields")),
    };
    // An entry without the field (written by hand) reads as an empty document, not an error
    // that would hide the whole page.
    let document = pairs
        .iter()
        .find(|(name, _)| text(name) == Some(FIELD))
        .and_then(|(_, value)| text(value))
        .unwrap_or("{}")
        .to_owned();
    Ok(AuditEntry { id, document })
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}
