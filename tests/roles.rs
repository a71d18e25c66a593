//! Admin roles and the audit trail, against the real binary: a `read` token looks and is
//! refused every change (403, nothing changed, audited); an `operate` token changes; tokens
//! come and go with a reload; every gateway on one Redis shares the trail, capped as
//! configured; and the trail never holds a client's key, scope or body.

use crate::support;

use http::Method;
use serde_json::Value;
use support::client::{Client, DEFAULT_AUTH, Reply};
use support::gateway_proc::{GatewayProc, Toml};
use support::upstream::TestUpstream;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;
/// `server.admin_token`: the operate token named "admin".
const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";

/// `[server]` lines: the legacy token, alice (operate, from the environment) and viewer
/// (read, from the file `viewer_file`).
fn server_lines(viewer_file: &std::path::Path, extra: &str) -> String {
    format!(
        "admin_token = \"{ADMIN}\"\n{extra}\n\
         [[server.admin_tokens]]\nname = \"alice\"\nrole = \"operate\"\ntoken_env = \"TEST_TOKEN_ALICE\"\n\n\
         [[server.admin_tokens]]\nname = \"viewer\"\nrole = \"read\"\ntoken_file = \"{}\"\n",
        viewer_file.display()
    )
}

async fn call(admin: &Client, method: Method, path: &str, token: &str, body: &str) -> Reply {
    let bearer = format!("Bearer {token}");
    let headers = [("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)];
    admin.send(method, path, &headers, body.to_owned()).await
}

fn entries(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["entries"].as_array().cloned().unwrap_or_default()
}

/// A gateway on the memory store with the three tokens, the viewer's in a file (with the
/// newline an editor leaves, which the gateway trims): the upstream, the gateway, the
/// directory and the viewer's file.
async fn on_memory() -> (TestUpstream, GatewayProc, tempfile::TempDir, std::path::PathBuf) {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let viewer_file = dir.path().join("viewer");
    std::fs::write(&viewer_file, format!("{VIEWER}\n")).unwrap();
    let gw = start(upstream.addr, "backend = \"memory\"", &server_lines(&viewer_file, ""));
    (upstream, gw, dir, viewer_file)
}

fn start(upstream: std::net::SocketAddr, store: &str, server: &str) -> GatewayProc {
    let toml = Toml { server, store, ..Toml::new(upstream) }.render();
    GatewayProc::start_full(&toml, &[], &[("TEST_TOKEN_ALICE", ALICE)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_looks_and_every_change_it_asks_for_is_refused_and_audited() {
    let (upstream, gw, _dir, _viewer) = on_memory().await;
    let client = gw.client();
    assert_eq!(client.post_json("/orders", Some("\"k-read\""), ORDER).await.status, 201);
    let admin = Client::new(gw.admin);
    let record = "/keys?route=orders&key=%22k-read%22";

    // What only looks: every GET.
    let looked = call(&admin, Method::GET, record, VIEWER, "").await;
    assert_eq!((looked.status.as_u16(), looked.json()["state"].as_str()), (200, Some("completed")));
    assert_eq!(call(&admin, Method::GET, "/routes", VIEWER, "").await.status, 200);
    assert_eq!(call(&admin, Method::GET, "/keys?route=orders&state=unknown", VIEWER, "").await.status, 200);
    assert_eq!(call(&admin, Method::GET, "/audit", VIEWER, "").await.status, 200);

    // Every change: 403, nothing changed.
    for (method, path, body) in [
        (Method::DELETE, record.to_owned(), ""),
        (Method::DELETE, format!("{record}&force=true"), ""),
        (Method::PUT, record.to_owned(), r#"{"status":200,"body":"<img src=x onerror=alert(1)>"}"#),
        (Method::POST, "/reload".to_owned(), ""),
    ] {
        let refused = call(&admin, method.clone(), &path, VIEWER, body).await;
        assert_eq!((refused.status.as_u16(), refused.problem().as_str()), (403, "admin-forbidden"), "{method} {path}");
        assert!(refused.json()["detail"].as_str().unwrap_or_default().contains("\"viewer\" has the read role"));
    }
    let replay = client.post_json("/orders", Some("\"k-read\""), ORDER).await;
    assert!(replay.is_replay(), "the record was not released: {:?}", replay.body);
    assert_eq!(upstream.executions(), 1, "nothing ran again");

    // Strangers: 401, and neither in the trail nor the log.
    assert_eq!(call(&admin, Method::DELETE, record, "not-a-token-0123456789", "").await.status, 401);
    assert_eq!(admin.send(Method::DELETE, record, &[], "").await.status, 401);

    // An operate token changes: alice's, and the legacy token as "admin".
    let released = call(&admin, Method::DELETE, record, ALICE, "").await;
    assert_eq!(released.json(), serde_json::json!({"released": true, "was": "completed"}));
    assert_eq!(client.post_json("/orders", Some("\"k-read\""), ORDER).await.status, 201, "ran again");
    assert_eq!(upstream.executions(), 2);
    let reloaded = call(&admin, Method::POST, "/reload", ADMIN, "").await;
    assert_eq!(reloaded.status, 200, "{:?}", reloaded.body);

    let trail = entries(&call(&admin, Method::GET, "/audit", VIEWER, "").await);
    let summary: Vec<(String, String, String, u64)> = trail
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
            (s("by"), s("action"), s("outcome"), e["status"].as_u64().unwrap_or(0))
        })
        .collect();
    let expected = [
        ("admin", "reload", "done", 200),
        ("alice", "release", "done", 200),
        ("viewer", "reload", "forbidden", 403),
        ("viewer", "resolve", "forbidden", 403),
        ("viewer", "forced-release", "forbidden", 403),
        ("viewer", "release", "forbidden", 403),
    ];
    let expected: Vec<(String, String, String, u64)> =
        expected.iter().map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), *d)).collect();
    assert_eq!(summary, expected, "newest first, strangers left out: {trail:#?}");
    let release = &trail[1];
    assert_eq!((release["before"].as_str(), release["after"].as_str()), (Some("completed"), Some("released")));
    assert_eq!((release["route"].as_str(), release["role"].as_str()), (Some("orders"), Some("operate")));
    assert_eq!(release["from"].as_str(), Some("127.0.0.1"));
    let short = release["record"].as_str().unwrap_or_default();
    assert_eq!(short.len(), 12, "the record as log lines name it: {release}");
    assert_eq!(trail[3]["route"].as_str(), Some("orders"), "a refused call names the configured route");
    for entry in &trail {
        assert!(entry["at"].as_str().is_some_and(|at| at.ends_with('Z')) && entry["gateway"].is_string(), "{entry}");
        assert!(entry["id"].as_str().is_some_and(|id| id.contains('-')), "{entry}");
        let text = entry.to_string();
        for secret in ["k-read", "tester", "onerror", VIEWER, ALICE, ADMIN] {
            assert!(!text.contains(secret), "the trail shows {secret}: {text}");
        }
    }
    // The log line keeps its fields, and says who.
    let lines = gw.lines_with("operator changed a key", 5);
    assert!(lines.iter().any(|l| l.contains("by=alice") && l.contains("action=\"release\"")), "{lines:#?}");
    assert!(!gw.log().contains("not-a-token"), "a stranger's token was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_added_changed_and_revoked_by_a_reload() {
    let (_upstream, gw, dir, viewer_file) = on_memory().await;
    let admin = Client::new(gw.admin);
    assert_eq!(call(&admin, Method::GET, "/routes", VIEWER, "").await.status, 200);

    // The viewer's secret rotated in its file, and a new read token: applied by the reload.
    let rotated = "viewer-rotated-0123456789";
    std::fs::write(&viewer_file, rotated).unwrap();
    let text = std::fs::read_to_string(gw.config_path()).unwrap().replace(
        "[[server.admin_tokens]]\nname = \"alice\"",
        "[[server.admin_tokens]]\nname = \"grafana\"\nrole = \"read\"\ntoken_file = \"GRAFANA\"\n\n\
         [[server.admin_tokens]]\nname = \"alice\"",
    );
    let grafana_file = dir.path().join("grafana");
    std::fs::write(&grafana_file, "grafana-token-0123456789").unwrap();
    std::fs::write(gw.config_path(), text.replace("GRAFANA", &grafana_file.display().to_string())).unwrap();
    let reloaded = call(&admin, Method::POST, "/reload", ALICE, "").await;
    assert_eq!(reloaded.json()["needs_restart"], serde_json::json!([]), "tokens need no restart: {:?}", reloaded.body);
    assert_eq!(call(&admin, Method::GET, "/routes", VIEWER, "").await.status, 401, "the old secret is revoked");
    assert_eq!(call(&admin, Method::GET, "/routes", rotated, "").await.status, 200);
    assert_eq!(call(&admin, Method::GET, "/routes", "grafana-token-0123456789", "").await.status, 200);

    // Alice removed: her token is refused from the next call.
    let text = std::fs::read_to_string(gw.config_path()).unwrap().replace(
        "[[server.admin_tokens]]\nname = \"alice\"\nrole = \"operate\"\ntoken_env = \"TEST_TOKEN_ALICE\"\n",
        "",
    );
    std::fs::write(gw.config_path(), text).unwrap();
    assert_eq!(call(&admin, Method::POST, "/reload", ALICE, "").await.status, 200);
    assert_eq!(call(&admin, Method::POST, "/reload", ALICE, "").await.status, 401, "alice is revoked");
    assert_eq!(call(&admin, Method::POST, "/reload", ADMIN, "").await.status, 200);

    // A reload whose token file is gone is refused whole: the running tokens stay.
    std::fs::remove_file(&grafana_file).unwrap();
    let refused = call(&admin, Method::POST, "/reload", ADMIN, "").await;
    assert_eq!(refused.status, 422, "{:?}", refused.body);
    assert!(refused.json()["error"].as_str().unwrap_or_default().contains("token_file"), "{:?}", refused.body);
    assert_eq!(call(&admin, Method::GET, "/routes", "grafana-token-0123456789", "").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_on_one_redis_shares_the_trail_capped_and_paged() {
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::start();
    let store = format!("backend = \"redis\"\nurl = \"{}\"", redis.url());
    let dir = tempfile::tempdir().unwrap();
    let viewer_file = dir.path().join("viewer");
    std::fs::write(&viewer_file, VIEWER).unwrap();
    let server = server_lines(&viewer_file, "audit_max_entries = 4");
    let a = start(upstream.addr, &store, &server);
    let b = start(upstream.addr, &store, &server);
    let (admin_a, admin_b) = (Client::new(a.admin), Client::new(b.admin));
    assert_eq!(a.client().post_json("/orders", Some("\"shared\""), ORDER).await.status, 201);

    // A change through A is in B's trail, with who did it.
    let released = call(&admin_a, Method::DELETE, "/keys?route=orders&key=%22shared%22", ALICE, "").await;
    assert_eq!(released.status, 200, "{:?}", released.body);
    let seen = entries(&call(&admin_b, Method::GET, "/audit", VIEWER, "").await);
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!((seen[0]["by"].as_str(), seen[0]["action"].as_str()), (Some("alice"), Some("release")));

    // Six more changes, through both: the trail keeps the newest four.
    for n in 0..6 {
        let admin = if n % 2 == 0 { &admin_a } else { &admin_b };
        let refused = call(admin, Method::DELETE, "/keys?route=orders&key=%22shared%22", VIEWER, "").await;
        assert_eq!(refused.status, 403);
    }
    let all = entries(&call(&admin_a, Method::GET, "/audit?limit=10", VIEWER, "").await);
    assert_eq!(all.len(), 4, "capped at audit_max_entries: {all:#?}");
    assert!(all.iter().all(|e| e["outcome"] == "forbidden"), "the oldest (alice's) went first: {all:#?}");
    let ids: Vec<&str> = all.iter().filter_map(|e| e["id"].as_str()).collect();

    // Paged: two, then the two before them, then nothing more.
    let first = call(&admin_b, Method::GET, "/audit?limit=2", VIEWER, "").await;
    let cursor = first.json()["next_cursor"].as_str().map(str::to_owned).expect("a cursor");
    let second = call(&admin_b, Method::GET, &format!("/audit?limit=2&cursor={cursor}"), VIEWER, "").await;
    let paged: Vec<String> = entries(&first)
        .iter()
        .chain(entries(&second).iter())
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(paged, ids, "pages walk the trail newest first");
    let last = second.json()["next_cursor"].as_str().map(str::to_owned).expect("a full page hands a cursor");
    let empty = call(&admin_b, Method::GET, &format!("/audit?limit=2&cursor={last}"), VIEWER, "").await;
    assert_eq!((entries(&empty).len(), empty.json()["next_cursor"].is_null()), (0, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_on_the_trail_are_refused_in_words() {
    let (_upstream, gw, _dir, _viewer) = on_memory().await;
    let admin = Client::new(gw.admin);
    for query in [
        "cursor=%2B",
        "cursor=-",
        "cursor=(0-0",
        "cursor=1-2-3",
        "limit=0",
        "limit=1001",
        "limit=ten",
        "limit=1&limit=2",
        "cursr=1-0",
        "%3Cscript%3E=1",
    ] {
        let refused = call(&admin, Method::GET, &format!("/audit?{query}"), VIEWER, "").await;
        assert_eq!((refused.status.as_u16(), refused.problem().as_str()), (400, "admin-bad-request"), "{query}");
    }
    // A path the admin listener does not have names the ones it has.
    for path in ["/", "/nope", "/keys/x"] {
        let lost = admin.get(path, &[]).await;
        assert_eq!((lost.status.as_u16(), lost.problem().as_str()), (404, "admin-not-found"), "{path}");
        let detail = lost.json()["detail"].as_str().unwrap_or_default().to_owned();
        for named in
            ["/healthz (GET, HEAD)", "/keys (GET, HEAD, PUT, DELETE)", "/reload (POST)", "/console/ (GET, HEAD)"]
        {
            assert!(detail.contains(named), "{path}: {detail}");
        }
    }
    // A token on the trail is still needed, and a read one will do.
    assert_eq!(admin.get("/audit", &[]).await.status, 401);
    assert_eq!(call(&admin, Method::GET, "/audit?limit=1", VIEWER, "").await.status, 200);
}
