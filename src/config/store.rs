//! `[store]` as the gateway uses it: the backend with its own settings.

use std::path::PathBuf;
use std::time::Duration;

use super::Secret;

/// `[store]`
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// Which backend, with its own settings.
    pub backend: StoreBackendConfig,
    /// Deadline of one store call.
    pub timeout: Duration,
    /// Prefix of record key names.
    pub key_prefix: String,
}

/// The backend-specific part of `[store]`.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreBackendConfig {
    /// Redis, shared by every gateway instance.
    Redis {
        /// Connection URL.
        url: String,
        /// Multiplexed connections.
        connections: usize,
        /// TLS files for `rediss://`.
        tls: RedisTls,
        /// The password from `password_env`, if set (it overrides one in the URL).
        password: Option<Secret>,
        /// Replicas that must hold a write before the gateway relies on it.
        replicas: ReplicaAcks,
    },
    /// In-process memory, for one instance.
    Memory {
        /// Maximum records.
        max_entries: usize,
        /// Maximum stored bytes.
        max_bytes: u64,
    },
}

/// `[store] replica_acks` and `replica_ack_timeout`: how many replicas must acknowledge a
/// claim before its request is forwarded (and an answer, a release or an unknown mark before
/// the client is answered), and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAcks {
    /// Replicas that must acknowledge; 0: none waited for (writes live on the primary alone
    /// until replication catches up).
    pub count: u32,
    /// How long one write waits for them.
    pub timeout: Duration,
}

impl ReplicaAcks {
    /// No replica waited for.
    pub const NONE: ReplicaAcks = ReplicaAcks { count: 0, timeout: crate::config::defaults::REPLICA_ACK_TIMEOUT };
}

/// TLS files for a `rediss://` store (`[store] ca_file`, `cert_file`, `key_file`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM CA bundle replacing the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
}
