//! Redis restarts empty between a request and its retry. The retry reaches the upstream, whose
//! UNIQUE constraint answers with the original order; the gateway stores that answer, and says
//! in its metrics that Redis lost its data. Guarantee: no duplicate row.

use std::time::Duration;

use crate::common::{Report, gateway_toml, order, post, post_until_served, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 20;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults::default()).await;
    let gateway =
        GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("loss"), &route("orders", "/orders", "")));
    let client = gateway.client();
    let mut firsts = Vec::new();
    for k in 0..KEYS {
        let r = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert_eq!(r.status, 201);
        firsts.push(r.body);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await; // the gateway has seen the epoch
    redis.restart();

    for k in 0..KEYS {
        let retry = post_until_served(&client, "/orders", &key(k), &order(k)).await;
        assert_eq!(retry.status, 201, "key {k}");
        assert_eq!(retry.body, firsts[k as usize], "key {k}: the original order");
        assert_eq!(retry.header("idempotency-backstop"), Some("hit"), "key {k}");
        let again = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert!(again.is_replay(), "key {k}: stored again after the loss");
    }
    let totals = ledger.totals();
    assert_eq!(totals.rows, KEYS, "no duplicate row");
    assert_eq!(totals.arrivals, 2 * KEYS);
    assert_eq!(totals.backstop_hits, KEYS);
    let mut noticed = 0.0;
    for _ in 0..50 {
        noticed = gateway.metric("idemgate_store_data_loss_total").await;
        if noticed >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(noticed >= 1.0, "the gateway reports the data loss:\n{}", gateway.log());
    Report {
        requests: 3 * KEYS,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: "every retry after the loss caught by the backstop; loss reported in metrics".into(),
    }
}

fn key(k: u32) -> String {
    format!("\"loss-{k}\"")
}
