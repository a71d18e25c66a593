//! The gateway end to end: a real client, the gateway on port 0, a counting upstream, and a
//! private `redis-server` (or the memory store). Assertions are on what reached the upstream,
//! not only on what the client saw.

use crate::support;

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method};
use idemgate::policy::fingerprint::Fingerprint;
use idemgate::store::{Claim, EntryState, Lifecycle, OwnerToken, RecordKey, Records, Terms};
use support::client::{Client, DEFAULT_AUTH, Reply};
use support::gateway::{StoreKind, TestGateway, config};
use support::gateway_proc::Toml;
use support::redis::RedisServer;
use support::upstream::{Behavior, TestUpstream};
use tokio::io::AsyncWriteExt;

const ORDER: &str = r#"{"sku":"A-1","quantity":2,"client_ts":"2026-11-30T10:00:00Z"}"#;

/// The record key the gateway uses for `raw_key` sent by the default caller to route `orders`.
fn record_key(gw: &TestGateway, raw_key: &str) -> RecordKey {
    let policy = gw.gateway.policy("orders").unwrap();
    let mut h = HeaderMap::new();
    h.insert(policy.header.clone(), HeaderValue::from_str(raw_key).unwrap());
    h.insert("authorization", HeaderValue::from_static(DEFAULT_AUTH));
    let k = policy.key(&h).unwrap().unwrap();
    let scope = policy.scope(&h, None, policy.on_missing_scope).unwrap();
    gw.gateway.runtime().record_key("orders", &scope, &k)
}

async fn setup(store: &StoreKind, policy: &str, behavior: Behavior) -> (TestUpstream, TestGateway, Client) {
    let upstream = TestUpstream::with(behavior).await;
    let gw = TestGateway::start(&config(store, upstream.addr, policy)).await;
    let client = gw.client();
    (upstream, gw, client)
}

fn slow(ms: u64) -> Behavior {
    Behavior { delay: Duration::from_millis(ms), ..Behavior::default() }
}

// ---- scenarios on both backends --------------------------------------------------------

async fn first_request_runs_once_and_retries_replay_it_byte_for_byte(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", Behavior::default()).await;
    let first = client.post_json("/orders", Some("\"order-1\""), ORDER).await;
    assert_eq!(first.status, 201);
    assert!(!first.is_replay());
    assert_eq!(first.header("set-cookie"), Some("session=s1"), "the first client gets the upstream's answer whole");

    for _ in 0..3 {
        let again = client.post_json("/orders", Some("\"order-1\""), ORDER).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body, "byte-identical body");
        assert!(again.is_replay(), "{:?}", again.headers);
        assert_eq!(again.header("x-execution"), Some("1"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(again.header("set-cookie"), None, "cookies are never replayed");
    }
    assert_eq!(upstream.executions(), 1, "the upstream ran the request once");
    // The bare-token form of the same key is the same key.
    let bare = client.post_json("/orders", Some("order-1"), ORDER).await;
    assert!(bare.is_replay());
    assert_eq!(upstream.executions(), 1);
}

async fn replays_carry_a_fresh_date_and_only_allowed_headers(store: StoreKind) {
    let (upstream, _gw, client) =
        setup(&store, r#"replay_headers = ["content-type", "x-execution"]"#, Behavior::default()).await;
    let first = client.post_json("/orders", Some("dated"), ORDER).await;
    let first_date = httpdate::parse_http_date(first.header("date").unwrap()).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = client.post_json("/orders", Some("dated"), ORDER).await;
    assert!(again.is_replay());
    let replay_date = httpdate::parse_http_date(again.header("date").unwrap()).unwrap();
    assert!(replay_date > first_date, "a replay is dated when it is sent");
    assert_eq!(again.header("x-execution"), Some("1"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(again.header("set-cookie"), None, "never stored, even if listed");
    assert_eq!(upstream.executions(), 1);
}

async fn changed_body_is_422_but_reordered_keys_and_ignored_fields_replay(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, r#"ignore = ["/client_ts"]"#, Behavior::default()).await;
    let first = client.post_json("/orders", Some("k"), ORDER).await;
    assert_eq!(first.status, 201);

    let reordered = r#"{ "client_ts": "2026-11-30T10:00:00Z", "quantity": 2, "sku": "A-1" }"#;
    let r = client.post_json("/orders", Some("k"), reordered).await;
    assert!(r.is_replay() && r.body == first.body, "reordered JSON keys are the same request");

    let new_ts = r#"{"sku":"A-1","quantity":2,"client_ts":"2026-11-30T10:00:09Z"}"#;
    let r = client.post_json("/orders", Some("k"), new_ts).await;
    assert!(r.is_replay() && r.body == first.body, "an ignored field does not change the request");

    let changed = r#"{"sku":"A-1","quantity":3,"client_ts":"2026-11-30T10:00:00Z"}"#;
    let r = client.post_json("/orders", Some("k"), changed).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.problem(), "key-reused");
    assert_eq!(upstream.executions(), 1);
}

async fn malformed_keys_are_400_and_never_forwarded(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "max_key_len = 16", Behavior::default()).await;
    let long = "a".repeat(17);
    type Headers<'a> = Vec<(&'a str, &'a [u8])>;
    let cases: Vec<(Headers, &str)> = vec![
        (vec![], "key-missing"),
        (vec![("idempotency-key", b"\"\"")], "key-malformed"),
        (vec![("idempotency-key", long.as_bytes())], "key-malformed"),
        (vec![("idempotency-key", "\"café\"".as_bytes())], "key-malformed"),
        (vec![("idempotency-key", b"a"), ("idempotency-key", b"b")], "key-malformed"),
        (vec![("idempotency-key", b"\"unterminated")], "key-malformed"),
        (vec![("idempotency-key", b"two words")], "key-malformed"),
    ];
    for (headers, problem) in cases {
        // Raw bytes: the test client's builder would refuse non-ASCII header values.
        let reply = raw_post(client_addr(&client), "/orders", &headers, ORDER).await;
        assert_eq!(reply.status, 400, "{headers:?}");
        assert_eq!(reply.problem(), problem, "{headers:?}");
        let doc = reply.json();
        assert_eq!(doc["status"], 400);
        assert!(doc["title"].is_string() && doc["detail"].is_string());
    }
    assert_eq!(upstream.executions(), 0);
}

async fn bodies_over_the_limit_are_413_before_anything_is_claimed(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, r#"max_request_body = "64B""#, Behavior::default()).await;
    let big = format!(r#"{{"sku":"{}"}}"#, "x".repeat(100));
    let r = client.post_json("/orders", Some("big"), &big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.problem(), "body-too-large");
    // Chunked (no Content-Length): cut off while streaming.
    let r = raw_chunked_post(gw.addr, "/orders", "big2", big.as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert_eq!(upstream.executions(), 0);
    assert_eq!(gw.gateway.runtime().records().get(&record_key(&gw, "big")).await.unwrap(), None, "nothing claimed");
    // The limit is inclusive of bodies that fit.
    let r = client.post_json("/orders", Some("small"), r#"{"sku":"x"}"#).await;
    assert_eq!(r.status, 201);
}

async fn fifty_concurrent_duplicates_run_once_and_get_identical_answers(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", slow(300)).await;
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.post_json("/orders", Some("\"dup\""), ORDER).await })
        })
        .collect();
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    assert_eq!(upstream.executions(), 1, "exactly one execution upstream");
    let first = &replies[0];
    for r in &replies {
        assert_eq!(r.status, 201);
        assert_eq!(r.body, first.body, "every duplicate gets the same answer");
    }
    assert_eq!(replies.iter().filter(|r| !r.is_replay()).count(), 1, "one first response, 49 replays");
}

async fn two_hundred_distinct_keys_run_two_hundred_times(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", slow(20)).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.post_json("/orders", Some(&format!("k-{i}")), ORDER).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 201);
    }
    assert_eq!(upstream.executions(), 200);
    let by_key = upstream.executions_by_key();
    assert_eq!(by_key.len(), 200);
    assert!(by_key.values().all(|&n| n == 1));
}

