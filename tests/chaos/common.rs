//! What every scenario shares: the gateway config, requests, and the report row.

use std::net::SocketAddr;

use http::Method;

use crate::support::client::{Client, DEFAULT_AUTH, Reply};

/// One row of the summary table.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Requests sent by clients.
    pub requests: u32,
    /// Requests that reached the upstream.
    pub executions: u32,
    /// Duplicates that reached the upstream and were caught by its UNIQUE constraint.
    pub caught: u32,
    /// Client-visible failures (connection errors, unexpected statuses) that the scenario allows.
    pub errors: u32,
    /// What the scenario showed, in a few words.
    pub note: String,
}

/// A gateway config on port 0 with the given routes, all forwarding to `upstream`.
pub fn gateway_toml(redis_url: &str, upstream: SocketAddr, key_prefix: &str, routes: &str) -> String {
    gateway_toml_with(redis_url, upstream, key_prefix, "", routes)
}

/// [`gateway_toml`] with extra `[store]` lines.
pub fn gateway_toml_with(redis_url: &str, upstream: SocketAddr, key_prefix: &str, store: &str, routes: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_grace = "5s"

[store]
backend = "redis"
url = "{redis_url}"
key_prefix = "{key_prefix}"
timeout = "500ms"
{store}

[upstreams.ledger]
url = "http://{upstream}"
timeout = "10s"
connect_timeout = "1s"
{routes}
"#
    )
}

/// An idempotent POST route with extra policy lines.
pub fn route(name: &str, path: &str, policy: &str) -> String {
    format!(
        r#"
[[routes]]
name = "{name}"
methods = ["POST"]
path = "{path}"
upstream = "ledger"

[routes.idempotency]
{policy}
"#
    )
}

/// The JSON body of order `n`.
pub fn order(n: u32) -> String {
    format!(r#"{{"sku":"SKU-{n}","quantity":{}}}"#, n % 7 + 1)
}

/// POSTs `body` with the raw key header value `key`.
pub async fn post(client: &Client, path: &str, key: &str, body: &str) -> Result<Reply, String> {
    client
        .try_send(
            Method::POST,
            path,
            &[("content-type", "application/json"), ("idempotency-key", key), ("authorization", DEFAULT_AUTH)],
            body.to_owned(),
        )
        .await
}

/// Retries while the gateway answers 503 (store briefly unavailable): nothing was forwarded,
/// so retrying with the same key is what a client does.
pub async fn post_until_served(client: &Client, path: &str, key: &str, body: &str) -> Reply {
    let started = std::time::Instant::now();
    let mut last = String::new();
    for _ in 0..100 {
        match post(client, path, key, body).await {
            Ok(r) if r.status != 503 => return r,
            // The last refusal is kept for the failure message: which store error it was
            // (unreachable, redirected, timed out) is what tells one outage from another.
            Ok(r) => last = format!("503 {}", String::from_utf8_lossy(&r.body)),
            Err(e) => last = e,
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{key}: still unavailable after 100 tries over {:.1?}; the last: {last}", started.elapsed());
}
