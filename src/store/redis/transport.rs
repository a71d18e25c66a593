//! The transport: one call to Redis within the store timeout, in one round trip, with what
//! a call needs to survive on its way. An EVALSHA that meets NOSCRIPT (a restarted or
//! failed-over Redis, a new Cluster node) goes again as EVAL with the script's text; a
//! Cluster's MOVED sends it again (the client then knows the slot's new node), and ASK sends
//! it once to the node named. A demoted primary (READONLY) or a broken connection is reported
//! to `links`, which reconnects. It knows commands and scripts, not what the store keeps.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, Value};

use super::links::{Link, Links, unavailable};
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
}

impl Transport {
    pub(super) fn new(links: Links, timeout: Duration) -> Self {
        Self { links, timeout, commands: Counter::default() }
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
            let mut result = self.send(&request, &mut conn, on_noscript).await;
            // A Cluster's redirections, which its client leaves to us (see `links`): after
            // MOVED it knows the slot's new node, so the call goes again (and the new node may
            // not have the script yet); after ASK the call goes to the node named, for this
            // one call.
            match result.as_ref().err().map(|e| (e.kind(), e.redirect_node())) {
                Some((ErrorKind::Server(ServerErrorKind::Moved), _)) => {
                    result = self.send(&request, &mut conn, on_noscript).await;
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
                eval().send(conn).await
            }
            (result, _) => result,
        }
    }

    /// Sends `request` to the node an ASK redirection named (see [`Request::asking`]), and by
    /// the script's text if that node lacks the script. `None` for a request that cannot be
    /// redirected this way.
    async fn asking<T: FromRedisValue>(
        &self,
        request: &Request,
        address: &str,
        on_noscript: OnNoscript<'_>,
    ) -> Result<Option<RedisResult<T>>, StoreError> {
        let (address, mut conn) = self.links.node(address).await?;
        self.commands.inc();
        let Some(first) = request.asking(&mut conn).await else { return Ok(None) };
        let result = match (first, on_noscript) {
            (Err(e), Some(eval)) if is_noscript(&e) => {
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
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
