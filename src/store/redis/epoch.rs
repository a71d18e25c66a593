//! Data-loss detection.
//!
//! Redis can lose records: a restart without persistence, a failover to a replica that had not
//! caught up, a FLUSHALL, eviction under memory pressure. The gateway cannot prevent a retry
//! from running again then (the upstream's UNIQUE constraint must catch it), but it says so:
//! each gateway keeps an epoch marker and checks it every second, together with the server's
//! `run_id` and `master_replid`; when the marker vanishes or changes, or the server behind it
//! is another one (restart, failover), the loss is logged and counted
//! (`store_data_loss_total`), and a second line names the keys this gateway answered in the
//! window the loss may cover and those it had in flight (see `journal`), so that an operator
//! can check them upstream.
//!
//! One primary (or the one Sentinel names) has one marker, `PREFIX:epoch`. A Cluster has one
//! per shard, `PREFIX:epoch:{TAG}`, where TAG hashes to the first slot the shard serves, so
//! that each marker lives on, and each check reads, that shard's primary.
//!
//! Routine resharding is not a loss, and must not raise the alarm that a loss raises: a
//! marker moves with its slot (the migration carries its keys), and is then found, with its
//! epoch, on another node. Each check also reads the node's id (`CLUSTER MYID`): a marker
//! found on another node is a failover, a possible loss, when that node was the previous
//! one's replica (its `master_replid2` is the previous primary's `master_replid`), and a
//! migration, no loss, when it was not.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use redis::Value;

use super::journal::Journal;
use super::link::unavailable;
use super::links::Links;
use crate::store::error::StoreError;

/// How often the epoch markers are checked.
const EPOCH_CHECK: Duration = Duration::from_secs(1);
/// Slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// What the gateway knows of one primary, checked every [`EPOCH_CHECK`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    /// The epoch marker's value.
    epoch: String,
    /// `run_id`: new on every start of the server process.
    run_id: String,
    /// `master_replid`: new when a replica is promoted (a failover).
    replid: String,
    /// `master_replid2`: a promoted replica's previous primary's `master_replid`.
    replid2: String,
    /// `CLUSTER MYID` on a Cluster: which node holds the marker.
    node: Option<String>,
    /// `redis_version`.
    version: String,
}

/// Detects that Redis lost, or may have lost, its data:
///
/// - the epoch marker this gateway saw is gone or replaced: the records went with it
///   (restart without persistence, flush, failover to an empty replica, eviction);
/// - the marker is there but the server is another one (`run_id` or `master_replid` changed):
///   a restart from a snapshot or a failover to a replica that lagged may have lost the last
///   writes before it, so a retry of a request answered just before may run again.
pub(super) async fn watch(links: Links, marker: String, data_loss: Counter, journal: Arc<Journal>) {
    // Per marker (one per shard): what the last check saw, and when it was sent.
    let mut known: HashMap<String, (Observed, Instant)> = HashMap::new();
    loop {
        let markers = if links.is_cluster() {
            match tokio::time::timeout(EPOCH_CHECK, shard_markers(&links, &marker)).await {
                Ok(Ok(markers)) => markers,
                Ok(Err(e)) => {
                    tracing::debug!(store = %links.describe(), error = %e, "epoch check skipped: cluster layout unknown");
                    Vec::new()
                }
                Err(_) => Vec::new(),
            }
        } else {
            vec![marker.clone()]
        };
        let checked = Instant::now();
        let checks = markers.into_iter().map(|marker| async {
            // A fresh candidate each time: a marker re-created by this same gateway after a
            // loss must differ from the one it knew.
            let candidate = hex::encode(rand::random::<[u8; 16]>());
            // Bounded here: links carry no deadline of their own (calls set theirs).
            let observed = tokio::time::timeout(EPOCH_CHECK, observe(&links, &marker, &candidate)).await;
            (marker, observed.unwrap_or(Err(StoreError::Timeout(EPOCH_CHECK))))
        });
        let observed = futures_util::future::join_all(checks).await;
        if links.is_cluster() && !observed.is_empty() {
            // A marker that is no shard's any more (its shard's first slot moved) is forgotten:
            // should it be one again later, it is seen anew.
            known.retain(|marker, _| observed.iter().any(|(m, _)| m == marker));
        }
        for (marker, observed) in observed {
            match observed {
                Ok(current) => {
                    match known.get(&marker) {
                        Some((previous, seen)) => {
                            if report_change(&links.describe(), &marker, previous, &current, &data_loss) {
                                name_the_window(&links.describe(), &journal, *seen);
                            }
                        }
                        None => check_version(&links.describe(), &current.version),
                    }
                    known.insert(marker, (current, checked));
                }
                Err(e) => {
                    tracing::debug!(store = %links.describe(), marker, error = %e, "epoch check skipped: store unreachable")
                }
            }
        }
        tokio::time::sleep(EPOCH_CHECK).await;
    }
}

