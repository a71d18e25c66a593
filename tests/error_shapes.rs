//! The gateway's errors in the API's own shape (`[errors]`, `[routes.errors]`): what clients
//! and their SDKs read, escaped so that no client input can break the envelope.

use crate::support;

use std::time::Duration;

use http::Method;
use idemgate::config::{Config, ConfigError};
use support::client::DEFAULT_AUTH;
use support::gateway::TestGateway;
use support::gateway_proc::Toml;
use support::upstream::{Behavior, TestUpstream};

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;

/// The Stripe-shaped recipe of docs/errors.md.
const STRIPE: &str = r#"
[errors]
content_type = "application/json"
body = '{"error": {"type": "api_error", "code": "{type}", "message": "{detail}", "doc_url": "{type_uri}"}}'

[errors.key-reused]
status = 400
body = '{"error": {"type": "idempotency_error", "message": "{detail}"}}'

[errors.in-progress]
body = '{"error": {"type": "idempotency_error", "code": "idempotency_key_in_use", "message": "{detail}"}}'

[errors.outcome-unknown]
headers = { "Stripe-Should-Retry" = "false" }
"#;

fn toml(upstream: std::net::SocketAddr, policy: &str, extra: &str) -> String {
    format!("{}\n{extra}", Toml { policy, ..Toml::new(upstream) }.render())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_recipe_answers_in_stripes_envelope() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(600), ..Behavior::default() }).await;
    let gw = TestGateway::start(&toml(upstream.addr, "wait = \"100ms\"", STRIPE)).await;
    let client = gw.client();
    // In progress: 409 (the gateway's status), Stripe's idempotency_key_in_use.
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("ch_1"), ORDER).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let busy = client.post_json("/orders", Some("ch_1"), ORDER).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.header("content-type"), Some("application/json"));
    assert!(busy.header("retry-after").is_some());
    let doc = busy.json();
    assert_eq!(doc["error"]["type"], "idempotency_error");
    assert_eq!(doc["error"]["code"], "idempotency_key_in_use");
    assert!(doc["error"]["message"].as_str().unwrap().contains("still being processed"), "{doc}");
    assert_eq!(first.await.unwrap().status, 201);
    // Key reuse: 400 idempotency_error, as Stripe answers it.
    let reused = client.post_json("/orders", Some("ch_1"), r#"{"sku":"B-2","quantity":1}"#).await;
    assert_eq!(reused.status, 400);
    assert_eq!(reused.json()["error"]["type"], "idempotency_error");
    // Every other type takes the envelope, with its slug as the code and its type URI.
    let missing = client.send(Method::POST, "/orders", &[("authorization", DEFAULT_AUTH)], ORDER).await;
    assert_eq!(missing.status, 400);
    let doc = missing.json();
    assert_eq!(doc["error"]["code"], "key-missing");
    assert!(doc["error"]["doc_url"].as_str().unwrap().ends_with("#key-missing"));
    assert_eq!(upstream.executions(), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_input_cannot_break_the_envelope() {
    let upstream = TestUpstream::start().await;
    let gw = TestGateway::start(
        &toml(upstream.addr, "", STRIPE)
            .replace("\n[[routes]]\nname = \"rest\"\npath = \"/{*rest}\"\nupstream = \"app\"\n", ""),
    )
    .await;
    // The no-route detail echoes the method and path.
    for path in ["/x%22,%22injected%22:%22", "/a\"b", "/%5C%5Cn"] {
        let r = gw.client().get(path, &[]).await;
        assert_eq!(r.status, 404, "{path}");
        let doc: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(doc.as_object().unwrap().len(), 1, "{doc}");
        assert_eq!(doc["error"].as_object().unwrap().len(), 4, "{doc}");
        assert_eq!(doc["error"]["code"], "no-route");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_has_its_own_shape_over_the_files_and_text_is_plain() {
    let upstream = TestUpstream::start().await;
    let route_errors = "\n[routes.errors]\ncontent_type = \"text/plain; charset=utf-8\"\nbody = \"{status} {title}: {detail}\"\n\
                        [routes.errors.key-missing]\nstatus = 422\nheaders = { \"X-Error-Code\" = \"{type}\" }\n";
    let text = toml(upstream.addr, "", STRIPE).replacen(
        "\n[routes.idempotency]\n",
        &format!("{route_errors}\n[routes.idempotency]\n"),
        1,
    );
    let gw = TestGateway::start(&text).await;
    let r = gw.client().send(Method::POST, "/orders", &[("authorization", DEFAULT_AUTH)], ORDER).await;
    assert_eq!(r.status, 422, "the route's status for the type");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("x-error-code"), Some("{type}"), "header values are not templates");
    let body = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(body.starts_with("422 Idempotency key missing: "), "{body}");
    assert!(!body.contains('\n'));
    // The file's shape where the route has none (the pass-through route).
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_errors_tables_the_answers_are_problem_json_as_before() {
    let upstream = TestUpstream::start().await;
    let gw = TestGateway::start(&toml(upstream.addr, "", "")).await;
    let r = gw.client().send(Method::POST, "/orders", &[("authorization", DEFAULT_AUTH)], ORDER).await;
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.problem(), "key-missing");
    gw.shutdown().await;
}

fn issues(extra: &str) -> Vec<(String, String)> {
    let text = toml("127.0.0.1:9".parse().unwrap(), "", extra);
    match Config::from_toml(&text, "t") {
        Err(ConfigError::Invalid { issues, .. }) => issues.into_iter().map(|i| (i.key, i.reason)).collect(),
        other => panic!("{extra}: {other:?}"),
    }
}

#[test]
fn check_validates_every_template() {
    for (extra, key, reason) in [
        (
            "[errors]\ncontent_type = \"application/json\"\nbody = '{\"e\": \"{typo}\"}'",
            "errors.body",
            "{typo} is not a placeholder",
        ),
        (
            "[errors]\ncontent_type = \"application/json\"\nbody = '{\"e\": {detail}}'",
            "errors.body",
            "is not JSON once filled",
        ),
        (
            "[errors]\ncontent_type = \"text/html\"\nbody = \"x\"",
            "errors.content_type",
            "JSON (application/json) or text/plain only",
        ),
        ("[errors]\nbody = \"x\"", "errors.body", "needs a content_type"),
        ("[errors]\ncontent_type = \"application/json\"", "errors.body", "is required with content_type"),
        ("[errors.key-reuse]\nstatus = 400", "errors.key-reuse", "is not a problem type"),
        ("[errors.key-reused]\nstatus = 99", "errors.key-reused.status", "between 200 and 599"),
        ("[errors.key-reused]\nbody = \"x\"", "errors.key-reused.body", "needs a content_type"),
        (
            "[errors.key-reused]\nheaders = { \"Connection\" = \"close\" }",
            "errors.key-reused.headers.Connection",
            "hop-by-hop",
        ),
        ("[errors.key-reused]\nstatsu = 400", "errors.key-reused.statsu", "unknown key"),
    ] {
        let found = issues(extra);
        assert!(found.iter().any(|(k, r)| k == key && r.contains(reason)), "{extra}\n=> {found:#?}");
    }
    // A valid recipe loads, and so does a type table alone (headers on problem+json).
    let text = toml("127.0.0.1:9".parse().unwrap(), "", STRIPE);
    Config::from_toml(&text, "t").unwrap();
    let text = toml(
        "127.0.0.1:9".parse().unwrap(),
        "",
        "[errors.outcome-unknown]\nheaders = { \"Stripe-Should-Retry\" = \"false\" }",
    );
    Config::from_toml(&text, "t").unwrap();
}
