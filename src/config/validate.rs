//! Checks every value of a parsed file and builds the runtime [`Config`].
//!
//! Problems are collected, not returned at the first one: an operator fixing a file should
//! see everything that is wrong with it in one run of `idemgate check`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, Uri};

use super::file::{self, File, IdempotencySection, OneOrMany, StatusEntry};
use super::units::{HumanDuration, HumanSize};
use super::{
    Config, Issue, Limits, ListenerTls, LogFormat, RedisTls, RouteConfig, Secret, ServerConfig, StoreBackendConfig,
    StoreConfig, UpstreamConfig,
};
use crate::forwarded::TrustedProxies;
use crate::headers::{self, StoredHeaders};
use crate::idempotent::fingerprint::{FingerprintSpec, JsonPointer};
use crate::idempotent::policy::{IdempotencyPolicy, Quota, StatusSet, StoreFailurePolicy, UnknownOutcomePolicy};
use crate::idempotent::scope::{MissingScope, ScopeSource};
use crate::router::{RouteSpec, Router, RouterError};
use crate::store::RedisTarget as Target;

/// Defaults, in one place so that docs/configuration.md can be checked against them.
pub mod defaults {
    use std::time::Duration;

    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);
    pub const LOG_FORMAT: &str = "pretty";
    pub const ON_STORE_ERROR: &str = "fail-closed";
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    pub const MAX_CONNECTIONS: usize = 10_000;
    pub const MAX_HEADER_BYTES: u64 = 64 << 10;
    pub const MAX_EXCHANGES: usize = 4096;
    pub const MAX_EXCHANGES_PER_CONNECTION: usize = 100;
    pub const MAX_RESET_STREAMS: usize = 100;
    pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
    pub const PROBLEM_BASE: &str = "https://github.com/idemgate/idemgate/blob/main/docs/errors.md#";
    pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);
    /// One multiplexed connection pipelines every concurrent call into shared writes; more
    /// split those batches (more syscalls on both ends) and add no parallelism to a Redis
    /// that runs commands on one thread.
    pub const CONNECTIONS: usize = 1;
    pub const KEY_PREFIX: &str = "idemgate";
    pub const MAX_ENTRIES: usize = 100_000;
    pub const MAX_BYTES: u64 = 256 << 20;
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    pub const KEY_HEADER: &str = "idempotency-key";
    pub const MAX_KEY_LEN: usize = 255;
    pub const SCOPE: &str = "header:Authorization";
    pub const LEASE: Duration = Duration::from_secs(10);
    pub const WAIT: Duration = Duration::from_secs(5);
    pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
    /// What began executing: 2xx, 3xx and 4xx, except the 4xx that mean "not processed" or
    /// "try again" (docs/idempotency-policy.md explains each).
    pub const STORE_STATUSES: &[&str] = &["2xx", "3xx", "4xx", "!400", "!408", "!409", "!422", "!425", "!429"];
    pub const ON_MISSING_SCOPE: &str = "reject";
    pub const ON_UNKNOWN_OUTCOME: &str = "hold";
    pub const ATTEMPT_HEADER: &str = "idempotency-attempt";
    pub const MAX_REQUEST_BODY: u64 = 1 << 20;
    pub const MAX_STORED_BODY: u64 = 1 << 20;
    pub const REPLAY_HEADER: &str = "idempotent-replay";
}

/// Longest key anyone could reasonably need; bounds the work done per key.
const MAX_KEY_LEN_LIMIT: usize = 8192;

#[derive(Default)]
struct Issues(Vec<Issue>);

impl Issues {
    fn add(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(Issue { key: key.into(), reason: reason.into(), line: None });
    }

    /// Records the error of `result` under `key` and passes the value on.
    fn check<T>(&mut self, key: &str, result: Result<T, String>) -> Option<T> {
        result.map_err(|reason| self.add(key, reason)).ok()
    }
}

