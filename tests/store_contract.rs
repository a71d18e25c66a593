//! One conformance suite for every store backend.
//!
//! Each scenario is written once against the `Store` trait and instantiated for the memory
//! store and for Redis in each topology: one private `redis-server`, a local Sentinel set
//! (primary, replica, three Sentinels) and a local 3-primary Redis Cluster. Time-dependent
//! scenarios use short real durations because Redis keeps its own clock.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::policy::fingerprint::Fingerprint;
use idemgate::policy::scope::{self, MissingScope, ScopeSource};
use idemgate::store::{
    Backend, Claim, Cursor, EntryState, Final, Granted, Index, IndexEntry, IndexKey, Lifecycle, Lookup, LookupEnd,
    LookupEnded, Lookups, MemoryStore, Operator, OwnerToken, Purged, Quota, QuotaKey, RecordKey, Records, RedisStore,
    Renewal, Resolved, Sent, Settled, State, StoredResponse, Terms,
};
use support::cluster::RedisCluster;
use support::redis::RedisServer;
use support::sentinel::SentinelSet;

const LEASE: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(60);

fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn record(prefix: &str, name: &str) -> RecordKey {
    support::record_key(prefix, name)
}

fn response(body: &'static [u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("1"));
    headers.append("x-multi", HeaderValue::from_static("2"));
    StoredResponse { status: StatusCode::CREATED, headers, body: Bytes::from_static(body).into() }
}

async fn acquire(store: &Backend, key: &RecordKey, fingerprint: Fingerprint, lease: Duration) -> Granted {
    match store.claim(key, &fingerprint, OwnerToken::generate(), Terms { lease, ttl: TTL }).await.unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn claim(store: &Backend, key: &RecordKey, fingerprint: Fingerprint) -> Claim {
    store.claim(key, &fingerprint, OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL }).await.unwrap()
}

async fn complete(store: &Backend, lease: Granted, response: &StoredResponse, retention: Duration) -> Settled {
    store.settle(&lease, Final::Response(response), retention).await.unwrap()
}

async fn release(store: &Backend, lease: Granted, sent: Sent) -> Settled {
    let (key, owner, ttl) = lease.into_lease().into_release();
    store.release(&key, owner, sent, ttl).await.unwrap()
}

/// A claim whose short lease passed, and the claim that took it over.
async fn taken_over(store: &Backend, key: &RecordKey) -> (Granted, Granted) {
    let stale = acquire(store, key, fp(1), Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    (stale, acquire(store, key, fp(1), LEASE).await)
}

// ---- scenarios -------------------------------------------------------------------------

async fn absent_key_is_acquired_as_attempt_one(store: Backend, p: String) {
    let lease = acquire(&store, &record(&p, "a"), fp(1), LEASE).await;
    assert_eq!(lease.attempt(), 1);
}

async fn live_claim_reports_in_flight_with_lease_left(store: Backend, p: String) {
    let k = record(&p, "a");
    let _lease = acquire(&store, &k, fp(1), LEASE).await;
    match claim(&store, &k, fp(1)).await {
        Claim::InFlight { lease_left } => assert!(lease_left <= LEASE && lease_left > Duration::ZERO, "{lease_left:?}"),
        other => panic!("expected InFlight, got {other:?}"),
    }
}

async fn different_fingerprint_is_mismatch_while_in_flight_and_after(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert!(matches!(claim(&store, &k, fp(2)).await, Claim::Mismatch));
    assert_eq!(complete(&store, lease, &response(b"{}"), RETENTION).await, Settled::Done);
    assert!(matches!(claim(&store, &k, fp(2)).await, Claim::Mismatch));
}

async fn completed_response_is_replayed_exactly(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    let body: &'static [u8] = b"{\"order_id\":7}\x00\xff\r\n binary";
    assert_eq!(complete(&store, lease, &response(body), RETENTION).await, Settled::Done);
    for _ in 0..2 {
        match claim(&store, &k, fp(1)).await {
            Claim::Completed(r) => assert_eq!(r, response(body)),
            other => panic!("expected Completed, got {other:?}"),
        }
    }
}

/// A response past the size the Redis store settles through a side key (16 KiB).
fn large_response(fill: u8) -> StoredResponse {
    let mut body = vec![fill; 200 * 1024];
    body[..10].copy_from_slice(b"\x00\xff\r\n large");
    StoredResponse { body: Bytes::from(body).into(), ..response(b"") }
}

async fn a_large_response_is_kept_whole_and_only_by_its_owner(store: Backend, p: String) {
    let k = record(&p, "a");
    let (stale, fresh) = taken_over(&store, &k).await;
    assert_eq!(complete(&store, stale, &large_response(b's'), RETENTION).await, Settled::Lost);
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }), "the fresh claim still holds");
    let retention = RETENTION * 2;
    assert_eq!(complete(&store, fresh, &large_response(b'f'), retention).await, Settled::Done);
    for _ in 0..2 {
        match claim(&store, &k, fp(1)).await {
            Claim::Completed(r) => assert!(r == large_response(b'f'), "the fresh owner's response, byte for byte"),
            other => panic!("expected Completed, got {other:?}"),
        }
    }
    assert!(matches!(claim(&store, &k, fp(2)).await, Claim::Mismatch));
    let entry = store.get(&k).await.unwrap().unwrap();
    assert_eq!(entry.attempt, 2);
    assert!(
        matches!(entry.state, EntryState::Completed { status: 201, body_len } if body_len == 200 * 1024),
        "{:?}",
        entry.state
    );
    assert!(entry.expires_in > TTL && entry.expires_in <= retention, "kept for its retention: {:?}", entry.expires_in);
}