/// How far before the last check that saw the lost server its replicas may have trailed:
/// replicas acknowledge once a second, so a write older than this was most likely held.
const REPLICA_TRAIL: Duration = Duration::from_secs(2);

/// The most keys one alarm line names; the rest are counted.
const NAMED_MAX: usize = 500;

/// Names, after a data loss found at a check that followed one sent at `seen`, the keys this
/// gateway wrote in the window that may have been lost: answered since a little before
/// `seen` (see [`REPLICA_TRAIL`]), and in flight now. Their retries may run again upstream
/// (as attempt 1), so an operator can check them there.
fn name_the_window(store: &str, journal: &Journal, seen: Instant) {
    let from = seen.checked_sub(REPLICA_TRAIL).unwrap_or(seen);
    let named = journal.since(from.into());
    let list = |keys: &[String]| {
        let mut shown = keys.iter().take(NAMED_MAX).cloned().collect::<Vec<_>>().join(",");
        if keys.len() > NAMED_MAX {
            shown.push_str(&format!(",… ({} more)", keys.len() - NAMED_MAX));
        }
        shown
    };
    tracing::error!(
        store,
        window_from_s_ago = %format!("{:.1}", from.elapsed().as_secs_f64()),
        answered = named.ended.len(),
        in_flight = named.in_flight.len(),
        not_named = named.unnamed,
        answered_keys = %list(&named.ended),
        in_flight_keys = %list(&named.in_flight),
        "keys this gateway answered or had in flight in the window the data loss may cover: their records may \
         be gone, and a retry of any of them may run again upstream as attempt 1; check them there"
    );
}

/// Says what changed between two checks of a marker; true when records may have been lost.
fn report_change(store: &str, marker: &str, previous: &Observed, current: &Observed, data_loss: &Counter) -> bool {
    let node = current.node.as_deref().unwrap_or("");
    let moved = previous.node.is_some() && previous.node != current.node;
    if previous.epoch == current.epoch && moved && current.replid2 != previous.replid {
        // Another node, not promoted from the previous one: the slot moved, with its keys.
        tracing::info!(
            store,
            marker,
            from = previous.node.as_deref().unwrap_or(""),
            to = current.node.as_deref().unwrap_or(""),
            "an epoch marker moved with its slot to another node (resharding); nothing was lost"
        );
        false
    } else if previous.epoch != current.epoch {
        data_loss.inc();
        tracing::error!(
            store,
            node,
            marker,
            previous = %previous.epoch,
            current = %current.epoch,
            "Redis lost its data (restart without persistence, failover, flush or eviction): \
             retries of requests that already ran will reach the upstream again, whose own \
             UNIQUE constraint must answer them"
        );
        true
    } else if previous.run_id != current.run_id || previous.replid != current.replid {
        data_loss.inc();
        tracing::error!(
            store,
            node,
            marker,
            restarted = previous.run_id != current.run_id,
            failed_over = previous.replid != current.replid,
            "Redis restarted or failed over: records written just before may be lost, so a \
             retry of a request answered then may reach the upstream again, whose own UNIQUE \
             constraint must answer it"
        );
        true
    } else {
        false
    }
}

/// The current epoch (the existing marker, or `candidate` if there was none, set without
/// expiry) and the server's identity, in one round trip to the primary holding `marker`.
async fn observe(links: &Links, marker: &str, candidate: &str) -> Result<Observed, StoreError> {
    let mut link = links.pick()?;
    // In a Cluster the pipeline goes to the primary of the marker's slot, the first key in it.
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg(marker).arg(candidate).arg("NX").ignore();
    pipe.cmd("GET").arg(marker).cmd("INFO").arg("server").cmd("INFO").arg("replication");
    let (epoch, server, replication, node) = if links.is_cluster() {
        // As a script on the marker's key, so that it runs on the node that holds the marker
        // (a plain CLUSTER MYID would go to any node).
        pipe.cmd("EVAL").arg("return redis.call('CLUSTER', 'MYID')").arg(1).arg(marker);
        let (epoch, server, replication, node): (String, String, String, String) =
            pipe.query_async(&mut link).await.map_err(unavailable)?;
        (epoch, server, replication, Some(node))
    } else {
        let (epoch, server, replication): (String, String, String) =
            pipe.query_async(&mut link).await.map_err(unavailable)?;
        (epoch, server, replication, None)
    };
    Ok(Observed {
        epoch,
        run_id: info_field(&server, "run_id"),
        replid: info_field(&replication, "master_replid"),
        replid2: info_field(&replication, "master_replid2"),
        node,
        version: info_field(&server, "redis_version"),
    })
}

