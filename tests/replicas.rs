//! `[store] replica_acks`: a claim is forwarded, and an answer replied, only once replicas hold
//! it (Redis `WAIT`). A replica is frozen with `DEBUG SLEEP`, which stops its event loop and so
//! its acknowledgements, for a bounded time.
//!
//! What reached the upstream is counted, not only what the client saw: a claim no replica
//! acknowledged forwards nothing, and its retry, once the replica is back, runs the request
//! once.

use std::time::{Duration, Instant};

use crate::support::client::Client;
use crate::support::gateway::{StoreKind, TestGateway, config};
use crate::support::redis::RedisServer;
use crate::support::upstream::TestUpstream;

/// Longer than a replay takes on the slowest machine, so that a replay stalled behind a
/// `WAIT` (the hazard of running it on a shared connection) shows.
const ACK_TIMEOUT: &str = "2s";

fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    replica.replicate(&primary);
    // The replica says its link is up before the primary counts it (the primary does once the
    // replica first acknowledges, within a second): wait for that, or a WAIT finds no replica.
    let mut conn = primary.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _: () = redis::cmd("SET").arg("warm-up").arg(1).query(&mut conn).unwrap();
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(200).query(&mut conn).unwrap();
        if acked >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the primary never counted its replica");
    }
    (primary, replica)
}

fn toml(primary: &RedisServer, upstream: &TestUpstream, acks: u32) -> String {
    let toml = config(&StoreKind::Redis(primary.url()), upstream.addr, "");
    let store = format!("timeout = \"500ms\"\nreplica_acks = {acks}\nreplica_ack_timeout = \"{ACK_TIMEOUT}\"");
    assert!(toml.contains("timeout = \"500ms\""), "{toml}");
    toml.replacen("timeout = \"500ms\"", &store, 1)
}

/// Stops `replica` answering anything, its replication acknowledgements included, for `for_`
/// (in a thread: `DEBUG SLEEP` blocks its caller too). Returns once the sleep has begun.
fn freeze(replica: &RedisServer, for_: Duration) -> std::thread::JoinHandle<()> {
    let mut conn = replica.connection();
    let frozen = std::thread::spawn(move || {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg(for_.as_secs_f64()).query(&mut conn);
    });
    // The command is on its way once the thread runs; give it a moment to arrive.
    std::thread::sleep(Duration::from_millis(100));
    frozen
}

