//! The guarantee at its edges: "a retry never runs twice, and never sees another caller's
//! answer", where it is easiest to break. Each test drives the gateway (in process, on a
//! private `redis-server`) against a real upstream over TCP and asserts on what reached the
//! upstream: an upstream that executes then drops the connection or sends half a body, every
//! spelling of a path, scopes from cookies and from several headers, a `Connection` header
//! that would strip what the route needs, Redis replies delayed past the store timeout (a TCP
//! proxy between the gateway and Redis), a lease lost mid-request, and a failover.

use crate::support;

use std::time::{Duration, Instant};

use http::Method;
use support::client::{Client, DEFAULT_AUTH, Reply};
use support::gateway::{StoreKind, TestGateway, config};
use support::proxy::TcpProxy;
use support::raw_upstream::{Misbehaviour, RawUpstream};
use support::redis::RedisServer;
use support::upstream::{Behavior, TestUpstream};

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;

fn redis() -> StoreKind {
    StoreKind::Redis(RedisServer::shared().url())
}

async fn gateway(upstream: std::net::SocketAddr, policy: &str) -> TestGateway {
    TestGateway::start(&config(&redis(), upstream, policy)).await
}

async fn post(client: &Client, path: &str, key: &str, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("content-type", "application/json"), ("idempotency-key", key)];
    all.extend_from_slice(headers);
    client.send(Method::POST, path, &all, ORDER).await
}