async fn release_keeps_the_attempt_and_lets_any_request_run(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert_eq!(release(&store, lease, Sent::Maybe).await, Settled::Done);
    let entry = store.get(&k).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.attempt), (EntryState::Released, 1));
    let again = acquire(&store, &k, fp(2), LEASE).await;
    assert_eq!(again.attempt(), 2, "a released key runs again, even with another fingerprint, as the next attempt");
    // An attempt that never reached the upstream gives its number back.
    assert_eq!(release(&store, again, Sent::No).await, Settled::Done);
    assert_eq!(acquire(&store, &k, fp(1), LEASE).await.attempt(), 2);
}

async fn a_first_attempt_released_unsent_leaves_nothing(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert_eq!(release(&store, lease, Sent::No).await, Settled::Done);
    assert_eq!(store.get(&k).await.unwrap(), None);
    assert_eq!(acquire(&store, &k, fp(2), LEASE).await.attempt(), 1);
}

async fn an_unknown_outcome_refuses_retries_until_purged(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert_eq!(
        store.settle(&lease, Final::Unknown { trusted_in: Duration::ZERO }, RETENTION).await.unwrap(),
        Settled::Done
    );
    for _ in 0..2 {
        assert!(matches!(claim(&store, &k, fp(1)).await, Claim::Unknown { attempt: 1 }));
    }
    assert!(matches!(claim(&store, &k, fp(2)).await, Claim::Mismatch), "422 is still checked first");
    assert_eq!(store.purge(&k, false).await.unwrap(), Purged::Released { was: State::Unknown });
    assert_eq!(acquire(&store, &k, fp(1), LEASE).await.attempt(), 2, "after reconciling, the next attempt");
}

async fn an_executed_record_answers_with_its_head(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    let head = response(b"");
    assert_eq!(store.settle(&lease, Final::Executed(&head), RETENTION).await.unwrap(), Settled::Done);
    match claim(&store, &k, fp(1)).await {
        Claim::Executed(r) => assert_eq!(r, head),
        other => panic!("expected Executed, got {other:?}"),
    }
    assert_eq!(store.get(&k).await.unwrap().unwrap().state, EntryState::Executed { status: 201 });
}

async fn a_claim_whose_reply_was_lost_is_released_by_its_owner(store: Backend, p: String) {
    // The gateway made the owner token before the call; the reply never reached it.
    let k = record(&p, "a");
    let owner = OwnerToken::generate();
    assert!(matches!(
        store.claim(&k, &fp(1), owner, Terms { lease: LEASE, ttl: TTL }).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(store.release(&k, owner, Sent::No, TTL).await.unwrap(), Settled::Done);
    assert_eq!(acquire(&store, &k, fp(1), LEASE).await.attempt(), 1, "the retry runs at once, as attempt 1");
    // Another owner's token releases nothing.
    assert_eq!(store.release(&k, OwnerToken::generate(), Sent::No, TTL).await.unwrap(), Settled::Lost);
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }));
}

async fn expired_lease_is_taken_over_and_the_stale_owner_is_locked_out(store: Backend, p: String) {
    let k = record(&p, "a");
    let (stale, fresh) = taken_over(&store, &k).await;
    assert_eq!(fresh.attempt(), 2);
    // The stale owner can no longer touch the record.
    assert_eq!(store.renew(&stale).await.unwrap(), Renewal::Lost);
    assert_eq!(complete(&store, stale, &response(b"stale"), RETENTION).await, Settled::Lost);
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }), "the fresh claim still holds");
    assert_eq!(complete(&store, fresh, &response(b"fresh"), RETENTION).await, Settled::Done);
    match claim(&store, &k, fp(1)).await {
        Claim::Completed(r) => assert_eq!(r.body, Bytes::from_static(b"fresh").into()),
        other => panic!("expected Completed, got {other:?}"),
    }
}

async fn stale_owner_cannot_release_the_new_claim(store: Backend, p: String) {
    let k = record(&p, "a");
    let (stale, _fresh) = taken_over(&store, &k).await;
    assert_eq!(release(&store, stale, Sent::Maybe).await, Settled::Lost);
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }));
}

async fn renewal_keeps_a_claim_past_its_original_lease(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), Duration::from_millis(300)).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.renew(&lease).await.unwrap(), Renewal::Renewed);
    }
    // 450ms after the claim, well past the 300ms lease: still held thanks to renewal.
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }));
}

async fn retention_expires_completed_records(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    complete(&store, lease, &response(b"{}"), Duration::from_millis(150)).await;
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::Completed(_)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.get(&k).await.unwrap(), None);
    assert_eq!(acquire(&store, &k, fp(2), LEASE).await.attempt(), 1);
}

async fn open_claims_expire_with_their_ttl(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = store
        .claim(
            &k,
            &fp(1),
            OwnerToken::generate(),
            Terms { lease: Duration::from_millis(100), ttl: Duration::from_millis(200) },
        )
        .await
        .unwrap();
    assert!(matches!(lease, Claim::Acquired(_)));
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(store.get(&k).await.unwrap(), None, "a crashed claim does not block the key forever");
}

async fn get_describes_records_and_purge_releases_them(store: Backend, p: String) {
    let k = record(&p, "a");
    assert_eq!(store.get(&k).await.unwrap(), None);
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    let entry = store.get(&k).await.unwrap().unwrap();
    match entry.state {
        EntryState::InProgress { lease_left } => assert!(lease_left > Duration::ZERO && lease_left <= LEASE),
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert!(entry.attempt == 1 && entry.expires_in > LEASE, "{entry:?}");
    complete(&store, lease, &response(b"12345"), RETENTION).await;
    let entry = store.get(&k).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Completed { status: 201, body_len: 5 });
    assert!(entry.attempt == 1 && entry.expires_in <= RETENTION);
    assert_eq!(store.purge(&k, false).await.unwrap(), Purged::Released { was: State::Completed });
    assert_eq!(store.purge(&k, false).await.unwrap(), Purged::Nothing);
    let entry = store.get(&k).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.attempt), (EntryState::Released, 1));
}

