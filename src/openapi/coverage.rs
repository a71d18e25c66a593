//! What a configuration leaves of a document unprotected (`idemgate check --openapi`): the
//! unsafe operations that reach no route enforcing idempotency, the keyed routes that match
//! no operation, and the operations whose declared key the route reads otherwise. Where a
//! request goes is asked of the router, through the same samples as `check`'s warning about
//! unsafe requests that fall through to a route that does not enforce ([`Reach`]).

use http::Method;

use super::contract::header_name;
use super::operations::Operation;
use crate::config::RouteConfig;
use crate::config::reach::{Reach, enforces, sample_path, unsafe_methods, unused_segment};
use crate::router::{RouteSpec, Router};

/// What the coverage found, one line each.
#[derive(Debug, Default)]
pub struct Coverage {
    /// Unsafe operations counted (of the methods asked).
    pub unsafe_operations: usize,
    /// Of those, the ones every host sends to a route that enforces idempotency.
    pub covered: usize,
    pub findings: Vec<String>,
}

/// The coverage of `operations` by `routes`; `methods` are the unsafe methods asked about.
pub fn coverage(routes: &[RouteConfig], operations: &[Operation], methods: &[Method]) -> Coverage {
    let mut out = Coverage::default();
    let Some(reach) = Reach::new(routes) else { return out };
    let probes = reach.probes();
    for op in operations.iter().filter(|op| methods.contains(&op.method)) {
        out.unsafe_operations += 1;
        let path = reach.sample(&op.pattern);
        let mut keyed = None;
        let mut gaps = 0;
        for probe in &probes {
            let found = reach.find(probe.host.as_deref(), &op.method, &path);
            // A gateway whose routes name no host has one probe: no host to name.
            let on = if probes.len() == 1 { String::new() } else { format!(" for {}", probe.named) };
            let at = format!("{}: {} {}{on}", op.place, op.method, op.pattern);
            let finding = match found.map(|r| &routes[r]) {
                Some(route) if enforces(route) => {
                    keyed = keyed.or(Some(route));
                    continue;
                }
                Some(route) if route.idempotency.is_some() => {
                    keyed = keyed.or(Some(route));
                    format!(
                        "{at} reaches route {:?}, which only observes (mode = \"observe\"): a retry runs again upstream",
                        route.name
                    )
                }
                Some(route) => format!(
                    "{at} reaches route {:?}, which does not enforce idempotency: a retry runs again upstream",
                    route.name
                ),
                None => format!("{at} matches no route: the gateway answers it 404 (no-route)"),
            };
            gaps += 1;
            out.findings.push(finding);
        }
        if gaps == 0 {
            out.covered += 1;
        }
        if let Some(route) = keyed {
            declared(route, op, &mut out.findings);
        }
    }
    unmatched(routes, operations, &mut out.findings);
    out
}

/// Where the operation's declared key and the route's reading of it differ.
fn declared(route: &RouteConfig, op: &Operation, findings: &mut Vec<String>) {
    let Some(policy) = &route.idempotency else { return };
    let at = format!("{}: route {:?}", op.place, route.name);
    match &op.key {
        None if policy.required => findings.push(format!(
            "{at} requires {} (400 without it), which the document does not declare for {} {}: clients built from \
             the document send none",
            header_name(&policy.header),
            op.method,
            op.pattern
        )),
        None => {}
        Some(key) => {
            if !key.header.eq_ignore_ascii_case(policy.header.as_str()) {
                findings.push(format!(
                    "{at} reads the key from {}, the document declares it as {}: the route's `header`",
                    header_name(&policy.header),
                    key.header
                ));
            }
            if key.required && !policy.required {
                findings.push(format!(
                    "{at} has required = false while the document requires {}: a request without it passes \
                     unprotected",
                    key.header
                ));
            } else if !key.required && policy.required {
                findings.push(format!(
                    "{at} requires {} (400 without it), which the document declares optional",
                    key.header
                ));
            }
        }
    }
}

/// Every keyed route whose path and methods match no operation of the document.
fn unmatched(routes: &[RouteConfig], operations: &[Operation], findings: &mut Vec<String>) {
    // One entry per method and pattern: operations the router cannot tell apart (`/a/{x}`
    // and `/a/{x}.json`, routed whole) are one for this question.
    let mut seen = std::collections::HashSet::new();
    let distinct: Vec<&Operation> =
        operations.iter().filter(|op| seen.insert((op.method.clone(), op.pattern.clone()))).collect();
    let methods: Vec<[Method; 1]> = distinct.iter().map(|op| [op.method.clone()]).collect();
    let specs = distinct.iter().zip(&methods).enumerate().map(|(i, (op, m))| RouteSpec {
        name: op.operation_id.as_deref().unwrap_or(&op.place),
        hosts: &[],
        pattern: &op.pattern,
        methods: Some(m.as_slice()),
        value: i,
    });
    let router = match Router::new(specs) {
        Ok(router) => router,
        Err(e) => {
            findings.push(format!("the document's own paths cannot all be routed side by side ({e}): keyed routes are not matched against them"));
            return;
        }
    };
    let segment = unused_segment(distinct.iter().map(|op| op.pattern.as_str()));
    for route in routes.iter().filter(|r| r.idempotency.is_some()) {
        let path = sample_path(&route.path, &segment);
        let asked = match &route.methods {
            Some(methods) => methods.clone(),
            None => unsafe_methods(routes),
        };
        if asked.iter().all(|m| router.find(None, m, &path).is_none()) {
            let methods = asked.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
            findings.push(format!(
                "route {:?} ({methods} {}) is keyed but matches no operation of the document",
                route.name, route.path
            ));
        }
    }
}