async fn client_disconnect_mid_flight_still_stores_the_result(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, "", slow(400)).await;
    // Send a whole request, then hang up before the upstream answers.
    let mut raw = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let req = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nauthorization: {DEFAULT_AUTH}\r\ncontent-type: application/json\r\nidempotency-key: \"gone\"\r\ncontent-length: {}\r\n\r\n{ORDER}",
        ORDER.len()
    );
    raw.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(raw);

    // The exchange finishes without its client and stores the answer.
    wait_for(|| async {
        let entry = gw.gateway.runtime().records().get(&record_key(&gw, "\"gone\"")).await;
        matches!(entry, Ok(Some(e)) if matches!(e.state, EntryState::Completed { .. }))
    })
    .await;
    let retry = client.post_json("/orders", Some("\"gone\""), ORDER).await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay(), "the retry is answered from the store");
    assert_eq!(upstream.executions(), 1);
}

async fn server_errors_release_the_key_and_the_retry_runs_again(store: StoreKind) {
    let behavior = Behavior { statuses: [503, 500].into(), ..Behavior::default() };
    let (upstream, gw, client) = setup(&store, "", behavior).await;
    let r = client.post_json("/orders", Some("flaky"), ORDER).await;
    assert_eq!(r.status, 503, "the upstream's own 5xx is passed through");
    let entry = gw.gateway.runtime().records().get(&record_key(&gw, "flaky")).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.attempt), (EntryState::Released, 1), "released, keeping the attempt");
    let r = client.post_json("/orders", Some("flaky"), ORDER).await;
    assert_eq!(r.status, 500);
    let ok = client.post_json("/orders", Some("flaky"), ORDER).await;
    assert_eq!(ok.status, 201);
    assert!(!ok.is_replay());
    let replay = client.post_json("/orders", Some("flaky"), ORDER).await;
    assert!(replay.is_replay() && replay.body == ok.body);
    assert_eq!(upstream.executions(), 3, "two failures and one success; the success is stored once");
    // Every execution told the upstream which attempt it was.
    let attempts: Vec<String> =
        upstream.seen().iter().map(|s| s.headers["idempotency-attempt"].to_str().unwrap().to_owned()).collect();
    assert_eq!(attempts, ["1", "2", "3"]);
}

