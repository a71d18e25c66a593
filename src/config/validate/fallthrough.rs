//! What a host or method split leaves unprotected: a warning (for `check`, startup and
//! reload) whenever a request with an unsafe method, on a path a keyed route enforces, can
//! reach a route that does not enforce.
//!
//! Routing picks the host's routes first and falls back to the routes for every host (see
//! [`crate::router`]). So `hosts = ["api.example.com"]` on the keyed `POST /orders`, beside a
//! catch-all pass-through route, sends `POST /orders` for every other host (curl's
//! `127.0.0.1:PORT` among them) to the catch-all, where a retry runs again upstream: valid,
//! as documented, and silent. Likewise `PUT /orders` listed on a pass-through route beside a
//! keyed `POST /orders`.
//!
//! Where each sample request goes is asked of the router ([`crate::config::reach`], which
//! `idemgate check --openapi` shares).
//!
//! Warned: (a) a method the keyed route takes that reaches, for some host, a route without
//! `[routes.idempotency]` of other hosts (a route of the same hosts that takes the sample path
//! is a path carved out on purpose, not a split); (b) another unsafe method, on a host the
//! keyed route serves, that reaches such a route which lists that method itself. A catch-all
//! that lists no method is what methods no route names are meant to reach, and is not warned
//! about for them. A route that observes (`mode = "observe"`) is never warned about, as the
//! keyed route or as the other: it is the deliberate first step of adopting enforcement, and
//! `idemgate report` counts what it would change.

use std::collections::BTreeMap;

use http::Method;

use super::Issues;
use crate::config::reach::{Probe, Reach, UNNAMED, enforces, unsafe_methods};
use crate::config::{Config, RouteConfig};

/// How a request escapes the keyed route.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Split {
    /// (a) With a method the keyed route takes, for a host it does not keep.
    Host,
    /// (b) With another unsafe method, listed by the route it reaches.
    Method,
}

/// What reaches one unprotected route from one keyed route: methods and hosts, in probe order.
#[derive(Default)]
struct Escape {
    methods: Vec<Method>,
    hosts: Vec<String>,
}

/// Adds a warning for every keyed route and every route that takes requests from it unprotected.
pub(super) fn warnings(config: &Config, out: &mut Issues) {
    let routes = &config.routes;
    if !routes.iter().any(enforces) {
        return;
    }
    // `build` refused a table that does not compile: nothing to say here.
    let Some(reach) = Reach::new(routes) else { return };
    let probes = reach.probes();
    let methods = unsafe_methods(routes);
    let mut found: BTreeMap<(usize, usize, Split), Escape> = BTreeMap::new();
    for (k, keyed) in routes.iter().enumerate().filter(|(_, r)| enforces(r)) {
        let path = reach.sample(&keyed.path);
        for method in &methods {
            let takes = keyed.methods.as_ref().is_none_or(|ms| ms.contains(method));
            for probe in &probes {
                let Some(r) = reach.find(probe.host.as_deref(), method, &path) else { continue };
                let other = &routes[r];
                if r == k || other.idempotency.is_some() {
                    continue;
                }
                let split = if takes {
                    if other.hosts == keyed.hosts {
                        continue;
                    }
                    Split::Host
                } else if serves(keyed, probe) && other.methods.as_ref().is_some_and(|ms| ms.contains(method)) {
                    Split::Method
                } else {
                    continue;
                };
                let escape = found.entry((k, r, split)).or_default();
                if !escape.methods.contains(method) {
                    escape.methods.push(method.clone());
                }
                if !escape.hosts.contains(&probe.named) {
                    escape.hosts.push(probe.named.clone());
                }
            }
        }
    }
    for ((k, r, split), escape) in found {
        let (keyed, other) = (&routes[k], &routes[r]);
        match split {
            Split::Host => {
                let key =
                    if keyed.hosts.is_empty() { format!("routes[{r}].hosts") } else { format!("routes[{k}].hosts") };
                out.add(key, host_split(keyed, other, &escape));
            }
            Split::Method => out.add(format!("routes[{r}].methods"), method_split(keyed, other, &escape)),
        }
    }
}

/// Whether `route` serves the hosts `probe` stands for.
fn serves(route: &RouteConfig, probe: &Probe) -> bool {
    route.hosts.is_empty() || probe.host.as_deref().is_some_and(|h| route.hosts.iter().any(|p| p.matches(h)))
}

/// `a`, `a and b`, `a, b and c`.
fn listed<T: ToString>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// `POST /orders`, or `/orders` for a route that takes every method.
fn on(route: &RouteConfig) -> String {
    match &route.methods {
        Some(methods) => format!("{} {}", listed(methods), route.path),
        None => route.path.clone(),
    }
}

fn verb(methods: &[Method]) -> &'static str {
    if methods.len() == 1 { "goes" } else { "go" }
}