async fn purged_claim_cannot_be_completed(store: Backend, p: String) {
    let k = record(&p, "a");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert_eq!(store.purge(&k, true).await.unwrap(), Purged::Released { was: State::InProgress });
    assert_eq!(store.renew(&lease).await.unwrap(), Renewal::Lost);
    assert_eq!(complete(&store, lease, &response(b"{}"), RETENTION).await, Settled::Lost);
    assert_eq!(store.get(&k).await.unwrap().unwrap().state, EntryState::Released);
}

/// A settle's reply may be lost after the store applied it, so its owner sends it again: the
/// store answers `Done` for a record this owner settled with this outcome (also an unknown
/// record a lookup has started on), and `Lost` for anybody else's: a takeover is never taken
/// for a try that landed.
async fn a_settle_sent_again_by_its_owner_is_done_and_a_takeover_is_lost(store: Backend, p: String) {
    let answer = response(b"{\"order_id\":1}");
    let k = record(&p, "again");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    assert_eq!(store.settle(&lease, Final::Response(&answer), RETENTION).await.unwrap(), Settled::Done);
    assert_eq!(store.settle(&lease, Final::Response(&answer), RETENTION).await.unwrap(), Settled::Done, "again");
    assert_eq!(
        store.settle(&lease, Final::Executed(&answer), RETENTION).await.unwrap(),
        Settled::Lost,
        "another outcome"
    );
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::Completed(_)));

    let u = record(&p, "again-unknown");
    let lease = acquire(&store, &u, fp(1), LEASE).await;
    let unknown = Final::Unknown { trusted_in: Duration::ZERO };
    assert_eq!(store.settle(&lease, unknown, RETENTION).await.unwrap(), Settled::Done);
    assert!(matches!(store.lookup(&u, &fp(1), OwnerToken::generate(), LOOKUP).await.unwrap(), Lookup::Started { .. }));
    assert_eq!(store.settle(&lease, unknown, RETENTION).await.unwrap(), Settled::Done, "with a lookup running");

    // Purged and taken over: the first owner's settle finds the new owner's answer.
    let t = record(&p, "taken-over");
    let mine = acquire(&store, &t, fp(1), LEASE).await;
    assert!(matches!(store.purge(&t, true).await.unwrap(), Purged::Released { .. }));
    let theirs = acquire(&store, &t, fp(1), LEASE).await;
    assert_eq!(theirs.attempt(), 2);
    assert_eq!(store.settle(&theirs, Final::Response(&answer), RETENTION).await.unwrap(), Settled::Done);
    assert_eq!(store.settle(&mine, Final::Response(&answer), RETENTION).await.unwrap(), Settled::Lost);
    // And an operator's answer is nobody's settle.
    let r = record(&p, "resolved");
    let lease = acquire(&store, &r, fp(1), LEASE).await;
    assert_eq!(store.settle(&lease, unknown, RETENTION).await.unwrap(), Settled::Done);
    assert!(matches!(store.resolve(&r, &answer, RETENTION).await.unwrap(), Resolved::Done { .. }));
    assert_eq!(store.settle(&lease, Final::Response(&answer), RETENTION).await.unwrap(), Settled::Lost);
}

/// A claim whose lease is live is a request running upstream: an operator's purge leaves it
/// alone unless forced, in the same step that reads it. One whose lease passed is anyone's.
async fn a_running_claim_is_purged_only_by_force(store: Backend, p: String) {
    let k = record(&p, "running");
    let lease = acquire(&store, &k, fp(1), LEASE).await;
    match store.purge(&k, false).await.unwrap() {
        Purged::Refused { lease_left } => assert!(lease_left > Duration::ZERO && lease_left <= LEASE, "{lease_left:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.renew(&lease).await.unwrap(), Renewal::Renewed, "still the owner's");
    assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }), "a retry still waits for it");
    assert_eq!(store.purge(&k, true).await.unwrap(), Purged::Released { was: State::InProgress });
    assert_eq!(complete(&store, lease, &response(b"{}"), RETENTION).await, Settled::Lost);
    // A lease that has passed: released without force, as the next claim would take it over.
    let dead = record(&p, "dead");
    let _gone = acquire(&store, &dead, fp(1), Duration::from_millis(300)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.purge(&dead, false).await.unwrap(), Purged::Released { was: State::InProgress });
    assert_eq!(store.get(&dead).await.unwrap().unwrap().state, EntryState::Released);
}

async fn watch_fires_on_complete_and_release_of_its_key_only(store: Backend, p: String) {
    let far = || tokio::time::Instant::now() + Duration::from_secs(5);
    for settles in [true, false] {
        let k = record(&p, if settles { "c" } else { "r" });
        let lease = acquire(&store, &k, fp(1), Duration::from_secs(10)).await;
        // A waiter flags the record so that the Redis owner publishes on settle.
        assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }));
        let watch = store.watch(&k);
        let started = tokio::time::Instant::now();
        let waiter = tokio::spawn(async move { watch.changed(far()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        if settles {
            complete(&store, lease, &response(b"{}"), RETENTION).await;
        } else {
            release(&store, lease, Sent::Maybe).await;
        }
        waiter.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(2), "woken by the settle, not by the deadline");
    }
    // A watch on another key sleeps until its deadline (or, on Redis, its poll interval).
    let other = store.watch(&record(&p, "other"));
    let started = tokio::time::Instant::now();
    other.changed(started + Duration::from_millis(300)).await;
    assert!(started.elapsed() >= Duration::from_millis(290));
}

async fn concurrent_claims_acquire_exactly_once(store: Backend, p: String) {
    let store = std::sync::Arc::new(store);
    let k = record(&p, "a");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move {
                store.claim(&k, &fp(1), OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL }).await.unwrap()
            })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1);
}