async fn each_status_class_is_stored_or_released_as_the_policy_says(store: StoreKind) {
    // What began executing is stored (2xx, 3xx, most 4xx); "not processed" or "try again"
    // answers (400, 408, 409, 422, 425, 429) and 5xx release the key.
    let (upstream, _gw, client) = setup(&store, "", Behavior::default()).await;
    let mut expected = 0;
    for (status, stored) in [
        (200, true),
        (201, true),
        (303, true),
        (404, true),
        (403, true),
        (400, false),
        (408, false),
        (409, false),
        (422, false),
        (425, false),
        (429, false),
        (500, false),
        (503, false),
    ] {
        upstream.set(|b| b.statuses = [status].into());
        let key = format!("status-{status}");
        let first = client.post_json("/orders", Some(&key), ORDER).await;
        assert_eq!(first.status.as_u16(), status);
        let again = client.post_json("/orders", Some(&key), ORDER).await;
        let executions = upstream.executions();
        if stored {
            assert!(again.is_replay(), "{status} is stored");
            assert_eq!((again.status.as_u16(), &again.body), (status, &first.body), "{status}");
        } else {
            assert!(!again.is_replay(), "{status} is released: the retry runs again");
            assert_eq!(again.status, 201);
        }
        expected += if stored { 1 } else { 2 };
        assert_eq!(executions, expected, "after {status}");
    }
}

async fn crashed_owner_is_taken_over_after_its_lease(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, r#"lease = "300ms""#, Behavior::default()).await;
    // Simulate a gateway that claimed the key and died: its lease is never completed.
    let key = record_key(&gw, "crash");
    let body_fp = fingerprint_of(&gw, "crash", ORDER);
    let claim = gw
        .gateway
        .runtime()
        .lifecycle()
        .claim(
            &key,
            &body_fp,
            OwnerToken::generate(),
            Terms { lease: Duration::from_millis(300), ttl: Duration::from_secs(60) },
        )
        .await
        .unwrap();
    let Claim::Acquired(dead) = claim else { panic!("expected to acquire, got {claim:?}") };
    std::mem::forget(dead);

    // The retry waits (wait = 5s by default) until the lease passes, then takes over.
    let started = std::time::Instant::now();
    let r = client.post_json("/orders", Some("crash"), ORDER).await;
    assert_eq!(r.status, 201);
    assert!(!r.is_replay());
    assert!(started.elapsed() < Duration::from_secs(3), "taken over at lease expiry, not after the whole wait");
    assert_eq!(upstream.executions(), 1);
    let entry = gw.gateway.runtime().records().get(&key).await.unwrap().unwrap();
    assert!(matches!(entry.state, EntryState::Completed { .. }) && entry.attempt == 2, "{entry:?}");
    assert_eq!(upstream.seen()[0].headers["idempotency-attempt"], "2", "the takeover is announced as attempt 2");
}

async fn same_key_from_two_callers_is_two_records(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", Behavior::default()).await;
    let alice = client.post_json_as("/orders", Some("1"), Some("Bearer alice"), ORDER).await;
    let bob = client.post_json_as("/orders", Some("1"), Some("Bearer bob"), r#"{"sku":"B","quantity":1}"#).await;
    assert_eq!((alice.status.as_u16(), bob.status.as_u16()), (201, 201));
    assert!(!bob.is_replay(), "bob never gets alice's order");
    assert_ne!(alice.body, bob.body);
    // Without a credential there is no caller to scope the key by: refused, never pooled.
    let anon = client.post_json_as("/orders", Some("1"), None, ORDER).await;
    assert_eq!((anon.status.as_u16(), anon.problem().as_str()), (400, "scope-missing"));
    assert_eq!(upstream.executions(), 2);
    // The scheme's case is not part of the caller's identity.
    let alice_again = client.post_json_as("/orders", Some("1"), Some("bearer alice"), ORDER).await;
    assert!(alice_again.is_replay() && alice_again.body == alice.body);
    assert_eq!(upstream.executions(), 2);
}

/// The Stripe-Account pattern: a platform acts on its own account (no header) or on a
/// connected one (the header); each is a key space of its own, and the header is optional.
async fn an_optional_scope_part_makes_its_absence_a_scope_of_its_own(store: StoreKind) {
    let scope = r#"scope = ["header:Authorization", "header:Stripe-Account?"]"#;
    let (upstream, _gw, client) = setup(&store, scope, Behavior::default()).await;
    let post = |account: Option<&'static str>, auth: &'static str| {
        let client = client.clone();
        async move {
            let mut headers = vec![("content-type", "application/json"), ("idempotency-key", "ch-1")];
            headers.push(("authorization", auth));
            if let Some(account) = account {
                headers.push(("stripe-account", account));
            }
            client.send(Method::POST, "/orders", &headers, ORDER).await
        }
    };
    let own = post(None, "Bearer platform").await;
    let connected = post(Some("acct_1"), "Bearer platform").await;
    let other = post(Some("acct_2"), "Bearer platform").await;
    for r in [&own, &connected, &other] {
        assert_eq!((r.status.as_u16(), r.is_replay()), (201, false), "{:?}", r.body);
    }
    assert_eq!(upstream.executions(), 3, "three key spaces, one key each");
    // Each retry replays its own answer.
    for (account, first) in [(None, &own), (Some("acct_1"), &connected), (Some("acct_2"), &other)] {
        let again = post(account, "Bearer platform").await;
        assert!(again.is_replay() && again.body == first.body, "{account:?}");
    }
    // The required part stays required; another caller without the header is apart too.
    let no_caller = client
        .send(Method::POST, "/orders", &[("content-type", "application/json"), ("idempotency-key", "ch-1")], ORDER)
        .await;
    assert_eq!((no_caller.status.as_u16(), no_caller.problem().as_str()), (400, "scope-missing"));
    assert!(!post(None, "Bearer someone-else").await.is_replay());
    assert_eq!(upstream.executions(), 4);
}

async fn duplicate_in_flight_gets_409_after_the_wait_and_422_wins(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, r#"wait = "100ms""#, slow(800)).await;
    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("busy"), ORDER).await });
    tokio::time::sleep(Duration::from_millis(150)).await;

    let started = std::time::Instant::now();
    let dup = client.post_json("/orders", Some("busy"), ORDER).await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.problem(), "in-progress");
    let retry_after: u64 = dup.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry_after));
    assert!(started.elapsed() >= Duration::from_millis(100), "waited before answering 409");

    let other = client.post_json("/orders", Some("busy"), r#"{"sku":"other"}"#).await;
    assert_eq!(other.status, 422, "a different request under a running key is 422, not 409");

    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let after = client.post_json("/orders", Some("busy"), ORDER).await;
    assert!(after.is_replay() && after.body == first.body);
    assert_eq!(upstream.executions(), 1);
}

