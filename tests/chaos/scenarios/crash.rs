//! A gateway is killed with SIGKILL while its request is at the upstream. The client retries
//! through the other gateway, which waits for the dead gateway's lease to pass, takes the key
//! over and forwards the retry; the upstream's UNIQUE constraint answers it with the original
//! order. Guarantee: no duplicate row, and the retry gets the original result.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 5;
const LEASE: Duration = Duration::from_secs(1);

pub async fn run() -> Report {
    let redis = RedisServer::start();
    // The first execution of each key is slow: the gateway dies while it runs.
    let ledger = Ledger::start(Faults { first_delay: Duration::from_secs(2), ..Faults::default() }).await;
    let toml = gateway_toml(&redis.url(), ledger.addr, &unique("crash"), &route("orders", "/orders", "lease = \"1s\""));
    let mut doomed = GatewayProc::start(&toml);
    let survivor = GatewayProc::start(&toml);

    let mut first_tries = JoinSet::new();
    for k in 0..KEYS {
        let client = doomed.client();
        first_tries.spawn(async move { post(&client, "/orders", &key(k), &order(k)).await });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for k in 0..KEYS {
        assert_eq!(ledger.arrivals(&key(k)), 1, "key {k} reached the upstream before the crash");
    }
    doomed.kill9();
    let lost = first_tries.join_all().await;
    let errors = lost.iter().filter(|r| r.is_err()).count() as u32;
    assert_eq!(errors, KEYS, "the clients of the killed gateway lost their answers");

    let started = Instant::now();
    let client = survivor.client();
    for k in 0..KEYS {
        let retry = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert_eq!(retry.status, 201, "key {k}: {retry:?}");
        assert_eq!(retry.header("idempotency-backstop"), Some("hit"), "key {k}: answered by the upstream's constraint");
        let again = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert!(again.is_replay() && again.body == retry.body, "key {k}: the backstop's answer was stored");
    }
    assert!(started.elapsed() >= LEASE / 2, "the survivor waited for the dead gateway's lease");

    let totals = ledger.totals();
    assert_eq!(totals.rows, KEYS, "no duplicate row");
    assert_eq!(totals.arrivals, 2 * KEYS, "each key ran once more after the crash, no more");
    assert_eq!(totals.backstop_hits, KEYS);
    Report {
        requests: 3 * KEYS,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors,
        note: "retries through the survivor after the lease: 0 duplicate rows".into(),
    }
}

fn key(k: u32) -> String {
    format!("\"crash-{k}\"")
}
