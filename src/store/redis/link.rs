//! One connection to Redis, of whichever kind, and how its errors read: the leaf that the
//! links, the pool of connections held alone (`replicas`) and the transport share.

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::store::error::StoreError;

/// One multiplexed connection.
#[derive(Clone)]
pub(super) enum Link {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
    /// A connection that never reconnects, held by one call at a time (see `replicas`).
    Direct(MultiplexedConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
            Link::Direct(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Direct(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
            Link::Direct(c) => c.get_db(),
        }
    }
}

pub(super) fn unavailable(e: redis::RedisError) -> StoreError {
    if e.is_cluster_error() {
        return StoreError::Migrating(e.to_string());
    }
    if refused_command(&e) {
        return StoreError::Rejected(e.to_string());
    }
    StoreError::Unavailable(e.to_string())
}

/// Whether Redis answered and refused this one command (an argument out of range, a key of
/// another type, a script's own error): the store is up, and taking the refusal for an outage
/// would report one that is not there (and hide the bug that sent the command). Only the codes
/// that say so; any other (`LOADING`, `READONLY`, `MASTERDOWN`, `BUSY`, `OOM`, `MISCONF`,
/// `NOREPLICAS`, `NOPERM`, `NOAUTH`, `WRONGPASS`, a proxy's or a module's own) is an outage:
/// a store that refuses for a reason of its own must not pass for one that answers.
fn refused_command(e: &redis::RedisError) -> bool {
    // No code: the connection failed, or its reply could not be read.
    match e.code() {
        Some("ERR") => !e.detail().is_some_and(|d| d.contains("max number of clients")),
        Some("WRONGTYPE" | "EXECABORT") => true,
        _ => false,
    }
}

#[cfg(test)]
mod classification {
    use redis::{ErrorKind, RedisError, ServerErrorKind, make_extension_error};

    use super::*;

    #[test]
    fn a_refused_command_is_no_outage_and_an_unavailable_server_is_one() {
        let refused = [
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                "value is out of range, must be positive".to_owned(),
            )),
            make_extension_error("WRONGTYPE".into(), Some("Operation against a key holding the wrong kind".into())),
        ];
        for e in refused {
            assert!(matches!(unavailable(e.clone()), StoreError::Rejected(_)), "{e}");
        }
        let down = [
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading")),
            RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "replica")),
            make_extension_error("OOM".into(), Some("command not allowed when used memory > 'maxmemory'".into())),
            make_extension_error("WRONGPASS".into(), Some("invalid username-password pair".into())),
            make_extension_error("NOAUTH".into(), Some("Authentication required.".into())),
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                "max number of clients reached".to_owned(),
            )),
        ];
        for e in down {
            assert!(matches!(unavailable(e.clone()), StoreError::Unavailable(_)), "{e}");
        }
    }
}