/// The p90 of route `orders`'s upstream answer times as Prometheus's `histogram_quantile`
/// computes it from `/metrics` (classes 2xx to 5xx added up), and how many answers it is over.
async fn upstream_p90(gw: &TestGateway) -> (f64, u64) {
    let text = String::from_utf8(gw.admin_client().get("/metrics", &[]).await.body.to_vec()).unwrap();
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        line[start..].split('"').next().unwrap().to_owned()
    };
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("idemgate_upstream_seconds_bucket{")) {
        let class = label(line, "class");
        if !line.contains(r#"route="orders""#) || !["2xx", "3xx", "4xx", "5xx"].contains(&class.as_str()) {
            continue;
        }
        let le = match label(line, "le").as_str() {
            "+Inf" => f64::INFINITY,
            bound => bound.parse().unwrap(),
        };
        let count: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, sum)) => *sum += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().unwrap().1;
    let rank = 0.9 * total as f64;
    let (mut lower, mut below) = (0.0, 0);
    for &(le, cumulative) in &buckets {
        if cumulative as f64 >= rank {
            if le.is_infinite() {
                return (lower, total);
            }
            return (lower + (le - lower) * (rank - below as f64) / (cumulative - below) as f64, total);
        }
        (lower, below) = (le, cumulative);
    }
    unreachable!("the +Inf bucket holds every answer")
}

async fn a_duplicate_is_told_the_upstreams_usual_time_once_there_are_twenty_answers(store: StoreKind) {
    // The upstream answers in about 200ms. Until the route has 20 answers, a duplicate that
    // waited out `wait` is sent back after the first request's lease left (about 10s); from
    // then on, after the route's p90 less what the first request has already run: 1s.
    for wait in ["0s", "100ms"] {
        let (upstream, gw, client) = setup(&store, &format!("wait = \"{wait}\""), slow(200)).await;
        let warm: Vec<_> = (0..19)
            .map(|i| {
                let c = client.clone();
                tokio::spawn(async move { c.post_json("/orders", Some(&format!("warm-{i}")), ORDER).await })
            })
            .collect();
        for w in warm {
            assert_eq!(w.await.unwrap().status, 201);
        }
        upstream.set(|b| b.delay = Duration::from_millis(1500));
        for (key, answers_before) in [("slow-1", 19), ("slow-2", 20)] {
            let c = client.clone();
            let first = tokio::spawn(async move { c.post_json("/orders", Some(key), ORDER).await });
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (p90, answers) = upstream_p90(&gw).await;
            assert_eq!(answers, answers_before, "wait {wait}");
            let dup = client.post_json("/orders", Some(key), ORDER).await;
            assert_eq!((dup.status.as_u16(), dup.problem().as_str()), (409, "in-progress"), "wait {wait}");
            let retry_after: u64 = dup.header("retry-after").unwrap().parse().unwrap();
            if answers < 20 {
                assert!(
                    (8..=10).contains(&retry_after),
                    "wait {wait}, {answers} answers: the lease left, not {retry_after}"
                );
            } else {
                assert!(p90 < 0.6, "wait {wait}: the p90 of 200ms answers is {p90}");
                assert!(
                    (1..=p90.ceil() as u64).contains(&retry_after),
                    "wait {wait}: Retry-After {retry_after} with a p90 of {p90}s"
                );
            }
            // Its answer is the next one counted.
            assert_eq!(first.await.unwrap().status, 201);
        }
        assert_eq!(upstream.executions(), 21);
    }
}