fn host_split(keyed: &RouteConfig, other: &RouteConfig, escape: &Escape) -> String {
    let only = if keyed.hosts.is_empty() { String::new() } else { format!(" for {} only", listed(&keyed.hosts)) };
    let fix = if keyed.hosts.is_empty() {
        format!(
            "give route {:?} a [routes.idempotency] table, or narrow it (its hosts, methods or path) so that it \
             does not take them",
            other.name
        )
    } else {
        // A host no route names cannot be listed: only leaving `hosts` out keeps it.
        let keep = if escape.hosts.iter().any(|h| h == UNNAMED) {
            format!("leave hosts out of route {:?} (or list in it every host clients send)", keyed.name)
        } else {
            format!("add those hosts to route {:?}", keyed.name)
        };
        format!(
            "{keep}, give route {:?} a [routes.idempotency] table, or narrow route {:?} (its hosts, methods or \
             path) so that it does not take them",
            other.name, other.name
        )
    };
    format!(
        "route {:?} enforces idempotency on {}{only}, but {} {} for {} {} to route {:?}, which does not enforce it: \
         a retry there runs again upstream; {fix}",
        keyed.name,
        on(keyed),
        listed(&escape.methods),
        keyed.path,
        listed(&escape.hosts),
        verb(&escape.methods),
        other.name,
    )
}

fn method_split(keyed: &RouteConfig, other: &RouteConfig, escape: &Escape) -> String {
    let methods = listed(&escape.methods);
    let at = if keyed.hosts.is_empty() { String::new() } else { format!(" on {}", listed(&escape.hosts)) };
    format!(
        "{methods} {path}{at} {} to route {:?}, which lists {methods} and does not enforce idempotency, while route \
         {:?} enforces it on {}: a retry there runs again upstream; give route {:?} a [routes.idempotency] \
         table of its own, or take {methods} out of its methods if the upstream makes them safe to repeat by itself",
        verb(&escape.methods),
        other.name,
        keyed.name,
        on(keyed),
        other.name,
        path = keyed.path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_sentences() {
        assert_eq!(listed::<&str>(&[]), "");
        assert_eq!(listed(&["a"]), "a");
        assert_eq!(listed(&["a", "b", "c"]), "a, b and c");
    }

    fn config(routes: &str) -> Config {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\n\
             [upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n{routes}"
        );
        Config::from_toml(&text, "t").unwrap_or_else(|e| panic!("{e}"))
    }

    fn unprotected(routes: &str) -> Vec<String> {
        let config = config(routes);
        let mut out = Issues::default();
        warnings(&config, &mut out);
        out.0.into_iter().map(|i| format!("{}: {}", i.key, i.reason)).collect()
    }

    const KEYED: &str = "[[routes]]\nname = \"k\"\nhosts = [\"api.example.com\"]\nmethods = [\"POST\"]\n\
                         path = \"/orders/{id}\"\nupstream = \"app\"\n[routes.idempotency]\n";

    #[test]
    fn a_parameter_is_sampled_with_a_segment_no_literal_route_takes() {
        let literal = "[[routes]]\nname = \"tilde\"\nhosts = [\"api.example.com\"]\nmethods = [\"POST\"]\n\
                       path = \"/orders/~\"\nupstream = \"app\"\n";
        let rest = "[[routes]]\nname = \"rest\"\npath = \"/{*rest}\"\nupstream = \"app\"\n";
        let config = config(&format!("{KEYED}{literal}{rest}"));
        assert_eq!(Reach::new(&config.routes).map(|r| r.sample("/{id}")), Some("/~~".to_owned()));
        // `/orders/~` on api.example.com is the literal route's, by design; other hosts fall through.
        let found = unprotected(&format!("{KEYED}{literal}{rest}"));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].starts_with("routes[0].hosts: route \"k\" enforces idempotency on POST /orders/{id}"));
    }

    #[test]
    fn a_path_carved_out_for_the_same_hosts_is_no_split() {
        let keyed = "[[routes]]\nname = \"k\"\nmethods = [\"POST\"]\npath = \"/{*rest}\"\nupstream = \"app\"\n\
                     [routes.idempotency]\n";
        let carved = "[[routes]]\nname = \"plain\"\npath = \"/orders\"\nupstream = \"app\"\n";
        assert_eq!(unprotected(&format!("{keyed}{carved}")), Vec::<String>::new());
        // Whereas a route that lists another unsafe method on the keyed path is named.
        let put =
            "[[routes]]\nname = \"put\"\nmethods = [\"PUT\", \"PURGE\"]\npath = \"/{*rest}\"\nupstream = \"app\"\n";
        let found = unprotected(&format!("{keyed}{put}"));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].starts_with("routes[1].methods: PUT and PURGE /{*rest} go to route \"put\""), "{found:#?}");
    }
}
