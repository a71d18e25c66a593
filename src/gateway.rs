//! Gateway: the routes and the runtime built from a [`Config`], and the top of the request
//! path.
//!
//! ```text
//! client ─▶ listener ─▶ path normalised ─▶ host ─▶ router ─▶ check ─┬▶ plain route ─▶ proxy ─▶ upstream
//!                                                                   └▶ idempotent::handle
//! ```
//!
//! Whatever happens below, this is where the outcome is counted, the access line written and
//! an error turned into its answer (by the one table in [`crate::error`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use thiserror::Error;

use crate::access::{self, Notes};
use crate::body::Body;
use crate::check;
use crate::config::{Config, RouteConfig};
use crate::connection::Connection;
use crate::error::GatewayError;
use crate::idempotent::{self, Served};
use crate::metrics::{Metrics, Outcome, Pins, Produces};
use crate::path;
use crate::policy::errors::ErrorShape;
use crate::policy::{IdempotencyPolicy, Mode, StoreFailurePolicy};
use crate::proxy;
use crate::router::{RouteSpec, Router, RouterError};
use crate::runtime::{IdempotentRoute, RequestSettings, Route, Routed, Runtime};
use crate::store::{Backend, StoreError};
use crate::telemetry::{self, Telemetry, TelemetryError};
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
    /// Trace export could not start.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// A route names an upstream that does not exist (validation should have caught this).
    #[error("route {route}: unknown upstream {upstream}")]
    UnknownUpstream {
        /// The route.
        route: String,
        /// The upstream it names.
        upstream: String,
    },
}

/// What a route with `policy` (none: a plain route) can count.
fn produces(policy: Option<&IdempotencyPolicy>) -> Produces {
    policy.map_or(Produces::PLAIN, |p| Produces {
        idempotent: true,
        keyless: !p.required,
        quota: p.max_new_keys.is_some(),
        fail_open: p.on_store_error == StoreFailurePolicy::FailOpen,
        reconciles: p.reconcile.is_some(),
        observes: p.mode == Mode::Observe,
        pinned: Pins {
            name: p.identity.unpinned.renamed,
            host: p.identity.hosts != p.identity.unpinned.hosts,
            fingerprint: p.identity.previous_fingerprint.is_some(),
        },
    })
}

/// What became of a routed request before anything went upstream as on a plain route.
enum Handled {
    /// A plain route's request, untouched.
    Plain(Request<Incoming>),
    /// What the idempotent path did: answered, or handed back to forward.
    Idempotent(Served),
}

/// Everything the request path needs, shared by all connections.
pub struct Gateway {
    router: Router<Routed>,
    routes: Vec<Routed>,
    runtime: Arc<Runtime>,
    settings: Arc<RequestSettings>,
    route_configs: Vec<RouteConfig>,
    /// How errors look before a route matched (`[errors]`).
    errors: Arc<ErrorShape>,
    /// The upstreams by name: what a reload carries over from.
    upstreams: HashMap<String, Arc<Upstream>>,
}

impl Gateway {
    /// Builds upstream clients, the store and the route table. Must run inside a tokio runtime.
    pub fn new(config: &Config) -> Result<Self, SetupError> {
        let store = Backend::from_config(&config.store)?;
        let mut metrics = Metrics::default();
        if let Some(redis) = store.redis() {
            metrics.register_store_data_loss(redis.data_loss_counter());
            metrics.register_store_commands(redis.commands_counter());
            let replicas = redis.replica_metrics();
            metrics.register_store_replicas(
                replicas.acks,
                replicas.seconds,
                replicas.answers_unreplicated,
                replicas.claims_unreplicated,
            );
        }
        metrics.register_store_latency(store.call_latency());
        let telemetry = config.telemetry.as_ref().map(Telemetry::start).transpose()?;
        if let Some(telemetry) = &telemetry {
            metrics.register_telemetry_drops(telemetry.dropped());
        }
        let runtime =
            Runtime::new(store, metrics, config.server.limits.max_exchanges, &config.store.key_prefix, telemetry);
        Self::build(config, Arc::new(runtime), None)
    }