async fn oversized_responses_are_delivered_and_recorded_as_executed(store: StoreKind) {
    let behavior = Behavior { padding: 4000, ..Behavior::default() };
    let (upstream, gw, client) = setup(&store, r#"max_stored_body = "1KiB""#, behavior).await;
    let r = client.post_json("/orders", Some("huge"), ORDER).await;
    assert_eq!(r.status, 201);
    assert!(r.body.len() > 4000, "the whole body reached the client");
    assert_eq!(r.json()["padding"].as_str().unwrap().len(), 4000);
    wait_for(|| async {
        let entry = gw.gateway.runtime().records().get(&record_key(&gw, "huge")).await.unwrap();
        matches!(entry, Some(e) if e.state == EntryState::Executed { status: 201 })
    })
    .await;
    // The retry learns that the request ran, with its status and headers, and never runs it.
    let again = client.post_json("/orders", Some("huge"), ORDER).await;
    assert_eq!(again.status, 201);
    assert!(again.is_replay());
    assert_eq!(again.problem(), "response-not-stored");
    assert_eq!(again.header("x-execution"), Some("1"), "the stored headers come along");
    assert_eq!(again.header("set-cookie"), None);
    assert_eq!(upstream.executions(), 1);
}

async fn upstream_timeout_is_504_and_holds_the_key_as_unknown(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, "", slow(3500)).await;
    let r = client.post_json("/orders", Some("slowpoke"), ORDER).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.problem(), "outcome-unknown");
    let entry = gw.gateway.runtime().records().get(&record_key(&gw, "slowpoke")).await.unwrap().unwrap();
    assert!(matches!(entry.state, EntryState::Unknown { lookup: None, .. }), "{entry:?}");
    // The upstream may well have acted on it: the retry is refused, nothing is forwarded.
    let retry = client.post_json("/orders", Some("slowpoke"), ORDER).await;
    assert_eq!((retry.status.as_u16(), retry.problem().as_str()), (502, "outcome-unknown"));
    assert!(retry.json()["detail"].as_str().unwrap().contains("Check the state of the resource"));
    assert_eq!(upstream.executions(), 1);
}

async fn upstream_timeout_on_a_release_route_lets_the_retry_run(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, r#"on_unknown_outcome = "release""#, slow(3500)).await;
    let r = client.post_json("/orders", Some("slowpoke"), ORDER).await;
    assert_eq!((r.status.as_u16(), r.problem().as_str()), (504, "upstream-timeout"));
    let entry = gw.gateway.runtime().records().get(&record_key(&gw, "slowpoke")).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.attempt), (EntryState::Released, 1));
    upstream.set(|b| b.delay = Duration::ZERO);
    let retry = client.post_json("/orders", Some("slowpoke"), ORDER).await;
    assert_eq!(retry.status, 201);
    assert_eq!(upstream.executions(), 2);
    assert_eq!(upstream.seen()[1].headers["idempotency-attempt"], "2", "the upstream can tell the re-run");
}

async fn lease_is_renewed_while_the_upstream_is_slow(store: StoreKind) {
    // The upstream takes four leases' time; duplicates arriving after the first lease would
    // take the key over if the owner did not renew it.
    for renew in [true, false] {
        let policy = format!("lease = \"300ms\"\nwait = \"0s\"\nrenew = {renew}");
        let (upstream, _gw, client) = setup(&store, &policy, slow(1200)).await;
        let c = client.clone();
        let first = tokio::spawn(async move { c.post_json("/orders", Some("slow"), ORDER).await });
        let mut duplicates = Vec::new();
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let c = client.clone();
            duplicates.push(tokio::spawn(async move { c.post_json("/orders", Some("slow"), ORDER).await }));
        }
        assert_eq!(first.await.unwrap().status, 201);
        let mut statuses = Vec::new();
        for d in duplicates {
            statuses.push(d.await.unwrap().status.as_u16());
        }
        if renew {
            assert_eq!(statuses, [409, 409], "renewed lease: duplicates see the first request in flight");
            assert_eq!(upstream.executions(), 1);
        } else {
            assert_eq!(upstream.executions(), 3, "without renewal each expired lease is taken over");
        }
    }
}

async fn optional_key_absent_passes_through(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "required = false", Behavior::default()).await;
    let a = client.post_json("/orders", None, ORDER).await;
    let b = client.post_json("/orders", None, ORDER).await;
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201));
    assert!(!a.is_replay() && !b.is_replay());
    assert_eq!(upstream.executions(), 2);
    let keyed = client.post_json("/orders", Some("k"), ORDER).await;
    let again = client.post_json("/orders", Some("k"), ORDER).await;
    assert!(!keyed.is_replay() && again.is_replay(), "a key present on an optional route is honoured");
    assert_eq!(upstream.executions(), 3);
}

