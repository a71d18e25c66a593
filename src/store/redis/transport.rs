//! The transport: one call to Redis within the store timeout, in one round trip, with what
//! a call needs to survive on its way. An EVALSHA that meets NOSCRIPT (a restarted or
//! failed-over Redis, a new Cluster node) goes again as EVAL with the script's text; a
//! Cluster's MOVED sends it again (the client then knows the slot's new node), and ASK sends
//! it once to the node named. A demoted primary (READONLY) or a broken connection is reported
//! to `links`, which reconnects. It knows commands and scripts, not what the store keeps.

use std::time::Duration;

use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, Value};

use super::budget::{BUDGET, Budget};
use super::replicas::Held;

use super::link::{Link, unavailable};
use super::links::Links;
use super::round_trip::Request;
use super::scripts::Lua;
use crate::store::error::StoreError;

/// What a request is sent as instead when its EVALSHA meets NOSCRIPT: the same call by the
/// script's text.
type OnNoscript<'a> = Option<&'a (dyn Fn() -> Request + Sync)>;

/// The way to Redis and back, for every call of the store.
pub(super) struct Transport {
    pub(super) links: Links,
    timeout: Duration,
    /// Every command sent (each one round trip).
    commands: Counter,
    /// Room for large answers on their way (see `budget`).
    budget: Budget,
}

impl Transport {
    pub(super) fn new(links: Links, timeout: Duration) -> Self {
        Self { links, timeout, commands: Counter::default(), budget: Budget::new(BUDGET) }
    }

