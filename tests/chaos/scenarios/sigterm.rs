//! SIGTERM while requests are in flight. The gateway stops accepting, lets open requests
//! finish and stores their results, then exits. Guarantee: no client whose request reached
//! the upstream sees an error; every executed request's answer is stored (a retry through
//! another gateway replays it); requests that failed never reached the upstream.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::Client;
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const REQUESTS: u32 = 200;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults {
        first_delay: Duration::from_millis(100),
        jitter: Duration::from_millis(700),
        ..Faults::default()
    })
    .await;
    let toml = gateway_toml(&redis.url(), ledger.addr, &unique("term"), &route("orders", "/orders", ""));
    let mut stopping = GatewayProc::start(&toml);
    let witness = GatewayProc::start(&toml);

    // Requests arrive over 600ms, each on a connection of its own; SIGTERM lands in the middle.
    let mut sends = JoinSet::new();
    for k in 0..REQUESTS {
        let client = Client::new(stopping.addr);
        sends.spawn(async move {
            tokio::time::sleep(Duration::from_millis(u64::from(k) * 3)).await;
            (k, post(&client, "/orders", &key(k), &order(k)).await)
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stopping.sigterm();
    let results = sends.join_all().await;
    let status = stopping.wait_exit(Duration::from_secs(10)).expect("the gateway exits within its grace period");
    assert!(status.success(), "clean exit: {status:?}\n{}", stopping.log());

    let mut errors = 0;
    let mut served = 0;
    let replay = witness.client();
    for (k, result) in &results {
        let ran = ledger.arrivals(&key(*k));
        match result {
            Ok(reply) => {
                assert_eq!(reply.status, 201, "key {k}: {reply:?}");
                served += 1;
            }
            Err(e) => {
                errors += 1;
                assert_eq!(ran, 0, "key {k} reached the upstream but its client saw an error: {e}");
            }
        }
        if ran > 0 {
            let again = post(&replay, "/orders", &key(*k), &order(*k)).await.unwrap();
            assert!(again.is_replay(), "key {k}: its result was stored before the gateway exited");
        }
    }
    assert!(served > 0 && errors > 0, "SIGTERM landed mid-load (served {served}, refused {errors})");
    let totals = ledger.totals();
    assert_eq!(ledger.keys_over(1), vec![], "no key ran twice");
    Report {
        requests: REQUESTS + totals.arrivals,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors,
        note: format!("{served} accepted requests all answered and stored; {errors} refused after SIGTERM never ran"),
    }
}

fn key(k: u32) -> String {
    format!("\"term-{k}\"")
}
