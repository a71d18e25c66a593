//! Observe mode (`mode = "observe"`): a route that answers every request exactly as a
//! pass-through route would, counts what enforcement would have done, and keeps what a switch
//! to enforce needs, so that no request first sent while observing runs again after it.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderMap, Method};
use support::client::{Client, Reply};
use support::gateway::{StoreKind, TestGateway};
use support::gateway_proc::{GatewayProc, Toml};
use support::raw_upstream::Hanging;
use support::redis::RedisServer;
use support::upstream::TestUpstream;

const TOKEN: (&str, &str) = ("authorization", "Bearer test-admin-token-0123456789");
const JSON: (&str, &str) = ("content-type", "application/json");
const CALLER: (&str, &str) = ("x-caller", "acme");

/// An observing route `/orders` on upstream `observed`, and its pass-through twin
/// `/orders-plain` on upstream `plain`: the same requests, the same upstream behaviour.
fn twin_config(store: &StoreKind, observed: SocketAddr, plain: SocketAddr) -> String {
    let store = store.toml(&support::unique("obs"));
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "test-admin-token-0123456789"

[store]
{store}

[upstreams.observed]
url = "http://{observed}"
timeout = "3s"

[upstreams.plain]
url = "http://{plain}"
timeout = "3s"

[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders"
upstream = "observed"

[routes.idempotency]
mode = "observe"
scope = "header:x-caller"
max_key_len = 64
max_request_body = "1KiB"

[[routes]]
name = "plain"
methods = ["POST"]
path = "/orders-plain"
upstream = "plain"
"#
    )
}

/// The series `idemgate_observed_total{route, would}` as the admin listener exposes it.
async fn observed(admin: &Client, route: &str, would: &str) -> u64 {
    series(admin, &format!("idemgate_observed_total{{route=\"{route}\",would=\"{would}\"}}")).await
}

async fn series(admin: &Client, name: &str) -> u64 {
    let text = admin.get("/metrics", &[]).await.body;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no series {name} in /metrics")) as u64
}

/// The headers a client compares: all but `Date`.
fn without_date(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut out: Vec<_> = headers
        .iter()
        .filter(|(name, _)| *name != http::header::DATE)
        .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    out.sort();
    out
}

fn assert_same(observed: &Reply, plain: &Reply, what: &str) {
    assert_eq!(observed.status, plain.status, "{what}: status");
    assert_eq!(without_date(&observed.headers), without_date(&plain.headers), "{what}: headers");
    assert_eq!(observed.body, plain.body, "{what}: body");
}

/// Sends the same request to both routes, and checks that the answers are the same.
async fn both(client: &Client, headers: &[(&str, &str)], body: &str, what: &str) -> Reply {
    let observed = client.send(Method::POST, "/orders", headers, body.to_owned()).await;
    let plain = client.send(Method::POST, "/orders-plain", headers, body.to_owned()).await;
    assert_same(&observed, &plain, what);
    observed
}