async fn keys_are_independent(store: Backend, p: String) {
    let a = acquire(&store, &record(&p, "a"), fp(1), LEASE).await;
    let b = acquire(&store, &record(&p, "b"), fp(1), LEASE).await;
    complete(&store, a, &response(b"a"), RETENTION).await;
    assert!(matches!(claim(&store, &record(&p, "b"), fp(1)).await, Claim::InFlight { .. }));
    release(&store, b, Sent::Maybe).await;
    assert!(matches!(claim(&store, &record(&p, "a"), fp(1)).await, Claim::Completed(_)));
}

async fn new_key_budgets_count_within_their_window(store: Backend, p: String) {
    let scope = scope::derive(&ScopeSource::Global, MissingScope::Reject, &HeaderMap::new()).unwrap();
    let budget = QuotaKey::new(&p, "orders", &scope);
    let window = Duration::from_millis(300);
    let (first, left) = store.count_new_key(&budget, window).await.unwrap();
    assert_eq!(first, 1);
    assert!(left > Duration::ZERO && left <= window, "{left:?}");
    assert_eq!(store.count_new_key(&budget, window).await.unwrap().0, 2);
    let other = QuotaKey::new(&p, "payments", &scope);
    assert_eq!(store.count_new_key(&other, window).await.unwrap().0, 1, "each route has its own budget");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.count_new_key(&budget, window).await.unwrap().0, 1, "a new window starts over");
}

async fn ping_answers(store: Backend, _p: String) {
    store.ping().await.unwrap();
}

// ---- instantiation ---------------------------------------------------------------------

/// A record held as unknown, whose "not found" is trusted `trusted_in` after now.
async fn unknown(store: &Backend, key: &RecordKey, trusted_in: Duration) {
    let lease = acquire(store, key, fp(1), LEASE).await;
    assert_eq!(store.settle(&lease, Final::Unknown { trusted_in }, RETENTION).await.unwrap(), Settled::Done);
}

const LOOKUP: Duration = Duration::from_secs(5);

async fn one_lookup_at_a_time_and_found_completes_the_record(store: Backend, p: String) {
    let key = record(&p, "lookup-found");
    unknown(&store, &key, Duration::ZERO).await;
    let (mine, theirs) = (OwnerToken::generate(), OwnerToken::generate());
    assert_eq!(store.lookup(&key, &fp(1), mine, LOOKUP).await.unwrap(), Lookup::Started { attempt: 1 });
    let busy = store.lookup(&key, &fp(1), theirs, LOOKUP).await.unwrap();
    assert!(matches!(busy, Lookup::Busy { left } if left > Duration::from_secs(3)), "{busy:?}");
    // A lookup of another request under the key, or of a key that is not unknown: moved.
    assert_eq!(store.lookup(&key, &fp(2), theirs, LOOKUP).await.unwrap(), Lookup::Moved);
    assert_eq!(store.lookup(&record(&p, "absent"), &fp(1), theirs, LOOKUP).await.unwrap(), Lookup::Moved);
    match store.get(&key).await.unwrap().unwrap().state {
        EntryState::Unknown { lookup, trusted_in } => {
            assert!(
                lookup.is_some_and(|left| left > Duration::from_secs(3)),
                "the lookup shows, with its lease: {lookup:?}"
            );
            assert_eq!(trusted_in, Some(Duration::ZERO), "settled as trusted at once");
        }
        other => panic!("{other:?}"),
    }
    // Only the lookup's own token ends it; the waiter's watch fires on the end.
    let watch = store.watch(&key);
    let answer = response(b"{\"order_id\":7}");
    let found = LookupEnd::Found { response: &answer, retention: RETENTION };
    assert_eq!(store.end_lookup(&key, theirs, found).await.unwrap(), LookupEnded::Lost);
    assert_eq!(store.end_lookup(&key, mine, found).await.unwrap(), LookupEnded::Done);
    tokio::time::timeout(Duration::from_secs(3), watch.changed(tokio::time::Instant::now() + Duration::from_secs(3)))
        .await
        .unwrap();
    match claim(&store, &key, fp(1)).await {
        Claim::Completed(replayed) => assert_eq!(replayed, answer),
        other => panic!("expected the found answer, got {other:?}"),
    }
    let entry = store.get(&key).await.unwrap().unwrap();
    assert!(entry.expires_in > RETENTION - Duration::from_secs(5), "kept for its retention");
    assert_eq!(store.end_lookup(&key, mine, LookupEnd::Failed).await.unwrap(), LookupEnded::Lost, "once");
}

