//! The embedded store: one process, same semantics as Redis.
//!
//! For a single instance and for development. Leases, takeover and retention behave exactly as
//! in Redis (the conformance suite runs against both). Time is tokio's clock, so tests can
//! advance it. Memory is bounded: past `max_entries` or `max_bytes`, the completed record
//! closest to its expiry is evicted first (a retry of it would run again, and the upstream's
//! constraint catches that); open claims are never evicted, and a store full of them refuses
//! new claims with [`StoreError::Full`], which the route's `on_store_error` policy answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::waiters::Waiters;
use super::{Claim, Entry, Lease, OwnerToken, RecordKey, Renewal, Settled, Store, StoreError, StoredResponse, Watch};
use crate::idempotent::fingerprint::Fingerprint;

/// The in-process store.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    waiters: Arc<Waiters>,
    max_entries: usize,
    max_bytes: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<RecordKey, Slot>,
    /// Expiry order of all entries; the u64 makes equal instants distinct.
    expiry: BTreeMap<(Instant, u64), RecordKey>,
    next_id: u64,
    bytes: u64,
}

struct Slot {
    fingerprint: Fingerprint,
    attempt: u32,
    expires: (Instant, u64),
    state: State,
}

enum State {
    InProgress { owner: OwnerToken, deadline: Instant },
    Completed(StoredResponse),
}

