//! Writes that replicas must hold before anyone relies on them (`[store] replica_acks`).
//!
//! Redis replicates asynchronously: a claim or an answer the primary acknowledged lives on the
//! primary alone until its replicas catch up, and a failover to a replica that had not caught
//! up forgets it (a retry then runs the request again, as attempt 1). With `replica_acks = N`
//! each write the promise rests on (the claim, the answer, the release, the unknown mark, a
//! lookup's end) is followed by `WAIT N timeout`, and the gateway relies on the write only
//! once N replicas acknowledged it.
//!
//! Hazards that decide the shape:
//! - `WAIT` blocks the connection it runs on until the replicas answer or the timeout passes.
//!   On the multiplexed connections every call pipelined behind it would wait too (a replay
//!   behind a slow replica), so a waiting write takes a connection of its own
//!   ([`Exclusive`]) for its round trip.
//! - `WAIT` counts the replicas that acknowledged *this connection's* last write. Sent on a
//!   connection that reconnected after the write, it acknowledges nothing, yet answers with
//!   every connected replica. So the write and its `WAIT` go in one pipeline, on a connection
//!   that never reconnects (a broken one is dropped, never repaired), and a write repeated
//!   after a lost reply always writes again (the settle script renews the expiry of a record
//!   it already settled), so that its `WAIT` covers the first try as well: replication is one
//!   stream, in order.
//! - A connection whose `WAIT` came back short still has an unacknowledged write as its last:
//!   the next holder's `WAIT` would wait for it too. Such a connection is not returned to the
//!   pool (an answer's is kept by the task that goes on waiting for it, see
//!   [`Replicas::keep_waiting`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::link::{Link, unavailable};
use super::round_trip::ms;
use crate::config::ReplicaAcks;
use crate::store::error::StoreError;

/// Connections held by one call at a time, at most this many at once per primary: past it,
/// writes wait for one (within their deadline). Each is a socket on the gateway and a client
/// on Redis.
pub(super) const EXCLUSIVE_MAX: usize = 256;

/// An idle connection older than this is closed rather than reused: a server or a proxy may
/// have closed it meanwhile, and a write sent on a dead connection fails the request it
/// carries.
const IDLE_MAX: Duration = Duration::from_secs(30);

/// How often the answers replied to before their replicas held them are logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Connections to one primary (or one Cluster) that one call holds at a time, for the writes
/// that wait for replicas (see the module docs).
pub(super) struct Exclusive {
    source: Source,
    idle: Mutex<Vec<(Instant, Link)>>,
    permits: Arc<Semaphore>,
    /// Bounds making a connection.
    timeout: Duration,
}

// Made once per primary, and the pool is behind an `Arc`: the sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Source {
    Node(redis::Client),
    Cluster(ClusterClient),
}

/// A connection of an [`Exclusive`] pool, held by one call; dropped, it is closed.
pub(super) struct Held {
    link: Link,
    pool: Arc<Exclusive>,
    _permit: OwnedSemaphorePermit,
}

impl Exclusive {
    /// Connections to the one server `client` reaches.
    pub fn node(client: redis::Client, timeout: Duration) -> Arc<Self> {
        Self::new(Source::Node(client), timeout)
    }

    /// Cluster connections (each routing by slot, with sockets of its own to the nodes).
    pub fn cluster(client: ClusterClient, timeout: Duration) -> Arc<Self> {
        Self::new(Source::Cluster(client), timeout)
    }

    fn new(source: Source, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            source,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(EXCLUSIVE_MAX)),
            timeout,
        })
    }

    /// A connection for one call: an idle one, or a new one. Waits while [`EXCLUSIVE_MAX`]
    /// are held; the caller bounds the wait.
    pub async fn take(self: &Arc<Self>) -> Result<Held, StoreError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("the store is closing".into()))?;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.retain(|(since, _)| since.elapsed() < IDLE_MAX);
            idle.pop()
        };
        let link = match idle {
            Some((_, link)) => link,
            None => self.connect().await?,
        };
        Ok(Held { link, pool: Arc::clone(self), _permit: permit })
    }

    async fn connect(&self) -> Result<Link, StoreError> {
        match &self.source {
            Source::Node(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(None);
                let conn: MultiplexedConnection =
                    client.get_multiplexed_async_connection_with_config(&config).await.map_err(unavailable)?;
                Ok(Link::Direct(conn))
            }
            Source::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new().set_connection_timeout(self.timeout);
                Ok(Link::Cluster(client.get_async_connection_with_config(config).await.map_err(unavailable)?))
            }
        }
    }
}

impl Held {
    pub fn link(&mut self) -> &mut Link {
        &mut self.link
    }

    /// Returns the connection to its pool: only one whose last write every replica waited for
    /// acknowledged (see the module docs).
    pub fn give_back(self) {
        let Held { link, pool, _permit } = self;
        pool.idle.lock().unwrap_or_else(PoisonError::into_inner).push((Instant::now(), link));
    }
}

/// What is written, for the metrics and the logs.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Written {
    /// A claim: the request is forwarded only once replicas hold it.
    claim,
    /// A completed or executed answer: the client is answered once replicas hold it.
    answer,
    /// An unknown outcome held for an operator or a lookup.
    unknown,
    /// A claim given back.
    release,
    /// A lookup's end.
    lookup,
}

