//! What Redis's own settings mean for the records: read at start and for `/readyz`.
//!
//! A record evicted under memory pressure is an answer lost: the retry runs the request again.
//! Only `maxmemory-policy noeviction` never evicts a record (every record has a TTL, so the
//! `volatile-*` policies evict them too), and only once `maxmemory` is set does any policy act.
//! Persistence and replicas decide what a restart or a failover keeps. Managed Redis services
//! often refuse `CONFIG`: then the gateway says it could not check, and serves. In a Cluster
//! the node that answers speaks for all (configure every node alike).

use redis::Value;

use super::replicas::Replicas;
use super::transport::Transport;

/// Redis's settings that decide whether records last their retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `maxmemory-policy` and `maxmemory` (bytes, 0: no limit), or why they could not be read.
    pub eviction: Result<(String, u64), String>,
    /// How the node persists its data (`INFO persistence`, `CONFIG GET save`), if readable.
    pub persistence: Option<Persistence>,
    /// Replicas connected to the node (`INFO replication`), if readable.
    pub replicas: Option<u64>,
    /// What `[store] replica_acks` asks for, and how many replicas acknowledged a probe write
    /// within `replica_ack_timeout` (or why the probe failed); `None` when nothing is asked.
    pub acks: Option<Acks>,
}

/// `replica_acks` against what the store gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acks {
    /// `replica_acks`.
    pub wanted: u32,
    /// Replicas that acknowledged a probe write in time, or why it could not be asked.
    pub acknowledged: Result<i64, String>,
    /// The primary's `min-replicas-to-write`, if readable.
    pub min_replicas_to_write: Option<u64>,
}

/// How a node keeps its data across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// `appendonly yes`, with its `appendfsync` when readable.
    pub aof: Option<Option<String>>,
    /// RDB snapshots are scheduled (`save` is not empty); `None` when unreadable.
    pub rdb: Option<bool>,
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Records can be lost before their retention: an error.
    Error,
    /// The gateway could not check, or a restart would lose records: a warning.
    Warning,
}

impl Settings {
    /// Whether Redis may evict records now (an evicting policy with a memory limit).
    pub fn evicts(&self) -> bool {
        matches!(&self.eviction, Ok((policy, max)) if policy != "noeviction" && *max > 0)
    }

    /// What the settings mean for the records, worst first.
    pub fn findings(&self) -> Vec<(Severity, String)> {
        let mut out = Vec::new();
        match &self.eviction {
            Ok((policy, max)) if policy != "noeviction" && *max > 0 => out.push((
                Severity::Error,
                format!(
                    "maxmemory-policy is {policy} with maxmemory {max} bytes: Redis evicts records under memory \
                     pressure, and a retry of an evicted request runs it again; set maxmemory-policy noeviction"
                ),
            )),
            Ok((policy, _)) if policy != "noeviction" => out.push((
                Severity::Warning,
                format!(
                    "maxmemory-policy is {policy}: once a maxmemory is set, Redis evicts records under memory \
                     pressure; set maxmemory-policy noeviction"
                ),
            )),
            Ok(_) => {}
            Err(why) => out.push((
                Severity::Warning,
                format!(
                    "cannot read maxmemory-policy ({why}): make sure it is noeviction, or records can be evicted \
                     and their requests run again"
                ),
            )),
        }
        if let Some(acks) = &self.acks {
            out.extend(acks.findings());
        }
        if let Some(Persistence { aof: Some(None), rdb: Some(false) }) = &self.persistence {
            out.push((
                Severity::Warning,
                "Redis persists nothing (appendonly no, no save points): a restart loses every record, and \
                 retries of earlier requests run them again (the gateway counts it in idemgate_store_data_loss_total)"
                    .to_owned(),
            ));
        }
        out
    }

    /// One line for people: persistence and replicas, as far as they could be read.
    pub fn summary(&self) -> String {
        let eviction = match &self.eviction {
            Ok((policy, 0)) => format!("maxmemory-policy {policy}, no maxmemory"),
            Ok((policy, max)) => format!("maxmemory-policy {policy}, maxmemory {max} bytes"),
            Err(_) => "maxmemory-policy unknown".to_owned(),
        };
        let persistence = match &self.persistence {
            Some(Persistence { aof: Some(Some(fsync)), .. }) => format!("appendonly yes (appendfsync {fsync})"),
            Some(Persistence { aof: Some(None), rdb: Some(true) }) => "RDB snapshots only".to_owned(),
            Some(Persistence { aof: Some(None), rdb: Some(false) }) => "no persistence".to_owned(),
            _ => "persistence unknown".to_owned(),
        };
        let replicas = self.replicas.map_or_else(|| "replicas unknown".to_owned(), |n| format!("{n} replicas"));
        let acks = match &self.acks {
            None => String::new(),
            Some(Acks { wanted, acknowledged: Ok(n), .. }) => format!("; replica_acks {wanted}: {n} acknowledged"),
            Some(Acks { wanted, acknowledged: Err(_), .. }) => {
                format!("; replica_acks {wanted}: acknowledgements unknown")
            }
        };
        format!("{eviction}; {persistence}; {replicas}{acks}")
    }
}

