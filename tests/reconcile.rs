//! Unknown outcomes resolved by asking the upstream (`[routes.idempotency.reconcile]`), and the
//! operator's tools for the rest (`GET /keys?state=`, `PUT /keys`).
//!
//! The upstream here is a small order service with a real lookup: it keeps orders by (caller,
//! key), can drop a connection after executing, before executing, or take longer than the
//! gateway's timeout while executing, and counts every execution and every lookup. Assertions
//! are on what it executed, not only on what the client saw.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use support::client::{Client, Reply};
use support::cluster::RedisCluster;
use support::gateway::{StoreKind, TestGateway};
use support::gateway_proc::{GatewayProc, Toml};
use support::redis::RedisServer;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;
const AUTH: &str = "Bearer alice";
const TOKEN: &str = "test-admin-token-0123456789";

/// How the order service treats the next order POSTs and lookups.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Post {
    Answer,
    /// Stores the order, then closes the connection without an answer.
    DropAfter,
    /// Closes the connection without storing anything.
    DropBefore,
    /// Answers after this long, storing the order at the end (the gateway gives up first).
    Slow(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lookup {
    Answer,
    Delay(Duration),
    Fail,
}

#[derive(Default)]
struct Shop {
    orders: Mutex<HashMap<(String, String), u64>>,
    posts: Mutex<Vec<(String, Option<String>)>>,
    lookups: Mutex<Vec<String>>,
    lookup_headers: Mutex<Vec<http::HeaderMap>>,
    mode: Mutex<Option<Post>>,
    lookup: Mutex<Option<Lookup>>,
}

struct Orders {
    addr: SocketAddr,
    shop: Arc<Shop>,
}

impl Orders {
    async fn start() -> Self {
        let shop = Arc::new(Shop::default());
        *shop.mode.lock().unwrap() = Some(Post::Answer);
        *shop.lookup.lock().unwrap() = Some(Lookup::Answer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::clone(&shop);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| serve(Arc::clone(&state), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, shop }
    }

    fn set(&self, post: Post) {
        *self.shop.mode.lock().unwrap() = Some(post);
    }

    fn set_lookup(&self, lookup: Lookup) {
        *self.shop.lookup.lock().unwrap() = Some(lookup);
    }

    /// Orders created (executions that took effect).
    fn orders(&self) -> usize {
        self.shop.orders.lock().unwrap().len()
    }

    /// POSTs that reached it, with their attempt header.
    fn posts(&self) -> Vec<(String, Option<String>)> {
        self.shop.posts.lock().unwrap().clone()
    }

    fn lookups(&self) -> Vec<String> {
        self.shop.lookups.lock().unwrap().clone()
    }
}

type Served = Result<Response<Full<Bytes>>, std::io::Error>;

fn order_body(id: u64) -> Bytes {
    Bytes::from(format!(r#"{{"order_id": {id}, "status": "created"}}"#))
}

async fn serve(shop: Arc<Shop>, req: Request<Incoming>) -> Served {
    let (parts, body) = req.into_parts();
    let _ = body.collect().await;
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let caller = header("authorization").unwrap_or_default();
    let key = header("idempotency-key").unwrap_or_default();
    let path = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    if parts.method == Method::GET {
        shop.lookups.lock().unwrap().push(path);
        shop.lookup_headers.lock().unwrap().push(parts.headers.clone());
        let mode = shop.lookup.lock().unwrap().unwrap_or(Lookup::Answer);
        match mode {
            Lookup::Fail => return Ok(respond(500, Bytes::from_static(b"{}"))),
            Lookup::Delay(d) => tokio::time::sleep(d).await,
            Lookup::Answer => {}
        }
        let found = shop.orders.lock().unwrap().get(&(caller, key)).copied();
        return Ok(match found {
            Some(id) => respond(200, order_body(id)),
            None => respond(404, Bytes::from_static(b"{\"error\":\"not found\"}")),
        });
    }
    shop.posts.lock().unwrap().push((key.clone(), header("idempotency-attempt")));
    let mode = shop.mode.lock().unwrap().unwrap_or(Post::Answer);
    let store = move |shop: &Shop| {
        let mut orders = shop.orders.lock().unwrap();
        let next = orders.len() as u64 + 1;
        *orders.entry((caller.clone(), key.clone())).or_insert(next)
    };
    match mode {
        Post::Answer => Ok(respond(201, order_body(store(&shop)))),
        Post::DropAfter => {
            store(&shop);
            Err(std::io::Error::other("dropped after executing"))
        }
        Post::DropBefore => Err(std::io::Error::other("dropped before executing")),
        // Detached, as in a server that goes on when its client hangs up.
        Post::Slow(d) => {
            let work = tokio::spawn(async move {
                tokio::time::sleep(d).await;
                store(&shop)
            });
            Ok(respond(201, order_body(work.await.unwrap())))
        }
    }
}

fn respond(status: u16, body: Bytes) -> Response<Full<Bytes>> {
    Response::builder().status(status).header("content-type", "application/json").body(Full::new(body)).unwrap()
}

/// A gateway config: the orders route holds unknown outcomes and reconciles with `reconcile`.
fn config(store: &StoreKind, upstream: SocketAddr, timeout: &str, reconcile: &str) -> String {
    let store = store.toml(&support::unique("rc"));
    let policy = format!(
        "scope = \"header:Authorization\"\nwait = \"3s\"\n\n[routes.idempotency.reconcile]\npath = \"/orders/lookup\"\n{reconcile}\n"
    );
    Toml {
        server: &format!("admin_token = \"{TOKEN}\"\nshutdown_grace = \"2s\""),
        store: &store,
        upstream_lines: &format!("timeout = \"{timeout}\"\nconnect_timeout = \"1s\""),
        policy: &policy,
        ..Toml::new(upstream)
    }
    .render()
}

async fn post(client: &Client, key: &str) -> Reply {
    client.post_json_as("/orders", Some(key), Some(AUTH), ORDER).await
}

fn admin(gw: &TestGateway) -> Client {
    gw.admin_client()
}

async fn key_state_by_hash(gw: &TestGateway, key: &str, hash: &str) -> serde_json::Value {
    let path = format!("/keys?route=orders&key={}&scope_hash={hash}", urlencode(key));
    admin(gw).get(&path, &[("authorization", &format!("Bearer {TOKEN}"))]).await.json()
}

async fn key_state(gw: &TestGateway, key: &str) -> serde_json::Value {
    let path = format!("/keys?route=orders&key={}", urlencode(key));
    admin(gw).get(&path, &[("authorization", &format!("Bearer {TOKEN}")), ("scope-authorization", AUTH)]).await.json()
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

async fn wait_until<F, Fut>(what: &str, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if ok().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

// ---- scenarios on every store ------------------------------------------------------------

async fn an_answer_lost_after_executing_is_found_and_replayed(store: StoreKind) {
    let orders = Orders::start().await;
    let gw = TestGateway::start(&config(&store, orders.addr, "2s", "after = \"off\"")).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    let lost = post(&client, "k-after").await;
    assert_eq!((lost.status.as_u16(), lost.problem().as_str()), (502, "outcome-unknown"));
    // The first client is told to retry with the same key, not to make a new one.
    assert!(lost.json()["detail"].as_str().unwrap().contains("retry with the same key"), "{:?}", lost.body);
    assert_eq!(lost.header("retry-after"), Some("1"));
    assert_eq!(key_state(&gw, "k-after").await["state"], "unknown");

    orders.set(Post::Answer);
    let retry = post(&client, "k-after").await;
    assert_eq!(retry.status, StatusCode::OK, "the lookup's status: no answer_status is set");
    assert!(retry.is_replay());
    assert_eq!(retry.header("idempotency-status"), Some("reconciled"));
    assert_eq!(retry.body, order_body(1));
    // The lookup carried the key and the caller as the request did.
    let seen = orders.shop.lookup_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].get("idempotency-key").unwrap(), "k-after");
    assert_eq!(seen[0].get("authorization").unwrap(), AUTH);
    // Later retries replay the stored answer without asking again.
    let again = post(&client, "k-after").await;
    assert!(again.is_replay());
    assert_eq!(again.header("idempotency-status"), None);
    assert_eq!(again.body, order_body(1));
    assert_eq!(orders.lookups().len(), 1);
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1), "executed once");
    assert_eq!(key_state(&gw, "k-after").await["state"], "completed");
    gw.shutdown().await;
}

async fn a_request_the_upstream_never_ran_runs_again_as_the_next_attempt(store: StoreKind) {
    let orders = Orders::start().await;
    let gw = TestGateway::start(&config(&store, orders.addr, "2s", "after = \"off\"")).await;
    let client = gw.client();
    orders.set(Post::DropBefore);
    let lost = post(&client, "k-before").await;
    assert_eq!(lost.status, 502);
    orders.set(Post::Answer);
    // The upstream closed the connection itself: its "not found" is proof at once.
    let retry = post(&client, "k-before").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.is_replay(), "it ran, as a first execution");
    assert_eq!(retry.body, order_body(1));
    let posts = orders.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[1].1.as_deref(), Some("2"), "announced as attempt 2");
    assert_eq!(orders.orders(), 1, "one order in the end");
    assert_eq!(orders.lookups().len(), 1);
    gw.shutdown().await;
}

