//! One round trip to Redis: what it sends, and how a script's reply is read back. A reply
//! that does not have the shape the store expects is a protocol error, never a panic.

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Value};

use super::link::Link;
use crate::store::error::StoreError;
use crate::store::record::StoredResponse;

/// Whole milliseconds for a command's duration argument, at least one: Redis rejects a zero
/// expiry, and `WAIT` with 0 would wait for ever (every duration here is validated positive;
/// keep it so).
pub(super) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// What one round trip sends: one command or a pipeline, and behind it, when the write must
/// be held by replicas, a `WAIT` on the same connection.
pub(super) struct Request {
    body: Body,
    /// `WAIT numreplicas timeout`, sent behind the body in the same pipeline (see
    /// `replicas`): the reply then ends with the number of replicas that acknowledged.
    wait: Option<Cmd>,
}

enum Body {
    One(Cmd),
    Pipeline(redis::Pipeline),
}

impl From<Cmd> for Request {
    fn from(cmd: Cmd) -> Self {
        Self { body: Body::One(cmd), wait: None }
    }
}

impl From<redis::Pipeline> for Request {
    fn from(pipe: redis::Pipeline) -> Self {
        Self { body: Body::Pipeline(pipe), wait: None }
    }
}

impl Request {
    /// This request with `WAIT replicas timeout` behind it: its reply is then an array of the
    /// body's replies (those not ignored) and the count of replicas that acknowledged.
    pub fn waiting(mut self, wait: Option<&Cmd>) -> Self {
        self.wait = wait.cloned();
        self
    }

    /// Whether a `WAIT` rides behind the body.
    pub fn waits(&self) -> bool {
        self.wait.is_some()
    }

    /// Whether the body is a pipeline (its reply an array), not one command.
    pub fn is_pipeline(&self) -> bool {
        matches!(self.body, Body::Pipeline(_))
    }

    /// The `WAIT` behind the body, if any.
    pub fn wait(&self) -> Option<&Cmd> {
        self.wait.as_ref()
    }

    pub async fn send<T: FromRedisValue>(&self, conn: &mut Link) -> redis::RedisResult<T> {
        match (&self.body, &self.wait) {
            (Body::One(cmd), None) => cmd.query_async(conn).await,
            (Body::Pipeline(pipe), None) => pipe.query_async(conn).await,
            // In one pipeline, so that nothing can come between the write and its WAIT, and a
            // connection that breaks between them fails the whole (a WAIT on a connection that
            // reconnected would count replicas of no write at all).
            (Body::One(cmd), Some(wait)) => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone()).add_command(wait.clone());
                pipe.query_async(conn).await
            }
            (Body::Pipeline(pipe), Some(wait)) => {
                let mut pipe = pipe.clone();
                pipe.add_command(wait.clone());
                pipe.query_async(conn).await
            }
        }
    }

    /// Sends a command to the node a Cluster redirected it to with ASK: `ASKING` and the
    /// command (and its `WAIT`) in one pipeline, so that nothing else on the connection can
    /// come between the two and take the one-time permission. (A pipeline is not followed:
    /// the store's only pipeline touches two keys, which a migrating slot may hold apart; its
    /// caller falls back to a one-key call.)
    pub async fn asking<T: FromRedisValue>(&self, conn: &mut MultiplexedConnection) -> Option<redis::RedisResult<T>> {
        let Body::One(cmd) = &self.body else { return None };
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore().add_command(cmd.clone());
        match &self.wait {
            None => Some(pipe.query_async::<(T,)>(conn).await.map(|(value,)| value)),
            Some(wait) => {
                pipe.add_command(wait.clone());
                Some(pipe.query_async::<T>(conn).await)
            }
        }
    }
}

/// Reads a script's array reply front to back.
pub(super) struct Reply(pub std::vec::IntoIter<Value>);

impl Reply {
    pub fn array(v: Value) -> Result<Self, StoreError> {
        match v {
            Value::Array(items) => Ok(Self(items.into_iter())),
            other => Err(protocol(&format!("expected an array, got {other:?}"))),
        }
    }

    pub fn integer(v: Value) -> Result<i64, StoreError> {
        match v {
            Value::Int(n) => Ok(n),
            other => Err(protocol(&format!("expected an integer, got {other:?}"))),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    pub fn tag(&mut self) -> Result<Vec<u8>, StoreError> {
        self.bytes()
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.0.next() {
            Some(Value::BulkString(b)) => Ok(b),
            Some(Value::SimpleString(s)) => Ok(s.into_bytes()),
            other => Err(protocol(&format!("expected a string, got {other:?}"))),
        }
    }

    pub fn attempt(&mut self) -> Result<u32, StoreError> {
        u32::try_from(self.int()?).map_err(|_| protocol("attempt out of range"))
    }

    pub fn response(&mut self) -> Result<StoredResponse, StoreError> {
        StoredResponse::decode(Bytes::from(self.bytes()?)).map_err(|e| protocol(&e.to_string()))
    }

    pub fn int(&mut self) -> Result<i64, StoreError> {
        match self.0.next() {
            Some(v) => Self::integer(v),
            None => Err(protocol("reply too short")),
        }
    }
}

pub(super) fn protocol(what: &str) -> StoreError {
    StoreError::Protocol(what.to_owned())
}
