//! Server: listeners, connections, graceful shutdown.
//!
//! Clients speak HTTP/1.1 or HTTP/2 with prior knowledge (h2c) on the same port; hyper-util's
//! auto builder tells them apart by the connection preface.
//!
//! Shutdown, when the given future completes: stop accepting; let open connections finish
//! their requests; wait for detached exchanges (their clients may be gone, their results must
//! still be stored); at the end of the grace period, abandon what still runs, which releases
//! those keys so retries can proceed instead of waiting for a lease to pass.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Admin};
use crate::config::Config;
use crate::gateway::{Gateway, SetupError};
use crate::headers::Peer;
use crate::store::Store;

/// After the grace period, how long connections get to deliver the answers of abandoned
/// exchanges (503 shutting-down) before the process exits.
const ABANDON_FLUSH: Duration = Duration::from_secs(1);

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gateway could not be built.
    #[error(transparent)]
    Setup(#[from] SetupError),
}

/// A bound, not yet running gateway.
pub struct Server {
    gateway: Arc<Gateway>,
    listener: TcpListener,
    admin: Option<(TcpListener, Admin)>,
    grace: Duration,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })
}

impl Server {
    /// Builds the gateway and binds its listeners (port 0 picks a free port).
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let gateway = Arc::new(Gateway::new(config)?);
        let listener = bind(config.server.listen).await?;
        let admin = match config.server.admin_listen {
            Some(addr) => {
                let admin = Admin::new(Arc::clone(&gateway), config.server.admin_token.clone());
                Some((bind(addr).await?, admin))
            }
            None => None,
        };
        Ok(Self { gateway, listener, admin, grace: config.server.shutdown_grace })
    }

    /// The proxy listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        // A bound TcpListener always has a local address; the fallback is unreachable.
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The admin listener's address, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The shared gateway state.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Logs a warning when the store does not answer at startup. The gateway serves anyway
    /// (each route applies its `on_store_error` policy until the store answers), but an
    /// operator who mistyped the Redis URL should hear of it now, not at the first request.
    /// The check runs in the background, so serving does not wait for it.
    pub fn warn_if_store_unreachable(&self) {
        let gateway = Arc::clone(&self.gateway);
        tokio::spawn(async move {
            if let Err(e) = gateway.store.ping().await {
                tracing::warn!(
                    store = gateway.store.kind(),
                    error = %e,
                    "the store does not answer; idempotent routes apply on_store_error until it does"
                );
            }
        });
    }

    /// Serves until `shutdown` completes, then drains (see the module docs).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Self { gateway, listener, admin, grace } = self;
        let draining = CancellationToken::new();
        let admin_task = admin.map(|(l, a)| tokio::spawn(admin::serve(l, a, draining.clone())));
        let connections = GracefulShutdown::new();
        let builder = auto::Builder::new(TokioExecutor::new());
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let gw = Arc::clone(&gateway);
                        let client = Arc::new(Peer::new(peer));
                        let service = service_fn(move |request| {
                            let (gw, client) = (Arc::clone(&gw), Arc::clone(&client));
                            async move { Ok::<_, Infallible>(gw.handle(request, &client).await) }
                        });
                        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                        let conn = connections.watch(conn);
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        draining.cancel();
        let deadline = Instant::now() + grace;
        tracing::info!(grace = ?grace, "shutting down: draining connections and exchanges");
        let drain = connections.shutdown();
        tokio::pin!(drain);
        let drained = tokio::time::timeout_at(deadline, &mut drain).await.is_ok();
        // Exchanges whose clients went away are not tied to a connection: wait for them too.
        gateway.exchanges.close();
        let finished = drained && tokio::time::timeout_at(deadline, gateway.exchanges.wait()).await.is_ok();
        if !finished {
            tracing::warn!(
                running = gateway.exchanges.len(),
                "grace period over: abandoning exchanges, releasing their keys"
            );
            gateway.abandon.cancel();
            gateway.exchanges.wait().await;
            // Their clients, if still connected, get 503 shutting-down: let that reach them.
            if !drained && tokio::time::timeout(ABANDON_FLUSH, &mut drain).await.is_err() {
                tracing::warn!("connections still open after the grace period; closing them");
            }
        }
        if let Some(task) = admin_task {
            task.abort();
        }
        tracing::info!("shutdown complete");
    }
}