async fn the_gateway_that_lost_the_answer_asks_by_itself(store: StoreKind) {
    let orders = Orders::start().await;
    let gw = TestGateway::start(&config(&store, orders.addr, "2s", "after = \"200ms\"")).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "k-bg").await.status, 502);
    wait_until("the background lookup", || async { key_state(&gw, "k-bg").await["state"] == "completed" }).await;
    let retry = post(&client, "k-bg").await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, order_body(1));
    assert_eq!((orders.posts().len(), orders.lookups().len()), (1, 1));
    gw.shutdown().await;
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::StoreKind::Memory).await;
            })*
        }
        mod redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::StoreKind::Redis(super::RedisServer::shared().url())).await;
            })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::StoreKind::Redis(super::cluster().url())).await;
            })*
        }
    };
}

on_every_store!(
    an_answer_lost_after_executing_is_found_and_replayed,
    a_retry_that_meets_a_running_lookup_waits_for_its_answer,
    a_lookup_that_outlasts_the_wait_answers_409_with_retry_after,
    a_retry_whose_awaited_lookup_settles_nothing_is_told_when_to_come_back,
    a_request_the_upstream_never_ran_runs_again_as_the_next_attempt,
    the_gateway_that_lost_the_answer_asks_by_itself,
    the_binary_reconciles_and_its_cli_lists_and_resolves,
    executed_records_are_listed_and_resolvable,
);

