//! Admin listener: health, readiness, metrics, and inspect/purge of one key.
//!
//! It listens on its own address so that it can be kept off the public network. Its
//! connections are held to the proxy's header, idle and body timeouts and to a cap of their
//! own (`admin_max_connections`): a flood on the admin port must never take the descriptors
//! the proxy needs (see `server` and `descriptors`). The key
//! endpoints can purge records (after which a retry would run again upstream), so they, and
//! `/routes`, `/audit` and `/reload`, are off unless an admin token is configured
//! (`server.admin_token`, `admin_token_env`, `[[server.admin_tokens]]`), and then require
//! `Authorization: Bearer <token>`: a `read` token for what only looks, an `operate` token
//! (`admin_token` is one) for what changes. Every change asked for, made or refused, goes to
//! the audit trail (`operator::audit`).
//!
//! ```text
//! GET    /healthz                                 200 while the process runs (HEAD too)
//! GET    /readyz                                  200 when the store answers and not draining
//! GET    /metrics                                 Prometheus text format
//! GET    /policy                                  the idempotency policy, Markdown (public)
//! GET    /routes                                  the routing table with policies, JSON (read)
//! GET    /audit[?cursor=C&limit=N]                the audit trail, newest first (read)
//! GET    /whoami                                  the token's name and role (read)
//! GET    /upstreams                               each upstream's instances and their health (read)
//! GET    /console/                                the operator's console (its files need no
//!                                                 token; every call it makes does)
//! POST   /reload                                  re-read the config file (operate)
//! GET    /keys?route=R&key=K[&scope_hash=H]   the record of key K (JSON; read)
//! PUT    /keys?route=R&key=K[&scope_hash=H]   complete an unknown or executed record with
//!                                             the answer in the body (JSON; operate)
//! DELETE /keys?route=R&key=K[&scope_hash=H][&force=true]   release it (a key a running
//!                                             request holds: only with force; operate)
//! GET    /keys?route=R&state=S[&cursor=C&limit=N]  the route's records in state S (unknown,
//!                                             executed): the ones that need an operator (read)
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

mod answer;
mod audit;
mod console;
mod keys;
mod respond;

use self::keys::keys;
use self::respond::{json_response, problem, text};
use crate::body::{self, Body};
use crate::config::AdminRole;
use crate::gateway::Gateway;
use crate::operator::Keys;
use crate::operator::audit::{self as trail, Actor, Change, Outcome};
use crate::reload::Live;
use crate::store::{Lifecycle, Severity};

/// When the store's settings were last read, and what `/readyz` said of them.
type Checked = (std::time::Instant, Vec<String>);

/// The admin service's shared state.
#[derive(Clone)]
pub struct Admin {
    /// The gateway, and who may call (its tokens, read again on every reload).
    live: Arc<Live>,
    /// When the unknown-records gauge was last counted (see `refresh_unknown_records`).
    counted: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// What `/readyz` last said about the store's settings, and when (see `store_findings`).
    settings: Arc<std::sync::Mutex<Option<Checked>>>,
}

impl Admin {
    /// An admin service; the endpoints that need a token are enabled only while one is
    /// configured.
    pub fn new(live: Arc<Live>) -> Self {
        Self { live, counted: Arc::default(), settings: Arc::default() }
    }

    /// The admin listener's TLS of the moment (`[server.admin_tls]`, renewed on reload).
    pub fn tls(&self) -> Option<Arc<crate::config::ListenerTls>> {
        self.live.admin_tls()
    }
}

/// The admin endpoints and the methods each allows (HEAD wherever GET is).
const ENDPOINTS: [(&str, &str); 11] = [
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/metrics", "GET, HEAD"),
    ("/policy", "GET, HEAD"),
    ("/routes", "GET, HEAD"),
    ("/audit", "GET, HEAD"),
    ("/whoami", "GET, HEAD"),
    ("/upstreams", "GET, HEAD"),
    ("/console/", "GET, HEAD"),
    ("/reload", "POST"),
    ("/keys", "GET, HEAD, PUT, DELETE"),
];

/// Answers one admin request from `peer`, with the headers every admin answer carries (see
/// `console::secure`). (Connections, their limits and timeouts are the server's, as for the
/// proxy: see `server::serve_admin`.)
pub async fn handle(
    admin: &Admin,
    draining: &CancellationToken,
    peer: IpAddr,
    request: Request<Incoming>,
) -> Response<Body> {
    let mut response = answer(admin, draining, peer, request).await;
    console::secure(response.headers_mut());
    response
}

