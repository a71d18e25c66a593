//! What asynchronous replication loses, without and with `[store] replica_acks`.
//!
//! The primary's replica replicates through a link that delays the stream by `LAG`
//! (support/lagged_sentinel.rs), as a replica under load or across a slow network trails.
//! Whatever the primary acknowledged within the last `LAG` lives on the primary alone: when its
//! host dies (SIGKILL, its link dropping what it had not delivered) and Sentinel promotes the
//! replica, it is gone.
//!
//! - Without `replica_acks` (the default): answers clients had received are lost, and their
//!   retries run the request again; claims are lost, and requests that were running run twice.
//!   The scenario asserts that this happens: it shows the problem.
//! - With `replica_acks = 1`: the gateway waits (Redis `WAIT`) for the replica to have the
//!   claim before forwarding, and the answer before replying. Nothing runs twice, no answer a
//!   client received is lost; the report says what the waits cost a first request.
//! - Frozen replicas with `replica_acks = 1`: the link stops delivering. Each claim waits for
//!   the replica in vain and is given back: the client gets 503, nothing is forwarded. Once the
//!   link thaws and the replica has caught up, each key runs once, then replays.
//!
//! The ledger counts every execution of a key, whatever its `UNIQUE(key)` backstop answers
//! then: a second run the backstop catches counts as a double execution, as it would be at an
//! upstream without one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::common::{Report, gateway_toml_with, order, post, post_until_served, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::{Client, Reply};
use crate::support::gateway_proc::GatewayProc;
use crate::support::lagged_sentinel::LaggedSentinelSet;
use crate::support::redis::RedisServer;
use crate::support::replication_link::ReplicationLink;
use crate::support::unique;

/// How far the replica trails the primary.
const LAG: Duration = Duration::from_millis(300);
/// One first request every this often: about 35 a second.
const EVERY: Duration = Duration::from_millis(28);
/// How long first requests are sent before the primary's host dies.
const LOAD: Duration = Duration::from_secs(3);
/// How long first requests are sent through the gateway without `replica_acks`, to compare.
const BASELINE: Duration = Duration::from_secs(2);
/// How long the upstream works on a first request.
const UPSTREAM: Duration = Duration::from_millis(100);
/// Long enough for a settle to wait out the failover (as in chaos 15): a double execution
/// with `replica_acks` must come from replication, not from a lease that ran out.
const LEASE: Duration = Duration::from_secs(10);
/// `store.timeout` in `gateway_toml`.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);
const ACK_TIMEOUT: Duration = Duration::from_secs(1);
/// A retry whose key is still claimed (its answer or its release lost) is served once the
/// lease passes; a retry that waited (the route's `wait`, 5 s) and got 409 tries again.
const SERVE_LIMIT: Duration = Duration::from_secs(30);
/// Keyed first requests sent while the replica is frozen.
const FROZEN_KEYS: u32 = 8;

fn acks() -> String {
    format!("replica_acks = 1\nreplica_ack_timeout = \"{}ms\"", ACK_TIMEOUT.as_millis())
}

/// (a) Today's behaviour: a failover while the replica trails loses answers and claims.
pub async fn without_replica_acks() -> Report {
    let set = start_set().await;
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, ..Faults::default() }).await;
    let gateway = GatewayProc::start(&toml(&set.url(), &ledger, "lag0", ""));
    let run = fail_over_under_load(&set, &gateway.client(), &ledger, "lag0").await;
    assert!(
        !run.lost.is_empty() && !run.doubles.is_empty(),
        "a failover while the replica trails {LAG:?} loses answers and claims; this run lost none: {}",
        run.summary()
    );
    run.report(format!("without replica_acks: {}", run.summary()))
}

/// (b) With `replica_acks = 1`: the same failover, nothing runs twice, no answer is lost.
pub async fn with_replica_acks() -> Report {
    let set = start_set().await;
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, ..Faults::default() }).await;

    // The same load through a gateway without replica_acks first, on the same set and ledger,
    // for what the waits add to a first request.
    let baseline = {
        let gateway = GatewayProc::start(&toml(&set.url(), &ledger, "lagbase", ""));
        let client = gateway.client();
        warm(&client, "lagbase").await;
        let sent = load(&client, "lagbase", BASELINE).await.join_all().await;
        Latency::of(sent.iter().filter(|s| s.answered()).map(|s| s.took))
    };

    let gateway = GatewayProc::start(&toml(&set.url(), &ledger, "lag1", &acks()));
    let run = fail_over_under_load(&set, &gateway.client(), &ledger, "lag1").await;
    assert!(
        run.doubles.is_empty() && run.lost.is_empty(),
        "with replica_acks = 1 nothing runs twice and no answer is lost: {}; double executions (key, attempts): \
         {:?}; answered then lost: {:?}",
        run.summary(),
        run.doubles,
        run.lost
    );
    run.report(format!(
        "replica_acks = 1: {}; first requests without replica_acks: {baseline}, so the waits added {} (median) \
         and {} (p99)",
        run.summary(),
        ms(run.latency.median.saturating_sub(baseline.median)),
        ms(run.latency.p99.saturating_sub(baseline.p99)),
    ))
}

