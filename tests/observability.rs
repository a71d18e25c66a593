//! What an operator sees, from the real binary: JSON log lines with one access line per
//! request (never the key or a credential), and latency histograms and gauges on /metrics.

use crate::support;

use std::time::Duration;

use support::client::Client;
use support::gateway_proc::{GatewayProc, Toml};
use support::upstream::{Behavior, TestUpstream};

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;

fn toml(upstream: std::net::SocketAddr, server: &str) -> String {
    Toml { server, ..Toml::new(upstream) }.render()
}

/// The access lines logged so far, parsed.
fn access_lines(gw: &GatewayProc) -> Vec<serde_json::Value> {
    gw.log_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "idemgate::access")
        .collect()
}

async fn wait_for_lines(gw: &GatewayProc, n: usize) -> Vec<serde_json::Value> {
    for _ in 0..100 {
        let lines = access_lines(gw);
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {n} access lines in:\n{}", gw.log_lines().join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_one_access_line_per_request_without_secrets() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start_with(&toml(upstream.addr, ""), &["--log-format", "json"]);
    let client = gw.client();
    let key = "\"secret-key-7f3a\"";
    let auth = "Bearer very-secret-credential";
    client.post_json_as("/orders", Some(key), Some(auth), ORDER).await;
    client.post_json_as("/orders", Some(key), Some(auth), ORDER).await;
    client.get("/elsewhere", &[]).await;
    let lines = wait_for_lines(&gw, 3).await;
    let (first, replay, passed) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(first["route"], "orders");
    assert_eq!(first["method"], "POST");
    assert_eq!(first["outcome"], "executed");
    assert_eq!(first["status"], 201);
    assert_eq!(first["attempt"], 1);
    assert!(first["total_ms"].as_f64().unwrap() > 0.0);
    assert!(first["upstream_ms"].as_f64().unwrap() > 0.0);
    assert!(first["store_ms"].as_f64().is_some());
    let record = first["record"].as_str().unwrap();
    assert_eq!(record.len(), 12, "a short prefix of the record hash");
    assert_eq!(replay["outcome"], "replayed");
    assert_eq!(replay["record"], record, "one key, one record hash across lines");
    assert!(replay.get("attempt").is_none() || replay["attempt"].is_null());
    assert_eq!(passed["outcome"], "passed_through");
    let everything = gw.log_lines().join("\n");
    assert!(!everything.contains("secret-key-7f3a"), "the key never appears in logs");
    assert!(!everything.contains("very-secret-credential"), "credentials never appear in logs");
}

/// The raw text of `field`'s number in a JSON log line, as the gateway wrote it.
fn raw_number<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{field}\":"))? + field.len() + 3;
    let rest = &line[start..];
    Some(&rest[..rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len())])
}

