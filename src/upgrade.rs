//! A protocol upgrade (`Upgrade: websocket`) bridged: once the upstream switched protocols,
//! the client's and the upstream's connections are joined byte for byte until either side
//! closes or nothing moves for the client connection's `idle_timeout`.

use std::sync::Arc;

use hyper_util::rt::TokioIo;

use crate::connection::Connection;

/// Joins the client's and the upstream's upgraded connections until either closes, or until
/// no byte has moved either way for `idle_timeout`.
///
/// Hazard: without the idle deadline, a client that upgrades and then goes silent would hold
/// its place under `max_connections` (and two sockets) for as long as the upstream tolerates
/// it, and an attacker could fill the gateway with such connections.
pub async fn bridge(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    connection: Arc<Connection>,
) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "protocol upgrade did not complete");
            return;
        }
    };
    let (client_read, client_write) = tokio::io::split(TokioIo::new(client));
    let (upstream_read, upstream_write) = tokio::io::split(TokioIo::new(upstream));
    let activity = Activity::new();
    let both_ways = async {
        tokio::try_join!(pump(client_read, upstream_write, &activity), pump(upstream_read, client_write, &activity))
    };
    tokio::select! {
        ended = both_ways => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "upgraded connection ended with an error");
            }
        }
        () = activity.idle_for(connection.idle_timeout()) => {
            // Dropping both halves of each side closes both sockets.
            tracing::debug!("upgraded connection idle for too long; closed");
        }
    }
}

/// When a byte last moved through a bridge, in either direction.
struct Activity(std::sync::Mutex<tokio::time::Instant>);

impl Activity {
    fn new() -> Self {
        Self(std::sync::Mutex::new(tokio::time::Instant::now()))
    }

    fn touch(&self) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    /// Completes once nothing has moved for `idle`.
    async fn idle_for(&self, idle: std::time::Duration) {
        loop {
            let due = *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) + idle;
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// Copies `from` to `to` until `from` ends, then passes the end on (a half close), as
/// `tokio::io::copy_bidirectional` does, noting each chunk in `activity`.
async fn pump<R, W>(mut from: R, mut to: W, activity: &Activity) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        activity.touch();
        to.write_all(&chunk[..n]).await?;
        to.flush().await?;
    }
}
