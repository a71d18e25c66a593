//! The Redis store: every transition is one Lua script, run by SHA.
//!
//! Scripts are built once (their SHA computed once), loaded when the gateway starts and sent
//! with EVALSHA; on NOSCRIPT (a restarted or failed-over Redis) the script is loaded and the
//! call repeated. Calls go over a few multiplexed connections (`store.connections`), which
//! pipeline every concurrent call instead of holding a connection per call: one round trip per
//! transition, and concurrent requests share writes. A broken connection reconnects by itself.
//! Every call is bounded by the store timeout.
//! Times are Redis server time (`TIME`) or relative expiry, never a gateway's wall clock,
//! so that gateways with skewed clocks agree on every lease.
//!
//! Waiting duplicates are woken through pub/sub: a claim that finds the key in flight sets a
//! flag on the record, and the owner's complete/release script publishes the key name on the
//! gateway's channel only when that flag is set, so uncontended keys cost nothing. One
//! subscriber task per gateway fans messages out to local waiters. Pub/sub delivery is
//! at-most-once; waiters therefore also re-read the key at a bounded interval.
//!
//! Redis can lose records: a restart without persistence, a failover to a replica that had not
//! caught up, a FLUSHALL, eviction under memory pressure. The gateway cannot prevent a retry
//! from running again then (the upstream's UNIQUE constraint must catch it), but it says so:
//! each gateway keeps an epoch marker (`PREFIX:epoch`) and checks it every second, together
//! with the server's `run_id` and `master_replid`; when the marker vanishes or changes, or the
//! server behind the address is another one (restart, failover), the loss is logged and
//! counted (`store_data_loss_total`). Only `maxmemory-policy noeviction` keeps records from
//! being evicted: the `volatile-*` policies evict records (they expire), never the marker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, RedisWrite, Script, ServerErrorKind, ToRedisArgs,
    Value,
};
use tokio::task::JoinHandle;

use super::waiters::Waiters;
use super::{
    Claim, Entry, EntryState, Final, Lease, OwnerToken, QuotaKey, RecordKey, Renewal, Sent, Settled, Store, StoreError,
    StoredResponse, Watch,
};
use crate::config::RedisTls;
use crate::idempotent::fingerprint::Fingerprint;

/// How often a waiter re-reads its key while the subscription is up (a lost message costs at
/// most this much extra wait) and while it is down.
const POLL_SUBSCRIBED: Duration = Duration::from_secs(1);
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);

struct Scripts {
    claim: Script,
    renew: Script,
    settle: Script,
    release: Script,
    purge: Script,
    inspect: Script,
    quota: Script,
}

impl Scripts {
    fn all(&self) -> [&Script; 7] {
        [&self.claim, &self.renew, &self.settle, &self.release, &self.purge, &self.inspect, &self.quota]
    }