/// Builds the runtime config; `env` looks up environment variables (the secrets a file may
/// name instead of holding).
pub(super) fn build(file: File, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<Issue>> {
    let mut issues = Issues::default();
    let server = server(&file.server, env, &mut issues);
    let store = store(&file.store, env, &mut issues);
    let upstreams: Vec<UpstreamConfig> =
        file.upstreams.iter().filter_map(|(name, section)| upstream(name, section, &mut issues)).collect();
    let routes = routes(&file, &mut issues);
    match (server, store, issues.0.is_empty()) {
        (Some(server), Some(store), true) => Ok(Config { server, store, upstreams, routes, warnings: Vec::new() }),
        _ => Err(issues.0),
    }
}

fn server(s: &file::ServerSection, env: &dyn Fn(&str) -> Option<String>, issues: &mut Issues) -> Option<ServerConfig> {
    let listen = issues.check("server.listen", socket_addr(&s.listen));
    let admin_listen = s.admin_listen.as_ref().and_then(|a| issues.check("server.admin_listen", socket_addr(a)));
    if let (Some(l), Some(a)) = (listen, admin_listen)
        && l == a
        && l.port() != 0
    {
        issues.add("server.admin_listen", "must differ from server.listen");
    }
    let admin_token = match (&s.admin_token, &s.admin_token_env) {
        (Some(_), Some(_)) => {
            issues.add("server.admin_token_env", "give admin_token or admin_token_env, not both");
            None
        }
        (Some(token), None) => Some((token.clone(), "server.admin_token")),
        (None, Some(var)) => match env(var) {
            Some(token) => Some((token, "server.admin_token_env")),
            None => {
                issues.add("server.admin_token_env", format!("the environment variable {var:?} is not set"));
                None
            }
        },
        (None, None) => None,
    };
    if let Some((token, key)) = &admin_token
        && token.trim().len() < 16
    {
        issues.add(*key, "the token must be at least 16 characters (it guards key purges)");
    }
    let admin_token = admin_token.map(|(token, _)| token);
    let problem_base = s.problem_base.clone().unwrap_or_else(|| defaults::PROBLEM_BASE.to_owned());
    if problem_base.parse::<Uri>().map_or(true, |u| u.scheme().is_none()) {
        issues.add("server.problem_base", format!("{problem_base:?} is not an absolute URI"));
    }
    if s.worker_threads.is_some_and(|n| !(1..=1024).contains(&n)) {
        issues.add("server.worker_threads", "must be between 1 and 1024");
    }
    let limits = limits(s, issues);
    let trusted_proxies =
        issues.check("server.trusted_proxies", TrustedProxies::parse(s.trusted_proxies.as_deref().unwrap_or_default()));
    let log_format =
        issues.check("server.log_format", LogFormat::parse(s.log_format.as_deref().unwrap_or(defaults::LOG_FORMAT)));
    let tls = s.tls.as_ref().and_then(|t| {
        let tls = ListenerTls { cert: t.cert.clone(), key: t.key.clone() };
        issues.check("server.tls", crate::tls::acceptor(&tls).map(|_| tls).map_err(|e| e.to_string()))
    });
    Some(ServerConfig {
        tls,
        log_format: log_format?,
        worker_threads: s.worker_threads,
        listen: listen?,
        admin_listen,
        admin_token,
        shutdown_grace: s.shutdown_grace.map_or(defaults::SHUTDOWN_GRACE, |d| d.0),
        problem_base,
        limits: limits?,
        trusted_proxies: trusted_proxies?,
    })
}

fn limits(s: &file::ServerSection, issues: &mut Issues) -> Option<Limits> {
    let count = |issues: &mut Issues, key: &str, value: Option<usize>, default: usize, max: usize| {
        let n = value.unwrap_or(default);
        if !(1..=max).contains(&n) {
            issues.add(format!("server.{key}"), format!("must be between 1 and {max}"));
        }
        n
    };
    let header_read_timeout =
        positive_duration(issues, "server.header_read_timeout", s.header_read_timeout, defaults::HEADER_READ_TIMEOUT);
    let max_header_bytes =
        positive_size(issues, "server.max_header_bytes", s.max_header_bytes, defaults::MAX_HEADER_BYTES);
    // hyper reads a head into a buffer of at least 8 KiB; a smaller limit cannot be kept.
    if !(8 << 10..=1 << 20).contains(&max_header_bytes) {
        issues.add("server.max_header_bytes", "must be between 8KiB and 1MiB");
    }
    Some(Limits {
        header_read_timeout,
        body_read_timeout: positive_duration(
            issues,
            "server.body_read_timeout",
            s.body_read_timeout,
            defaults::BODY_READ_TIMEOUT,
        ),
        idle_timeout: positive_duration(issues, "server.idle_timeout", s.idle_timeout, defaults::IDLE_TIMEOUT),
        max_connections: count(issues, "max_connections", s.max_connections, defaults::MAX_CONNECTIONS, 1 << 20),
        max_header_bytes: usize::try_from(max_header_bytes).ok()?,
        max_exchanges: count(issues, "max_exchanges", s.max_exchanges, defaults::MAX_EXCHANGES, 1 << 20),
        max_exchanges_per_connection: count(
            issues,
            "max_exchanges_per_connection",
            s.max_exchanges_per_connection,
            defaults::MAX_EXCHANGES_PER_CONNECTION,
            1 << 16,
        ),
        max_reset_streams: count(
            issues,
            "max_reset_streams",
            s.max_reset_streams,
            defaults::MAX_RESET_STREAMS,
            1 << 20,
        ),
        h2_keepalive_interval: Some(s.h2_keepalive_interval.map_or(defaults::H2_KEEPALIVE_INTERVAL, |d| d.0))
            .filter(|d| !d.is_zero()),
    })
}

fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an IP address with a port, like \"0.0.0.0:8080\""))
}