async fn not_found_releases_only_once_it_can_be_trusted(store: Backend, p: String) {
    let key = record(&p, "lookup-absent");
    unknown(&store, &key, Duration::from_millis(600)).await;
    let token = OwnerToken::generate();
    assert!(matches!(store.lookup(&key, &fp(1), token, LOOKUP).await.unwrap(), Lookup::Started { .. }));
    let early = store.end_lookup(&key, token, LookupEnd::NotFound { ttl: TTL }).await.unwrap();
    assert!(
        matches!(early, LookupEnded::TooEarly { left } if left > Duration::from_millis(200) && left <= Duration::from_millis(600)),
        "{early:?}"
    );
    // Still unknown, and free for the next lookup; inspection says when "not found" is proof.
    assert!(matches!(claim(&store, &key, fp(1)).await, Claim::Unknown { attempt: 1 }));
    match store.get(&key).await.unwrap().unwrap().state {
        EntryState::Unknown { lookup: None, trusted_in: Some(left) } => {
            assert!(left > Duration::from_millis(100) && left <= Duration::from_millis(600), "{left:?}")
        }
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let token = OwnerToken::generate();
    assert!(matches!(store.lookup(&key, &fp(1), token, LOOKUP).await.unwrap(), Lookup::Started { .. }));
    assert_eq!(store.end_lookup(&key, token, LookupEnd::NotFound { ttl: TTL }).await.unwrap(), LookupEnded::Done);
    // Released: the next request runs as attempt 2, whatever its body.
    assert_eq!(acquire(&store, &key, fp(3), LEASE).await.attempt(), 2);
}

async fn a_failed_lookup_frees_the_key_and_a_dead_ones_lease_passes(store: Backend, p: String) {
    let key = record(&p, "lookup-failed");
    unknown(&store, &key, Duration::ZERO).await;
    let token = OwnerToken::generate();
    assert!(matches!(store.lookup(&key, &fp(1), token, LOOKUP).await.unwrap(), Lookup::Started { .. }));
    assert_eq!(store.end_lookup(&key, token, LookupEnd::Failed).await.unwrap(), LookupEnded::Done);
    // A lookup whose gateway died: its short lease passes, and the next one starts.
    let dead = OwnerToken::generate();
    let short = Duration::from_millis(150);
    assert!(matches!(store.lookup(&key, &fp(1), dead, short).await.unwrap(), Lookup::Started { .. }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = OwnerToken::generate();
    assert!(matches!(store.lookup(&key, &fp(1), next, LOOKUP).await.unwrap(), Lookup::Started { .. }));
    assert_eq!(
        store.end_lookup(&key, dead, LookupEnd::Failed).await.unwrap(),
        LookupEnded::Lost,
        "the dead one is out"
    );
    assert!(matches!(claim(&store, &key, fp(1)).await, Claim::Unknown { attempt: 1 }));
}

async fn an_operator_resolves_unknown_and_executed_records_only(store: Backend, p: String) {
    let key = record(&p, "resolve");
    unknown(&store, &key, Duration::ZERO).await;
    // A lookup running when the operator resolves finds its record gone from unknown.
    let token = OwnerToken::generate();
    assert!(matches!(store.lookup(&key, &fp(1), token, LOOKUP).await.unwrap(), Lookup::Started { .. }));
    let answer = response(b"operator");
    assert_eq!(store.resolve(&key, &answer, RETENTION).await.unwrap(), Resolved::Done { was: State::Unknown });
    assert_eq!(store.end_lookup(&key, token, LookupEnd::NotFound { ttl: TTL }).await.unwrap(), LookupEnded::Lost);
    assert!(matches!(claim(&store, &key, fp(1)).await, Claim::Completed(r) if r == answer));
    assert_eq!(
        store.resolve(&key, &answer, RETENTION).await.unwrap(),
        Resolved::Refused { state: Some(State::Completed) },
        "a completed record is not rewritten"
    );
    assert_eq!(
        store.resolve(&record(&p, "none"), &answer, RETENTION).await.unwrap(),
        Resolved::Refused { state: None }
    );
    let executed = record(&p, "resolve-x");
    let lease = acquire(&store, &executed, fp(1), LEASE).await;
    store.settle(&lease, Final::Executed(&response(b"")), RETENTION).await.unwrap();
    assert_eq!(store.resolve(&executed, &answer, RETENTION).await.unwrap(), Resolved::Done { was: State::Executed });
    let open = record(&p, "resolve-p");
    let _lease = acquire(&store, &open, fp(1), LEASE).await;
    assert_eq!(
        store.resolve(&open, &answer, RETENTION).await.unwrap(),
        Resolved::Refused { state: Some(State::InProgress) }
    );
}

fn entry(record: &RecordKey, n: usize) -> IndexEntry {
    IndexEntry {
        record: record.as_str().to_owned(),
        key: format!("key \"{n}\" /../"),
        scope_hash: "ab".repeat(32),
        method: "POST".into(),
        path: "/orders?x=1".into(),
        since_unix_ms: 1,
    }
}

async fn the_index_pages_by_state_and_forgets(store: Backend, p: String) {
    let index = IndexKey::new(&p, "route-a");
    let other = IndexKey::new(&p, "route-b");
    let records: Vec<RecordKey> = (0..7).map(|n| record(&p, &format!("ix{n}"))).collect();
    for (n, r) in records.iter().enumerate() {
        // Two of them share one expiry, so that a page boundary falls inside a tie.
        let expires = RETENTION + Duration::from_secs(if n < 2 { 0 } else { n as u64 });
        store.index(&index, State::Unknown, &entry(r, n), expires).await.unwrap();
    }
    store.index(&index, State::Executed, &entry(&records[6], 6), RETENTION).await.unwrap();
    store.index(&other, State::Unknown, &entry(&records[0], 0), RETENTION).await.unwrap();
    assert_eq!(store.count(&index, State::Unknown).await.unwrap(), 6, "moved to executed");
    assert_eq!(store.count(&index, State::Executed).await.unwrap(), 1);
    let mut seen = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..10 {
        let page = store.list(&index, State::Unknown, cursor, 1).await.unwrap();
        seen.extend(page.entries.iter().map(|(e, _)| e.record.clone()));
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    let mut expected: Vec<String> = records[..6].iter().map(|r| r.as_str().to_owned()).collect();
    let mut got = seen.clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "every entry once, across pages of one");
    assert_eq!(seen.len(), 6);
    let page = store.list(&index, State::Unknown, None, 100).await.unwrap();
    // Oldest expiry first, each description as written.
    let first = &page.entries[0].0;
    assert!(*first == entry(&records[0], 0) || *first == entry(&records[1], 1), "{first:?}");
    assert_eq!(page.entries[5].0, entry(&records[5], 5));
    assert!(page.next.is_none());
    store.unindex(&index, &records[3]).await.unwrap();
    assert_eq!(store.count(&index, State::Unknown).await.unwrap(), 5);
    assert_eq!(store.count(&other, State::Unknown).await.unwrap(), 1, "indexes are per route");
}

macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let store = idemgate::store::Backend::new(idemgate::store::Engine::Memory(super::MemoryStore::new(10_000, 1 << 30)));
                    super::$scenario(store, super::support::unique("mem")).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let (store, prefix) = super::redis_at(super::RedisServer::shared().url()).await;
                    super::$scenario(store, prefix).await;
                }
            )*
        }
        mod sentinel {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let (store, prefix) = super::redis_at(super::sentinels().url()).await;
                    super::$scenario(store, prefix).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let (store, prefix) = super::redis_at(super::cluster().url()).await;
                    super::$scenario(store, prefix).await;
                }
            )*
        }
    };
}

