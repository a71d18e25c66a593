//! The memory store's audit trail: a ring of the last entries, for its single gateway, kept
//! as Redis keeps its stream (ids from the clock, never going back; capped by count and age).

use std::sync::PoisonError;
use std::time::Duration;

use super::engine::MemoryStore;
use crate::store::audit::{AuditEntry, AuditId, AuditPage};
use crate::store::error::Result;
use crate::store::index::unix_ms;
use crate::store::roles::Audit;

impl Audit for MemoryStore {
    async fn append(&self, document: &str, keep: u64, max_age: Duration) -> Result<()> {
        let mut trail = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
        let now = unix_ms();
        // As Redis does: an id after the last one, even if the clock stepped back.
        let id = match trail.back() {
            Some(last) if last.id.ms >= now => AuditId { ms: last.id.ms, seq: last.id.seq + 1 },
            _ => AuditId { ms: now, seq: 0 },
        };
        trail.push_back(AuditEntry { id, document: document.to_owned() });
        let oldest_kept = now.saturating_sub(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX));
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        while trail.len() > keep || trail.front().is_some_and(|e| e.id.ms < oldest_kept) {
            trail.pop_front();
        }
        Ok(())
    }

    async fn trail(&self, before: Option<AuditId>, limit: usize) -> Result<AuditPage> {
        let trail = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
        let entries: Vec<AuditEntry> =
            trail.iter().rev().filter(|e| before.is_none_or(|before| e.id < before)).take(limit).cloned().collect();
        let next = if entries.len() == limit { entries.last().map(|e| e.id) } else { None };
        Ok(AuditPage { entries, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_trail_keeps_the_newest_and_pages_back_to_the_oldest() {
        let store = MemoryStore::new(1000, 1 << 20);
        for n in 0..7 {
            store.append(&format!("{{\"n\":{n}}}"), 5, Duration::from_secs(3600)).await.expect("appended");
        }
        let first = store.trail(None, 3).await.expect("a page");
        let docs = |page: &AuditPage| page.entries.iter().map(|e| e.document.clone()).collect::<Vec<_>>();
        assert_eq!(docs(&first), ["{\"n\":6}", "{\"n\":5}", "{\"n\":4}"]);
        let second = store.trail(first.next, 3).await.expect("a page");
        assert_eq!(docs(&second), ["{\"n\":3}", "{\"n\":2}"], "five kept: the two oldest went");
        assert_eq!(second.next, None);
        // Ids only grow, also within one millisecond.
        let ids: Vec<AuditId> = first.entries.iter().chain(&second.entries).map(|e| e.id).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
    }

    #[tokio::test]
    async fn entries_past_their_age_go() {
        let store = MemoryStore::new(1000, 1 << 20);
        store.append("{}", 10, Duration::from_millis(1)).await.expect("appended");
        tokio::time::sleep(Duration::from_millis(20)).await;
        store.append("{\"last\":1}", 10, Duration::from_millis(1)).await.expect("appended");
        let page = store.trail(None, 10).await.expect("a page");
        assert_eq!(page.entries.len(), 1, "the older entry outlived its age");
    }
}
