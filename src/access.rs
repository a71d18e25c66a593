//! The access log: one line per request, with where its time went.
//!
//! The line names the route, method, outcome, status and, on idempotent routes, the attempt,
//! the time spent upstream and in the store, and a short prefix of the record's hash, so that
//! an operator can follow one key across gateways. Never the key itself or a credential.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::metrics::Outcome;

/// What the idempotent path learned about a request, for its access line.
#[derive(Debug, Default)]
pub struct Trace {
    /// A short prefix of the record's hash.
    pub record: Option<String>,
    /// The attempt that ran upstream, if one did.
    pub attempt: Option<u32>,
    /// Time spent in store calls before the answer.
    pub store: Duration,
    /// Time spent on the upstream exchange, if there was one.
    pub upstream: Option<Duration>,
}

/// Writes the access line of one request (target `idemgate::access`, level info).
pub fn log(route: &str, method: &Method, outcome: Outcome, status: StatusCode, total: Duration, trace: &Trace) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    tracing::info!(
        target: "idemgate::access",
        route,
        method = %method,
        outcome = outcome.as_str(),
        status = status.as_u16(),
        attempt = trace.attempt,
        total_ms = ms(total),
        upstream_ms = trace.upstream.map(ms),
        store_ms = ms(trace.store),
        record = trace.record.as_deref(),
        "request"
    );
}
