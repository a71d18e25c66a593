//! The Redis store: a record is one string (`layout`); a claim is one native command where it
//! can be (`SET NX GET PX`: an absent key is claimed, a settled one answered from the reply),
//! and every compare-and-set is one Lua script.
//!
//! Scripts are built once (their SHA computed once), loaded when the gateway starts and sent
//! with EVALSHA; on NOSCRIPT (a restarted or failed-over Redis, a new Cluster node) the call is
//! repeated once as EVAL with the script's text, which runs it and caches it on the node that
//! holds the key (a `SCRIPT LOAD` would go to every node of a Cluster and fail while any is
//! down). Calls go over a few multiplexed connections (`store.connections`), which
//! pipeline every concurrent call instead of holding a connection per call: one round trip per
//! transition (two for a claim that meets a claim in progress: the native try, then the
//! script), and concurrent requests share writes. A broken connection reconnects by itself.
//! Every call is bounded by the store timeout.
//! Times are Redis's own expiry clock (a lease ends at a mark on the record's PTTL), never a
//! gateway's wall clock, so that gateways with skewed clocks agree on every lease.
//!
//! Waiting duplicates are woken through pub/sub: a claim that finds the key in flight sets a
//! flag on the record, and the owner's complete/release script publishes the key name on the
//! gateway's channel only when that flag is set, so uncontended keys cost nothing (see
//! `notify`). Where Redis is and how connections follow it is `links` (through a Sentinel
//! failover, `sentinel`); data-loss detection is `epoch`; the scripts and their loading are
//! `scripts`; what one round trip sends and how its reply is read, `round_trip`; one call's
//! way there and back (NOSCRIPT, MOVED, ASK, the timeout), `transport`. The roles read as the
//! state machine: the key's life and its lookups in `lifecycle`, an operator's calls and the
//! index in `operator`, the quota here.

mod epoch;
mod layout;
mod lifecycle;
mod links;
mod notify;
mod operator;
mod round_trip;
mod scripts;
mod sentinel;
mod settings;
mod transport;

pub use self::settings::{Persistence, Settings, Severity};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::task::JoinHandle;

use self::links::{Links, Opened};
use self::round_trip::{Reply, protocol};
use self::scripts::{Scripts, load_scripts};
use self::sentinel::Follower;

use super::waiters::Waiters;
use super::{Quota, QuotaKey, Result, StoreError};
use crate::config::{RedisTarget as Target, RedisTls};

/// Responses from this size on are settled through a side key (see `settle_aside`); below
/// it, the extra command costs more than the copies it saves.
const ASIDE_FROM: usize = 16 * 1024;

/// How often a waiter re-reads its key while the subscription is up (a lost message costs at
/// most this much extra wait) and while it is down.
const POLL_SUBSCRIBED: Duration = Duration::from_secs(1);
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);

/// Redis-backed store, shared by any number of gateway instances.
pub struct RedisStore {
    links: Links,
    scripts: Arc<Scripts>,
    timeout: Duration,
    channel: String,
    /// `store.key_prefix`, which starts every key name the store writes.
    prefix: String,
    waiters: Arc<Waiters>,
    subscribed: Arc<AtomicBool>,
    data_loss: Counter,
    commands: Counter,
    /// Subscriber, epoch watch, script warm-up and Sentinel follower; stopped with the store.
    background: Vec<JoinHandle<()>>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

impl RedisStore {
    /// A store at `url` (any [`Target`]) without TLS files or a separate password; see
    /// [`RedisStore::open`].
    pub fn new(url: &str, connections: usize, timeout: Duration, key_prefix: &str) -> Result<Self> {
        Self::open(url, &RedisTls::default(), None, connections, timeout, key_prefix)
    }

    /// Prepares `connections` multiplexed connections to `url` and starts the background
    /// tasks (notifications, data-loss detection, script warm-up, and for Sentinel the
    /// follower). Connections are made on first use, so this succeeds while Redis is down.
    /// `tls` replaces the system roots with a CA bundle and adds a client certificate for
    /// mutual TLS; `password` (from `password_env`) overrides a password in the URL. Neither
    /// appears in an error. Must be called inside a tokio runtime.
    pub fn open(
        url: &str,
        tls: &RedisTls,
        password: Option<&str>,
        connections: usize,
        timeout: Duration,
        key_prefix: &str,
    ) -> Result<Self> {
        let target = Target::parse(url).map_err(|e| StoreError::Unavailable(format!("bad Redis URL: {e}")))?;
        let Opened { links, sentinels } = Links::open(target, tls, password, connections, timeout)?;
        let scripts = Arc::new(Scripts::new());
        let channel = format!("{key_prefix}:settled");
        let waiters = Arc::new(Waiters::default());
        let subscribed = Arc::new(AtomicBool::new(false));
        let data_loss = Counter::default();
        let mut background = vec![
            tokio::spawn(notify::subscribe(
                links.clone(),
                channel.clone(),
                Arc::clone(&waiters),
                Arc::clone(&subscribed),
            )),
            tokio::spawn(epoch::watch(links.clone(), format!("{key_prefix}:epoch"), data_loss.clone())),
        ];
        // On a Cluster, SCRIPT LOAD goes to every node and fails while any is down; there the
        // first call of each script on each node pays one NOSCRIPT round trip instead.
        if !links.is_cluster() {
            background.push(tokio::spawn(load_scripts(links.clone(), Arc::clone(&scripts))));
        }
        if let Some(sentinels) = sentinels {
            background.push(tokio::spawn(Follower::new(sentinels).run(links.clone())));
        }
        let commands = Counter::default();
        let prefix = key_prefix.to_owned();
        Ok(Self { links, scripts, timeout, channel, prefix, waiters, subscribed, data_loss, commands, background })
    }

    /// Where the store is, for a log line (see `Links::describe`).
    pub fn describe(&self) -> String {
        self.links.describe()
    }

    /// The deadline of one call (`store.timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Redis's settings that decide whether records last their retention (see `settings`).
    pub async fn settings(&self) -> Settings {
        settings::read(self).await
    }

    /// Counts the commands this gateway sent (each one round trip).
    pub fn commands_counter(&self) -> Counter {
        self.commands.clone()
    }

    /// Counts the times this gateway saw Redis lose its data (see the module docs).
    pub fn data_loss_counter(&self) -> Counter {
        self.data_loss.clone()
    }
}

fn ms(d: Duration) -> u64 {
    // Redis rejects a zero expiry; every duration here is validated positive, keep it so.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Quota for RedisStore {
    async fn count_new_key(&self, key: &QuotaKey, window: Duration) -> Result<(u64, Duration)> {
        let reply = self.eval(&self.scripts.quota, key.as_str(), |cmd| {
            cmd.arg(ms(window));
        });
        let mut items = Reply::array(reply.await?)?;
        let count = u64::try_from(items.int()?).map_err(|_| protocol("quota count out of range"))?;
        let left = Duration::from_millis(items.int()?.max(0) as u64);
        Ok((count, left))
    }
}
