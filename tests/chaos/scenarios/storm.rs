//! Two gateway processes on one Redis; K keys, each sent N times at once, spread across both
//! gateways; then, for a slice of the keys, a request with an altered body.
//! Guarantee: exactly K executions; every answer for a key byte-identical; every altered
//! body 422.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::Client;
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

const KEYS: u32 = 500;
const DUPLICATES: u32 = 8;
const ALTERED_EVERY: u32 = 10;
const IN_FLIGHT: usize = 128;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults { jitter: Duration::from_millis(30), ..Faults::default() }).await;
    let toml = gateway_toml(&redis.url(), ledger.addr, &unique("storm"), &route("orders", "/orders", ""));
    let gateways = [GatewayProc::start(&toml), GatewayProc::start(&toml)];
    let clients = [gateways[0].client(), gateways[1].client()];
    let outcome = storm(&clients, 0..KEYS).await;
    assert_ran_once(&ledger, KEYS);
    Report {
        requests: outcome.requests,
        executions: ledger.totals().arrivals,
        caught: 0,
        errors: 0,
        note: format!("{KEYS} executions for {KEYS} keys; {} altered bodies all 422", outcome.altered),
    }
}

/// What a storm sent and got.
pub struct Storm {
    pub requests: u32,
    pub altered: u32,
    /// The one answer body of each key.
    pub bodies: HashMap<u32, Bytes>,
}

/// Sends each key of `keys` [`DUPLICATES`] times at once, spread across both gateways, then an
/// altered body for a slice of them. Asserts that every key got one first answer and
/// byte-identical replays, and that every altered body was refused with 422.
pub async fn storm(clients: &[Client; 2], keys: Range<u32>) -> Storm {
    let limit = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = JoinSet::new();
    for k in keys.clone() {
        for n in 0..DUPLICATES {
            let client = clients[((k + n) % 2) as usize].clone();
            let limit = Arc::clone(&limit);
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await.unwrap();
                (k, post(&client, "/orders", &key(k), &order(k)).await)
            });
        }
    }
    let mut answers: HashMap<u32, Vec<crate::support::client::Reply>> = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (k, reply) = joined.unwrap();
        let reply = reply.unwrap_or_else(|e| panic!("key {k}: request failed: {e}"));
        answers.entry(k).or_default().push(reply);
    }
    for (k, replies) in &answers {
        let first = &replies[0];
        for r in replies {
            assert_eq!(r.status, 201, "key {k}: {r:?}");
            assert_eq!(r.body, first.body, "key {k}: answers differ");
        }
        assert_eq!(replies.iter().filter(|r| !r.is_replay()).count(), 1, "key {k}: one first answer, the rest replays");
    }

    // A slice of keys gets a different body: 422 through either gateway, nothing forwarded.
    let mut altered = 0;
    for k in keys.clone().step_by(ALTERED_EVERY as usize) {
        let r = post(&clients[(k % 2) as usize], "/orders", &key(k), &order(k + 1)).await.unwrap();
        assert_eq!(r.status, 422, "key {k}: altered body");
        altered += 1;
    }
    let bodies = answers.into_iter().map(|(k, replies)| (k, replies[0].body.clone())).collect();
    Storm { requests: keys.len() as u32 * DUPLICATES + altered, altered, bodies }
}

/// The ledger saw exactly `keys` executions, none twice, none caught by the backstop.
pub fn assert_ran_once(ledger: &Ledger, keys: u32) {
    let totals = ledger.totals();
    assert_eq!(ledger.keys_over(1), vec![], "keys executed more than once");
    assert_eq!(totals.arrivals, keys, "exactly one execution per key");
    assert_eq!(totals.rows, keys);
    assert_eq!(totals.backstop_hits, 0, "no duplicate ever reached the upstream");
}

pub fn key(k: u32) -> String {
    format!("\"storm-{k}\"")
}
