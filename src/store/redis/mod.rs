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
//! `scripts`, and what one round trip sends and how its reply is read, `round_trip`.

mod epoch;
mod layout;
mod links;
mod notify;
mod round_trip;
mod scripts;
mod sentinel;
mod settings;

pub use self::settings::{Persistence, Settings, Severity};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisWrite, ServerErrorKind, ToRedisArgs, Value};
use tokio::task::JoinHandle;

use self::layout::Record;
use self::links::{Links, Opened, unavailable};
use self::round_trip::{Reply, Request, protocol};
use self::scripts::{Lua, Scripts, load_scripts};
use self::sentinel::Follower;

use super::index::unix_ms;
use super::waiters::Waiters;
use super::{
    Claim, Cursor, Entry, EntryState, Final, IndexEntry, IndexKey, Lease, LookupEnd, LookupEnded, LookupStart,
    OwnerToken, Page, Purged, QuotaKey, RecordKey, Renewal, Resolved, Sent, Settled, State, Store, StoreError,
    StoredResponse, Watch,
};
use crate::config::{RedisTarget as Target, RedisTls};
use crate::policy::fingerprint::Fingerprint;

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
    pub fn new(url: &str, connections: usize, timeout: Duration, key_prefix: &str) -> Result<Self, StoreError> {
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
    ) -> Result<Self, StoreError> {
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

    /// Runs `request` within the store timeout, in one round trip. A NOSCRIPT reply (to an
    /// EVALSHA) sends `on_noscript()` instead, once.
    async fn query<T: FromRedisValue>(
        &self,
        request: impl Into<Request>,
        on_noscript: Option<&(dyn Fn() -> Request + Sync)>,
    ) -> Result<T, StoreError> {
        let request = request.into();
        let call = async {
            let mut conn = self.links.pick()?;
            self.commands.inc();
            let mut result = match (request.send(&mut conn).await, on_noscript) {
                (Err(e), Some(eval)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.commands.inc();
                    eval().send(&mut conn).await
                }
                (result, _) => result,
            };
            // A Cluster's redirections, which its client leaves to us (see `links`): after
            // MOVED it knows the slot's new node, so the call goes again; after ASK the call
            // goes to the node named, for this one call.
            match result.as_ref().err().map(|e| (e.kind(), e.redirect_node())) {
                Some((ErrorKind::Server(ServerErrorKind::Moved), _)) => {
                    self.commands.inc();
                    result = match (request.send(&mut conn).await, on_noscript) {
                        // The slot's new node may not have the script yet.
                        (Err(e), Some(eval)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                            self.commands.inc();
                            eval().send(&mut conn).await
                        }
                        (result, _) => result,
                    };
                }
                // `redirect_node` is the node's "host:port" and the slot. Boxed: making a
                // connection is a large future, and inline it would swell every store call's
                // (and so every request's) state for a path taken only during migrations.
                Some((ErrorKind::Server(ServerErrorKind::Ask), Some((address, _slot)))) => {
                    if let Some(followed) = Box::pin(self.asking(&request, address, on_noscript)).await? {
                        result = followed;
                    }
                }
                _ => {}
            }
            if let Err(e) = &result {
                // A demoted primary answers READONLY; a dead one breaks the connection.
                if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) || e.is_io_error() {
                    self.links.report_trouble();
                }
            }
            result.map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// Sends `request` to the node an ASK redirection named (see [`Request::asking`]), and by
    /// the script's text if that node lacks the script. `None` for a request that cannot be
    /// redirected this way.
    async fn asking<T: FromRedisValue>(
        &self,
        request: &Request,
        address: &str,
        on_noscript: Option<&(dyn Fn() -> Request + Sync)>,
    ) -> Result<Option<redis::RedisResult<T>>, StoreError> {
        let (address, mut conn) = self.links.node(address).await?;
        self.commands.inc();
        let Some(first) = request.asking(&mut conn).await else { return Ok(None) };
        let result = match (first, on_noscript) {
            (Err(e), Some(eval)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.commands.inc();
                match eval().asking(&mut conn).await {
                    Some(result) => result,
                    None => return Ok(None),
                }
            }
            (result, _) => result,
        };
        if result.as_ref().is_err_and(redis::RedisError::is_io_error) {
            self.links.forget_node(&address);
        }
        Ok(Some(result))
    }

    /// Calls `script` on the one key `key` (a record, or a quota counter); `args` appends its
    /// ARGV.
    async fn eval(&self, lua: &Lua, key: &str, args: impl Fn(&mut Cmd) + Sync) -> Result<Value, StoreError> {
        self.eval_keys(lua, &[key], args).await
    }

    /// Calls `script` on `keys` (all in one hash slot); `args` appends its ARGV.
    async fn eval_keys(&self, lua: &Lua, keys: &[&str], args: impl Fn(&mut Cmd) + Sync) -> Result<Value, StoreError> {
        self.eval_sized(lua, keys, 0, args).await
    }

    /// [`Self::eval_keys`] with room for `extra` bytes of arguments in the command's buffer
    /// from the start (a response: grown as it is written, the buffer is copied at every
    /// doubling).
    async fn eval_sized(
        &self,
        lua: &Lua,
        keys: &[&str],
        extra: usize,
        args: impl Fn(&mut Cmd) + Sync,
    ) -> Result<Value, StoreError> {
        let call = |verb: &str, script: &str| {
            let mut cmd = Cmd::with_capacity(keys.len() + 8, extra + 128);
            cmd.arg(verb);
            cmd.arg(script).arg(keys.len());
            for key in keys {
                cmd.arg(*key);
            }
            args(&mut cmd);
            cmd
        };
        self.query(call("EVALSHA", lua.script.get_hash()), Some(&|| call("EVAL", lua.code).into())).await
    }

    /// Calls the index script on `index`'s keys.
    async fn eval_index(&self, index: &IndexKey, args: impl Fn(&mut Cmd) + Sync) -> Result<Value, StoreError> {
        let keys = [index.set(State::Unknown), index.set(State::Executed), index.data()];
        let keys = [keys[0].as_str(), keys[1].as_str(), keys[2].as_str()];
        self.eval_keys(&self.scripts.index, &keys, args).await
    }

    /// Settles a claim whose response is large, without copying the response inside Redis.
    ///
    /// Passed to the settle script as an argument, a response is copied into a Lua string and
    /// again by `APPEND` into the record: for 1 MiB, 1.7 ms of Redis's time, most of it page
    /// faults on fresh allocations. Here it goes, in the same round trip, to a side key of its
    /// own with a native `SET` (which keeps a large argument's buffer as the value), behind
    /// room for the record's header; the script writes the header into that room
    /// (`SETRANGE`, in place) and renames the side key over the record, or deletes it when
    /// the claim is no longer this owner's. The side key shares the record's hash slot (its
    /// hash tag is the record's whole name, which has no braces), and lives no longer than
    /// the claim if the script never runs.
    async fn settle_aside(
        &self,
        lease: &Lease,
        state: State,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Settled, StoreError> {
        // `PREFIX:aside:{RECORD}`: under the prefix like every key, and in the record's slot.
        let side = format!("{}:aside:{{{}}}", self.prefix, lease.key.as_str());
        let pipe = |verb: &str, script: &str| {
            let mut pipe = redis::pipe();
            // Sized for the response up front: grown as it is written, the command's buffer
            // would be copied on every doubling (a whole body's copy more for 64 KiB).
            let mut set = Cmd::with_capacity(5, side.len() + layout::HEADER + response.encoded_len() + 32);
            set.arg("SET").arg(&side).arg(Aside(response)).arg("PX").arg(ms(lease.ttl.max(lease.duration)));
            pipe.add_command(set).ignore();
            pipe.cmd(verb).arg(script).arg(2).arg(lease.key.as_str()).arg(&side);
            pipe.arg(&lease.owner.as_bytes()[..])
                .arg(&[state.letter()][..])
                .arg("")
                .arg(ms(retention))
                .arg(&self.channel);
            pipe
        };
        let settle = &self.scripts.settle;
        let (reply,): (i64,) =
            self.query(pipe("EVALSHA", settle.script.get_hash()), Some(&|| pipe("EVAL", settle.code).into())).await?;
        settled(reply)
    }

    /// The settle script with the response as its argument, on the record's one key.
    async fn settle_in_place(
        &self,
        lease: &Lease,
        state: State,
        response: Option<&StoredResponse>,
        retention: Duration,
    ) -> Result<Settled, StoreError> {
        let extra = response.map_or(0, StoredResponse::encoded_len);
        let reply = self
            .eval_sized(&self.scripts.settle, &[lease.key.as_str()], extra, |cmd| {
                cmd.arg(&lease.owner.as_bytes()[..]).arg(&[state.letter()][..]);
                match response {
                    Some(r) => cmd.arg(Encoded(r)),
                    None => cmd.arg(""),
                };
                cmd.arg(ms(retention)).arg(&self.channel);
            })
            .await?;
        settled(Reply::integer(reply)?)
    }
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
        // The common cases in one native command: an absent key is claimed, a settled one
        // answered from the reply. A claim in progress or a released tombstone needs a
        // compare-and-set (register a waiter, take over, count the attempt): the script.
        // The lease began no earlier than this: counted from it, never from the reply.
        let sent = tokio::time::Instant::now();
        let (lease_ms, ttl_ms) = (ms(lease), ms(ttl.max(lease)));
        let mut set = redis::cmd("SET");
        set.arg(key.as_str()).arg(layout::claim(1, ttl_ms, lease_ms, fingerprint, &owner));
        set.arg("NX").arg("GET").arg("PX").arg(ttl_ms);
        let existing: Option<Vec<u8>> = self.query(set, None).await?;
        let Some(existing) = existing else {
            return Ok(Claim::Acquired(Lease::new(key.clone(), owner, 1, lease, ttl, sent)));
        };
        let record = Record::parse(Bytes::from(existing))?;
        // The same order as claim.lua: a tombstone is claimable whatever the request; then the
        // fingerprint, then the state.
        match record.state {
            State::Released => {}
            _ if !record.fingerprint_is(fingerprint) => return Ok(Claim::Mismatch),
            State::Completed => return Ok(Claim::Completed(decode(record.response())?)),
            State::Executed => return Ok(Claim::Executed(decode(record.response())?)),
            State::Unknown => return Ok(Claim::Unknown { attempt: record.attempt }),
            State::InProgress => {}
        }
        let reply = self
            .eval(&self.scripts.claim, key.as_str(), |cmd| {
                cmd.arg(&fingerprint.as_bytes()[..]).arg(&owner.as_bytes()[..]).arg(lease_ms).arg(ttl_ms);
            })
            .await?;
        let mut items = Reply::array(reply)?;
        match items.tag()?.as_slice() {
            b"acquired" => Ok(Claim::Acquired(Lease::new(key.clone(), owner, items.attempt()?, lease, ttl, sent))),
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
        let state = outcome.state();
        let response = match outcome {
            Final::Response(r) | Final::Executed(r) => Some(r),
            Final::Unknown { trusted_in } => {
                let trusted_ms = u64::try_from(trusted_in.as_millis()).unwrap_or(u64::MAX);
                let tail = layout::unknown_tail(ms(retention), trusted_ms, &lease.owner);
                let reply = self
                    .eval(&self.scripts.settle, lease.key.as_str(), |cmd| {
                        cmd.arg(&lease.owner.as_bytes()[..])
                            .arg(&[state.letter()][..])
                            .arg(&tail)
                            .arg(ms(retention))
                            .arg(&self.channel);
                    })
                    .await?;
                return settled(Reply::integer(reply)?);
            }
        };
        if let Some(large) = response.filter(|r| r.body.len() >= ASIDE_FROM) {
            match self.settle_aside(lease, state, large, retention).await {
                // While its slot migrates, the record may still be on the source node and the
                // side key land on the target (ASK), or the two keys be split between them
                // (TRYAGAIN): the two-key settle cannot work until the migration ends, which
                // may take longer than the lease. The one-key settle, with the body as an
                // argument, follows the redirection like any one-key call. (The side key, if
                // it was written, expires with the claim.)
                Err(StoreError::Migrating(e)) => {
                    tracing::debug!(key = lease.key.short(), error = %e, "large settle met a slot migration; settling in one key");
                    // Had the two-key try landed after all, this one finds the record
                    // settled by this owner and says so.
                    return self.settle_in_place(lease, state, response, retention).await;
                }
                other => return other,
            }
        }
        self.settle_in_place(lease, state, response, retention).await
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
        let state = match state_of(&tag)?.ok_or_else(|| protocol("a record without a state"))? {
            State::InProgress => EntryState::InProgress { lease_left },
            State::Completed => {
                let r = items.response()?;
                EntryState::Completed { status: r.status.as_u16(), body_len: r.body.len() }
            }
            State::Executed => EntryState::Executed { status: items.response()?.status.as_u16() },
            State::Unknown => {
                // Negative: the record keeps no trust time (written by an earlier version).
                let trusted_in = u64::try_from(items.int()?).ok().map(Duration::from_millis);
                EntryState::Unknown { lookup: Some(lease_left).filter(|left| !left.is_zero()), trusted_in }
            }
            State::Released => EntryState::Released,
        };
        Ok(Some(Entry { state, attempt, expires_in }))
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Resolved, StoreError> {
        let reply = self.eval(&self.scripts.resolve, key.as_str(), |cmd| {
            cmd.arg(Encoded(response)).arg(ms(retention)).arg(&self.channel);
        });
        let mut items = Reply::array(reply.await?)?;
        let done = items.int()? == 1;
        let state = state_of(&items.tag()?)?;
        Ok(match (done, state) {
            (true, Some(was)) => Resolved::Done { was },
            (_, state) => Resolved::Refused { state },
        })
    }

    async fn begin_lookup(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        token: OwnerToken,
        lease: Duration,
    ) -> Result<LookupStart, StoreError> {
        let reply = self.eval(&self.scripts.lookup, key.as_str(), |cmd| {
            cmd.arg("begin").arg(&fingerprint.as_bytes()[..]).arg(&token.as_bytes()[..]).arg(ms(lease));
        });
        let mut items = Reply::array(reply.await?)?;
        match items.tag()?.as_slice() {
            b"started" => Ok(LookupStart::Started { attempt: items.attempt()? }),
            b"busy" => Ok(LookupStart::Busy { left: Duration::from_millis(items.int()?.max(0) as u64) }),
            b"moved" => Ok(LookupStart::Moved),
            other => Err(protocol(&format!("unknown lookup reply {:?}", String::from_utf8_lossy(other)))),
        }
    }

    async fn end_lookup(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        end: LookupEnd<'_>,
    ) -> Result<LookupEnded, StoreError> {
        let token = &token.as_bytes()[..];
        let reply = self.eval(&self.scripts.lookup, key.as_str(), |cmd| {
            match end {
                LookupEnd::Found { response, retention } => {
                    cmd.arg("found").arg(token).arg(Encoded(response)).arg(ms(retention))
                }
                LookupEnd::NotFound { ttl } => cmd.arg("absent").arg(token).arg(ms(ttl)),
                LookupEnd::Failed => cmd.arg("failed").arg(token),
            };
            cmd.arg(&self.channel);
        });
        let mut items = Reply::array(reply.await?)?;
        match items.tag()?.as_slice() {
            b"done" => Ok(LookupEnded::Done),
            b"early" => Ok(LookupEnded::TooEarly { left: Duration::from_millis(items.int()?.max(1) as u64) }),
            b"lost" => Ok(LookupEnded::Lost),
            other => Err(protocol(&format!("unknown lookup reply {:?}", String::from_utf8_lossy(other)))),
        }
    }

    async fn index(
        &self,
        index: &IndexKey,
        held: State,
        entry: &IndexEntry,
        expires_in: Duration,
    ) -> Result<(), StoreError> {
        let score = super::index::expiry_score(expires_in);
        let description = entry.encode();
        self.eval_index(index, |cmd| {
            cmd.arg("add").arg(&[held.letter()][..]).arg(&entry.record).arg(score).arg(&description).arg(unix_ms());
        })
        .await?;
        Ok(())
    }

    async fn unindex(&self, index: &IndexKey, record: &RecordKey) -> Result<(), StoreError> {
        self.eval_index(index, |cmd| {
            cmd.arg("remove").arg(record.as_str());
        })
        .await?;
        Ok(())
    }

    async fn list(
        &self,
        index: &IndexKey,
        held: State,
        cursor: Option<Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let start = super::index::live_start(cursor);
        let reply = self.eval_index(index, |cmd| {
            cmd.arg("list").arg(&[held.letter()][..]).arg(start.score).arg(start.skip).arg(limit);
        });
        let items = match reply.await? {
            Value::Array(items) => items,
            Value::Nil => Vec::new(),
            other => return Err(protocol(&format!("index list reply {other:?}"))),
        };
        let mut found = Vec::new();
        for triple in items.chunks(3) {
            let [name, score, description] = triple else { return Err(protocol("index list reply cut short")) };
            let score = bulk(score)
                .and_then(|s| std::str::from_utf8(s).ok()?.parse::<f64>().ok())
                .ok_or_else(|| protocol("index score is not a number"))? as u64;
            match bulk(description).and_then(IndexEntry::decode) {
                Some(entry) => found.push((entry, score)),
                // No description (written half, or by another version): named, nothing else.
                None => {
                    let name =
                        bulk(name).and_then(|n| std::str::from_utf8(n).ok()).ok_or_else(|| protocol("index name"))?;
                    found.push((IndexEntry::unnamed(name.to_owned()), score));
                }
            }
        }
        Ok(Page::new(found, start, limit))
    }

    async fn count(&self, index: &IndexKey, held: State) -> Result<u64, StoreError> {
        let reply = self.eval_index(index, |cmd| {
            cmd.arg("count").arg(&[held.letter()][..]).arg(unix_ms());
        });
        u64::try_from(Reply::integer(reply.await?)?).map_err(|_| protocol("index count out of range"))
    }

    async fn purge(&self, key: &RecordKey, force: bool) -> Result<Purged, StoreError> {
        let reply = self.eval(&self.scripts.purge, key.as_str(), |cmd| {
            cmd.arg(&self.channel).arg(if force { "1" } else { "0" });
        });
        let mut items = Reply::array(reply.await?)?;
        match items.tag()?.as_slice() {
            b"released" => match state_of(&items.tag()?)? {
                Some(State::Released) | None => Err(protocol("purge reply: released a released record")),
                Some(was) => Ok(Purged::Released { was }),
            },
            b"refused" => Ok(Purged::Refused { lease_left: Duration::from_millis(items.int()?.max(1) as u64) }),
            b"none" => Ok(Purged::Nothing),
            other => Err(protocol(&format!("unknown purge reply {:?}", String::from_utf8_lossy(other)))),
        }
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
        if !self.links.is_cluster() {
            let _: String = self.query(redis::cmd("PING"), None).await?;
            return Ok(());
        }
        // A PING would go to every primary and fail while any one is down, although the
        // other shards serve their keys (and the routes' on_store_error handles the rest):
        // a Cluster is ready when one node says the cluster is.
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("INFO");
        let info: String = self.query(cmd, None).await?;
        match info.lines().any(|line| line.trim() == "cluster_state:ok") {
            true => Ok(()),
            false => Err(StoreError::Unavailable("the Redis Cluster reports cluster_state:fail".into())),
        }
    }
}

/// A response as a script argument, encoded straight into the command's buffer: the body is
/// copied once, not into an intermediate record first.
struct Encoded<'a>(&'a StoredResponse);

/// A response as a side key holds it: room for the record's header, then the response.
struct Aside<'a>(&'a StoredResponse);

impl ToRedisArgs for Aside<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // The command buffer is memory; writing to it cannot fail.
        let _ = std::io::Write::write_all(&mut arg, &[0; layout::HEADER]);
        let _ = self.0.write_encoded(&mut arg);
    }
}

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // The command buffer is memory; writing to it cannot fail.
        let _ = self.0.write_encoded(&mut out.writer_for_next_arg());
    }
}

fn decode(response: Bytes) -> Result<StoredResponse, StoreError> {
    StoredResponse::decode(response).map_err(|e| protocol(&e.to_string()))
}

/// The bytes of a bulk string reply.
fn bulk(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The state a script replied with, by its letter; `None` for an absent record ("").
fn state_of(letter: &[u8]) -> Result<Option<State>, StoreError> {
    match letter {
        [] => Ok(None),
        &[one] => State::from_letter(one)
            .map(Some)
            .ok_or_else(|| protocol(&format!("unknown record state {:?}", char::from(one)))),
        other => Err(protocol(&format!("unknown record state {:?}", String::from_utf8_lossy(other)))),
    }
}

fn settled(n: i64) -> Result<Settled, StoreError> {
    Ok(if n == 1 { Settled::Done } else { Settled::Lost })
}
