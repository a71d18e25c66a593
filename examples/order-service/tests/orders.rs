//! End-to-end scenarios over real TCP, each run on SQLite and (when configured) Postgres.
//! Assertions read the `orders` table directly, not only the responses.

mod common;

use axum::http::StatusCode;
use std::time::Duration;

use common::{InsertBlocker, Row, Service, order_json, rows};

on_both_backends!(
    create_stores_one_row,
    replay_with_same_payload_hits_backstop,
    quoted_and_bare_keys_are_the_same_key,
    reuse_with_different_payload_is_422,
    keys_are_per_user,
    missing_or_empty_key_is_400,
    validation_failures_are_400,
    malformed_json_is_400,
    get_order_and_404,
    concurrent_duplicates_create_one_row,
    shutdown_future_stops_the_server,
    shutdown_finishes_in_flight_request,
);

fn row(id: i64, user_id: &str, idem_key: &str, sku: &str, quantity: i64) -> Row {
    Row { id, user_id: user_id.into(), idem_key: idem_key.into(), sku: sku.into(), quantity }
}

async fn create_stores_one_row(url: &str) {
    let svc = Service::start(url).await;
    let res = svc.client.post_order(Some("k-1"), &order_json("alice", "SKU-1", 3)).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
    assert_eq!(res.header("content-type"), Some("application/json"));
    assert_eq!(res.header("idempotency-backstop"), None);
    let id = res.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(res.text(), format!(r#"{{"order_id": {id}, "status": "created"}}"#));
    assert_eq!(rows(url).await, vec![row(id, "alice", "k-1", "SKU-1", 3)]);
    assert_eq!(svc.stats().await, serde_json::json!({ "orders": 1, "backstop_hits": 0 }));
    svc.stop().await.expect("clean stop");
}

async fn replay_with_same_payload_hits_backstop(url: &str) {
    let svc = Service::start(url).await;
    let body = order_json("alice", "SKU-1", 3);
    let first = svc.client.post_order(Some("k-1"), &body).await;
    let again = svc.client.post_order(Some("k-1"), &body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert_eq!(again.body, first.body, "replayed body must be byte-identical");
    assert_eq!(again.header("content-type"), first.header("content-type"));
    assert_eq!(again.header("idempotency-backstop"), Some("hit"));
    assert_eq!(rows(url).await.len(), 1);
    assert_eq!(svc.stats().await, serde_json::json!({ "orders": 1, "backstop_hits": 1 }));
    svc.stop().await.expect("clean stop");
}

async fn quoted_and_bare_keys_are_the_same_key(url: &str) {
    let svc = Service::start(url).await;
    let body = order_json("alice", "SKU-1", 1);
    let quoted = svc.client.post_order(Some(r#""k\"1\\x""#), &body).await;
    assert_eq!(quoted.status, StatusCode::CREATED, "{}", quoted.text());
    let id = quoted.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "alice", r#"k"1\x"#, "SKU-1", 1)]);

    let bare = svc.client.post_order(Some("plain"), &body).await;
    assert_eq!(bare.status, StatusCode::CREATED);
    let bare_again_quoted = svc.client.post_order(Some("\"plain\""), &body).await;
    assert_eq!(bare_again_quoted.status, StatusCode::CREATED);
    assert_eq!(bare_again_quoted.body, bare.body);
    assert_eq!(bare_again_quoted.header("idempotency-backstop"), Some("hit"));
    assert_eq!(rows(url).await.len(), 2);
    svc.stop().await.expect("clean stop");
}

async fn reuse_with_different_payload_is_422(url: &str) {
    let svc = Service::start(url).await;
    let first = svc.client.post_order(Some("k-1"), &order_json("alice", "SKU-1", 3)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for changed in [order_json("alice", "SKU-2", 3), order_json("alice", "SKU-1", 4)] {
        let res = svc.client.post_order(Some("k-1"), &changed).await;
        assert_eq!(res.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", res.text());
        assert_eq!(res.header("content-type"), Some("application/json"));
        assert!(res.json()["error"].is_string());
        assert_eq!(res.header("idempotency-backstop"), None);
    }
    let id = first.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "alice", "k-1", "SKU-1", 3)]);
    assert_eq!(svc.stats().await["backstop_hits"], 0);
    svc.stop().await.expect("clean stop");
}

async fn keys_are_per_user(url: &str) {
    let svc = Service::start(url).await;
    let a = svc.client.post_order(Some("shared"), &order_json("alice", "SKU-1", 1)).await;
    let b = svc.client.post_order(Some("shared"), &order_json("bob", "SKU-1", 1)).await;
    assert_eq!((a.status, b.status), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(b.header("idempotency-backstop"), None);
    let (ida, idb) = (a.json()["order_id"].as_i64().unwrap(), b.json()["order_id"].as_i64().unwrap());
    assert_ne!(ida, idb);
    assert_eq!(rows(url).await, vec![row(ida, "alice", "shared", "SKU-1", 1), row(idb, "bob", "shared", "SKU-1", 1)]);
    svc.stop().await.expect("clean stop");
}

async fn missing_or_empty_key_is_400(url: &str) {
    let svc = Service::start(url).await;
    let body = order_json("alice", "SKU-1", 1);
    let res = svc.client.post_order(None, &body).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(res.json(), serde_json::json!({ "error": "missing Idempotency-Key header" }));
    for bad in ["", "\"\"", "\"unterminated", "two words", "\"a\";param=1"] {
        let res = svc.client.post_order(Some(bad), &body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "key {bad:?}: {}", res.text());
        assert!(res.json()["error"].as_str().unwrap().contains("Idempotency-Key"), "{}", res.text());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn validation_failures_are_400(url: &str) {
    let svc = Service::start(url).await;
    let field_errors = [
        ("user_id", r#"{"sku":"S","quantity":1}"#),
        ("user_id", r#"{"user_id":"","sku":"S","quantity":1}"#),
        ("user_id", r#"{"user_id":"  ","sku":"S","quantity":1}"#),
        ("user_id", r#"{"user_id":7,"sku":"S","quantity":1}"#),
        ("user_id", r#"{"user_id":null,"sku":"S","quantity":1}"#),
        ("user_id", r#"{"user_id":"a\u0000b","sku":"S","quantity":1}"#),
        ("sku", r#"{"user_id":"u","quantity":1}"#),
        ("sku", r#"{"user_id":"u","sku":"","quantity":1}"#),
        ("sku", r#"{"user_id":"u","sku":["S"],"quantity":1}"#),
        ("quantity", r#"{"user_id":"u","sku":"S"}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":0}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":-1}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":1.5}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":2.0}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":1e2}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":"3"}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":null}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":9223372036854775808}"#),
        ("quantity", r#"{"user_id":"u","sku":"S","quantity":123456789012345678901234567890}"#),
    ];
    for (i, (field, body)) in field_errors.iter().enumerate() {
        let res = svc.client.post_order(Some(&format!("v-{i}")), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.text());
        let err = res.json();
        assert_eq!(err["field"], *field, "{body}: {err}");
        assert!(err["error"].as_str().unwrap().contains(field), "{body}: {err}");
    }
    // Not objects at all; `1e400` is out of f64 range and may fail as JSON or as a field.
    for body in ["[]", "\"order\"", "42", "null", r#"{"user_id":"u","sku":"S","quantity":1e400}"#] {
        let res = svc.client.post_order(Some("v-shape"), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.text());
        assert!(res.json()["error"].is_string());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn malformed_json_is_400(url: &str) {
    let svc = Service::start(url).await;
    for body in ["", "{", "{\"user_id\": \"u\",}", "not json", "{\"user_id\":\"u\"} trailing", "\u{FEFF}{}"] {
        let res = svc.client.post_order(Some("m"), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body:?}: {}", res.text());
        assert_eq!(res.header("content-type"), Some("application/json"));
        assert!(res.json()["error"].is_string());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn get_order_and_404(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order(Some("g-1"), &order_json("carol", "SKU-9", 5)).await;
    let id = created.json()["order_id"].as_i64().expect("order_id");

    let res = svc.client.get(&format!("/orders/{id}")).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    let order = res.json();
    assert_eq!(order["id"], id);
    assert_eq!(order["user_id"], "carol");
    assert_eq!(order["idem_key"], "g-1");
    assert_eq!(order["sku"], "SKU-9");
    assert_eq!(order["quantity"], 5);
    let created_at = order["created_at"].as_str().expect("created_at");
    assert!(created_at.len() == 24 && created_at.ends_with('Z') && created_at.as_bytes()[10] == b'T', "{created_at}");

    for path in [format!("/orders/{}", id + 1000), "/orders/-1".into(), "/nope".into()] {
        let res = svc.client.get(&path).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{path}");
        assert!(res.json()["error"].is_string());
    }
    let res = svc.client.get("/orders/abc").await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.json()["error"].is_string());

    assert_eq!(svc.client.get("/healthz").await.status, StatusCode::OK);
    svc.stop().await.expect("clean stop");
}

async fn concurrent_duplicates_create_one_row(url: &str) {
    const N: usize = 20;
    let svc = Service::start(url).await;
    let body = order_json("dave", "SKU-7", 2);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let (client, body, barrier) = (svc.client.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client.post_order(Some("race"), &body).await
            })
        })
        .collect();
    let mut responses = Vec::with_capacity(N);
    for task in tasks {
        responses.push(task.await.expect("request task"));
    }
    for res in &responses {
        assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
        assert_eq!(res.body, responses[0].body, "all bodies must be identical");
    }
    let hits = responses.iter().filter(|r| r.header("idempotency-backstop") == Some("hit")).count();
    assert_eq!(hits, N - 1, "exactly one request creates, the rest replay");
    let id = responses[0].json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "dave", "race", "SKU-7", 2)]);
    assert_eq!(svc.stats().await, serde_json::json!({ "orders": 1, "backstop_hits": N - 1 }));
    svc.stop().await.expect("clean stop");
}

async fn shutdown_future_stops_the_server(url: &str) {
    let svc = Service::start(url).await;
    let (addr, client) = (svc.addr, svc.client.clone());
    // Leaves an idle keep-alive connection in the client pool: graceful shutdown must close
    // it rather than wait for it.
    assert_eq!(client.get("/healthz").await.status, StatusCode::OK);
    let res = client.post_order(Some("s-1"), &order_json("erin", "SKU-1", 1)).await;
    assert_eq!(res.status, StatusCode::CREATED);
    svc.stop().await.expect("serve returns Ok after shutdown");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "listener still accepting");
    assert_eq!(rows(url).await.len(), 1);
}

async fn shutdown_finishes_in_flight_request(url: &str) {
    let mut svc = Service::start(url).await;
    let blocker = InsertBlocker::hold(url, "grace", "in-flight").await;
    let client = svc.client.clone();
    let request =
        tokio::spawn(async move { client.post_order(Some("in-flight"), &order_json("grace", "SKU-1", 1)).await });
    // Long enough for the request to reach the database and wait on the lock; the SQLite
    // busy timeout (5 s) bounds how long it may stay blocked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!request.is_finished(), "request should be waiting on the lock");
    svc.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!svc.has_stopped(), "serve returned while a request was in flight");
    blocker.release().await;

    let res = request.await.expect("request task");
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
    svc.stop().await.expect("clean stop");
    let id = res.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "grace", "in-flight", "SKU-1", 1)]);
}
