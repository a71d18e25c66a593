//! The real binary: flags, database creation, and exit on SIGTERM / SIGINT.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{HttpClient, TestDb, bearer, order_json, rows};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_order-service");

/// Starts the binary on port 0 and reads the bound address from its startup log line.
async fn spawn(database: &str) -> (Child, SocketAddr) {
    spawn_with(database, &[]).await
}

/// [`spawn`] with more flags.
async fn spawn_with(database: &str, flags: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--database", database])
        .args(flags)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn order-service");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some((_, rest)) = line.split_once("listening on ") {
                let addr = rest.split_whitespace().next().expect("address");
                return addr.parse::<SocketAddr>().expect("socket address");
            }
        }
        panic!("order-service exited before listening");
    })
    .await
    .expect("order-service did not start");
    // Keep draining so the child never blocks on a full stderr pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

async fn signal_and_wait(child: &mut Child, signal: &str) {
    let pid = child.id().expect("pid").to_string();
    let status = Command::new("kill").args([&format!("-{signal}"), &pid]).status().await.expect("run kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("order-service did not exit after signal")
        .expect("wait");
    assert!(exit.success(), "exit status after {signal}: {exit}");
}

async fn serves_then_exits_cleanly(url: &str, signal: &str) {
    let (mut child, addr) = spawn(url).await;
    let client = HttpClient::new(addr);
    let res = client.post_order("frank", Some("cli-1"), &order_json("frank", "SKU-3", 4)).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.text());
    signal_and_wait(&mut child, signal).await;
    assert_eq!(rows(url).await.len(), 1);
}

#[tokio::test]
async fn sqlite_file_is_created_and_sigterm_exits_zero() {
    let db = TestDb::sqlite();
    let path = db.url().trim_start_matches("sqlite:").to_owned();
    assert!(!std::path::Path::new(&path).exists());
    serves_then_exits_cleanly(db.url(), "TERM").await;
    assert!(std::path::Path::new(&path).exists());
}

#[tokio::test]
async fn sigint_exits_zero() {
    let db = TestDb::sqlite();
    serves_then_exits_cleanly(db.url(), "INT").await;
}

#[tokio::test]
async fn postgres_sigterm_exits_zero() {
    let Some(db) = TestDb::postgres("postgres_sigterm_exits_zero").await else {
        return;
    };
    serves_then_exits_cleanly(db.url(), "TERM").await;
}

#[tokio::test]
async fn unsupported_database_url_fails_without_echoing_it() {
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--database", "mysql://user:secret@localhost/db"])
        .output()
        .await
        .expect("run order-service");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unsupported database URL scheme \"mysql\""), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}

/// POST /orders as `frank` with `key` and `X-Demo-Fault: drop-answer`: whether the answer
/// arrived whole, and the status.
async fn post_with_fault(client: &HttpClient, key: &str) -> (StatusCode, bool) {
    let auth = bearer("frank");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", auth.as_str()),
        ("idempotency-key", key),
        ("x-demo-fault", "drop-answer"),
    ];
    let res = client.try_request(Method::POST, "/orders", &headers, &order_json("frank", "SKU-3", 1)).await;
    (res.status, res.body.is_ok())
}

#[tokio::test]
async fn demo_faults_flag_turns_the_fault_header_on() {
    let db = TestDb::sqlite();
    let (mut child, addr) = spawn_with(db.url(), &["--demo-faults"]).await;
    let client = HttpClient::new(addr);
    assert_eq!(post_with_fault(&client, "cli-drop").await, (StatusCode::CREATED, false), "the answer should break off");
    let found = client.lookup("frank", "cli-drop").await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.text());
    signal_and_wait(&mut child, "TERM").await;
    assert_eq!(rows(db.url()).await.len(), 1);
}

#[tokio::test]
async fn without_demo_faults_the_fault_header_is_ignored() {
    let db = TestDb::sqlite();
    let (mut child, addr) = spawn(db.url()).await;
    let client = HttpClient::new(addr);
    assert_eq!(post_with_fault(&client, "cli-drop").await, (StatusCode::CREATED, true), "the answer should be whole");
    signal_and_wait(&mut child, "TERM").await;
    assert_eq!(rows(db.url()).await.len(), 1);
}

#[tokio::test]
async fn help_documents_demo_faults() {
    let out = Command::new(BIN).arg("--help").output().await.expect("run order-service --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--demo-faults"), "{help}");
    assert!(help.contains("X-Demo-Fault: drop-answer"), "{help}");
}