fn cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

// ---- the hazards -------------------------------------------------------------------------

/// A request that timed out may still be running: a "not found" then is no proof, and the key
/// stays unknown (with a Retry-After) until the upstream's timeout plus `release_after` have
/// passed. The order lands late, and the retry after that gets it: one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_while_the_upstream_may_still_run_it_is_not_trusted() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let gw = TestGateway::start(&config(&store, orders.addr, "1s", "after = \"off\"\nrelease_after = \"1s\"")).await;
    let client = gw.client();
    orders.set(Post::Slow(Duration::from_millis(1500)));
    let started = std::time::Instant::now();
    let lost = post(&client, "k-slow").await;
    assert_eq!((lost.status.as_u16(), lost.problem().as_str()), (504, "outcome-unknown"));
    orders.set(Post::Answer);
    // The upstream is still working on it: its lookup says 404.
    let early = post(&client, "k-slow").await;
    assert_eq!((early.status.as_u16(), early.problem().as_str()), (502, "outcome-unknown"));
    let retry_after: u64 = early.header("retry-after").expect("a Retry-After").parse().unwrap();
    assert!((1..=2).contains(&retry_after), "until timeout + release_after: {retry_after}");
    assert_eq!(orders.posts().len(), 1, "not run again");
    // The order lands; once the window has passed, the lookup finds it.
    tokio::time::sleep(Duration::from_millis(2200).saturating_sub(started.elapsed())).await;
    let found = post(&client, "k-slow").await;
    assert_eq!(found.header("idempotency-status"), Some("reconciled"), "{:?} {:?}", found.status, found.body);
    assert_eq!(found.body, order_body(1));
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1));
    let metrics = String::from_utf8_lossy(&admin(&gw).get("/metrics", &[]).await.body).into_owned();
    assert!(metrics.contains(r#"idemgate_reconciliations_total{route="orders",result="too_early"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"idemgate_reconciliations_total{route="orders",result="found"} 1"#), "{metrics}");
    gw.shutdown().await;
}

/// A lookup that times out settles nothing: the key stays unknown and free for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_that_times_out_leaves_the_key_unknown() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let gw = TestGateway::start(&config(&store, orders.addr, "1s", "after = \"off\"")).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "k-lt").await.status, 502);
    orders.set_lookup(Lookup::Delay(Duration::from_secs(3)));
    let retry = post(&client, "k-lt").await;
    assert_eq!((retry.status.as_u16(), retry.problem().as_str()), (502, "outcome-unknown"));
    let state = key_state(&gw, "k-lt").await;
    assert_eq!((state["state"].as_str(), state["lookup_in_flight"].as_bool()), (Some("unknown"), Some(false)));
    // A failing lookup (500) is no answer either.
    orders.set_lookup(Lookup::Fail);
    assert_eq!(post(&client, "k-lt").await.status, 502);
    // Once the lookup answers, the next retry gets the order.
    orders.set_lookup(Lookup::Answer);
    let found = post(&client, "k-lt").await;
    assert_eq!(found.header("idempotency-status"), Some("reconciled"));
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1));
    let metrics = String::from_utf8_lossy(&admin(&gw).get("/metrics", &[]).await.body).into_owned();
    assert!(metrics.contains(r#"idemgate_reconciliations_total{route="orders",result="failed"} 2"#), "{metrics}");
    gw.shutdown().await;
}

/// Retries at two gateways at once: one lookup in all, and both get the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_at_two_gateways_share_one_lookup() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let toml = config(&store, orders.addr, "2s", "after = \"off\"");
    let a = TestGateway::start(&toml).await;
    let b = TestGateway::start(&toml).await;
    orders.set(Post::DropAfter);
    assert_eq!(post(&a.client(), "k-two").await.status, 502);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(Duration::from_millis(500)));
    let (ca, cb) = (a.client(), b.client());
    let (ra, rb) = tokio::join!(post(&ca, "k-two"), post(&cb, "k-two"));
    for r in [&ra, &rb] {
        assert!(r.is_replay(), "{:?} {:?}", r.status, r.body);
        assert_eq!(r.header("idempotency-status"), Some("reconciled"));
        assert_eq!(r.body, order_body(1));
    }
    assert_eq!(orders.lookups().len(), 1, "one lookup across both gateways");
    assert_eq!(orders.posts().len(), 1);
    a.shutdown().await;
    b.shutdown().await;
}

