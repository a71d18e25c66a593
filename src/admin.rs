//! Admin listener: health, readiness, metrics, and inspect/purge of one key.
//!
//! It listens on its own address so that it can be kept off the public network. The key
//! endpoints can purge records (after which a retry would run again upstream), so they are
//! off unless `server.admin_token` is set, and then require `Authorization: Bearer <token>`.
//!
//! ```text
//! GET    /healthz                                 200 while the process runs (HEAD too)
//! GET    /readyz                                  200 when the store answers and not draining
//! GET    /metrics                                 Prometheus text format
//! GET    /policy                                  the idempotency policy, Markdown (public)
//! GET    /routes                                  the routing table with policies, JSON (token)
//! POST   /reload                                  re-read the config file (token)
//! GET    /keys?route=R&key=K[&scope_hash=H]   the record of key K (JSON)
//! DELETE /keys?route=R&key=K[&scope_hash=H]   release it
//! ```
//!
//! The caller whose key it is: its scope headers, each sent as `Scope-NAME` (for a route
//! scoped by `Authorization`, `Scope-Authorization: Bearer ...`; by a cookie,
//! `Scope-Cookie: session=...`), or `scope_hash`, the scope's digest in hex. Never the raw
//! credential in the URL, where proxies and shells log it. Neither: a `global` route, or the
//! anonymous scope.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::body::{self, Body};
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::policy::scope::{MissingScope, Scope};
use crate::reload::Live;
use crate::store::{EntryState, Store, StoreError};

/// The admin service's shared state.
#[derive(Clone)]
pub struct Admin {
    live: Arc<Live>,
    /// SHA-256 of the token: compared in constant time regardless of the token's length.
    token_hash: Option<[u8; 32]>,
}

impl Admin {
    /// An admin service; key endpoints are enabled only with a token.
    pub fn new(live: Arc<Live>, token: Option<String>) -> Self {
        Self { live, token_hash: token.map(|t| Sha256::digest(t.trim().as_bytes()).into()) }
    }
}