fn store(s: &file::StoreSection, env: &dyn Fn(&str) -> Option<String>, issues: &mut Issues) -> Option<StoreConfig> {
    let mut cluster = false;
    let backend = match s.backend.as_str() {
        "redis" => {
            for (set, key) in [(s.max_entries.is_some(), "max_entries"), (s.max_bytes.is_some(), "max_bytes")] {
                if set {
                    issues.add(format!("store.{key}"), "applies to the memory backend only");
                }
            }
            // Parsing only; no connection is made here.
            let target = match &s.url {
                None => {
                    issues.add("store.url", "is required for the redis backend, e.g. \"redis://127.0.0.1:6379\"");
                    None
                }
                Some(url) => issues.check("store.url", Target::parse(url)),
            };
            let url = target.as_ref().and(s.url.clone());
            cluster = matches!(target, Some(Target::Cluster { .. }));
            let connections = s.connections.unwrap_or(defaults::CONNECTIONS);
            if !(1..=64).contains(&connections) {
                issues.add("store.connections", "must be between 1 and 64");
            }
            let tls = redis_tls(s, target.as_ref(), issues);
            let password = match &s.password_env {
                None => Some(None),
                Some(var) => match env(var) {
                    Some(password) => Some(Some(Secret(password))),
                    None => {
                        issues.add("store.password_env", format!("the environment variable {var:?} is not set"));
                        None
                    }
                },
            };
            match (url, password) {
                (Some(url), Some(password)) => Some(StoreBackendConfig::Redis { url, connections, tls, password }),
                _ => None,
            }
        }
        "memory" => {
            for (set, key) in [
                (s.url.is_some(), "url"),
                (s.connections.is_some(), "connections"),
                (s.ca_file.is_some(), "ca_file"),
                (s.cert_file.is_some(), "cert_file"),
                (s.key_file.is_some(), "key_file"),
                (s.password_env.is_some(), "password_env"),
            ] {
                if set {
                    issues.add(format!("store.{key}"), "applies to the redis backend only");
                }
            }
            let max_entries = s.max_entries.unwrap_or(defaults::MAX_ENTRIES);
            if max_entries == 0 {
                issues.add("store.max_entries", "must be at least 1");
            }
            let max_bytes = positive_size(issues, "store.max_bytes", s.max_bytes, defaults::MAX_BYTES);
            Some(StoreBackendConfig::Memory { max_entries, max_bytes })
        }
        other => {
            issues.add("store.backend", format!("{other:?} is neither \"redis\" nor \"memory\""));
            None
        }
    };
    let timeout = positive_duration(issues, "store.timeout", s.timeout, defaults::STORE_TIMEOUT);
    let key_prefix = s.key_prefix.clone().unwrap_or_else(|| defaults::KEY_PREFIX.to_owned());
    if key_prefix.is_empty() || !key_prefix.bytes().all(|b| b.is_ascii_graphic()) {
        issues.add("store.key_prefix", "must be non-empty printable ASCII without spaces");
    } else if cluster && key_prefix.contains(['{', '}']) {
        // Redis hashes only the part between the first braces of a key: every record would
        // land in one slot, on one shard, and the cluster would not spread the load.
        issues.add(
            "store.key_prefix",
            "must not contain '{' or '}' with a Redis Cluster (a hash tag would put every record on one shard)",
        );
    }
    Some(StoreConfig { backend: backend?, timeout, key_prefix })
}