async fn forwarded_request_is_clean_and_keeps_the_key(store: StoreKind) {
    let (upstream, gw, client) = setup(&store, "", Behavior::default()).await;
    let r = client
        .send(
            Method::POST,
            "/orders?b=2&a=1",
            &[
                ("content-type", "application/json"),
                ("idempotency-key", "\"raw-key\""),
                ("host", "shop.example"),
                ("connection", "x-hop"),
                ("x-hop", "secret"),
                ("x-forwarded-for", "203.0.113.7"),
                ("authorization", "Bearer abc"),
            ],
            ORDER,
        )
        .await;
    assert_eq!(r.status, 201);
    let seen = &upstream.seen()[0];
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/orders?b=2&a=1");
    assert_eq!(seen.body, ORDER.as_bytes());
    assert_eq!(seen.headers["idempotency-key"], "\"raw-key\"", "forwarded unchanged for the upstream's constraint");
    assert_eq!(seen.headers["authorization"], "Bearer abc");
    assert!(seen.headers.get("x-hop").is_none(), "headers named in Connection are hop-by-hop");
    // The client is not a trusted proxy: what it said about itself is replaced.
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-real-ip"], "127.0.0.1");
    assert_eq!(seen.headers["forwarded"], "for=127.0.0.1;proto=http;host=shop.example");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-host"], "shop.example");
    assert_eq!(seen.headers["host"], upstream.addr.to_string().as_str());
    drop(gw);
}

async fn a_trusted_proxy_keeps_its_forwarding_headers(store: StoreKind) {
    let upstream = TestUpstream::start().await;
    let toml = config(&store, upstream.addr, "")
        .replace("shutdown_grace = \"2s\"", "shutdown_grace = \"2s\"\ntrusted_proxies = [\"127.0.0.0/8\"]");
    let gw = TestGateway::start(&toml).await;
    let headers = [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-forwarded-proto", "https"),
        ("x-real-ip", "203.0.113.7"),
        ("forwarded", "for=203.0.113.7;proto=https"),
    ];
    gw.client().send(Method::GET, "/anything", &headers, "").await;
    let seen = &upstream.seen()[0].headers;
    assert_eq!(seen["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(seen["x-real-ip"], "203.0.113.7");
    assert!(seen["forwarded"].to_str().unwrap().starts_with("for=203.0.113.7;proto=https, for=127.0.0.1"));
}

async fn pass_through_routes_stream_without_idempotency(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", Behavior::default()).await;
    let a = client.send(Method::PUT, "/anything/else", &[("idempotency-key", "k")], "one").await;
    let b = client.send(Method::PUT, "/anything/else", &[("idempotency-key", "k")], "one").await;
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201));
    assert!(!b.is_replay());
    assert_eq!(a.header("set-cookie"), Some("session=s1"));
    assert_eq!(upstream.executions(), 2);
}

async fn http2_clients_are_served(store: StoreKind) {
    let (upstream, gw, _client) = setup(&store, "", Behavior::default()).await;
    let h2 = Client::h2(gw.addr);
    let first = h2.post_json("/orders", Some("h2"), ORDER).await;
    let again = h2.post_json("/orders", Some("h2"), ORDER).await;
    assert_eq!(first.status, 201);
    assert!(again.is_replay() && again.body == first.body);
    assert_eq!(upstream.executions(), 1);
    assert_eq!(upstream.seen()[0].headers["x-forwarded-host"], gw.addr.to_string().as_str());
}

async fn unknown_routes_are_404_problems(store: StoreKind) {
    let (upstream, _gw, client) = setup(&store, "", Behavior::default()).await;
    let r = client.get("/orders", &[]).await;
    assert_eq!(r.status, 201, "GET /orders falls to the catch-all pass-through route");
    let gw2 = TestGateway::start(
        &config(&store, upstream.addr, "").replace("path = \"/{*rest}\"", "path = \"/api/{*rest}\""),
    )
    .await;
    let r = gw2.client().get("/nope", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.problem(), "no-route");
    assert_eq!(upstream.executions(), 1);
}

async fn admin_reports_health_readiness_metrics_and_keys(store: StoreKind) {
    let (_upstream, gw, client) = setup(&store, "", Behavior::default()).await;
    let admin = gw.admin_client();
    assert_eq!(admin.get("/healthz", &[]).await.status, 200);
    assert_eq!(admin.get("/readyz", &[]).await.status, 200);
    let head = admin.send(Method::HEAD, "/healthz", &[], "").await;
    assert_eq!((head.status.as_u16(), head.body.len()), (200, 0), "HEAD works where GET does");
    let post = admin.send(Method::POST, "/keys", &[], "").await;
    assert_eq!((post.status.as_u16(), post.header("allow")), (405, Some("GET, HEAD, PUT, DELETE")));
    assert_eq!(post.problem(), "admin-method");
    assert_eq!(admin.get("/nothing", &[]).await.status, 404);
    client.post_json("/orders", Some("m"), ORDER).await;
    client.post_json("/orders", Some("m"), ORDER).await;
    let metrics = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(metrics.contains(r#"idemgate_requests_total{route="orders",outcome="executed"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_requests_total{route="orders",outcome="replayed"} 1"#), "{metrics}");

    // The scope is the caller's credential, as the route's scope source reads it.
    let path = "/keys?route=orders&key=m";
    assert_eq!(admin.get(path, &[]).await.status, 401);
    assert_eq!(admin.get(path, &[("authorization", "Bearer wrong-token-wrong-token")]).await.status, 401);
    let auth = [("authorization", "Bearer test-admin-token-0123456789"), ("scope-authorization", DEFAULT_AUTH)];
    let r = admin.get(path, &auth).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["state"], "completed");
    assert_eq!(r.json()["status"], 201);
    assert_eq!(r.json()["attempt"], 1);
    let r = admin.send(Method::DELETE, path, &auth, "").await;
    assert_eq!((r.json()["released"].clone(), r.json()["was"].clone()), (true.into(), "completed".into()));
    let r = admin.get(path, &auth).await;
    assert_eq!((r.json()["state"].clone(), r.json()["attempt"].clone()), ("released".into(), 1.into()));
    let again = client.post_json("/orders", Some("m"), ORDER).await;
    assert!(!again.is_replay(), "a released key runs again");
    assert_eq!(upstream_attempts(&again), None, "the client does not see the attempt header");
    // The same record, found by the scope's hash instead of the credential.
    let in_url = admin.get("/keys?route=orders&key=m&scope=Bearer%20tester", &auth).await;
    assert_eq!(in_url.status, 400, "a credential in the URL is refused");
    let hash = record_scope_hash(&gw);
    let r = admin.get(&format!("/keys?route=orders&key=m&scope_hash={hash}"), &auth).await;
    assert_eq!((r.json()["state"].clone(), r.json()["attempt"].clone()), ("completed".into(), 2.into()));
}

// ---- instantiation ---------------------------------------------------------------------

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::StoreKind::Redis(super::RedisServer::shared().url())).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::StoreKind::Memory).await;
                }
            )*
        }
    };
}