/// A duplicate that waits for the request holding its key logs that time as `wait_ms`, apart
/// from the store calls in `store_ms`; and the times are milliseconds to the microsecond, never
/// `4.1057120000000005`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_logs_its_wait_apart_from_store_time() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(1200), ..Behavior::default() }).await;
    let config = Toml { policy: r#"wait = "400ms""#, ..Toml::new(upstream.addr) }.render();
    let gw = GatewayProc::start_with(&config, &["--log-format", "json"]);
    let client = gw.client();
    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("w-1"), ORDER).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dup = client.post_json("/orders", Some("w-1"), ORDER).await;
    assert_eq!(dup.status, 409, "the first request outlasts the wait");
    assert_eq!(first.await.unwrap().status, 201);
    let lines = wait_for_lines(&gw, 2).await;
    let line = |outcome: &str| {
        lines.iter().find(|l| l["outcome"] == outcome).unwrap_or_else(|| panic!("no {outcome} line in {lines:#?}"))
    };
    let waited = line("in_flight");
    let wait_ms = waited["wait_ms"].as_f64().unwrap();
    assert!((400.0..1000.0).contains(&wait_ms), "waited 400ms: {waited}");
    assert!(waited["store_ms"].as_f64().unwrap() < 50.0, "the wait is not store time: {waited}");
    assert!(waited["total_ms"].as_f64().unwrap() >= wait_ms);
    let executed = line("executed");
    assert_eq!(executed["wait_ms"].as_f64(), Some(0.0), "a first request waits for nobody: {executed}");
    assert!(executed["upstream_ms"].as_f64().unwrap() >= 1200.0, "{executed}");

    for text in gw.log_lines().iter().filter(|l| l.contains("idemgate::access")) {
        for field in ["total_ms", "upstream_ms", "store_ms", "wait_ms"] {
            let Some(number) = raw_number(text, field) else { continue };
            let decimals = number.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 3, "{field} is {number} in {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_format_can_come_from_the_config_file() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&toml(upstream.addr, r#"log_format = "json""#));
    gw.client().get("/elsewhere", &[]).await;
    let lines = wait_for_lines(&gw, 1).await;
    assert_eq!(lines[0]["outcome"], "passed_through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_latency_histograms_and_gauges() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&toml(upstream.addr, ""));
    let client = gw.client();
    client.post_json("/orders", Some("m-1"), ORDER).await;
    client.post_json("/orders", Some("m-1"), ORDER).await;
    let text = String::from_utf8(Client::new(gw.admin).get("/metrics", &[]).await.body.to_vec()).unwrap();
    for needle in [
        r#"idemgate_request_seconds_count{route="orders",outcome="executed"} 1"#,
        r#"idemgate_request_seconds_count{route="orders",outcome="replayed"} 1"#,
        r#"idemgate_upstream_seconds_count{route="orders",class="2xx"} 1"#,
        r#"idemgate_store_call_seconds_count{call="claim"} 2"#,
        r#"idemgate_store_call_seconds_count{call="settle"} 1"#,
        "idemgate_exchanges_running 0",
        "idemgate_waiting_duplicates 0",
        r#"idemgate_request_seconds_bucket{le="0.0005",route="orders",outcome="executed"}"#,
        // Only the upstream classes a route can produce: abandoned on the idempotent route,
        // 1xx (a bridged upgrade's 101) where requests pass through.
        r#"idemgate_upstream_seconds_count{route="orders",class="abandoned"} 0"#,
        r#"idemgate_upstream_seconds_count{route="rest",class="1xx"} 0"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    for absent in [r#"{route="rest",class="abandoned"}"#, r#"{route="orders",class="1xx"}"#] {
        assert!(!text.contains(absent), "{absent} is a class the route cannot produce:\n{text}");
    }
}

/// A first request costs two Redis round trips (the native claim, the settle script) and a
/// replay one (the claim's reply carries the response), as `idemgate_store_commands_total`
/// counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_costs_two_redis_round_trips_and_a_replay_one() {
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::shared();
    let store =
        format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"", redis.url(), support::unique("trips"));
    let gw = GatewayProc::start(&Toml { store: &store, ..Toml::new(upstream.addr) }.render());
    let client = gw.client();
    // The check of Redis's own settings at start makes round trips of its own; measure after it.
    assert_eq!(gw.lines_with("store settings", 1).len(), 1, "{}", gw.log());
    let commands = || gw.metric("idemgate_store_commands_total");
    let before = commands().await;
    assert_eq!(client.post_json("/orders", Some("t-1"), ORDER).await.status, 201);
    let first = commands().await;
    assert_eq!(client.post_json("/orders", Some("t-1"), ORDER).await.status, 201);
    let replay = commands().await;
    assert_eq!((first - before, replay - first), (2.0, 1.0), "round trips of a first request, then of a replay");
    assert_eq!(upstream.executions(), 1, "the replay never reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_published_by_the_cli_and_the_admin_listener() {
    let upstream = TestUpstream::start().await;
    let config = Toml {
        server: r#"admin_token = "test-admin-token-0123456789""#,
        policy: "ignore = [\"/client_ts\"]\nmax_new_keys = \"100/s\"",
        ..Toml::new(upstream.addr)
    }
    .render();
    let gw = GatewayProc::start(&config);
    let admin = Client::new(gw.admin);

    let published = admin.get("/policy", &[]).await;
    assert_eq!(published.status, 200, "the policy is public");
    assert_eq!(published.header("content-type"), Some("text/markdown; charset=utf-8"));
    let markdown = String::from_utf8(published.body.to_vec()).unwrap();
    for needle in [
        "## POST /orders (route `orders`)",
        "`idempotency-key` header",
        "`header:authorization`",
        "JSON fields ignored: `/client_ts`",
        "| lease | 10s (renewed while the request runs)",
        "answers are replayed for 24h",
        "4xx except 400, 408, 409, 422, 425, 429",
        "held: retries get 502 `outcome-unknown`",
        "at most 100 new keys per caller per 1s",
    ] {
        assert!(markdown.contains(needle), "missing {needle:?} in\n{markdown}");
    }
    assert!(!markdown.contains("route `rest`"), "only idempotent routes publish a policy");

    // The CLI prints the same document from the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("policy")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), markdown);

    // The routing table needs the token.
    assert_eq!(admin.get("/routes", &[]).await.status, 401);
    let routes = admin.get("/routes", &[("authorization", "Bearer test-admin-token-0123456789")]).await.json();
    assert_eq!(routes[0]["name"], "orders");
    assert_eq!(routes[0]["methods"], serde_json::json!(["POST"]));
    assert_eq!(routes[0]["path"], "/orders");
    assert_eq!(routes[0]["idempotency"]["lease_ms"], 10_000);
    assert_eq!(routes[0]["idempotency"]["max_new_keys"]["count"], 100);
    assert_eq!(routes[1]["name"], "rest");
    assert!(routes[1]["idempotency"].is_null());
}

/// Redis down for a few seconds under steady traffic and readiness probes: one WARN when the
/// store stops answering, at most a summary per 10 s while it stays down, one INFO when it
/// answers again; each refused request is in the access log, not in a warning of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_said_once_not_once_per_request() {
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout = \"200ms\"",
        redis.url(),
        support::unique("outage")
    );
    let gw = GatewayProc::start(
        &Toml { server: "log_format = \"json\"", store: &store, ..Toml::new(upstream.addr) }.render(),
    );
    let client = gw.client();
    let admin = Client::new(gw.admin);
    assert_eq!(client.post_json("/orders", Some("before"), ORDER).await.status, 201);
    let before = gw.log_lines().len();

    redis.stop();
    let mut refused = 0;
    for i in 0..65 {
        let r = client.post_json("/orders", Some(&format!("down-{i}")), ORDER).await;
        refused += usize::from(r.status == 503);
        if i % 8 == 0 {
            assert_eq!(admin.get("/readyz", &[]).await.status, 503);
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(refused, 65, "fail-closed while Redis is down");
    redis.restart();
    let mut back = false;
    for _ in 0..100 {
        if client.post_json("/orders", Some("after"), ORDER).await.status == 201 {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the gateway never got Redis back:\n{}", gw.log());
    // Lines reach stderr through the log writer's thread, a moment after the answers: wait
    // (5 s at most) until the 66 access lines since `before` are there.
    let access_before = gw.log_lines()[..before].iter().filter(|l| l.contains("idemgate::access")).count();
    let _ = gw.lines_with("idemgate::access", access_before + 66);

    let lines: Vec<serde_json::Value> =
        gw.log_lines()[before..].iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let loud: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["level"] == "WARN" || l["level"] == "ERROR").collect();
    let said = |text: &str| lines.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.contains(text))).count();
    assert_eq!(said("store stopped answering"), 1, "{loud:#?}");
    assert_eq!(said("store answers again"), 1, "{lines:#?}");
    // Both name the store they mean.
    let address = redis.addr().to_string();
    for text in ["store stopped answering", "store answers again"] {
        let line = lines.iter().find(|l| l["message"].as_str().is_some_and(|m| m.contains(text)));
        let named = line.and_then(|l| l["store"].as_str()).unwrap_or_default();
        assert!(named.contains(&address), "{text}: {line:?}");
    }
    // The outage, the notification subscription it broke, and (for a run past 10 s) one
    // summary: nothing per request or per probe.
    assert!(loud.len() <= 4, "{} warnings for one outage: {loud:#?}", loud.len());
    let access = lines.iter().filter(|l| l["target"] == "idemgate::access").count();
    assert!(access >= 66, "every request is in the access log: {access}");
}