/// The TLS files of a TLS store (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`),
/// each checked readable.
fn redis_tls(s: &file::StoreSection, target: Option<&Target>, issues: &mut Issues) -> RedisTls {
    let mut readable = |key: &str, path: &Option<PathBuf>| -> Option<PathBuf> {
        let path = path.as_ref()?;
        if target.is_some_and(|t| !t.tls()) {
            issues.add(
                format!("store.{key}"),
                "applies to TLS URLs only (rediss://, rediss+sentinel://, rediss+cluster://)",
            );
            return None;
        }
        match std::fs::metadata(path) {
            Ok(_) => Some(path.clone()),
            Err(e) => {
                issues.add(format!("store.{key}"), format!("cannot read {}: {e}", path.display()));
                None
            }
        }
    };
    let ca_file = readable("ca_file", &s.ca_file);
    let cert = readable("cert_file", &s.cert_file);
    let key = readable("key_file", &s.key_file);
    let client = match (cert, key, &s.cert_file, &s.key_file) {
        (Some(cert), Some(key), _, _) => Some((cert, key)),
        (_, _, Some(_), None) => {
            issues.add("store.key_file", "is required with cert_file (mutual TLS needs both)");
            None
        }
        (_, _, None, Some(_)) => {
            issues.add("store.cert_file", "is required with key_file (mutual TLS needs both)");
            None
        }
        _ => None,
    };
    RedisTls { ca_file, client }
}

fn upstream(name: &str, s: &file::UpstreamSection, issues: &mut Issues) -> Option<UpstreamConfig> {
    let key = format!("upstreams.{name}");
    let url = issues.check(&format!("{key}.url"), upstream_url(&s.url));
    let timeout = positive_duration(issues, &format!("{key}.timeout"), s.timeout, defaults::UPSTREAM_TIMEOUT);
    let connect_timeout =
        positive_duration(issues, &format!("{key}.connect_timeout"), s.connect_timeout, defaults::CONNECT_TIMEOUT);
    if let Some(path) = &s.ca_file {
        if url.as_ref().is_some_and(|u| u.scheme_str() != Some("https")) {
            issues.add(format!("{key}.ca_file"), "applies to https:// upstreams only");
        } else if let Err(e) = std::fs::metadata(path) {
            issues.add(format!("{key}.ca_file"), format!("cannot read {}: {e}", path.display()));
        }
    }
    Some(UpstreamConfig { name: name.to_owned(), url: url?, timeout, connect_timeout, ca_file: s.ca_file.clone() })
}

fn upstream_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text.parse().map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{text:?} must start with http:// or https://")),
    }
    if uri.authority().is_none_or(|a| a.host().is_empty()) {
        return Err(format!("{text:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{text:?} must not have a query"));
    }
    Ok(uri)
}