    /// A gateway for a reloaded `config` that keeps this one's runtime (store, metrics,
    /// running exchanges, limits): requests in flight finish on the gateway they started
    /// with, new ones get the new routes and upstreams. (What a reload cannot change is
    /// reported by [`crate::reload`].)
    pub fn rebuild(&self, config: &Config) -> Result<Self, SetupError> {
        Self::build(config, Arc::clone(&self.runtime), Some(self))
    }

    fn build(config: &Config, runtime: Arc<Runtime>, previous: Option<&Gateway>) -> Result<Self, SetupError> {
        let settings = Arc::new(RequestSettings {
            problem_base: config.server.problem_base.clone(),
            body_read_timeout: config.server.limits.body_read_timeout,
        });
        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            let upstream = Upstream::new(u, Some(&runtime.metrics.instances))?;
            // A reload keeps a resolved name's addresses until its own first lookup, rather
            // than going back to the name for a while (and to new series for each address).
            if let Some(before) = previous.and_then(|p| p.upstreams.get(&u.name)) {
                upstream.carry_over(before);
            }
            upstreams.insert(u.name.clone(), Arc::new(upstream));
        }
        let mut routes = Vec::with_capacity(config.routes.len());
        for r in &config.routes {
            let upstream = upstreams
                .get(&r.upstream)
                .cloned()
                .ok_or_else(|| SetupError::UnknownUpstream { route: r.name.clone(), upstream: r.upstream.clone() })?;
            let route = Route {
                name: r.name.clone(),
                upstream,
                metrics: runtime.metrics.route(&r.name, produces(r.idempotency.as_deref())),
                errors: Arc::clone(&r.errors),
            };
            routes.push(match &r.idempotency {
                None => Routed::Plain(Arc::new(route)),
                Some(policy) => {
                    let route = Arc::new(IdempotentRoute {
                        route,
                        policy: Arc::clone(policy),
                        settings: Arc::clone(&settings),
                    });
                    match policy.mode {
                        Mode::Enforce => Routed::Idempotent(route),
                        Mode::Observe => Routed::Observed(route),
                    }
                }
            });
        }
        let router = Router::new(config.routes.iter().zip(&routes).map(|(r, route)| RouteSpec {
            name: &r.name,
            hosts: &r.hosts,
            pattern: &r.path,
            methods: r.methods.as_deref(),
            value: route.clone(),
        }))?;
        // Built: names resolved again start their lookups. (The series of instances this
        // configuration no longer has go with the gateway it replaces, when its last request
        // is done: see `metrics::instance`.)
        for upstream in upstreams.values() {
            upstream.start_resolving();
        }
        Ok(Self {
            router,
            routes,
            runtime,
            settings,
            route_configs: config.routes.clone(),
            errors: Arc::clone(&config.errors),
            upstreams,
        })
    }

    /// What every request, exchange and reloaded gateway shares: the store, the metrics, the
    /// exchanges running.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The upstreams, by name (for `/upstreams`).
    pub fn upstreams(&self) -> Vec<&Arc<Upstream>> {
        let mut all: Vec<&Arc<Upstream>> = self.upstreams.values().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// The routes as configured, in file order (for the published policy and `/routes`).
    pub fn route_configs(&self) -> &[RouteConfig] {
        &self.route_configs
    }

    /// Prefix of problem+json `type` URIs.
    pub fn problem_base(&self) -> &str {
        &self.settings.problem_base
    }

    /// The idempotent route named `name`, enforcing or observing (both claim keys).
    pub fn idempotent_route(&self, name: &str) -> Option<&Arc<IdempotentRoute>> {
        self.routes.iter().find_map(|r| match r {
            Routed::Idempotent(route) | Routed::Observed(route) if route.name == name => Some(route),
            _ => None,
        })
    }

    /// The idempotency policy of the route named `name`, if it has one.
    pub fn policy(&self, name: &str) -> Option<&IdempotencyPolicy> {
        self.idempotent_route(name).map(|route| &*route.policy)
    }

    /// Serves one request that arrived on `connection`.
    pub async fn handle(&self, mut request: Request<Incoming>, connection: &Arc<Connection>) -> Response<Body> {
        let started = Instant::now();
        path::normalize_request(&mut request);
        // A request whose host cannot be told is refused in the shape of the route its path
        // would have for every host.
        let certificate = connection.certificate();
        let (named, routed) = match check::host(&request, self.router.by_host() || certificate.is_some()) {
            Ok(host) => {
                let routed = self.router.find(host.as_deref(), request.method(), request.uri().path());
                (check::covered(host.as_deref(), certificate), routed)
            }
            Err(e) => (Err(e), self.router.find(None, request.method(), request.uri().path())),
        };
        if let Err(e) = named.and_then(|()| check::request(&request, routed.and_then(Routed::policy))) {
            let shape = routed.map_or(&self.errors, |r| &r.route().errors);
            return e.problem().respond_as(self.problem_base(), shape);
        }
        let method = request.method().clone();
        let Some(routed) = routed else {
            self.runtime.metrics.unmatched();
            let error =
                GatewayError::NoRoute { method: request.method().clone(), path: request.uri().path().to_owned() };
            return error.problem().respond_as(self.problem_base(), &self.errors);
        };
        let mut notes = Notes::default();
        // W3C's bounds, for what is forwarded whether or not the gateway traces.
        telemetry::bound_tracestate(request.headers_mut());
        if let Some(telemetry) = &self.runtime.telemetry {
            let trusted = connection.peer.trusted();
            notes.span = telemetry.begin(request.headers_mut(), trusted, &routed.route().name, &method);
        }
        // The idempotent path answers, or hands the request back to go upstream as on a plain
        // route. Boxed: its state is several times the pass-through's, and an unboxed future
        // would make every request and idle connection carry it. The pass-through stays inline
        // (figures in docs/performance.md).
        let handled = match routed {
            Routed::Plain(_) => Ok(Handled::Plain(request)),
            Routed::Idempotent(route) | Routed::Observed(route) => {
                let session = idempotent::Session { rt: &self.runtime, connection, route, notes: &mut notes };
                Box::pin(idempotent::serve(session, request)).await.map(Handled::Idempotent)
            }
        };
        let route = routed.route();
        let result = match handled {
            Ok(Handled::Plain(request)) => proxy::pass_through(route, request, connection, &mut notes, None)
                .await
                .map(|response| (Outcome::PassedThrough, response))
                .map_err(GatewayError::from),
            Ok(Handled::Idempotent(Served::Pass(pass))) => {
                proxy::pass_through(route, pass.request, connection, &mut notes, pass.expected)
                    .await
                    .map(|response| (pass.outcome, response))
                    .map_err(GatewayError::from)
            }
            Ok(Handled::Idempotent(Served::Answered(outcome, response))) => Ok((outcome, response)),
            Err(e) => Err(e),
        };
        let (outcome, response) = match result {
            Ok(served) => served,
            Err(e) => {
                let problem = e.problem();
                problem.log(&route.name, &e);
                (problem.outcome, problem.respond_as(self.problem_base(), &route.errors))
            }
        };
        route.metrics.outcome(outcome);
        let took = started.elapsed();
        route.metrics.request_duration(outcome, took);
        access::log(&route.name, &method, outcome, response.status(), took, &notes);
        if let Some(span) = &notes.span {
            span.end(outcome.as_str(), response.status().as_u16(), notes.attempt, notes.record.as_deref());
        }
        response
    }
}
