//! The embedded store: one process, same semantics as Redis.
//!
//! For a single instance and for development. Leases, takeover and retention behave exactly as
//! in Redis (the conformance suite runs against both). Time is tokio's clock, so tests can
//! advance it. Memory is bounded: past `max_entries` or `max_bytes`, the stored response (or,
//! for the entry bound, release tombstone) closest to its expiry is evicted first (a retry of
//! it would run again, and the upstream's constraint catches that). Open claims and unknown
//! outcomes are never evicted, since evicting either would let a retry run a request that may
//! be running or may have run; a store full of them refuses new claims with
//! [`StoreError::Full`], which the route's `on_store_error` policy answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::fingerprint::Fingerprint;
use crate::store::entry::EntryState;
use crate::store::error::{Result, StoreError};
use crate::store::index::{IndexEntry, IndexKey};
use crate::store::lifecycle::{Claim, Final, Granted, Lease, Renewal, Sent, Settled, Terms};
use crate::store::lookups::{Lookup, LookupEnd, LookupEnded};
use crate::store::names::{OwnerToken, QuotaKey, RecordKey};
use crate::store::record::StoredResponse;
use crate::store::roles::{Lifecycle, Lookups, Quota};
use crate::store::state::State;
use crate::store::waiters::{Waiters, Watch};

/// The in-process store.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// New-key budgets: count and end of the current window.
    quotas: Mutex<HashMap<QuotaKey, (u64, Instant)>>,
    /// The indexes of records that need an operator, as Redis keeps them (see `index`).
    pub(super) indexes: Mutex<HashMap<IndexKey, RouteIndex>>,
    /// The audit trail, oldest first (see `audit`).
    pub(super) audit: Mutex<std::collections::VecDeque<crate::store::audit::AuditEntry>>,
    pub(super) waiters: Arc<Waiters>,
    max_entries: usize,
    max_bytes: u64,
}

/// One route's index: entries by (expiry score, record name), and each record's place.
#[derive(Default)]
pub(super) struct RouteIndex {
    pub(super) order: BTreeMap<(State, u64, String), IndexEntry>,
    pub(super) place: HashMap<String, (State, u64)>,
}

impl RouteIndex {
    pub(super) fn remove(&mut self, record: &str) {
        if let Some((held, score)) = self.place.remove(record) {
            self.order.remove(&(held, score, record.to_owned()));
        }
    }
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) entries: HashMap<RecordKey, Slot>,
    /// Expiry order of all entries; the u64 makes equal instants distinct.
    pub(super) expiry: BTreeMap<(Instant, u64), RecordKey>,
    pub(super) next_id: u64,
    pub(super) bytes: u64,
}

pub(super) struct Slot {
    pub(super) fingerprint: Fingerprint,
    pub(super) attempt: u32,
    pub(super) expires: (Instant, u64),
    pub(super) data: Data,
    /// The owner whose settle wrote a completed, executed or unknown state (`None` when a
    /// lookup or an operator did): a settle sent again by that owner is answered `Done`.
    pub(super) settled_by: Option<OwnerToken>,
}

/// What a record holds, by its state.
pub(super) enum Data {
    InProgress {
        owner: OwnerToken,
        deadline: Instant,
    },
    Completed(StoredResponse),
    /// Ran; only the status and headers are kept.
    Executed(StoredResponse),
    Unknown(Unknown),
    /// A tombstone keeping the attempt count; any request may claim it.
    Released,
}

/// What an unknown record keeps: when a lookup's "not found" can be trusted, and the lookup
/// that may be running.
pub(super) struct Unknown {
    pub(super) trusted_at: Instant,
    pub(super) lookup: Option<(OwnerToken, Instant)>,
}

impl Slot {
    /// The record's state as the admin API shows it, at `now`.
    pub(super) fn entry_state(&self, now: Instant) -> EntryState {
        match &self.data {
            Data::InProgress { deadline, .. } => {
                EntryState::InProgress { lease_left: deadline.saturating_duration_since(now) }
            }
            Data::Completed(r) => EntryState::Completed { status: r.status.as_u16(), body_len: r.body.len() },
            Data::Executed(r) => EntryState::Executed { status: r.status.as_u16() },
            Data::Unknown(u) => EntryState::Unknown {
                lookup: u.lookup.filter(|(_, end)| *end > now).map(|(_, end)| end - now),
                trusted_in: Some(u.trusted_at.saturating_duration_since(now)),
            },
            Data::Released => EntryState::Released,
        }
    }

