//! Configuration: `gateway.toml`, read once, validated in full, then immutable.
//!
//! This is where environment variables named by the file (`admin_token_env`) are read; the
//! log filter (`RUST_LOG`) is read by the binary, and nothing else reads the environment.
//!
//! Loading has three layers: [`file`] is the schema as written (serde, unknown keys denied),
//! [`units`] parses durations and sizes, and [`validate`] checks every value and builds the
//! runtime types the request path uses. Every error names the file, the key and the reason,
//! and validation reports all problems at once rather than the first one only. [`change`]
//! compares two valid configurations: what the next one does to the records the running one
//! made.

mod admin;
pub mod change;
mod defaults;
mod file;
mod known;
pub mod reach;
mod redis_url;
mod source;
mod store;
mod tls;
mod units;
mod validate;
mod words;

pub use self::admin::{AdminAccess, AdminRole, AdminToken, AuditRetention};
pub use self::redis_url::{Address, Auth, Target as RedisTarget};
pub use self::store::{RedisTls, ReplicaAcks, StoreBackendConfig, StoreConfig};
pub use self::tls::{HostCert, ListenerTls, Served, TlsError};

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Uri};
use thiserror::Error;

use crate::forwarded::TrustedProxies;
pub use crate::host::HostPattern;
use crate::policy::IdempotencyPolicy;
use crate::policy::errors::ErrorShape;

/// The validated configuration of one gateway process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listeners and process-wide settings.
    pub server: ServerConfig,
    /// The record store.
    pub store: StoreConfig,
    /// Upstream services, by name.
    pub upstreams: Vec<UpstreamConfig>,
    /// Routes, in file order.
    pub routes: Vec<RouteConfig>,
    /// How the gateway's errors look before a route matched (`[errors]`).
    pub errors: Arc<ErrorShape>,
    /// Trace export (`[telemetry]`); `None`: off.
    pub telemetry: Option<TelemetryConfig>,
    /// Settings that are valid but risky, each with its reason (printed by `check`, logged at
    /// startup).
    pub warnings: Vec<Issue>,
    /// Where the file has each key: for [`Config::sets`] and [`Config::warning_line`].
    lines: Arc<source::Lines>,
}

/// `[server]`
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener, if any.
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token for the admin key endpoints (`admin_token`, `admin_token_env`); they are
    /// disabled without any token.
    pub admin_token: Option<String>,
    /// Who may call the admin API and what the audit trail keeps: applied by a reload.
    pub access: AdminAccess,
    /// Drain period on SIGTERM.
    pub shutdown_grace: Duration,
    /// Prefix of problem+json `type` URIs.
    pub problem_base: String,
    /// Runtime worker threads; `None` is one per CPU.
    pub worker_threads: Option<usize>,
    /// Connection and request limits.
    pub limits: Limits,
    /// Peers whose forwarding headers are believed.
    pub trusted_proxies: TrustedProxies,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// TLS on the proxy listener: certificate chain and key files.
    pub tls: Option<ListenerTls>,
    /// TLS on the admin listener: its own certificate chain and key files.
    pub admin_tls: Option<ListenerTls>,
}

/// How log lines are written (`server.log_format`, `--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Text for people (coloured on a terminal).
    #[default]
    Pretty,
}

impl LogFormat {
    /// Parses `"json"` or `"pretty"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "json" => Ok(Self::Json),
            "pretty" => Ok(Self::Pretty),
            other => Err(format!("{other:?} is neither \"json\" nor \"pretty\"")),
        }
    }
}

/// What one client, or all of them, may hold of the gateway (`[server]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Deadline of a request head, from its first byte (or from the connection's start).
    pub header_read_timeout: Duration,
    /// Deadline of an idempotent route's whole request body.
    pub body_read_timeout: Duration,
    /// How long a connection may wait without a request.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections the admin listener serves at once.
    pub admin_max_connections: usize,
    /// Largest request head, in bytes.
    pub max_header_bytes: usize,
    /// Upstream exchanges running at once, in all.
    pub max_exchanges: usize,
    /// Upstream exchanges running at once for one connection.
    pub max_exchanges_per_connection: usize,
    /// Abandoned requests per connection before it is closed.
    pub max_reset_streams: usize,
    /// HTTP/2 keep-alive ping interval, if any.
    pub h2_keepalive_interval: Option<Duration>,
}

