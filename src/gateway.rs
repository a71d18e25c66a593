//! Gateway: the runtime built from a [`Config`], and the top of the request path.
//!
//! ```text
//! client ─▶ listener ─▶ router ─▶ (route without idempotency) ─▶ proxy ─▶ upstream
//!                         └─▶ idempotent::handle (key, scope, body, fingerprint, claim, ...)
//! ```
//!
//! Whatever happens below, this is where the outcome is counted and an error becomes its
//! problem+json response.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::{self, Trace};
use crate::body::{self, Body};
use crate::config::{Config, RouteConfig};
use crate::connection::Connection;
use crate::error::{self, GatewayError};
use crate::idempotent;
use crate::idempotent::exchange::status_class;
use crate::metrics::{Metrics, Outcome};
use crate::path;
use crate::proxy;
use crate::route::Route;
use crate::router::{RouteSpec, Router, RouterError};
use crate::store::{Backend, StoreError};
use crate::upstream::{Upstream, UpstreamSetupError};

/// Why a gateway could not be built from a valid config.
#[derive(Debug, Error)]
pub enum SetupError {
    /// An upstream's TLS could not be set up.
    #[error(transparent)]
    Upstream(#[from] UpstreamSetupError),
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The routes do not compile (validation should have caught this).
    #[error("routes: {0}")]
    Routes(#[from] RouterError),
    /// A route names an upstream that does not exist (validation should have caught this).
    #[error("route {route}: unknown upstream {upstream}")]
    UnknownUpstream {
        /// The route.
        route: String,
        /// The upstream it names.
        upstream: String,
    },
}

/// What a gateway keeps across reloads.
struct Shared {
    store: Arc<Backend>,
    metrics: Arc<Metrics>,
    exchanges: TaskTracker,
    abandon: CancellationToken,
    exchange_slots: Arc<Semaphore>,
}

/// Everything the request path needs, shared by all connections.
pub struct Gateway {
    router: Router<Arc<Route>>,
    routes: Vec<Arc<Route>>,
    /// The record store.
    pub store: Arc<Backend>,
    /// Prefix of record key names.
    pub key_prefix: String,
    /// Prefix of problem+json `type` URIs.
    pub problem_base: String,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Detached upstream exchanges, so shutdown can wait for them.
    pub exchanges: TaskTracker,
    /// Cancelled when the shutdown grace period is over: exchanges still running settle
    /// their keys so that retries can proceed.
    pub abandon: CancellationToken,
    /// One permit per upstream exchange running at once (`server.max_exchanges`).
    pub exchange_slots: Arc<Semaphore>,
    /// Deadline of an idempotent route's whole request body.
    pub body_read_timeout: Duration,
    route_configs: Vec<RouteConfig>,
}

impl Gateway {
    /// Builds upstream clients, the store and the route table. Must run inside a tokio runtime.
    pub fn new(config: &Config) -> Result<Self, SetupError> {
        let store = Backend::from_config(&config.store)?;
        let mut metrics = Metrics::default();
        if let Some(redis) = store.redis() {
            metrics.register_store_data_loss(redis.data_loss_counter());
            metrics.register_store_commands(redis.commands_counter());
        }
        metrics.register_store_latency(store.call_latency());
        let shared = Shared {
            store: Arc::new(store),
            metrics: Arc::new(metrics),
            exchanges: TaskTracker::new(),
            abandon: CancellationToken::new(),
            exchange_slots: Arc::new(Semaphore::new(config.server.limits.max_exchanges)),
        };
        Self::build(config, shared)
    }

    /// A gateway for a reloaded `config` that keeps this one's store, metrics, running
    /// exchanges and limits: requests in flight finish on the gateway they started with, new
    /// ones get the new routes and upstreams. (What a reload cannot change is reported by
    /// [`crate::reload`].)
    pub fn rebuild(&self, config: &Config) -> Result<Self, SetupError> {
        let shared = Shared {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            exchanges: self.exchanges.clone(),
            abandon: self.abandon.clone(),
            exchange_slots: Arc::clone(&self.exchange_slots),
        };
        Self::build(config, shared)
    }

    fn build(config: &Config, shared: Shared) -> Result<Self, SetupError> {
        let Shared { store, metrics, exchanges, abandon, exchange_slots } = shared;
        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            upstreams.insert(u.name.clone(), Arc::new(Upstream::new(u)?));
        }
        let mut routes = Vec::with_capacity(config.routes.len());
        for r in &config.routes {
            let upstream = upstreams
                .get(&r.upstream)
                .cloned()
                .ok_or_else(|| SetupError::UnknownUpstream { route: r.name.clone(), upstream: r.upstream.clone() })?;
            routes.push(Arc::new(Route {
                name: r.name.clone(),
                upstream,
                policy: r.idempotency.clone(),
                metrics: metrics.route(&r.name),
            }));
        }
        let router = Router::new(config.routes.iter().zip(&routes).map(|(r, route)| RouteSpec {
            name: &r.name,
            pattern: &r.path,
            methods: r.methods.as_deref(),
            value: Arc::clone(route),
        }))?;
        Ok(Self {
            router,
            routes,
            store,
            key_prefix: config.store.key_prefix.clone(),
            problem_base: config.server.problem_base.clone(),
            metrics,
            exchanges,
            abandon,
            exchange_slots,
            body_read_timeout: config.server.limits.body_read_timeout,
            route_configs: config.routes.clone(),
        })
    }

    /// The routes as configured, in file order (for the published policy and `/routes`).
    pub fn route_configs(&self) -> &[RouteConfig] {
        &self.route_configs
    }

    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// Serves one request that arrived on `connection`.
    pub async fn handle(&self, mut request: Request<Incoming>, connection: &Arc<Connection>) -> Response<Body> {
        let started = std::time::Instant::now();
        if let Err(e) = check_host(&request) {
            return error::respond(&e, &self.problem_base);
        }
        normalize_path(&mut request);
        let method = request.method().clone();
        let Some(route) = self.router.find(request.method(), request.uri().path()) else {
            self.metrics.unmatched();
            let error =
                GatewayError::NoRoute { method: request.method().clone(), path: request.uri().path().to_owned() };
            return error::respond(&error, &self.problem_base);
        };
        let mut trace = Trace::default();
        let result = match &route.policy {
            None => {
                let request = request.map(body::boxed);
                let sent = std::time::Instant::now();
                let forwarded = proxy::forward(&route.upstream, request, connection).await;
                let class = forwarded.as_ref().map_or("error", |r| status_class(r.status()));
                trace.upstream = Some(sent.elapsed());
                route.metrics.upstream_latency(class, sent.elapsed());
                forwarded.map(|r| (Outcome::PassedThrough, r)).map_err(Into::into)
            }
            // Boxed: the idempotent path's state is several times the pass-through's, and an
            // unboxed future would make every request (and every idle connection) carry it.
            Some(policy) => Box::pin(idempotent::handle(self, route, policy, request, connection, &mut trace)).await,
        };
        let (outcome, response) = match result {
            Ok(served) => served,
            Err(e) => {
                log_error(route, &e);
                (outcome_of(&e), error::respond(&e, &self.problem_base))
            }
        };
        route.metrics.outcome(outcome);
        let took = started.elapsed();
        route.metrics.request_duration(outcome, took);
        access::log(&route.name, &method, outcome, response.status(), took, &trace);
        response
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request without a Host header, or with more than one, is 400.
/// The Host names the origin the client means; with none or two, a gateway and the upstream
/// could each pick another.
fn check_host<B>(request: &Request<B>) -> Result<(), GatewayError> {
    if request.version() != Version::HTTP_11 {
        return Ok(());
    }
    match request.headers().get_all(http::header::HOST).iter().count() {
        1 => Ok(()),
        0 => Err(GatewayError::BadHost { detail: "The request has no Host header." }),
        _ => Err(GatewayError::BadHost { detail: "The request has more than one Host header." }),
    }
}

/// Replaces the request's path by its normal form (see [`path`]), which the router matches and
/// the upstream receives, so that no spelling of a path reaches another route than its own.
fn normalize_path<B>(request: &mut Request<B>) {
    let Cow::Owned(normal) = path::normalize(request.uri().path()) else { return };
    let target = match request.uri().query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let mut parts = request.uri().clone().into_parts();
    // A normalised path of a valid path is valid: it only loses characters or decodes
    // unreserved ones. Should parsing fail anyway, the request keeps its original path.
    if let Ok(pq) = target.parse::<PathAndQuery>() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
}

fn outcome_of(e: &GatewayError) -> Outcome {
    match e {
        GatewayError::Key(_)
        | GatewayError::Body(_)
        | GatewayError::Scope(_)
        | GatewayError::ConnectionHeader { .. }
        | GatewayError::BadHost { .. }
        | GatewayError::UpgradeRefused
        | GatewayError::NoRoute { .. } => Outcome::Rejected,
        GatewayError::Overloaded => Outcome::Overloaded,
        GatewayError::TooManyNewKeys { .. } => Outcome::QuotaExceeded,
        GatewayError::OutcomeUnknown { .. } => Outcome::OutcomeUnknown,
        GatewayError::ResponseNotStored { .. } => Outcome::Replayed,
        GatewayError::Mismatch => Outcome::Mismatch,
        GatewayError::InFlight { .. } => Outcome::InFlight,
        GatewayError::StoreUnavailable(_) => Outcome::StoreUnavailable,
        GatewayError::Upstream(_) | GatewayError::ShuttingDown => Outcome::UpstreamFailed,
        GatewayError::Internal(_) => Outcome::Internal,
    }
}

fn log_error(route: &Route, e: &GatewayError) {
    match e {
        GatewayError::Upstream(_)
        | GatewayError::StoreUnavailable(_)
        | GatewayError::OutcomeUnknown { .. }
        | GatewayError::Overloaded
        | GatewayError::ShuttingDown
        | GatewayError::Internal(_) => {
            tracing::warn!(route = %route.name, error = %e, "request failed");
        }
        _ => tracing::debug!(route = %route.name, error = %e, "request refused"),
    }
}