    fn new() -> Self {
        Self {
            claim: Script::new(include_str!("lua/claim.lua")),
            renew: Script::new(include_str!("lua/renew.lua")),
            settle: Script::new(include_str!("lua/settle.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            purge: Script::new(include_str!("lua/purge.lua")),
            inspect: Script::new(include_str!("lua/inspect.lua")),
            quota: Script::new(include_str!("lua/quota.lua")),
        }
    }
}

/// Redis-backed store, shared by any number of gateway instances.
pub struct RedisStore {
    connections: Connections,
    scripts: Arc<Scripts>,
    timeout: Duration,
    channel: String,
    waiters: Arc<Waiters>,
    subscribed: Arc<AtomicBool>,
    data_loss: Counter,
    /// Subscriber, epoch watch and script warm-up; stopped with the store.
    background: Vec<JoinHandle<()>>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

/// A fixed set of multiplexed, self-reconnecting connections, used in turn.
#[derive(Clone)]
struct Connections {
    managers: Arc<[ConnectionManager]>,
    next: Arc<AtomicUsize>,
}

impl Connections {
    fn new(client: &redis::Client, count: usize, timeout: Duration) -> Result<Self, StoreError> {
        // A broken connection is re-established on the next call; retries inside one call are
        // few and short so that an unreachable Redis surfaces as an error within the timeout
        // (and the route's on_store_error applies) instead of a long hang. The deadline of a
        // call is set once, by `query`; the connection timeout here bounds a reconnection,
        // which also runs outside any call.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(timeout);
        let managers = (0..count.max(1))
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        Ok(Self { managers: managers.into(), next: Arc::new(AtomicUsize::new(0)) })
    }

    fn pick(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.managers.len();
        self.managers[i].clone()
    }
}

impl RedisStore {
    /// Prepares `connections` multiplexed connections and starts the notification subscriber.
    /// Connections are made on first use, so this succeeds while Redis is down. Must be called
    /// inside a tokio runtime.
    pub fn new(url: &str, connections: usize, timeout: Duration, key_prefix: &str) -> Result<Self, StoreError> {
        Self::with_client(redis::Client::open(url).map_err(unavailable)?, connections, timeout, key_prefix)
    }

    /// Like [`RedisStore::new`], over a client built by [`client`] (TLS, a password).
    pub fn with_client(
        client: redis::Client,
        connections: usize,
        timeout: Duration,
        key_prefix: &str,
    ) -> Result<Self, StoreError> {
        let connections = Connections::new(&client, connections, timeout)?;
        let scripts = Arc::new(Scripts::new());
        let channel = format!("{key_prefix}:settled");
        let waiters = Arc::new(Waiters::default());
        let subscribed = Arc::new(AtomicBool::new(false));
        let data_loss = Counter::default();
        let background = vec![
            tokio::spawn(subscribe(client, channel.clone(), Arc::clone(&waiters), Arc::clone(&subscribed))),
            tokio::spawn(watch_epoch(connections.pick(), format!("{key_prefix}:epoch"), data_loss.clone())),
            tokio::spawn(load_scripts(connections.clone(), Arc::clone(&scripts))),
        ];
        Ok(Self { connections, scripts, timeout, channel, waiters, subscribed, data_loss, background })
    }

    /// Counts the times this gateway saw Redis lose its data (see the module docs).
    pub fn data_loss_counter(&self) -> Counter {
        self.data_loss.clone()
    }

    /// Runs `cmd` within the store timeout. For an EVALSHA of `script`, a NOSCRIPT reply (Redis
    /// restarted or failed over) loads the script and repeats the call once.
    async fn query<T: FromRedisValue>(&self, cmd: Cmd, script: Option<&Script>) -> Result<T, StoreError> {
        let call = async {
            let mut conn = self.connections.pick();
            match (cmd.query_async(&mut conn).await, script) {
                (Err(e), Some(script)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await.map_err(unavailable)?;
                    cmd.query_async(&mut conn).await.map_err(unavailable)
                }
                (result, _) => result.map_err(unavailable),
            }
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// Calls `script` on the one key `key` (a record, or a quota counter); `args` appends its
    /// ARGV.
    async fn eval(&self, script: &Script, key: &str, args: impl FnOnce(&mut Cmd)) -> Result<Value, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(key);
        args(&mut cmd);
        self.query(cmd, Some(script)).await
    }
}

/// A Redis client for `url`: `redis://` or `rediss://` (TLS), with `[user:password@]`.
/// `tls` replaces the system roots with a CA bundle and adds a client certificate for mutual
/// TLS; `password` (from `password_env`) overrides a password in the URL. Neither appears in
/// an error.
pub fn client(url: &str, tls: &RedisTls, password: Option<&str>) -> Result<redis::Client, StoreError> {
    let mut info =
        url.into_connection_info().map_err(|e| StoreError::Unavailable(format!("bad Redis URL ({:?})", e.kind())))?;
    if let Some(password) = password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    if tls.ca_file.is_none() && tls.client.is_none() {
        return redis::Client::open(info).map_err(unavailable);
    }
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| StoreError::Unavailable(format!("cannot read {}: {e}", path.display())))
    };
    let client_tls = match &tls.client {
        Some((cert, key)) => Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key)? }),
        None => None,
    };
    let root_cert = tls.ca_file.as_deref().map(read).transpose()?;
    redis::Client::build_with_tls(info, redis::TlsCertificates { client_tls, root_cert }).map_err(unavailable)
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn ms(d: Duration) -> u64 {
    // Redis rejects a zero expiry; every duration here is validated positive, keep it so.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Store for RedisStore {
    async fn claim(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: OwnerToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let reply = self
            .eval(&self.scripts.claim, key.as_str(), |cmd| {
                cmd.arg(&fingerprint.as_bytes()[..]).arg(&owner.as_bytes()[..]).arg(ms(lease)).arg(ms(ttl.max(lease)));
            })
            .await?;
        let mut items = Reply::array(reply)?;
        match items.tag()?.as_slice() {
            b"acquired" => Ok(Claim::Acquired(Lease::new(key.clone(), owner, items.attempt()?, lease, ttl))),
            b"completed" => Ok(Claim::Completed(items.response()?)),
            b"executed" => Ok(Claim::Executed(items.response()?)),
            b"unknown" => Ok(Claim::Unknown { attempt: items.attempt()? }),
            b"inflight" => Ok(Claim::InFlight { lease_left: Duration::from_millis(items.int()?.max(0) as u64) }),
            b"mismatch" => Ok(Claim::Mismatch),
            other => Err(protocol(&format!("unknown claim reply {:?}", String::from_utf8_lossy(other)))),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal, StoreError> {
        let reply = self
            .eval(&self.scripts.renew, lease.key.as_str(), |cmd| {
                cmd.arg(&lease.owner.as_bytes()[..]).arg(ms(lease.duration)).arg(ms(lease.ttl.max(lease.duration)));
            })
            .await?;
        match Reply::integer(reply)? {
            1 => Ok(Renewal::Renewed),
            _ => Ok(Renewal::Lost),
        }
    }

    async fn settle(&self, lease: &Lease, outcome: Final<'_>, retention: Duration) -> Result<Settled, StoreError> {
        let (state, response) = match outcome {
            Final::Response(r) => ("c", Some(r)),
            Final::Executed(r) => ("x", Some(r)),
            Final::Unknown => ("u", None),
        };
        let reply = self
            .eval(&self.scripts.settle, lease.key.as_str(), |cmd| {
                cmd.arg(&lease.owner.as_bytes()[..]).arg(state);
                match response {
                    Some(r) => cmd.arg(Encoded(r)),
                    None => cmd.arg(""),
                };
                cmd.arg(ms(retention)).arg(&self.channel);
            })
            .await?;
        settled(Reply::integer(reply)?)
    }

    async fn release(
        &self,
        key: &RecordKey,
        owner: OwnerToken,
        sent: Sent,
        ttl: Duration,
    ) -> Result<Settled, StoreError> {
        let sent = match sent {
            Sent::Maybe => "1",
            Sent::No => "0",
        };
        let reply = self
            .eval(&self.scripts.release, key.as_str(), |cmd| {
                cmd.arg(&owner.as_bytes()[..]).arg(sent).arg(ms(ttl)).arg(&self.channel);
            })
            .await?;
        settled(Reply::integer(reply)?)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Entry>, StoreError> {
        let mut items = Reply::array(self.eval(&self.scripts.inspect, key.as_str(), |_| {}).await?)?;
        if items.is_empty() {
            return Ok(None);
        }
        let tag = items.tag()?;
        let attempt = items.attempt()?;
        let lease_left = Duration::from_millis(items.int()?.max(0) as u64);
        let expires_in = Duration::from_millis(items.int()?.max(0) as u64);
        let state = match tag.as_slice() {
            b"p" => EntryState::InProgress { lease_left },
            b"c" => {
                let r = items.response()?;
                EntryState::Completed { status: r.status.as_u16(), body_len: r.body.len() }
            }
            b"x" => EntryState::Executed { status: items.response()?.status.as_u16() },
            b"u" => EntryState::Unknown,
            b"r" => EntryState::Released,
            _ => return Err(protocol("unknown record state")),
        };
        Ok(Some(Entry { state, attempt, expires_in }))
    }

    async fn purge(&self, key: &RecordKey) -> Result<Option<&'static str>, StoreError> {
        let reply = self.eval(&self.scripts.purge, key.as_str(), |cmd| {
            cmd.arg(&self.channel);
        });
        let mut items = Reply(vec![reply.await?].into_iter());
        Ok(match items.tag()?.as_slice() {
            b"" => None,
            b"p" => Some("in_progress"),
            b"c" => Some("completed"),
            b"x" => Some("executed"),
            b"u" => Some("unknown"),
            other => return Err(protocol(&format!("unknown purge reply {:?}", String::from_utf8_lossy(other)))),
        })
    }

    fn watch(&self, key: &RecordKey) -> Watch {
        let poll = if self.subscribed.load(Ordering::Acquire) { POLL_SUBSCRIBED } else { POLL_UNSUBSCRIBED };
        self.waiters.watch(key.as_str(), Some(poll))
    }

    async fn count_new_key(&self, key: &QuotaKey, window: Duration) -> Result<(u64, Duration), StoreError> {
        let reply = self.eval(&self.scripts.quota, key.as_str(), |cmd| {
            cmd.arg(ms(window));
        });
        let mut items = Reply::array(reply.await?)?;
        let count = u64::try_from(items.int()?).map_err(|_| protocol("quota count out of range"))?;
        let left = Duration::from_millis(items.int()?.max(0) as u64);
        Ok((count, left))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = self.query(redis::cmd("PING"), None).await?;
        Ok(())
    }
}

/// A response as a script argument, encoded straight into the command's buffer: the body is
/// copied once, not into an intermediate record first.
struct Encoded<'a>(&'a StoredResponse);

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // The command buffer is memory; writing to it cannot fail.
        let _ = self.0.write_encoded(&mut out.writer_for_next_arg());
    }
}