/// How a write's wait for its replicas ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Enough replicas acknowledged within `replica_ack_timeout`.
    acknowledged,
    /// Too few acknowledged within it.
    timed_out,
    /// An answer too few acknowledged in time, acknowledged later while the gateway kept
    /// waiting.
    late,
    /// An answer still not acknowledged when the gateway stopped waiting (its lease ended).
    never,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AckLabel {
    pub write: Written,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub write: Written,
}

/// The metrics of replica acknowledgements.
#[derive(Clone)]
pub struct ReplicaMetrics {
    /// Acknowledgements by write and outcome.
    pub acks: Family<AckLabel, Counter>,
    /// How long a write and its acknowledgement took, by write.
    pub seconds: Family<WriteLabel, Histogram>,
    /// Answers the client got before replicas held them.
    pub answers_unreplicated: Counter,
    /// Claims given back, their requests not forwarded, for want of replicas.
    pub claims_unreplicated: Counter,
}

impl Default for ReplicaMetrics {
    fn default() -> Self {
        Self {
            acks: Family::default(),
            seconds: Family::new_with_constructor(crate::metrics::latency_histogram),
            answers_unreplicated: Counter::default(),
            claims_unreplicated: Counter::default(),
        }
    }
}

/// What `replica_acks` asks for, and what became of it.
pub(super) struct Replicas {
    acks: ReplicaAcks,
    /// `WAIT count timeout`, made once.
    wait: redis::Cmd,
    pub metrics: ReplicaMetrics,
    /// When the last line about answers replied to before replication was logged, and how
    /// many there have been since.
    logged: Mutex<(Option<Instant>, u64)>,
}

impl Replicas {
    pub fn new(acks: ReplicaAcks) -> Self {
        let mut wait = redis::cmd("WAIT");
        wait.arg(acks.count).arg(ms(acks.timeout));
        Self { acks, wait, metrics: ReplicaMetrics::default(), logged: Mutex::new((None, 0)) }
    }

    /// The `WAIT` to send behind a write, if any replica is waited for.
    pub fn wait(&self) -> Option<&redis::Cmd> {
        (self.acks.count > 0).then_some(&self.wait)
    }

    /// How many replicas each write waits for.
    pub fn count(&self) -> u32 {
        self.acks.count
    }

    /// The longest a write waits for them.
    pub fn timeout(&self) -> Duration {
        self.acks.timeout
    }

    /// Counts a write's acknowledgement (`got` replicas, after `took`); true when enough.
    pub fn record(&self, write: Written, got: i64, took: Duration) -> bool {
        let enough = got >= i64::from(self.acks.count);
        let outcome = if enough { Outcome::acknowledged } else { Outcome::timed_out };
        self.metrics.acks.get_or_create(&AckLabel { write, outcome }).inc();
        self.metrics.seconds.get_or_create(&WriteLabel { write }).observe(took.as_secs_f64());
        enough
    }

    /// An answer (or a release, an unknown mark, a lookup's end) that too few replicas
    /// acknowledged in time: the client is answered all the same (the request ran), and the
    /// gateway goes on waiting on the write's own connection until `until`, in the background.
    /// Counted, and logged at most once per [`LOG_EVERY`], naming the store.
    pub fn keep_waiting(self: &Arc<Self>, write: Written, held: Held, got: i64, until: Instant, store: String) {
        if write == Written::answer {
            self.metrics.answers_unreplicated.inc();
        }
        self.log_short(write, got, &store);
        let replicas = Arc::clone(self);
        tokio::spawn(async move {
            let mut held = held;
            let outcome = loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Outcome::never;
                }
                let mut wait = redis::cmd("WAIT");
                wait.arg(replicas.acks.count).arg(ms(left.min(replicas.acks.timeout)));
                // The same connection: its last write is the one waited for.
                let asked =
                    tokio::time::timeout(left + replicas.acks.timeout, wait.query_async::<i64>(held.link())).await;
                match asked {
                    Ok(Ok(n)) if n >= i64::from(replicas.acks.count) => break Outcome::late,
                    Ok(Ok(_)) => {}
                    // A broken connection cannot say any more about the write.
                    Ok(Err(_)) | Err(_) => {
                        replicas.metrics.acks.get_or_create(&AckLabel { write, outcome: Outcome::never }).inc();
                        return;
                    }
                }
            };
            replicas.metrics.acks.get_or_create(&AckLabel { write, outcome }).inc();
            if outcome == Outcome::late {
                held.give_back();
            }
        });
    }

    /// A claim too few replicas acknowledged in time: refused, counted, and logged at most
    /// once per [`LOG_EVERY`].
    pub fn claim_refused(&self, got: i64, store: &str) {
        self.metrics.claims_unreplicated.inc();
        self.log_short(Written::claim, got, store);
    }

    fn log_short(&self, write: Written, got: i64, store: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        logged.1 += 1;
        if logged.0.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return;
        }
        let since = std::mem::take(&mut logged.1);
        logged.0 = Some(Instant::now());
        drop(logged);
        let what = match write {
            Written::claim => "claims refused (503, nothing forwarded)",
            _ => "writes replied to before their replicas held them (a failover now may forget them; still waiting)",
        };
        tracing::warn!(
            store,
            ?write,
            acknowledged = got,
            wanted = self.acks.count,
            within = ?self.acks.timeout,
            since_last_line = since,
            "too few replicas acknowledge: {what}"
        );
    }
}
