//! Reloading the configuration of the real binary under load: SIGHUP and `POST /reload`
//! swap routes in without a failed request, a bad file changes nothing, and what cannot
//! change without a restart is reported.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Method;
use support::client::Client;
use support::gateway_proc::{GatewayProc, Toml};
use support::upstream::TestUpstream;

const TOKEN: (&str, &str) = ("authorization", "Bearer test-admin-token-0123456789");

/// A config whose routes include `probe-N` for each N in `probes`.
fn config(upstream: std::net::SocketAddr, probes: &[usize], listen: &str) -> String {
    let routes = probes
        .iter()
        .map(|n| format!("\n[[routes]]\nname = \"probe-{n}\"\npath = \"/probe-{n}\"\nupstream = \"app\"\n"))
        .collect();
    Toml {
        listen,
        server: "admin_token = \"test-admin-token-0123456789\"",
        pass_through: false,
        routes,
        ..Toml::new(upstream)
    }
    .render()
}

async fn route_names(admin: &Client) -> Vec<String> {
    let routes = admin.get("/routes", &[TOKEN]).await.json();
    routes.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_fail_no_request() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&config(upstream.addr, &[], "127.0.0.1:0"));
    let admin = Client::new(gw.admin);

    // Load: new keys and their retries, without pause, on several connections.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|worker| {
            let (client, stop) = (gw.client(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{worker}-{}", n / 2);
                    match client
                        .try_send(
                            Method::POST,
                            "/orders",
                            &[
                                ("content-type", "application/json"),
                                ("authorization", "Bearer load"),
                                ("idempotency-key", &key),
                            ],
                            r#"{"n":1}"#,
                        )
                        .await
                    {
                        Ok(r) if r.status == 201 => {}
                        Ok(r) => failures.push(format!("{key}: {}", r.status)),
                        Err(e) => failures.push(format!("{key}: {e}")),
                    }
                    n += 1;
                }
                (n, failures)
            })
        })
        .collect();

    for i in 1..=20 {
        std::fs::write(gw.config_path(), config(upstream.addr, &[i], "127.0.0.1:0")).unwrap();
        if i % 2 == 0 {
            gw.sighup();
        } else {
            let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            assert_eq!(r.json()["needs_restart"], serde_json::json!([]));
        }
        // The new route serves; the one before it is gone.
        let mut names = Vec::new();
        for _ in 0..50 {
            names = route_names(&admin).await;
            if names.contains(&format!("probe-{i}")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(names, ["orders".to_owned(), format!("probe-{i}")], "after reload {i}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for worker in load {
        let (n, failures) = worker.await.unwrap();
        assert!(failures.is_empty(), "{failures:?}");
        total += n;
    }
    assert!(total > 100, "the load ran ({total} requests)");
    assert!(gw.lines_with("configuration reloaded", 20).len() >= 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_changes_nothing_and_a_new_listener_needs_a_restart() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&config(upstream.addr, &[1], "127.0.0.1:0"));
    let admin = Client::new(gw.admin);

    std::fs::write(gw.config_path(), "[server\nthis is not TOML").unwrap();
    let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["reloaded"], false);
    gw.sighup();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(route_names(&admin).await, ["orders", "probe-1"], "the running config stays");
    assert_eq!(gw.client().get("/probe-1", &[]).await.status, 201, "and serves");

    std::fs::write(gw.config_path(), config(upstream.addr, &[2], "127.0.0.1:1")).unwrap();
    let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["needs_restart"], serde_json::json!(["server.listen"]));
    assert_eq!(route_names(&admin).await, ["orders", "probe-2"], "what can change, changed");
    assert_eq!(gw.client().get("/probe-2", &[]).await.status, 201, "still on the running listener");

    assert_eq!(admin.send(Method::POST, "/reload", &[], "").await.status, 401, "reload needs the token");
}

/// The reload's log line names what needs a restart as words, in both log formats (not
/// `needs_restart="[]"`), and leaves the JSON answer of `POST /reload` a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_log_line_names_what_needs_a_restart_in_either_format() {
    let upstream = TestUpstream::start().await;
    for format in ["json", "pretty"] {
        let gw = GatewayProc::start_with(&config(upstream.addr, &[1], "127.0.0.1:0"), &["--log-format", format]);
        let admin = Client::new(gw.admin);
        let reloaded = || gw.lines_with("configuration reloaded", 2);

        assert_eq!(admin.send(Method::POST, "/reload", &[TOKEN], "").await.status, 200);
        std::fs::write(gw.config_path(), config(upstream.addr, &[1], "127.0.0.1:1")).unwrap();
        let r = admin.send(Method::POST, "/reload", &[TOKEN], "").await;
        assert_eq!(r.json()["needs_restart"], serde_json::json!(["server.listen"]));
        let lines = reloaded();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        if format == "json" {
            let fields: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
            assert_eq!(fields[0]["needs_restart"], "none", "{lines:#?}");
            assert_eq!(fields[1]["needs_restart"], "server.listen", "{lines:#?}");
        } else {
            assert!(lines[0].contains("needs_restart=none"), "{lines:#?}");
            assert!(lines[1].contains("needs_restart=server.listen"), "{lines:#?}");
        }
        assert!(lines.iter().all(|l| !l.contains('[')), "no list punctuation: {lines:#?}");
    }
}

/// Without an admin token, the endpoints that need one say which they are and how to turn
/// them on (the problem type is still `admin-keys-disabled`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_admin_says_which_endpoints_are_off_and_how_to_enable_them() {
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&Toml::new(upstream.addr).render());
    let admin = Client::new(gw.admin);
    for (method, path) in
        [(Method::GET, "/routes"), (Method::POST, "/reload"), (Method::GET, "/keys?route=orders&key=k")]
    {
        let r = admin.send(method.clone(), path, &[TOKEN], "").await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (404, "admin-keys-disabled"), "{method} {path}");
        let doc = r.json();
        assert_eq!(doc["title"], "Admin endpoints that need a token are disabled", "{method} {path}");
        let detail = doc["detail"].as_str().unwrap();
        for needle in ["/keys", "/routes", "/reload", "server.admin_token", "admin_token_env"] {
            assert!(detail.contains(needle), "{method} {path}: {needle} not in {detail:?}");
        }
    }
    assert_eq!(admin.get("/policy", &[]).await.status, 200, "the public endpoints stay on");
}