async fn answer(
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
            let actor = match authorize(admin, request.headers(), peer, AdminRole::Operate) {
                Access::Granted(actor) => actor,
                Access::Forbidden(actor) => return forbidden(admin, gw, &actor, "reload", None).await,
                Access::Denied(denied) => return denied,
            };
            // The retention the trail is kept with is the running one, also for the entry
            // of the reload that changes it.
            let retention = admin.live.access().audit;
            let (response, outcome, detail) = match admin.live.reload() {
                Ok(done) => {
                    let detail = match done.needs_restart.as_slice() {
                        [] => "reloaded".to_owned(),
                        held => format!("reloaded; needs a restart: {}", held.join(", ")),
                    };
                    let body = json!({ "reloaded": true, "needs_restart": done.needs_restart });
                    (json_response(StatusCode::OK, &body), Outcome::Done, detail)
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload refused; the running configuration stays");
                    let body = json!({ "reloaded": false, "error": e.to_string() });
                    let detail = format!("refused: {e}");
                    (json_response(StatusCode::UNPROCESSABLE_ENTITY, &body), Outcome::Failed, detail)
                }
            };
            let change = Change {
                action: "reload",
                route: None,
                record: None,
                before: None,
                after: None,
                outcome,
                status: response.status().as_u16(),
                detail: &detail,
            };
            trail::write(gw.runtime(), retention, &actor, change).await;
            response
        }
        (&Method::GET, "/routes") => {
            if let Access::Denied(denied) = authorize(admin, request.headers(), peer, AdminRole::Read) {
                return denied;
            }
            json_response(StatusCode::OK, &crate::publish::routes_json(gw.route_configs()))
        }
        (&Method::GET, "/whoami") => match authorize(admin, request.headers(), peer, AdminRole::Read) {
            Access::Granted(actor) | Access::Forbidden(actor) => {
                json_response(StatusCode::OK, &json!({ "name": actor.name, "role": actor.role.as_str() }))
            }
            Access::Denied(denied) => denied,
        },
        (&Method::GET, path) if path == "/console" || path.starts_with("/console/") => match console::file(path) {
            Some(file) => file,
            None => problem(gw, StatusCode::NOT_FOUND, "admin-not-found", "Not found", "No such file of the console."),
        },
        (&Method::GET, "/upstreams") => {
            if let Access::Denied(denied) = authorize(admin, request.headers(), peer, AdminRole::Read) {
                return denied;
            }
            json_response(StatusCode::OK, &upstreams(gw))
        }
        (&Method::GET, "/audit") => {
            if let Access::Denied(denied) = authorize(admin, request.headers(), peer, AdminRole::Read) {
                return denied;
            }
            audit::page(gw, request.uri().query().unwrap_or("")).await
        }
        (&Method::GET | &Method::DELETE | &Method::PUT, "/keys") => {
            let needs = if *method == Method::GET { AdminRole::Read } else { AdminRole::Operate };
            let actor = match authorize(admin, request.headers(), peer, needs) {
                Access::Granted(actor) => actor,
                Access::Forbidden(actor) => {
                    let query = request.uri().query().unwrap_or("");
                    let action = keys::action_of(request.method(), query);
                    let route = keys::route_named(gw, query);
                    return forbidden(admin, gw, &actor, action, route.as_deref()).await;
                }
                Access::Denied(denied) => return denied,
            };
            keys(gw, &actor, admin.live.access().audit, request).await
        }
        (method, path) => match ENDPOINTS.iter().find(|(p, _)| *p == path) {
            Some((_, allow)) => {
                let detail = format!("{path} answers {allow}, not {method}.");
                let mut r = problem(gw, StatusCode::METHOD_NOT_ALLOWED, "admin-method", "Method not allowed", &detail);
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
                r
            }
            None => {
                // The endpoints there are, so that a first call to `/` or a typo finds its way.
                let named: Vec<String> = ENDPOINTS.iter().map(|(path, allow)| format!("{path} ({allow})")).collect();
                let detail = format!("No such admin endpoint. The endpoints are: {}.", named.join(", "));
                problem(gw, StatusCode::NOT_FOUND, "admin-not-found", "Not found", &detail)
            }
        },
    }
}

