//! A rolling upgrade: the previous release and this build serve one route on one Redis, as
//! they do while a deployment replaces one by the other. Records, their state letters and the
//! scripts are shared byte for byte, so every key runs upstream once whichever gateway the
//! first request and its retries reach, in both directions: a small answer, a large one (kept
//! through a side key), one too large to keep (`response-not-stored`), a key reused with
//! another body (422), and a retry that arrives while the first request still runs.
//!
//! The previous release is built from this repository's history on first use (see
//! `support::previous`), or named by `IDEMGATE_PREVIOUS_BIN`.

use crate::support;

use std::time::Duration;

use support::gateway_proc::{GatewayProc, Toml};
use support::redis::RedisServer;
use support::upstream::TestUpstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_release_and_this_build_share_every_record_both_ways() {
    let previous = tokio::task::spawn_blocking(support::previous::binary).await.unwrap();
    let redis = RedisServer::shared();
    let upstream = TestUpstream::start().await;
    let prefix = support::unique("upgrade");
    let store = format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"", redis.url());
    let toml = Toml {
        store: &store,
        policy: "max_stored_body = \"32KiB\"\nwait = \"5s\"",
        upstream_lines: "timeout = \"10s\"",
        ..Toml::new(upstream.addr)
    }
    .render();
    let old = GatewayProc::start_binary(&previous, &toml);
    let new = GatewayProc::start(&toml);

    for (first, retry, way) in [(&old, &new, "old-new"), (&new, &old, "new-old")] {
        let (first, retry) = (first.client(), retry.client());

        // Small and large answers: the retry at the other gateway gets the same bytes.
        for (size, padding) in [("small", 0), ("large", 20_000)] {
            upstream.set(|b| b.padding = padding);
            let key = format!("{way}-{size}");
            let answer = first.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await;
            assert_eq!(answer.status, 201, "{way} {size}: {answer:?}");
            let again = retry.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await;
            assert!(again.is_replay(), "{way} {size}: the retry was not a replay: {again:?}");
            assert_eq!((again.status, &again.body), (answer.status, &answer.body), "{way} {size}");
            // Another body under the same key is refused by either gateway.
            let reused = retry.post_json("/orders", Some(&key), r#"{"sku":"b"}"#).await;
            assert_eq!(reused.status, 422, "{way} {size}: {reused:?}");
        }

        // Too large to keep: executed, and the retry is told so with the original status.
        upstream.set(|b| b.padding = 40_000);
        let key = format!("{way}-executed");
        let answer = first.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await;
        assert_eq!(answer.status, 201, "{way} executed");
        let again = retry.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await;
        assert_eq!(again.problem(), "response-not-stored", "{way} executed: {again:?}");

        // A retry while the first still runs waits for it, across versions, and replays it.
        upstream.set(|b| {
            b.padding = 0;
            b.delay = Duration::from_millis(800);
        });
        let key = format!("{way}-running");
        let running = {
            let (first, key) = (first.clone(), key.clone());
            tokio::spawn(async move { first.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let waited = retry.post_json("/orders", Some(&key), r#"{"sku":"a"}"#).await;
        let answer = running.await.unwrap();
        assert_eq!(answer.status, 201, "{way} running");
        assert!(waited.is_replay(), "{way} running: the waiting retry was not a replay: {waited:?}");
        assert_eq!(waited.body, answer.body, "{way} running");
        upstream.set(|b| b.delay = Duration::ZERO);
    }

    // What reached the upstream: each key once, whichever gateway its requests reached.
    let runs = upstream.executions_by_key();
    assert_eq!(runs.len(), 8, "{runs:?}");
    assert!(runs.values().all(|n| *n == 1), "a key ran twice across versions: {runs:?}");
}