/// (c) With `replica_acks = 1` and the replica's link frozen: 503s, nothing forwarded; after
/// the thaw, each key runs once and then replays.
pub async fn frozen_replica_with_replica_acks() -> Report {
    let (primary, replica, link) = tokio::task::spawn_blocking(|| {
        let primary = RedisServer::start();
        let replica = RedisServer::start();
        let link = ReplicationLink::start(primary.addr(), Duration::ZERO);
        replica.replicate_at(link.port());
        (primary, replica, link)
    })
    .await
    .unwrap();
    let ledger = Ledger::start(Faults::default()).await;
    let gateway = GatewayProc::start(&toml(&primary.url(), &ledger, "frozen", &acks()));
    let client = gateway.client();
    warm(&client, "frozen").await;

    link.freeze();
    let keys: Vec<String> = (0..FROZEN_KEYS).map(|n| format!("\"frozen-{n}\"")).collect();
    let mut sent = JoinSet::new();
    for (n, key) in keys.iter().enumerate() {
        let (client, key) = (client.clone(), key.clone());
        sent.spawn(async move {
            let started = Instant::now();
            let reply = post(&client, "/orders", &key, &order(n as u32)).await;
            (key, reply, started.elapsed())
        });
    }
    // Generous: the machine is shared, and a store call may have to wait for a connection.
    let bound = ACK_TIMEOUT + STORE_TIMEOUT + Duration::from_secs(2);
    let mut slowest = Duration::ZERO;
    for (key, reply, took) in sent.join_all().await {
        let reply = reply.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(reply.status, 503, "{key}: a claim the replica never acknowledged is refused: {reply:?}");
        assert_eq!(reply.problem(), "store-unavailable", "{key}");
        assert!(reply.header("retry-after").is_some(), "{key}: 503 carries Retry-After");
        assert!(took < bound, "{key}: refused after {took:?}, over {bound:?}");
        slowest = slowest.max(took);
    }
    // What the primary says of its replica meanwhile: still connected (its acknowledgements
    // come back every second, naming the offset it is stuck at), so only WAIT finds it behind.
    let seen = primary.replication("slave0").unwrap_or_default();
    let written = primary.replication_offset().expect("the primary answers");
    let applied = replica.replication_offset().expect("the replica answers");
    assert!(
        applied < written,
        "the frozen link held back the claims: the replica is at {applied}, the primary at {written}"
    );
    for key in &keys {
        assert_eq!(ledger.arrivals(key), 0, "{key}: nothing is forwarded while the replica is frozen");
    }

    link.thaw();
    let thawed = Instant::now();
    let (primary, replica) = tokio::task::spawn_blocking(move || {
        let written = primary.replication_offset().expect("the primary answers");
        let deadline = Instant::now() + Duration::from_secs(10);
        while replica.replication_offset().is_none_or(|at| at < written) {
            assert!(Instant::now() < deadline, "the replica did not catch up with offset {written} after the thaw");
            std::thread::sleep(Duration::from_millis(20));
        }
        (primary, replica)
    })
    .await
    .unwrap();
    let caught_up = thawed.elapsed();

    let mut tries = 0;
    for (n, key) in keys.iter().enumerate() {
        let (reply, attempts) = until_served(&client, key, &order(n as u32)).await;
        tries += attempts;
        assert_eq!(reply.status, 201, "{key}: {reply:?}");
        assert!(!reply.is_replay(), "{key}: its first run");
        assert_eq!(executions(&ledger, key), 1, "{key}: runs once after the thaw");
        let again = post(&client, "/orders", key, &order(n as u32)).await.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(again.is_replay(), "{key}: the retry replays: {again:?}");
        assert_eq!(again.body, reply.body, "{key}: the same answer");
        assert_eq!(executions(&ledger, key), 1, "{key}");
    }
    drop((primary, replica, link));
    let totals = ledger.totals();
    Report {
        requests: 1 + 2 * FROZEN_KEYS + tries,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: FROZEN_KEYS,
        note: format!(
            "replica_acks = 1, replica_ack_timeout {}, the replica's link frozen: {FROZEN_KEYS} first requests all 503 \
             store-unavailable (slowest {}), none forwarded, while the primary reported its replica as {seen:?}; \
             thawed, caught up in {}: each key ran once, then replayed",
            ms(ACK_TIMEOUT),
            ms(slowest),
            ms(caught_up)
        ),
    }
}