fn settled(n: i64) -> Result<Settled, StoreError> {
    Ok(if n == 1 { Settled::Done } else { Settled::Lost })
}

fn protocol(what: &str) -> StoreError {
    StoreError::Protocol(what.to_owned())
}

/// Reads a script's array reply front to back.
struct Reply(std::vec::IntoIter<Value>);

impl Reply {
    fn array(v: Value) -> Result<Self, StoreError> {
        match v {
            Value::Array(items) => Ok(Self(items.into_iter())),
            other => Err(protocol(&format!("expected an array, got {other:?}"))),
        }
    }

    fn integer(v: Value) -> Result<i64, StoreError> {
        match v {
            Value::Int(n) => Ok(n),
            other => Err(protocol(&format!("expected an integer, got {other:?}"))),
        }
    }

    fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    fn tag(&mut self) -> Result<Vec<u8>, StoreError> {
        self.bytes()
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.0.next() {
            Some(Value::BulkString(b)) => Ok(b),
            Some(Value::SimpleString(s)) => Ok(s.into_bytes()),
            other => Err(protocol(&format!("expected a string, got {other:?}"))),
        }
    }

    fn attempt(&mut self) -> Result<u32, StoreError> {
        u32::try_from(self.int()?).map_err(|_| protocol("attempt out of range"))
    }

