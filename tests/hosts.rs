//! Routes by host: exact hosts before wildcards before routes for every host, however the
//! client spells the host; a request that names two hosts refused; tenants under one
//! wildcard route never sharing a record, on one gateway or two racing on one Redis.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use support::client::{Client, DEFAULT_AUTH};
use support::gateway::{StoreKind, TestGateway};
use support::upstream::{Behavior, TestUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const ORDER: &str = r#"{"sku":"BOOK-42"}"#;

/// `api.example.com` (one exact host) → `api`; `*.example.com` → `tenants`; every other
/// host → `fallback` for any path.
fn config(store: &StoreKind, api: SocketAddr, tenants: SocketAddr, fallback: SocketAddr) -> String {
    let store = store.toml(&support::unique("hosts"));
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "{ADMIN_TOKEN}"

[store]
{store}

[upstreams.api]
url = "http://{api}"
[upstreams.tenants]
url = "http://{tenants}"
[upstreams.fallback]
url = "http://{fallback}"

[[routes]]
name = "fallback"
path = "/{{*rest}}"
upstream = "fallback"

[[routes]]
name = "tenants"
hosts = ["*.example.com"]
methods = ["POST"]
path = "/orders"
upstream = "tenants"
[routes.idempotency]

[[routes]]
name = "api"
hosts = ["api.example.com"]
methods = ["POST"]
path = "/orders"
upstream = "api"
[routes.idempotency]
"#
    )
}

async fn post(client: &Client, host: &str, key: &str) -> support::client::Reply {
    let headers = [
        ("host", host),
        ("content-type", "application/json"),
        ("authorization", DEFAULT_AUTH),
        ("idempotency-key", key),
    ];
    client.send(Method::POST, "/orders", &headers, ORDER).await
}

/// The status line and the whole answer of one raw HTTP/1 exchange (the request closes).
async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {text:?}"));
    (status, text)
}

