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

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::body::{self, Body, BodyError};
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::operator::{Keys, Refusal, wire};
use crate::policy::scope::{MissingScope, Scope};
use crate::reload::Live;
use crate::runtime::IdempotentRoute;
use crate::store::{Cursor, Lifecycle, RecordKey, Severity, State, StoreError, StoredResponse};

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
            match gw.runtime().store.ping().await {
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
    let Some(settings) = rt.store.settings().await else { return Vec::new() };
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

/// The longest page of `GET /keys?state=...`.
const MAX_LIMIT: usize = 1000;
/// Largest body of `PUT /keys`.
const MAX_RESOLVE_BODY: usize = 16 * 1024 * 1024;

/// The query of a `/keys` call.
#[derive(Default)]
struct KeysQuery {
    route: Option<String>,
    key: Option<String>,
    scope: Option<String>,
    scope_hash: Option<String>,
    state: Option<String>,
    cursor: Option<String>,
    limit: Option<String>,
    force: Option<String>,
}

impl KeysQuery {
    fn parse(query: &str) -> Self {
        let mut q = Self::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*k {
                "route" => &mut q.route,
                "key" => &mut q.key,
                "scope" => &mut q.scope,
                "scope_hash" => &mut q.scope_hash,
                "state" => &mut q.state,
                "cursor" => &mut q.cursor,
                "limit" => &mut q.limit,
                "force" => &mut q.force,
                _ => continue,
            };
            *slot = Some(v.into_owned());
        }
        q
    }
}

async fn keys(gw: &Gateway, peer: IpAddr, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let query = KeysQuery::parse(parts.uri.query().unwrap_or(""));
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let Some(route_name) = &query.route else {
        return bad("Give route as a query parameter, and key (one record) or state (a list).");
    };
    let Some(route) = gw.idempotent_route(route_name) else {
        return bad("No idempotent route has that name.");
    };
    let keys = Keys::new(gw.runtime(), route, peer);
    let reading = parts.method == Method::GET || parts.method == Method::HEAD;
    if reading && query.key.is_none() && query.state.is_some() {
        return list(gw, &keys, &query).await;
    }
    let record = match record_of(route, &query, &parts.headers, gw) {
        Ok(record) => record,
        Err(detail) => return bad(&detail),
    };
    match parts.method {
        Method::DELETE => {
            let force = match query.force.as_deref() {
                None | Some("false") => false,
                Some("true") => true,
                Some(_) => return bad("force must be true or false."),
            };
            match keys.release(&record, force).await {
                Ok(released) => json_response(StatusCode::OK, &released),
                Err(refusal) => refused(gw, refusal),
            }
        }
        Method::PUT => {
            let answer = match read_answer(gw, route, &parts.headers, body).await {
                Ok(answer) => answer,
                Err(refused) => {
                    keys.refused_answer(&record);
                    return refused;
                }
            };
            match keys.resolve(&record, &answer).await {
                Ok(resolved) => json_response(StatusCode::OK, &resolved),
                Err(refusal) => refused(gw, refusal),
            }
        }
        _ => match keys.inspect(&record).await {
            Ok(None) => json_response(StatusCode::NOT_FOUND, &json!({ "state": wire::ABSENT })),
            Ok(Some(found)) => json_response(StatusCode::OK, &found),
            Err(e) => store_failed(gw, e),
        },
    }
}

/// The answer to an operator's change that was not made.
fn refused(gw: &Gateway, refusal: Refusal) -> Response<Body> {
    let (detail, title, state) = match refusal {
        Refusal::Running { lease_left } => (
            format!(
                "A request holds this key and may be running upstream now (its lease ends within {}s): \
                 released, a retry would run it a second time beside it. Nothing changed. Wait for it to \
                 settle, or release it with force=true only if you know it is not running.",
                lease_left.as_secs_f64().ceil()
            ),
            "Not releasable",
            State::InProgress.name(),
        ),
        Refusal::NotHeld { state } => {
            let state = state.map_or(wire::ABSENT, State::name);
            let detail =
                format!("The record is {state}: only an unknown or executed record can be resolved. Nothing changed.");
            (detail, "Not resolvable", state)
        }
        Refusal::Store(e) => return store_failed(gw, e),
    };
    let mut r = problem(gw, StatusCode::CONFLICT, "admin-conflict", title, &detail);
    r.headers_mut().insert("x-record-state", HeaderValue::from_static(state));
    r
}

