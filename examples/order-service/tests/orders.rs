//! End-to-end scenarios over real TCP, each run on SQLite and (when configured) Postgres.
//! Assertions read the `orders` table directly, not only the responses.

mod common;

use axum::http::{Method, StatusCode};
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
    get_order_is_scoped_to_the_caller,
    post_without_bearer_is_401,
    body_user_id_must_match_the_bearer,
    create_then_lookup_is_byte_identical,
    lookup_is_scoped_to_the_caller,
    lookup_of_an_unknown_key_is_404,
    lookup_needs_a_bearer_and_a_key,
    lookup_by_query_parameter,
    hostile_query_keys_are_just_keys,
    concurrent_duplicates_create_one_row,
    shutdown_future_stops_the_server,
    shutdown_finishes_in_flight_request,
);

fn row(id: i64, user_id: &str, idem_key: &str, sku: &str, quantity: i64) -> Row {
    Row { id, user_id: user_id.into(), idem_key: idem_key.into(), sku: sku.into(), quantity }
}

async fn create_stores_one_row(url: &str) {
    let svc = Service::start(url).await;
    let res = svc.client.post_order("alice", Some("k-1"), &order_json("alice", "SKU-1", 3)).await;
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
    let first = svc.client.post_order("alice", Some("k-1"), &body).await;
    let again = svc.client.post_order("alice", Some("k-1"), &body).await;
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
    let quoted = svc.client.post_order("alice", Some(r#""k\"1\\x""#), &body).await;
    assert_eq!(quoted.status, StatusCode::CREATED, "{}", quoted.text());
    let id = quoted.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "alice", r#"k"1\x"#, "SKU-1", 1)]);

    let bare = svc.client.post_order("alice", Some("plain"), &body).await;
    assert_eq!(bare.status, StatusCode::CREATED);
    let bare_again_quoted = svc.client.post_order("alice", Some("\"plain\""), &body).await;
    assert_eq!(bare_again_quoted.status, StatusCode::CREATED);
    assert_eq!(bare_again_quoted.body, bare.body);
    assert_eq!(bare_again_quoted.header("idempotency-backstop"), Some("hit"));
    assert_eq!(rows(url).await.len(), 2);
    svc.stop().await.expect("clean stop");
}

async fn reuse_with_different_payload_is_422(url: &str) {
    let svc = Service::start(url).await;
    let first = svc.client.post_order("alice", Some("k-1"), &order_json("alice", "SKU-1", 3)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for changed in [order_json("alice", "SKU-2", 3), order_json("alice", "SKU-1", 4)] {
        let res = svc.client.post_order("alice", Some("k-1"), &changed).await;
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
    let a = svc.client.post_order("alice", Some("shared"), &order_json("alice", "SKU-1", 1)).await;
    let b = svc.client.post_order("bob", Some("shared"), &order_json("bob", "SKU-1", 1)).await;
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
    let res = svc.client.post_order("alice", None, &body).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(res.json(), serde_json::json!({ "error": "missing Idempotency-Key header" }));
    for bad in ["", "\"\"", "\"unterminated", "two words", "\"a\";param=1"] {
        let res = svc.client.post_order("alice", Some(bad), &body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "key {bad:?}: {}", res.text());
        assert!(res.json()["error"].as_str().unwrap().contains("Idempotency-Key"), "{}", res.text());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn validation_failures_are_400(url: &str) {
    let svc = Service::start(url).await;
    let field_errors = [
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
        let res = svc.client.post_order("u", Some(&format!("v-{i}")), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.text());
        let err = res.json();
        assert_eq!(err["field"], *field, "{body}: {err}");
        assert!(err["error"].as_str().unwrap().contains(field), "{body}: {err}");
    }
    // Not objects at all; `1e400` is out of f64 range and may fail as JSON or as a field.
    for body in ["[]", "\"order\"", "42", "null", r#"{"user_id":"u","sku":"S","quantity":1e400}"#] {
        let res = svc.client.post_order("u", Some("v-shape"), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.text());
        assert!(res.json()["error"].is_string());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn malformed_json_is_400(url: &str) {
    let svc = Service::start(url).await;
    for body in ["", "{", "{\"user_id\": \"u\",}", "not json", "{\"user_id\":\"u\"} trailing", "\u{FEFF}{}"] {
        let res = svc.client.post_order("u", Some("m"), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body:?}: {}", res.text());
        assert_eq!(res.header("content-type"), Some("application/json"));
        assert!(res.json()["error"].is_string());
    }
    assert_eq!(rows(url).await, vec![]);
    svc.stop().await.expect("clean stop");
}

async fn get_order_and_404(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("carol", Some("g-1"), &order_json("carol", "SKU-9", 5)).await;
    let id = created.json()["order_id"].as_i64().expect("order_id");

    let res = svc.client.get_as("carol", &format!("/orders/{id}")).await;
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
        let res = svc.client.get_as("carol", &path).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{path}");
        assert!(res.json()["error"].is_string());
    }
    let res = svc.client.get_as("carol", "/orders/abc").await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.json()["error"].is_string());

    assert_eq!(svc.client.get("/healthz").await.status, StatusCode::OK);
    svc.stop().await.expect("clean stop");
}

async fn get_order_is_scoped_to_the_caller(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("carol", Some("g-1"), &order_json("carol", "SKU-9", 5)).await;
    let id = created.json()["order_id"].as_i64().expect("order_id");
    let path = format!("/orders/{id}");

    // Another user's order looks exactly like one that does not exist.
    let theirs = svc.client.get_as("mallory", &path).await;
    let missing = svc.client.get_as("carol", &format!("/orders/{}", id + 1000)).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.text());
    assert_eq!(theirs.body, missing.body);

    assert_unauthenticated(&svc.client.get(&path).await, "Bearer");
    svc.stop().await.expect("clean stop");
}

async fn post_without_bearer_is_401(url: &str) {
    let svc = Service::start(url).await;
    let body = order_json("alice", "SKU-1", 1);
    // No credentials, or credentials of another scheme: the client is told to use Bearer.
    for auth in [None, Some("Basic YWxpY2U6c2VjcmV0"), Some("alice")] {
        let res = svc.client.post_order_auth(auth, Some("a-1"), &body).await;
        assert_unauthenticated(&res, "Bearer");
    }
    // Bearer credentials that cannot be a user id: `invalid_token`.
    let too_long = format!("Bearer {}", "u".repeat(129));
    for auth in ["Bearer", "Bearer ", "Bearer a b", "Bearer a\tb", too_long.as_str()] {
        let res = svc.client.post_order_auth(Some(auth), Some("a-1"), &body).await;
        assert_unauthenticated(&res, r#"Bearer error="invalid_token""#);
    }
    // Authentication comes before the key and the body are looked at.
    let res = svc.client.post_order_auth(None, None, "not json").await;
    assert_unauthenticated(&res, "Bearer");
    assert_eq!(rows(url).await, vec![]);

    // The scheme is case-insensitive, spaces before the token do not count, the longest
    // user id fits.
    let longest = "u".repeat(128);
    for (i, (auth, user)) in
        [("bearer alice", "alice"), ("BEARER   alice", "alice"), (&*format!("Bearer {longest}"), &*longest)]
            .into_iter()
            .enumerate()
    {
        let res = svc.client.post_order_auth(Some(auth), Some(&format!("ok-{i}")), &order_json(user, "SKU-1", 1)).await;
        assert_eq!(res.status, StatusCode::CREATED, "{auth}: {}", res.text());
    }
    assert_eq!(rows(url).await.len(), 3);
    svc.stop().await.expect("clean stop");
}

fn assert_unauthenticated(res: &common::Response, challenge: &str) {
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.text());
    assert_eq!(res.header("www-authenticate"), Some(challenge));
    assert_eq!(res.header("content-type"), Some("application/json"));
    assert!(res.json()["error"].as_str().is_some_and(|e| !e.is_empty()), "{}", res.text());
}

async fn body_user_id_must_match_the_bearer(url: &str) {
    let svc = Service::start(url).await;
    let res = svc.client.post_order("alice", Some("m-1"), &order_json("bob", "SKU-1", 1)).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.text());
    assert_eq!(res.header("content-type"), Some("application/json"));
    assert_eq!(
        res.json(),
        serde_json::json!({ "error": "user_id in the body does not match the authenticated user", "field": "user_id" })
    );
    assert_eq!(rows(url).await, vec![], "nothing inserted");

    // Without user_id the order is the bearer's; with a matching one it is the same request,
    // so the second is a backstop replay of the first.
    let without = svc.client.post_order("alice", Some("m-1"), r#"{"sku":"SKU-1","quantity":1}"#).await;
    assert_eq!(without.status, StatusCode::CREATED, "{}", without.text());
    let with = svc.client.post_order("alice", Some("m-1"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!(with.status, StatusCode::CREATED, "{}", with.text());
    assert_eq!(with.body, without.body);
    assert_eq!(with.header("idempotency-backstop"), Some("hit"));
    let id = without.json()["order_id"].as_i64().expect("order_id");
    assert_eq!(rows(url).await, vec![row(id, "alice", "m-1", "SKU-1", 1)]);
    svc.stop().await.expect("clean stop");
}

async fn create_then_lookup_is_byte_identical(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("alice", Some("\"look-1\""), &order_json("alice", "SKU-1", 2)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    // Both spellings of the key, as POST accepts them.
    for key in ["\"look-1\"", "look-1"] {
        let res = svc.client.lookup("alice", key).await;
        assert_eq!(res.status, StatusCode::OK, "{key}: {}", res.text());
        assert_eq!(res.body, created.body, "the create's body, byte for byte");
        assert_eq!(res.header("content-type"), Some("application/json"));
        assert_eq!(res.header("idempotency-backstop"), None);
    }
    assert_eq!(rows(url).await.len(), 1, "a lookup creates nothing");
    assert_eq!(svc.stats().await["backstop_hits"], 0, "a lookup is not a duplicate");
    svc.stop().await.expect("clean stop");
}

async fn lookup_is_scoped_to_the_caller(url: &str) {
    let svc = Service::start(url).await;
    let alices = svc.client.post_order("alice", Some("shared"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!(alices.status, StatusCode::CREATED);

    let res = svc.client.lookup("bob", "shared").await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.text());
    assert_eq!(res.json(), serde_json::json!({ "error": "order not found" }), "no trace of alice's order");

    // Once bob has his own order under the same key, each sees only their own.
    let bobs = svc.client.post_order("bob", Some("shared"), &order_json("bob", "SKU-2", 4)).await;
    assert_eq!(bobs.status, StatusCode::CREATED);
    assert_ne!(alices.body, bobs.body);
    assert_eq!(svc.client.lookup("alice", "shared").await.body, alices.body);
    assert_eq!(svc.client.lookup("bob", "shared").await.body, bobs.body);
    svc.stop().await.expect("clean stop");
}

async fn lookup_of_an_unknown_key_is_404(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("alice", Some("known"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!(created.status, StatusCode::CREATED);
    for key in ["unknown", "\"Known\"", "known-2"] {
        let res = svc.client.lookup("alice", key).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{key}: {}", res.text());
        assert_eq!(res.header("content-type"), Some("application/json"));
        assert_eq!(res.json(), serde_json::json!({ "error": "order not found" }));
    }
    svc.stop().await.expect("clean stop");
}

async fn lookup_needs_a_bearer_and_a_key(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("alice", Some("k"), &order_json("alice", "SKU-1", 1)).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_unauthenticated(&svc.client.get("/orders/lookup?key=k").await, "Bearer");
    let no_bearer = [("idempotency-key", "k")];
    assert_unauthenticated(&svc.client.request(Method::GET, "/orders/lookup", &no_bearer, "").await, "Bearer");

    let res = svc.client.get_as("alice", "/orders/lookup").await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST, "{}", res.text());
    assert_eq!(res.json(), serde_json::json!({ "error": "missing Idempotency-Key header or key query parameter" }));
    // Malformed keys are refused as POST refuses them, in the header or the query.
    for key in ["", "two words", "\"a\";p=1"] {
        let res = svc.client.lookup("alice", key).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{key:?}: {}", res.text());
    }
    for query in ["key=", "key=k&key=k", "key=%zz", "key=%C3%A9", "key=a%0Ab"] {
        let res = svc.client.get_as("alice", &format!("/orders/lookup?{query}")).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{query}: {}", res.text());
        assert!(res.json()["error"].is_string());
    }
    svc.stop().await.expect("clean stop");
}

async fn lookup_by_query_parameter(url: &str) {
    let svc = Service::start(url).await;
    let plain = svc.client.post_order("alice", Some("q-1"), &order_json("alice", "SKU-1", 1)).await;
    let spaced = svc.client.post_order("alice", Some(r#""q 2/+""#), &order_json("alice", "SKU-2", 1)).await;
    let quoted = svc.client.post_order("alice", Some(r#""\"q-1\"""#), &order_json("alice", "SKU-3", 1)).await;
    for res in [&plain, &spaced, &quoted] {
        assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
    }

    // The query holds the stored key, percent-decoded: no second layer of sf-string quotes,
    // so `%22q-1%22` is the key `"q-1"`, not `q-1`.
    for (query, expected) in [
        ("key=q-1", &plain),
        ("key=%71%2D%31", &plain),
        ("other=x&key=q-1", &plain),
        ("key=q%202/+", &spaced),
        ("key=q%202%2F%2B", &spaced),
        ("key=%22q-1%22", &quoted),
    ] {
        let res = svc.client.get_as("alice", &format!("/orders/lookup?{query}")).await;
        assert_eq!(res.status, StatusCode::OK, "{query}: {}", res.text());
        assert_eq!(res.body, expected.body, "{query}");
        assert_eq!(res.header("content-type"), Some("application/json"));
    }

    // The header, when present, is the key; the query is not consulted.
    let headers = [("authorization", "Bearer alice"), ("idempotency-key", "q-1")];
    let res = svc.client.request(Method::GET, "/orders/lookup?key=nope", &headers, "").await;
    assert_eq!(res.body, plain.body);
    let headers = [("authorization", "Bearer alice"), ("idempotency-key", "nope")];
    let res = svc.client.request(Method::GET, "/orders/lookup?key=q-1", &headers, "").await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);

    // Scoped like the header form.
    assert_eq!(svc.client.get_as("bob", "/orders/lookup?key=q-1").await.status, StatusCode::NOT_FOUND);
    svc.stop().await.expect("clean stop");
}

async fn hostile_query_keys_are_just_keys(url: &str) {
    let svc = Service::start(url).await;
    let created = svc.client.post_order("alice", Some("x"), &order_json("alice", "SKU-1", 1)).await;
    let id = created.json()["order_id"].as_i64().expect("order_id");
    for query in ["key=../x", "key=..%2Fx", "key=a/b", "key=%2F", "key=%2E%2E%2F", &format!("key=../{id}")] {
        let res = svc.client.get_as("alice", &format!("/orders/lookup?{query}")).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{query}: {}", res.text());
        assert_eq!(res.json(), serde_json::json!({ "error": "order not found" }), "{query}");
    }
    // And a key that looks like a path is found when it is one.
    let odd = svc.client.post_order("alice", Some("../x"), &order_json("alice", "SKU-2", 1)).await;
    assert_eq!(odd.status, StatusCode::CREATED, "{}", odd.text());
    assert_eq!(svc.client.get_as("alice", "/orders/lookup?key=..%2Fx").await.body, odd.body);
    assert_eq!(svc.client.get_as("alice", "/orders/lookup?key=../x").await.body, odd.body);
    assert_eq!(rows(url).await.len(), 2);
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
                client.post_order("dave", Some("race"), &body).await
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
    let res = client.post_order("erin", Some("s-1"), &order_json("erin", "SKU-1", 1)).await;
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
        tokio::spawn(
            async move { client.post_order("grace", Some("in-flight"), &order_json("grace", "SKU-1", 1)).await },
        );
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
