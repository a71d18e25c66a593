//! Test harness: a real `redis-server` per test binary, a counting upstream, the gateway on
//! port 0, and a small HTTP client. Everything binds to loopback.

#![allow(dead_code)]

pub mod client;
pub mod cluster;
pub mod gateway;
pub mod gateway_proc;
pub mod lagged_sentinel;
pub mod pki;
pub mod previous;
pub mod process;
pub mod proxy;
pub mod raw_upstream;
pub mod redis;
pub mod replication_link;
pub mod sentinel;
pub mod upstream;

use std::sync::atomic::{AtomicUsize, Ordering};

/// `cargo`, for a build started from inside a test, without the variables cargo sets for the
/// test process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...). Build scripts watch some of
/// them (ring's does, with `rerun-if-env-changed`): seen set here and unset from a shell, they
/// would rebuild those dependencies here, in the shared target directory, and again at the next
/// `cargo build` or `cargo test` from a shell, with everything that depends on them.
pub fn cargo() -> std::process::Command {
    let mut command = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let set_for_tests = |name: &str| {
        name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&name)
    };
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_for_tests) {
            command.env_remove(name);
        }
    }
    command
}

/// A name unique within this test process and across concurrently running test processes, for
/// key prefixes, so tests sharing one Redis never see each other's records.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The store's name for the record of Idempotency-Key `name` on route `orders`, global scope;
/// `prefix` keeps tests sharing one Redis apart.
pub fn record_key(prefix: &str, name: &str) -> idemgate::store::RecordKey {
    use idemgate::policy::{key, scope};
    let mut h = http::HeaderMap::new();
    h.insert("idempotency-key", http::HeaderValue::from_str(name).unwrap());
    let k = key::extract(&h, &http::HeaderName::from_static("idempotency-key"), 255).unwrap().unwrap();
    let scope =
        scope::derive(&scope::ScopeSource::Global, scope::MissingScope::Reject, &http::HeaderMap::new()).unwrap();
    idemgate::store::RecordKey::new(prefix, "orders", &scope, &k)
}

/// Serves HTTP/1.1 and h2c on a fresh loopback port with `answer(state, request)`; returns the
/// address. The server runs until the test's runtime ends.
pub async fn serve_http<S, F, Fut>(state: std::sync::Arc<S>, answer: F) -> std::net::SocketAddr
where
    S: Send + Sync + 'static,
    F: Fn(std::sync::Arc<S>, http::Request<hyper::body::Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<
            Output = Result<http::Response<http_body_util::Full<bytes::Bytes>>, std::convert::Infallible>,
        > + Send
        + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_http_on(listener, state, answer)
}

/// As [`serve_http`], on a listener of the caller's; returns its address.
pub fn serve_http_on<S, F, Fut>(
    listener: tokio::net::TcpListener,
    state: std::sync::Arc<S>,
    answer: F,
) -> std::net::SocketAddr
where
    S: Send + Sync + 'static,
    F: Fn(std::sync::Arc<S>, http::Request<hyper::body::Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<
            Output = Result<http::Response<http_body_util::Full<bytes::Bytes>>, std::convert::Infallible>,
        > + Send
        + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let state = std::sync::Arc::clone(&state);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(std::sync::Arc::clone(&state), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}