/// The record a `/keys` call names: the route, the key, and the caller (see the module docs).
fn record_of(
    route: &IdempotentRoute,
    query: &KeysQuery,
    headers: &HeaderMap,
    gw: &Gateway,
) -> Result<RecordKey, String> {
    let policy = &route.policy;
    let Some(key_value) = &query.key else { return Err("Give key as a query parameter.".into()) };
    let Ok(key_header) = HeaderValue::from_str(key_value) else {
        return Err("The key holds characters a header cannot carry.".into());
    };
    let key = match policy.key(&HeaderMap::from_iter([(policy.header.clone(), key_header)])) {
        Ok(Some(k)) => k,
        Ok(None) => return Err("Give a key.".into()),
        Err(e) => return Err(e.to_string()),
    };
    if query.scope.is_some() {
        return Err("The scope does not go in the URL, where proxies and shells log it: send the caller's \
            scope headers as Scope-NAME headers (Scope-Authorization: Bearer ...), or give scope_hash."
            .into());
    }
    let scope = match &query.scope_hash {
        Some(hash) => Scope::from_hex(hash).ok_or("scope_hash must be 64 hex digits.")?,
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
            policy.scope(&caller, MissingScope::Anonymous).map_err(|e| e.to_string())?
        }
    };
    Ok(gw.runtime().record_key(&route.name, &scope, &key))
}

/// `GET /keys?route=R&state=unknown|executed[&cursor=C][&limit=N]`: one page of the route's
/// records in that state, oldest first. Each entry of the index is checked against its record
/// (the index is best-effort): one that moved on is dropped from the index and not listed.
async fn list(gw: &Gateway, keys: &Keys<'_>, query: &KeysQuery) -> Response<Body> {
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let Some(held) = query.state.as_deref().and_then(State::parse).filter(|state| state.is_held()) else {
        return bad("state must be unknown or executed: the states that need an operator.");
    };
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        Some(_) => return bad(&format!("limit must be between 1 and {MAX_LIMIT}.")),
    };
    let cursor = match query.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => match Cursor::decode(text) {
            Some(cursor) => Some(cursor),
            None => return bad("cursor is not one this endpoint handed out."),
        },
    };
    match keys.list(held, cursor, limit).await {
        Ok(page) => json_response(StatusCode::OK, &page),
        Err(e) => store_failed(gw, e),
    }
}

/// The operator's answer in a `PUT /keys` body (see [`crate::operator`]), read whole within
/// the body timeout; the refusal when it is not one.
async fn read_answer(
    gw: &Gateway,
    route: &IdempotentRoute,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<StoredResponse, Response<Body>> {
    let limit = route.settings.body_read_timeout;
    let bytes = match crate::body::read_bounded(headers, body, MAX_RESOLVE_BODY, limit).await {
        Ok(bytes) => bytes,
        // The rest may still arrive: the connection cannot carry another request.
        Err(BodyError::Timeout { limit }) => {
            let detail = format!("The body did not arrive within {}s; nothing changed.", limit.as_secs_f64());
            let mut r = problem(gw, StatusCode::REQUEST_TIMEOUT, "admin-body-timeout", "Body too slow", &detail);
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err(r);
        }
        Err(e) => return Err(bad_request(gw, &format!("Cannot read the body: {e}."))),
    };
    crate::operator::parse_answer(&bytes, &route.policy.stored_headers)
        .map_err(|e| bad_request(gw, &format!("{}. Nothing changed.", capitalise(&e.to_string()))))
}

fn bad_request(gw: &Gateway, detail: &str) -> Response<Body> {
    problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail)
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

fn store_failed(gw: &Gateway, e: StoreError) -> Response<Body> {
    if let StoreError::Rejected(why) = &e {
        // The store answers: it is the command, not the store (logged by the store's health).
        let detail = format!("The store refused the command: {why}. Nothing changed.");
        return problem(
            gw,
            StatusCode::INTERNAL_SERVER_ERROR,
            "admin-store-refused",
            "Store refused the command",
            &detail,
        );
    }
    tracing::debug!(error = %e, "admin: store unavailable");
    problem(
        gw,
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "Idempotency store unavailable",
        "The store did not answer.",
    )
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    // Plain data: serialising cannot fail.
    let mut r = Response::new(body::full(serde_json::to_string(value).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The admin listener's own errors (400, 401, 404, 405), as problem+json like the proxy's.
fn problem(gw: &Gateway, status: StatusCode, slug: &'static str, title: &'static str, detail: &str) -> Response<Body> {
    Problem::refused(status, slug, title, detail.to_owned()).respond(gw.problem_base())
}
