//! Router: host + method + path pattern → route.
//!
//! Hosts first: a route with `hosts` serves only those (exact names, or `*.domain` for every
//! name under a domain), a route without serves every host. A request is matched against the
//! routes of its exact host, then those of the wildcards that cover it (the longest domain
//! first), then the routes for every host: the first of these that has a route for its method
//! and path answers, so a route for every host is what a named host falls back to. A gateway
//! whose routes name no host never looks at the host at all.
//!
//! Then methods and paths, within one host's routes. Patterns are exact (`/orders`), with a
//! named segment (`/orders/{id}`) or with a tail (`/files/{*rest}`, which also matches
//! `/files/` itself, so `/{*rest}` covers `/`). A path with a trailing slash matches the route
//! of the same path without it (`/orders/` is `/orders`): upstreams mostly treat the two
//! alike, so an idempotent route must too. Paths reach the router normalised (see
//! [`crate::path`]). They are checked here, in our own words, before the path tree (matchit)
//! sees them. Several routes may share one pattern with disjoint methods (`POST /orders`
//! idempotent, `GET /orders` pass-through), or with disjoint hosts.
//!
//! Methods are matched before paths: there is one path tree per method named in the config
//! (holding that method's routes and every route without `methods`), and one tree for all
//! other methods. So `GET /orders`, when only `POST /orders` is configured, falls through to a
//! catch-all `/{*rest}` route instead of stopping at the POST-only `/orders` pattern.

use std::collections::HashMap;

use http::Method;
use thiserror::Error;

use crate::host::HostPattern;

/// Why a set of routes cannot be compiled.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouterError {
    /// The pattern is not valid, or it conflicts with another route's pattern.
    #[error("invalid path pattern {pattern:?}: {reason}")]
    Pattern { index: usize, pattern: String, reason: String },
    /// Two routes match the same method on the same pattern for the same host.
    #[error("routes {first:?} and {second:?} both match {method} {pattern}{on}")]
    /// (`on`: " on host NAME", or empty for the routes of every host; boxed, to keep the
    /// error small.)
    Overlap { index: usize, first: String, second: String, method: String, pattern: String, on: Box<str> },
}

/// One route as the router sees it.
pub struct RouteSpec<'a, T> {
    /// Route name, for error messages.
    pub name: &'a str,
    /// Hosts served; empty is every host.
    pub hosts: &'a [HostPattern],
    /// Path pattern.
    pub pattern: &'a str,
    /// Methods; `None` is every method.
    pub methods: Option<&'a [Method]>,
    /// What a match returns.
    pub value: T,
}

/// A compiled route table.
pub struct Router<T> {
    /// Routes for every host.
    any_host: Paths<T>,
    /// Routes by exact host; empty when no route names one.
    exact: HashMap<String, Paths<T>>,
    /// Routes by wildcard, the longest domain first.
    wildcards: Vec<(HostPattern, Paths<T>)>,
}

