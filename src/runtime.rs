//! What the request path runs on: the shared [`Runtime`] handle, and the routes.
//!
//! The runtime is built once, with the first gateway, and every gateway a reload builds keeps
//! it: exchanges that outlive a reload must settle into the same store, count into the same
//! metrics and be waited for by the same shutdown. Routes are rebuilt by every reload.
//!
//! The idempotent path takes this handle, never the whole gateway: what it may touch is what
//! is listed here.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::{Metrics, RouteMetrics};
use crate::policy::IdempotencyPolicy;
use crate::policy::errors::ErrorShape;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::store::{Audit, Backend, Index, Lifecycle, Lookups, Operator, Quota, RecordKey, Records};
use crate::telemetry::Telemetry;
use crate::upstream::Upstream;

/// The handle shared by every request, every exchange and every reloaded gateway.
pub struct Runtime {
    /// The record store, handed out by role (see the accessors): the request path holds the
    /// key's lifecycle, lookups, records, the index and the quota, never the operator's role.
    store: Arc<Backend>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Detached upstream exchanges, so that shutdown can wait for them.
    pub exchanges: TaskTracker,
    /// Cancelled when the shutdown grace period is over: exchanges still running settle their
    /// keys so that retries can proceed.
    pub abandon: CancellationToken,
    /// One permit per upstream exchange running at once (`server.max_exchanges`).
    pub exchange_slots: Arc<Semaphore>,
    /// Prefix of the store's key names (`store.key_prefix`).
    key_prefix: String,
    /// Trace export (`[telemetry]`); `None` when off, and then no span is built.
    pub telemetry: Option<Telemetry>,
}

impl Runtime {
    /// A runtime over `store`, allowing `max_exchanges` exchanges at once.
    pub fn new(
        store: Backend,
        metrics: Metrics,
        max_exchanges: usize,
        key_prefix: &str,
        telemetry: Option<Telemetry>,
    ) -> Self {
        Self {
            store: Arc::new(store),
            metrics: Arc::new(metrics),
            exchanges: TaskTracker::new(),
            abandon: CancellationToken::new(),
            exchange_slots: Arc::new(Semaphore::new(max_exchanges)),
            key_prefix: key_prefix.to_owned(),
            telemetry,
        }
    }

    /// The store's name for the record of `key`, sent by `scope` to route `route`: the one
    /// place a record's name is derived (the request path, the admin key endpoints and the
    /// tests all come here).
    pub fn record_key(&self, route: &str, scope: &Scope, key: &IdempotencyKey) -> RecordKey {
        RecordKey::new(&self.key_prefix, route, scope, key)
    }

    /// Prefix of the store's key names.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The key's life in the store: claim, renew, settle, release, watch.
    pub fn lifecycle(&self) -> &(impl Lifecycle + use<>) {
        &*self.store
    }

    /// The key's lifecycle, for a task that outlives the request (a background release).
    pub fn lifecycle_owned(&self) -> Arc<impl Lifecycle + use<>> {
        Arc::clone(&self.store)
    }

    /// Lookups of unknown outcomes.
    pub fn lookups(&self) -> &(impl Lookups + use<>) {
        &*self.store
    }

    /// Records, read as the store holds them.
    pub fn records(&self) -> &(impl Records + use<>) {
        &*self.store
    }

    /// The index of the records that need an operator.
    pub fn index(&self) -> &(impl Index + use<>) {
        &*self.store
    }

    /// The index, for a task that outlives the request.
    pub fn index_owned(&self) -> Arc<impl Index + use<>> {
        Arc::clone(&self.store)
    }

    /// The budgets of new keys.
    pub fn quota(&self) -> &(impl Quota + use<>) {
        &*self.store
    }

    /// What only an operator does to a record (the admin API's role).
    pub fn operator(&self) -> &(impl Operator + use<>) {
        &*self.store
    }

    /// The audit trail of what operators did (the admin API's role).
    pub fn audit(&self) -> &(impl Audit + use<>) {
        &*self.store
    }

    /// The longest one store call may take (`store.timeout`; nothing for the memory store):
    /// a call sent now may be applied that much later.
    pub fn store_call_timeout(&self) -> Duration {
        self.store.call_timeout()
    }

    /// The store as configured, for the server's wiring: where it is, whether it answers,
    /// its settings and its latency metrics. Not for the request path, which holds roles.
    pub fn backend(&self) -> &Backend {
        &self.store
    }
}

/// One route at run time: its name, where it forwards, its counters.
pub struct Route {
    /// Route name.
    pub name: String,
    /// Where it forwards.
    pub upstream: Arc<Upstream>,
    /// Its counters.
    pub metrics: RouteMetrics,
    /// How the gateway's errors look on it.
    pub errors: Arc<ErrorShape>,
}

/// What the request path reads of `[server]`; a reload applies it, like the routes.
#[derive(Debug, Clone)]
pub struct RequestSettings {
    /// Prefix of problem+json `type` URIs.
    pub problem_base: String,
    /// Deadline of an idempotent route's whole request body.
    pub body_read_timeout: Duration,
}

/// An idempotent route: a route with its policy (never absent here), and what it reads of
/// `[server]`.
pub struct IdempotentRoute {
    /// The route.
    pub route: Route,
    /// Its `[routes.idempotency]`.
    pub policy: Arc<IdempotencyPolicy>,
    /// The problem base and the body deadline.
    pub settings: Arc<RequestSettings>,
}

impl Deref for IdempotentRoute {
    type Target = Route;

    fn deref(&self) -> &Route {
        &self.route
    }
}

/// What the router finds for a request: a plain route, or an idempotent one.
#[derive(Clone)]
pub enum Routed {
    /// A streaming proxy route.
    Plain(Arc<Route>),
    /// A route with a `[routes.idempotency]` table.
    Idempotent(Arc<IdempotentRoute>),
    /// A route with a `[routes.idempotency]` table in observe mode (`mode = "observe"`).
    Observed(Arc<IdempotentRoute>),
}

impl Routed {
    /// The idempotency policy a request is held to: an enforcing route's (a route that only
    /// observes checks requests as a pass-through route does).
    pub fn policy(&self) -> Option<&IdempotencyPolicy> {
        match self {
            Self::Plain(_) | Self::Observed(_) => None,
            Self::Idempotent(route) => Some(&route.policy),
        }
    }

    /// The route, whatever its kind.
    pub fn route(&self) -> &Route {
        match self {
            Self::Plain(route) => route,
            Self::Idempotent(route) | Self::Observed(route) => route,
        }
    }
}