    fn response(&mut self) -> Result<StoredResponse, StoreError> {
        StoredResponse::decode(Bytes::from(self.bytes()?)).map_err(|e| protocol(&e.to_string()))
    }

    fn int(&mut self) -> Result<i64, StoreError> {
        match self.0.next() {
            Some(v) => Self::integer(v),
            None => Err(protocol("reply too short")),
        }
    }
}

/// Keeps one subscription to the settle channel alive and wakes local waiters.
async fn subscribe(client: redis::Client, channel: String, waiters: Arc<Waiters>, subscribed: Arc<AtomicBool>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    subscribed.store(true, Ordering::Release);
                    backoff = Duration::from_millis(100);
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if let Ok(key) = std::str::from_utf8(msg.get_payload_bytes()) {
                            waiters.notify(key);
                        }
                    }
                    subscribed.store(false, Ordering::Release);
                    tracing::warn!(channel, "store notification subscription lost; waiters poll until it is back");
                }
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to store notifications"),
            },
            Err(e) => tracing::debug!(error = %e, "store unreachable for notifications"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// How often the epoch marker is checked.
const EPOCH_CHECK: Duration = Duration::from_secs(1);

/// What the gateway knows of the Redis it talks to, checked every [`EPOCH_CHECK`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    /// The epoch marker's value (`PREFIX:epoch`).
    epoch: String,
    /// `run_id`: new on every start of the server process.
    run_id: String,
    /// `master_replid`: new when a replica is promoted (a failover).
    replid: String,
}