fn routes(file: &File, issues: &mut Issues) -> Vec<RouteConfig> {
    if file.routes.is_empty() {
        issues.add("routes", "no [[routes]] are defined; the gateway would answer 404 to everything");
    }
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(file.routes.len());
    for (i, r) in file.routes.iter().enumerate() {
        let key = format!("routes[{i}]");
        if r.name.is_empty() || !r.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            issues.add(format!("{key}.name"), format!("{:?} must be non-empty and use only A-Z a-z 0-9 - _ .", r.name));
        } else if !names.insert(r.name.as_str()) {
            issues.add(format!("{key}.name"), format!("{:?} is used by an earlier route", r.name));
        }
        if !file.upstreams.contains_key(&r.upstream) {
            issues.add(format!("{key}.upstream"), format!("{:?} is not defined under [upstreams]", r.upstream));
        }
        let methods = r.methods.as_ref().map(|ms| methods(&format!("{key}.methods"), ms, issues));
        let idempotency = r.idempotency.as_ref().and_then(|s| policy(&format!("{key}.idempotency"), s, issues));
        out.push(RouteConfig {
            name: r.name.clone(),
            methods,
            path: r.path.clone(),
            upstream: r.upstream.clone(),
            idempotency: idempotency.map(Arc::new),
        });
    }
    let specs =
        out.iter().map(|r| RouteSpec { name: &r.name, pattern: &r.path, methods: r.methods.as_deref(), value: () });
    if let Err(e) = Router::new(specs) {
        let index = match &e {
            RouterError::Pattern { index, .. } | RouterError::Overlap { index, .. } => *index,
        };
        issues.add(format!("routes[{index}].path"), e.to_string());
    }
    out
}

fn methods(key: &str, names: &[String], issues: &mut Issues) -> Vec<Method> {
    if names.is_empty() {
        issues.add(key, "is empty; leave it out to match every method");
    }
    let mut out = Vec::new();
    for name in names {
        match Method::from_bytes(name.as_bytes()) {
            Ok(m) if name.bytes().all(|b| b.is_ascii_uppercase()) => {
                if out.contains(&m) {
                    issues.add(key, format!("{name:?} is listed twice"));
                }
                out.push(m);
            }
            _ => issues.add(key, format!("{name:?} is not an HTTP method in upper case, like \"POST\"")),
        }
    }
    out
}

fn policy(key: &str, s: &IdempotencySection, issues: &mut Issues) -> Option<IdempotencyPolicy> {
    let header = header_name(issues, &format!("{key}.header"), s.header.as_deref().unwrap_or(defaults::KEY_HEADER));
    if header.as_ref().is_some_and(headers::is_hop_by_hop) {
        issues.add(format!("{key}.header"), "a hop-by-hop header cannot carry the key");
    }
    let max_key_len = s.max_key_len.unwrap_or(defaults::MAX_KEY_LEN);
    if !(1..=MAX_KEY_LEN_LIMIT).contains(&max_key_len) {
        issues.add(format!("{key}.max_key_len"), format!("must be between 1 and {MAX_KEY_LEN_LIMIT}"));
    }
    let scope_entries = s.scope.as_ref().map_or_else(|| vec![defaults::SCOPE], OneOrMany::entries);
    let scope = issues.check(&format!("{key}.scope"), ScopeSource::parse(&scope_entries));
    let on_missing_scope = issues.check(
        &format!("{key}.on_missing_scope"),
        MissingScope::parse(s.on_missing_scope.as_deref().unwrap_or(defaults::ON_MISSING_SCOPE)),
    );
    let on_unknown_outcome = issues.check(
        &format!("{key}.on_unknown_outcome"),
        UnknownOutcomePolicy::parse(s.on_unknown_outcome.as_deref().unwrap_or(defaults::ON_UNKNOWN_OUTCOME)),
    );
    let attempt_header = match s.attempt_header.as_deref().unwrap_or(defaults::ATTEMPT_HEADER) {
        "" => Some(None),
        name => header_name(issues, &format!("{key}.attempt_header"), name).map(Some),
    };
    let ignore: Vec<JsonPointer> = s
        .ignore
        .iter()
        .flatten()
        .filter_map(|p| issues.check(&format!("{key}.ignore"), JsonPointer::parse(p)))
        .collect();
    let fingerprint_headers: Vec<HeaderName> = s
        .fingerprint_headers
        .iter()
        .flatten()
        .filter_map(|h| header_name(issues, &format!("{key}.fingerprint_headers"), h))
        .collect();
    let lease = positive_duration(issues, &format!("{key}.lease"), s.lease, defaults::LEASE);
    if lease < Duration::from_millis(10) {
        issues.add(format!("{key}.lease"), "must be at least 10ms");
    }
    let wait = s.wait.map_or(defaults::WAIT, |d| d.0);
    let retention = positive_duration(issues, &format!("{key}.retention"), s.retention, defaults::RETENTION);
    let store_statuses = statuses(&format!("{key}.store_statuses"), s.store_statuses.as_deref(), issues);
    let max_request_body =
        body_limit(issues, &format!("{key}.max_request_body"), s.max_request_body, defaults::MAX_REQUEST_BODY);
    let max_stored_body =
        body_limit(issues, &format!("{key}.max_stored_body"), s.max_stored_body, defaults::MAX_STORED_BODY);
    let exclude_headers: Vec<HeaderName> = s
        .exclude_headers
        .iter()
        .flatten()
        .filter_map(|h| header_name(issues, &format!("{key}.exclude_headers"), h))
        .collect();
    let max_new_keys = match &s.max_new_keys {
        None => Some(None),
        Some(text) => issues.check(&format!("{key}.max_new_keys"), Quota::parse(text)).map(Some),
    };
    let replay_headers: Option<Vec<HeaderName>> = s
        .replay_headers
        .as_ref()
        .map(|names| names.iter().filter_map(|h| header_name(issues, &format!("{key}.replay_headers"), h)).collect());
    let on_store_error = issues.check(
        &format!("{key}.on_store_error"),
        StoreFailurePolicy::parse(s.on_store_error.as_deref().unwrap_or(defaults::ON_STORE_ERROR)),
    );
    let replay_header = header_name(
        issues,
        &format!("{key}.replay_header"),
        s.replay_header.as_deref().unwrap_or(defaults::REPLAY_HEADER),
    );
    Some(IdempotencyPolicy {
        required: s.required.unwrap_or(true),
        header: header?,
        max_key_len,
        scope: scope?,
        on_missing_scope: on_missing_scope?,
        on_unknown_outcome: on_unknown_outcome?,
        attempt_header: attempt_header?,
        max_new_keys: max_new_keys?,
        fingerprint: FingerprintSpec { ignore, headers: fingerprint_headers },
        lease,
        renew: s.renew.unwrap_or(true),
        wait,
        retention,
        store_statuses: store_statuses?,
        max_request_body: max_request_body?,
        max_stored_body: max_stored_body?,
        stored_headers: StoredHeaders { allow: replay_headers, exclude: exclude_headers },
        on_store_error: on_store_error?,
        replay_header: replay_header?,
    })
}

