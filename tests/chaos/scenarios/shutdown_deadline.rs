//! A request still running when the shutdown grace period ends: the gateway answers 503
//! `shutting-down` and settles its key at once, so the client's retry through another gateway
//! does not wait for the lease to pass. The request was sent, so its outcome is unknown: on a
//! `hold` route (the default) the retry gets 502 `outcome-unknown` and is not run again; on a
//! `release` route it runs again and the upstream's constraint answers it. And a second signal
//! ends the process without waiting.

use std::time::{Duration, Instant};

use crate::common::{Report, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

pub async fn run() -> Report {
    let redis = RedisServer::start();
    let ledger = Ledger::start(Faults { first_delay: Duration::from_secs(4), ..Faults::default() }).await;
    let prefix = unique("deadline");
    let routes =
        route("orders", "/orders", "") + &route("deduplicated", "/deduplicated", "on_unknown_outcome = \"release\"");
    let toml = crate::common::gateway_toml(&redis.url(), ledger.addr, &prefix, &routes)
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"1s\"");
    let mut stopping = GatewayProc::start(&toml);
    let witness = GatewayProc::start(&toml);

    let client = stopping.client();
    let slow = tokio::spawn(async move { post(&client, "/orders", "\"slow\"", &order(1)).await });
    let client = stopping.client();
    let dedup = tokio::spawn(async move { post(&client, "/deduplicated", "\"dedup\"", &order(3)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((ledger.arrivals("\"slow\""), ledger.arrivals("\"dedup\"")), (1, 1));
    let signalled = Instant::now();
    stopping.sigterm();
    for answer in [slow.await.unwrap(), dedup.await.unwrap()] {
        let answer = answer.expect("the client is answered, not reset");
        assert_eq!(answer.status, 503, "{answer:?}");
        assert_eq!(answer.problem(), "shutting-down");
    }
    let status = stopping.wait_exit(Duration::from_secs(5)).expect("exits after the grace period");
    assert!(status.success());
    let stopped_after = signalled.elapsed();
    assert!(stopped_after < Duration::from_secs(3), "grace is 1s, took {stopped_after:?}");

    // Neither retry waits for the 10s lease. The held key refuses its retry...
    let started = Instant::now();
    let retry = post(&witness.client(), "/orders", "\"slow\"", &order(1)).await.unwrap();
    assert_eq!((retry.status.as_u16(), retry.problem().as_str()), (502, "outcome-unknown"), "{retry:?}");
    assert_eq!(ledger.arrivals("\"slow\""), 1, "never run twice");
    // ...the released one runs again, and the first execution's row answers it.
    let retry = post(&witness.client(), "/deduplicated", "\"dedup\"", &order(3)).await.unwrap();
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header("idempotency-backstop"), Some("hit"), "the first execution's row answers");
    assert!(started.elapsed() < Duration::from_secs(2), "settled at shutdown, not left to expire");
    // A second signal does not wait for the grace period.
    let mut impatient = GatewayProc::start(&toml.replace("shutdown_grace = \"1s\"", "shutdown_grace = \"30s\""));
    let client = impatient.client();
    let held = tokio::spawn(async move { post(&client, "/orders", "\"held\"", &order(2)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    impatient.sigterm();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(impatient.wait_exit(Duration::ZERO).is_none(), "the first signal waits for the running request");
    let second = Instant::now();
    impatient.sigterm();
    let status = impatient.wait_exit(Duration::from_secs(5)).expect("a second signal exits at once");
    assert!(second.elapsed() < Duration::from_secs(2) && !status.success(), "{status:?}");
    assert!(held.await.unwrap().is_err(), "its client loses the answer: that is what a second signal means");

    let totals = ledger.totals();
    assert_eq!(totals.rows, 3);
    Report {
        requests: 5,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 4,
        note: format!(
            "exited {:.1}s after SIGTERM; held key refused its retry, released key's retry hit the backstop; a second signal exits at once",
            stopped_after.as_secs_f64()
        ),
    }
}