/// A realistic mix through an observing route: every answer is the pass-through route's, every
/// request reaches the upstream exactly once, and every counter is exact.
async fn a_mix_is_answered_as_passed_through_and_counted(store: StoreKind) {
    let (up_observed, up_plain) = (TestUpstream::start().await, TestUpstream::start().await);
    let gw = TestGateway::start(&twin_config(&store, up_observed.addr, up_plain.addr)).await;
    let (client, admin) = (gw.client(), gw.admin_client());
    let keyed = |key: &'static str| [JSON, CALLER, ("idempotency-key", key)];

    // A first request, and its retry after the answer: the retry runs again (the upstream
    // answers it with another execution number: a different answer).
    let first = both(&client, &keyed("k1"), r#"{"amount":1}"#, "first request").await;
    assert_eq!(first.status, 201);
    let retry = both(&client, &keyed("k1"), r#"{"amount":1}"#, "retry after the answer").await;
    assert_eq!(retry.json()["execution"], 2);
    // The same key with another body.
    both(&client, &keyed("k1"), r#"{"amount":2}"#, "reused key").await;
    // A duplicate while the first still runs (on both routes, in the same order).
    for up in [&up_observed, &up_plain] {
        up.set(|b| b.delay = Duration::from_millis(400));
    }
    for path in ["/orders", "/orders-plain"] {
        let (c, p) = (client.clone(), path.to_owned());
        let running = tokio::spawn(async move {
            c.send(Method::POST, &p, &[JSON, CALLER, ("idempotency-key", "k2")], r#"{"amount":3}"#).await
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let dup = client.send(Method::POST, path, &keyed("k2"), r#"{"amount":3}"#).await;
        assert_eq!(dup.status, 201, "{path}: the duplicate runs too");
        assert_eq!(running.await.unwrap().status, 201);
    }
    for up in [&up_observed, &up_plain] {
        up.set(|b| b.delay = Duration::ZERO);
    }
    // What enforcement would refuse: no key, a malformed key, no scope, a Connection header
    // naming the key, a body over the limit.
    both(&client, &[JSON, CALLER], "{}", "no key").await;
    let long = "k".repeat(100);
    both(&client, &[JSON, CALLER, ("idempotency-key", &long)], "{}", "malformed key").await;
    both(&client, &[JSON, ("idempotency-key", "k3")], "{}", "no scope").await;
    both(&client, &[JSON, CALLER, ("idempotency-key", "k4"), ("connection", "idempotency-key")], "{}", "unsafe").await;
    let large = format!(r#"{{"pad":"{}"}}"#, "x".repeat(4096));
    let reply = both(&client, &keyed("k5"), &large, "body over max_request_body").await;
    assert_eq!(reply.json()["body_len"], large.len(), "the whole body reached the upstream");

    // Every request reached the upstream once, as through the pass-through route.
    assert_eq!(up_observed.executions(), 10);
    assert_eq!(up_observed.executions(), up_plain.executions());
    let (o, p) = (up_observed.seen(), up_plain.seen());
    for (o, p) in o.iter().zip(&p) {
        assert_eq!(o.body, p.body, "the upstream got the same body");
        for name in ["idempotency-key", "connection", "idempotency-attempt"] {
            assert_eq!(o.headers.get(name), p.headers.get(name), "{name}");
        }
    }
    // Observing adds no header for the upstream either.
    assert!(o.iter().all(|s| s.headers.get("idempotency-attempt").is_none()));

    for (would, count) in [
        ("first", 2),
        ("would_replay", 1),
        ("answer_differed", 1),
        ("would_reject_reuse", 1),
        ("would_conflict", 1),
        ("missing_key", 1),
        ("malformed_key", 1),
        ("missing_scope", 1),
        ("unsafe_headers", 1),
        ("too_large", 1),
        ("unread_body", 0),
        ("would_answer_unknown", 0),
        ("unknown_outcome", 0),
        ("store_error", 0),
        ("would_throttle", 0),
    ] {
        assert_eq!(observed(&admin, "orders", would).await, count, "would={would}");
    }
    assert_eq!(series(&admin, "idemgate_requests_total{route=\"orders\",outcome=\"observed\"}").await, 10);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_is_answered_as_passed_through_and_counted_on_memory() {
    a_mix_is_answered_as_passed_through_and_counted(StoreKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_is_answered_as_passed_through_and_counted_on_redis() {
    a_mix_is_answered_as_passed_through_and_counted(StoreKind::Redis(RedisServer::shared().url())).await;
}

/// The switch's config: the orders route in `mode`, answers over 1 KiB not stored, an upstream
/// timeout of 1 s.
fn switch_config(upstream: SocketAddr, store: &str, mode: &str) -> String {
    let policy = format!("mode = \"{mode}\"\nmax_stored_body = \"1KiB\"\nlease = \"5s\"\nwait = \"5s\"");
    Toml {
        server: "admin_token = \"test-admin-token-0123456789\"",
        store,
        upstream_lines: "timeout = \"1s\"",
        policy: &policy,
        ..Toml::new(upstream)
    }
    .render()
}

/// Rewrites the running gateway's file with the route in `mode`, and reloads it.
async fn switch(gw: &GatewayProc, upstream: SocketAddr, store: &str, mode: &str) {
    std::fs::write(gw.config_path(), switch_config(upstream, store, mode)).unwrap();
    let reloaded = Client::new(gw.admin).send(Method::POST, "/reload", &[TOKEN], "").await;
    assert_eq!(reloaded.status, 200, "reload to {mode}: {:?}", reloaded.body);
}

async fn post(client: &Client, key: &str) -> Reply {
    client.post_json("/orders", Some(key), r#"{"sku":"A-1"}"#).await
}

/// Switching a route from observe to enforce by reload, mid-traffic: a request first sent
/// while observing never runs again (its retry gets its answer replayed, or the
/// `response-not-stored` answer of a large one; a retry of one still running waits for it);
/// an unknown outcome observed left its key released; switching back stops enforcing at once.
async fn switching_to_enforce_runs_nothing_again(store: &str) {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&switch_config(upstream.addr, store, "observe"));
    let client = gw.client();

    let small = post(&client, "small").await;
    assert_eq!(small.status, 201);
    upstream.set(|b| b.padding = 4000);
    let large = post(&client, "large").await;
    assert_eq!((large.status, large.body.len() > 4000), (http::StatusCode::CREATED, true));
    upstream.set(|b| b.padding = 0);
    // Sent, and no answer within the upstream's timeout: the pass-through route's 504, and the
    // key released.
    upstream.set(|b| b.delay = Duration::from_millis(1500));
    let lost = post(&client, "lost").await;
    assert_eq!(lost.status, 504);
    // Running when the switch comes.
    upstream.set(|b| b.delay = Duration::from_millis(800));
    let running = {
        let client = client.clone();
        tokio::spawn(async move { post(&client, "running").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    upstream.set(|b| b.delay = Duration::ZERO);
    switch(&gw, upstream.addr, store, "enforce").await;

    let waited = post(&client, "running").await;
    let running = running.await.unwrap();
    assert_eq!(running.status, 201);
    assert!(waited.is_replay(), "the retry waited for the running request: {waited:?}");
    assert_eq!(waited.json()["execution"], running.json()["execution"]);
    let again = post(&client, "small").await;
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.json()["execution"], small.json()["execution"]);
    let again = post(&client, "large").await;
    assert_eq!(again.problem(), "response-not-stored");
    // The unknown outcome was released while observing: enforcement runs it (attempt 2)
    // instead of holding it as unknown.
    let again = post(&client, "lost").await;
    assert_eq!(again.status, 201, "{again:?}");
    let by_key = upstream.executions_by_key();
    for key in ["small", "large", "running"] {
        assert_eq!(by_key[key], 1, "{key} ran once: {by_key:?}");
    }
    assert_eq!(by_key["lost"], 2);
    assert_eq!(gw.metric("idemgate_observed_total{route=\"orders\",would=\"unknown_outcome\"}").await, 1.0);

    // Back to observe: enforcing stops at once; the retry runs, and is counted.
    switch(&gw, upstream.addr, store, "observe").await;
    let observed = post(&client, "small").await;
    assert!(!observed.is_replay() && observed.headers.get("idempotent-replay").is_none(), "{observed:?}");
    assert_eq!(upstream.executions_by_key()["small"], 2);
    assert_eq!(gw.metric("idemgate_observed_total{route=\"orders\",would=\"would_replay\"}").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_enforce_runs_nothing_again_on_memory() {
    switching_to_enforce_runs_nothing_again("backend = \"memory\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_enforce_runs_nothing_again_on_redis() {
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"",
        RedisServer::shared().url(),
        support::unique("switch")
    );
    switching_to_enforce_runs_nothing_again(&store).await;
}

/// A rolling switch: two gateways observing on one Redis, switched to enforce one after the
/// other while requests and retries go to both. Once the gateway a retry reaches enforces, the
/// retry never runs: what observing ran first is replayed, whichever gateway ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_switch_of_two_gateways_runs_nothing_again() {
    let upstream = TestUpstream::start().await;
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"",
        RedisServer::shared().url(),
        support::unique("rolling")
    );
    let (a, b) = (
        GatewayProc::start(&switch_config(upstream.addr, &store, "observe")),
        GatewayProc::start(&switch_config(upstream.addr, &store, "observe")),
    );
    let (ca, cb) = (a.client(), b.client());
    // Both observe: first requests on either.
    for n in 0..10 {
        let client = if n % 2 == 0 { &ca } else { &cb };
        assert_eq!(post(client, &format!("k{n}")).await.status, 201);
    }
    switch(&a, upstream.addr, &store, "enforce").await;
    // A enforces, B observes: B's first requests and A's retries; a request running on B while
    // its retry reaches A.
    for n in 10..15 {
        assert_eq!(post(&cb, &format!("k{n}")).await.status, 201);
    }
    upstream.set(|b| b.delay = Duration::from_millis(600));
    let running = {
        let cb = cb.clone();
        tokio::spawn(async move { post(&cb, "slow").await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    upstream.set(|b| b.delay = Duration::ZERO);
    let waited = post(&ca, "slow").await;
    assert!(waited.is_replay(), "{waited:?}");
    assert_eq!(running.await.unwrap().json()["execution"], waited.json()["execution"]);
    for n in 0..15 {
        let retry = post(&ca, &format!("k{n}")).await;
        assert!(retry.is_replay(), "k{n} through A: {retry:?}");
    }
    switch(&b, upstream.addr, &store, "enforce").await;
    for n in 0..15 {
        let retry = post(&cb, &format!("k{n}")).await;
        assert!(retry.is_replay(), "k{n} through B: {retry:?}");
    }
    let by_key = upstream.executions_by_key();
    assert!(by_key.values().all(|&n| n == 1), "every key ran once: {by_key:?}");
    assert_eq!(by_key.len(), 16);
}

/// Runs `idemgate report ARGS`: exit code, stdout, stderr.
fn report(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate")).arg("report").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `idemgate report` reads each gateway's counters and sums them per route; bad input exits 2
/// before anything is read, a gateway that cannot be read exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_sums_what_the_gateways_observed() {
    let upstream = TestUpstream::start().await;
    let (a, b) = (
        GatewayProc::start(&switch_config(upstream.addr, "backend = \"memory\"", "observe")),
        GatewayProc::start(&switch_config(upstream.addr, "backend = \"memory\"", "observe")),
    );
    let (ca, cb) = (a.client(), b.client());
    assert_eq!(post(&ca, "k1").await.status, 201);
    assert_eq!(post(&ca, "k1").await.status, 201);
    assert_eq!(post(&cb, "k2").await.status, 201);
    assert_eq!(cb.post_json("/orders", None, "{}").await.status, 201);
    let (ua, ub) = (format!("http://{}", a.admin), format!("http://{}", b.admin));

    let (code, out, err) = report(&["--admin", &ua, "--admin", &ub, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["gateways"], 2);
    let orders = &doc["routes"][0];
    assert_eq!((orders["route"].as_str(), orders["mode"].as_str()), (Some("orders"), Some("observe")), "{doc}");
    assert_eq!(orders["requests"], 4);
    assert_eq!(orders["observed"]["first"], 2);
    assert_eq!(orders["observed"]["would_replay"], 1);
    assert_eq!(orders["observed"]["answer_differed"], 1);
    assert_eq!(orders["observed"]["missing_key"], 1);
    assert_eq!(orders["saved_executions"], 1);
    assert_eq!(orders["keyless_share"], 0.25);
    assert_eq!(doc["routes"].as_array().unwrap().len(), 1, "the pass-through route is not reported: {doc}");

    let (code, out, err) = report(&["--admin", &ua, "--route", "orders"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("route orders: observing, 2 requests"), "{out}");
    assert!(out.contains("executions enforcement would have saved: 1 (50.0% of requests)"), "{out}");

    let (code, _, err) = report(&["--admin", &ua, "--route", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no idempotent route \"nope\"") && err.contains("orders"), "{err}");
    let (code, _, err) = report(&["--admin", "127.0.0.1:9090"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = report(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--admin <URL>") && err.contains("--config <PATH>"), "names both ways: {err}");

    // --config reads the admin listener from a gateway's file (as keys does), alone or beside
    // --admin.
    let file_a = tempfile::NamedTempFile::new().unwrap();
    let text = std::fs::read_to_string(a.config_path()).unwrap();
    let text = text.replacen("admin_listen = \"127.0.0.1:0\"", &format!("admin_listen = \"{}\"", a.admin), 1);
    assert!(text.contains(&a.admin.to_string()), "the file names the listener: {text}");
    std::fs::write(file_a.path(), text).unwrap();
    let path_a = file_a.path().to_str().unwrap();
    let (code, out, err) = report(&["--config", path_a, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((doc["gateways"].as_u64(), doc["routes"][0]["requests"].as_u64()), (Some(1), Some(2)), "{doc}");
    let (code, out, err) = report(&["--admin", &ub, "--config", path_a, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((doc["gateways"].as_u64(), doc["routes"][0]["requests"].as_u64()), (Some(2), Some(4)), "{doc}");
    let (code, _, err) = report(&["--config", "/nonexistent/gw.toml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/nonexistent/gw.toml"), "{err}");
    // A port nothing listens on.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gone = format!("http://{gone}");
    let (code, _, err) = report(&["--admin", &ua, "--admin", &gone]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot reach the admin listener"), "{err}");
    // The proxy listener is no admin listener.
    let (code, _, err) = report(&["--admin", &format!("http://{}", a.addr)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no idemgate metric"), "{err}");
}

/// A listener on port 0 that answers every request with `body` as `/metrics` would: the
/// answer of a gateway that lies, or of something else at that address.
fn fake_metrics(body: String) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    url
}

/// `idemgate report` reads `/metrics` as hostile input (the issue's answers): a route label
/// holding a newline and an ESC is printed escaped, never as a line of its own; a sum past
/// 2^64 and a series given twice in one answer are refused, naming the series, as is a count
/// that is not a whole number.
#[test]
fn the_report_reads_metrics_as_hostile_input() {
    let forged = "idemgate_observed_total{route=\"pay\\nroute payments: observing, 0 requests\u{1b}[2J\",\
                  would=\"first\"} 5\n";
    let (code, out, err) = report(&["--admin", &fake_metrics(forged.to_owned())]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains('\u{1b}'), "an ESC reached the terminal: {out:?}");
    assert!(!out.lines().any(|l| l.starts_with("route payments")), "a forged line: {out}");
    assert!(out.contains(r"route pay\nroute payments: observing, 0 requests\u{1b}[2J: observing, 5 requests"), "{out}");
    // The --route a reader asks for is matched as it is, and the names listed are escaped.
    let (code, _, err) = report(&["--admin", &fake_metrics(forged.to_owned()), "--route", "x"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains('\u{1b}') && err.lines().count() == 1, "{err:?}");

    let max = (1u64 << 53) - 1;
    // The issue's answer: one series 2049 times (it summed past 2^64 and wrapped).
    let repeated = format!("idemgate_observed_total{{route=\"pay\",would=\"first\"}} {max}\n").repeat(2049);
    // The same sum from 2049 different series: each is whole, their sum is not a u64.
    let spread: String = (0..2049)
        .map(|i| format!("idemgate_observed_total{{route=\"pay\",would=\"first\",instance=\"{i}\"}} {max}\n"))
        .collect();
    let twice = "idemgate_requests_total{route=\"pay\",outcome=\"executed\"} 5\n\
                 idemgate_requests_total{outcome=\"executed\",route=\"pay\"} 5\n";
    let series = r#"idemgate_observed_total{route="pay",would="first"}"#;
    let cases = [
        (repeated, format!("{series} is given twice")),
        (spread, "idemgate_observed_total{instance=\"2048\",route=\"pay\",would=\"first\"}: the sum".to_owned()),
        (twice.to_owned(), r#"idemgate_requests_total{outcome="executed",route="pay"} is given twice"#.to_owned()),
        (format!("{series} NaN\n"), format!("{series}: NaN is not a count")),
        (format!("{series} +Inf\n"), format!("{series}: +Inf is not a count")),
        (format!("{series} -3\n"), format!("{series}: -3 is not a count")),
        (format!("{series} 1.5\n"), format!("{series}: 1.5 is not a count")),
        (format!("{series} 1e\n"), format!("{series}: 1e is not a count")),
        ("idemgate_observed_total{route=\"pay\",would=\"first} 5\n".to_owned(), "cannot be read".to_owned()),
    ];
    for (answer, named) in cases {
        let (code, out, err) = report(&["--admin", &fake_metrics(answer)]);
        assert_eq!(code, Some(1), "{named}: {out}{err}");
        assert!(err.contains(&named), "{named}: {err}");
        assert!(out.is_empty(), "nothing printed from an answer refused: {out}");
    }
}

/// A caller past `max_new_keys` on an observing route: answered as ever, counted as
/// `would_throttle`, and its claim given back, so that one caller cannot fill the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_past_the_budget_are_forwarded_unclaimed_and_counted() {
    let upstream = TestUpstream::start().await;
    let gw = TestGateway::start(&support::gateway::config(
        &StoreKind::Memory,
        upstream.addr,
        "mode = \"observe\"\nmax_new_keys = \"2/m\"",
    ))
    .await;
    let (client, admin) = (gw.client(), gw.admin_client());
    for key in ["b1", "b2", "b3"] {
        assert_eq!(client.post_json("/orders", Some(key), r#"{"n":1}"#).await.status, 201);
    }
    assert_eq!(observed(&admin, "orders", "first").await, 2);
    assert_eq!(observed(&admin, "orders", "would_throttle").await, 1);
    // b3 holds no record: its retry is no duplicate (and, past the budget still, throttled).
    assert_eq!(client.post_json("/orders", Some("b3"), r#"{"n":1}"#).await.status, 201);
    assert_eq!(observed(&admin, "orders", "would_replay").await, 0);
    assert_eq!(observed(&admin, "orders", "would_throttle").await, 2);
    // b1's retry is one.
    assert_eq!(client.post_json("/orders", Some("b1"), r#"{"n":1}"#).await.status, 201);
    assert_eq!(observed(&admin, "orders", "would_replay").await, 1);
    assert_eq!(upstream.executions(), 5);
    gw.shutdown().await;
}

/// Over HTTP/2 too: the claimant's answer ends (END_STREAM) once settled, and its retry is
/// counted as one enforcing would replay; a large answer streams whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_gets_whole_answers_and_exact_counts() {
    let upstream = TestUpstream::start().await;
    let policy = "mode = \"observe\"\nmax_stored_body = \"1KiB\"";
    let gw = TestGateway::start(&support::gateway::config(&StoreKind::Memory, upstream.addr, policy)).await;
    let (h2, admin) = (Client::h2(gw.addr), gw.admin_client());
    let headers = [JSON, ("authorization", "Bearer alice"), ("idempotency-key", "h2-1")];
    for execution in [1, 2] {
        let reply = h2.send(Method::POST, "/orders", &headers, r#"{"n":1}"#).await;
        assert_eq!((reply.status.as_u16(), reply.json()["execution"].as_u64()), (201, Some(execution)));
    }
    upstream.set(|b| b.padding = 100_000);
    let large = h2
        .send(Method::POST, "/orders", &[JSON, ("authorization", "Bearer alice"), ("idempotency-key", "h2-2")], "{}")
        .await;
    assert_eq!(large.json()["padding"].as_str().map(str::len), Some(100_000));
    assert_eq!(observed(&admin, "orders", "first").await, 2);
    assert_eq!(observed(&admin, "orders", "would_replay").await, 1);
    assert_eq!(observed(&admin, "orders", "answer_differed").await, 1);
    gw.shutdown().await;
}

/// A body that trickles in past `body_read_timeout` is forwarded whole as it comes (no 408),
/// and counted as `unread_body`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_forwarded_whole_and_counted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = TestUpstream::start().await;
    let toml =
        Toml { server: "body_read_timeout = \"300ms\"", policy: "mode = \"observe\"", ..Toml::new(upstream.addr) };
    let gw = TestGateway::start(&toml.render()).await;
    let body = r#"{"sku":"A-1","n":12}"#;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: slow-1\r\nauthorization: Bearer alice\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body.as_bytes()[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    tcp.write_all(&body.as_bytes()[5..]).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(upstream.seen()[0].body, body.as_bytes());
    assert_eq!(observed(&gw.admin_client(), "orders", "unread_body").await, 1);
    assert_eq!(observed(&gw.admin_client(), "orders", "first").await, 0);
    gw.shutdown().await;
}

/// A store that is down never changes an answer on an observing route: each request is
/// forwarded once the claim fails (within the store's timeout), answered as ever, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_changes_no_answer_and_is_counted() {
    let upstream = TestUpstream::start().await;
    let redis = RedisServer::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout = \"200ms\"",
        redis.url(),
        support::unique("down")
    );
    let gw = TestGateway::start(
        &Toml { store: &store, policy: "mode = \"observe\"\nlease = \"1s\"", ..Toml::new(upstream.addr) }.render(),
    )
    .await;
    let (client, admin) = (gw.client(), gw.admin_client());
    assert_eq!(client.post_json("/orders", Some("up-1"), "{}").await.status, 201);
    redis.stop();
    for key in ["down-1", "down-2", "up-1"] {
        let started = std::time::Instant::now();
        let reply = client.post_json("/orders", Some(key), "{}").await;
        assert_eq!(reply.status, 201, "{reply:?}");
        assert!(reply.headers.get("idempotency-status").is_none(), "{reply:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{key} answered after {:?}", started.elapsed());
    }
    assert_eq!(upstream.executions(), 4);
    assert_eq!(observed(&admin, "orders", "store_error").await, 3);
    assert_eq!(observed(&admin, "orders", "first").await, 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_connect_outlasts_the_timeout_is_counted_as_never_sent() {
    // Both routes' upstreams take connects that hang; each request's 1 s timeout passes while
    // its dial waits. Nothing was sent: the observed key is released as not sent, and nothing
    // counts as an unknown outcome.
    let (observed_up, plain_up) = (Hanging::start().await, Hanging::start().await);
    let toml = twin_config(&StoreKind::Memory, observed_up.addr, plain_up.addr);
    let gw = TestGateway::start(&toml.replace("timeout = \"3s\"", "timeout = \"1s\"")).await;
    let (client, admin) = (gw.client(), gw.admin_client());
    let headers = [JSON, CALLER, ("idempotency-key", "hung")];
    let answered = both(&client, &headers, r#"{"amount":1}"#, "a connect that hangs").await;
    assert_eq!((answered.status.as_u16(), answered.problem()), (502, "upstream-unavailable".to_owned()));
    assert_eq!(observed(&admin, "orders", "first").await, 1);
    assert_eq!(observed(&admin, "orders", "unknown_outcome").await, 0);
    assert_eq!(series(&admin, "idemgate_released_total{route=\"orders\",reason=\"not_sent\"}").await, 1);
    // Back: the retry runs as the key's first request, once.
    let back = observed_up.come_back();
    let retry = client.send(Method::POST, "/orders", &headers, r#"{"amount":1}"#).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(back.executions(), 1);
    assert_eq!(observed(&admin, "orders", "first").await, 2);
    gw.shutdown().await;
}
