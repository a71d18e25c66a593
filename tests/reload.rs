//! Reloading the configuration of the real binary under load: SIGHUP and `POST /reload`
//! swap routes in without a failed request, a bad file changes nothing, and what cannot
//! change without a restart is reported.

mod support;

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
    assert!(gw.log_lines().iter().filter(|l| l.contains("configuration reloaded")).count() >= 20);
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