impl Slot {
    fn weight(&self) -> u64 {
        match &self.state {
            State::InProgress { .. } => 0,
            State::Completed(r) => r.weight() as u64,
        }
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` records and `max_bytes` of responses.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        Self { inner: Mutex::new(Inner::default()), waiters: Arc::default(), max_entries, max_bytes }
    }

    /// Holds the lock for one transition; the map stays consistent even if a holder panicked,
    /// since every transition writes its slot in one assignment.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.purge_expired(Instant::now());
        inner
    }
}

impl Inner {
    fn purge_expired(&mut self, now: Instant) {
        while let Some(entry) = self.expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &RecordKey) -> Option<Slot> {
        let slot = self.entries.remove(key)?;
        self.expiry.remove(&slot.expires);
        self.bytes -= slot.weight();
        Some(slot)
    }

    fn expiry_id(&mut self, key: &RecordKey, at: Instant) -> (Instant, u64) {
        self.next_id += 1;
        let id = (at, self.next_id);
        self.expiry.insert(id, key.clone());
        id
    }

    fn set_expiry(&mut self, key: &RecordKey, at: Instant) {
        let id = self.expiry_id(key, at);
        if let Some(slot) = self.entries.get_mut(key) {
            let old = std::mem::replace(&mut slot.expires, id);
            self.expiry.remove(&old);
        }
    }

    /// Evicts completed records, soonest to expire first, until `fits` holds. Returns whether
    /// it holds in the end.
    fn evict_until(&mut self, keep: Option<&RecordKey>, fits: impl Fn(&Self) -> bool) -> bool {
        while !fits(self) {
            let victim = self
                .expiry
                .values()
                .find(|k| {
                    Some(*k) != keep && matches!(self.entries.get(*k), Some(Slot { state: State::Completed(_), .. }))
                })
                .cloned();
            match victim {
                Some(k) => {
                    self.remove(&k);
                }
                None => return false,
            }
        }
        true
    }
}

impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        // An open claim never expires before its lease does (as in Redis).
        let ttl = ttl.max(lease);
        let mut inner = self.lock();
        let owner = OwnerToken::generate();
        let attempt = match inner.entries.get_mut(key) {
            Some(slot) if slot.fingerprint != *fingerprint => return Ok(Claim::Mismatch),
            Some(Slot { state: State::Completed(response), .. }) => return Ok(Claim::Completed(response.clone())),
            Some(Slot { state: State::InProgress { deadline, .. }, .. }) if *deadline > now => {
                return Ok(Claim::InFlight { lease_left: *deadline - now });
            }
            Some(slot) => {
                // The lease passed: the owner died or stalled. Take the claim over.
                slot.attempt += 1;
                slot.state = State::InProgress { owner, deadline: now + lease };
                slot.attempt
            }
            None => {
                let max_entries = self.max_entries;
                if !inner.evict_until(None, |i| i.entries.len() < max_entries) {
                    return Err(StoreError::Full);
                }
                let expires = inner.expiry_id(key, now + ttl);
                let state = State::InProgress { owner, deadline: now + lease };
                inner.entries.insert(key.clone(), Slot { fingerprint: *fingerprint, attempt: 1, expires, state });
                1
            }
        };
        if attempt > 1 {
            inner.set_expiry(key, now + ttl);
        }
        Ok(Claim::Acquired(Lease::new(key.clone(), owner, attempt, lease, ttl)))
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(slot) = inner.entries.get_mut(&lease.key) else {
            return Ok(Renewal::Lost);
        };
        let State::InProgress { owner, deadline } = &mut slot.state else {
            return Ok(Renewal::Lost);
        };
        if *owner != lease.owner {
            return Ok(Renewal::Lost);
        }
        *deadline = now + lease.duration;
        if slot.expires.0 < *deadline {
            inner.set_expiry(&lease.key, now + lease.ttl.max(lease.duration));
        }
        Ok(Renewal::Renewed)
    }

    async fn complete(
        &self,
        lease: Lease,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Settled, StoreError> {
        let now = Instant::now();
        let stored = response.compact();
        {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(&lease.key) else {
                return Ok(Settled::Lost);
            };
            if !matches!(slot.state, State::InProgress { owner, .. } if owner == lease.owner) {
                return Ok(Settled::Lost);
            }
            let weight = stored.weight() as u64;
            slot.state = State::Completed(stored);
            inner.bytes += weight;
            inner.set_expiry(&lease.key, now + retention);
            let max_bytes = self.max_bytes;
            inner.evict_until(Some(&lease.key), |i| i.bytes <= max_bytes);
        }
        self.waiters.notify(lease.key.as_str());
        Ok(Settled::Done)
    }

    async fn release(&self, lease: Lease) -> Result<Settled, StoreError> {
        {
            let mut inner = self.lock();
            let owned = matches!(
                inner.entries.get(&lease.key),
                Some(Slot { state: State::InProgress { owner, .. }, .. }) if *owner == lease.owner
            );
            if !owned {
                return Ok(Settled::Lost);
            }
            inner.remove(&lease.key);
        }
        self.waiters.notify(lease.key.as_str());
        Ok(Settled::Done)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Entry>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        Ok(inner.entries.get(key).map(|slot| {
            let expires_in = slot.expires.0.saturating_duration_since(now);
            match &slot.state {
                State::InProgress { deadline, .. } => Entry::InProgress {
                    attempt: slot.attempt,
                    lease_left: deadline.saturating_duration_since(now),
                    expires_in,
                },
                State::Completed(r) => Entry::Completed {
                    attempt: slot.attempt,
                    status: r.status.as_u16(),
                    body_len: r.body.len(),
                    expires_in,
                },
            }
        }))
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let removed = self.lock().remove(key).is_some();
        Ok(removed)
    }

    fn watch(&self, key: &RecordKey) -> Watch {
        // Notifications are delivered in-process and cannot be lost: no polling needed.
        self.waiters.watch(key.as_str(), None)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    fn key(n: u32) -> RecordKey {
        RecordKey(format!("t:r:{n}"))
    }

    fn response(len: usize) -> StoredResponse {
        StoredResponse { status: StatusCode::OK, headers: HeaderMap::new(), body: Bytes::from(vec![b'x'; len]) }
    }

    const FP: Fingerprint = Fingerprint::from_bytes([1; 32]);
    const LEASE: Duration = Duration::from_secs(10);
    const TTL: Duration = Duration::from_secs(3600);

    async fn complete(store: &MemoryStore, n: u32, len: usize) {
        let Claim::Acquired(lease) = store.claim(&key(n), &FP, LEASE, TTL).await.unwrap() else {
            panic!("not acquired")
        };
        assert_eq!(store.complete(lease, &response(len), TTL).await.unwrap(), Settled::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn entry_bound_evicts_completed_records_oldest_first() {
        let store = MemoryStore::new(2, u64::MAX);
        complete(&store, 1, 1).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        complete(&store, 2, 1).await;
        complete(&store, 3, 1).await;
        assert!(store.get(&key(1)).await.unwrap().is_none(), "oldest evicted");
        assert!(store.get(&key(2)).await.unwrap().is_some());
        assert!(store.get(&key(3)).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn open_claims_are_never_evicted_and_a_full_store_says_so() {
        let store = MemoryStore::new(1, u64::MAX);
        let _held = store.claim(&key(1), &FP, LEASE, TTL).await.unwrap();
        assert!(matches!(store.claim(&key(2), &FP, LEASE, TTL).await, Err(StoreError::Full)));
    }

    #[tokio::test(start_paused = true)]
    async fn byte_bound_evicts_other_records() {
        let store = MemoryStore::new(100, 250);
        complete(&store, 1, 100).await;
        complete(&store, 2, 100).await;
        complete(&store, 3, 100).await;
        assert!(store.get(&key(1)).await.unwrap().is_none());
        assert!(store.get(&key(3)).await.unwrap().is_some());
        assert!(store.lock().bytes <= 250);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_claim_outlives_a_ttl_shorter_than_its_lease() {
        let store = MemoryStore::new(100, u64::MAX);
        let _held = store.claim(&key(1), &FP, Duration::from_millis(400), Duration::from_millis(100)).await.unwrap();
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(matches!(store.claim(&key(1), &FP, LEASE, TTL).await.unwrap(), Claim::InFlight { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_free_their_bytes() {
        let store = MemoryStore::new(100, u64::MAX);
        complete(&store, 1, 100).await;
        tokio::time::advance(TTL + Duration::from_secs(1)).await;
        let inner = store.lock();
        assert_eq!((inner.entries.len(), inner.expiry.len(), inner.bytes), (0, 0, 0));
    }
}
