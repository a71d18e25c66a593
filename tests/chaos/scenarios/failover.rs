//! Unplanned failovers while the upstream answers: the primary holding in-flight claims is
//! killed (SIGKILL) halfway through the upstream's work, and its replica is promoted, by the
//! Cluster itself or by Sentinel. The gateway answers each client at once and keeps settling
//! behind the answer until the new primary takes writes, within the lease; every retry after
//! the lease is a replay.
//!
//! Replication is asynchronous, so a claim written just before the kill may never have
//! reached the replica: its settle then finds no claim of its, and the retry, finding no
//! record, runs again as attempt 1. Such re-runs come from the store losing data, not from a
//! settle that gave up; they are counted apart (a settle that gave up shows as attempt 2,
//! the retry taking over a claim whose lease passed), and the upstream's constraint answers
//! them.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, post_until_served, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::Client;
use crate::support::cluster::RedisCluster;
use crate::support::gateway_proc::GatewayProc;
use crate::support::sentinel::SentinelSet;
use crate::support::unique;

const KEYS: u32 = 60;
const LEASE: Duration = Duration::from_secs(10);
const UPSTREAM: Duration = Duration::from_millis(800);

pub async fn cluster() -> Report {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1)).await.unwrap();
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, ..Faults::default() }).await;
    let gateway = GatewayProc::start(&toml(&cluster.url(), &ledger, "cfail"));
    let client = gateway.client();
    warm(&client).await;
    let primary = cluster.primary_ports()[0];
    let replica = cluster.replicas_of(primary)[0];
    let (cluster, keys) = run_with(&client, "cfail", move || {
        cluster.kill_and_wait_promoted(primary, replica);
        cluster
    })
    .await;
    drop(cluster);
    report(&ledger, &keys, "Cluster: a primary killed, its replica promoted")
}

pub async fn sentinel() -> Report {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start("orders")).await.unwrap();
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, ..Faults::default() }).await;
    let gateway = GatewayProc::start(&toml(&set.url(), &ledger, "sfail"));
    let client = gateway.client();
    warm(&client).await;
    let (set, keys) = run_with(&client, "sfail", move || {
        set.kill_primary();
        set
    })
    .await;
    drop(set);
    report(&ledger, &keys, "Sentinel: the primary killed, the replica promoted")
}

fn toml(url: &str, ledger: &Ledger, prefix: &str) -> String {
    let routes = route("orders", "/orders", &format!("lease = \"{}s\"", LEASE.as_secs()));
    gateway_toml(url, ledger.addr, &unique(prefix), &routes)
}

/// A first request through, so that the gateway has found the store.
async fn warm(client: &Client) {
    let warm = post_until_served(client, "/orders", "\"warm\"", &order(0)).await;
    assert_eq!(warm.status, 201, "{warm:?}");
}

/// Sends every key, fails the primary over while the upstream works, and retries every key
/// once the leases would have passed.
async fn run_with<T: Send + 'static>(
    client: &Client,
    name: &str,
    fail_over: impl FnOnce() -> T + Send + 'static,
) -> (T, Vec<String>) {
    let keys: Vec<String> = (0..KEYS).map(|n| format!("\"{name}-{n}\"")).collect();
    let mut first = JoinSet::new();
    for (n, key) in keys.iter().enumerate() {
        let (client, key) = (client.clone(), key.clone());
        first.spawn(async move { (post(&client, "/orders", &key, &order(n as u32)).await, key) });
    }
    tokio::time::sleep(UPSTREAM / 2).await;
    let store = tokio::task::spawn_blocking(fail_over).await.unwrap();
    for (reply, key) in first.join_all().await {
        let reply = reply.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(reply.status, 201, "{key}: the client gets the upstream's answer: {reply:?}");
    }
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    for (n, key) in keys.iter().enumerate() {
        let retry = post_until_served(client, "/orders", key, &order(n as u32)).await;
        assert_eq!(retry.status, 201, "{key}: {retry:?}");
    }
    (store, keys)
}

fn report(ledger: &Ledger, keys: &[String], what: &str) -> Report {
    let (mut once, mut lost_with_replication, mut gave_up) = (0, Vec::new(), Vec::new());
    for key in keys {
        match ledger.attempts(key).as_slice() {
            [1] => once += 1,
            [1, 1] => lost_with_replication.push(key.clone()),
            other => gave_up.push(format!("{key}: {other:?}")),
        }
    }
    assert_eq!(gave_up, Vec::<String>::new(), "re-runs that no data loss explains");
    let totals = ledger.totals();
    Report {
        requests: 2 * KEYS,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: format!(
            "{what} while the upstream answered, lease {}s: {once} keys ran once, 0 re-runs from a settle that \
             gave up, {} re-runs of claims lost with asynchronous replication (attempt 1 again, all caught by \
             the backstop)",
            LEASE.as_secs(),
            lost_with_replication.len()
        ),
    }
}
