//! The Redis store itself: what it holds (the transport, the scripts, the waiters and its
//! background tasks), how it opens, and the quota (one script). The key's life and its
//! lookups are `lifecycle`; an operator's calls, the records and the index, `operator`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::task::JoinHandle;

use super::journal::Journal;
use super::links::{Links, Opened};
use super::replicas::{ReplicaMetrics, Replicas};
use super::round_trip::{Reply, ms, protocol};
use super::scripts::{Scripts, load_scripts};
use super::sentinel::Follower;
use super::settings::{self, Settings};
use super::transport::Transport;
use super::{epoch, notify};
use crate::config::{RedisTarget as Target, RedisTls, ReplicaAcks};
use crate::store::error::{Result, StoreError};
use crate::store::names::QuotaKey;
use crate::store::roles::Quota;
use crate::store::waiters::Waiters;

/// Responses from this size on are settled through a side key (see `settle_aside`); below
/// it, the extra command costs more than the copies it saves.
pub(super) const ASIDE_FROM: usize = 16 * 1024;

/// How often a waiter re-reads its key while the subscription is up (a lost message costs at
/// most this much extra wait) and while it is down.
pub(super) const POLL_SUBSCRIBED: Duration = Duration::from_secs(1);
pub(super) const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);

/// Redis-backed store, shared by any number of gateway instances.
pub struct RedisStore {
    /// The way there and back.
    pub(super) transport: Transport,
    pub(super) scripts: Arc<Scripts>,
    /// The channel settled keys are published on, for waiters (see `notify`).
    pub(super) channel: String,
    /// `store.key_prefix`, which starts every key name the store writes.
    pub(super) prefix: String,
    pub(super) waiters: Arc<Waiters>,
    pub(super) subscribed: Arc<AtomicBool>,
    data_loss: Counter,
    /// The keys claimed and answered lately, for the data-loss alarm to name.
    pub(super) journal: Arc<Journal>,
    /// What `replica_acks` asks of every write the promise rests on (see `replicas`).
    pub(super) replicas: Arc<Replicas>,
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
        let journal = Arc::new(Journal::default());
        let mut background = vec![
            tokio::spawn(notify::subscribe(
                links.clone(),
                channel.clone(),
                Arc::clone(&waiters),
                Arc::clone(&subscribed),
            )),
            tokio::spawn(epoch::watch(
                links.clone(),
                format!("{key_prefix}:epoch"),
                data_loss.clone(),
                Arc::clone(&journal),
            )),
        ];
        // On a Cluster, SCRIPT LOAD goes to every node and fails while any is down; there the
        // first call of each script on each node pays one NOSCRIPT round trip instead.
        if !links.is_cluster() {
            background.push(tokio::spawn(load_scripts(links.clone(), Arc::clone(&scripts))));
        }
        if let Some(sentinels) = sentinels {
            background.push(tokio::spawn(Follower::new(sentinels).run(links.clone())));
        }
        let transport = Transport::new(links, timeout);
        let prefix = key_prefix.to_owned();
        let replicas = Arc::new(Replicas::new(ReplicaAcks::NONE));
        Ok(Self { transport, scripts, channel, prefix, waiters, subscribed, data_loss, journal, replicas, background })
    }

    /// This store, relying on a claim or an answer only once `acks.count` replicas hold it
    /// (`[store] replica_acks`, see `replicas`).
    pub fn requiring(mut self, acks: ReplicaAcks) -> Self {
        self.replicas = Arc::new(Replicas::new(acks));
        self
    }

    /// The metrics of replica acknowledgements.
    pub fn replica_metrics(&self) -> ReplicaMetrics {
        self.replicas.metrics.clone()
    }

    /// Where the store is, for a log line (see `Links::describe`).
    pub fn describe(&self) -> String {
        self.transport.links.describe()
    }

    /// The deadline of one call (`store.timeout`).
    pub fn timeout(&self) -> Duration {
        self.transport.timeout()
    }

    /// Redis's settings that decide whether records last their retention (see `settings`).
    pub async fn settings(&self) -> Settings {
        settings::read(&self.transport, &self.replicas, &format!("{}:replicas", self.prefix)).await
    }

    /// Counts the commands this gateway sent (each one round trip).
    pub fn commands_counter(&self) -> Counter {
        self.transport.commands()
    }

    /// Counts the times this gateway saw Redis lose its data (see the module docs).
    pub fn data_loss_counter(&self) -> Counter {
        self.data_loss.clone()
    }
}

impl Quota for RedisStore {
    async fn count_new_key(&self, key: &QuotaKey, window: Duration) -> Result<(u64, Duration)> {
        let reply = self.transport.eval(&self.scripts.quota, key.as_str(), |cmd| {
            cmd.arg(ms(window));
        });
        let mut items = Reply::array(reply.await?)?;
        let count = u64::try_from(items.int()?).map_err(|_| protocol("quota count out of range"))?;
        let left = Duration::from_millis(items.int()?.max(0) as u64);
        Ok((count, left))
    }
}
