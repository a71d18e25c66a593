//! Redis stops while requests flow. Fail-closed routes answer 503 with Retry-After and forward
//! nothing; fail-open routes forward with `Idempotency-Status: bypassed`. When Redis returns,
//! the same gateway process serves normally again, without a restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::Reply;
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

/// Phases of the run, as the load loop sees them.
const UP: u8 = 0;
const STOPPING: u8 = 1;
const DOWN: u8 = 2;
const RESTARTING: u8 = 3;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults::default()).await;
    let routes = route("closed", "/closed", "") + &route("open", "/open", "on_store_error = \"fail-open\"");
    let gateway = GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("down"), &routes));
    let pid = gateway.pid();
    let phase = Arc::new(AtomicU8::new(UP));

    // Load: a request to each route every 10ms, each tagged with the phase it was sent and
    // answered in (or as in transition when those differ).
    let mut load = JoinSet::new();
    let sender = {
        let (client, phase) = (gateway.client(), Arc::clone(&phase));
        tokio::spawn(async move {
            for n in 0..u32::MAX {
                let p = phase.load(Ordering::SeqCst);
                if p == u8::MAX {
                    break;
                }
                for path in ["/closed", "/open"] {
                    let (client, key) = (client.clone(), format!("\"down-{path}-{n}\""));
                    let phase = Arc::clone(&phase);
                    load.spawn(async move {
                        let reply = post(&client, path, &key, &order(n)).await;
                        // Only a request sent and answered within one phase belongs to it.
                        let p = if phase.load(Ordering::SeqCst) == p { p } else { STOPPING };
                        (p, path, key, reply)
                    });
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            load.join_all().await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    phase.store(STOPPING, Ordering::SeqCst);
    redis.stop();
    phase.store(DOWN, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    phase.store(RESTARTING, Ordering::SeqCst);
    redis.restart();
    // Back to normal without a restart of the gateway: wait for a fail-closed success.
    let probe = gateway.client();
    let mut recovered = false;
    for n in 0..200 {
        if post(&probe, "/closed", &format!("\"probe-{n}\""), &order(n)).await.is_ok_and(|r| r.status == 201) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(recovered, "fail-closed route did not recover:\n{}", gateway.log());
    phase.store(UP, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    phase.store(u8::MAX, Ordering::SeqCst);
    let results: Vec<(u8, &str, String, Result<Reply, String>)> = sender.await.unwrap();

    let (mut closed_down, mut open_down, mut up_after) = (0, 0, 0);
    let mut saw_recovery_phase = false;
    for (p, path, key, reply) in &results {
        let reply = reply.as_ref().unwrap_or_else(|e| panic!("{key}: connection failed: {e}"));
        match (*p, *path) {
            (DOWN, "/closed") => {
                closed_down += 1;
                assert_eq!(reply.status, 503, "{key}");
                assert!(reply.header("retry-after").is_some(), "{key}: 503 carries Retry-After");
                assert_eq!(ledger.arrivals(key), 0, "{key}: fail-closed forwards nothing");
            }
            (DOWN, "/open") => {
                open_down += 1;
                assert_eq!(reply.status, 201, "{key}");
                assert_eq!(reply.header("idempotency-status"), Some("bypassed"), "{key}");
                assert_eq!(ledger.arrivals(key), 1, "{key}: fail-open forwards once");
            }
            (UP, _) => {
                saw_recovery_phase |= reply.status == 201 && reply.header("idempotency-status").is_none();
                up_after += 1;
            }
            _ => {} // sent while Redis was stopping or starting: either answer is allowed
        }
    }
    assert!(closed_down > 20 && open_down > 20, "load ran while Redis was down ({closed_down}, {open_down})");
    assert!(saw_recovery_phase, "normal service after Redis returned");
    assert_eq!(gateway.pid(), pid, "same gateway process throughout");
    let totals = ledger.totals();
    assert_eq!(ledger.keys_over(1), vec![], "no key ran twice");
    Report {
        requests: results.len() as u32,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: format!(
            "while down: {closed_down} fail-closed 503s forwarded nothing, {open_down} fail-open bypassed; \
             {up_after} normal after recovery"
        ),
    }
}
