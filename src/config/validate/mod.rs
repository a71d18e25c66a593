//! Checks every value of a parsed file and builds the runtime [`Config`].
//!
//! Problems are collected, not returned at the first one: an operator fixing a file should
//! see everything that is wrong with it in one run of `idemgate check`. One file per part of
//! the file: [`server`] (`[server]`), [`store`] (`[store]`), [`routes`] (`[upstreams]` and
//! `[[routes]]` with their policies); the checks shared by all of them, and the warnings, are
//! here.

mod errors;
mod fallthrough;
mod identity;
mod routes;
mod server;
mod store;
mod telemetry;
mod upstreams;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use crate::policy::errors::ErrorShape;

use super::file::File;
use super::units::{HumanDuration, HumanSize};
use super::{Config, Issue, UpstreamConfig};

#[derive(Default)]
pub(super) struct Issues(Vec<Issue>);

impl Issues {
    pub(super) fn add(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(Issue { key: key.into(), reason: reason.into(), line: None, route: None });
    }

    /// Records the error of `result` under `key` and passes the value on.
    pub(super) fn check<T>(&mut self, key: &str, result: Result<T, String>) -> Option<T> {
        result.map_err(|reason| self.add(key, reason)).ok()
    }
}

/// Builds the runtime config; `env` looks up environment variables (the secrets a file may
/// name instead of holding).
pub(super) fn build(file: File, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<Issue>> {
    let mut issues = Issues::default();
    let server = server::server(&file.server, env, &mut issues);
    let store = store::store(&file.store, env, &mut issues);
    let upstreams: Vec<UpstreamConfig> =
        file.upstreams.iter().filter_map(|(name, section)| upstreams::upstream(name, section, &mut issues)).collect();
    let errors = errors::shape("errors", file.errors.as_ref(), &ErrorShape::default(), &mut issues).map(Arc::new);
    let routes = routes::routes(&file, errors.as_deref().unwrap_or(&ErrorShape::default()), &mut issues);
    let telemetry = match &file.telemetry {
        None => Some(None),
        Some(section) => telemetry::telemetry(section, env, &mut issues).map(Some),
    };
    match (server, store, errors, telemetry, issues.0.is_empty()) {
        (Some(server), Some(store), Some(errors), Some(telemetry), true) => Ok(Config {
            server,
            store,
            upstreams,
            routes,
            errors,
            telemetry,
            warnings: Vec::new(),
            lines: Default::default(),
        }),
        _ => Err(issues.0),
    }
}

/// The route-name rules, which an identity's name follows too.
pub(super) fn valid_route_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

pub(super) fn header_name(issues: &mut Issues, key: &str, name: &str) -> Option<HeaderName> {
    issues
        .check(key, HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a valid header name")))
}

pub(super) fn positive_duration(
    issues: &mut Issues,
    key: &str,
    value: Option<HumanDuration>,
    default: Duration,
) -> Duration {
    let d = value.map_or(default, |d| d.0);
    if d.is_zero() {
        issues.add(key, "must be longer than 0");
    }
    d
}

pub(super) fn positive_size(issues: &mut Issues, key: &str, value: Option<HumanSize>, default: u64) -> u64 {
    let n = value.map_or(default, |s| s.0);
    if n == 0 {
        issues.add(key, "must be larger than 0");
    }
    n
}

pub(super) fn body_limit(issues: &mut Issues, key: &str, value: Option<HumanSize>, default: u64) -> Option<usize> {
    let n = positive_size(issues, key, value, default);
    // Bodies are held in memory whole; anything above 1 GiB is a typo, not a plan.
    if n > 1 << 30 {
        issues.add(key, "must be at most 1GiB");
        return None;
    }
    usize::try_from(n).ok()
}

/// Settings that are valid but undermine the guarantee, as warnings for `check` and startup.
///
/// - Without renewal, a lease shorter than the upstream's timeout passes while a slow request
///   still runs; a retry then takes the key over and runs the request a second time.
/// - A lease shorter than three store timeouts leaves too little room for renewals, which are
///   store calls too, to land before it passes.
/// - A shutdown grace period longer than a lease: see the message.
/// - A route that holds unknown outcomes without a lookup, or a lookup with `{key}` in its
///   path.
/// - Unsafe requests on a keyed path that another host's or method's route takes without
///   enforcing ([`fallthrough`]).
/// - An upstream whose `connect_timeout` is not shorter than its `timeout`: see the message.
pub(super) fn warnings(config: &Config) -> Vec<Issue> {
    let mut out = Issues::default();
    for upstream in config.upstreams.iter().filter(|u| u.connect_timeout >= u.timeout) {
        out.add(
            format!("upstreams.{}.connect_timeout", upstream.name),
            format!(
                "{:?} is not shorter than timeout ({:?}): a connect that hangs takes the request's whole timeout, \
                 and the request fails unsent instead of going to another instance; set connect_timeout well \
                 below timeout",
                upstream.connect_timeout, upstream.timeout
            ),
        );
    }
    for token in &config.server.access.tokens {
        if token.secret != crate::config::defaults::SAMPLE_ADMIN_TOKEN {
            continue;
        }
        let key = if config.server.admin_token.is_some() && token.name == crate::config::defaults::ADMIN_TOKEN_NAME {
            "server.admin_token".to_owned()
        } else {
            format!("server.admin_tokens ({:?})", token.name)
        };
        out.add(
            key,
            "is the sample value from gateway.toml, which anyone can read: whoever reaches the admin listener \
             can resolve and release keys; set a random token of your own (e.g. openssl rand -hex 32)",
        );
    }
    if let Some(admin) = config.server.admin_listen
        && !admin.ip().is_loopback()
    {
        out.add(
            "server.admin_listen",
            format!("{admin} is not a loopback address: keep the admin listener (metrics, key release) off networks clients reach"),
        );
        if config.server.admin_tls.is_none() && !config.server.access.tokens.is_empty() {
            out.add(
                "server.admin_tls",
                format!(
                    "is not set while the admin listener ({admin}) is reachable beyond this host: admin tokens, \
                     typed into the console or sent by scripts, cross the network in clear; give it a \
                     certificate ([server.admin_tls]) or keep it on loopback"
                ),
            );
        }
    }
    for (i, route) in config.routes.iter().enumerate() {
        let Some(policy) = &route.idempotency else { continue };
        if policy.mode == crate::policy::Mode::Observe && config.server.admin_listen.is_none() {
            out.add(
                format!("routes[{i}].idempotency.mode"),
                "\"observe\" counts what enforcing would do in metrics the admin listener serves, and there \
                 is none: set server.admin_listen to read them (/metrics, idemgate report)",
            );
        }
        let key = format!("routes[{i}].idempotency.lease");
        let upstream = config.upstreams.iter().find(|u| u.name == route.upstream);
        if let Some(upstream) = upstream.filter(|u| !policy.renew && policy.lease < u.timeout) {
            out.add(
                &key,
                format!(
                    "{:?} is shorter than upstreams.{}.timeout ({:?}) and renew = false: a request slower \
                     than the lease can be taken over and run a second time",
                    policy.lease, upstream.name, upstream.timeout
                ),
            );
        }
        if config.server.shutdown_grace > policy.lease {
            out.add(
                "server.shutdown_grace",
                format!(
                    "{:?} is longer than routes[{i}] ({:?}).idempotency.lease ({:?}): a gateway killed before \
                     its grace period ends leaves its running requests' keys claimed, to be taken over and run \
                     again once the lease passes; keep shutdown_grace shorter than the shortest lease",
                    config.server.shutdown_grace, route.name, policy.lease
                ),
            );
        }
        match &policy.reconcile {
            None if policy.on_unknown_outcome == crate::policy::UnknownOutcomePolicy::Hold => out.add(
                format!("routes[{i}].idempotency"),
                "holds unknown outcomes without [routes.idempotency.reconcile]: a key whose answer was lost \
                 answers 502 outcome-unknown until it expires or an operator settles it; add a lookup the \
                 upstream answers",
            ),
            Some(reconcile) if reconcile.path.key_in_path() => out.add(
                format!("routes[{i}].idempotency.reconcile.path"),
                format!(
                    "{:?} puts {{key}} in the path: an upstream behind a proxy that decodes %2F or %2E could \
                     be misled by a hostile key; prefer the key header (always sent) or the query",
                    reconcile.path.to_string()
                ),
            ),
            _ => {}
        }
        if let Some(status) = policy.reconcile.as_ref().and_then(|r| r.answer_status)
            && crate::headers::has_no_body(status)
        {
            out.add(
                format!("routes[{i}].idempotency.reconcile.answer_status"),
                format!(
                    "{} has no body: a found answer is replayed with its headers only, without the lookup's \
                     body and without a Content-Length, so clients never see what the lookup said",
                    status.as_u16()
                ),
            );
        }
        if policy.lease < config.store.timeout * 3 {
            out.add(
                &key,
                format!(
                    "{:?} is less than 3 × store.timeout ({:?}): renewals may not land before it passes",
                    policy.lease, config.store.timeout
                ),
            );
        }
    }
    replica_warnings(config, &mut out);
    fallthrough::warnings(config, &mut out);
    out.0
}

/// `replica_ack_timeout` without `replica_acks`, and a wait for replicas that a lease may not
/// outlast: the claim's lease runs while its replicas are awaited, and its first renewal comes
/// a third of a lease after the claim returns.
fn replica_warnings(config: &Config, out: &mut Issues) {
    let crate::config::StoreBackendConfig::Redis { replicas, url, .. } = &config.store.backend else { return };
    if replicas.count == 0 {
        if replicas.timeout != crate::config::defaults::REPLICA_ACK_TIMEOUT {
            out.add("store.replica_ack_timeout", "has no effect with replica_acks = 0 (no replica is waited for)");
        }
        return;
    }
    if matches!(crate::config::RedisTarget::parse(url), Ok(crate::config::RedisTarget::Single(_))) {
        out.add(
            "store.replica_acks",
            "the store is one server (redis://): its replicas keep what they acknowledged only if something \
             promotes one when that server fails (a managed service's failover behind the address); with \
             redis+sentinel:// or redis+cluster:// the gateway follows the promotion itself",
        );
    }
    for (i, route) in config.routes.iter().enumerate() {
        let Some(policy) = &route.idempotency else { continue };
        let waited = replicas.timeout + config.store.timeout;
        if waited * 3 > policy.lease * 2 {
            out.add(
                format!("routes[{i}].idempotency.lease"),
                format!(
                    "{:?} leaves too little room for store.replica_ack_timeout ({:?}) and store.timeout ({:?}): \
                     a claim waiting for its replicas may pass its lease before its first renewal, and a retry \
                     take it over; keep replica_ack_timeout + timeout under two thirds of the lease",
                    policy.lease, replicas.timeout, config.store.timeout
                ),
            );
        }
    }
}
