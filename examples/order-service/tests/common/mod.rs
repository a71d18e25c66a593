//! Test support: throwaway databases on both backends, an in-process service on a real
//! TCP port, a small HTTP client and direct reads of the `orders` table.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use order_service::{Database, Error, Options};
use sqlx::Connection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const POSTGRES_ENV: &str = "ORDER_SERVICE_TEST_POSTGRES";
/// The server the Postgres tests use when `ORDER_SERVICE_TEST_POSTGRES` is not set: the local
/// one, as its superuser, without a password (a trust login).
pub const LOCAL_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Whether the local server took a login, asked once per test process: its URL, or why not.
static LOCAL: OnceLock<Result<String, String>> = OnceLock::new();

/// Distinguishes databases created by one test process within the same nanosecond.
static DB_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A database that exists for one test. SQLite lives in a temp dir; Postgres gets a
/// uniquely named database on the server from `ORDER_SERVICE_TEST_POSTGRES` (or the local
/// one), dropped when this value is dropped, including while a failed test unwinds.
pub struct TestDb {
    url: String,
    backend: Backend,
}

enum Backend {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, name: String },
}

impl TestDb {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("create temp dir");
        let url = format!("sqlite:{}", dir.path().join("orders.db").display());
        Self { url, backend: Backend::Sqlite(dir) }
    }

    /// A database on the server from `ORDER_SERVICE_TEST_POSTGRES`, else on the local server
    /// when it takes a login. Without either, `None` after reporting `test` as not run, on
    /// stderr past the test harness's capture, so that it shows; with `CI=true` that fails
    /// the test instead. A server that is named but does not answer fails the test.
    pub async fn postgres(test: &str) -> Option<Self> {
        let admin_url = match std::env::var(POSTGRES_ENV) {
            Ok(url) => url,
            Err(_) => match LOCAL.get_or_init(local_postgres) {
                Ok(url) => url.clone(),
                Err(why) => {
                    not_run(test, why);
                    return None;
                }
            },
        };
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos();
        let name =
            format!("order_service_test_{}_{}_{}", std::process::id(), nanos, DB_SEQ.fetch_add(1, Ordering::Relaxed));
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|err| panic!("connect to test Postgres {admin_url}: {err}"));
        // The name is generated above from digits and underscores, so quoting suffices.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let _ = admin.close().await;
        let mut url = url::Url::parse(&admin_url).expect("parse the Postgres URL");
        url.set_path(&name);
        Some(Self { url: url.to_string(), backend: Backend::Postgres { admin_url, name } })
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// `LOCAL_POSTGRES` if something answers on its port and takes the login, else why not.
fn local_postgres() -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 5432));
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|err| format!("nothing answers on {addr}: {err}"))?;
    // Asked from inside a test's runtime: a thread with its own runtime, as in `Drop`.
    let login = std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async {
            let conn = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(LOCAL_POSTGRES))
                .await
                .map_err(|_| "the login timed out".to_owned())?
                .map_err(|err| format!("the login was refused: {err}"))?;
            let _ = conn.close().await;
            Ok(LOCAL_POSTGRES.to_owned())
        })
    })
    .join();
    login
        .unwrap_or_else(|_| Err("the login attempt panicked".to_owned()))
        .map_err(|why| format!("{LOCAL_POSTGRES}: {why}"))
}

/// Reports a Postgres test that could not run: a failure with `CI=true`, else a line on stderr.
fn not_run(test: &str, why: &str) {
    let line = format!("NOT RUN: {test} ({why}; set {POSTGRES_ENV} or start PostgreSQL on 127.0.0.1:5432)");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{line}: CI runs every test");
    }
    // Straight to the stream: `eprintln!` would be captured, and shown only for a failure.
    let _ = writeln!(std::io::stderr(), "{line}");
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Backend::Postgres { admin_url, name } = &self.backend else {
            return;
        };
        let (admin_url, name) = (admin_url.clone(), name.clone());
        // Drop cannot await, and may run on a runtime thread: a fresh thread with its own
        // runtime avoids nesting runtimes. FORCE ends connections a failed test left open.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let mut admin = sqlx::PgConnection::connect(&admin_url).await?;
                let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut admin).await?;
                admin.close().await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(err)) => eprintln!("warning: could not drop test database {}: {err}", self.url),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.url),
        }
    }
}

/// A stored order as read straight from the table, bypassing the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: i64,
    pub user_id: String,
    pub idem_key: String,
    pub sku: String,
    pub quantity: i64,
}

type RawRow = (i64, String, String, String, i64);
const ROWS: &str = "SELECT id, user_id, idem_key, sku, quantity FROM orders ORDER BY id";

pub async fn rows(url: &str) -> Vec<Row> {
    let raw: Vec<RawRow> = if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.expect("open sqlite");
        sqlx::query_as(ROWS).fetch_all(&mut conn).await.expect("read sqlite rows")
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.expect("open postgres");
        sqlx::query_as(ROWS).fetch_all(&mut conn).await.expect("read postgres rows")
    };
    raw.into_iter().map(|(id, user_id, idem_key, sku, quantity)| Row { id, user_id, idem_key, sku, quantity }).collect()
}

pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII header"))
    }
}

/// A response whose body may have broken off.
pub struct PartialResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The whole body, or the client's error reading it.
    pub body: Result<Bytes, String>,
}