async fn start_set() -> Arc<LaggedSentinelSet> {
    Arc::new(tokio::task::spawn_blocking(|| LaggedSentinelSet::start("orders", LAG)).await.unwrap())
}

fn toml(url: &str, ledger: &Ledger, prefix: &str, store: &str) -> String {
    let routes = route("orders", "/orders", &format!("lease = \"{}s\"", LEASE.as_secs()));
    gateway_toml_with(url, ledger.addr, &unique(prefix), store, &routes)
}

/// A first request through, so that the gateway has found the store.
async fn warm(client: &Client, name: &str) {
    let warm = post_until_served(client, "/orders", &format!("\"{name}-warm\""), &order(0)).await;
    assert_eq!(warm.status, 201, "{warm:?}");
}

/// A first request and what it got.
struct Sent {
    key: String,
    n: u32,
    /// When it was sent, and how long its answer took.
    at: Instant,
    took: Duration,
    reply: Result<Reply, String>,
}

impl Sent {
    /// The client got the upstream's answer.
    fn answered(&self) -> bool {
        self.reply.as_ref().is_ok_and(|r| r.status.is_success())
    }
}

/// First requests with distinct keys `name-0`, `name-1`, ..., one every [`EVERY`] for `lasting`;
/// they run on in the set returned.
async fn load(client: &Client, name: &str, lasting: Duration) -> JoinSet<Sent> {
    let mut sent = JoinSet::new();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let started = Instant::now();
    for n in 0u32.. {
        tick.tick().await;
        if started.elapsed() >= lasting {
            break;
        }
        let (client, key) = (client.clone(), format!("\"{name}-{n}\""));
        sent.spawn(async move {
            let at = Instant::now();
            let reply = post(&client, "/orders", &key, &order(n)).await;
            Sent { key, n, at, took: at.elapsed(), reply }
        });
    }
    sent
}

/// What a failover under load did.
struct Failover {
    sent: u32,
    answered: u32,
    /// Keys whose first request was refused or failed (never answered by the upstream).
    refused: u32,
    /// Answered keys whose retry ran again instead of replaying.
    lost: Vec<String>,
    /// Keys executed twice or more, with the `Idempotency-Attempt` of each arrival.
    doubles: Vec<(String, Vec<u32>)>,
    retries: u32,
    /// First requests answered before the crash.
    latency: Latency,
    promoted_in: Duration,
    /// Replicas of the promoted replica when the Sentinel named it, and how long after that it
    /// had one (None: not within 10 s).
    replicas_when_named: Option<u32>,
    replica_back_after: Option<Duration>,
    executions: u32,
    caught: u32,
}

