//! `[store]`: the backend, the Redis URL and its TLS files, the timeout and the key prefix.

use std::path::PathBuf;

use super::{Issues, positive_duration, positive_size};
use crate::config::defaults;
use crate::config::file;
use crate::config::redis_url::Target;
use crate::config::{RedisTls, ReplicaAcks, Secret, StoreBackendConfig, StoreConfig};

pub(super) fn store(
    s: &file::StoreSection,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<StoreConfig> {
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
            let replicas = replica_acks(s, issues);
            match (url, password) {
                (Some(url), Some(password)) => {
                    Some(StoreBackendConfig::Redis { url, connections, tls, password, replicas })
                }
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
                (s.replica_acks.is_some(), "replica_acks"),
                (s.replica_ack_timeout.is_some(), "replica_ack_timeout"),
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

/// `replica_acks` and `replica_ack_timeout`. Whether the store has that many replicas is
/// asked of the store itself (`check`, the start, `/readyz`), never assumed here.
fn replica_acks(s: &file::StoreSection, issues: &mut Issues) -> ReplicaAcks {
    let count = s.replica_acks.unwrap_or(0);
    if count > MAX_REPLICA_ACKS {
        issues.add("store.replica_acks", format!("must be between 0 and {MAX_REPLICA_ACKS}"));
    }
    let timeout =
        positive_duration(issues, "store.replica_ack_timeout", s.replica_ack_timeout, defaults::REPLICA_ACK_TIMEOUT);
    if timeout < std::time::Duration::from_millis(1) {
        // WAIT takes whole milliseconds, and 0 would wait for ever.
        issues.add("store.replica_ack_timeout", "must be at least 1ms");
    }
    ReplicaAcks { count, timeout }
}

/// More replicas than any deployment runs behind one primary: a larger number is a typo.
const MAX_REPLICA_ACKS: u32 = 16;

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
