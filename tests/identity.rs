//! A record's identity across change: a reload, a restart, and two gateways running the old
//! and the new file side by side on one store. For each setting that names records or
//! fingerprints requests (the route's name, its hosts in either direction, its fingerprint
//! settings), a retry of a request answered before the change is replayed after it, never
//! run again and never answered 422, when the change pins the identity its records were
//! made under; and a change without the pin is refused by the reload, the running
//! configuration staying. What is counted is what reached the upstream.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use http::Method;
use support::client::{Client, DEFAULT_AUTH, Reply};
use support::cluster::RedisCluster;
use support::gateway::{StoreKind, TestGateway};
use support::gateway_proc::GatewayProc;
use support::upstream::{Behavior, TestUpstream};

const TOKEN: (&str, &str) = ("authorization", "Bearer test-admin-token-0123456789");

/// One idempotent `POST /orders` route: its name, its hosts (none: every host), and lines
/// for its `[routes.idempotency]` (subtables such as `[routes.idempotency.identity]` last).
struct Route<'a> {
    name: &'a str,
    hosts: &'a [&'a str],
    policy: &'a str,
}

fn toml(store: &str, upstream: SocketAddr, route: &Route<'_>) -> String {
    let hosts = if route.hosts.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = route.hosts.iter().map(|h| format!("{h:?}")).collect();
        format!("hosts = [{}]\n", list.join(", "))
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "test-admin-token-0123456789"
shutdown_grace = "2s"

[store]
{store}

[upstreams.app]
url = "http://{upstream}"

[[routes]]
name = "{name}"
{hosts}methods = ["POST"]
path = "/orders"
upstream = "app"

[routes.idempotency]
{policy}
"#,
        name = route.name,
        policy = route.policy,
    )
}