/// An operator resolves the key while a lookup runs: the lookup's answer is not written over
/// the operator's, and every retry gets the operator's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolve_racing_a_lookup_wins_cleanly() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let gw = TestGateway::start(&config(&store, orders.addr, "2s", "after = \"off\"")).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "k-race").await.status, 502);
    orders.set_lookup(Lookup::Delay(Duration::from_millis(800)));
    let retry = tokio::spawn({
        let client = client.clone();
        async move { post(&client, "k-race").await }
    });
    wait_until("the lookup to start", || async { key_state(&gw, "k-race").await["lookup_in_flight"] == true }).await;
    let answer = r#"{"status": 201, "headers": {"content-type": "application/json"}, "body": "{\"order_id\": 1, \"by\": \"operator\"}"}"#;
    let put = admin(&gw)
        .send(
            Method::PUT,
            "/keys?route=orders&key=k-race",
            &[("authorization", &format!("Bearer {TOKEN}")), ("scope-authorization", AUTH)],
            answer,
        )
        .await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    assert_eq!(put.json(), serde_json::json!({"resolved": true, "was": "unknown"}));
    let retry = retry.await.unwrap();
    assert_eq!(retry.status, 201);
    assert_eq!(&retry.body[..], br#"{"order_id": 1, "by": "operator"}"#);
    assert_eq!(retry.header("idempotency-status"), Some("reconciled"));
    let later = post(&client, "k-race").await;
    assert_eq!(later.body, retry.body);
    // A second PUT finds the record completed: 409, nothing changed.
    let again = admin(&gw)
        .send(
            Method::PUT,
            "/keys?route=orders&key=k-race",
            &[("authorization", &format!("Bearer {TOKEN}")), ("scope-authorization", AUTH)],
            answer,
        )
        .await;
    assert_eq!((again.status.as_u16(), again.problem().as_str()), (409, "admin-conflict"));
    assert_eq!(orders.posts().len(), 1);
    gw.shutdown().await;
}

// ---- retries that meet a lookup in flight ----------------------------------------------------

/// The lookup answers only after this long, longer than the Redis store's 1 s poll of a
/// waiting retry: a retry that took that poll for the lookup's end was told to use a new key.
const SLOW_LOOKUP: Duration = Duration::from_millis(2500);

/// A retry that arrives while another retry's lookup runs waits for that lookup, across the
/// store's periodic wake-ups, and gets the answer it found; nothing runs twice.
async fn a_retry_that_meets_a_running_lookup_waits_for_its_answer(store: StoreKind) {
    let orders = Orders::start().await;
    let gw = TestGateway::start(&config(&store, orders.addr, "3s", "after = \"off\"")).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "k-wait").await.status, 502);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(SLOW_LOOKUP));
    let first = tokio::spawn({
        let client = client.clone();
        async move { post(&client, "k-wait").await }
    });
    wait_until("the lookup to start", || async { key_state(&gw, "k-wait").await["lookup_in_flight"] == true }).await;
    let started = std::time::Instant::now();
    let second = post(&client, "k-wait").await;
    let waited = started.elapsed();
    let first = first.await.unwrap();
    for (name, r) in [("the retry that asked", &first), ("the retry that waited", &second)] {
        assert_eq!(r.status, 200, "{name}: {:?} {:?} after {waited:?}", r.status, r.body);
        assert_eq!(r.header("idempotency-status"), Some("reconciled"), "{name}");
        assert_eq!(r.body, order_body(1), "{name}");
    }
    assert!(waited > Duration::from_millis(1500), "it waited for the lookup, not for a poll: {waited:?}");
    assert_eq!(orders.lookups().len(), 1, "one lookup");
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1), "executed once");
    gw.shutdown().await;
}

/// A lookup that outlasts the retries' `wait`: each is told the key is in progress, with a
/// Retry-After that covers the lookup, never to take a new key; the next retry gets the answer.
async fn a_lookup_that_outlasts_the_wait_answers_409_with_retry_after(store: StoreKind) {
    let orders = Orders::start().await;
    let toml = config(&store, orders.addr, "3s", "after = \"off\"").replace("wait = \"3s\"", "wait = \"1500ms\"");
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "k-long").await.status, 502);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(SLOW_LOOKUP));
    let first = tokio::spawn({
        let client = client.clone();
        async move { post(&client, "k-long").await }
    });
    wait_until("the lookup to start", || async { key_state(&gw, "k-long").await["lookup_in_flight"] == true }).await;
    let second = post(&client, "k-long").await;
    let first = first.await.unwrap();
    for (name, r) in [("the retry that asked", &first), ("the retry that waited", &second)] {
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (409, "in-progress"), "{name}: {:?}", r.body);
        let after: u64 = r.header("retry-after").expect("a Retry-After").parse().unwrap();
        // The lookup's lease: the upstream's timeout, a store call at each end, a second.
        assert!((1..=5).contains(&after), "{name}: Retry-After {after}");
        assert!(!r.json()["detail"].as_str().unwrap().contains("new key"), "{name}: {:?}", r.body);
    }
    wait_until("the lookup to end", || async { key_state(&gw, "k-long").await["state"] == "completed" }).await;
    let later = post(&client, "k-long").await;
    assert!(later.is_replay());
    assert_eq!(later.body, order_body(1));
    assert_eq!((orders.posts().len(), orders.lookups().len()), (1, 1));
    gw.shutdown().await;
}

