//! Configuration: `gateway.toml`, read once, validated in full, then immutable.
//!
//! Loading has three layers: [`file`] is the schema as written (serde, unknown keys denied),
//! [`units`] parses durations and sizes, and [`validate`] checks every value and builds the
//! runtime types the request path uses. Every error names the file, the key and the reason,
//! and validation reports all problems at once rather than the first one only.

mod file;
mod units;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Uri};
use thiserror::Error;

use crate::policy::IdempotencyPolicy;

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
}

/// `[server]`
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener, if any.
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token for the admin key endpoints; they are disabled without one.
    pub admin_token: Option<String>,
    /// Drain period on SIGTERM.
    pub shutdown_grace: Duration,
    /// Prefix of problem+json `type` URIs.
    pub problem_base: String,
    /// Runtime worker threads; `None` is one per CPU.
    pub worker_threads: Option<usize>,
}

/// `[store]`
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Which backend, with its own settings.
    pub backend: StoreBackendConfig,
    /// Deadline of one store call.
    pub timeout: Duration,
    /// Prefix of record key names.
    pub key_prefix: String,
}

/// The backend-specific part of `[store]`.
#[derive(Debug, Clone)]
pub enum StoreBackendConfig {
    /// Redis, shared by every gateway instance.
    Redis {
        /// Connection URL.
        url: String,
        /// Multiplexed connections.
        connections: usize,
    },
    /// In-process memory, for one instance.
    Memory {
        /// Maximum records.
        max_entries: usize,
        /// Maximum stored bytes.
        max_bytes: u64,
    },
}

/// `[upstreams.NAME]`
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The table's name.
    pub name: String,
    /// Base URL: scheme, authority and an optional path prefix.
    pub url: Uri,
    /// Deadline of one upstream exchange.
    pub timeout: Duration,
    /// Deadline of establishing a connection.
    pub connect_timeout: Duration,
    /// CA bundle replacing the system roots for https.
    pub ca_file: Option<PathBuf>,
}

/// `[[routes]]`
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Unique route name.
    pub name: String,
    /// Methods matched; `None` matches every method.
    pub methods: Option<Vec<Method>>,
    /// Path pattern in matchit syntax.
    pub path: String,
    /// Name of the upstream.
    pub upstream: String,
    /// The idempotency policy; `None` makes the route a plain streaming proxy.
    pub idempotency: Option<Arc<IdempotencyPolicy>>,
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
    /// The file is not valid TOML, or a value has the wrong type, or a key is unknown.
    #[error("{file}: {key}{message}{location}", key = key_prefix(key))]
    Syntax {
        /// The file.
        file: String,
        /// Dotted path of the key, when known.
        key: Option<String>,
        /// What is wrong.
        message: String,
        /// Line and column, when known.
        location: Location,
    },
    /// The file parsed, but values are wrong.
    #[error("{file}: {}", Problems(issues))]
    Invalid {
        /// The file.
        file: String,
        /// Every problem found.
        issues: Vec<Issue>,
    },
}

/// A line/column position in the file, printed as ` (line L, column C)` when known.
#[derive(Debug, Default)]
pub struct Location(Option<(usize, usize)>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((line, column)) => write!(f, " (line {line}, column {column})"),
            None => Ok(()),
        }
    }
}

fn key_prefix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default()
}

/// One invalid value: the dotted key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Dotted path such as `routes[0].idempotency.lease`.
    pub key: String,
    /// What is wrong, in words.
    pub reason: String,
}

struct Problems<'a>(&'a [Issue]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "{}: {}", one.key, one.reason),
            many => {
                write!(f, "{} problems", many.len())?;
                for issue in many {
                    write!(f, "\n  {}: {}", issue.key, issue.reason)?;
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
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let parsed = parse(text, origin)?;
        validate::build(parsed).map_err(|issues| ConfigError::Invalid { file: origin.to_owned(), issues })
    }

    /// The route named `name`, if any.
    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }
}

fn parse(text: &str, origin: &str) -> Result<file::File, ConfigError> {
    let syntax_error = |key: Option<String>, err: &toml::de::Error| ConfigError::Syntax {
        file: origin.to_owned(),
        key,
        message: err.message().trim().to_owned(),
        location: Location(err.span().map(|span| line_column(text, span.start))),
    };
    let deserializer = toml::Deserializer::parse(text).map_err(|e| syntax_error(None, &e))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let key = e.path().to_string();
        let key = (key != ".").then_some(key);
        syntax_error(key, e.inner())
    })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