contract!(
    absent_key_is_acquired_as_attempt_one,
    live_claim_reports_in_flight_with_lease_left,
    different_fingerprint_is_mismatch_while_in_flight_and_after,
    completed_response_is_replayed_exactly,
    a_large_response_is_kept_whole_and_only_by_its_owner,
    release_keeps_the_attempt_and_lets_any_request_run,
    a_first_attempt_released_unsent_leaves_nothing,
    an_unknown_outcome_refuses_retries_until_purged,
    an_executed_record_answers_with_its_head,
    a_claim_whose_reply_was_lost_is_released_by_its_owner,
    expired_lease_is_taken_over_and_the_stale_owner_is_locked_out,
    stale_owner_cannot_release_the_new_claim,
    renewal_keeps_a_claim_past_its_original_lease,
    retention_expires_completed_records,
    open_claims_expire_with_their_ttl,
    get_describes_records_and_purge_releases_them,
    purged_claim_cannot_be_completed,
    a_running_claim_is_purged_only_by_force,
    a_settle_sent_again_by_its_owner_is_done_and_a_takeover_is_lost,
    watch_fires_on_complete_and_release_of_its_key_only,
    concurrent_claims_acquire_exactly_once,
    keys_are_independent,
    new_key_budgets_count_within_their_window,
    ping_answers,
    one_lookup_at_a_time_and_found_completes_the_record,
    not_found_releases_only_once_it_can_be_trusted,
    a_failed_lookup_frees_the_key_and_a_dead_ones_lease_passes,
    an_operator_resolves_unknown_and_executed_records_only,
    the_index_pages_by_state_and_forgets,
);

/// The Sentinel set shared by this binary's tests.
fn sentinels() -> &'static SentinelSet {
    static SET: std::sync::OnceLock<SentinelSet> = std::sync::OnceLock::new();
    SET.get_or_init(|| SentinelSet::start("contract"))
}

/// The 3-primary cluster shared by this binary's tests.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

/// A Redis store at `url` under a fresh key prefix, once it answers.
async fn redis_at(url: String) -> (Backend, String) {
    let prefix = support::unique("contract");
    (ready(RedisStore::new(&url, 8, Duration::from_secs(2), &prefix).unwrap()).await, prefix)
}