/// The oldest Redis the store works with: a claim is `SET key value NX GET PX ttl`, and `NX`
/// with `GET` came in 7.0.
const MIN_MAJOR: u32 = 7;

/// Says, once per server seen, when it is too old for the store's commands.
fn check_version(store: &str, version: &str) {
    let major = version.split('.').next().and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m < MIN_MAJOR) {
        tracing::error!(
            store,
            version,
            "Redis {version} is older than {MIN_MAJOR}.0: every claim (SET NX GET) fails, and the routes' \
             on_store_error applies to every request; upgrade Redis"
        );
    }
}

/// One marker per shard: the shard's first slot, read from `CLUSTER SLOTS`.
async fn shard_markers(links: &Links, marker: &str) -> Result<Vec<String>, StoreError> {
    let mut link = links.pick()?;
    let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut link).await.map_err(unavailable)?;
    let Value::Array(ranges) = slots else {
        return Err(StoreError::Protocol("CLUSTER SLOTS did not answer an array".into()));
    };
    // Primary node id → the lowest slot it serves.
    let mut first: HashMap<Vec<u8>, i64> = HashMap::new();
    for range in ranges {
        let Value::Array(fields) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Array(primary))) = (fields.first(), fields.get(2)) else {
            continue;
        };
        let id = match primary.get(2) {
            Some(Value::BulkString(id)) => id.clone(),
            _ => format!("{primary:?}").into_bytes(),
        };
        let lowest = first.entry(id).or_insert(*start);
        *lowest = (*lowest).min(*start);
    }
    let mut markers: Vec<String> = first
        .into_values()
        .filter_map(|slot| usize::try_from(slot).ok().filter(|s| *s < SLOTS))
        .map(|slot| format!("{marker}:{{{}}}", tag_for_slot(slot)))
        .collect();
    markers.sort();
    Ok(markers)
}

/// The smallest decimal hash tag whose key slot is `slot`.
fn tag_for_slot(slot: usize) -> u32 {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        // Every slot is reached within a few hundred thousand numbers; the table is built
        // once, in well under a millisecond per thousand slots.
        let mut tags = vec![u32::MAX; SLOTS];
        let mut missing = SLOTS;
        let mut n = 0u32;
        while missing > 0 {
            let slot = key_slot(n.to_string().as_bytes());
            if tags[slot] == u32::MAX {
                tags[slot] = n;
                missing -= 1;
            }
            n += 1;
        }
        tags
    })[slot]
}

/// The Cluster slot of a key without a hash tag (CRC16/XMODEM mod 16384).
fn key_slot(key: &[u8]) -> usize {
    usize::from(crc16::State::<crc16::XMODEM>::calculate(key)) % SLOTS
}

/// One `name:value` line of an INFO reply ("" when absent).
fn info_field(info: &str, name: &str) -> String {
    info.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"123456789"), 12739);
    }

    fn observed(epoch: &str, node: &str, replid: &str, replid2: &str) -> Observed {
        Observed {
            epoch: epoch.into(),
            run_id: format!("run-{node}"),
            replid: replid.into(),
            replid2: replid2.into(),
            node: Some(node.into()),
            version: "7.0.15".into(),
        }
    }

    #[test]
    fn a_marker_that_moved_with_its_slot_is_no_loss_and_a_failover_is_one() {
        let before = observed("e1", "node-a", "repl-a", "0000");
        let losses = Counter::default();
        report_change("redis 127.0.0.1:6379", "m", &before, &before.clone(), &losses);
        assert_eq!(losses.get(), 0, "nothing changed");
        report_change("redis 127.0.0.1:6379", "m", &before, &observed("e1", "node-b", "repl-b", "0000"), &losses);
        assert_eq!(losses.get(), 0, "the marker moved to another shard with its slot");
        report_change("redis 127.0.0.1:6379", "m", &before, &observed("e1", "node-c", "repl-c", "repl-a"), &losses);
        assert_eq!(losses.get(), 1, "a replica of the previous node took over: a failover");
        report_change("redis 127.0.0.1:6379", "m", &before, &observed("e2", "node-b", "repl-b", "0000"), &losses);
        assert_eq!(losses.get(), 2, "the marker is another one: its slot moved without its keys");
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in [0, 1, 5460, 5461, 10922, 10923, 16383] {
            assert_eq!(key_slot(tag_for_slot(slot).to_string().as_bytes()), slot);
        }
    }
}