on_both_backends!(
    an_optional_scope_part_makes_its_absence_a_scope_of_its_own,
    first_request_runs_once_and_retries_replay_it_byte_for_byte,
    replays_carry_a_fresh_date_and_only_allowed_headers,
    changed_body_is_422_but_reordered_keys_and_ignored_fields_replay,
    malformed_keys_are_400_and_never_forwarded,
    bodies_over_the_limit_are_413_before_anything_is_claimed,
    fifty_concurrent_duplicates_run_once_and_get_identical_answers,
    two_hundred_distinct_keys_run_two_hundred_times,
    client_disconnect_mid_flight_still_stores_the_result,
    server_errors_release_the_key_and_the_retry_runs_again,
    each_status_class_is_stored_or_released_as_the_policy_says,
    crashed_owner_is_taken_over_after_its_lease,
    same_key_from_two_callers_is_two_records,
    duplicate_in_flight_gets_409_after_the_wait_and_422_wins,
    a_duplicate_is_told_the_upstreams_usual_time_once_there_are_twenty_answers,
    oversized_responses_are_delivered_and_recorded_as_executed,
    upstream_timeout_is_504_and_holds_the_key_as_unknown,
    upstream_timeout_on_a_release_route_lets_the_retry_run,
    lease_is_renewed_while_the_upstream_is_slow,
    optional_key_absent_passes_through,
    forwarded_request_is_clean_and_keeps_the_key,
    a_trusted_proxy_keeps_its_forwarding_headers,
    pass_through_routes_stream_without_idempotency,
    http2_clients_are_served,
    unknown_routes_are_404_problems,
    admin_reports_health_readiness_metrics_and_keys,
);

// ---- store-independent -----------------------------------------------------------------

/// Every cleartext upstream's pooled client keys its connections by the same one-letter
/// authority (a cheaper hash than the real one): the connections must still be each
/// upstream's own, and each upstream must see its own address as `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cleartext_upstreams_keep_their_own_connections_and_host() {
    let app = TestUpstream::start().await;
    let other = TestUpstream::start().await;
    let routes = format!(
        "\n[[routes]]\nname = \"other\"\npath = \"/other/{{*rest}}\"\nupstream = \"other\"\n\n\
         [upstreams.other]\nurl = \"http://{}\"\n",
        other.addr
    );
    let toml = Toml { routes, ..Toml::new(app.addr) }.render();
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    for i in 0..6 {
        let (path, expected) = if i % 2 == 0 { ("/app/x", "app") } else { ("/other/x", "other") };
        let r = client.send(Method::PUT, path, &[], expected).await;
        assert_eq!(r.status, 201, "{path}");
    }
    let (at_app, at_other) = (app.seen(), other.seen());
    assert_eq!((at_app.len(), at_other.len()), (3, 3));
    assert!(at_app.iter().all(|s| s.path == "/app/x" && s.body == b"app".as_slice()));
    assert!(at_other.iter().all(|s| s.path == "/other/x" && s.body == b"other".as_slice()));
    assert!(at_app.iter().all(|s| s.headers["host"] == app.addr.to_string().as_str()));
    assert!(at_other.iter().all(|s| s.headers["host"] == other.addr.to_string().as_str()));
    drop(gw);
}