#[cfg(test)]
impl Limits {
    /// Small limits for unit tests of connections: a 60 s idle timeout, two exchanges per
    /// connection, three wasted requests, and the head deadline given.
    pub(crate) fn for_tests(header_read_timeout: Duration) -> Self {
        Self {
            header_read_timeout,
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10,
            admin_max_connections: 4,
            max_header_bytes: 1 << 16,
            max_exchanges: 10,
            max_exchanges_per_connection: 2,
            max_reset_streams: 3,
            h2_keepalive_interval: None,
        }
    }
}

/// A secret read from the environment: compared, used, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `[upstreams.NAME]`
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The table's name.
    pub name: String,
    /// Base URLs, one per instance (at least one): scheme, authority and an optional path
    /// prefix, the same scheme and prefix for all.
    pub urls: Vec<Uri>,
    /// With one URL whose host is a name: look it up again this often, each address an
    /// instance.
    pub resolve_every: Option<Duration>,
    /// When an instance that keeps failing is left out of the balance.
    pub ejection: Ejection,
    /// Deadline of one upstream exchange.
    pub timeout: Duration,
    /// Deadline of establishing a connection.
    pub connect_timeout: Duration,
    /// CA bundle replacing the system roots for https.
    pub ca_file: Option<PathBuf>,
}

/// When an instance of an upstream that keeps failing is left out of the balance, and for
/// how long (`eject_after`, `eject_after_broken`, `eject_after_gateway_errors`, `eject_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Connect failures running that leave an instance out.
    pub after: u32,
    /// Exchanges running that broke before any answer that leave an instance out; 0: never.
    pub after_broken: u32,
    /// 502, 503 and 504 answers running that leave an instance out; 0: never.
    pub after_gateway_errors: u32,
    /// The first time it is left out.
    pub base: Duration,
    /// The longest.
    pub max: Duration,
}

/// Most instances one upstream takes, listed or resolved.
pub(crate) const MAX_INSTANCES: usize = defaults::MAX_INSTANCES;

/// When an instance is left out, as an `[upstreams.NAME]` without `eject_*` says.
pub(crate) fn default_ejection() -> Ejection {
    Ejection {
        after: defaults::EJECT_AFTER,
        after_broken: defaults::EJECT_AFTER_BROKEN,
        after_gateway_errors: defaults::EJECT_AFTER_GATEWAY_ERRORS,
        base: defaults::EJECT_FOR,
        max: defaults::EJECT_MAX,
    }
}

/// `[[routes]]`
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Unique route name.
    pub name: String,
    /// Hosts served; empty serves every host.
    pub hosts: Vec<HostPattern>,
    /// Methods matched; `None` matches every method.
    pub methods: Option<Vec<Method>>,
    /// Path pattern in matchit syntax.
    pub path: String,
    /// Name of the upstream.
    pub upstream: String,
    /// The idempotency policy; `None` makes the route a plain streaming proxy.
    pub idempotency: Option<Arc<IdempotencyPolicy>>,
    /// How the gateway's errors look on this route (`[errors]` with `[routes.errors]` over it).
    pub errors: Arc<ErrorShape>,
}

/// `[telemetry]`: spans exported over OTLP/HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's traces URL (`.../v1/traces`).
    pub traces_url: Uri,
    /// `service.name`.
    pub service_name: String,
    /// The share of requests traced when the client's sampling decision is not believed.
    pub sample_ratio: f64,
    /// A header sent to the collector (from `headers_env`).
    pub header: Option<(http::HeaderName, Secret)>,
    /// A CA bundle for the collector.
    pub ca_file: Option<PathBuf>,
}

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML; nothing after the error can be read.
    #[error("{file}:{}: {message}", Position(*position))]
    Syntax {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
        /// 1-based line and column, when known.
        position: Option<(usize, usize)>,
    },
    /// The file is TOML, but keys or values are wrong: every problem found, in file order.
    #[error("{}", Problems { file, issues })]
    Invalid {
        /// The file.
        file: String,
        /// Every problem found.
        issues: Vec<Issue>,
    },
}

struct Position(Option<(usize, usize)>);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((line, column)) => write!(f, "{line}:{column}"),
            None => Ok(()),
        }
    }
}