/// The lookup a retry waited for ends without settling anything ("not found" while the
/// upstream may still run the request): the retry gets 502 with a Retry-After for when "not
/// found" becomes proof, and is told to retry with the same key.
async fn a_retry_whose_awaited_lookup_settles_nothing_is_told_when_to_come_back(store: StoreKind) {
    let orders = Orders::start().await;
    let gw = TestGateway::start(&config(&store, orders.addr, "1s", "after = \"off\"\nrelease_after = \"4s\"")).await;
    let client = gw.client();
    orders.set(Post::Slow(Duration::from_secs(10)));
    assert_eq!(post(&client, "k-early").await.status, 504);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(Duration::from_millis(1500)));
    let first = tokio::spawn({
        let client = client.clone();
        async move { post(&client, "k-early").await }
    });
    wait_until("the lookup to start", || async { key_state(&gw, "k-early").await["lookup_in_flight"] == true }).await;
    let second = post(&client, "k-early").await;
    let first = first.await.unwrap();
    for (name, r) in [("the retry that asked", &first), ("the retry that waited", &second)] {
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (502, "outcome-unknown"), "{name}: {:?}", r.body);
        let after: u64 = r.header("retry-after").expect("a Retry-After").parse().unwrap();
        assert!((1..=4).contains(&after), "{name}: until timeout + release_after, less what passed: {after}");
        let detail = r.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("retry with the same key after Retry-After"), "{name}: {detail}");
    }
    assert_eq!(orders.posts().len(), 1, "not run again");
    assert_eq!(orders.lookups().len(), 1, "the waiting retry started no lookup of its own");
    gw.shutdown().await;
}

/// Ten retries at two gateways on one Redis, during one slow lookup: every one gets the
/// answer the lookup found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_retries_at_two_gateways_all_get_the_lookups_answer() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let toml = config(&store, orders.addr, "3s", "after = \"off\"");
    let a = TestGateway::start(&toml).await;
    let b = TestGateway::start(&toml).await;
    orders.set(Post::DropAfter);
    assert_eq!(post(&a.client(), "k-ten").await.status, 502);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(Duration::from_millis(2000)));
    let mut retries = Vec::new();
    for i in 0..10 {
        let client = if i % 2 == 0 { a.client() } else { b.client() };
        retries.push(tokio::spawn(async move { post(&client, "k-ten").await }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, retry) in retries.into_iter().enumerate() {
        let r = retry.await.unwrap();
        assert_eq!(r.status, 200, "retry {i}: {:?} {:?}", r.status, r.body);
        assert_eq!(r.body, order_body(1), "retry {i}");
    }
    assert_eq!(orders.lookups().len(), 1, "one lookup across both gateways");
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1));
    a.shutdown().await;
    b.shutdown().await;
}

/// A retry that waits for a lookup whose gateway died (its lease passes and nobody ends it)
/// starts a lookup of its own, within its `wait`, and gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_outlives_a_lookup_whose_gateway_died() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    let toml = config(&store, orders.addr, "1s", "after = \"off\"").replace("wait = \"3s\"", "wait = \"6s\"");
    let mut dying = GatewayProc::start(&toml);
    let living = TestGateway::start(&toml).await;
    orders.set(Post::DropAfter);
    assert_eq!(post(&dying.client(), "k-dead").await.status, 502);
    orders.set(Post::Answer);
    orders.set_lookup(Lookup::Delay(Duration::from_secs(10)));
    // Its client gets no answer: the gateway is killed while its lookup runs.
    let doomed = dying.client();
    let headers = [("content-type", "application/json"), ("idempotency-key", "k-dead"), ("authorization", AUTH)];
    let asking = tokio::spawn(async move { doomed.try_send(Method::POST, "/orders", &headers, ORDER).await });
    wait_until("the lookup to start", || async { key_state(&living, "k-dead").await["lookup_in_flight"] == true })
        .await;
    dying.kill9();
    let _ = asking.await;
    orders.set_lookup(Lookup::Answer);
    let started = std::time::Instant::now();
    let retry = post(&living.client(), "k-dead").await;
    assert_eq!(retry.status, 200, "after {:?}: {:?}", started.elapsed(), retry.body);
    assert_eq!(retry.header("idempotency-status"), Some("reconciled"));
    assert_eq!(retry.body, order_body(1));
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1));
    assert_eq!(orders.lookups().len(), 2, "the dead gateway's, then the retry's own");
    living.shutdown().await;
}

/// No key can move the lookup to another path or add a parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_stay_inside_their_lookup() {
    let orders = Orders::start().await;
    let store = StoreKind::Memory;
    let toml = config(&store, orders.addr, "2s", "after = \"off\"")
        .replace("path = \"/orders/lookup\"", "path = \"/orders/by-key/{key}?key={key}\"");
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    let keys = ["..", "../admin", "\"a/b?c=d#e\"", "%2F", "\"quoted/..\"", "\"x&key=y\"", "\"a b\\\"c\""];
    for key in keys {
        orders.set(Post::DropAfter);
        assert_eq!(post(&client, key).await.status, 502, "{key}");
        orders.set(Post::Answer);
        let _ = post(&client, key).await;
    }
    let lookups = orders.lookups();
    assert_eq!(lookups.len(), keys.len());
    for (path, key) in lookups.iter().zip(keys) {
        let pq: http::uri::PathAndQuery = path.parse().unwrap();
        let segments: Vec<&str> = pq.path().split('/').collect();
        assert_eq!(&segments[..3], ["", "orders", "by-key"], "{key:?} -> {path}");
        assert_eq!(segments.len(), 4, "{key:?} -> {path}");
        let query: Vec<(String, String)> =
            form_urlencoded::parse(pq.query().unwrap().as_bytes()).into_owned().collect();
        assert_eq!(query.len(), 1, "{key:?} -> {path}");
        // The parsed key: an sf-string's inner value, as the upstream stores it.
        let parsed = key.strip_prefix('"').and_then(|k| k.strip_suffix('"')).unwrap_or(key).replace("\\\"", "\"");
        assert_eq!(query[0].1, parsed, "{key:?} -> {path}");
    }
    gw.shutdown().await;
}

