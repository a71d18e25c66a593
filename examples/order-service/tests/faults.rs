//! The opt-in demo fault `X-Demo-Fault: drop-answer`, over real TCP on SQLite and (when
//! configured) Postgres: with faults on, the order is made and its answer breaks off; with
//! them off, the header changes nothing.

mod common;

use axum::http::{Method, StatusCode};
use order_service::Options;

use common::{PartialResponse, Row, Service, bearer, order_json, rows};

on_both_backends!(
    dropped_answer_makes_the_order_and_breaks_off,
    lookup_finds_the_order_of_a_dropped_answer,
    without_demo_faults_the_header_changes_nothing,
    demo_faults_leave_other_requests_alone,
);

const FAULTS_ON: Options = Options { demo_faults: true };

fn row(id: i64, user_id: &str, idem_key: &str, sku: &str, quantity: i64) -> Row {
    Row { id, user_id: user_id.into(), idem_key: idem_key.into(), sku: sku.into(), quantity }
}

/// POST /orders as `user` with `key`, and `X-Demo-Fault: <fault>` when given.
async fn post(svc: &Service, user: &str, key: &str, fault: Option<&str>, body: &str) -> PartialResponse {
    let auth = bearer(user);
    let mut headers = vec![("content-type", "application/json"), ("authorization", &auth), ("idempotency-key", key)];
    if let Some(fault) = fault {
        headers.push(("x-demo-fault", fault));
    }
    svc.client.try_request(Method::POST, "/orders", &headers, body).await
}

/// A complete body, or a panic that says what came instead.
fn whole(res: &PartialResponse) -> String {
    match &res.body {
        Ok(body) => String::from_utf8_lossy(body).into_owned(),
        Err(err) => panic!("{} answer broke off: {err}", res.status),
    }
}

async fn dropped_answer_makes_the_order_and_breaks_off(url: &str) {
    let svc = Service::start_with(url, FAULTS_ON).await;
    let res = post(&svc, "alice", "drop-1", Some("drop-answer"), &order_json("alice", "SKU-1", 2)).await;
    // The head arrives: 201, JSON, and the length of the whole body the create would send...
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(res.header("content-type"), Some("application/json"));
    let id = rows(url).await.first().map(|r| r.id).expect("the order was made");
    let full = format!(r#"{{"order_id": {id}, "status": "created"}}"#);
    assert_eq!(res.header("content-length"), Some(full.len().to_string().as_str()));
    // ...and the body never completes.
    let err = res.body.as_ref().err().unwrap_or_else(|| panic!("the answer arrived whole: {:?}", res.body));
    assert!(!err.is_empty());
    assert_eq!(rows(url).await, vec![row(id, "alice", "drop-1", "SKU-1", 2)]);

    // The value is matched without regard to case or surrounding spaces.
    let res = post(&svc, "alice", "drop-2", Some(" Drop-Answer "), &order_json("alice", "SKU-2", 1)).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert!(res.body.is_err(), "the answer arrived whole: {:?}", res.body);
    assert_eq!(rows(url).await.len(), 2);

    // The service itself is unharmed: the next request is answered in full.
    assert_eq!(svc.stats().await, serde_json::json!({ "orders": 2, "backstop_hits": 0 }));
    svc.stop().await.expect("clean stop");
}

async fn lookup_finds_the_order_of_a_dropped_answer(url: &str) {
    let svc = Service::start_with(url, FAULTS_ON).await;
    let body = order_json("alice", "SKU-1", 1);
    let lost = post(&svc, "alice", "drop-1", Some("drop-answer"), &body).await;
    assert_eq!(lost.status, StatusCode::CREATED);
    assert!(lost.body.is_err(), "the answer arrived whole: {:?}", lost.body);

    // What a client (or the gateway) asks next: the order the key made, in full.
    let found = svc.client.lookup("alice", "drop-1").await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.text());
    let id = found.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(found.text(), format!(r#"{{"order_id": {id}, "status": "created"}}"#));
    assert_eq!(rows(url).await, vec![row(id, "alice", "drop-1", "SKU-1", 1)]);
    // Another user does not see it.
    assert_eq!(svc.client.lookup("bob", "drop-1").await.status, StatusCode::NOT_FOUND);

    // A retry without the fault header is the same order, answered in full: no second row.
    let retry = post(&svc, "alice", "drop-1", None, &body).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(whole(&retry), found.text());
    assert_eq!(retry.header("idempotency-backstop"), Some("hit"));
    assert_eq!(rows(url).await.len(), 1);
    svc.stop().await.expect("clean stop");
}

async fn without_demo_faults_the_header_changes_nothing(url: &str) {
    let svc = Service::start(url).await;
    let res = post(&svc, "alice", "drop-1", Some("drop-answer"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!(res.status, StatusCode::CREATED);
    let body = whole(&res);
    let id = rows(url).await.first().map(|r| r.id).expect("the order was made");
    assert_eq!(body, format!(r#"{{"order_id": {id}, "status": "created"}}"#));
    assert_eq!(res.header("content-length"), Some(body.len().to_string().as_str()));
    assert_eq!(rows(url).await, vec![row(id, "alice", "drop-1", "SKU-1", 1)]);

    let found = svc.client.lookup("alice", "drop-1").await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.text(), body);
    // A replay through the backstop is not broken either.
    let again = post(&svc, "alice", "drop-1", Some("drop-answer"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!((again.status, whole(&again)), (StatusCode::CREATED, body));
    assert_eq!(again.header("idempotency-backstop"), Some("hit"));
    assert_eq!(rows(url).await.len(), 1);
    svc.stop().await.expect("clean stop");
}

async fn demo_faults_leave_other_requests_alone(url: &str) {
    let svc = Service::start_with(url, FAULTS_ON).await;
    let body = order_json("alice", "SKU-1", 1);

    // No header, or another value: the usual answer.
    for (key, fault) in [("plain", None), ("other", Some("something-else")), ("empty", Some(""))] {
        let res = post(&svc, "alice", key, fault, &body).await;
        assert_eq!(res.status, StatusCode::CREATED, "{key}");
        assert!(res.body.is_ok(), "{key}: {:?}", res.body);
    }
    assert_eq!(rows(url).await.len(), 3);

    // Refusals make no order, so there is no answer to lose: they arrive whole.
    let reused = post(&svc, "alice", "plain", Some("drop-answer"), &order_json("alice", "SKU-1", 9)).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(whole(&reused).contains("order_id"));
    let mismatched = post(&svc, "alice", "m-1", Some("drop-answer"), &order_json("bob", "SKU-1", 1)).await;
    assert_eq!(mismatched.status, StatusCode::FORBIDDEN);
    whole(&mismatched);
    let invalid = post(&svc, "alice", "v-1", Some("drop-answer"), &order_json("alice", "", 1)).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    whole(&invalid);
    let anonymous = svc
        .client
        .try_request(Method::POST, "/orders", &[("idempotency-key", "a-1"), ("x-demo-fault", "drop-answer")], &body)
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    whole(&anonymous);
    assert_eq!(rows(url).await.len(), 3);

    // Only POST /orders honours it: a lookup with the header is answered in full.
    let res = svc
        .client
        .try_request(
            Method::GET,
            "/orders/lookup",
            &[("authorization", &bearer("alice")), ("idempotency-key", "plain"), ("x-demo-fault", "drop-answer")],
            "",
        )
        .await;
    assert_eq!(res.status, StatusCode::OK);
    whole(&res);
    svc.stop().await.expect("clean stop");
}
