//! Why a store call failed.

use std::time::Duration;

use thiserror::Error;

/// What every store call answers, or why it failed.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Why a store call failed. Any of these makes the route apply its `on_store_error` policy.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The store could not be reached or refused the command.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call did not finish within the configured timeout.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The store answered something this gateway cannot read.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// A Redis Cluster slot is moving or its shard has no primary yet (`ASK`, `MOVED`,
    /// `TRYAGAIN`, `CLUSTERDOWN`, left after the client's own redirections): the same call
    /// may work a moment later, or in another form.
    #[error("store slot moving: {0}")]
    Migrating(String),
    /// The memory store is at its bound and holds only open claims.
    #[error("memory store is full")]
    Full,
    /// Too few replicas acknowledged a claim within `replica_ack_timeout` (see
    /// `redis::replicas`): a failover now could forget it, so it is given back and its
    /// request is not forwarded.
    #[error("{got} of the {wanted} replicas required acknowledged the claim within {within:?}")]
    Unreplicated {
        /// `replica_acks`.
        wanted: u32,
        /// How many acknowledged in time.
        got: i64,
        /// `replica_ack_timeout`.
        within: Duration,
    },
    /// The store answered and refused the command itself (an argument, a key of another
    /// type, a script's error): not an outage, a bug or a misconfigured store.
    #[error("store refused the command: {0}")]
    Rejected(String),
}
