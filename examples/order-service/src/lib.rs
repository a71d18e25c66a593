//! An example order API that sits behind the idemgate gateway.
//!
//! Its `UNIQUE(user_id, idem_key)` constraint is the backstop for duplicates the gateway
//! could not catch (its Redis lost the record, or a client bypassed it): a repeated
//! request with the same key and payload gets the original response again, a repeated
//! key with a different payload gets 422, and neither creates a second row.
//!
//! Every order belongs to the caller named by `Authorization: Bearer <user>` (the demo's
//! stand-in for authentication): creates, the backstop and lookups are all scoped to it.
//!
//! Modules:
//! - [`api`]: routes, request validation, response shapes and the backstop counter.
//! - [`auth`]: the caller, from the bearer token.
//! - [`db`]: connecting to SQLite or Postgres, schema creation, insert-or-fetch.
//! - [`error`]: error enums and their single mapping to HTTP responses.
//! - [`fault`]: the opt-in demo faults (`--demo-faults`, `X-Demo-Fault: drop-answer`).
//! - [`key`]: `Idempotency-Key` normalisation (RFC 8941 sf-string or bare value).
//!
//! [`serve`] runs the service on a listener that the caller bound, so other crates' tests
//! can start it in-process on port 0.

pub mod api;
pub mod auth;
pub mod db;
pub mod error;
pub mod fault;
pub mod key;

use std::future::Future;

pub use db::Database;
pub use error::{DbError, Error};
pub use fault::Options;

/// Serves the API on `listener` until `shutdown` completes, then stops accepting, lets
/// in-flight requests finish and closes the database pool.
pub async fn serve(
    listener: tokio::net::TcpListener,
    db: Database,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_with(listener, db, Options::default(), shutdown).await
}

/// [`serve`] with `options` (demo faults).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    db: Database,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let app = api::router_with(db.clone(), options);
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    // Closing after the server has drained: requests still running hold pool handles and
    // would fail with PoolClosed if the pool went first.
    db.close().await;
    served.map_err(Error::Serve)
}