/// An order on `host`; `ts` stands for a field a client changes on each retry.
async fn order(client: &Client, host: &str, key: &str, ts: u32) -> Reply {
    let headers = [
        ("host", host),
        ("content-type", "application/json"),
        ("authorization", DEFAULT_AUTH),
        ("idempotency-key", key),
    ];
    client.send(Method::POST, "/orders", &headers, format!(r#"{{"sku":"BOOK-42","ts":{ts}}}"#)).await
}

/// The changes of this suite, each from a file before to a file after that keeps the records
/// of the first (`pinned`) and one that does not (`unpinned`).
struct Change {
    what: &'static str,
    before: Route<'static>,
    pinned: Route<'static>,
    unpinned: Route<'static>,
    /// The host requests are sent to.
    host: &'static str,
}

impl Change {
    /// The `ts` of a request's `n`th sending: a field that changes on each retry where the
    /// change is about ignoring it, else the same body each time, as honest retries send.
    fn ts(&self, n: u32) -> u32 {
        if self.is_fingerprint() { n } else { 1 }
    }

    fn is_fingerprint(&self) -> bool {
        self.what.contains("ignored")
    }
}

fn changes() -> Vec<Change> {
    vec![
        Change {
            what: "a second host",
            before: Route { name: "orders", hosts: &["t1.example.com"], policy: "" },
            pinned: Route {
                name: "orders",
                hosts: &["t1.example.com", "t2.example.com"],
                policy: "[routes.idempotency.identity]\nhost = \"t1.example.com\"",
            },
            unpinned: Route { name: "orders", hosts: &["t1.example.com", "t2.example.com"], policy: "" },
            host: "t1.example.com",
        },
        Change {
            what: "a wildcard",
            before: Route { name: "orders", hosts: &["t1.example.com"], policy: "" },
            pinned: Route {
                name: "orders",
                hosts: &["*.example.com"],
                policy: "[routes.idempotency.identity]\nhost = \"t1.example.com\"",
            },
            unpinned: Route { name: "orders", hosts: &["*.example.com"], policy: "" },
            host: "t1.example.com",
        },
        Change {
            what: "back to one host",
            before: Route { name: "orders", hosts: &["t1.example.com", "t2.example.com"], policy: "" },
            pinned: Route {
                name: "orders",
                hosts: &["t1.example.com"],
                policy: "[routes.idempotency.identity]\nper_host = true",
            },
            unpinned: Route { name: "orders", hosts: &["t1.example.com"], policy: "" },
            host: "t1.example.com",
        },
        Change {
            what: "a new route name",
            before: Route { name: "orders", hosts: &[], policy: "" },
            pinned: Route { name: "orders-v2", hosts: &[], policy: "[routes.idempotency.identity]\nname = \"orders\"" },
            unpinned: Route { name: "orders-v2", hosts: &[], policy: "" },
            host: "api.example.com",
        },
        Change {
            what: "a field no longer ignored",
            before: Route { name: "orders", hosts: &[], policy: "ignore = [\"/ts\"]" },
            pinned: Route {
                name: "orders",
                hosts: &[],
                policy: "[routes.idempotency.identity.previous_fingerprint]\nignore = [\"/ts\"]",
            },
            unpinned: Route { name: "orders", hosts: &[], policy: "" },
            host: "api.example.com",
        },
    ]
}

/// A reload without the pin is refused and changes nothing; with the pin, it keeps every
/// answered request replaying. SIGHUP and `POST /reload`, against the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_answered_requests_replaying_or_is_refused() {
    for change in changes() {
        let upstream = TestUpstream::start().await;
        let store = StoreKind::Memory.toml(&support::unique("identity"));
        let gw = GatewayProc::start(&toml(&store, upstream.addr, &change.before));
        let (client, admin) = (gw.client(), Client::new(gw.admin));
        let what = change.what;
        let first = order(&client, change.host, "k-1", change.ts(1)).await;
        assert_eq!(first.status, 201, "{what}: {first:?}");

        // Unpinned: refused by SIGHUP (logged) and by POST /reload (said), nothing changes.
        std::fs::write(gw.config_path(), toml(&store, upstream.addr, &change.unpinned)).unwrap();
        gw.sighup();
        let refused = gw.lines_with("reload refused", 1);
        assert_eq!(refused.len(), 1, "{what}: {}", gw.log());
        assert!(refused[0].contains("Safe:"), "{what}: the way to make it safely is said: {}", refused[0]);
        let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
        assert_eq!((r.status.as_u16(), &r.json()["reloaded"]), (422, &serde_json::json!(false)), "{what}: {r:?}");
        let error = r.json()["error"].as_str().unwrap().to_owned();
        assert!(error.contains("[routes.idempotency.identity"), "{what}: the pin is named: {error}");
        let retry = order(&client, change.host, "k-1", change.ts(2)).await;
        assert!(retry.is_replay(), "{what}: the running file still answers: {retry:?}");

        // Pinned: reloaded; the retry replays the answer made before it.
        std::fs::write(gw.config_path(), toml(&store, upstream.addr, &change.pinned)).unwrap();
        let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
        assert_eq!(r.status, 200, "{what}: {r:?}");
        let retry = order(&client, change.host, "k-1", change.ts(3)).await;
        assert_eq!(retry.status, 201, "{what}: never 422: {retry:?}");
        assert!(retry.is_replay(), "{what}: replayed after the reload: {retry:?}");
        assert_eq!(retry.json()["execution"], first.json()["execution"], "{what}");
        assert_eq!(upstream.executions(), 1, "{what}: what reached the upstream");
        let pin = if change.is_fingerprint() {
            "fingerprint"
        } else if what.contains("name") {
            "name"
        } else {
            "host"
        };
        let hits = format!("idemgate_identity_pin_hits_total{{route=\"{}\",pin=\"{pin}\"}}", change.pinned.name);
        assert_eq!(gw.metric(&hits).await, 1.0, "{what}: the pin's hit is counted");
    }
}

/// Adding a tenant with the first host pinned: the first host's records keep their names, the
/// new host's are its own, and the two never meet.
#[tokio::test]
async fn a_pinned_host_never_meets_the_new_tenant() {
    let upstream = TestUpstream::start().await;
    let change = &changes()[0];
    let gw = TestGateway::start(&toml(&StoreKind::Memory.toml("tenants"), upstream.addr, &change.pinned)).await;
    let client = gw.client();
    let t1 = order(&client, "t1.example.com", "same", 1).await;
    let t2 = order(&client, "t2.example.com", "same", 1).await;
    assert_eq!((t1.status.as_u16(), t2.status.as_u16()), (201, 201));
    assert!(!t2.is_replay(), "another tenant's answer: {t2:?}");
    assert_ne!(t1.json()["execution"], t2.json()["execution"]);
    assert!(order(&client, "t2.example.com", "same", 1).await.is_replay());
    assert_eq!(upstream.executions(), 2);
    gw.shutdown().await;
}

/// A restart with the changed file, on Redis: the pinned file replays what the old one
/// answered; without the pin the same retry would reach the upstream again (the hazard this
/// guards, shown so that the pin is seen to matter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_pinned_file_replays_what_the_old_one_answered() {
    let redis = support::redis::RedisServer::shared();
    for change in changes() {
        let what = change.what;
        let upstream = TestUpstream::start().await;
        let store = StoreKind::Redis(redis.url()).toml(&support::unique("restart"));
        let old = TestGateway::start(&toml(&store, upstream.addr, &change.before)).await;
        let first = order(&old.client(), change.host, "k-1", change.ts(1)).await;
        let second = order(&old.client(), change.host, "k-2", change.ts(1)).await;
        assert_eq!((first.status.as_u16(), second.status.as_u16()), (201, 201), "{what}");
        old.shutdown().await;

        let pinned = TestGateway::start(&toml(&store, upstream.addr, &change.pinned)).await;
        let retry = order(&pinned.client(), change.host, "k-1", change.ts(2)).await;
        assert_eq!(retry.status, 201, "{what}: never 422: {retry:?}");
        assert!(retry.is_replay(), "{what}: {retry:?}");
        assert_eq!(retry.json()["execution"], first.json()["execution"], "{what}");
        assert_eq!(upstream.executions(), 2, "{what}: nothing ran again");
        pinned.shutdown().await;

        let unpinned = TestGateway::start(&toml(&store, upstream.addr, &change.unpinned)).await;
        let rerun = order(&unpinned.client(), change.host, "k-2", change.ts(2)).await;
        if change.is_fingerprint() {
            assert_eq!(rerun.status, 422, "{what}: the unpinned file refuses an honest retry: {rerun:?}");
        } else {
            assert!(rerun.status == 201 && !rerun.is_replay(), "{what}: the unpinned file runs it again: {rerun:?}");
            assert_eq!(upstream.executions(), 3, "{what}");
        }
        unpinned.shutdown().await;
    }
}

