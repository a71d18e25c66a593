//! Clients send a whole request and hang up before the answer. The gateway finishes the upstream
//! call anyway and stores the result; each client's retry is answered from the store.
//! Guarantee: one execution per key, and the retry gets its result.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 50;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults { first_delay: Duration::from_millis(500), ..Faults::default() }).await;
    let gateway =
        GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("gone"), &route("orders", "/orders", "")));
    let addr = gateway.addr;

    let mut hangups = JoinSet::new();
    for k in 0..KEYS {
        hangups.spawn(async move {
            let body = order(k);
            let request = format!(
                "POST /orders HTTP/1.1\r\nhost: shop\r\nauthorization: Bearer tester\r\ncontent-type: application/json\r\nidempotency-key: {}\r\ncontent-length: {}\r\n\r\n{body}",
                key(k),
                body.len()
            );
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(stream); // the answer is lost on the way back
        });
    }
    hangups.join_all().await;
    // The gateway may read a request only after its client has gone (on a busy machine, later
    // than the client's 100 ms): wait, bounded, for every key to arrive before counting.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..KEYS).any(|k| ledger.arrivals(&key(k)) == 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for k in 0..KEYS {
        assert_eq!(ledger.arrivals(&key(k)), 1, "key {k} reached the upstream");
    }
    tokio::time::sleep(Duration::from_millis(700)).await; // the upstream answers, nobody listens

    let client = gateway.client();
    for k in 0..KEYS {
        let retry = post(&client, "/orders", &key(k), &order(k)).await.unwrap();
        assert_eq!(retry.status, 201, "key {k}");
        assert!(retry.is_replay(), "key {k}: the retry is answered from the store");
    }
    let totals = ledger.totals();
    assert_eq!(totals.arrivals, KEYS, "one execution per key");
    assert_eq!(totals.backstop_hits, 0);
    Report {
        requests: 2 * KEYS,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: KEYS,
        note: format!("{KEYS} hung-up clients, {KEYS} retries all replayed"),
    }
}

fn key(k: u32) -> String {
    format!("\"gone-{k}\"")
}
