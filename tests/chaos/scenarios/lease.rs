//! The upstream takes five times the lease. With renewal the first request keeps its claim and
//! every duplicate is told 409; with renewal disabled each duplicate takes the expired lease
//! over and reaches the upstream, where the UNIQUE constraint catches every one.
//! Together they show both mechanisms: renewal prevents the duplicates, the backstop catches
//! them when renewal is off.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::{Client, Reply};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 10;
const UPSTREAM: Duration = Duration::from_millis(1500);
/// Duplicates are sent at these offsets; the lease is 300ms.
const DUPLICATES_AT: [u64; 3] = [400, 800, 1200];

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, later_delay: UPSTREAM, ..Faults::default() }).await;
    let policy = "lease = \"300ms\"\nwait = \"0s\"";
    let routes = route("renewing", "/renewing", policy)
        + &route("not-renewing", "/not-renewing", &format!("{policy}\nrenew = false"));
    let gateway = GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("lease"), &routes));
    let client = gateway.client();

    // With renewal: every duplicate finds the claim alive.
    let renewing = send_with_duplicates(&client, "/renewing", "r").await;
    for (k, first, duplicates) in &renewing {
        assert_eq!(first.status, 201, "{k}");
        for d in duplicates {
            assert_eq!(d.status, 409, "{k}: a duplicate while the first runs is told to wait");
        }
        assert_eq!(ledger.arrivals(k), 1, "{k}: renewal kept the claim, no duplicate execution");
    }
    let renewing_runs = ledger.totals().arrivals;
    assert_eq!(renewing_runs, KEYS);

    // Without renewal: duplicates take the expired lease over and run; the backstop answers.
    let not_renewing = send_with_duplicates(&client, "/not-renewing", "n").await;
    let mut duplicate_runs = 0;
    for (k, first, duplicates) in &not_renewing {
        assert_eq!(first.status, 201, "{k}");
        let runs = ledger.arrivals(k);
        assert!(runs > 1, "{k}: without renewal the lease expired and duplicates ran ({runs})");
        duplicate_runs += runs - 1;
        for d in duplicates {
            assert_eq!(d.status, 201, "{k}: {d:?}");
            assert_eq!(d.body, first.body, "{k}: the backstop answers with the original order");
        }
    }
    let totals = ledger.totals();
    assert_eq!(totals.rows, 2 * KEYS, "one row per key, whatever ran twice");
    assert_eq!(totals.backstop_hits, duplicate_runs, "every duplicate execution was caught by the backstop");
    assert!(gateway.metric("idemgate_lease_lost_total").await >= 1.0, "the gateway counted its lost leases");
    Report {
        requests: 2 * KEYS * (1 + DUPLICATES_AT.len() as u32),
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: format!(
            "renewal on: {renewing_runs} runs for {KEYS} keys; renewal off: {duplicate_runs} duplicate runs, all caught"
        ),
    }
}

/// For each key: the first request and duplicates at `DUPLICATES_AT`.
async fn send_with_duplicates(client: &Client, path: &'static str, tag: &str) -> Vec<(String, Reply, Vec<Reply>)> {
    let mut keys = JoinSet::new();
    for k in 0..KEYS {
        let client = client.clone();
        let key = format!("\"lease-{tag}-{k}\"");
        keys.spawn(async move {
            let mut sends = JoinSet::new();
            for (i, at) in std::iter::once(0).chain(DUPLICATES_AT).enumerate() {
                let (client, key) = (client.clone(), key.clone());
                sends.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    (i, post(&client, path, &key, &order(k)).await.unwrap())
                });
            }
            let mut replies: Vec<(usize, Reply)> = sends.join_all().await;
            replies.sort_by_key(|(i, _)| *i);
            let mut replies = replies.into_iter().map(|(_, r)| r);
            let first = replies.next().unwrap();
            (key, first, replies.collect())
        });
    }
    keys.join_all().await
}