/// A rolling deploy: one gateway with the old file, one with the new (pinned) one, on one
/// Redis, the same request sent to both at once. Each key runs once, whichever gateway won,
/// and a retry on the new file replays it.
///
/// A fingerprint change has a window: a record the new file made is judged by the old file
/// under the old settings alone, so a duplicate sent to an old gateway meanwhile may get 422
/// (never a second execution); see docs/configuration.md.
async fn two_files_side_by_side(store: StoreKind) {
    for change in changes() {
        let what = change.what;
        let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(100), ..Behavior::default() }).await;
        let store = store.toml(&support::unique("rolling"));
        let old = TestGateway::start(&toml(&store, upstream.addr, &change.before)).await;
        let new = TestGateway::start(&toml(&store, upstream.addr, &change.pinned)).await;
        let (a, b) = (old.client(), new.client());
        for round in 0..6u32 {
            let key = format!("race-{round}");
            let (x, y) = tokio::join!(order(&a, change.host, &key, 1), order(&b, change.host, &key, 1));
            let old_may_refuse = change.is_fingerprint() && x.status == 422;
            for r in [&x, &y] {
                assert!(r.status == 201 || r.status == 409 || old_may_refuse, "{what}: {r:?}");
            }
            if x.status == 201 && y.status == 201 {
                assert_eq!(x.json()["execution"], y.json()["execution"], "{what}: {key} ran twice");
            }
            let again = order(&b, change.host, &key, 1).await;
            assert!(again.is_replay(), "{what}: {again:?}");
            assert_eq!(upstream.executions(), round as usize + 1, "{what}: {key} reached the upstream once");
        }
        old.shutdown().await;
        new.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_files_side_by_side_on_one_redis() {
    two_files_side_by_side(StoreKind::Redis(support::redis::RedisServer::shared().url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_files_side_by_side_on_a_cluster() {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    two_files_side_by_side(StoreKind::Redis(CLUSTER.get_or_init(|| RedisCluster::start(3, 0)).url())).await;
}
