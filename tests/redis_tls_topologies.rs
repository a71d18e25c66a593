//! The Redis store over TLS in the replicated topologies: a Sentinel set
//! (`rediss+sentinel://`) and a Redis Cluster (`rediss+cluster://`), each running with TLS
//! only and a certificate from a CA made by the test. The store trusts that CA through
//! `[store] ca_file`; opened with the system roots instead, it must not get through.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::config::RedisTls;
use idemgate::policy::fingerprint::Fingerprint;
use idemgate::store::{
    Backend, Claim, Engine, Final, Lifecycle, OwnerToken, RecordKey, RedisStore, Settled, StoredResponse, Terms,
};
use support::cluster::RedisCluster;
use support::pki::Pki;
use support::sentinel::SentinelSet;

const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(60);
/// The deadline of one store call.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a store trusting the CA may take to answer a first ping.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// How long a store not trusting the CA is watched failing.
const REFUSED_FOR: Duration = Duration::from_secs(3);

fn record(prefix: &str, name: &str) -> RecordKey {
    support::record_key(prefix, name)
}

fn response(body: &str) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    StoredResponse { status: StatusCode::CREATED, headers, body: Bytes::from(body.to_owned()).into() }
}

/// The store at `url`, trusting `ca_file` (the system roots when None). Connections are made
/// on first use: an error here is about the URL or the TLS material, never the servers.
fn open(url: &str, ca_file: Option<PathBuf>, prefix: &str) -> Result<Backend, String> {
    let tls = RedisTls { ca_file, client: None };
    let store = RedisStore::open(url, &tls, None, 2, CALL_TIMEOUT, prefix).map_err(|e| e.to_string())?;
    Ok(Backend::new(Engine::Redis(store)))
}

/// The store at `url` trusting the test's CA.
fn open_trusting(url: &str, pki: &Pki, prefix: &str) -> Backend {
    open(url, Some(pki.path("ca.pem")), prefix).unwrap_or_else(|e| panic!("cannot open the store at {url}: {e}"))
}

/// The store at `url` with the system roots must never get a ping through.
async fn assert_system_roots_refused(url: &str, what: &str) {
    match open(url, None, &support::unique("untrusting")) {
        Ok(store) => assert_refused(&store, what).await,
        // Refused before any connection (no usable system roots at all): refused all the same.
        Err(e) => eprintln!("the store with the system roots could not even be opened: {e}"),
    }
}

/// Waits until `store` answers a ping; panics with the last error after [`READY_WITHIN`].
async fn wait_ready(store: &Backend, what: &str) {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    loop {
        let last = match tokio::time::timeout(CALL_TIMEOUT * 2, store.ping()).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "ping timed out".to_owned(),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store over TLS to {what} did not answer a ping within {READY_WITHIN:?}; last error: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pings `store` for [`REFUSED_FOR`] and panics should any ping succeed.
async fn assert_refused(store: &Backend, what: &str) {
    let deadline = tokio::time::Instant::now() + REFUSED_FOR;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(CALL_TIMEOUT * 2, store.ping()).await {
            Ok(Ok(())) => panic!("a store without the test CA reached {what}: TLS is not verified"),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "ping timed out".to_owned(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!last.is_empty(), "no ping was made against {what}");
    eprintln!("{what} refused a store without the test CA: {last}");
}

/// Claims `key` (acquired), settles it with a response, and claims it again: the response is
/// replayed.
async fn claim_settle_replay(store: &Backend, key: &RecordKey, body: &str) {
    let fp = Fingerprint::from_bytes([7; 32]);
    let lease = match store.claim(key, &fp, OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL }).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("the first claim of {} was not acquired: {other:?}", key.as_str()),
    };
    let stored = response(body);
    let settled = store.settle(&lease, Final::Response(&stored), RETENTION).await;
    assert!(matches!(settled, Ok(Settled::Done)), "settling {} gave {settled:?}", key.as_str());
    match store.claim(key, &fp, OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL }).await {
        Ok(Claim::Completed(replayed)) => assert_eq!(replayed, stored, "the replay of {}", key.as_str()),
        other => panic!("the second claim of {} did not replay the response: {other:?}", key.as_str()),
    }
}

/// Whether the node reached by `conn` holds `key`.
fn holds(conn: &mut ::redis::Connection, key: &RecordKey) -> bool {
    ::redis::cmd("EXISTS").arg(key.as_str()).query::<u64>(conn).unwrap() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_sentinel_set_with_a_private_ca_serves_the_store() {
    let pki = Pki::new();
    let set = SentinelSet::start_tls("tls-orders", &pki.server_files());
    let url = set.url();
    assert!(url.starts_with("rediss+sentinel://127.0.0.1:"), "{url}");
    let prefix = support::unique("tls-sentinel");

    let store = open_trusting(&url, &pki, &prefix);
    wait_ready(&store, "the Sentinel set").await;
    let key = record(&prefix, "\"sentinel-1\"");
    claim_settle_replay(&store, &key, r#"{"order":"sentinel-1"}"#).await;
    assert!(holds(&mut set.primary_server().connection(), &key), "the record is on the primary the Sentinels name");

    // The same set through the system roots: neither the Sentinels nor the primary verify.
    assert_system_roots_refused(&url, "the Sentinel set").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_private_ca_serves_the_store_on_every_shard() {
    let pki = Pki::new();
    let cluster = RedisCluster::start_tls(3, 0, &pki.server_files());
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://127.0.0.1:"), "{url}");
    let primaries = cluster.primary_ports();
    assert_eq!(primaries.len(), 3, "three primaries serve slots: {primaries:?}");
    let prefix = support::unique("tls-cluster");

    let store = open_trusting(&url, &pki, &prefix);
    wait_ready(&store, "the cluster").await;
    let mut shards = std::collections::BTreeSet::new();
    for n in 0..200 {
        let key = record(&prefix, &format!("\"cluster-{n}\""));
        let node = cluster.node_for_key(key.as_str());
        if !shards.insert(node) {
            continue;
        }
        claim_settle_replay(&store, &key, &format!(r#"{{"order":"cluster-{n}"}}"#)).await;
        assert!(holds(&mut cluster.connection(node), &key), "the record {} is on node {node}", key.as_str());
        if shards.len() == primaries.len() {
            break;
        }
    }
    assert_eq!(shards.into_iter().collect::<Vec<_>>(), primaries, "a record on every shard");

    // The same cluster through the system roots: no node verifies.
    assert_system_roots_refused(&url, "the cluster").await;
}
