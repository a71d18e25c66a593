//! `LaggedSentinelSet`: a primary whose replica trails it through a [`ReplicationLink`],
//! watched by three Sentinels: what asynchronous replication loses when the primary dies.
//!
//! The shape: the primary; its one replica, replicating through a link that delays the stream
//! by `lag`; and a replica of that replica (a sub-replica), replicating from it directly. Why:
//!
//! - `WAIT n` counts the primary's own replicas. With one, `WAIT 1` means "the replica that
//!   will be promoted has it". With two direct replicas, `WAIT 1` is met by whichever answers
//!   first, while Sentinel promotes by the offsets it last read, which may date from before the
//!   crash: a write one replica acknowledged can be lost with the promotion of the other.
//!   That loss is Redis's, no gateway's `WAIT 1` prevents it, and a test built on it would
//!   fail by chance.
//! - The promoted replica must have a replica of its own, or every `WAIT 1` on it would time
//!   out for good. The sub-replica is already there: no waiting for Sentinel to re-point a
//!   second replica, nor for the killed server to come back. It is gone for up to a second
//!   all the same: a replica promoted with `REPLICAOF NO ONE` drops its replicas to announce its
//!   new replication ID, and they come back on their next once-a-second cron tick.
//!
//! Hazard: Sentinel re-points a replica whose primary is not at the address it monitors
//! (`+fix-slave-config`) once `failover-timeout` has passed since it first saw it. Here that
//! would send the replica around the link, to the primary's real port, and the lag would be
//! gone without a word. So these Sentinels run with a `failover-timeout` longer than any
//! scenario runs before its failover, and [`LaggedSentinelSet::through_link`] checks before
//! anything counts on the lag. The price: an election that fails (three Sentinels splitting
//! their votes; rare) is tried again only after twice that.

use std::time::{Duration, Instant};

use super::redis::{RedisServer, replica_linked, wait_for};
use super::replication_link::ReplicationLink;
use super::sentinel::{Sentinel, wait_agreed};

/// Longer than a scenario runs before its failover; see the hazard above.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// A failover within twice the failover timeout: one failed election, then one that succeeds.
const PROMOTION_LIMIT: Duration = Duration::from_secs(75);

pub struct LaggedSentinelSet {
    // Declared first so they are dropped first: a Sentinel outliving the servers for a moment
    // would start a failover of its own.
    sentinels: Vec<Sentinel>,
    link: ReplicationLink,
    primary: RedisServer,
    /// Replicates from the primary through `link`; the one Sentinel promotes.
    replica: RedisServer,
    /// Replicates from `replica`, directly.
    sub_replica: RedisServer,
    name: String,
}

impl LaggedSentinelSet {
    /// Starts the primary, the replica behind a link of `lag`, the sub-replica, and three
    /// Sentinels monitoring the primary as `master_name`; returns once every Sentinel knows
    /// the replica and the two others, so that a failover can succeed.
    pub fn start(master_name: &str, lag: Duration) -> LaggedSentinelSet {
        let primary = RedisServer::start();
        let replica = RedisServer::start();
        let sub_replica = RedisServer::start();
        let link = ReplicationLink::start(primary.addr(), lag);
        // Linked before anything is written or any Sentinel looks: a primary takes a new
        // replication ID when its first replica attaches.
        replica.replicate_at(link.port());
        sub_replica.replicate(&replica);
        let sentinels =
            (0..3).map(|_| Sentinel::start_with(master_name, primary.port, None, FAILOVER_TIMEOUT)).collect::<Vec<_>>();
        wait_agreed(&sentinels, master_name, primary.port, replica.port, Duration::from_secs(30));
        LaggedSentinelSet { sentinels, link, primary, replica, sub_replica, name: master_name.to_string() }
    }

    /// `redis+sentinel://` with every Sentinel's address and the master name.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://{}/{}", addrs.join(","), self.name)
    }

    /// The server that is primary until [`crash_primary`].
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The server that trails behind the link, and is promoted.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    pub fn freeze(&self) {
        self.link.freeze();
    }

    pub fn thaw(&self) {
        self.link.thaw();
    }

    /// Ok while the replica still replicates through the link, link up; an Err says what
    /// became of it (see the `+fix-slave-config` hazard above).
    pub fn through_link(&self) -> Result<(), String> {
        replica_linked(&self.replica.reach, self.replica.port, self.link.port())
    }

    /// The host of the primary dies: its link drops what it had not delivered, and the primary
    /// is killed (SIGKILL). Panics if the replica no longer trailed through the link.
    pub fn crash_primary(&self) {
        if let Err(e) = self.through_link() {
            panic!("the replica does not replicate through its link, so nothing lagged: {e}");
        }
        self.link.crash();
        self.primary.stop();
    }

    /// After [`crash_primary`], waits until the first Sentinel names the replica as the
    /// primary; returns how long that took.
    pub fn wait_promoted(&self) -> Duration {
        let started = Instant::now();
        let first = &self.sentinels[0];
        wait_for(PROMOTION_LIMIT, "the Sentinels to promote the replica", || match first.master_addr(&self.name) {
            Some(port) if port == self.replica.port => Ok(()),
            other => Err(format!("Sentinel {} still names {other:?}", first.port)),
        });
        started.elapsed()
    }

    /// The replicas connected to the promoted replica (`connected_slaves`), None while it
    /// does not answer.
    pub fn promoted_replicas(&self) -> Option<u32> {
        self.replica.replication("connected_slaves")?.parse().ok()
    }
}
