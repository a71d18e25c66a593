//! The upstream answers 503 twice for every key, then succeeds. A 5xx releases the key, so each
//! retry runs again; the one success is stored and every later retry replays it.

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 20;
const FAILURES: u32 = 2;
const REPLAYS: u32 = 3;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults { fail_first: FAILURES, ..Faults::default() }).await;
    let gateway =
        GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("flaky"), &route("orders", "/orders", "")));
    let client = gateway.client();
    for k in 0..KEYS {
        for attempt in 0..FAILURES {
            let r = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
            assert_eq!(r.status, 503, "key {k}, attempt {attempt}: the upstream's own 5xx");
            assert!(!r.is_replay());
        }
        let success = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert_eq!(success.status, 201, "key {k}");
        assert!(!success.is_replay());
        for _ in 0..REPLAYS {
            let r = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
            assert!(r.is_replay() && r.body == success.body, "key {k}: the success is what is replayed");
        }
        assert_eq!(ledger.arrivals(&key(k)), FAILURES + 1, "key {k}: failures ran again, the success once");
    }
    let totals = ledger.totals();
    assert_eq!(totals.rows, KEYS, "exactly one success stored per key");
    assert_eq!(totals.backstop_hits, 0);
    Report {
        requests: KEYS * (FAILURES + 1 + REPLAYS),
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: format!("{FAILURES} x 5xx then success per key: retries ran again, one success stored"),
    }
}

fn key(k: u32) -> String {
    format!("\"flaky-{k}\"")
}