fn statuses(key: &str, entries: Option<&[StatusEntry]>, issues: &mut Issues) -> Option<StatusSet> {
    let texts: Vec<String> = match entries {
        None => defaults::STORE_STATUSES.iter().map(|s| (*s).to_owned()).collect(),
        Some(entries) => entries
            .iter()
            .map(|entry| match entry {
                StatusEntry::Code(code) => code.to_string(),
                StatusEntry::Text(text) => text.clone(),
            })
            .collect(),
    };
    match StatusSet::from_entries(&texts) {
        Ok(set) => Some(set),
        Err(errors) => {
            for e in errors {
                issues.add(key, e);
            }
            None
        }
    }
}

fn header_name(issues: &mut Issues, key: &str, name: &str) -> Option<HeaderName> {
    issues
        .check(key, HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a valid header name")))
}

fn positive_duration(issues: &mut Issues, key: &str, value: Option<HumanDuration>, default: Duration) -> Duration {
    let d = value.map_or(default, |d| d.0);
    if d.is_zero() {
        issues.add(key, "must be longer than 0");
    }
    d
}

fn positive_size(issues: &mut Issues, key: &str, value: Option<HumanSize>, default: u64) -> u64 {
    let n = value.map_or(default, |s| s.0);
    if n == 0 {
        issues.add(key, "must be larger than 0");
    }
    n
}

fn body_limit(issues: &mut Issues, key: &str, value: Option<HumanSize>, default: u64) -> Option<usize> {
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
pub(super) fn warnings(config: &Config) -> Vec<Issue> {
    let mut out = Issues::default();
    if let Some(admin) = config.server.admin_listen
        && !admin.ip().is_loopback()
    {
        out.add(
            "server.admin_listen",
            format!("{admin} is not a loopback address: keep the admin listener (metrics, key release) off networks clients reach"),
        );
    }
    for (i, route) in config.routes.iter().enumerate() {
        let Some(policy) = &route.idempotency else { continue };
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
    out.0
}