    pub(super) fn weight(&self) -> u64 {
        match &self.data {
            Data::Completed(r) | Data::Executed(r) => r.weight() as u64,
            Data::InProgress { .. } | Data::Unknown(_) | Data::Released => 0,
        }
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` records and `max_bytes` of responses.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            quotas: Mutex::default(),
            indexes: Mutex::default(),
            audit: Mutex::default(),
            waiters: Arc::default(),
            max_entries,
            max_bytes,
        }
    }

    /// Holds the lock for one transition; the map stays consistent even if a holder panicked,
    /// since every transition writes its slot in one assignment.
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.purge_expired(Instant::now());
        inner
    }
}

impl Inner {
    pub(super) fn purge_expired(&mut self, now: Instant) {
        while let Some(entry) = self.expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.remove(&key);
        }
    }

    pub(super) fn remove(&mut self, key: &RecordKey) -> Option<Slot> {
        let slot = self.entries.remove(key)?;
        self.expiry.remove(&slot.expires);
        self.bytes -= slot.weight();
        Some(slot)
    }

    pub(super) fn expiry_id(&mut self, key: &RecordKey, at: Instant) -> (Instant, u64) {
        self.next_id += 1;
        let id = (at, self.next_id);
        self.expiry.insert(id, key.clone());
        id
    }

    pub(super) fn set_expiry(&mut self, key: &RecordKey, at: Instant) {
        let id = self.expiry_id(key, at);
        if let Some(slot) = self.entries.get_mut(key) {
            let old = std::mem::replace(&mut slot.expires, id);
            self.expiry.remove(&old);
        }
    }

    /// Evicts records nearest their expiry, of the kinds `evictable` allows, until `fits`
    /// holds; returns whether it holds in the end.
    pub(super) fn evict_until(
        &mut self,
        keep: Option<&RecordKey>,
        evictable: impl Fn(&Slot) -> bool,
        fits: impl Fn(&Self) -> bool,
    ) -> bool {
        while !fits(self) {
            let victim = self
                .expiry
                .values()
                .find(|k| Some(*k) != keep && self.entries.get(*k).is_some_and(&evictable))
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

impl Lifecycle for MemoryStore {
    async fn claim(&self, key: &RecordKey, fp: &Fingerprint, owner: OwnerToken, terms: Terms) -> Result<Claim> {
        let Terms { lease, ttl } = terms;
        let now = Instant::now();
        let ttl = ttl.max(lease);
        let mut inner = self.lock();
        let claimed = Data::InProgress { owner, deadline: now + lease };
        let attempt = match inner.entries.get_mut(key) {
            Some(slot) if matches!(slot.data, Data::Released) => {
                slot.attempt += 1;
                slot.fingerprint = *fp;
                slot.data = claimed;
                slot.attempt
            }
            Some(slot) if slot.fingerprint != *fp => return Ok(Claim::Mismatch),
            Some(Slot { data: Data::Completed(response), .. }) => return Ok(Claim::Completed(response.clone())),
            Some(Slot { data: Data::Executed(response), .. }) => return Ok(Claim::Executed(response.clone())),
            Some(Slot { data: Data::Unknown(_), attempt, .. }) => return Ok(Claim::Unknown { attempt: *attempt }),
            Some(Slot { data: Data::InProgress { deadline, .. }, .. }) if *deadline > now => {
                return Ok(Claim::InFlight { lease_left: *deadline - now });
            }
            Some(slot) => {
                slot.attempt += 1;
                slot.data = claimed;
                slot.attempt
            }
            None => {
                let max_entries = self.max_entries;
                let stored_or_released =
                    |slot: &Slot| matches!(slot.data, Data::Completed(_) | Data::Executed(_) | Data::Released);
                if !inner.evict_until(None, stored_or_released, |i| i.entries.len() < max_entries) {
                    return Err(StoreError::Full);
                }
                let expires = inner.expiry_id(key, now + ttl);
                let slot = Slot { fingerprint: *fp, attempt: 1, expires, data: claimed, settled_by: None };
                inner.entries.insert(key.clone(), slot);
                1
            }
        };
        if attempt > 1 {
            inner.set_expiry(key, now + ttl);
        }
        Ok(Claim::Acquired(Granted::new(Lease::new(key.clone(), owner, Terms { lease, ttl }, now), attempt)))
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(slot) = inner.entries.get_mut(&lease.key) else {
            return Ok(Renewal::Lost);
        };
        let Data::InProgress { owner, deadline } = &mut slot.data else {
            return Ok(Renewal::Lost);
        };
        if *owner != lease.owner {
            return Ok(Renewal::Lost);
        }
        *deadline = now + lease.terms.lease;
        if slot.expires.0 < *deadline {
            inner.set_expiry(&lease.key, now + lease.terms.ttl.max(lease.terms.lease));
        }
        Ok(Renewal::Renewed)
    }

    async fn settle(&self, lease: &Lease, outcome: Final<'_>, retention: Duration) -> Result<Settled> {
        let now = Instant::now();
        let data = match outcome {
            Final::Response(r) => Data::Completed(r.compact()),
            Final::Executed(r) => Data::Executed(r.compact()),
            Final::Unknown { trusted_in } => Data::Unknown(Unknown { trusted_at: now + trusted_in, lookup: None }),
        };
        {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(&lease.key) else {
                return Ok(Settled::Lost);
            };
            if !matches!(slot.data, Data::InProgress { owner, .. } if owner == lease.owner) {
                // Settled already by this owner with this outcome: an earlier try landed. Its
                // retention starts again, as Redis's does (where the repeat must be a write).
                let same = slot.entry_state(now).state() == outcome.state();
                if !(same && slot.settled_by == Some(lease.owner)) {
                    return Ok(Settled::Lost);
                }
                inner.set_expiry(&lease.key, now + retention);
                return Ok(Settled::Done);
            }
            slot.data = data;
            slot.settled_by = Some(lease.owner);
            let weight = slot.weight();
            inner.bytes += weight;
            inner.set_expiry(&lease.key, now + retention);
            let max_bytes = self.max_bytes;
            // Only records that hold bytes free any.
            inner.evict_until(Some(&lease.key), |slot| slot.weight() > 0, |i| i.bytes <= max_bytes);
        }
        self.waiters.notify(lease.key.as_str());
        Ok(Settled::Done)
    }

    async fn release(&self, key: &RecordKey, owner: OwnerToken, sent: Sent, ttl: Duration) -> Result<Settled> {
        let now = Instant::now();
        {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(key) else {
                return Ok(Settled::Lost);
            };
            if !matches!(slot.data, Data::InProgress { owner: o, .. } if o == owner) {
                return Ok(Settled::Lost);
            }
            if sent == Sent::No {
                slot.attempt -= 1;
            }
            if slot.attempt == 0 {
                inner.remove(key);
            } else {
                slot.data = Data::Released;
                inner.set_expiry(key, now + ttl);
            }
        }
        self.waiters.notify(key.as_str());
        Ok(Settled::Done)
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    fn watch(&self, key: &RecordKey) -> Watch {
        self.waiters.watch(key.as_str(), None)
    }
}

impl Lookups for MemoryStore {
    async fn lookup(&self, key: &RecordKey, fp: &Fingerprint, token: OwnerToken, lease: Duration) -> Result<Lookup> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(slot) = inner.entries.get_mut(key).filter(|s| s.fingerprint == *fp) else {
            return Ok(Lookup::Moved);
        };
        let Data::Unknown(unknown) = &mut slot.data else { return Ok(Lookup::Moved) };
        if let Some((_, end)) = unknown.lookup.filter(|(_, end)| *end > now) {
            return Ok(Lookup::Busy { left: end - now });
        }
        unknown.lookup = Some((token, now + lease));
        Ok(Lookup::Started { attempt: slot.attempt })
    }

    async fn end_lookup(&self, key: &RecordKey, token: OwnerToken, end: LookupEnd<'_>) -> Result<LookupEnded> {
        let now = Instant::now();
        let ended = {
            let mut inner = self.lock();
            let Some(slot) = inner.entries.get_mut(key) else { return Ok(LookupEnded::Lost) };
            let Data::Unknown(unknown) = &mut slot.data else { return Ok(LookupEnded::Lost) };
            if !unknown.lookup.is_some_and(|(t, _)| t == token) {
                return Ok(LookupEnded::Lost);
            }
            unknown.lookup = None;
            match end {
                LookupEnd::Failed => LookupEnded::Done,
                LookupEnd::NotFound { .. } if unknown.trusted_at > now => {
                    LookupEnded::TooEarly { left: unknown.trusted_at - now }
                }
                LookupEnd::NotFound { ttl } => {
                    slot.data = Data::Released;
                    inner.set_expiry(key, now + ttl);
                    LookupEnded::Done
                }
                LookupEnd::Found { response, retention } => {
                    slot.data = Data::Completed(response.compact());
                    slot.settled_by = None;
                    let weight = slot.weight();
                    inner.bytes += weight;
                    inner.set_expiry(key, now + retention);
                    LookupEnded::Done
                }
            }
        };
        self.waiters.notify(key.as_str());
        Ok(ended)
    }
}

impl Quota for MemoryStore {
    async fn count_new_key(&self, key: &QuotaKey, window: Duration) -> Result<(u64, Duration)> {
        let now = Instant::now();
        let mut quotas = self.quotas.lock().unwrap_or_else(PoisonError::into_inner);
        // Ended windows go, so that the map holds only live budgets.
        quotas.retain(|_, (_, end)| *end > now);
        let (count, end) = quotas.entry(key.clone()).or_insert((0, now + window));
        *count += 1;
        Ok((*count, end.saturating_duration_since(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::roles::Records;
    use http::{HeaderMap, StatusCode};

    fn key(n: u32) -> RecordKey {
        RecordKey(format!("t:r:{n}"))
    }

    fn response(len: usize) -> StoredResponse {
        StoredResponse { status: StatusCode::OK, headers: HeaderMap::new(), body: vec![b'x'; len].into() }
    }

    const FP: Fingerprint = Fingerprint::from_bytes([1; 32]);
    const LEASE: Duration = Duration::from_secs(10);
    const TTL: Duration = Duration::from_secs(3600);

    async fn claim(store: &MemoryStore, n: u32, lease: Duration, ttl: Duration) -> Result<Claim> {
        store.claim(&key(n), &FP, OwnerToken::generate(), Terms { lease, ttl }).await
    }

    async fn complete(store: &MemoryStore, n: u32, len: usize) {
        let Claim::Acquired(lease) = claim(store, n, LEASE, TTL).await.unwrap() else { panic!("not acquired") };
        assert_eq!(store.settle(&lease, Final::Response(&response(len)), TTL).await.unwrap(), Settled::Done);
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
        let _held = claim(&store, 1, LEASE, TTL).await.unwrap();
        assert!(matches!(claim(&store, 2, LEASE, TTL).await, Err(StoreError::Full)));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_outcomes_are_never_evicted() {
        let store = MemoryStore::new(1, u64::MAX);
        let Claim::Acquired(lease) = claim(&store, 1, LEASE, TTL).await.unwrap() else { panic!("not acquired") };
        store.settle(&lease, Final::Unknown { trusted_in: Duration::ZERO }, TTL).await.unwrap();
        assert!(matches!(claim(&store, 2, LEASE, TTL).await, Err(StoreError::Full)));
        assert!(matches!(claim(&store, 1, LEASE, TTL).await.unwrap(), Claim::Unknown { attempt: 1 }));
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
        let _held = claim(&store, 1, Duration::from_millis(400), Duration::from_millis(100)).await.unwrap();
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(matches!(claim(&store, 1, LEASE, TTL).await.unwrap(), Claim::InFlight { .. }));
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
