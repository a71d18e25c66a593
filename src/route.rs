//! A route at run time: what the router finds for a request, and everything the request
//! path needs to serve it. Its own module so that the gateway (which builds routes) and the
//! idempotent path (which serves them) both use it without depending on each other.

use std::sync::Arc;

use crate::idempotent::policy::IdempotencyPolicy;
use crate::metrics::RouteMetrics;
use crate::upstream::Upstream;

/// One route at run time.
pub struct Route {
    /// Route name.
    pub name: String,
    /// Where it forwards.
    pub upstream: Arc<Upstream>,
    /// Its idempotency policy; `None` for a plain proxy route.
    pub policy: Option<Arc<IdempotencyPolicy>>,
    /// Its counters.
    pub metrics: RouteMetrics,
}