/// `GET /upstreams`: each upstream's instances, in flight and left out (until when from now,
/// and why), as the balancer sees them on this gateway.
fn upstreams(gw: &Gateway) -> serde_json::Value {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let list: Vec<serde_json::Value> = gw
        .upstreams()
        .into_iter()
        .map(|upstream| {
            let instances: Vec<serde_json::Value> = upstream
                .standings()
                .into_iter()
                .map(|(address, s)| {
                    json!({
                        "address": address,
                        "ejections": s.ejections,
                        "in_flight": s.outstanding,
                        "left_out": s.left_out.is_some(),
                        "left_out_because": s.left_out.map(|(_, why)| why.reason()),
                        "left_out_for_ms": s.left_out.map(|(left, _)| ms(left)),
                    })
                })
                .collect();
            json!({ "instances": instances, "name": upstream.name() })
        })
        .collect();
    serde_json::Value::Array(list)
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

/// What a call's token lets it do.
enum Access {
    /// The token's role allows the call.
    Granted(Actor),
    /// A valid token whose role does not allow the call (403, audited).
    Forbidden(Actor),
    /// No token configured (404), or none valid presented (401).
    Denied(Response<Body>),
}

/// Who calls, by the bearer token presented, and whether their role allows what `needs`.
///
/// The presented token is hashed (SHA-256) and compared with the hash of every configured
/// token, each in constant time and without stopping at a match, so that neither the
/// comparison nor how many tokens were tried tells a caller how close their guess was. The
/// tokens are the running configuration's: one added or revoked by a reload counts from the
/// next call.
fn authorize(admin: &Admin, headers: &HeaderMap, peer: IpAddr, needs: AdminRole) -> Access {
    let gw = &admin.live.gateway();
    let access = admin.live.access();
    if access.tokens.is_empty() {
        // The slug predates /routes and /reload; clients and alerts match on it, so it stays.
        return Access::Denied(problem(
            gw,
            StatusCode::NOT_FOUND,
            "admin-keys-disabled",
            "Admin endpoints that need a token are disabled",
            "/keys, /routes, /audit and /reload need a token, and none is configured: set \
             server.admin_token (or server.admin_token_env, the name of an environment variable \
             holding it), or add [[server.admin_tokens]], and reload or restart the gateway.",
        ));
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is "Bearer".
        .and_then(|v| v.trim().split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
        .map(|(_, token)| <[u8; 32]>::from(Sha256::digest(token.trim().as_bytes())));
    let mut found = None;
    if let Some(presented) = presented {
        for (i, token) in access.tokens.iter().enumerate() {
            let expected = <[u8; 32]>::from(Sha256::digest(token.secret.as_bytes()));
            let differs = presented.iter().zip(expected.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            // Secrets are unique (`check` refuses two alike): at most one matches.
            if differs == 0 {
                found = Some(i);
            }
        }
    }
    let Some(token) = found.and_then(|i| access.tokens.get(i)) else {
        let mut r = problem(
            gw,
            StatusCode::UNAUTHORIZED,
            "admin-unauthorized",
            "Unauthorized",
            "A valid bearer token is required.",
        );
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Access::Denied(r);
    };
    let actor = Actor { name: token.name.clone(), role: token.role, from: peer };
    match (needs, token.role) {
        (AdminRole::Operate, AdminRole::Read) => Access::Forbidden(actor),
        _ => Access::Granted(actor),
    }
}

/// The answer to a `read` token's change (403 `admin-forbidden`), written to the audit
/// trail as refused: `route` only when the call named one the configuration has.
async fn forbidden(
    admin: &Admin,
    gw: &Gateway,
    actor: &Actor,
    action: &'static str,
    route: Option<&str>,
) -> Response<Body> {
    let detail = format!(
        "The token {:?} has the read role: it may look, not change. Nothing changed; an operate token may {}.",
        actor.name,
        if action == "reload" { "reload the configuration" } else { "change keys" }
    );
    let change = Change {
        action,
        route,
        record: None,
        before: None,
        after: None,
        outcome: Outcome::Forbidden,
        status: 403,
        detail: "refused: the read role may not change anything",
    };
    trail::write(gw.runtime(), admin.live.access().audit, actor, change).await;
    problem(gw, StatusCode::FORBIDDEN, "admin-forbidden", "Forbidden", &detail)
}