/// Serves the admin listener until the process ends.
pub async fn serve(listener: TcpListener, admin: Admin, draining: CancellationToken) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let admin = admin.clone();
        let draining = draining.clone();
        let service = service_fn(move |request| {
            let admin = admin.clone();
            let draining = draining.clone();
            async move { Ok::<_, Infallible>(handle(&admin, &draining, request).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// The admin endpoints and the methods each allows (HEAD wherever GET is).
const ENDPOINTS: [(&str, &str); 7] = [
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/metrics", "GET, HEAD"),
    ("/policy", "GET, HEAD"),
    ("/routes", "GET, HEAD"),
    ("/reload", "POST"),
    ("/keys", "GET, HEAD, DELETE"),
];

async fn handle(admin: &Admin, draining: &CancellationToken, request: Request<Incoming>) -> Response<Body> {
    // HEAD is GET without the body, which hyper leaves out of the response by itself.
    let method = if request.method() == Method::HEAD { &Method::GET } else { request.method() };
    let gw = &admin.live.gateway();
    match (method, request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            if draining.is_cancelled() {
                return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
            }
            match gw.runtime().store.ping().await {
                Ok(()) => text(StatusCode::OK, "ready\n"),
                Err(e) => {
                    tracing::warn!(error = %e, "readiness check: store unavailable");
                    text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
                }
            }
        }
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(body::full(gw.runtime().metrics.encode()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            );
            r
        }
        // Public by design: the policy is what the API's clients are meant to read.
        (&Method::GET, "/policy") => {
            let mut r = Response::new(body::full(crate::publish::markdown(gw.route_configs())));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/markdown; charset=utf-8"));
            r
        }
        (&Method::POST, "/reload") => {
            if let Some(denied) = authorize(admin, request.headers()) {
                return denied;
            }
            match admin.live.reload() {
                Ok(done) => {
                    json_response(StatusCode::OK, &json!({ "reloaded": true, "needs_restart": done.needs_restart }))
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload refused; the running configuration stays");
                    json_response(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &json!({ "reloaded": false, "error": e.to_string() }),
                    )
                }
            }
        }
        (&Method::GET, "/routes") => {
            if let Some(denied) = authorize(admin, request.headers()) {
                return denied;
            }
            json_response(StatusCode::OK, &crate::publish::routes_json(gw.route_configs()))
        }
        (method @ (&Method::GET | &Method::DELETE), "/keys") => {
            if let Some(denied) = authorize(admin, request.headers()) {
                return denied;
            }
            let delete = method == Method::DELETE;
            keys(gw, request.uri().query().unwrap_or(""), request.headers(), delete).await
        }
        (method, path) => match ENDPOINTS.iter().find(|(p, _)| *p == path) {
            Some((_, allow)) => {
                let detail = format!("{path} answers {allow}, not {method}.");
                let mut r = problem(gw, StatusCode::METHOD_NOT_ALLOWED, "admin-method", "Method not allowed", &detail);
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
                r
            }
            None => problem(gw, StatusCode::NOT_FOUND, "admin-not-found", "Not found", "No such admin endpoint."),
        },
    }
}

fn authorize(admin: &Admin, headers: &HeaderMap) -> Option<Response<Body>> {
    let gw = &admin.live.gateway();
    let Some(expected) = admin.token_hash else {
        return Some(problem(
            gw,
            StatusCode::NOT_FOUND,
            "admin-keys-disabled",
            "Key endpoints disabled",
            "Set server.admin_token to enable them.",
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is "Bearer".
        .and_then(|v| v.trim().split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
        .map(|(_, token)| token)
        .map(|t| <[u8; 32]>::from(Sha256::digest(t.trim().as_bytes())));
    let matches = presented.is_some_and(|p| p.iter().zip(expected.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0);
    if matches {
        return None;
    }
    let mut r = problem(
        gw,
        StatusCode::UNAUTHORIZED,
        "admin-unauthorized",
        "Unauthorized",
        "A valid bearer token is required.",
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

async fn keys(gw: &Gateway, query: &str, headers: &HeaderMap, delete: bool) -> Response<Body> {
    let mut route_name = None;
    let mut key_value = None;
    let mut scope_value = None;
    let mut scope_hash = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "route" => route_name = Some(v.into_owned()),
            "key" => key_value = Some(v.into_owned()),
            "scope" => scope_value = Some(v.into_owned()),
            "scope_hash" => scope_hash = Some(v.into_owned()),
            _ => {}
        }
    }
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let (Some(route_name), Some(key_value)) = (route_name, key_value) else {
        return bad("Give route and key as query parameters.");
    };
    let Some(route) = gw.idempotent_route(&route_name) else {
        return bad("No idempotent route has that name.");
    };
    let policy = &route.policy;
    let Ok(key_header) = HeaderValue::from_str(&key_value) else {
        return bad("The key holds characters a header cannot carry.");
    };
    let key = match policy.key(&HeaderMap::from_iter([(policy.header.clone(), key_header)])) {
        Ok(Some(k)) => k,
        Ok(None) => return bad("Give a key."),
        Err(e) => return bad(&e.to_string()),
    };
    if scope_value.is_some() {
        return bad("The scope does not go in the URL, where proxies and shells log it: send the caller's \
            scope headers as Scope-NAME headers (Scope-Authorization: Bearer ...), or give scope_hash.");
    }
    let scope = match scope_hash {
        Some(hash) => match Scope::from_hex(&hash) {
            Some(scope) => scope,
            None => return bad("scope_hash must be 64 hex digits."),
        },
        None => {
            // The caller's scope sources, each sent as `Scope-NAME` (`Scope-Authorization`,
            // `Scope-Cookie`). Without them: the scope of a global route or the anonymous one.
            let mut caller = HeaderMap::new();
            for source in policy.scope.sources() {
                let name = source.header();
                let Ok(admin_name) = HeaderName::from_bytes(format!("scope-{name}").as_bytes()) else { continue };
                for value in headers.get_all(&admin_name) {
                    caller.append(name.clone(), value.clone());
                }
            }
            match policy.scope(&caller, MissingScope::Anonymous) {
                Ok(scope) => scope,
                Err(e) => return bad(&e.to_string()),
            }
        }
    };
    let record = gw.runtime().record_key(&route.name, &scope, &key);
    let unavailable = |e: StoreError| {
        tracing::warn!(error = %e, "admin: store unavailable");
        problem(
            gw,
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            "The store did not answer.",
        )
    };
    if delete {
        return match gw.runtime().store.purge(&record).await {
            Ok(released) => {
                tracing::info!(route = %route.name, key = record.short(), released, "admin release");
                json_response(StatusCode::OK, &json!({ "released": released.is_some(), "was": released }))
            }
            Err(e) => unavailable(e),
        };
    }
    match gw.runtime().store.get(&record).await {
        Ok(None) => json_response(StatusCode::NOT_FOUND, &json!({ "state": "absent" })),
        Ok(Some(entry)) => {
            let mut doc = json!({
                "state": entry.state.name(),
                "attempt": entry.attempt,
                "expires_in_ms": entry.expires_in.as_millis() as u64,
            });
            match entry.state {
                EntryState::InProgress { lease_left } => doc["lease_left_ms"] = json!(lease_left.as_millis() as u64),
                EntryState::Completed { status, body_len } => {
                    doc["status"] = json!(status);
                    doc["body_bytes"] = json!(body_len);
                }
                EntryState::Executed { status } => doc["status"] = json!(status),
                EntryState::Unknown | EntryState::Released => {}
            }
            json_response(StatusCode::OK, &doc)
        }
        Err(e) => unavailable(e),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(body::full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The admin listener's own errors (400, 401, 404, 405), as problem+json like the proxy's.
fn problem(gw: &Gateway, status: StatusCode, slug: &'static str, title: &'static str, detail: &str) -> Response<Body> {
    Problem::refused(status, slug, title, detail.to_owned()).respond(gw.problem_base())
}