// ---- operator tools ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_held_keys_page_by_page_and_settle_them() {
    let orders = Orders::start().await;
    let store = StoreKind::Redis(RedisServer::shared().url());
    // No reconcile table: the keys stay unknown for the operator.
    let toml = config(&store, orders.addr, "2s", "after = \"off\"")
        .replace("\n[routes.idempotency.reconcile]\npath = \"/orders/lookup\"\nafter = \"off\"\n", "\n");
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    orders.set(Post::DropAfter);
    let keys = ["held-1", "held-2", "\"held 3/?\""];
    for key in keys {
        assert_eq!(post(&client, key).await.status, 502);
    }
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let mut listed = Vec::new();
    let mut cursor = String::new();
    wait_until("the index", || async {
        let r = admin(&gw).get("/keys?route=orders&state=unknown&limit=10", &auth).await;
        r.json()["records"].as_array().is_some_and(|a| a.len() == 3)
    })
    .await;
    loop {
        let r = admin(&gw).get(&format!("/keys?route=orders&state=unknown&limit=2&cursor={cursor}"), &auth).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let doc = r.json();
        for record in doc["records"].as_array().unwrap() {
            assert_eq!(record["state"], "unknown");
            assert_eq!(record["method"], "POST");
            assert_eq!(record["path"], "/orders");
            assert_eq!(record["attempt"], 1);
            assert_eq!(record["scope_hash"].as_str().unwrap().len(), 64);
            assert!(record["since_ms"].as_u64().unwrap() < 60_000);
            listed.push(record["key"].as_str().unwrap().to_owned());
        }
        match doc["next_cursor"].as_str() {
            Some(next) => cursor = urlencode(next),
            None => break,
        }
    }
    listed.sort();
    let mut expected: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    let metrics = String::from_utf8_lossy(&admin(&gw).get("/metrics", &[]).await.body).into_owned();
    assert!(metrics.contains(r#"idemgate_unknown_records{route="orders"} 3"#), "{metrics}");
    // Settle one by the scope hash the list gave, release another.
    let first = admin(&gw).get("/keys?route=orders&state=unknown", &auth).await.json();
    let hash = first["records"][0]["scope_hash"].as_str().unwrap().to_owned();
    let target = format!("/keys?route=orders&key=held-1&scope_hash={hash}");
    // What a replay never carries is refused by name, and nothing changes.
    let refused = admin(&gw)
        .send(
            Method::PUT,
            &target,
            &auth,
            r#"{"status": 201, "headers": {"content-type": "application/json", "set-cookie": "no"}, "body": "{\"order_id\": 1}"}"#,
        )
        .await;
    assert_eq!((refused.status.as_u16(), refused.problem().as_str()), (400, "admin-bad-request"));
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.starts_with("The header set-cookie cannot be part of a stored answer"), "{detail}");
    assert_eq!(key_state_by_hash(&gw, "held-1", &hash).await["state"], "unknown");
    let put = admin(&gw)
        .send(
            Method::PUT,
            &target,
            &auth,
            r#"{"status": 201, "headers": {"content-type": "application/json"}, "body": "{\"order_id\": 1}"}"#,
        )
        .await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    let replay = post(&client, "held-1").await;
    assert_eq!((replay.status.as_u16(), &replay.body[..]), (201, &br#"{"order_id": 1}"#[..]));
    let del =
        admin(&gw).send(Method::DELETE, &format!("/keys?route=orders&key=held-2&scope_hash={hash}"), &auth, "").await;
    assert_eq!(del.json(), serde_json::json!({"released": true, "was": "unknown"}));
    let left = admin(&gw).get("/keys?route=orders&state=unknown", &auth).await.json();
    let left: Vec<&str> = left["records"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(left, ["\"held 3/?\""]);
    // Bad input gets a clear 400 and changes nothing.
    for (method, path, body) in [
        (Method::GET, "/keys?route=orders&state=bogus", ""),
        (Method::GET, "/keys?route=orders&state=unknown&limit=0", ""),
        (Method::GET, "/keys?route=orders&state=unknown&cursor=zz", ""),
        (Method::PUT, "/keys?route=orders&key=%22held%203%2F%3F%22", "{\"status\": 99}"),
        (Method::PUT, "/keys?route=orders&key=%22held%203%2F%3F%22", "not json"),
        // A length that lies would split the responses of every connection that replays it.
        (
            Method::PUT,
            "/keys?route=orders&key=%22held%203%2F%3F%22",
            r#"{"status":201,"headers":{"content-length":"2"},"body":"{\"order_id\":1}"}"#,
        ),
        (
            Method::PUT,
            "/keys?route=orders&key=%22held%203%2F%3F%22",
            r#"{"status":201,"headers":{"Transfer-Encoding":"chunked"}}"#,
        ),
        (Method::PUT, "/keys?route=orders&key=%22held%203%2F%3F%22", r#"{"status":204,"body":"x"}"#),
    ] {
        let scoped = [("authorization", bearer.as_str()), ("scope-authorization", AUTH)];
        let r = admin(&gw).send(method.clone(), path, &scoped, body).await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (400, "admin-bad-request"), "{method} {path}");
    }
    assert_eq!(key_state(&gw, "\"held 3/?\"").await["state"], "unknown");
    // A key looked up without its caller, on a route that keeps keys per caller: not "absent"
    // (it is there, stuck), but how to name the caller.
    for method in [Method::GET, Method::DELETE] {
        let r = admin(&gw)
            .send(
                method.clone(),
                "/keys?route=orders&key=%22held%203%2F%3F%22",
                &[("authorization", bearer.as_str())],
                "",
            )
            .await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (400, "admin-bad-request"), "{method}");
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains("keeps keys per caller"), "{detail}");
        // The variable that sends the route's scope header, by its name.
        assert!(detail.contains("the IDEMGATE_SCOPE_AUTHORIZATION variable,"), "{detail}");
        assert!(!detail.contains("<NAME>"), "{detail}");
    }
    assert_eq!(key_state(&gw, "\"held 3/?\"").await["state"], "unknown", "nothing released");
    // A route that is not there: the answer lists the ones that are, and echoes the name bounded.
    let long = "x".repeat(500);
    for asked in ["order", long.as_str()] {
        let path = format!("/keys?route={asked}&key=k");
        let r = admin(&gw).send(Method::GET, &path, &[("authorization", bearer.as_str())], "").await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (400, "admin-bad-request"));
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains("the idempotent routes are \"orders\""), "{detail}");
        assert!(detail.len() < 200, "{detail}");
    }
    gw.shutdown().await;
}

