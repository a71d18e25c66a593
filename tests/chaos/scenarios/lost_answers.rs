//! The upstream loses answers, by a seeded draw per key and arrival: it drops the connection
//! after executing, drops it before executing, or holds the request past the gateway's
//! upstream timeout while it goes on executing, detached from the connection, and records at
//! the end. Two gateways share one Redis; retrying clients alternate between them, keep their
//! key across retries, honour Retry-After up to a cap, and give up after a few tries.
//!
//! With `[routes.idempotency.reconcile]` the gateways ask the order service's lookup (by
//! caller and key): an answer it has is replayed, a request it never ran runs as the next
//! attempt once "not found" can be trusted. The same workload again with
//! `on_unknown_outcome = "hold"` and no lookup leaves each lost answer at 502 `outcome-unknown`.
//! Guarantee, both runs: no key executed twice; attempt N+1 reached the upstream only after
//! attempt N never executed. With reconcile: at least 99% of logical requests end with their
//! answer (stored, reconciled, or a first execution).

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, route};
use crate::ledger::{Faults, Ledger, LostAnswers, Strike};
use crate::support::client::{Client, Reply};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

/// Logical requests per run, each under a key of its own.
const LOGICAL: u32 = 400;
const IN_FLIGHT: usize = 48;
/// Callers the logical requests are spread over (each is a scope of its own).
const CALLERS: u32 = 4;
/// Tries per logical request before its client gives up.
const TRIES: u32 = 6;
/// The longest Retry-After a client waits.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(2);
/// The gateway's upstream timeout.
const TIMEOUT: Duration = Duration::from_millis(400);
/// How long a held request executes: past the timeout, within the timeout plus `release_after`.
const HOLD: Duration = Duration::from_millis(700);
const LOST: LostAnswers =
    LostAnswers { seed: 16, drop_before: 6, drop_after: 6, hold: 6, hold_for: HOLD, first_arrivals: 2 };
const RECONCILE: &str = r#"on_unknown_outcome = "hold"

[routes.idempotency.reconcile]
path = "/orders/lookup"
after = "250ms"
release_after = "1s"
answer_status = 201"#;
const HOLD_ONLY: &str = r#"on_unknown_outcome = "hold""#;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let on = workload(&redis, RECONCILE).await;
    let off = workload(&redis, HOLD_ONLY).await;

    println!();
    println!(
        "| lost answers | logical requests | ended with an answer (first / replayed / reconciled) | ended 502 outcome-unknown | other | double executions |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, t) in [("reconcile on", &on), ("reconcile off (hold)", &off)] {
        println!(
            "| {name} | {LOGICAL} | {} ({} / {} / {}) | {} | {} | {} |",
            t.answered(),
            t.first,
            t.replayed,
            t.reconciled,
            t.unknown,
            t.other.len(),
            t.double.len()
        );
    }
    println!();

    for (name, t) in [("reconcile on", &on), ("reconcile off", &off)] {
        assert_eq!(t.double, Vec::<(String, u32)>::new(), "{name}: keys executed twice");
        assert_eq!(t.out_of_turn, Vec::<String>::new(), "{name}: a later attempt reached the upstream too soon");
        for strike in [Strike::DropBefore, Strike::DropAfter, Strike::Hold] {
            assert!(t.strikes(strike) > 0, "{name}: no arrival struck by {strike:?}");
        }
    }
    assert!(
        on.answered() * 100 >= LOGICAL * 99,
        "reconcile on: {} of {LOGICAL} ended with their answer; unknown {}, other {:?}",
        on.answered(),
        on.unknown,
        on.other
    );
    assert!(on.reconciled > 0, "no answer was reconciled");
    assert_eq!(on.overlapping_lookups, 0, "two lookups of one key ran at once");
    assert_eq!(off.lookups, 0, "no lookup without a reconcile table");
    assert!(off.unknown > 0, "without reconcile, lost answers stay unknown");

    Report {
        requests: on.requests + off.requests,
        executions: on.arrivals + off.arrivals,
        caught: on.backstop_hits + off.backstop_hits,
        errors: on.unknown + off.unknown + on.other.len() as u32 + off.other.len() as u32,
        note: format!(
            "{LOGICAL} logical requests, {} / {} / {} arrivals dropped before / dropped after / held past the timeout; \
             reconcile on: {} answered ({} reconciled), {} 502; off: {} answered, {} 502; 0 double executions",
            on.strikes(Strike::DropBefore),
            on.strikes(Strike::DropAfter),
            on.strikes(Strike::Hold),
            on.answered(),
            on.reconciled,
            on.unknown,
            off.answered(),
            off.unknown
        ),
    }
}

/// What one run of the workload came to.
#[derive(Default)]
struct Tally {
    /// HTTP requests sent, over all tries.
    requests: u32,
    /// Ended with a first execution's answer.
    first: u32,
    /// Ended with the stored answer, replayed.
    replayed: u32,
    /// Ended with the answer the lookup found.
    reconciled: u32,
    /// Ended with 502/504 `outcome-unknown` after the last try.
    unknown: u32,
    /// Ended any other way.
    other: Vec<String>,
    /// Keys the upstream executed more than once.
    double: Vec<(String, u32)>,
    /// Keys whose arrivals break "attempt N+1 only after attempt N never executed".
    out_of_turn: Vec<String>,
    arrivals: u32,
    backstop_hits: u32,
    lookups: u32,
    overlapping_lookups: u32,
    strikes: Vec<(Strike, u32)>,
}

