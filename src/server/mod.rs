//! Server: listeners, connections, graceful shutdown.
//!
//! Clients speak HTTP/1.1 or HTTP/2 with prior knowledge (h2c) on the same port; hyper-util's
//! auto builder tells them apart by the connection preface.
//!
//! Shutdown, when the given future completes: stop accepting; let open connections finish
//! their requests; wait for detached exchanges (their clients may be gone, their results must
//! still be stored); at the end of the grace period, abandon what still runs, which settles
//! those keys at once (as unknown: the requests were sent) so that retries are answered
//! instead of waiting for a lease to pass.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod connections;

use self::connections::{AcceptTrouble, Open, accept, first_byte, http_builder, serve_admin, serve_proxy};
use crate::admin::Admin;
use crate::config::{Config, Limits};
use crate::connection::Connection;
use crate::descriptors::{self, Budget};
use crate::forwarded::{Peer, TrustedProxies};
use crate::gateway::{Gateway, SetupError};
use crate::reload::Live;
use crate::store::{Lifecycle, Severity};

/// After the grace period, how long connections get to deliver the answers of abandoned
/// exchanges (503 shutting-down) before the process exits.
const ABANDON_FLUSH: Duration = Duration::from_secs(1);

/// After the grace period, how long abandoned exchanges get to settle their keys.
const ABANDON_SETTLE: Duration = Duration::from_secs(5);

/// How long an admin connection may sit idle (see `run`).
const ADMIN_IDLE: Duration = Duration::from_secs(10);

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
    live: Arc<Live>,
    listener: TcpListener,
    admin: Option<(TcpListener, Admin)>,
    grace: Duration,
    limits: Limits,
    trusted: TrustedProxies,
    /// The connection caps, fitted into the process's descriptor limit.
    budget: Budget,
}

/// Connections the kernel completes and holds for a listener until the gateway accepts them
/// (capped by `net.core.somaxconn`). tokio's default, 128, overflowed when clients connected
/// faster than the one thread accepted them, or while a listener at its connection cap lets
/// new clients wait (a burst after a restart, a pool warming up): the kernel then drops the
/// SYN and the client waits a second or more to try again.
const LISTEN_BACKLOG: u32 = 1024;

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() };
    socket
        .and_then(|socket| {
            // As tokio's own bind: a restarted gateway binds while old connections linger.
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(LISTEN_BACKLOG)
        })
        .map_err(|source| ServeError::Bind { addr, source })
}