impl PartialResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII header"))
    }
}

#[derive(Clone)]
pub struct HttpClient {
    base: String,
    inner: Client<HttpConnector, Full<Bytes>>,
}

impl HttpClient {
    pub fn new(addr: SocketAddr) -> Self {
        Self { base: format!("http://{addr}"), inner: Client::builder(TokioExecutor::new()).build_http() }
    }

    pub async fn request(&self, method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        let res = self.try_request(method, path, headers, body).await;
        let body = res.body.unwrap_or_else(|err| panic!("read body: {err}"));
        Response { status: res.status, headers: res.headers, body }
    }

    /// Like [`Self::request`], but a body that cannot be read in full is an `Err` (with the
    /// client's error), not a panic: for answers that are meant to break off.
    pub async fn try_request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> PartialResponse {
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).expect("build request");
        let res = tokio::time::timeout(Duration::from_secs(10), self.inner.request(req))
            .await
            .expect("request timed out")
            .expect("send request");
        let (parts, body) = res.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(10), body.collect())
            .await
            .expect("reading the body timed out")
            .map(|collected| collected.to_bytes())
            .map_err(|err| format!("{err:?}"));
        PartialResponse { status: parts.status, headers: parts.headers, body }
    }

    /// POST /orders as `user` (`Authorization: Bearer <user>`) with an optional raw
    /// `Idempotency-Key` header value.
    pub async fn post_order(&self, user: &str, key: Option<&str>, body: &str) -> Response {
        self.post_order_auth(Some(&bearer(user)), key, body).await
    }

    /// POST /orders with a raw `Authorization` value, or none.
    pub async fn post_order_auth(&self, auth: Option<&str>, key: Option<&str>, body: &str) -> Response {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(auth) = auth {
            headers.push(("authorization", auth));
        }
        if let Some(key) = key {
            headers.push(("idempotency-key", key));
        }
        self.request(Method::POST, "/orders", &headers, body).await
    }

    /// GET without credentials.
    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path, &[], "").await
    }

    /// GET as `user`.
    pub async fn get_as(&self, user: &str, path: &str) -> Response {
        self.request(Method::GET, path, &[("authorization", &bearer(user))], "").await
    }

    /// GET /orders/lookup as `user` with a raw `Idempotency-Key` header value.
    pub async fn lookup(&self, user: &str, key: &str) -> Response {
        let auth = bearer(user);
        self.request(Method::GET, "/orders/lookup", &[("authorization", &auth), ("idempotency-key", key)], "").await
    }
}

/// The service running in-process on 127.0.0.1:0.
pub struct Service {
    pub addr: SocketAddr,
    pub client: HttpClient,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl Service {
    pub async fn start(url: &str) -> Self {
        Self::start_with(url, Options::default()).await
    }

    /// The service with `options` (demo faults), as `--demo-faults` starts the binary.
    pub async fn start_with(url: &str, options: Options) -> Self {
        let db = Database::connect(url).await.expect("connect service database");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(order_service::serve_with(listener, db, options, async {
            let _ = stop.await;
        }));
        Self { addr, client: HttpClient::new(addr), shutdown: Some(shutdown), task }
    }

    /// Completes the shutdown future handed to `serve`, like SIGTERM does in the binary.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub fn has_stopped(&self) -> bool {
        self.task.is_finished()
    }

    /// Triggers the shutdown future and waits for `serve` to return.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.begin_shutdown();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve did not return after shutdown")
            .expect("serve task panicked")
    }

    pub async fn stats(&self) -> serde_json::Value {
        let res = self.client.get("/stats").await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.text());
        res.json()
    }
}

/// Holds a lock that makes an insert of `(user_id, idem_key)` wait: SQLite's write lock, or on
/// Postgres an uncommitted row with that key. Released by rolling back.
pub enum InsertBlocker {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl InsertBlocker {
    pub async fn hold(url: &str, user_id: &str, idem_key: &str) -> Self {
        if url.starts_with("sqlite:") {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("open sqlite");
            sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await.expect("take write lock");
            Self::Sqlite(conn)
        } else {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("open postgres");
            sqlx::raw_sql("BEGIN").execute(&mut conn).await.expect("begin");
            sqlx::query("INSERT INTO orders (user_id, idem_key, sku, quantity) VALUES ($1, $2, 'HOLD', 1)")
                .bind(user_id)
                .bind(idem_key)
                .execute(&mut conn)
                .await
                .expect("insert uncommitted row");
            Self::Postgres(conn)
        }
    }

    pub async fn release(self) {
        match self {
            Self::Sqlite(mut conn) => sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.map(drop),
            Self::Postgres(mut conn) => sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.map(drop),
        }
        .expect("rollback");
    }
}

pub fn bearer(user: &str) -> String {
    format!("Bearer {user}")
}

pub fn order_json(user_id: &str, sku: &str, quantity: i64) -> String {
    serde_json::json!({ "user_id": user_id, "sku": sku, "quantity": quantity }).to_string()
}

/// Generates `NAME::sqlite` and `NAME::postgres` tests for each `async fn NAME(url: &str)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let db = $crate::common::TestDb::sqlite();
                super::$name(db.url()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let test = concat!(stringify!($name), "::postgres");
                let Some(db) = $crate::common::TestDb::postgres(test).await else { return };
                super::$name(db.url()).await;
            }
        }
    )*};
}