impl Tally {
    fn answered(&self) -> u32 {
        self.first + self.replayed + self.reconciled
    }

    fn strikes(&self, strike: Strike) -> u32 {
        self.strikes.iter().find(|(s, _)| *s == strike).map_or(0, |(_, n)| *n)
    }
}

/// Starts a ledger and two gateways with the orders route's `policy`, runs every logical
/// request to its end, and reads the ledger.
async fn workload(redis: &RedisServer, policy: &str) -> Tally {
    let ledger =
        Ledger::start(Faults { lost: Some(LOST), lookup_delay: Duration::from_millis(20), ..Faults::default() }).await;
    let toml = gateway_toml(&redis.url(), ledger.addr, &unique("lost"), &route("orders", "/orders", policy));
    let default_timeout = "\ntimeout = \"10s\"\n";
    assert!(toml.contains(default_timeout));
    let toml = toml.replacen(default_timeout, &format!("\ntimeout = \"{}ms\"\n", TIMEOUT.as_millis()), 1);
    let gateways = [GatewayProc::start(&toml), GatewayProc::start(&toml)];
    let clients = [gateways[0].client(), gateways[1].client()];

    let limit = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = JoinSet::new();
    for n in 0..LOGICAL {
        let (clients, limit) = (clients.clone(), Arc::clone(&limit));
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            logical(&clients, n).await
        });
    }
    let endings = tasks.join_all().await;
    // A held execution may still be running: let it record before the ledger is read.
    tokio::time::sleep(HOLD + Duration::from_millis(300)).await;

    let mut tally = Tally::default();
    for (n, tries, last) in endings {
        tally.requests += tries;
        let key = key(n);
        match last {
            Ok(r) if r.status.is_success() => {
                let recorded = ledger.answer(&key);
                assert_eq!(r.status, 201, "{key}: {r:?}");
                assert_eq!(Some(&r.body), recorded.as_ref(), "{key}: the answer is not the one the upstream recorded");
                if r.header("idempotency-status") == Some("reconciled") {
                    assert!(r.is_replay(), "{key}: {r:?}");
                    tally.reconciled += 1;
                } else if r.is_replay() {
                    tally.replayed += 1;
                } else {
                    tally.first += 1;
                }
            }
            Ok(r) if is_outcome_unknown(&r) => tally.unknown += 1,
            Ok(r) => tally.other.push(format!("{key}: {} {:?}", r.status, r.body)),
            Err(e) => tally.other.push(format!("{key}: {e}")),
        }
        // Attempt N+1 arrives only after attempt N was dropped before executing, so arrival i
        // carries attempt i, and only the last arrival may have executed.
        let runs = ledger.runs(&key);
        let in_turn = runs.iter().enumerate().all(|(i, run)| {
            run.attempt == i as u32 + 1 && (i + 1 == runs.len() || run.strike == Some(Strike::DropBefore))
        });
        if !in_turn {
            tally.out_of_turn.push(format!("{key}: {runs:?}"));
        }
    }
    tally.double = ledger.keys_executed_over(1);
    let totals = ledger.totals();
    (tally.arrivals, tally.backstop_hits) = (totals.arrivals, totals.backstop_hits);
    (tally.lookups, tally.overlapping_lookups) = ledger.lookups();
    tally.strikes =
        [Strike::DropBefore, Strike::DropAfter, Strike::Hold].into_iter().map(|s| (s, ledger.strikes(s))).collect();
    tally
}

/// One logical request: the same key and body on every try, alternating gateways, until an
/// answer, a status not worth retrying, or the last try. Returns the tries and the last reply.
async fn logical(clients: &[Client; 2], n: u32) -> (u32, u32, Result<Reply, String>) {
    let (key, caller, body) = (key(n), format!("Bearer caller-{}", n % CALLERS), order(n));
    let mut last = Err("never sent".to_owned());
    for t in 0..TRIES {
        let client = &clients[((n + t) % 2) as usize];
        let headers = [
            ("content-type", "application/json"),
            ("idempotency-key", key.as_str()),
            ("authorization", caller.as_str()),
        ];
        last = client.try_send(Method::POST, "/orders", &headers, body.clone()).await;
        let pause = match &last {
            Ok(r) if r.status.is_success() => return (n, t + 1, last),
            Ok(r) if r.status.is_client_error() && r.status != 409 && r.status != 429 => return (n, t + 1, last),
            Ok(r) => r
                .header("retry-after")
                .and_then(|v| v.parse::<u64>().ok())
                .map_or_else(|| backoff(t), |s| Duration::from_secs(s).min(RETRY_AFTER_CAP)),
            Err(_) => backoff(t),
        };
        if t + 1 < TRIES {
            tokio::time::sleep(pause).await;
        }
    }
    (n, TRIES, last)
}

/// 100ms, doubling, at most 1s.
fn backoff(try_number: u32) -> Duration {
    Duration::from_millis(100 << try_number.min(4)).min(Duration::from_secs(1))
}

fn is_outcome_unknown(r: &Reply) -> bool {
    (r.status == 502 || r.status == 504)
        && r.header("content-type") == Some("application/problem+json")
        && r.json()["type"].as_str().is_some_and(|t| t.ends_with("#outcome-unknown"))
}

fn key(n: u32) -> String {
    format!("\"lost-{n}\"")
}