    /// Room for a write carrying `bytes` of an answer, held while the permit lives; waited for
    /// within the store timeout (see `budget`).
    pub(super) async fn room(&self, bytes: usize) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.budget.take(bytes, self.timeout).await
    }

    /// The deadline of one call (`store.timeout`).
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Counts the commands this gateway sent.
    pub(super) fn commands(&self) -> Counter {
        self.commands.clone()
    }

    /// Runs `request` within the store timeout, in one round trip. A NOSCRIPT reply (to an
    /// EVALSHA) sends `on_noscript()` instead, once.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        request: impl Into<Request>,
        on_noscript: OnNoscript<'_>,
    ) -> Result<T, StoreError> {
        let request = request.into();
        let call = async {
            let mut conn = self.links.pick()?;
            self.exchange(&request, &mut conn, on_noscript).await
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// Runs `request` with `wait` (`WAIT n timeout`) behind it, in one pipeline on a
    /// connection of its own (see `replicas`), within the store timeout plus the wait's:
    /// the body's replies (those not ignored), how many replicas acknowledged, and the
    /// connection, to give back or to go on waiting on.
    pub(super) async fn query_waiting(
        &self,
        request: impl Into<Request>,
        on_noscript: OnNoscript<'_>,
        wait: &Cmd,
        wait_timeout: Duration,
    ) -> Result<(Vec<Value>, i64, Held), StoreError> {
        let request = request.into().waiting(Some(wait));
        let deadline = self.timeout + wait_timeout;
        let call = async {
            let mut held = self.links.exclusive().await?;
            // The connection is dropped (closed) on any error: its last write is unknown.
            let reply: Value = self.exchange(&request, held.link(), on_noscript).await?;
            let Value::Array(mut replies) = reply else {
                return Err(StoreError::Protocol(format!("a write and its WAIT answered {reply:?}")));
            };
            let acks = match replies.pop() {
                Some(Value::Int(n)) => n,
                other => return Err(StoreError::Protocol(format!("WAIT answered {other:?}"))),
            };
            Ok((replies, acks, held))
        };
        tokio::time::timeout(deadline, call).await.map_err(|_| StoreError::Timeout(deadline))?
    }

    /// One call on `conn` and its way there: the NOSCRIPT fallback, a Cluster's
    /// redirections, and the trouble a demoted or dead primary reports.
    async fn exchange<T: FromRedisValue>(
        &self,
        request: &Request,
        conn: &mut Link,
        on_noscript: OnNoscript<'_>,
    ) -> Result<T, StoreError> {
        let mut result = self.send(request, conn, on_noscript).await;
        // A Cluster's redirections, which its client leaves to us (see `links`): after
        // MOVED it knows the slot's new node, so the call goes again (and the new node may
        // not have the script yet); after ASK the call goes to the node named, for this
        // one call.
        match result.as_ref().err().map(|e| (e.kind(), e.redirect_node())) {
            Some((ErrorKind::Server(ServerErrorKind::Moved), _)) => {
                result = self.send(request, conn, on_noscript).await;
            }
            // `redirect_node` is the node's "host:port" and the slot. Boxed: making a
            // connection is a large future, and inline it would swell every store call's
            // (and so every request's) state for a path taken only during migrations.
            Some((ErrorKind::Server(ServerErrorKind::Ask), Some((address, _slot)))) => {
                if let Some(followed) = Box::pin(self.asking(request, address, on_noscript)).await? {
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
    }

    /// Sends `request` on `conn`, and `on_noscript()` once if it meets NOSCRIPT: the one
    /// place the fallback is written.
    async fn send<T: FromRedisValue>(
        &self,
        request: &Request,
        conn: &mut Link,
        on_noscript: OnNoscript<'_>,
    ) -> RedisResult<T> {
        self.commands.inc();
        match (request.send(conn).await, on_noscript) {
            (Err(e), Some(eval)) if is_noscript(&e) => {
                self.commands.inc();
                // By the script's text, with the same WAIT behind it.
                eval().waiting(request.wait()).send(conn).await
            }
            (result, _) => result,
        }
    }

    /// Sends `request` to the node an ASK redirection named (see [`Request::asking`]), and by
    /// the script's text if that node lacks the script. `None` for a request that cannot be
    /// redirected this way. A request that waits for replicas goes on a connection of its own
    /// (a `WAIT` would block the shared one), made for it and closed after.
    async fn asking<T: FromRedisValue>(
        &self,
        request: &Request,
        address: &str,
        on_noscript: OnNoscript<'_>,
    ) -> Result<Option<RedisResult<T>>, StoreError> {
        let (shared, mut conn) = match request.waits() {
            false => {
                let (address, conn) = self.links.node(address).await?;
                (Some(address), conn)
            }
            true => (None, self.links.node_alone(address).await?),
        };
        self.commands.inc();
        let Some(first) = request.asking(&mut conn).await else { return Ok(None) };
        let result = match (first, on_noscript) {
            (Err(e), Some(eval)) if is_noscript(&e) => {
                self.commands.inc();
                match eval().waiting(request.wait()).asking(&mut conn).await {
                    Some(result) => result,
                    None => return Ok(None),
                }
            }
            (result, _) => result,
        };
        if let Some(address) = shared.filter(|_| result.as_ref().is_err_and(redis::RedisError::is_io_error)) {
            self.links.forget_node(&address);
        }
        Ok(Some(result))
    }

    /// Calls `script` on the one key `key` (a record, or a quota counter); `args` appends its
    /// ARGV.
    pub(super) async fn eval(&self, lua: &Lua, key: &str, args: impl Fn(&mut Cmd) + Sync) -> Result<Value, StoreError> {
        self.eval_sized(lua, &[key], 0, args).await
    }

    /// Calls `script` on `keys` (all in one hash slot), with room for `extra` bytes of
    /// arguments in the command's buffer from the start (a response: grown as it is written,
    /// the buffer is copied at every doubling); `args` appends its ARGV.
    pub(super) async fn eval_sized(
        &self,
        lua: &Lua,
        keys: &[&str],
        extra: usize,
        args: impl Fn(&mut Cmd) + Sync,
    ) -> Result<Value, StoreError> {
        Ok(self.eval_write(lua, keys, extra, args, None).await?.0)
    }

    /// [`eval_sized`](Self::eval_sized), and with `wait` a write that replicas must hold:
    /// see [`write`](Self::write).
    pub(super) async fn eval_write(
        &self,
        lua: &Lua,
        keys: &[&str],
        extra: usize,
        args: impl Fn(&mut Cmd) + Sync,
        wait: Option<(&Cmd, Duration)>,
    ) -> Result<(Value, Option<Ack>), StoreError> {
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
        let eval = || call("EVAL", lua.code).into();
        self.write(call("EVALSHA", lua.script.get_hash()).into(), Some(&eval), wait).await
    }

    /// A write the promise rests on. Without `wait`, as [`query`](Self::query); with it
    /// (`WAIT n timeout` and the timeout), followed by that `WAIT` on a connection of its own
    /// (see `replicas`): its reply (for a pipeline, the array of the replies not ignored) and
    /// what the replicas said.
    pub(super) async fn write(
        &self,
        request: Request,
        on_noscript: OnNoscript<'_>,
        wait: Option<(&Cmd, Duration)>,
    ) -> Result<(Value, Option<Ack>), StoreError> {
        let Some((wait, wait_timeout)) = wait else {
            return Ok((self.query(request, on_noscript).await?, None));
        };
        let one = !request.is_pipeline();
        let sent = Instant::now();
        // Boxed: inline, the wait's state (a connection taken from a pool, a longer deadline)
        // would swell every store write's future, and so every request's, also without
        // replica_acks.
        let waiting = Box::pin(self.query_waiting(request, on_noscript, wait, wait_timeout));
        let (mut replies, got, held) = waiting.await?;
        let took = sent.elapsed();
        let reply = match (one, replies.pop()) {
            (true, Some(reply)) if replies.is_empty() => reply,
            (true, other) => return Err(StoreError::Protocol(format!("a write answered {other:?} and more"))),
            (false, last) => Value::Array(replies.into_iter().chain(last).collect()),
        };
        Ok((reply, Some(Ack { got, held, took })))
    }
}

/// What the replicas said of a write: how many acknowledged it, and how long the write and
/// its wait took; with the connection it went on, to give back or to go on waiting on.
pub(super) struct Ack {
    pub got: i64,
    pub held: Held,
    pub took: Duration,
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
