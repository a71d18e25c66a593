//! idemgate: an idempotency gateway.
//!
//! A reverse proxy that makes unsafe HTTP endpoints idempotent without changing them. The
//! first request with an `Idempotency-Key` runs upstream; every retry gets its stored
//! response back. See `docs/` for the policy, configuration and operations, and
//! `docs/architecture.md` for the request path and the state of a key, drawn.
//!
//! The modules, from the process down to what everything uses (arrows only point down this
//! list; `docs/architecture.md` draws the layers):
//!
//! - [`server`]: listeners, HTTP/1.1 + h2c (and TLS) connections, graceful shutdown;
//! - [`admin`]: the admin listener: health, readiness, metrics, `/keys`, `/routes`, `/reload`,
//!   the published policy;
//! - [`reload`]: a new configuration without a restart (SIGHUP, `POST /reload`);
//! - [`gateway`]: the routes and the runtime built from the config; the top of the request
//!   path: check, route, serve, count, log;
//! - [`idempotent`]: the idempotent path as named phases, one path for a route that enforces
//!   and one that observes: identify, claim, reconcile (asking the upstream what became of a
//!   lost answer), admit, the exchange (capture, settle), reply; each decision a table
//!   (`outcome`) with a column per mode;
//! - [`operator`]: what an operator does to held keys (inspect, release, resolve, list), the
//!   answer an operator gives, checked so that no answer can break a replay's framing, and the
//!   documents `/keys` answers with;
//! - [`proxy`]: streaming pass-through for routes without idempotency, and for what an
//!   idempotent route does not claim;
//! - [`upgrade`]: a protocol upgrade bridged byte for byte, within the idle limit;
//! - [`runtime`]: the handle the request path runs on (store, exchanges, limits, metrics),
//!   and the routes at run time;
//! - [`check`]: what a request must be before the gateway acts on it;
//! - [`access`]: one access log line per request;
//! - [`error`]: every error, and the one table that says how each is answered, counted and
//!   logged;
//! - [`telemetry`]: traces exported over OTLP, W3C trace context to the upstream;
//! - [`store`]: the state of every key, as six narrow roles (the key's lifecycle, lookups,
//!   records, the index of held records, an operator's calls, the quota), each handed out by
//!   the runtime to who holds it, on Redis with Lua or in memory;
//! - [`publish`]: the idempotency policy of every route, as Markdown and JSON;
//! - [`upstream`]: pooled http/https clients over one or several instances: balancing, passive
//!   health and ejection, dials bounded by the request's deadline, addresses looked up again,
//!   request preparation;
//! - [`connection`]: one client connection's limits: idle and head deadlines, exchanges,
//!   abandoned requests;
//! - [`descriptors`]: the listeners' connection caps, fitted into the process's
//!   descriptor limit with a reserve for the store and the upstreams;
//! - [`config`]: `gateway.toml`, validated into the types below;
//! - [`policy`]: a route's `[routes.idempotency]`, and the readings of a request it defines
//!   (key, scope, fingerprint);
//! - [`forwarded`], [`metrics`]: forwarding headers, Prometheus metrics;
//! - [`body`], [`headers`], [`host`], [`path`], [`router`], [`log_writer`], [`outbound`]:
//!   bodies and their bounds, header hygiene, the host a request names, path normalisation,
//!   host + method + path → route, the writer of log lines, the TLS and error chains of
//!   outgoing clients.
//!
//! The crate's surface is what the binary, the tests and the fuzz targets use: the
//! configuration, the policy, the store, an operator's answer, the descriptor budget, and
//! the server with its gateway.

pub mod config;
pub mod descriptors;
pub mod log_writer;
pub mod openapi;
pub mod operator;
pub mod outbound;
pub mod policy;
pub mod store;

mod access;
mod admin;
mod body;
mod check;
mod connection;
mod error;
mod forwarded;
mod gateway;
mod headers;
mod host;
mod idempotent;
mod metrics;
mod path;
mod proxy;
mod publish;
mod reload;
mod router;
mod runtime;
mod server;
mod telemetry;
mod upgrade;
mod upstream;

pub use gateway::{Gateway, SetupError};
pub use path::normalize as normalize_path;
pub use publish::markdown as policy_markdown;
pub use reload::{Live, ReloadError, Reloaded};
pub use runtime::Runtime;
pub use server::{ServeError, Server};
pub use upstream::{Upstream, UpstreamSetupError};