impl<T: Clone> Router<T> {
    /// Compiles routes. Within one host and method, a route that names the method wins over a
    /// route without `methods` on the same pattern.
    pub fn new<'a>(specs: impl IntoIterator<Item = RouteSpec<'a, T>>) -> Result<Self, RouterError> {
        let specs: Vec<(usize, RouteSpec<'a, T>)> = specs.into_iter().enumerate().collect();
        for (index, spec) in &specs {
            check_pattern(spec.pattern).map_err(|reason| RouterError::Pattern {
                index: *index,
                pattern: spec.pattern.to_owned(),
                reason,
            })?;
        }
        let hosts: Vec<&HostPattern> = specs.iter().flat_map(|(_, s)| s.hosts).collect();
        let mut seen = Vec::new();
        let (mut exact, mut wildcards) = (HashMap::new(), Vec::new());
        for host in hosts {
            if seen.contains(&host) {
                continue;
            }
            seen.push(host);
            let serving: Vec<&(usize, RouteSpec<'a, T>)> =
                specs.iter().filter(|(_, s)| s.hosts.contains(host)).collect();
            let paths = Paths::new(&serving, &format!(" on host {host}"))?;
            match host {
                HostPattern::Exact(name) => {
                    exact.insert(name.clone(), paths);
                }
                HostPattern::Wildcard(_) => wildcards.push((host.clone(), paths)),
            }
        }
        // The longest domain first: `*.eu.example.com` before `*.example.com`.
        wildcards.sort_by_key(|(host, _)| std::cmp::Reverse(host.to_string().len()));
        let every: Vec<&(usize, RouteSpec<'a, T>)> = specs.iter().filter(|(_, s)| s.hosts.is_empty()).collect();
        Ok(Self { any_host: Paths::new(&every, "")?, exact, wildcards })
    }

    /// Whether some route names its hosts (so that routing needs the request's host).
    pub fn by_host(&self) -> bool {
        !self.exact.is_empty() || !self.wildcards.is_empty()
    }

    /// The route for a request to `host` (normalised, see [`crate::host`]) with `method` and
    /// `path`, if any.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&T> {
        if let Some(host) = host.filter(|_| self.by_host()) {
            let exact = self.exact.get(host).and_then(|paths| paths.find(method, path));
            let found = exact.or_else(|| {
                self.wildcards.iter().filter(|(w, _)| w.matches(host)).find_map(|(_, paths)| paths.find(method, path))
            });
            if found.is_some() {
                return found;
            }
        }
        self.any_host.find(method, path)
    }
}

/// The routes of one host (or of every host): a path tree per method.
struct Paths<T> {
    /// A list, not a map: routes name a handful of methods, and comparing a standard method
    /// is cheaper than hashing it (figures in docs/performance.md).
    by_method: Vec<(Method, matchit::Router<T>)>,
    any_method: matchit::Router<T>,
}

impl<T: Clone> Paths<T> {
    /// Compiles the routes of one host; `on` names it in an overlap's error.
    fn new(specs: &[&(usize, RouteSpec<'_, T>)], on: &str) -> Result<Self, RouterError> {
        for (i, (index, spec)) in specs.iter().map(|s| (&s.0, &s.1)).enumerate() {
            check_overlap(*index, spec, specs[..i].iter().map(|s| &s.1), on)?;
        }
        let mut methods: Vec<&Method> = specs.iter().flat_map(|s| s.1.methods.into_iter().flatten()).collect();
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods.dedup();
        let mut by_method = Vec::with_capacity(methods.len());
        for method in methods {
            by_method.push((method.clone(), tree(specs, Some(method))?));
        }
        Ok(Self { by_method, any_method: tree(specs, None)? })
    }

    /// The route for `method` and `path`, if any.
    fn find(&self, method: &Method, path: &str) -> Option<&T> {
        let tree = self.by_method.iter().find(|(m, _)| m == method).map_or(&self.any_method, |(_, tree)| tree);
        tree.at(path).ok().map(|m| m.value)
    }
}

/// The path tree of one method (`None`: of methods no route names).
fn tree<T: Clone>(
    specs: &[&(usize, RouteSpec<'_, T>)],
    method: Option<&Method>,
) -> Result<matchit::Router<T>, RouterError> {
    let explicit = |s: &RouteSpec<'_, T>| method.is_some_and(|m| s.methods.is_some_and(|ms| ms.contains(m)));
    let mut tree = matchit::Router::new();
    let mut implied = Vec::new();
    for (index, spec) in specs.iter().map(|s| (s.0, &s.1)) {
        let applies = explicit(spec)
            || (spec.methods.is_none() && !specs.iter().any(|o| o.1.pattern == spec.pattern && explicit(&o.1)));
        if applies {
            tree.insert(spec.pattern, spec.value.clone()).map_err(|e| RouterError::Pattern {
                index,
                pattern: spec.pattern.to_owned(),
                reason: conflict_reason(e),
            })?;
            implied.extend(implied_pattern(spec.pattern).map(|pattern| (pattern, spec)));
        }
    }
    // What a pattern implies (`/orders/` for `/orders`, `/` for `/{*rest}`) goes in last and
    // only where no route claims that path itself: an explicit pattern always wins.
    for (pattern, spec) in implied {
        let _ = tree.insert(pattern, spec.value.clone());
    }
    Ok(tree)
}

/// The other spelling a pattern matches: for a tail (`/api/{*rest}`), its empty form
/// (`/api/`); for any other pattern but `/`, the same with a trailing slash (`/orders/`).
fn implied_pattern(pattern: &str) -> Option<String> {
    if let Some(start) = pattern.rfind("/{*") {
        return Some(pattern[..=start].to_owned());
    }
    (pattern != "/" && !pattern.ends_with('/')).then(|| format!("{pattern}/"))
}

/// Checks a pattern's syntax and says what is wrong in the terms of the config reference.
fn check_pattern(pattern: &str) -> Result<(), String> {
    if !pattern.starts_with('/') {
        return Err("it must start with '/'".into());
    }
    let segments: Vec<&str> = pattern[1..].split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        let opens = segment.matches('{').count();
        let closes = segment.matches('}').count();
        if opens == 0 && closes == 0 {
            continue;
        }
        let Some(inner) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
            return Err(format!(
                "segment {segment:?}: a parameter takes a whole segment, written {{name}} or {{*name}}"
            ));
        };
        if opens != 1 || closes != 1 {
            return Err(format!("segment {segment:?}: one parameter per segment, written {{name}}"));
        }
        let (tail, name) = match inner.strip_prefix('*') {
            Some(name) => (true, name),
            None => (false, inner),
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("segment {segment:?}: a parameter's name uses only A-Z a-z 0-9 _"));
        }
        if tail && i + 1 != segments.len() {
            return Err(format!("segment {segment:?}: a tail {{*{name}}} must be the last segment"));
        }
    }
    Ok(())
}

fn conflict_reason(e: matchit::InsertError) -> String {
    match e {
        matchit::InsertError::Conflict { with } => format!(
            "it conflicts with the pattern {with:?} of an earlier route: the same path would match \
             both (parameters in one position must have one name)"
        ),
        other => format!("it cannot be routed: {other}"),
    }
}

fn check_overlap<'s, 'a: 's, T: 's>(
    index: usize,
    new: &RouteSpec<'a, T>,
    earlier: impl Iterator<Item = &'s RouteSpec<'a, T>>,
    on: &str,
) -> Result<(), RouterError> {
    for existing in earlier.filter(|e| e.pattern == new.pattern) {
        let shared = match (existing.methods, new.methods) {
            (None, None) => Some("every method".to_owned()),
            (Some(a), Some(b)) => a.iter().find(|m| b.contains(m)).map(Method::to_string),
            // One route with methods and one without: the explicit one wins for its methods.
            _ => None,
        };
        if let Some(method) = shared {
            return Err(RouterError::Overlap {
                index,
                first: existing.name.to_owned(),
                second: new.name.to_owned(),
                method,
                pattern: new.pattern.to_owned(),
                on: on.into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(name: &'a str, pattern: &'a str, methods: Option<&'a [Method]>) -> RouteSpec<'a, &'a str> {
        RouteSpec { name, hosts: &[], pattern, methods, value: name }
    }

    const POST: &[Method] = &[Method::POST];
    const GET: &[Method] = &[Method::GET];

    #[test]
    fn exact_param_and_tail_patterns() {
        let r = Router::new([
            spec("create", "/orders", Some(POST)),
            spec("one", "/orders/{id}", Some(GET)),
            spec("files", "/files/{*rest}", None),
        ])
        .unwrap();
        assert_eq!(r.find(None, &Method::POST, "/orders"), Some(&"create"));
        assert_eq!(r.find(None, &Method::GET, "/orders/42"), Some(&"one"));
        assert_eq!(r.find(None, &Method::DELETE, "/files/a/b/c"), Some(&"files"));
        assert_eq!(r.find(None, &Method::GET, "/orders"), None);
        assert_eq!(r.find(None, &Method::POST, "/nothing"), None);
        assert_eq!(r.find(None, &Method::POST, "/files/x"), Some(&"files"));
        assert_eq!(r.find(None, &Method::GET, "/orders/42/items"), None);
    }

    #[test]
    fn one_pattern_many_methods() {
        let r = Router::new([
            spec("list", "/orders", Some(GET)),
            spec("fallback", "/orders", None),
            spec("create", "/orders", Some(POST)),
        ])
        .unwrap();
        assert_eq!(r.find(None, &Method::POST, "/orders"), Some(&"create"));
        assert_eq!(r.find(None, &Method::GET, "/orders"), Some(&"list"));
        assert_eq!(r.find(None, &Method::PATCH, "/orders"), Some(&"fallback"));
    }

    #[test]
    fn a_method_that_misses_a_pattern_falls_through_to_a_catch_all() {
        let r = Router::new([spec("create", "/orders", Some(POST)), spec("rest", "/{*rest}", None)]).unwrap();
        assert_eq!(r.find(None, &Method::POST, "/orders"), Some(&"create"));
        assert_eq!(r.find(None, &Method::GET, "/orders"), Some(&"rest"));
        assert_eq!(r.find(None, &Method::from_bytes(b"PURGE").unwrap(), "/orders"), Some(&"rest"));
        assert_eq!(r.find(None, &Method::POST, "/other"), Some(&"rest"));
    }

    #[test]
    fn overlapping_methods_on_one_pattern_are_rejected() {
        let err = Router::new([spec("a", "/orders", Some(POST)), spec("b", "/orders", Some(POST))]).err();
        assert!(matches!(err, Some(RouterError::Overlap { index: 1, .. })), "{err:?}");
        let err = Router::new([spec("a", "/orders", None), spec("b", "/orders", None)]).err();
        assert!(matches!(err, Some(RouterError::Overlap { .. })), "{err:?}");
    }

    #[test]
    fn conflicting_or_bad_patterns_are_rejected() {
        let err = Router::new([spec("a", "/orders/{id}", None), spec("b", "/orders/{oid}", None)]).err();
        assert!(matches!(err, Some(RouterError::Pattern { index: 1, .. })), "{err:?}");
        let err = Router::new([spec("a", "orders", None)]).err();
        assert!(matches!(err, Some(RouterError::Pattern { index: 0, .. })), "{err:?}");
        for bad in ["/orders/{id", "/orders/{}", "/a/{x-y}", "/a/{*rest}/b", "/a/x{id}", "/a/{b}{c}", "/a/}"] {
            let err = Router::new([spec("a", bad, None)]).err();
            let Some(RouterError::Pattern { reason, .. }) = &err else { panic!("{bad}: {err:?}") };
            assert!(reason.contains("segment") && !reason.contains("registered"), "{bad}: {reason}");
        }
    }

    #[test]
    fn a_trailing_slash_matches_the_route_without_it() {
        let r = Router::new([
            spec("create", "/orders", Some(POST)),
            spec("one", "/orders/{id}", None),
            spec("rest", "/{*rest}", None),
        ])
        .unwrap();
        assert_eq!(r.find(None, &Method::POST, "/orders/"), Some(&"create"));
        assert_eq!(r.find(None, &Method::POST, "/orders/7/"), Some(&"one"));
        assert_eq!(r.find(None, &Method::GET, "/orders/"), Some(&"rest"));
        // A route for the slashed path itself wins over the implied one.
        let r = Router::new([spec("bare", "/orders", None), spec("slashed", "/orders/", None)]).unwrap();
        assert_eq!(r.find(None, &Method::GET, "/orders/"), Some(&"slashed"));
        assert_eq!(r.find(None, &Method::GET, "/orders"), Some(&"bare"));
    }

    #[test]
    fn a_tail_also_matches_its_empty_form_unless_a_route_claims_it() {
        let r = Router::new([spec("rest", "/{*rest}", None), spec("api", "/api/{*rest}", None)]).unwrap();
        assert_eq!(r.find(None, &Method::GET, "/"), Some(&"rest"));
        assert_eq!(r.find(None, &Method::GET, "/api/"), Some(&"api"));
        assert_eq!(r.find(None, &Method::GET, "/api/x"), Some(&"api"));
        let r = Router::new([spec("rest", "/{*rest}", None), spec("root", "/", Some(GET))]).unwrap();
        assert_eq!(r.find(None, &Method::GET, "/"), Some(&"root"));
        assert_eq!(r.find(None, &Method::POST, "/"), Some(&"rest"));
    }

    fn on<'a>(name: &'a str, hosts: &'a [HostPattern], pattern: &'a str) -> RouteSpec<'a, &'a str> {
        RouteSpec { name, hosts, pattern, methods: None, value: name }
    }

    #[test]
    fn exact_hosts_before_wildcards_before_every_host() {
        let api = [HostPattern::parse("api.example.com").unwrap()];
        let any_sub = [HostPattern::parse("*.example.com").unwrap()];
        let eu = [HostPattern::parse("*.eu.example.com").unwrap()];
        let r = Router::new([
            on("everyone", &[], "/{*rest}"),
            on("tenants", &any_sub, "/orders"),
            on("eu", &eu, "/orders"),
            on("api", &api, "/orders"),
        ])
        .unwrap();
        assert!(r.by_host());
        let find = |host: Option<&str>, path: &str| r.find(host, &Method::POST, path).copied();
        assert_eq!(find(Some("api.example.com"), "/orders"), Some("api"));
        assert_eq!(find(Some("a.example.com"), "/orders"), Some("tenants"));
        assert_eq!(find(Some("x.eu.example.com"), "/orders"), Some("eu"));
        assert_eq!(find(Some("example.com"), "/orders"), Some("everyone"));
        assert_eq!(find(None, "/orders"), Some("everyone"));
        // A named host without a route for the path falls back to the routes for every host.
        assert_eq!(find(Some("api.example.com"), "/other"), Some("everyone"));
        let only = Router::new([on("api", &api, "/orders")]).unwrap();
        assert_eq!(only.find(Some("other.example.com"), &Method::POST, "/orders"), None);
        assert_eq!(only.find(None, &Method::POST, "/orders"), None);
    }

    #[test]
    fn routes_overlap_only_on_a_host_they_share() {
        let a = [HostPattern::parse("a.example.com").unwrap()];
        let b = [HostPattern::parse("b.example.com").unwrap(), HostPattern::parse("a.example.com").unwrap()];
        let c = [HostPattern::parse("c.example.com").unwrap()];
        assert!(Router::new([on("a", &a, "/orders"), on("c", &c, "/orders"), on("all", &[], "/orders")]).is_ok());
        let err = Router::new([on("a", &a, "/orders"), on("b", &b, "/orders")]).err();
        let Some(RouterError::Overlap { index: 1, on, .. }) = &err else { panic!("{err:?}") };
        assert_eq!(&**on, " on host a.example.com");
        assert!(err.unwrap().to_string().ends_with("on host a.example.com"));
    }

    #[test]
    fn a_router_without_hosts_never_reads_one() {
        let r = Router::new([spec("create", "/orders", Some(POST))]).unwrap();
        assert!(!r.by_host());
        assert_eq!(r.find(Some("anything.example"), &Method::POST, "/orders"), Some(&"create"));
    }
}