/// `store` once it answers and its notification subscriber had time to connect, as it would
/// long before traffic (a Sentinel store first asks the Sentinels for the primary).
async fn ready(store: RedisStore) -> Backend {
    let store = Backend::new(idemgate::store::Engine::Redis(store));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Err(e) = store.ping().await {
        assert!(tokio::time::Instant::now() < deadline, "the store never answered: {e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
}

/// Cluster-only: a large answer settled while its slot migrates. The record is on the source,
/// which answers ASK for the side key it does not hold and TRYAGAIN for the two-key settle
/// script: the settle falls back to the one-key script, which lands on the source.
#[tokio::test]
async fn cluster_a_large_settle_during_a_slot_migration_lands_in_one_key() {
    let cluster = RedisCluster::start(3, 0);
    let (store, p) = redis_at(cluster.url()).await;
    let k = record(&p, "moving");
    let lease = acquire(&store, &k, fp(1), Duration::from_secs(10)).await;
    let slot = cluster.slot_for_key(k.as_str());
    let from = cluster.node_for_key(k.as_str());
    let to = *cluster.primary_ports().iter().find(|port| **port != from).unwrap();
    cluster.begin_migration(slot, from, to);
    assert_eq!(complete(&store, lease, &large_response(b'm'), RETENTION).await, Settled::Done);
    match claim(&store, &k, fp(1)).await {
        Claim::Completed(r) => assert_eq!(r, large_response(b'm'), "the answer is kept whole"),
        other => panic!("expected Completed, got {other:?}"),
    }
    cluster.finish_migration(slot, from, to);
    match claim(&store, &k, fp(1)).await {
        Claim::Completed(r) => assert_eq!(r, large_response(b'm'), "and moved with its slot"),
        other => panic!("expected Completed after the migration, got {other:?}"),
    }
}

/// How soon after the Sentinels name the promoted replica store calls succeed again: the
/// gateway follows their announcement within milliseconds; the rest is room for a busy machine.
const FOLLOWED_WITHIN: Duration = Duration::from_secs(5);

/// Sentinel-only: the primary killed (SIGKILL), the replica promoted. Calls succeed again
/// soon after the Sentinels name the new primary, and the stretch without one is told once in
/// the log (a warning per condition, then one line when it ends), not once per ask: that was a
/// dozen warnings per failover.
#[tokio::test]
async fn sentinel_a_killed_primary_is_followed_and_its_outage_told_once() {
    let log = FollowerLog::capture();
    let set = tokio::task::spawn_blocking(|| SentinelSet::start("killed")).await.unwrap();
    let (store, prefix) = redis_at(set.url()).await;
    let set = tokio::task::spawn_blocking(move || {
        set.kill_primary();
        set
    })
    .await
    .unwrap();
    calls_succeed_again(&store, &prefix).await;
    let lines = log.lines();
    let count = |level: &str, message: &str| lines.iter().filter(|l| l.contains(level) && l.contains(message)).count();
    let unnamed = count(" WARN ", "no Sentinel named a primary");
    let unanswering = count(" WARN ", "the named primary does not answer as one");
    assert!(unnamed <= 1 && unanswering <= 1, "a warning per condition, not per ask:\n{}", lines.join("\n"));
    assert!(unnamed + unanswering >= 1, "the outage is told:\n{}", lines.join("\n"));
    assert_eq!(count(" INFO ", "the Sentinels named a primary again"), 1, "and its end:\n{}", lines.join("\n"));
    assert_eq!(count(" WARN ", "following a Sentinel failover"), 1, "{}", lines.join("\n"));
    drop(set);
}

/// Sentinel-only: the primary hangs (SIGSTOP: its connections stay open and unanswered, as
/// with a node cut off) under a store timeout of 20 s, so that a check of it lasts that long.
/// The Sentinels' announcement of the promotion is followed at once, not after the check.
#[tokio::test]
async fn sentinel_a_hung_primary_does_not_hold_up_the_announced_promotion() {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start("hung")).await.unwrap();
    let prefix = support::unique("hung");
    let store = ready(RedisStore::new(&set.url(), 8, Duration::from_secs(20), &prefix).unwrap()).await;
    let set = tokio::task::spawn_blocking(move || {
        set.freeze_primary();
        set
    })
    .await
    .unwrap();
    calls_succeed_again(&store, &prefix).await;
    drop(set);
}

/// Claims new keys until one is acquired, which must be within [`FOLLOWED_WITHIN`]; each try
/// is cut short, as a call to a hung primary would last the store timeout.
async fn calls_succeed_again(store: &Backend, prefix: &str) {
    let named = tokio::time::Instant::now();
    let fingerprint = fp(1);
    for n in 0.. {
        let key = record(prefix, &format!("after-{n}"));
        let call = store.claim(&key, &fingerprint, OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL });
        match tokio::time::timeout(Duration::from_millis(500), call).await {
            Ok(Ok(Claim::Acquired(_))) => return,
            other => assert!(
                named.elapsed() < FOLLOWED_WITHIN,
                "calls still fail {FOLLOWED_WITHIN:?} after the Sentinels named the new primary: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Sentinel follower's log lines, debug and up, written on this thread while it lives: a
/// `#[tokio::test]` runs the store's tasks on the test's own thread, and no other test does.
/// (No process-wide subscriber: the binary's other tests would write into it.)
struct FollowerLog {
    out: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _default: tracing::subscriber::DefaultGuard,
}

impl FollowerLog {
    fn capture() -> FollowerLog {
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&out);
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("idemgate::store::redis::sentinel=debug"))
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .with_ansi(false)
            .finish();
        FollowerLog { out, _default: tracing::subscriber::set_default(subscriber) }
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.out.lock().unwrap()).lines().map(str::to_owned).collect()
    }
}

struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many epoch markers under `prefix` the node on `port` holds.
fn epoch_markers_on(cluster: &RedisCluster, prefix: &str, port: u16) -> usize {
    let keys: Vec<String> =
        ::redis::cmd("KEYS").arg(format!("{prefix}:epoch:*")).query(&mut cluster.connection(port)).unwrap();
    keys.len()
}

/// Cluster-only: a rebalance moves a shard's first slot, and with it the shard's epoch marker,
/// to another shard. Nothing was lost, and the data-loss counter says so.
#[tokio::test]
async fn cluster_a_rebalance_is_not_taken_for_data_loss() {
    let cluster = RedisCluster::start(3, 0);
    let prefix = support::unique("rebalance");
    let store = RedisStore::new(&cluster.url(), 2, Duration::from_secs(2), &prefix).unwrap();
    let losses = store.data_loss_counter();
    let store = ready(store).await;
    let markers_on = |port: u16| epoch_markers_on(&cluster, &prefix, port);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.primary_ports().into_iter().any(|port| markers_on(port) != 1) {
        assert!(tokio::time::Instant::now() < deadline, "a marker per shard was never written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Records on every shard, some of them in the slot that moves.
    for n in 0..50 {
        let lease = acquire(&store, &record(&prefix, &format!("r{n}")), fp(1), LEASE).await;
        assert_eq!(complete(&store, lease, &response(b"kept"), RETENTION).await, Settled::Done);
    }
    let (from, to) = (cluster.primary_ports()[1], cluster.primary_ports()[0]);
    let slot = cluster.first_slot(from);
    cluster.begin_migration(slot, from, to);
    cluster.finish_migration(slot, from, to);
    assert_eq!(markers_on(to), 2, "the moved slot's marker went with it");
    // Checks see the marker on its new node, and a new first slot of the source shard.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while markers_on(from) != 1 {
        assert!(tokio::time::Instant::now() < deadline, "the source shard got no marker of its own");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(losses.get(), 0, "a rebalance is not a data loss");
    for n in 0..50 {
        assert!(matches!(claim(&store, &record(&prefix, &format!("r{n}")), fp(1)).await, Claim::Completed(_)), "r{n}");
    }
    drop(store);
}

/// Cluster-only: a settle on any shard notifies a subscriber on one node. The gateway keeps one
/// subscription, on any node; this is what wakes its waiters for keys on every other shard.
#[tokio::test]
async fn cluster_settle_notifications_from_every_shard_reach_one_node() {
    let cluster = cluster();
    let prefix = support::unique("shards");
    let store = ready(RedisStore::new(&cluster.url(), 2, Duration::from_secs(2), &prefix).unwrap()).await;
    let primaries = cluster.primary_ports();
    let listener = primaries[0];
    let mut conn = cluster.connection(listener);
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut pubsub = conn.as_pubsub();
    pubsub.subscribe(format!("{prefix}:settled")).unwrap();
    // One record on each shard.
    let mut shards = std::collections::HashSet::new();
    for n in 0.. {
        let k = record(&prefix, &format!("\"k{n}\""));
        if !shards.insert(cluster.node_for_key(k.as_str())) {
            continue;
        }
        let lease = acquire(&store, &k, fp(1), Duration::from_secs(10)).await;
        // A waiter flags the record, so that the settle publishes.
        assert!(matches!(claim(&store, &k, fp(1)).await, Claim::InFlight { .. }));
        complete(&store, lease, &response(b"{}"), RETENTION).await;
        let message = pubsub.get_message().expect("a notification on the listening node");
        assert_eq!(message.get_payload::<String>().unwrap(), k.as_str());
        if shards.len() == primaries.len() {
            break;
        }
    }
    assert_eq!(shards.len(), 3, "one record on each of the three shards, heard on node {listener}");
}

/// Cluster-only: each shard gets its own epoch marker, on that shard, and a shard that loses
/// its data is noticed while the others are untouched.
#[tokio::test]
async fn cluster_data_loss_is_detected_per_shard() {
    let cluster = RedisCluster::start(3, 0);
    let prefix = support::unique("epochs");
    let store = RedisStore::new(&cluster.url(), 2, Duration::from_secs(2), &prefix).unwrap();
    let losses = store.data_loss_counter();
    let store = ready(store).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let holding: Vec<u16> = cluster
            .primary_ports()
            .into_iter()
            .filter(|port| epoch_markers_on(&cluster, &prefix, *port) == 1)
            .collect();
        if holding.len() == 3 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "markers only on {holding:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let a check see all three markers, then empty one shard.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(losses.get(), 0, "nothing was lost yet");
    cluster.flush_node(cluster.primary_ports()[1]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while losses.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the emptied shard was not noticed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(losses.get(), 1, "one shard lost its data, once");
    drop(store);
}

/// A store on this binary's shared Redis under `prefix`, for the Redis-only tests below.
fn on_shared_redis(server: &RedisServer, prefix: &str) -> Backend {
    Backend::new(idemgate::store::Engine::Redis(
        RedisStore::new(&server.url(), 2, Duration::from_secs(2), prefix).unwrap(),
    ))
}

/// The shared Redis's key names matching `pattern`, sorted.
fn key_names(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut names: Vec<String> = ::redis::cmd("KEYS").arg(pattern).query(&mut server.connection()).unwrap();
    names.sort();
    names
}

/// Redis-only: records live under hashed names; neither the key nor the caller appears.
#[tokio::test]
async fn redis_key_names_never_contain_client_input() {
    let server = RedisServer::shared();
    let prefix = support::unique("names");
    let store = on_shared_redis(server, &prefix);
    let k = record(&prefix, "\"user-secret-key{slot}\"");
    let _lease = acquire(&store, &k, fp(1), LEASE).await;
    // The record, and the epoch marker that detects data loss (written by a background task
    // that may not have run yet on a busy machine).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut names = key_names(server, &format!("{prefix}*"));
    while names.len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        names = key_names(server, &format!("{prefix}*"));
    }
    assert_eq!(names, vec![format!("{prefix}:epoch"), k.as_str().to_owned()]);
    assert!(!names[1].contains("secret") && !names[1].contains('{'));
}

/// Redis-only: a large response travels through a side key, which never outlives its settle:
/// renamed over the record when the claim is still the owner's, deleted when it is not, also
/// when the settle has to be sent again by the script's text.
#[tokio::test]
async fn redis_a_large_response_leaves_no_side_key() {
    let server = RedisServer::shared();
    let prefix = support::unique("aside");
    let store = on_shared_redis(server, &prefix);
    let k = record(&prefix, "a");
    let (stale, fresh) = taken_over(&store, &k).await;
    let names = || key_names(server, &format!("*{prefix}*"));
    let only_the_record = vec![format!("{prefix}:epoch"), k.as_str().to_owned()];
    assert_eq!(complete(&store, stale, &large_response(b's'), RETENTION).await, Settled::Lost);
    assert_eq!(names(), only_the_record, "a lost claim's side key is deleted");
    // A Redis that lost its scripts (a restart, a failover) runs the settle by its text, the
    // side key's write included.
    let _: () = ::redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.connection()).unwrap();
    assert_eq!(complete(&store, fresh, &large_response(b'f'), RETENTION).await, Settled::Done);
    assert_eq!(names(), only_the_record, "the owner's side key became the record");
}

/// Redis-only: a script flushed from Redis (restart, failover) is reloaded transparently.
#[tokio::test]
async fn redis_reloads_scripts_after_script_flush() {
    let server = RedisServer::shared();
    let prefix = support::unique("noscript");
    let store = on_shared_redis(server, &prefix);
    let _ = acquire(&store, &record(&prefix, "a"), fp(1), LEASE).await;
    let mut conn = server.connection();
    let _: () = ::redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    let _ = acquire(&store, &record(&prefix, "b"), fp(1), LEASE).await;
}

/// Cluster-only: a node without the scripts (flushed, or new) runs them on the first call, by
/// the script's text; no other node is involved, so this works while another node is down.
#[tokio::test]
async fn cluster_nodes_without_the_scripts_run_them_by_text() {
    let cluster = cluster();
    let prefix = support::unique("noscript");
    let (store, _) = redis_at(cluster.url()).await;
    for port in cluster.primary_ports() {
        let _: () = ::redis::cmd("SCRIPT").arg("FLUSH").query(&mut cluster.connection(port)).unwrap();
    }
    let mut shards = std::collections::HashSet::new();
    for n in 0..200 {
        let k = record(&prefix, &format!("\"k{n}\""));
        shards.insert(cluster.node_for_key(k.as_str()));
        let _ = acquire(&store, &k, fp(1), LEASE).await;
    }
    assert_eq!(shards.len(), 3, "keys on every shard");
}

/// The store's own settings are read on every topology: the node a plain or Sentinel store
/// reaches, one node of a Cluster. (A Cluster routes `CONFIG` and `INFO` to one node here,
/// not to all.)
#[tokio::test]
async fn the_stores_own_settings_are_read_on_every_topology() {
    for url in [RedisServer::shared().url(), sentinels().url(), cluster().url()] {
        let (store, _) = redis_at(url.clone()).await;
        let settings = store.settings().await.expect("a Redis store has settings");
        assert_eq!(settings.eviction, Ok(("noeviction".to_owned(), 0)), "{url}: {settings:?}");
        assert!(!settings.evicts());
        assert!(settings.persistence.is_some() && settings.replicas.is_some(), "{url}: {settings:?}");
    }
}
