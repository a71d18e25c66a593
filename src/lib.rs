//! idemgate: an idempotency gateway.
//!
//! A reverse proxy that makes unsafe HTTP endpoints idempotent without changing them. The
//! first request with an `Idempotency-Key` runs upstream; every retry gets its stored
//! response back. See `docs/` for the policy, configuration and operations.
//!
//! The request path, module by module:
//!
//! - [`server`]: listeners, HTTP/1.1 + h2c connections, graceful shutdown;
//! - [`tls`]: TLS on the proxy listener;
//! - [`gateway`]: runtime state built from the config, routing, outcome counting;
//! - [`path`]: path normalisation before routing (`//`, `.`, `..`, `%6f`);
//! - [`router`]: method + path pattern → route;
//! - [`proxy`]: streaming pass-through for routes without idempotency;
//! - [`route`]: a route at run time (upstream, policy, counters);
//! - [`idempotent`]: the idempotent path, one module per step, in the order of
//!   docs/architecture.md:
//!   - [`idempotent::key`]: reading the `Idempotency-Key` header;
//!   - [`idempotent::scope`]: whose key it is;
//!   - [`body`]: bounded reading of the request body (and the shared body type);
//!   - [`idempotent::fingerprint`]: what makes two requests the same request;
//!   - [`idempotent::claim`]: the claim, the bounded wait for a running duplicate, and
//!     releasing claims whose reply was lost;
//!   - [`store`]: claim, renew, settle, release (Redis with Lua, or memory);
//!   - [`idempotent::exchange`]: the detached upstream call with lease renewal;
//!   - [`idempotent::capture`]: buffering the upstream response for storage;
//!   - [`idempotent::replay`]: answering retries from the store;
//!   - [`idempotent::policy`]: a route's `[routes.idempotency]`, parsed;
//! - [`upstream`]: pooled http/https clients and request preparation;
//! - [`connection`]: one client connection's limits: idle and head deadlines, exchanges,
//!   abandoned requests;
//! - [`headers`]: hop-by-hop stripping, what may be stored and replayed;
//! - [`forwarded`]: `Forwarded` / `X-Forwarded-*`, believed only from trusted proxies;
//! - [`error`]: every error, mapped to problem+json in one place;
//! - [`access`]: one access log line per request;
//! - [`admin`]: health, readiness, metrics, key inspect/purge, published policy, routes;
//! - [`publish`]: the idempotency policy of every route, as Markdown and JSON;
//! - [`reload`]: a new configuration without a restart (SIGHUP, `POST /reload`);
//! - [`metrics`]: Prometheus counters, histograms and gauges;
//! - [`config`]: `gateway.toml`, validated into runtime types.

pub mod access;
pub mod admin;
pub mod body;
pub mod config;
pub mod connection;
pub mod error;
pub mod forwarded;
pub mod gateway;
pub mod headers;
pub mod idempotent;
pub mod metrics;
pub mod path;
pub mod proxy;
pub mod publish;
pub mod reload;
pub mod route;
pub mod router;
pub mod server;
pub mod store;
pub mod tls;
pub mod upstream;