/// One problem: the dotted key, what is wrong with it, and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Dotted path such as `routes[0].idempotency.lease`.
    pub key: String,
    /// What is wrong, in words.
    pub reason: String,
    /// 1-based line of the key (or of its table, when the key is missing).
    pub line: Option<usize>,
    /// The name the file gives the route the key is in, if it is in one.
    pub route: Option<String>,
}

impl Issue {
    /// The key as people read it: a route's by its name as well as its place,
    /// `routes[0] ("create-order").hosts`.
    pub fn shown_key(&self) -> String {
        match (&self.route, self.key.strip_prefix("routes[").and_then(|rest| rest.split_once(']'))) {
            (Some(name), Some((index, rest))) => format!("routes[{index}] ({name:?}){rest}"),
            _ => self.key.clone(),
        }
    }
}

/// A warning as `FILE:LINE: warning: KEY: REASON` (`FILE: warning: ...` without a line).
fn warning_line(origin: &str, w: &Issue) -> String {
    match w.line {
        Some(line) => format!("{origin}:{line}: warning: {}: {}", w.shown_key(), w.reason),
        None => format!("{origin}: warning: {}: {}", w.shown_key(), w.reason),
    }
}

/// Issues printed one per line, compiler style: `FILE:LINE: KEY: REASON`.
struct Problems<'a> {
    file: &'a str,
    issues: &'a [Issue],
}

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |f: &mut fmt::Formatter<'_>, issue: &Issue| match issue.line {
            Some(line) => write!(f, "{}:{line}: {}: {}", self.file, issue.shown_key(), issue.reason),
            None => write!(f, "{}: {}: {}", self.file, issue.shown_key(), issue.reason),
        };
        match self.issues {
            [issue] => one(f, issue),
            many => {
                write!(f, "{}: {} problems", self.file, many.len())?;
                for issue in many {
                    f.write_str("\n  ")?;
                    one(f, issue)?;
                }
                Ok(())
            }
        }
    }
}

impl Config {
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { file: file.clone(), source })?;
        Self::from_toml(&text, &file)
    }

    /// Validates TOML text; `origin` names it in errors (a file path, or e.g. `"<test>"`).
    /// Every problem is reported: unknown keys, wrongly typed values and invalid values alike.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(text, origin, &|name| std::env::var(name).ok())
    }

    /// Like [`Config::from_toml`], with `env` standing in for the process environment (the
    /// secrets a file names by variable).
    pub fn from_toml_with_env(
        text: &str,
        origin: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let read = source::read(text).map_err(|e| ConfigError::Syntax {
            file: origin.to_owned(),
            message: e.message,
            position: e.position,
        })?;
        let mut issues = read.issues;
        // Each issue on its line, with the name of its route.
        let located = |i: Issue| Issue { line: read.lines.line_of(&i.key), route: read.lines.route_of(&i.key), ..i };
        let config = match read.file {
            Some(file) => match validate::build(file, env) {
                Ok(mut config) => {
                    config.warnings = validate::warnings(&config).into_iter().map(located).collect();
                    Some(config)
                }
                Err(found) => {
                    issues.extend(found.into_iter().map(located));
                    None
                }
            },
            None => None,
        };
        match config {
            Some(config) if issues.is_empty() => Ok(Self { lines: Arc::new(read.lines), ..config }),
            _ => {
                issues.sort_by_key(|i| i.line.unwrap_or(usize::MAX));
                Err(ConfigError::Invalid { file: origin.to_owned(), issues })
            }
        }
    }

    /// The warnings, one per line as `FILE:LINE: warning: KEY: REASON`.
    pub fn warning_lines(&self, origin: &str) -> Vec<String> {
        self.warnings.iter().map(|w| warning_line(origin, w)).collect()
    }

    /// A warning about `key` that only the machine tells (the descriptor limit, say), as
    /// [`Config::warning_lines`] prints them: on the key's line, or its table's.
    pub fn warning_line(&self, origin: &str, key: &str, reason: &str) -> String {
        let (line, route) = (self.lines.line_of(key), self.lines.route_of(key));
        warning_line(origin, &Issue { key: key.to_owned(), reason: reason.to_owned(), line, route })
    }

    /// Whether the file sets `key` (a dotted path, `server.max_connections`), rather than
    /// leaving it to its default.
    pub fn sets(&self, key: &str) -> bool {
        self.lines.has(key)
    }

    /// The route named `name`, if any.
    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }
}