/// Detects that Redis lost, or may have lost, its data:
///
/// - the epoch marker this gateway saw is gone or replaced: the records went with it
///   (restart without persistence, flush, failover to an empty replica, eviction);
/// - the marker is there but the server is another one (`run_id` or `master_replid` changed):
///   a restart from a snapshot or a failover to a replica that lagged may have lost the last
///   writes before it, so a retry of a request answered just before may run again.
async fn watch_epoch(conn: ConnectionManager, marker: String, data_loss: Counter) {
    let mut known: Option<Observed> = None;
    loop {
        // A fresh candidate each time: a marker re-created by this same gateway after a loss
        // must differ from the one it knew.
        let candidate = hex::encode(rand::random::<[u8; 16]>());
        // Bounded here: connections carry no deadline of their own (calls set theirs).
        let observed = tokio::time::timeout(EPOCH_CHECK, observe(conn.clone(), &marker, &candidate)).await;
        match observed.unwrap_or(Err(StoreError::Timeout(EPOCH_CHECK))) {
            Ok(current) => {
                if let Some(previous) = known.as_ref() {
                    report_change(previous, &current, &data_loss);
                }
                known = Some(current);
            }
            Err(e) => tracing::debug!(error = %e, "epoch check skipped: store unreachable"),
        }
        tokio::time::sleep(EPOCH_CHECK).await;
    }
}

fn report_change(previous: &Observed, current: &Observed, data_loss: &Counter) {
    if previous.epoch != current.epoch {
        data_loss.inc();
        tracing::error!(
            previous = %previous.epoch,
            current = %current.epoch,
            "Redis lost its data (restart without persistence, failover, flush or eviction): \
             retries of requests that already ran will reach the upstream again, whose own \
             UNIQUE constraint must answer them"
        );
    } else if previous.run_id != current.run_id || previous.replid != current.replid {
        data_loss.inc();
        tracing::error!(
            restarted = previous.run_id != current.run_id,
            failed_over = previous.replid != current.replid,
            "Redis restarted or failed over: records written just before may be lost, so a \
             retry of a request answered then may reach the upstream again, whose own UNIQUE \
             constraint must answer it"
        );
    }
}

/// The current epoch (the existing marker, or `candidate` if there was none, set without
/// expiry) and the server's identity, in one round trip.
async fn observe(mut conn: ConnectionManager, marker: &str, candidate: &str) -> Result<Observed, StoreError> {
    let (epoch, server, replication): (String, String, String) = redis::pipe()
        .cmd("SET")
        .arg(marker)
        .arg(candidate)
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(marker)
        .cmd("INFO")
        .arg("server")
        .cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    Ok(Observed { epoch, run_id: info_field(&server, "run_id"), replid: info_field(&replication, "master_replid") })
}

/// One `name:value` line of an INFO reply ("" when absent).
fn info_field(info: &str, name: &str) -> String {
    info.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// How long one script load may take at startup before it is tried again.
const SCRIPT_LOAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Loads every script once Redis answers, so that the first calls after a start do not begin
/// with a NOSCRIPT round trip. (After a Redis restart, NOSCRIPT handling in `query` reloads.)
async fn load_scripts(connections: Connections, scripts: Arc<Scripts>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut conn = connections.pick();
        let mut loaded = true;
        for script in scripts.all() {
            let load = tokio::time::timeout(SCRIPT_LOAD_TIMEOUT, script.load_async(&mut conn)).await;
            loaded &= matches!(load, Ok(Ok(_)));
        }
        if loaded {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
