//! What an operator sees, from the real binary: JSON log lines with one access line per
//! request (never the key or a credential), and latency histograms and gauges on /metrics.

mod support;

use std::time::Duration;

use support::client::Client;
use support::gateway_proc::GatewayProc;
use support::upstream::TestUpstream;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;

fn toml(upstream: std::net::SocketAddr, server: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
{server}

[store]
backend = "memory"

[upstreams.app]
url = "http://{upstream}"

[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders"
upstream = "app"

[routes.idempotency]

[[routes]]
name = "rest"
path = "/{{*rest}}"
upstream = "app"
"#
    )
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
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}