async fn metric(gateway: &TestGateway, series: &str) -> f64 {
    let reply = gateway.admin_client().get("/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

/// Waits until `series` counts at least one, for up to `within`.
async fn metric_reaches(gateway: &TestGateway, series: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while metric(gateway, series).await < 1.0 {
        assert!(Instant::now() < deadline, "{series} never counted within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(client: &Client, key: &str) -> crate::support::client::Reply {
    client.post_json("/orders", Some(key), r#"{"item":"book"}"#).await
}

#[tokio::test]
async fn a_claim_no_replica_holds_forwards_nothing_and_its_retry_runs_once_the_replica_is_back() {
    let (primary, replica) = primary_and_replica();
    let upstream = TestUpstream::start().await;
    let gateway = TestGateway::start(&toml(&primary, &upstream, 1)).await;
    let client = gateway.client();

    // Steady state: the claim and the answer are acknowledged, and the replica holds them.
    let first = post(&client, "held-1").await;
    assert_eq!(first.status, 201);
    let claims = r#"idemgate_store_replica_acks_total{write="claim",outcome="acknowledged"}"#;
    let answers = r#"idemgate_store_replica_acks_total{write="answer",outcome="acknowledged"}"#;
    assert_eq!(metric(&gateway, claims).await, 1.0);
    assert_eq!(metric(&gateway, answers).await, 1.0);

    let frozen = freeze(&replica, Duration::from_secs(4));
    // A replay needs no replica: it is not held up by one that does not answer.
    let started = Instant::now();
    let replay = post(&client, "held-1").await;
    assert_eq!(replay.status, 201);
    assert!(replay.is_replay());
    assert!(started.elapsed() < Duration::from_millis(1500), "a replay waited {:?}", started.elapsed());

    // A new key: claimed on the primary, never acknowledged, given back; nothing forwarded.
    let started = Instant::now();
    let refused = post(&client, "unheld-1").await;
    let took = started.elapsed();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.problem(), "store-unavailable");
    assert!(refused.header("retry-after").is_some());
    assert!(took >= Duration::from_millis(1900), "refused before the ack timeout: {took:?}");
    assert!(took < Duration::from_secs(4), "refused only after {took:?}");
    assert_eq!(upstream.executions_by_key().get("unheld-1"), None, "a claim no replica held was forwarded");
    assert_eq!(metric(&gateway, "idemgate_store_claims_unreplicated_total").await, 1.0);
    frozen.join().unwrap();

    // The replica is back: the retry runs the request, once, and its own retry replays.
    let mut retried = post(&client, "unheld-1").await;
    for _ in 0..20 {
        if retried.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        retried = post(&client, "unheld-1").await;
    }
    assert_eq!(retried.status, 201, "{retried:?}");
    assert!(post(&client, "unheld-1").await.is_replay());
    assert_eq!(upstream.executions_by_key().get("unheld-1"), Some(&1));
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_answer_no_replica_holds_yet_is_replied_and_waited_for_behind_it() {
    let (primary, replica) = primary_and_replica();
    let upstream = TestUpstream::start().await;
    upstream.set(|b| b.delay = Duration::from_millis(1500));
    let gateway = TestGateway::start(&toml(&primary, &upstream, 1)).await;
    let client = gateway.client();

    // The claim is acknowledged; the replica then stops before the answer is stored.
    let running = {
        let client = client.clone();
        tokio::spawn(async move { post(&client, "slow-1").await })
    };
    let claimed = r#"idemgate_store_replica_acks_total{write="claim",outcome="acknowledged"}"#;
    metric_reaches(&gateway, claimed, Duration::from_secs(5)).await;
    // Frozen past the answer (1.5 s) and its wait (2 s).
    let frozen = freeze(&replica, Duration::from_secs(5));
    let answered = running.await.unwrap();
    // The request ran: its answer is the client's, replicated or not.
    assert_eq!(answered.status, 201);
    assert_eq!(upstream.executions(), 1);
    assert_eq!(metric(&gateway, "idemgate_store_answers_unreplicated_total").await, 1.0);
    frozen.join().unwrap();
    // Once the replica is back, the gateway that kept waiting hears it acknowledge.
    let late = r#"idemgate_store_replica_acks_total{write="answer",outcome="late"}"#;
    metric_reaches(&gateway, late, Duration::from_secs(10)).await;
    assert!(post(&client, "slow-1").await.is_replay());
    assert_eq!(upstream.executions(), 1);
    gateway.shutdown().await;
}

#[tokio::test]
async fn without_replica_acks_nothing_waits_for_a_replica() {
    let (primary, replica) = primary_and_replica();
    let upstream = TestUpstream::start().await;
    let gateway = TestGateway::start(&toml(&primary, &upstream, 0)).await;
    let client = gateway.client();
    let frozen = freeze(&replica, Duration::from_secs(2));
    let started = Instant::now();
    assert_eq!(post(&client, "free-1").await.status, 201);
    assert!(started.elapsed() < Duration::from_millis(1500), "waited {:?}", started.elapsed());
    assert_eq!(
        metric(&gateway, r#"idemgate_store_replica_acks_total{write="claim",outcome="acknowledged"}"#).await,
        0.0
    );
    frozen.join().unwrap();
    gateway.shutdown().await;
}

#[test]
fn check_refuses_more_replica_acks_than_the_store_has_replicas() {
    let (primary, _replica) = primary_and_replica();
    let dir = tempfile::tempdir().unwrap();
    let write = |acks: u32| {
        let path = dir.path().join(format!("acks-{acks}.toml"));
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\nbackend = \"redis\"\nurl = \"{}\"\nreplica_acks = {acks}\n\n[upstreams.app]\nurl = \"http://127.0.0.1:9\"\n\n\
             [[routes]]\nname = \"orders\"\nmethods = [\"POST\"]\npath = \"/orders\"\nupstream = \"app\"\n\n[routes.idempotency]\n",
            primary.url()
        );
        std::fs::write(&path, toml).unwrap();
        path
    };
    let check = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["check", "--config"])
            .arg(path)
            .output()
            .unwrap()
    };
    let one = check(&write(1));
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let two = check(&write(2));
    let stderr = String::from_utf8_lossy(&two.stderr);
    assert!(!two.status.success(), "{stderr}");
    assert!(stderr.contains("store.replica_acks: 2 is more than the replicas that acknowledge a write"), "{stderr}");
    assert!(stderr.contains("1 connected"), "{stderr}");
}

#[tokio::test]
async fn a_claim_the_store_forgot_is_said_vanished_once_not_taken_over() {
    let redis = RedisServer::start();
    let upstream = TestUpstream::start().await;
    upstream.set(|b| b.delay = Duration::from_millis(800));
    let gateway = TestGateway::start(&config(&StoreKind::Redis(redis.url()), upstream.addr, "")).await;
    let client = gateway.client();
    let first = {
        let client = client.clone();
        tokio::spawn(async move { post(&client, "forgotten-1").await })
    };
    // While the first runs, the store forgets its claim (as a failover to a replica that had
    // not received it does), and a retry, finding nothing, claims the key afresh as attempt 1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.connection()).unwrap();
    let retry = post(&client, "forgotten-1").await;
    assert_eq!(retry.status, 201);
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(upstream.executions_by_key().get("forgotten-1"), Some(&2), "the store's loss let the retry run");
    let attempts: Vec<_> =
        upstream.seen().iter().filter_map(|s| s.headers.get("idempotency-attempt").cloned()).collect();
    assert_eq!(attempts, ["1", "1"], "a re-run after a lost record arrives as attempt 1");
    let vanished = r#"idemgate_claims_vanished_total{route="orders"}"#;
    assert_eq!(metric(&gateway, vanished).await, 1.0, "the first's claim vanished, said once");
    assert_eq!(metric(&gateway, r#"idemgate_lease_lost_total{route="orders"}"#).await, 0.0, "nobody took it over");
    gateway.shutdown().await;
}

#[tokio::test]
async fn two_gateways_racing_on_a_key_while_the_replica_is_frozen_run_it_once_after() {
    let (primary, replica) = primary_and_replica();
    let upstream = TestUpstream::start().await;
    // One file for both, so that they share a key prefix and so each record.
    let text = toml(&primary, &upstream, 1);
    let (a, b) = (TestGateway::start(&text).await, TestGateway::start(&text).await);
    assert_eq!(a.config.store.key_prefix, b.config.store.key_prefix);
    // Frozen for longer than both can try: the one that claims first waits 2 s in vain and
    // gives its claim back, the other (which waited for it) claims and waits 2 s in vain too.
    let frozen_at = Instant::now();
    let frozen = freeze(&replica, Duration::from_secs(8));
    let (ca, cb) = (a.client(), b.client());
    let (ra, rb) = tokio::join!(post(&ca, "raced-1"), post(&cb, "raced-1"));
    assert!(frozen_at.elapsed() < Duration::from_secs(7), "the replica woke before the race ended");
    // Each is refused: for want of replicas, or as a duplicate still in flight; nothing reached
    // the upstream.
    for r in [&ra, &rb] {
        assert!(r.status == 503 || r.status == 409, "{r:?}");
    }
    assert_eq!(upstream.executions(), 0, "a claim no replica held was forwarded");
    frozen.join().unwrap();
    // Back: both race again until served; the request runs once, the other gets its answer.
    let served = |gw: &TestGateway| {
        let client = gw.client();
        async move {
            for _ in 0..40 {
                let r = post(&client, "raced-1").await;
                if r.status == 201 {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            panic!("never served");
        }
    };
    let (ra, rb) = tokio::join!(served(&a), served(&b));
    assert_eq!(upstream.executions(), 1, "the key ran {} times", upstream.executions());
    assert_eq!(ra.body, rb.body, "both have the one answer");
    assert!(ra.is_replay() || rb.is_replay());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn on_a_cluster_each_write_waits_for_the_replica_of_its_own_shard() {
    let cluster = tokio::task::spawn_blocking(|| crate::support::cluster::RedisCluster::start(3, 1)).await.unwrap();
    let upstream = TestUpstream::start().await;
    let text = config(&StoreKind::Redis(cluster.url()), upstream.addr, "");
    let store = format!("timeout = \"500ms\"\nreplica_acks = 1\nreplica_ack_timeout = \"{ACK_TIMEOUT}\"");
    let gateway = TestGateway::start(&text.replacen("timeout = \"500ms\"", &store, 1)).await;
    let client = gateway.client();
    // Keys over every shard: each claim and answer is acknowledged by that shard's replica
    // (the WAIT rides with the write to the node that owns the key).
    const KEYS: usize = 30;
    for i in 0..KEYS {
        let key = format!("sharded-{i}");
        let mut first = post(&client, &key).await;
        // The cluster's replicas may still be attaching: refused claims run nothing, so retry.
        for _ in 0..40 {
            if first.status != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            first = post(&client, &key).await;
        }
        assert_eq!(first.status, 201, "{key}: {first:?}");
        assert!(post(&client, &key).await.is_replay(), "{key}");
    }
    assert_eq!(upstream.executions(), KEYS);
    let answers = r#"idemgate_store_replica_acks_total{write="answer",outcome="acknowledged"}"#;
    assert_eq!(metric(&gateway, answers).await, KEYS as f64);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_replica_that_goes_away_during_a_claims_wait_leaves_it_unforwarded_and_the_retry_runs_once() {
    let (primary, replica) = primary_and_replica();
    let upstream = TestUpstream::start().await;
    let gateway = TestGateway::start(&toml(&primary, &upstream, 1)).await;
    let client = gateway.client();
    let frozen = freeze(&replica, Duration::from_secs(10));
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { post(&client, "orphaned-1").await })
    };
    // While the claim waits for it, the replica dies (its connection to the primary breaks).
    tokio::time::sleep(Duration::from_millis(500)).await;
    replica.stop();
    let refused = waiting.await.unwrap();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(upstream.executions(), 0, "a claim no replica held was forwarded");
    let _ = frozen.join();
    // A replica again: the retry runs the request once, and its own retry replays.
    let replacement = RedisServer::start();
    replacement.replicate(&primary);
    let mut served = post(&client, "orphaned-1").await;
    for _ in 0..40 {
        if served.status == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        served = post(&client, "orphaned-1").await;
    }
    assert_eq!(served.status, 201, "{served:?}");
    assert!(post(&client, "orphaned-1").await.is_replay());
    assert_eq!(upstream.executions(), 1);
    gateway.shutdown().await;
}