// ---- Redis only ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_or_open_per_route_and_recovers() {
    let redis = RedisServer::start();
    let store = StoreKind::Redis(redis.url());
    let (upstream, gw, client) = setup(&store, "", Behavior::default()).await;
    assert_eq!(client.post_json("/orders", Some("before"), ORDER).await.status, 201);
    redis.stop();

    let closed = client.post_json("/orders", Some("down-1"), ORDER).await;
    assert_eq!(closed.status, 503);
    assert_eq!(closed.problem(), "store-unavailable");
    assert!(closed.header("retry-after").is_some());
    assert_eq!(upstream.executions(), 1, "fail-closed forwards nothing");

    let open = client.post_json("/open-orders", Some("down-2"), ORDER).await;
    assert_eq!(open.status, 201);
    assert_eq!(open.header("idempotency-status"), Some("bypassed"));
    assert_eq!(upstream.executions(), 2, "fail-open forwards");
    assert_eq!(upstream.seen()[1].headers["idempotency-key"], "down-2", "with the key, for the upstream's constraint");
    assert_eq!(gw.admin_client().get("/readyz", &[]).await.status, 503);

    redis.restart();
    wait_for(|| async { client.post_json("/orders", Some("after"), ORDER).await.status == 201 }).await;
    assert!(client.post_json("/orders", Some("after"), ORDER).await.is_replay(), "service resumed without a restart");
    assert_eq!(gw.admin_client().get("/readyz", &[]).await.status, 200);
    // The restarted Redis came back empty: the gateway says so in its metrics.
    let admin = gw.admin_client();
    wait_for(|| async {
        let text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
        text.contains("idemgate_store_data_loss_total 1")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_and_releases() {
    let store = StoreKind::Redis(RedisServer::shared().url());
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gw = TestGateway::start(&config(&store, dead, "")).await;
    let r = gw.client().post_json("/orders", Some("nowhere"), ORDER).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.problem(), "upstream-unavailable");
    assert_eq!(gw.gateway.runtime().records().get(&record_key(&gw, "nowhere")).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_across_two_gateways_on_one_redis_run_once() {
    let redis_url = RedisServer::shared().url();
    let upstream = TestUpstream::with(slow(300)).await;
    let toml = config(&StoreKind::Redis(redis_url), upstream.addr, "");
    let a = TestGateway::start(&toml).await;
    let b = TestGateway::start(&toml).await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let c = if i % 2 == 0 { a.client() } else { b.client() };
            tokio::spawn(async move { c.post_json("/orders", Some("shared"), ORDER).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 201);
        bodies.push(r.body);
    }
    assert_eq!(upstream.executions(), 1);
    assert!(bodies.iter().all(|b| *b == bodies[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_the_store_not_by_polling() {
    // A Redis of its own: the script-call count below must not include other tests' calls.
    let redis = RedisServer::start();
    let (upstream, _gw, client) = setup(&StoreKind::Redis(redis.url()), "", slow(300)).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the subscriber connects at start
    let calls_before = evalsha_calls(&redis);
    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("woken"), ORDER).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let dup = client.post_json("/orders", Some("woken"), ORDER).await;
    let waited = started.elapsed();
    first.await.unwrap();
    assert!(dup.is_replay());
    // Woken when the first finished (~250ms), not at the 1s safety poll.
    assert!(waited < Duration::from_millis(800), "waited {waited:?}");
    // First request: a native claim, then the settle script. Duplicate: a claim that finds
    // the key in progress (native, then the claim script, which flags a waiter), the same
    // again after registering its watch, and a native claim after the wake that the stored
    // answer comes back from. So 3 script calls: no polling in between (each poll would add
    // one), and no NOSCRIPT retries (scripts are loaded when a connection is made).
    assert_eq!(evalsha_calls(&redis) - calls_before, 3);
    assert_eq!(upstream.executions(), 1);
}

// ---- helpers ---------------------------------------------------------------------------

fn upstream_attempts(reply: &Reply) -> Option<&str> {
    reply.header("idempotency-attempt")
}

/// The hex scope hash of the default caller on route `orders`.
fn record_scope_hash(gw: &TestGateway) -> String {
    let policy = gw.gateway.policy("orders").unwrap();
    let h = HeaderMap::from_iter([(http::header::AUTHORIZATION, HeaderValue::from_static(DEFAULT_AUTH))]);
    policy.scope(&h, None, policy.on_missing_scope).unwrap().to_hex()
}

fn client_addr(client: &Client) -> std::net::SocketAddr {
    client.addr()
}

fn fingerprint_of(gw: &TestGateway, raw_key: &str, body: &str) -> Fingerprint {
    let policy = gw.gateway.policy("orders").unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", raw_key)
        .body(())
        .unwrap();
    idemgate::policy::fingerprint::compute("orders", &policy.fingerprint, &req.into_parts().0, body.as_bytes())
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    let info: String = ::redis::cmd("INFO").arg("commandstats").query(&mut redis.connection()).unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn wait_for<F, Fut>(mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ok().await {
        assert!(std::time::Instant::now() < deadline, "condition not met within 10s");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Sends a POST with raw header bytes and reads the whole response.
async fn raw_post(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &[u8])], body: &str) -> Reply {
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\nauthorization: {DEFAULT_AUTH}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n", body.len()).into_bytes();
    for (k, v) in headers {
        req.extend_from_slice(k.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body.as_bytes());
    parse_response(&exchange_raw(addr, &req).await)
}

async fn raw_chunked_post(addr: std::net::SocketAddr, path: &str, key: &str, body: &[u8]) -> String {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\nauthorization: {DEFAULT_AUTH}\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(16) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    String::from_utf8_lossy(&exchange_raw(addr, &req).await).into_owned()
}

async fn exchange_raw(addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    out
}

fn parse_response(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse::<u16>().unwrap();
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            headers.append(
                http::HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                HeaderValue::from_str(v.trim()).unwrap(),
            );
        }
    }
    Reply { status: http::StatusCode::from_u16(status).unwrap(), headers, body: bytes::Bytes::from(body.to_owned()) }
}