/// A record whose answer was too large to keep is `executed`: listed under that state, and an
/// operator can give it the answer to replay.
async fn executed_records_are_listed_and_resolvable(store: StoreKind) {
    let orders = Orders::start().await;
    let toml = config(&store, orders.addr, "2s", "after = \"off\"")
        .replace("wait = \"3s\"", "wait = \"3s\"\nmax_stored_body = \"16B\"");
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    assert_eq!(post(&client, "big-1").await.status, 201);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    wait_until("the index", || async {
        let r = admin(&gw).get("/keys?route=orders&state=executed", &auth).await;
        r.json()["records"].as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    let listed = admin(&gw).get("/keys?route=orders&state=executed", &auth).await.json();
    assert_eq!(listed["records"][0]["key"], "big-1");
    assert_eq!(listed["records"][0]["state"], "executed");
    let none = admin(&gw).get("/keys?route=orders&state=unknown", &auth).await.json();
    assert_eq!(none["records"], serde_json::json!([]));
    assert_eq!(post(&client, "big-1").await.problem(), "response-not-stored");
    let scoped = [("authorization", bearer.as_str()), ("scope-authorization", AUTH)];
    let put = admin(&gw)
        .send(Method::PUT, "/keys?route=orders&key=big-1", &scoped, r#"{"status": 201, "body": "{\"order_id\": 1}"}"#)
        .await;
    assert_eq!(put.json(), serde_json::json!({"resolved": true, "was": "executed"}));
    let replay = post(&client, "big-1").await;
    assert_eq!((replay.status.as_u16(), &replay.body[..]), (201, &br#"{"order_id": 1}"#[..]));
    let gone = admin(&gw).get("/keys?route=orders&state=executed", &auth).await.json();
    assert_eq!(gone["records"], serde_json::json!([]));
    assert_eq!(orders.posts().len(), 1);
    gw.shutdown().await;
}

// ---- configuration ----------------------------------------------------------------------

#[test]
fn reconcile_is_refused_where_nothing_is_held_and_checked_everywhere() {
    let base = |policy: &str| Toml { policy, ..Toml::new("127.0.0.1:9".parse().unwrap()) }.render();
    let refused = idemgate::config::Config::from_toml(
        &base("on_unknown_outcome = \"release\"\n[routes.idempotency.reconcile]\npath = \"/l\""),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("routes[0] (\"orders\").idempotency.reconcile"), "{refused}");
    for (policy, expected) in [
        ("[routes.idempotency.reconcile]\nmethod = \"GET\"", "reconcile.path: is required"),
        ("[routes.idempotency.reconcile]\npath = \"/l/{id}\"", "the only placeholder is {key}"),
        ("[routes.idempotency.reconcile]\npath = \"/l\"\nafter = \"soon\"", "reconcile.after"),
        ("[routes.idempotency.reconcile]\npath = \"/l\"\nfound = [\"2xx\", 404]", "404 is in found too"),
        ("[routes.idempotency.reconcile]\npath = \"/l\"\nanswer_status = 99", "reconcile.answer_status"),
        ("[routes.idempotency.reconcile]\npath = \"/l\"\nfund = [200]", "fund"),
    ] {
        let e = idemgate::config::Config::from_toml(&base(policy), "t").unwrap_err().to_string();
        assert!(e.contains(expected), "{policy}: {e}");
    }
    let held = idemgate::config::Config::from_toml(&base(""), "t").unwrap();
    assert!(held.warning_lines("t").iter().any(|w| w.contains("without [routes.idempotency.reconcile]")));
    let in_path =
        idemgate::config::Config::from_toml(&base("[routes.idempotency.reconcile]\npath = \"/l/{key}\""), "t").unwrap();
    let warnings = in_path.warning_lines("t");
    assert!(warnings.iter().any(|w| w.contains("puts {key} in the path")), "{warnings:?}");
    let fine = idemgate::config::Config::from_toml(
        &base("[routes.idempotency.reconcile]\npath = \"/l?key={key}\"\nafter = \"off\"\nanswer_status = 201"),
        "t",
    )
    .unwrap();
    assert!(fine.warning_lines("t").iter().all(|w| !w.contains("reconcile")), "{:?}", fine.warning_lines("t"));
    for status in [204, 205, 304] {
        let toml =
            base(&format!("[routes.idempotency.reconcile]\npath = \"/l?key={{key}}\"\nanswer_status = {status}"));
        let warnings = idemgate::config::Config::from_toml(&toml, "t").unwrap().warning_lines("t");
        let said = warnings.iter().find(|w| w.contains("reconcile.answer_status")).expect("a warning");
        assert!(said.contains(&format!("{status} has no body")) && said.contains("without a Content-Length"), "{said}");
    }
}

/// `answer_status = 204`: a found answer is replayed as a 204, without the lookup's body and
/// without a length, and the next request on the connection gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_found_answer_replayed_as_204_has_no_body_and_no_length() {
    let orders = Orders::start().await;
    let store = StoreKind::Memory;
    let gw = TestGateway::start(&config(&store, orders.addr, "2s", "after = \"off\"\nanswer_status = 204")).await;
    orders.set(Post::DropAfter);
    assert_eq!(post(&gw.client(), "k-204").await.status, 502);
    orders.set(Post::Answer);
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let retry = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k-204\r\nauthorization: {AUTH}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{ORDER}\
         GET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ORDER.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut stream, retry.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).to_lowercase();
    let second = text.find("\r\n\r\nhttp/1.1 ").map(|at| at + 4).expect("two responses, the first without a body");
    let first = &text[..second];
    assert!(first.starts_with("http/1.1 204"), "{text}");
    assert!(first.contains("idempotency-status: reconciled"), "{text}");
    assert!(!first.contains("content-length") && !first.contains("order_id"), "{text}");
    assert!(text[second..].starts_with("http/1.1 "), "{text}");
    assert_eq!(orders.posts().len(), 1);
    gw.shutdown().await;
}

/// The shipped binary, end to end: a lost answer found on retry, and the operator's CLI
/// listing and resolving a key on a route that does not reconcile.
async fn the_binary_reconciles_and_its_cli_lists_and_resolves(store: StoreKind) {
    let orders = Orders::start().await;
    let held_route = "\n[[routes]]\nname = \"held\"\nmethods = [\"POST\"]\npath = \"/held\"\nupstream = \"app\"\n\n\
        [routes.idempotency]\nscope = \"header:Authorization\"\n";
    let toml = format!("{}{held_route}", config(&store, orders.addr, "2s", "after = \"off\""))
        // The catch-all route must stay last.
        .replace("\n[[routes]]\nname = \"rest\"\npath = \"/{*rest}\"\nupstream = \"app\"\n", "");
    let gw = GatewayProc::start(&toml);
    let client = gw.client();
    orders.set(Post::DropAfter);
    assert_eq!(post(&client, "bin-1").await.status, 502);
    orders.set(Post::Answer);
    let found = post(&client, "bin-1").await;
    assert_eq!(found.header("idempotency-status"), Some("reconciled"));
    assert_eq!((orders.posts().len(), orders.orders()), (1, 1));

    orders.set(Post::DropAfter);
    let held = client.post_json_as("/held", Some("cli-1"), Some(AUTH), ORDER).await;
    assert_eq!(held.status, 502);
    let admin_url = format!("http://{}", gw.admin);
    let cli = |args: &[&str], scope: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"));
        cmd.arg("keys").args(args).env("IDEMGATE_ADMIN_TOKEN", TOKEN);
        if scope {
            cmd.env("IDEMGATE_SCOPE_AUTHORIZATION", AUTH);
        }
        cmd.output().unwrap()
    };
    let mut listed = String::new();
    for _ in 0..100 {
        let out = cli(&["list", "--admin", &admin_url, "--route", "held", "--json"], false);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if listed.contains("cli-1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(listed.contains("cli-1"), "{listed}");
    let out = cli(
        &[
            "resolve",
            "--admin",
            &admin_url,
            "--route",
            "held",
            "--key",
            "cli-1",
            "--status",
            "201",
            "--body",
            "{\"order_id\": 9}",
        ],
        true,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let replay = client.post_json_as("/held", Some("cli-1"), Some(AUTH), ORDER).await;
    assert_eq!((replay.status.as_u16(), &replay.body[..]), (201, &b"{\"order_id\": 9}"[..]));
    assert!(replay.is_replay());
    let out = cli(&["show", "--admin", &admin_url, "--route", "held", "--key", "cli-1", "--json"], true);
    assert!(String::from_utf8_lossy(&out.stdout).contains("completed"));
    assert_eq!(orders.posts().len(), 2, "each request ran once");
}