#[tokio::test]
async fn exact_hosts_then_wildcards_then_every_host_however_the_host_is_spelt() {
    let (api, tenants, fallback) =
        (TestUpstream::start().await, TestUpstream::start().await, TestUpstream::start().await);
    let gw = TestGateway::start(&config(&StoreKind::Memory, api.addr, tenants.addr, fallback.addr)).await;
    let client = gw.client();

    for (i, host) in
        ["api.example.com", "API.Example.COM", "api.example.com:8443", "api.example.com."].iter().enumerate()
    {
        let r = post(&client, host, &format!("api-{i}")).await;
        assert_eq!(r.status, 201, "{host}: {r:?}");
    }
    for (i, host) in ["a.example.com", "x.y.example.com", "B.EXAMPLE.COM:80"].iter().enumerate() {
        let r = post(&client, host, &format!("tenant-{i}")).await;
        assert_eq!(r.status, 201, "{host}: {r:?}");
    }
    // Not under the wildcard, or another path on a named host: the routes for every host.
    for host in ["example.com", "badexample.com", "127.0.0.1"] {
        assert_eq!(post(&client, host, "fb").await.status, 201, "{host}");
    }
    let other = client.send(Method::GET, "/status", &[("host", "api.example.com")], Bytes::new()).await;
    assert_eq!(other.status, 201);
    // HTTP/1.0 names no host at all.
    let (status, _) = raw(gw.addr, "GET /anything HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 201);

    assert_eq!(api.executions(), 4);
    assert_eq!(tenants.executions(), 3);
    assert_eq!(fallback.executions(), 5);
    // The upstream learns the host the request was routed on.
    let forwarded: Vec<String> =
        tenants.seen().iter().map(|s| s.headers["x-forwarded-host"].to_str().unwrap().to_owned()).collect();
    assert_eq!(forwarded, ["a.example.com", "x.y.example.com", "B.EXAMPLE.COM:80"]);
    assert!(tenants.seen().iter().all(|s| s.headers["host"] == tenants.addr.to_string().as_str()));
    gw.shutdown().await;
}

/// Tried as a new user would: the idempotent `POST /orders` names its hosts, and a catch-all
/// pass-through route serves the rest. A POST with another Host (curl's `127.0.0.1:PORT`)
/// is routed as documented, to the catch-all, where its retry runs again; the configuration
/// is valid, and its warnings name each idempotent route, the catch-all and the hosts that
/// fall through.
#[tokio::test]
async fn a_host_the_idempotent_routes_do_not_list_runs_unprotected_and_the_config_says_so() {
    let (api, tenants, fallback) =
        (TestUpstream::start().await, TestUpstream::start().await, TestUpstream::start().await);
    let toml = config(&StoreKind::Memory, api.addr, tenants.addr, fallback.addr);
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    let curl = gw.addr.to_string();
    for _ in 0..2 {
        let r = post(&client, &curl, "same-key").await;
        assert!(r.status == 201 && !r.is_replay(), "{r:?}");
    }
    assert_eq!(fallback.executions(), 2, "the retry ran again: nothing protects this host");
    gw.shutdown().await;

    let config = idemgate::config::Config::from_toml(&toml, "gw.toml").unwrap_or_else(|e| panic!("{e}"));
    let lines = config.warning_lines("gw.toml");
    // Each route named as people know it, beside its place in the file.
    for (key, keyed) in [("routes[1] (\"tenants\").hosts", "tenants"), ("routes[2] (\"api\").hosts", "api")] {
        let warned = lines.iter().find(|l| l.contains(&format!("warning: {key}: route \"{keyed}\" enforces")));
        let warned = warned.unwrap_or_else(|| panic!("no warning for {keyed}: {lines:#?}"));
        assert!(
            warned.contains(
                "POST /orders for any host no route names goes to route \"fallback\", which does not enforce it"
            ),
            "{warned}"
        );
    }
}

#[tokio::test]
async fn a_host_no_route_serves_is_not_found() {
    let api = TestUpstream::start().await;
    let store = StoreKind::Memory.toml(&support::unique("hosts"));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\n{store}\n[upstreams.api]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"api\"\nhosts = [\"api.example.com\"]\npath = \"/orders\"\nupstream = \"api\"\n",
        api.addr
    );
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    let missed = client.send(Method::GET, "/orders", &[("host", "other.example.com")], Bytes::new()).await;
    assert_eq!((missed.status.as_u16(), missed.problem().as_str()), (404, "no-route"));
    let (status, _) = raw(gw.addr, "GET /orders HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 404);
    assert_eq!(client.send(Method::GET, "/orders", &[("host", "api.example.com")], Bytes::new()).await.status, 201);
    assert_eq!(api.executions(), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn tenants_under_one_wildcard_route_never_share_a_record() {
    let redis = support::redis::RedisServer::shared();
    for store in [StoreKind::Memory, StoreKind::Redis(redis.url())] {
        let (api, tenants, fallback) =
            (TestUpstream::start().await, TestUpstream::start().await, TestUpstream::start().await);
        let gw = TestGateway::start(&config(&store, api.addr, tenants.addr, fallback.addr)).await;
        let client = gw.client();
        // The same key and the same caller on two tenants' hosts: two orders, two records.
        let a = post(&client, "a.example.com", "order-1").await;
        let b = post(&client, "b.example.com", "order-1").await;
        assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201));
        assert!(!a.is_replay() && !b.is_replay(), "{a:?} {b:?}");
        assert_eq!(tenants.executions(), 2);
        // Each retry gets its own tenant's answer, however the host is spelt.
        let a2 = post(&client, "A.Example.com:443", "order-1").await;
        let b2 = post(&client, "b.example.com.", "order-1").await;
        assert!(a2.is_replay() && b2.is_replay());
        assert_eq!(
            (a2.json()["execution"].clone(), b2.json()["execution"].clone()),
            (a.json()["execution"].clone(), b.json()["execution"].clone())
        );
        assert_ne!(a.json()["execution"], b.json()["execution"]);
        assert_eq!(tenants.executions(), 2);

        // An operator names the tenant's record by its host; one exact host needs none.
        let admin = gw.admin_client();
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let scope = ("scope-authorization", DEFAULT_AUTH);
        let show = |query: String| {
            let (admin, auth) = (admin.clone(), auth.clone());
            async move { admin.get(&format!("/keys?{query}"), &[("authorization", &auth), scope]).await }
        };
        let found = show("route=tenants&key=order-1&host=a.example.com".into()).await;
        assert_eq!((found.status.as_u16(), found.json()["state"].as_str()), (200, Some("completed")), "{found:?}");
        let missing = show("route=tenants&key=order-1".into()).await;
        assert_eq!(missing.status, 400);
        assert!(missing.json()["detail"].as_str().unwrap().contains("host="), "{missing:?}");
        let c = show("route=tenants&key=order-1&host=c.example.com".into()).await;
        assert_eq!(c.json()["state"], "absent");
        let exact = post(&client, "api.example.com", "order-1").await;
        assert_eq!(exact.status, 201);
        let found = show("route=api&key=order-1".into()).await;
        assert_eq!(found.json()["state"], "completed", "{found:?}");
        let refused = show("route=api&key=order-1&host=api.example.com".into()).await;
        assert_eq!(refused.status, 400);
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_racing_on_one_key_keep_each_tenant_apart() {
    // Two gateways on one Redis; each tenant's order sent to both at once, with the same key
    // and caller: one execution per tenant, whichever gateway won, and the copy that lost
    // gets its own tenant's answer.
    let redis = support::redis::RedisServer::shared();
    let slow = Behavior { delay: Duration::from_millis(200), ..Behavior::default() };
    let (api, tenants, fallback) =
        (TestUpstream::start().await, TestUpstream::with(slow).await, TestUpstream::start().await);
    let toml = config(&StoreKind::Redis(redis.url()), api.addr, tenants.addr, fallback.addr);
    let (one, two) = (TestGateway::start(&toml).await, TestGateway::start(&toml).await);
    let (c1, c2) = (one.client(), two.client());
    for round in 0..5 {
        let key = format!("race-{round}");
        let (a1, a2, b1, b2) = tokio::join!(
            post(&c1, "a.example.com", &key),
            post(&c2, "a.example.com", &key),
            post(&c1, "b.example.com", &key),
            post(&c2, "b.example.com", &key),
        );
        for r in [&a1, &a2, &b1, &b2] {
            assert_eq!(r.status, 201, "{r:?}");
        }
        assert_eq!(a1.json()["execution"], a2.json()["execution"], "tenant a ran twice: {a1:?} {a2:?}");
        assert_eq!(b1.json()["execution"], b2.json()["execution"], "tenant b ran twice: {b1:?} {b2:?}");
        assert_ne!(a1.json()["execution"], b1.json()["execution"], "one tenant got the other's answer");
        assert_eq!(tenants.executions(), 2 * (round + 1));
    }
    // What reached the upstream: each tenant's host five times, nothing else.
    let mut hosts: Vec<String> =
        tenants.seen().iter().map(|s| s.headers["x-forwarded-host"].to_str().unwrap().to_owned()).collect();
    hosts.sort();
    assert_eq!(hosts, [vec!["a.example.com".to_owned(); 5], vec!["b.example.com".to_owned(); 5]].concat());
    assert_eq!(api.executions() + fallback.executions(), 0);
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn a_request_that_names_two_hosts_is_refused() {
    let (api, tenants, fallback) =
        (TestUpstream::start().await, TestUpstream::start().await, TestUpstream::start().await);
    let gw = TestGateway::start(&config(&StoreKind::Memory, api.addr, tenants.addr, fallback.addr)).await;

    // HTTP/1.1 through a proxy: an absolute-form target and a Host that differ.
    let (status, text) = raw(
        gw.addr,
        "POST http://api.example.com/orders HTTP/1.1\r\nhost: a.example.com\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("bad-host") && text.contains("two different hosts"), "{text}");
    // Agreeing in another spelling is one host.
    let (status, text) =
        raw(gw.addr, "GET http://API.example.com:80/x HTTP/1.1\r\nhost: api.example.com\r\nconnection: close\r\n\r\n")
            .await;
    assert_eq!(status, 201, "{text}");
    // A Host that is no host, on a gateway that routes by host.
    let (status, text) = raw(gw.addr, "GET /x HTTP/1.1\r\nhost: a b\r\nconnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "{text}");

    // HTTP/2: :authority routes; a Host beside it must name the same host.
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let send = |authority: &'static str, host: Option<&'static str>| {
        let h2 = h2.clone();
        async move {
            let mut request = http::Request::builder()
                .method(Method::POST)
                .uri(format!("http://{authority}/orders"))
                .header("content-type", "application/json")
                .header("authorization", DEFAULT_AUTH)
                .header("idempotency-key", format!("h2-{authority}-{}", host.unwrap_or("none")));
            if let Some(host) = host {
                request = request.header("host", host);
            }
            let mut sender = h2.ready().await.unwrap();
            let (response, mut body) = sender.send_request(request.body(()).unwrap(), false).unwrap();
            body.send_data(Bytes::from_static(ORDER.as_bytes()), true).unwrap();
            response.await.unwrap().status().as_u16()
        }
    };
    assert_eq!(send("api.example.com", None).await, 201);
    assert_eq!(send("t.example.com", None).await, 201);
    assert_eq!(send("t.example.com", Some("t.example.com")).await, 201);
    assert_eq!(send("api.example.com", Some("t.example.com")).await, 400);

    assert_eq!(api.executions(), 1, "{:?}", api.seen());
    assert_eq!(tenants.executions(), 2);
    assert_eq!(fallback.executions(), 1, "only the agreeing absolute-form GET");
    gw.shutdown().await;
}