/// A mistyped port: every line about the store names the address it tried, never the password
/// the URL carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_lines_name_the_address_and_never_the_password() {
    let upstream = TestUpstream::start().await;
    // A port nothing listens on: bound, read back, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap();
    let store = format!(
        "backend = \"redis\"\nurl = \"redis://:hunter2-secret@{closed}\"\nkey_prefix = \"{}\"\ntimeout = \"200ms\"",
        support::unique("wrongport")
    );
    let gw = GatewayProc::start(
        &Toml { server: "log_format = \"json\"", store: &store, ..Toml::new(upstream.addr) }.render(),
    );
    let r = gw.client().post_json("/orders", Some("wrong-port"), ORDER).await;
    assert_eq!(r.status, 503, "fail-closed: {:?}", r.body);
    let store_lines = |log: &[String]| -> Vec<serde_json::Value> {
        log.iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            // About the store (not the descriptor budget, which counts the store's connections).
            .filter(|l| l["message"].as_str().is_some_and(|m| m.contains("store") && !m.contains("file descriptors")))
            .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
            .collect()
    };
    let mut said = Vec::new();
    for _ in 0..50 {
        said = store_lines(&gw.log_lines());
        if said.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // At least the start-up check and the outage; each names the address.
    assert!(said.len() >= 2, "{said:#?}\n{}", gw.log());
    for line in &said {
        let named = line["store"].as_str().or_else(|| line["node"].as_str()).unwrap_or_default();
        assert!(named.contains(&closed.to_string()), "no address in {line}");
    }
    assert!(!gw.log().contains("hunter2-secret"), "the password reached the log:\n{}", gw.log());
}