/// Sends first requests for [`LOAD`], then the primary's host dies; waits for the promotion,
/// retries every key until served, and counts at the upstream.
async fn fail_over_under_load(set: &Arc<LaggedSentinelSet>, client: &Client, ledger: &Ledger, name: &str) -> Failover {
    warm(client, name).await;
    let first = load(client, name, LOAD).await;
    let crashed = Instant::now();
    let (promoted_in, replicas_when_named, replica_back_after) = {
        let set = Arc::clone(set);
        tokio::task::spawn_blocking(move || {
            set.crash_primary();
            let promoted_in = set.wait_promoted();
            let named = Instant::now();
            let when_named = set.promoted_replicas();
            let mut back = None;
            while named.elapsed() < Duration::from_secs(10) {
                if set.promoted_replicas().is_some_and(|n| n >= 1) {
                    back = Some(named.elapsed());
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (promoted_in, when_named, back)
        })
        .await
        .unwrap()
    };
    let sent = first.join_all().await;
    let latency = Latency::of(sent.iter().filter(|s| s.answered() && s.at + s.took < crashed).map(|s| s.took));

    // Every key again, until served: those answered, those in flight at the crash, and those
    // refused while there was no primary.
    let mut retried = JoinSet::new();
    for (i, s) in sent.iter().enumerate() {
        let (client, key, n) = (client.clone(), s.key.clone(), s.n);
        retried.spawn(async move { (i, until_served(&client, &key, &order(n)).await) });
    }
    // `join_all` gives the tasks' results in the order they ended: back in the order sent.
    let mut retried = retried.join_all().await;
    retried.sort_by_key(|(i, _)| *i);

    let (mut lost, mut doubles, mut retries) = (Vec::new(), Vec::new(), 0);
    for (s, (_, (retry, tries))) in sent.iter().zip(&retried) {
        retries += tries;
        assert_eq!(retry.status, 201, "{}: {retry:?}", s.key);
        // The ledger's answer names the key it was made for: a retry never gets another key's.
        let named = format!("\"key\":{}", serde_json::to_string(&s.key).unwrap());
        assert!(String::from_utf8_lossy(&retry.body).contains(&named), "{}: {retry:?}", s.key);
        let ran = executions(ledger, &s.key);
        assert!(ran >= 1, "{}: served, so executed", s.key);
        if s.answered() && !retry.is_replay() {
            lost.push(s.key.clone());
        }
        if ran >= 2 {
            doubles.push((s.key.clone(), ledger.attempts(&s.key)));
        }
    }
    let answered = sent.iter().filter(|s| s.answered()).count() as u32;
    let totals = ledger.totals();
    Failover {
        sent: sent.len() as u32,
        answered,
        refused: sent.len() as u32 - answered,
        lost,
        doubles,
        retries,
        latency,
        promoted_in,
        replicas_when_named,
        replica_back_after,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
    }
}

impl Failover {
    fn summary(&self) -> String {
        // Attempt 1 twice: the claim was lost and the retry found nothing. Attempt 2: the claim
        // survived, the answer did not, and the retry took over once the lease passed.
        let claim_lost = self.doubles.iter().filter(|(_, a)| a.iter().filter(|n| **n == 1).count() >= 2).count();
        let named = self.replicas_when_named.map_or("?".to_owned(), |n| n.to_string());
        let back = self.replica_back_after.map_or("not within 10 s".to_owned(), |d| format!("{} after", ms(d)));
        format!(
            "replica {} behind, {} first requests at ~{}/s ({}), primary's host killed; promoted in {}, its own \
             replicas when named: {named} (one {back}); {} answered, {} refused or failed; {} answered keys \
             lost their answer (the retry ran again), {} keys ran twice ({claim_lost} as attempt 1 again: claim \
             lost; {} taken over after the lease: claim kept, answer lost); {} retries",
            ms(LAG),
            self.sent,
            1000 / EVERY.as_millis(),
            self.latency,
            secs(self.promoted_in),
            self.answered,
            self.refused,
            self.lost.len(),
            self.doubles.len(),
            self.doubles.len() - claim_lost,
            self.retries
        )
    }

    fn report(&self, note: String) -> Report {
        Report {
            requests: self.sent + self.retries,
            executions: self.executions,
            caught: self.caught,
            errors: self.refused,
            note,
        }
    }
}

/// Sends `key` until the gateway serves it. A 503 (no primary, or no replica acknowledged:
/// nothing forwarded) and a 409 (its claim still held, by a request whose answer or release
/// never reached the replica promoted since, until its lease passes) are tried again after
/// their Retry-After, at most a second.
async fn until_served(client: &Client, key: &str, body: &str) -> (Reply, u32) {
    let deadline = Instant::now() + SERVE_LIMIT;
    for tries in 1u32.. {
        let pause = match post(client, "/orders", key, body).await {
            Ok(r) if r.status != 503 && r.status != 409 => return (r, tries),
            Ok(r) => r
                .header("retry-after")
                .and_then(|s| s.parse().ok())
                .map_or(Duration::from_millis(100), |s| Duration::from_secs(s).min(Duration::from_secs(1))),
            Err(_) => Duration::from_millis(100),
        };
        assert!(Instant::now() < deadline, "{key}: not served within {SERVE_LIMIT:?}");
        tokio::time::sleep(pause).await;
    }
    unreachable!("tries until served or past the deadline")
}

/// Times the upstream executed `key`, the backstop's catches included.
fn executions(ledger: &Ledger, key: &str) -> usize {
    ledger.runs(key).iter().filter(|r| r.executed).count()
}

/// The median and 99th percentile of first requests' answers.
#[derive(Clone, Copy)]
struct Latency {
    median: Duration,
    p99: Duration,
}

impl Latency {
    fn of(took: impl Iterator<Item = Duration>) -> Latency {
        let mut took: Vec<Duration> = took.collect();
        assert!(!took.is_empty(), "no first request was answered");
        took.sort();
        let at = |p: f64| took[((took.len() - 1) as f64 * p).round() as usize];
        Latency { median: at(0.5), p99: at(0.99) }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "median {}, p99 {}", ms(self.median), ms(self.p99))
    }
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
