//! Where a request goes, asked of the router itself (its matching, not a comparison of
//! strings: `/orders` is under `/{*rest}`), for sample requests. Shared by `check`'s warning
//! about unsafe requests that reach a route that does not enforce idempotency
//! (`validate/fallthrough.rs`) and by the coverage of an API's OpenAPI document
//! (`idemgate check --openapi`), so that both say the same about the same request.
//!
//! The samples:
//! - paths: a pattern with a segment no pattern names in each parameter ([`Reach::sample`]);
//! - hosts: every exact host routes name; for each wildcard, its own text (`*.example.com`,
//!   which only that wildcard and those over it match, as an unnamed name under it is); and
//!   no host, as for a host no route names ([`probes`]);
//! - methods: the unsafe ones (RFC 9110 §9.2.1: all but GET, HEAD, OPTIONS and TRACE).

use http::Method;

use super::RouteConfig;
use crate::policy::Mode;
use crate::router::{RouteSpec, Router};

/// The routes of a configuration, compiled to be asked where sample requests go.
pub struct Reach<'a> {
    pub routes: &'a [RouteConfig],
    router: Router<usize>,
    /// A path segment no pattern names literally.
    segment: String,
}

/// One sample host, and how a report names the hosts it stands for.
pub struct Probe {
    /// `None`: a host no route names (or none at all).
    pub host: Option<String>,
    pub named: String,
}

/// How a report names the hosts no route names.
pub const UNNAMED: &str = "any host no route names";

impl<'a> Reach<'a> {
    /// `None` when the routes do not compile (validation says why).
    pub fn new(routes: &'a [RouteConfig]) -> Option<Self> {
        let specs = routes.iter().enumerate().map(|(i, r)| RouteSpec {
            name: &r.name,
            hosts: &r.hosts,
            pattern: &r.path,
            methods: r.methods.as_deref(),
            value: i,
        });
        let router = Router::new(specs).ok()?;
        let segment = unused_segment(routes.iter().map(|r| r.path.as_str()));
        Some(Self { routes, router, segment })
    }

    /// `pattern` with the sample segment in each parameter (`/orders/{id}` → `/orders/~`).
    pub fn sample(&self, pattern: &str) -> String {
        sample_path(pattern, &self.segment)
    }

    /// The index of the route a request goes to, if any.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
        self.router.find(host, method, path).copied()
    }

    /// The sample hosts: each exact host, each wildcard's own text, then a host no route names.
    pub fn probes(&self) -> Vec<Probe> {
        let mut out: Vec<Probe> = Vec::new();
        for pattern in self.routes.iter().flat_map(|r| &r.hosts) {
            let host = pattern.to_string();
            if out.iter().any(|p| p.host.as_ref() == Some(&host)) {
                continue;
            }
            let named = if pattern.is_wildcard() { format!("names under {host}") } else { host.clone() };
            out.push(Probe { host: Some(host), named });
        }
        out.push(Probe { host: None, named: UNNAMED.into() });
        out
    }
}

/// A route that claims, replays and refuses: one with `[routes.idempotency]` that does not
/// only observe.
pub fn enforces(route: &RouteConfig) -> bool {
    route.idempotency.as_ref().is_some_and(|p| p.mode == Mode::Enforce)
}

/// Whether a request with `method` is unsafe (RFC 9110 §9.2.1).
pub fn is_unsafe(method: &Method) -> bool {
    ![Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method)
}

/// POST, PUT, PATCH, DELETE, then every other unsafe method a route names.
pub fn unsafe_methods(routes: &[RouteConfig]) -> Vec<Method> {
    let mut out = vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE];
    for method in routes.iter().flat_map(|r| r.methods.iter().flatten()) {
        if is_unsafe(method) && !out.contains(method) {
            out.push(method.clone());
        }
    }
    out
}

/// A path segment none of `patterns` names literally (`~`, else `~~`, ...): a sample of a
/// parameter that no pattern for that literal can take.
pub fn unused_segment<'p>(patterns: impl Iterator<Item = &'p str> + Clone) -> String {
    let literal = |s: &str| patterns.clone().any(|p| p.split('/').any(|segment| segment == s));
    let mut segment = String::from("~");
    while literal(&segment) {
        segment.push('~');
    }
    segment
}

/// `pattern` with `segment` in each parameter (for patterns of another table, such as an
/// OpenAPI document's operations, whose literals [`Reach::sample`] does not know).
pub fn sample_path(pattern: &str, segment: &str) -> String {
    let parts: Vec<&str> = pattern.split('/').map(|s| if s.starts_with('{') { segment } else { s }).collect();
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_fill_every_parameter_with_a_segment_no_pattern_names() {
        assert_eq!(sample_path("/orders/{id}/items/{*rest}", "~"), "/orders/~/items/~");
        assert_eq!(sample_path("/", "~"), "/");
        assert!(is_unsafe(&Method::POST) && is_unsafe(&Method::from_bytes(b"PURGE").unwrap()));
        assert!(!is_unsafe(&Method::GET));
    }
}
