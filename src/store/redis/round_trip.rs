//! One round trip to Redis: what it sends, and how a script's reply is read back. A reply
//! that does not have the shape the store expects is a protocol error, never a panic.

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Value};

use super::links::Link;
use crate::store::error::StoreError;
use crate::store::record::StoredResponse;

/// One command or a pipeline: what one round trip sends.
pub(super) enum Request {
    One(Cmd),
    Pipeline(redis::Pipeline),
}

impl From<Cmd> for Request {
    fn from(cmd: Cmd) -> Self {
        Self::One(cmd)
    }
}

impl From<redis::Pipeline> for Request {
    fn from(pipe: redis::Pipeline) -> Self {
        Self::Pipeline(pipe)
    }
}

impl Request {
    pub async fn send<T: FromRedisValue>(&self, conn: &mut Link) -> redis::RedisResult<T> {
        match self {
            Self::One(cmd) => cmd.query_async(conn).await,
            Self::Pipeline(pipe) => pipe.query_async(conn).await,
        }
    }

    /// Sends a command to the node a Cluster redirected it to with ASK: `ASKING` and the
    /// command in one pipeline, so that nothing else on the connection can come between the
    /// two and take the one-time permission. (A pipeline is not followed: the store's only
    /// pipeline touches two keys, which a migrating slot may hold apart; its caller falls
    /// back to a one-key call.)
    pub async fn asking<T: FromRedisValue>(&self, conn: &mut MultiplexedConnection) -> Option<redis::RedisResult<T>> {
        let Self::One(cmd) = self else { return None };
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore().add_command(cmd.clone());
        Some(pipe.query_async::<(T,)>(conn).await.map(|(value,)| value))
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