impl Acks {
    fn findings(&self) -> Vec<(Severity, String)> {
        let mut out = Vec::new();
        match &self.acknowledged {
            Ok(n) if *n < i64::from(self.wanted) => out.push((
                Severity::Error,
                format!(
                    "replica_acks is {} but {n} replicas acknowledged a write within replica_ack_timeout: every \
                     claim is given back and its request refused (503 store-unavailable on fail-closed routes) \
                     until {} do",
                    self.wanted, self.wanted
                ),
            )),
            Ok(_) => {}
            Err(why) => out.push((
                Severity::Warning,
                format!(
                    "cannot ask the replicas to acknowledge a write ({why}): replica_acks {} may refuse every claim",
                    self.wanted
                ),
            )),
        }
        if self.min_replicas_to_write == Some(0) {
            out.push((
                Severity::Warning,
                format!(
                    "min-replicas-to-write is 0 on the primary: setting it to {} (with min-replicas-max-lag) makes \
                     a primary cut off from its replicas refuse writes at once, instead of taking each claim \
                     and having the gateway give it back after replica_ack_timeout",
                    self.wanted
                ),
            ));
        }
        out
    }
}

/// Reads the settings of the node the store reaches. Each part that Redis refuses (a managed
/// service that disables `CONFIG`, an ACL) is left unknown; nothing here fails.
/// `probe` is a write (to a key of the store's own) that replicas are asked to acknowledge
/// when `replica_acks` is set: a real write and its `WAIT`, as a claim would make.
pub(super) async fn read(store: &Transport, replicas: &Replicas, probe: &str) -> Settings {
    let config = |name: &'static str| async move {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        let reply: Result<Value, _> = store.query(cmd, None).await;
        match reply {
            Ok(Value::Array(items)) | Ok(Value::Set(items)) => {
                items.get(1).and_then(text).ok_or_else(|| format!("CONFIG GET {name} answered nothing"))
            }
            Ok(Value::Map(pairs)) => {
                pairs.first().and_then(|(_, v)| text(v)).ok_or_else(|| format!("CONFIG GET {name} answered nothing"))
            }
            Ok(other) => Err(format!("CONFIG GET {name} answered {other:?}")),
            Err(e) => Err(format!("CONFIG GET {name}: {e}")),
        }
    };
    let eviction = match (config("maxmemory-policy").await, config("maxmemory").await) {
        (Ok(policy), Ok(max)) => Ok((policy, max.parse().unwrap_or(0))),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let info = |section: &'static str| async move {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        // A Cluster client asks every node and answers a map by node: the first one's.
        match store.query::<Value>(cmd, None).await.ok()? {
            Value::Map(nodes) => nodes.first().and_then(|(_, info)| text(info)),
            one => text(&one),
        }
    };
    let field = |text: &str, name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
    };
    let aof = match info("persistence").await.and_then(|text| field(&text, "aof_enabled")) {
        Some(on) if on == "1" => Some(Some(config("appendfsync").await.unwrap_or_else(|_| "unknown".into()))),
        Some(_) => Some(None),
        None => None,
    };
    let rdb = config("save").await.ok().map(|save| !save.trim().is_empty());
    let persistence = Some(Persistence { aof, rdb }).filter(|p| p.aof.is_some() || p.rdb.is_some());
    let connected = info("replication").await.and_then(|text| field(&text, "connected_slaves")?.parse().ok());
    let acks = match replicas.wait() {
        None => None,
        Some(wait) => {
            let mut set = redis::cmd("SET");
            set.arg(probe).arg("replica-ack-probe").arg("PX").arg(60_000);
            let acknowledged = match store.query_waiting(set, None, wait, replicas.timeout()).await {
                Ok((_, got, held)) => {
                    if got >= i64::from(replicas.count()) {
                        held.give_back();
                    }
                    Ok(got)
                }
                Err(e) => Err(e.to_string()),
            };
            let min_replicas_to_write = config("min-replicas-to-write").await.ok().and_then(|n| n.parse().ok());
            Some(Acks { wanted: replicas.count(), acknowledged, min_replicas_to_write })
        }
    };
    Settings { eviction, persistence, replicas: connected, acks }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(policy: &str, max: u64) -> Settings {
        Settings {
            eviction: Ok((policy.to_owned(), max)),
            persistence: Some(Persistence { aof: Some(Some("always".into())), rdb: Some(false) }),
            replicas: Some(1),
            acks: None,
        }
    }

    #[test]
    fn only_noeviction_keeps_every_record() {
        assert!(settings("allkeys-lru", 100 << 20).evicts());
        assert!(settings("volatile-ttl", 1).evicts(), "every record has a TTL");
        assert!(!settings("noeviction", 100 << 20).evicts());
        assert!(!settings("allkeys-lru", 0).evicts(), "no limit, no eviction yet");
        assert_eq!(settings("allkeys-lru", 100 << 20).findings()[0].0, Severity::Error);
        assert_eq!(settings("allkeys-lru", 0).findings()[0].0, Severity::Warning);
        assert!(settings("noeviction", 0).findings().is_empty());
    }

    #[test]
    fn what_cannot_be_read_is_a_warning_and_nothing_persisted_is_one_too() {
        let refused = Settings { eviction: Err("NOPERM".into()), persistence: None, replicas: None, acks: None };
        let findings = refused.findings();
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].0, Severity::Warning);
        assert!(findings[0].1.contains("cannot read maxmemory-policy (NOPERM)"));
        assert_eq!(refused.summary(), "maxmemory-policy unknown; persistence unknown; replicas unknown");
        let volatile = Settings {
            persistence: Some(Persistence { aof: Some(None), rdb: Some(false) }),
            ..settings("noeviction", 0)
        };
        assert!(volatile.findings()[0].1.contains("persists nothing"));
        assert_eq!(volatile.summary(), "maxmemory-policy noeviction, no maxmemory; no persistence; 1 replicas");
    }
}