// ---- unknown outcomes --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_executes_then_drops_the_connection_is_never_run_again() {
    let upstream = RawUpstream::start(Misbehaviour::CloseAfterRequest).await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("dropped"), ORDER).await;
    assert_eq!((first.status.as_u16(), first.problem().as_str()), (502, "outcome-unknown"));
    upstream.set(Misbehaviour::Answer);
    for _ in 0..3 {
        let retry = client.post_json("/orders", Some("dropped"), ORDER).await;
        assert_eq!((retry.status.as_u16(), retry.problem().as_str()), (502, "outcome-unknown"));
    }
    assert_eq!(upstream.executions(), 1, "the retry did not run the request again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_sends_half_a_body_is_never_run_again() {
    let upstream = RawUpstream::start(Misbehaviour::HalfBody).await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("half"), ORDER).await;
    assert_eq!((first.status.as_u16(), first.problem().as_str()), (502, "outcome-unknown"));
    upstream.set(Misbehaviour::Answer);
    let retry = client.post_json("/orders", Some("half"), ORDER).await;
    assert_eq!(retry.problem(), "outcome-unknown");
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_released_by_an_operator_and_then_runs_as_attempt_two() {
    let upstream = RawUpstream::start(Misbehaviour::CloseAfterRequest).await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    client.post_json("/orders", Some("reconcile"), ORDER).await;
    let admin = gw.admin_client();
    let auth = [("authorization", "Bearer test-admin-token-0123456789"), ("scope-authorization", DEFAULT_AUTH)];
    let path = "/keys?route=orders&key=reconcile";
    assert_eq!(admin.get(path, &auth).await.json()["state"], "unknown");
    let released = admin.send(Method::DELETE, path, &auth, "").await;
    assert_eq!(released.json()["was"], "unknown");
    upstream.set(Misbehaviour::Answer);
    let after = client.post_json("/orders", Some("reconcile"), ORDER).await;
    assert_eq!(after.status, 201);
    assert_eq!(upstream.header_values("idempotency-attempt"), [Some("1".into()), Some("2".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_route_lets_an_upstream_that_deduplicates_see_the_retry() {
    let upstream = RawUpstream::start(Misbehaviour::CloseAfterRequest).await;
    let gw = gateway(upstream.addr, r#"on_unknown_outcome = "release""#).await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("dedup"), ORDER).await;
    assert_eq!((first.status.as_u16(), first.problem().as_str()), (502, "upstream-unavailable"));
    upstream.set(Misbehaviour::Answer);
    let retry = client.post_json("/orders", Some("dedup"), ORDER).await;
    assert_eq!(retry.status, 201);
    assert_eq!(upstream.header_values("idempotency-attempt"), [Some("1".into()), Some("2".into())]);
    assert_eq!(upstream.header_values("idempotency-key"), [Some("dedup".into()), Some("dedup".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_was_not_sent_and_gives_its_attempt_back() {
    // Nothing listens on this port: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gw = gateway(closed, "").await;
    let r = gw.client().post_json("/orders", Some("refused"), ORDER).await;
    assert_eq!((r.status.as_u16(), r.problem().as_str()), (502, "upstream-unavailable"));
    // The attempt never left: the key is as if never claimed.
    let auth = [("authorization", "Bearer test-admin-token-0123456789"), ("scope-authorization", DEFAULT_AUTH)];
    let state = gw.admin_client().get("/keys?route=orders&key=refused", &auth).await;
    assert_eq!((state.status.as_u16(), state.json()["state"].clone()), (404, "absent".into()));
    let metrics = String::from_utf8(gw.admin_client().get("/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(metrics.contains(r#"idemgate_released_total{route="orders",reason="not_sent"} 1"#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_header_can_be_renamed_or_turned_off() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, r#"attempt_header = "X-Execution-Attempt""#).await;
    gw.client().post_json("/orders", Some("a"), ORDER).await;
    let seen = &upstream.seen()[0].headers;
    assert_eq!(seen["x-execution-attempt"], "1");
    assert!(seen.get("idempotency-attempt").is_none());

    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, r#"attempt_header = """#).await;
    gw.client().post_json("/orders", Some("a"), ORDER).await;
    assert!(upstream.seen()[0].headers.get("idempotency-attempt").is_none());
}

// ---- path spellings ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_idempotent_path_reaches_its_route() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("spelled"), ORDER).await;
    assert_eq!(first.status, 201);
    for spelling in ["/orders/", "//orders", "/./orders", "/x/../orders", "/%6frders", "/%6Frders/"] {
        let r = client.post_json(spelling, Some("spelled"), ORDER).await;
        assert!(r.is_replay(), "{spelling} is /orders: {r:?}");
        assert_eq!(r.body, first.body, "{spelling}");
    }
    assert_eq!(upstream.executions(), 1, "no spelling ran the request again");
    // A new key under another spelling runs, and the upstream sees the normal path.
    let r = client.post_json("//x/../orders", Some("fresh"), ORDER).await;
    assert_eq!(r.status, 201);
    assert_eq!(upstream.seen()[1].path, "/orders");
    assert_eq!(upstream.executions(), 2);
}

// ---- scope ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_authenticated_by_cookie_never_share_records() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, r#"scope = "cookie:session""#).await;
    let client = gw.client();
    let alice = post(&client, "/orders", "1", &[("cookie", "theme=dark; session=alice")]).await;
    let bob = post(&client, "/orders", "1", &[("cookie", "session=bob")]).await;
    assert_eq!((alice.status.as_u16(), bob.status.as_u16()), (201, 201));
    assert!(!bob.is_replay(), "bob never gets alice's order");
    let again = post(&client, "/orders", "1", &[("cookie", "session=alice; theme=light")]).await;
    assert!(again.is_replay() && again.body == alice.body);
    // No session cookie (an Authorization header does not count here): refused, not pooled.
    let none = post(&client, "/orders", "1", &[("authorization", DEFAULT_AUTH)]).await;
    assert_eq!((none.status.as_u16(), none.problem().as_str()), (400, "scope-missing"));
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_of_several_headers_needs_all_of_them() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, r#"scope = ["header:Authorization", "header:Stripe-Account"]"#).await;
    let client = gw.client();
    let a1 = post(&client, "/orders", "k", &[("authorization", "Bearer platform"), ("stripe-account", "acct_1")]).await;
    let a2 = post(&client, "/orders", "k", &[("authorization", "Bearer platform"), ("stripe-account", "acct_2")]).await;
    assert!(!a2.is_replay(), "another connected account is another caller");
    let again =
        post(&client, "/orders", "k", &[("authorization", "bearer platform"), ("stripe-account", " acct_1 ")]).await;
    assert!(again.is_replay() && again.body == a1.body, "scheme case and whitespace are normalised");
    let missing = post(&client, "/orders", "k", &[("authorization", "Bearer platform")]).await;
    assert_eq!(missing.problem(), "scope-missing");
    assert!(missing.json()["detail"].as_str().unwrap().contains("header:stripe-account"));
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_route_pools_callers_without_a_scope_on_purpose() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, r#"on_missing_scope = "anonymous""#).await;
    let client = gw.client();
    let first = client.post_json_as("/orders", Some("anon"), None, ORDER).await;
    let second = client.post_json_as("/orders", Some("anon"), None, ORDER).await;
    assert_eq!(first.status, 201);
    assert!(second.is_replay());
    let caller = client.post_json_as("/orders", Some("anon"), Some("Bearer x"), ORDER).await;
    assert!(!caller.is_replay(), "a caller with a credential is not the anonymous one");
    assert_eq!(upstream.executions(), 2);
}

// ---- Connection ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_header_naming_what_the_route_needs_is_refused() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    for connection in ["Idempotency-Key", "close, Authorization", "content-type", "Content-Length", "host"] {
        let r = post(&client, "/orders", "conn", &[("authorization", DEFAULT_AUTH), ("connection", connection)]).await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (400, "connection-header"), "{connection}");
    }
    assert_eq!(upstream.executions(), 0, "nothing reached the upstream stripped");
    let fine = post(&client, "/orders", "conn", &[("authorization", DEFAULT_AUTH), ("connection", "keep-alive")]).await;
    assert_eq!(fine.status, 201);
    assert_eq!(upstream.seen()[0].headers["idempotency-key"], "conn", "the key reaches the upstream");
}

// ---- ghost claims --------------------------------------------------------------------------

/// A gateway whose Redis connection goes through `proxy`, store timeout 500ms.
async fn behind_proxy(proxy: &TcpProxy, upstream: std::net::SocketAddr, policy: &str) -> TestGateway {
    TestGateway::start(&config(&StoreKind::Redis(proxy.url()), upstream, policy)).await
}

/// Waits until requests get through the proxy again (the gateway has connected).
async fn warm_up(client: &Client) {
    let r = client.post_json("/orders", Some("warm-up"), ORDER).await;
    assert_eq!(r.status, 201, "{r:?}");
}

/// A gateway in front of `upstream` whose Redis is the shared one behind a [`TcpProxy`],
/// connected and warmed up.
struct Proxied {
    proxy: TcpProxy,
    upstream: TestUpstream,
    gw: TestGateway,
    client: Client,
}

async fn proxied(upstream: TestUpstream, policy: &str) -> Proxied {
    let proxy = TcpProxy::start(RedisServer::shared().addr()).await;
    let gw = behind_proxy(&proxy, upstream.addr, policy).await;
    let client = gw.client();
    warm_up(&client).await;
    Proxied { proxy, upstream, gw, client }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_arrives_too_late_is_released_for_the_retry() {
    let Proxied { proxy, upstream, gw: _gw, client } = proxied(TestUpstream::start().await, "").await;

    // Redis applies the claim; its reply reaches the gateway after the 500ms store timeout.
    proxy.slow_replies(Duration::from_millis(300), Duration::from_millis(800));
    let r = client.post_json("/orders", Some("ghost"), ORDER).await;
    assert_eq!((r.status.as_u16(), r.problem().as_str()), (503, "store-unavailable"));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The retry is not held up for a whole lease (10s) by the forgotten claim.
    let started = Instant::now();
    let retry = client.post_json("/orders", Some("ghost"), ORDER).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(upstream.executions_by_key()["ghost"], 1);
    assert_eq!(upstream.seen().last().unwrap().headers["idempotency-attempt"], "1", "the ghost used no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_claim_leaves_no_ghost() {
    let Proxied { proxy, upstream, gw: _gw, client } = proxied(TestUpstream::start().await, "").await;

    // The claim is on the wire (its reply held 800ms) when the client hangs up.
    proxy.slow_replies(Duration::from_millis(300), Duration::from_millis(800));
    let c = client.clone();
    let gone = tokio::spawn(async move { c.post_json("/orders", Some("gone-mid-claim"), ORDER).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    gone.abort();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let started = Instant::now();
    let retry = client.post_json("/orders", Some("gone-mid-claim"), ORDER).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(upstream.executions_by_key()["gone-mid-claim"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_never_runs_a_request_twice_through_a_ghost_claim() {
    // A short lease, so that a forgotten claim would be taken over within the test.
    let Proxied { proxy, upstream, gw: _gw, client } = proxied(TestUpstream::start().await, r#"lease = "1s""#).await;

    proxy.slow_replies(Duration::from_millis(300), Duration::from_millis(800));
    let first = client.post_json("/open-orders", Some("open"), ORDER).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotency-status"), Some("bypassed"));
    // Past the lease: a forgotten claim would now be taken over and the request run again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let retry = client.post_json("/open-orders", Some("open"), ORDER).await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay(), "the forwarded request settled the claim it made: {retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executions_by_key()["open"], 1, "never a second execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_keeps_a_ghost_claim_alive_while_a_slow_request_runs() {
    // The upstream takes longer than the lease: the claim the forwarded request may hold must
    // be renewed, or a retry would take it over mid-request and run it a second time.
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(1800), ..Behavior::default() }).await;
    let Proxied { proxy, upstream, gw: _gw, client } = proxied(slow, r#"lease = "900ms""#).await;
    proxy.slow_replies(Duration::from_millis(300), Duration::from_millis(800));
    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/open-orders", Some("slow-open"), ORDER).await });
    // Past the lease, while the first still runs.
    tokio::time::sleep(Duration::from_millis(1400)).await;
    let retry = client.post_json("/open-orders", Some("slow-open"), ORDER).await;
    let first = first.await.unwrap();
    assert_eq!(first.header("idempotency-status"), Some("bypassed"));
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay(), "the retry waited for the running request: {retry:?}");
    assert_eq!(upstream.executions_by_key()["slow-open"], 1, "never a second execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_blip_after_the_upstream_answered_does_not_lose_the_answer() {
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(300), ..Behavior::default() }).await;
    let Proxied { proxy, upstream, gw: _gw, client } = proxied(slow, "").await;

    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("blip"), ORDER).await });
    // The claim went through; now every connection to Redis is cut, so the settle, when the
    // upstream answers, fails on the broken connection (a blip: Redis itself is fine).
    tokio::time::sleep(Duration::from_millis(150)).await;
    proxy.retarget(RedisServer::shared().addr());
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "the client gets the upstream's answer whatever the store does");
    // Settling was tried again behind the answer: the retry replays instead of waiting out
    // the lease (and then running again).
    let started = Instant::now();
    let retry = client.post_json("/orders", Some("blip"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    assert_eq!(upstream.executions_by_key()["blip"], 1);
}

/// What the lease-long settle leaves: a store down for longer than the lease. The settle
/// gives up when the lease ends, counted from when the claim was sent (the exchange ends, it
/// does not hang on),
/// the failure is counted, and the retry after the lease runs again, as attempt 2, for the
/// upstream's own constraint to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_for_longer_than_the_lease_leaves_the_rerun_to_the_upstream() {
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(300), ..Behavior::default() }).await;
    let Proxied { proxy, upstream, gw, client } = proxied(slow, r#"lease = "2s""#).await;
    let c = client.clone();
    let started = Instant::now();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("long-outage"), ORDER).await });
    // The claim went through; now Redis is out of reach (new connections are refused).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    proxy.retarget(dead);
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "the client gets the upstream's answer: {first:?}");
    // The settle tries until the 2s lease ends, then gives up.
    let admin = gw.admin_client();
    let metrics = loop {
        let text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
        if text.contains(r#"idemgate_store_write_failed_total{route="orders"} 1"#) {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(4), "the settle never gave up:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(metrics.contains("idemgate_exchanges_running 0"), "the exchange ended:\n{metrics}");
    assert!(started.elapsed() >= Duration::from_millis(1000), "it kept trying: {:?}", started.elapsed());
    proxy.retarget(RedisServer::shared().addr());
    // Once the gateway has reconnected (the settle's last try ran until the lease ended, so
    // this is later than the lease), and the lease has passed.
    let back = Instant::now();
    while admin.get("/readyz", &[]).await.status != 200 {
        assert!(back.elapsed() < Duration::from_secs(5), "the gateway never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed())).await;
    let retry = client.post_json("/orders", Some("long-outage"), ORDER).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(upstream.executions_by_key()["long-outage"], 2);
    let attempts: Vec<Option<String>> = upstream
        .seen()
        .iter()
        .filter(|seen| seen.headers.get("idempotency-key").is_some_and(|k| k == "long-outage"))
        .map(|seen| seen.headers.get("idempotency-attempt").map(|a| a.to_str().unwrap().to_owned()))
        .collect();
    assert_eq!(attempts, [Some("1".into()), Some("2".into())], "the re-run is announced as attempt 2");
}

/// docs/guarantees.md, "the store goes down after the upstream answered": a 5 s lease, the
/// store timeout 1 s, Redis (AOF, fsync always) down from 0.4 s for 3 s. The settle keeps
/// trying until the lease ends, counted from when the claim was sent, lands once Redis is
/// back, and the retry replays. (It gave up at 3.0 s, two store timeouts early, and the retry
/// ran the request again once the lease passed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_for_three_of_the_leases_five_seconds_still_settles_the_answer() {
    let redis = std::sync::Arc::new(RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]));
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(600), ..Behavior::default() }).await;
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout = \"1s\"",
        redis.url(),
        support::unique("outage")
    );
    let toml = support::gateway_proc::Toml {
        store: &store,
        policy: "lease = \"5s\"\nwait = \"5s\"",
        upstream_lines: "timeout = \"3s\"",
        ..support::gateway_proc::Toml::new(slow.addr)
    }
    .render();
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    warm_up(&client).await;
    let started = Instant::now();
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("outage"), ORDER).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stopping = std::sync::Arc::clone(&redis);
    tokio::task::spawn_blocking(move || stopping.stop()).await.unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "the client gets the upstream's answer: {first:?}");
    tokio::time::sleep(Duration::from_millis(3400).saturating_sub(started.elapsed())).await;
    let starting = std::sync::Arc::clone(&redis);
    tokio::task::spawn_blocking(move || starting.restart()).await.unwrap();
    let back = started.elapsed();
    assert!(back < Duration::from_millis(4500), "Redis took until {back:?} to come back");
    let retry = client.post_json("/orders", Some("outage"), ORDER).await;
    assert!(retry.is_replay(), "Redis was back at {back:?}, within the lease: {retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(slow.executions_by_key()["outage"], 1, "never a second execution");
    let metrics = String::from_utf8(gw.admin_client().get("/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(metrics.contains(r#"idemgate_store_write_failed_total{route="orders"} 0"#), "{metrics}");
}

/// A settle whose first try failed, while an operator released the key and another request
/// took it over and answered: the next try finds another owner's answer. That is a lost
/// lease, counted and logged, never taken for an earlier try of its own that landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_while_a_settle_is_retried_is_counted_as_a_lost_lease() {
    use idemgate::store::{
        Final, Lifecycle, Operator, OwnerToken, Purged, RedisStore, Settled, State, StoredResponse, Terms,
    };
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(600), ..Behavior::default() }).await;
    let Proxied { proxy, upstream, gw, client } = proxied(slow, r#"scope = "global""#).await;
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("taken"), ORDER).await }
    });
    // The claim went through; now this gateway cannot reach Redis, so its settle fails.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    proxy.retarget(dead);
    assert_eq!(first.await.unwrap().status, 201);
    // Meanwhile, straight on Redis: an operator forces the key free, another request takes it.
    let prefix = gw.config.store.key_prefix.clone();
    let direct = RedisStore::new(&RedisServer::shared().url(), 1, Duration::from_secs(2), &prefix).unwrap();
    let record = support::record_key(&prefix, "taken");
    assert_eq!(direct.purge(&record, true).await.unwrap(), Purged::Released { was: State::InProgress });
    let fingerprint = idemgate::policy::fingerprint::Fingerprint::from_bytes([9; 32]);
    let lease = match direct
        .claim(
            &record,
            &fingerprint,
            OwnerToken::generate(),
            Terms { lease: Duration::from_secs(10), ttl: Duration::from_secs(20) },
        )
        .await
        .unwrap()
    {
        idemgate::store::Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    let theirs = StoredResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"theirs").into(),
    };
    assert_eq!(direct.settle(&lease, Final::Response(&theirs), Duration::from_secs(60)).await.unwrap(), Settled::Done);
    proxy.retarget(RedisServer::shared().addr());
    let admin = gw.admin_client();
    let started = Instant::now();
    loop {
        let text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
        if text.contains(r#"idemgate_lease_lost_total{route="orders"} 1"#) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the takeover was never counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.executions_by_key()["taken"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_applied_but_answered_too_late_is_not_counted_as_a_lost_lease() {
    let slow = TestUpstream::with(Behavior { delay: Duration::from_millis(400), ..Behavior::default() }).await;
    let Proxied { proxy, upstream, gw, client } = proxied(slow, "").await;

    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("late-settle"), ORDER).await });
    // The claim went through; the settle's reply (sent at about 400ms) then reaches the gateway
    // after the 500ms store timeout, although Redis applied it. The settle is tried again
    // and finds its own record settled.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.slow_replies(Duration::from_millis(400), Duration::from_millis(800));
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotency-status"), None);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let retry = client.post_json("/orders", Some("late-settle"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(upstream.executions_by_key()["late-settle"], 1);
    let metrics = String::from_utf8(gw.admin_client().get("/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(metrics.contains(r#"idemgate_lease_lost_total{route="orders"} 0"#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_the_upstream_names_in_connection_are_neither_relayed_nor_stored() {
    let upstream = RawUpstream::start(Misbehaviour::Answer).await;
    let gw = gateway(upstream.addr, "").await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("hop-answer"), ORDER).await;
    assert_eq!(first.status, 201);
    let replay = client.post_json("/orders", Some("hop-answer"), ORDER).await;
    assert!(replay.is_replay(), "{replay:?}");
    for reply in [&first, &replay] {
        assert_eq!(reply.header("x-upstream-hop"), None, "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
    assert_eq!(upstream.executions(), 1);
}

// ---- quotas ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_new_keys_is_shared_by_every_gateway_and_spares_retries() {
    let upstream = TestUpstream::start().await;
    // Two gateways on one Redis, one key prefix: one budget per caller.
    let toml = config(&redis(), upstream.addr, r#"max_new_keys = "3/30s""#);
    let (a, b) = (TestGateway::start(&toml).await, TestGateway::start(&toml).await);
    let (ca, cb) = (a.client(), b.client());
    for (client, key) in [(&ca, "q1"), (&cb, "q2"), (&ca, "q3")] {
        assert_eq!(client.post_json("/orders", Some(key), ORDER).await.status, 201);
    }
    let over = cb.post_json("/orders", Some("q4"), ORDER).await;
    assert_eq!((over.status.as_u16(), over.problem().as_str()), (429, "too-many-new-keys"));
    let retry_after: u64 = over.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    // Retries of keys already sent are not new keys.
    assert!(ca.post_json("/orders", Some("q1"), ORDER).await.is_replay());
    // Another caller has a budget of its own.
    let other = cb.post_json_as("/orders", Some("q4"), Some("Bearer someone-else"), ORDER).await;
    assert_eq!(other.status, 201);
    assert_eq!(upstream.executions(), 4, "the refused key never reached the upstream");
}

// ---- lease loss ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_mid_request_is_said_on_the_first_response() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(900), ..Behavior::default() }).await;
    let gw = gateway(upstream.addr, "lease = \"300ms\"\nrenew = false\nwait = \"0s\"").await;
    let client = gw.client();
    let c = client.clone();
    let first = tokio::spawn(async move { c.post_json("/orders", Some("lost"), ORDER).await });
    // After the first lease passed, a retry takes the key over (and runs: the lease was too
    // short for this upstream, which `idemgate check` warns about).
    tokio::time::sleep(Duration::from_millis(450)).await;
    let second = client.post_json("/orders", Some("lost"), ORDER).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotency-status"), Some("lease-lost"));
    assert_eq!(second.header("idempotency-status"), None);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].headers["idempotency-attempt"], "2", "the upstream can refuse the re-run");
    let metrics = String::from_utf8(gw.admin_client().get("/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(metrics.contains(r#"idemgate_lease_lost_total{route="orders"} 1"#), "{metrics}");
}

// ---- data loss -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_keeps_the_epoch_marker_is_still_detected() {
    // The primary, a replica of it, and the gateway behind a proxy that follows the failover.
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replica.replicate(&primary);
    let proxy = TcpProxy::start(primary.addr()).await;
    let upstream = TestUpstream::start().await;
    let gw = behind_proxy(&proxy, upstream.addr, "").await;
    let client = gw.client();
    warm_up(&client).await;
    let admin = gw.admin_client();
    let data_loss = || async {
        let text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
        text.lines().find(|l| l.starts_with("idemgate_store_data_loss_total")).map(str::to_owned)
    };
    // The gateway has seen the primary (and written its epoch marker, now on the replica too).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(data_loss().await.as_deref(), Some("idemgate_store_data_loss_total 0"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.dbsize() < 2 {
        assert!(Instant::now() < deadline, "the replica never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    replica.promote();
    proxy.retarget(replica.addr());
    let deadline = Instant::now() + Duration::from_secs(10);
    while data_loss().await.as_deref() != Some("idemgate_store_data_loss_total 1") {
        assert!(Instant::now() < deadline, "failover not detected: {:?}", data_loss().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The replica had the records: the retry still replays (after the 503s a client may get
    // while the gateway reconnects through the cut connections).
    let mut retry = client.post_json("/orders", Some("warm-up"), ORDER).await;
    for _ in 0..20 {
        if retry.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        retry = client.post_json("/orders", Some("warm-up"), ORDER).await;
    }
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(upstream.executions(), 1);
}