/// `worker_threads = 1` runs the gateway on one thread without a pool (a cheaper runtime,
/// see docs/performance.md): it must serve, replay, log and drain exactly as a pool does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_one_thread_serves_replays_and_drains_its_requests() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(400), ..Behavior::default() }).await;
    let mut gw = GatewayProc::start(&toml(upstream.addr, "worker_threads = 1\nlog_format = \"json\""));
    let client = gw.client();
    let first = client.post_json("/orders", Some("one-thread-1"), ORDER).await;
    let replay = client.post_json("/orders", Some("one-thread-1"), ORDER).await;
    assert_eq!(first.status, 201);
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body, "the retry got the stored answer");
    assert_eq!(client.get("/elsewhere", &[]).await.status, 201, "a pass-through");
    assert_eq!(upstream.executions(), 2, "the order ran once, the pass-through once");

    // A request still at the upstream when SIGTERM arrives is finished and answered.
    let in_flight = tokio::spawn(async move { client.post_json("/orders", Some("one-thread-2"), ORDER).await });
    for _ in 0..100 {
        if upstream.executions() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(upstream.executions(), 3, "the third request reached the upstream");
    gw.sigterm();
    assert_eq!(in_flight.await.unwrap().status, 201, "answered during the drain");
    let status = gw.wait_exit(Duration::from_secs(10)).expect("the gateway exits after its drain");
    assert!(status.success(), "{status:?}");
    let outcomes: Vec<String> =
        access_lines(&gw).iter().map(|l| l["outcome"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(
        outcomes,
        ["executed", "replayed", "passed_through", "executed"],
        "every access line was flushed at exit"
    );
}

/// A keyed route's request without its optional key goes upstream as on a plain route, and is
/// seen as one: its upstream time in the access line and in the route's upstream histogram.
/// (It was sent on a path of its own that skipped both.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_request_on_a_keyed_route_is_timed_like_a_pass_through() {
    let upstream = TestUpstream::start().await;
    let toml = Toml { policy: "required = false", ..Toml::new(upstream.addr) }.render();
    let gw = GatewayProc::start_with(&toml, &["--log-format", "json"]);
    let r = gw.client().post_json("/orders", None, ORDER).await;
    assert_eq!(r.status, 201);
    let lines = wait_for_lines(&gw, 1).await;
    assert_eq!(lines[0]["outcome"], "passed_through");
    assert!(lines[0]["upstream_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{:?}", lines[0]);
    let timed = gw.metric("idemgate_upstream_seconds_count{route=\"orders\",class=\"2xx\"}").await;
    assert_eq!(timed, 1.0);
    assert_eq!(upstream.executions(), 1);
}
