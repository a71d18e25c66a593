//! The storm on the other Redis topologies the gateway runs on.
//!
//! - Cluster: two gateways on a local 3-primary Redis Cluster. Guarantee as for one Redis:
//!   exactly one execution per key, and the records spread over every shard.
//! - Sentinel: two gateways that know only the Sentinels. A storm; a forced `SENTINEL
//!   FAILOVER`; a storm while the old primary still takes writes (before Sentinel demotes it);
//!   every key sent again; a last storm. Guarantee: the gateways follow the new primary on
//!   Sentinel's word, so every retry after the failover is a replay and nothing runs twice,
//!   and both report the failover as a possible data loss.

use std::time::{Duration, Instant};

use super::storm::{Storm, assert_ran_once, key, storm};
use crate::common::{Report, gateway_toml, order, post_until_served, route};
use crate::ledger::{Faults, Ledger};
use crate::support::cluster::RedisCluster;
use crate::support::gateway_proc::GatewayProc;
use crate::support::sentinel::SentinelSet;
use crate::support::unique;

const KEYS: u32 = 300;
/// A gateway moves to the new primary this soon after the Sentinels name it (they demote the
/// old one about ten seconds later).
const FOLLOW_WITHIN: Duration = Duration::from_secs(3);

pub async fn cluster() -> Report {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0)).await.unwrap();
    let ledger = Ledger::start(Faults { jitter: Duration::from_millis(30), ..Faults::default() }).await;
    let toml = gateway_toml(&cluster.url(), ledger.addr, &unique("cstorm"), &route("orders", "/orders", ""));
    let gateways = [GatewayProc::start(&toml), GatewayProc::start(&toml)];
    let clients = [gateways[0].client(), gateways[1].client()];
    let Storm { requests, altered, .. } = storm(&clients, 0..KEYS).await;
    assert_ran_once(&ledger, KEYS);
    let per_shard: Vec<u64> = cluster.primary_ports().iter().map(|port| cluster.dbsize(*port)).collect();
    assert!(per_shard.iter().all(|n| *n > 0), "records on every shard: {per_shard:?}");
    Report {
        requests,
        executions: ledger.totals().arrivals,
        caught: 0,
        errors: 0,
        note: format!(
            "{KEYS} executions for {KEYS} keys over 3 shards ({per_shard:?} keys); {altered} altered bodies all 422"
        ),
    }
}

pub async fn sentinel_failover() -> Report {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start("orders")).await.unwrap();
    let ledger = Ledger::start(Faults { jitter: Duration::from_millis(10), ..Faults::default() }).await;
    let toml = gateway_toml(&set.url(), ledger.addr, &unique("sstorm"), &route("orders", "/orders", ""));
    let gateways = [GatewayProc::start(&toml), GatewayProc::start(&toml)];
    let clients = [gateways[0].client(), gateways[1].client()];
    // The gateways ask the Sentinels for the primary as they start; until they have an answer
    // a request is refused (fail-closed) and a client tries again.
    for (g, client) in clients.iter().enumerate() {
        let warm = post_until_served(client, "/orders", &format!("\"warm-{g}\""), &order(0)).await;
        assert_eq!(warm.status, 201, "{warm:?}");
    }
    let before = storm(&clients, 0..KEYS).await;

    // The Sentinels promote the replica. The old primary still takes writes until they demote
    // it, about ten seconds later, and loses them then: a gateway must move on Sentinel's
    // word, not wait for the old primary to refuse.
    let set = tokio::task::spawn_blocking(move || {
        set.switch();
        set
    })
    .await
    .unwrap();
    let switched = Instant::now();
    for gateway in &gateways {
        while !gateway.log().contains("following a Sentinel failover") {
            assert!(switched.elapsed() < FOLLOW_WITHIN, "the gateway did not follow the switch: {}", gateway.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let followed = switched.elapsed();
    let during = storm(&clients, KEYS..2 * KEYS).await;
    let set = tokio::task::spawn_blocking(move || {
        set.wait_demoted();
        set
    })
    .await
    .unwrap();

    // Every key again, through the other gateway: a replay of the same answer, read from the
    // new primary, including those answered while the old primary still took writes.
    let mut waited = 0;
    for k in 0..2 * KEYS {
        let client = &clients[((k + 1) % 2) as usize];
        let started = Instant::now();
        let reply = post_until_served(client, "/orders", &key(k), &order(k)).await;
        if started.elapsed() > Duration::from_millis(40) {
            waited += 1;
        }
        let first = before.bodies.get(&k).or(during.bodies.get(&k)).unwrap();
        assert_eq!(reply.status, 201, "key {k} after the failover: {reply:?}");
        assert!(reply.is_replay(), "key {k} ran again after the failover");
        assert_eq!(&reply.body, first, "key {k}: another answer after the failover");
    }
    let after = storm(&clients, 2 * KEYS..3 * KEYS).await;
    assert_ran_once(&ledger, 3 * KEYS + 2);

    // Both gateways said records may have been lost.
    for gateway in &gateways {
        let deadline = Instant::now() + Duration::from_secs(10);
        while gateway.metric("idemgate_store_data_loss_total").await < 1.0 {
            assert!(Instant::now() < deadline, "the failover was not reported: {}", gateway.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(set);
    Report {
        requests: 2 + before.requests + during.requests + 2 * KEYS + after.requests,
        executions: ledger.totals().arrivals,
        caught: 0,
        errors: 0,
        note: format!(
            "{KEYS} keys; SENTINEL FAILOVER, followed in {} ms; {KEYS} keys before the old primary was demoted; \
             {} retries all replays ({waited} waited); {KEYS} new keys once each",
            followed.as_millis(),
            2 * KEYS
        ),
    }
}
