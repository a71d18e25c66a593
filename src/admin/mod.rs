//! Admin listener: health, readiness, metrics, and inspect/purge of one key.
//!
//! It listens on its own address so that it can be kept off the public network. Its
//! connections are held to the proxy's header, idle and body timeouts and to a cap of their
//! own (`admin_max_connections`): a flood on the admin port must never take the descriptors
//! the proxy needs (see `server` and `descriptors`). The key
//! endpoints can purge records (after which a retry would run again upstream), so they, and
//! `/routes` and `/reload`, are off unless `server.admin_token` (or `admin_token_env`) is set,
//! and then require `Authorization: Bearer <token>`.
//!
//! ```text
//! GET    /healthz                                 200 while the process runs (HEAD too)
//! GET    /readyz                                  200 when the store answers and not draining
//! GET    /metrics                                 Prometheus text format
//! GET    /policy                                  the idempotency policy, Markdown (public)
//! GET    /routes                                  the routing table with policies, JSON (token)
//! POST   /reload                                  re-read the config file (token)
//! GET    /keys?route=R&key=K[&scope_hash=H]   the record of key K (JSON)
//! PUT    /keys?route=R&key=K[&scope_hash=H]   complete an unknown or executed record with
//!                                             the answer in the body (JSON)
//! DELETE /keys?route=R&key=K[&scope_hash=H][&force=true]   release it (a key a running
//!                                             request holds: only with force)
//! GET    /keys?route=R&state=S[&cursor=C&limit=N]  the route's records in state S (unknown,
//!                                             executed): the ones that need an operator
//! ```
//!
//! The caller whose key it is: its scope headers, each sent as `Scope-NAME` (for a route
//! scoped by `Authorization`, `Scope-Authorization: Bearer ...`; by a cookie,
//! `Scope-Cookie: session=...`), or `scope_hash`, the scope's digest in hex. Never the raw
//! credential in the URL, where proxies and shells log it. Neither: a `global` route, or the
//! anonymous scope.

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

mod keys;
mod respond;

use self::keys::keys;
use self::respond::{json_response, problem, text};
use crate::body::{self, Body};
use crate::gateway::Gateway;
use crate::operator::Keys;
use crate::reload::Live;
use crate::store::{Lifecycle, Severity};

/// When the store's settings were last read, and what `/readyz` said of them.
type Checked = (std::time::Instant, Vec<String>);

/// The admin service's shared state.
#[derive(Clone)]
pub struct Admin {
    live: Arc<Live>,
    /// SHA-256 of the token: compared in constant time regardless of the token's length.
    token_hash: Option<[u8; 32]>,
    /// When the unknown-records gauge was last counted (see `refresh_unknown_records`).
    counted: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// What `/readyz` last said about the store's settings, and when (see `store_findings`).
    settings: Arc<std::sync::Mutex<Option<Checked>>>,
}

impl Admin {
    /// An admin service; key endpoints are enabled only with a token.
    pub fn new(live: Arc<Live>, token: Option<String>) -> Self {
        Self {
            live,
            token_hash: token.map(|t| Sha256::digest(t.trim().as_bytes()).into()),
            counted: Arc::default(),
            settings: Arc::default(),
        }
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
    ("/keys", "GET, HEAD, PUT, DELETE"),
];

/// Answers one admin request from `peer`. (Connections, their limits and timeouts are the
/// server's, as for the proxy: see `server::serve_admin`.)
pub async fn handle(
    admin: &Admin,
    draining: &CancellationToken,
    peer: IpAddr,
    request: Request<Incoming>,
) -> Response<Body> {
    // HEAD is GET without the body, which hyper leaves out of the response by itself.
    let method = if request.method() == Method::HEAD { &Method::GET } else { request.method() };
    let gw = &admin.live.gateway();
    match (method, request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            if draining.is_cancelled() {
                return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
            }
            match gw.runtime().backend().ping().await {
                Ok(()) => {
                    let mut body = String::from("ready\n");
                    for line in store_findings(admin, gw).await {
                        body.push_str(&line);
                        body.push('\n');
                    }
                    let mut r = text(StatusCode::OK, "");
                    *r.body_mut() = body::full(body);
                    r
                }
                Err(e) => {
                    tracing::debug!(error = %e, "readiness check: store unavailable");
                    text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
                }
            }
        }
        (&Method::GET, "/metrics") => {
            refresh_unknown_records(admin, gw).await;
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
        (&Method::GET | &Method::DELETE | &Method::PUT, "/keys") => {
            if let Some(denied) = authorize(admin, request.headers()) {
                return denied;
            }
            keys(gw, peer, request).await
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

/// How long what the store's settings say is kept for `/readyz`: a `CONFIG GET` and two
/// `INFO`s per probe, which several probes a second need not repeat.
const SETTINGS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// What the store's own settings mean for the records, one line each (`/readyz` says why an
/// evicting store is a danger, without failing the probe: the gateway serves all the same).
async fn store_findings(admin: &Admin, gw: &Gateway) -> Vec<String> {
    {
        let cached = admin.settings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, lines)) = cached.as_ref().filter(|(at, _)| at.elapsed() < SETTINGS_EVERY) {
            return lines.clone();
        }
    }
    let rt = gw.runtime();
    let Some(settings) = rt.backend().settings().await else { return Vec::new() };
    rt.metrics.store_evicts_records.set(i64::from(settings.evicts()));
    let mut lines = vec![format!("store: {}", settings.summary())];
    for (severity, finding) in settings.findings() {
        let level = match severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        lines.push(format!("store {level}: {finding}"));
    }
    *admin.settings.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
        Some((std::time::Instant::now(), lines.clone()));
    lines
}

/// How often the unknown-records gauge is counted at most: a store call per holding route,
/// which scrapes from several Prometheus servers need not repeat.
const COUNT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Counts each holding route's unknown records for the gauge, as the store's index has them;
/// a store that does not answer leaves the last counts.
async fn refresh_unknown_records(admin: &Admin, gw: &Gateway) {
    {
        let mut counted = admin.counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if counted.is_some_and(|at| at.elapsed() < COUNT_EVERY) {
            return;
        }
        *counted = Some(std::time::Instant::now());
    }
    let rt = gw.runtime();
    for config in gw.route_configs() {
        let Some(route) = gw.idempotent_route(&config.name) else { continue };
        if route.policy.on_unknown_outcome != crate::policy::UnknownOutcomePolicy::Hold {
            continue;
        }
        match Keys::count_unknown(rt, route).await {
            Ok(count) => rt.metrics.set_unknown_records(&route.name, count),
            Err(e) => {
                tracing::debug!(route = %route.name, error = %e, "cannot count unknown records");
                return;
            }
        }
    }
}

fn authorize(admin: &Admin, headers: &HeaderMap) -> Option<Response<Body>> {
    let gw = &admin.live.gateway();
    let Some(expected) = admin.token_hash else {
        // The slug predates /routes and /reload; clients and alerts match on it, so it stays.
        return Some(problem(
            gw,
            StatusCode::NOT_FOUND,
            "admin-keys-disabled",
            "Admin endpoints that need a token are disabled",
            "/keys, /routes and /reload need a token, and none is configured: set \
             server.admin_token (or server.admin_token_env, the name of an environment variable \
             holding it) and restart the gateway to enable them.",
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