impl Server {
    /// Builds the gateway and binds its listeners (port 0 picks a free port).
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        Self::bind_reloadable(config, None).await
    }

    /// Like [`Server::bind`], reloadable from `source` (SIGHUP, `POST /reload`).
    pub async fn bind_reloadable(config: &Config, source: Option<std::path::PathBuf>) -> Result<Self, ServeError> {
        let live = Arc::new(Live::new(Gateway::new(config)?, config.clone(), source));
        let listener = bind(config.server.listen).await?;
        let admin = match config.server.admin_listen {
            Some(addr) => {
                let admin = Admin::new(Arc::clone(&live));
                Some((bind(addr).await?, admin))
            }
            None => None,
        };
        // Without a readable limit, the caps are taken as configured.
        let limit = descriptors::limits().map_or(u64::MAX, |(soft, _)| soft);
        let budget = Budget::fit(config, limit);
        match (budget.fits(), Budget::asked(config)) {
            (true, _) => {}
            (false, Some(_)) => tracing::warn!("{}", budget.shortfall(config)),
            // The defaults are what fits: said, not warned about.
            (false, None) => tracing::info!("{}", budget.shortfall(config)),
        }
        Ok(Self {
            live,
            listener,
            admin,
            grace: config.server.shutdown_grace,
            limits: config.server.limits.clone(),
            trusted: config.server.trusted_proxies.clone(),
            budget,
        })
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

    /// The gateway serving new requests now.
    pub fn gateway(&self) -> Arc<Gateway> {
        self.live.gateway()
    }

    /// The gateway in service and its reloading.
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    /// Logs a warning when the store does not answer at startup, and what the store's own
    /// settings mean for the records (an evicting policy is an error: records would be lost).
    /// The gateway serves anyway (each route applies its `on_store_error` policy until the
    /// store answers), but an operator who mistyped the Redis URL, or runs Redis with
    /// `allkeys-lru`, should hear of it now, not at the first lost record. In the background,
    /// so serving does not wait for it.
    pub fn warn_if_store_unreachable(&self) {
        let rt = Arc::clone(self.live.gateway().runtime());
        tokio::spawn(async move {
            if let Err(e) = rt.backend().ping().await {
                tracing::warn!(
                    store = %rt.backend().describe(),
                    error = %e,
                    "the store does not answer; idempotent routes apply on_store_error until it does"
                );
                return;
            }
            if let Some(settings) = rt.backend().settings().await {
                rt.metrics.store_evicts_records.set(i64::from(settings.evicts()));
                tracing::info!(store = %rt.backend().describe(), settings = %settings.summary(), "store settings");
                for (severity, finding) in settings.findings() {
                    match severity {
                        Severity::Error => tracing::error!(store = %rt.backend().describe(), "store: {finding}"),
                        Severity::Warning => tracing::warn!(store = %rt.backend().describe(), "store: {finding}"),
                    }
                }
            }
        });
    }

    /// Serves until `shutdown` completes, then drains (see the module docs).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Self { live, listener, admin, grace, limits, trusted, budget } = self;
        let draining = CancellationToken::new();
        // An admin connection idle for ADMIN_IDLE is closed, whatever `idle_timeout` says: a
        // browser opens several to load the console and keeps the spare ones idle (Chromium,
        // for minutes), each holding one of the listener's few places; the console itself
        // calls every 5 s on one, which stays.
        let admin_limits = Limits { idle_timeout: limits.idle_timeout.min(ADMIN_IDLE), ..limits.clone() };
        let admin_task =
            admin.map(|(l, a)| tokio::spawn(serve_admin(l, a, draining.clone(), admin_limits, budget.admin)));
        let connections = TaskTracker::new();
        let open = Arc::new(Open::default());
        let builder = Arc::new(http_builder(&limits));
        // One permit per connection: with none left, the loop stops accepting and new clients
        // wait in the listen backlog instead of failing the connections already served.
        let places = Arc::new(Semaphore::new(budget.proxy));
        let mut trouble = AcceptTrouble::new("proxy");
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = accept(&listener, &places, &mut trouble) => accepted,
                () = &mut shutdown => break,
            };
            let (stream, peer, permit) = accepted;
            let _ = stream.set_nodelay(true);
            let tls = live.tls();
            let peer = Peer::new(peer, &trusted);
            let peer = if tls.is_some() { peer.over_tls() } else { peer };
            let connection = Arc::new(Connection::new(peer, limits.clone(), Some(permit)));
            let registered = open.add(&connection);
            let (live, builder) = (Arc::clone(&live), Arc::clone(&builder));
            let handshake = limits.header_read_timeout;
            connections.spawn(async move {
                let _registered = registered;
                // Until the client sends its first byte, the connection holds this small task
                // and nothing of hyper's or TLS's (buffers, state): what a silent client costs.
                // Boxed, so that the task is only as large as this wait until then.
                if !first_byte(&stream, &connection).await {
                    return;
                }
                match tls {
                    None => Box::pin(serve_proxy(stream, connection, live, builder)).await,
                    // The handshake counts against the header timeout, like a silent client.
                    Some(tls) => {
                        Box::pin(async move {
                            match tokio::time::timeout(handshake, tls.acceptor().accept(stream)).await {
                                Ok(Ok(stream)) => {
                                    connection.served(tls.served(stream.get_ref().1.server_name()));
                                    serve_proxy(stream, connection, live, builder).await
                                }
                                Ok(Err(e)) => {
                                    tracing::debug!(peer = %connection.peer.ip(), error = %e, "TLS handshake failed")
                                }
                                Err(_) => tracing::debug!(peer = %connection.peer.ip(), "TLS handshake timed out"),
                            }
                        })
                        .await
                    }
                }
            });
        }
        drop(listener);
        draining.cancel();
        open.ask_all_to_close();
        let deadline = Instant::now() + grace;
        tracing::info!(grace = %crate::access::human(grace), "shutting down: draining connections and exchanges");
        connections.close();
        // Exchanges, store and abandon token are shared by every reloaded gateway.
        let rt = Arc::clone(live.gateway().runtime());
        let drain = connections.wait();
        tokio::pin!(drain);
        let drained = tokio::time::timeout_at(deadline, &mut drain).await.is_ok();
        // Exchanges whose clients went away are not tied to a connection: wait for them too.
        rt.exchanges.close();
        let finished = drained && tokio::time::timeout_at(deadline, rt.exchanges.wait()).await.is_ok();
        if !finished {
            tracing::warn!(
                running = rt.exchanges.len(),
                "grace period over: abandoning exchanges; their keys are settled as unknown (or released, per route)"
            );
            rt.abandon.cancel();
            // Abandoned exchanges settle in a few store calls; bounded all the same, so that a
            // store that hangs cannot keep the process from exiting.
            if tokio::time::timeout(ABANDON_SETTLE, rt.exchanges.wait()).await.is_err() {
                tracing::warn!(running = rt.exchanges.len(), "exchanges still settling; exiting without them");
            }
            // Their clients, if still connected, get 503 shutting-down: let that reach them.
            if !drained && tokio::time::timeout(ABANDON_FLUSH, &mut drain).await.is_err() {
                tracing::warn!("connections still open after the grace period; closing them");
            }
        }
        if let Some(task) = admin_task {
            task.abort();
        }
        // The spans of the last requests, before the process ends.
        if let Some(telemetry) = &rt.telemetry {
            telemetry.shutdown().await;
        }
        tracing::info!("shutdown complete");
    }
}
