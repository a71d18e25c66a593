//! The listeners' connections: the accept loop (a failing accept backed off and logged once a
//! while), the wait for a client's first byte, one connection served under its deadlines, and
//! the registry of open connections that a drain asks to close.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Poll;
use std::time::Duration;

use http::{Request, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use slab::Slab;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Admin};
use crate::config::Limits;
use crate::connection::{Connection, Watched};
use crate::forwarded::{Peer, TrustedProxies};
use crate::reload::Live;

/// The HTTP/1.1 + h2c server settings that bound what a client may send.
pub(super) fn http_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A head larger than the read buffer is answered 431 by hyper. hyper's own head timer is
    // off: the connection's deadline covers heads (see connection.rs), with one timer per
    // connection where hyper's would be reset for every request.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None).max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(u32::try_from(limits.max_exchanges_per_connection.max(100)).unwrap_or(u32::MAX))
        .keep_alive_interval(limits.h2_keepalive_interval)
        .keep_alive_timeout(limits.h2_keepalive_interval.unwrap_or(Duration::from_secs(20)));
    builder
}

/// Waits until `stream` has bytes to read (or has ended): false when the head deadline
/// passed first or the connection was asked to close (the server drains).
///
/// Hazard: tokio marks an accepted stream readable before the kernel said so (its first read
/// then tries the socket at once), so a readiness check would let every silent client in.
/// A peek asks the socket itself: one `recv(MSG_PEEK)` per connection, and on `EAGAIN`
/// tokio clears the assumed readiness and waits for the kernel's event.
pub(super) async fn first_byte(stream: &TcpStream, connection: &Connection) -> bool {
    let Some((due, _)) = connection.deadline() else { return true };
    let timer = tokio::time::sleep_until(due);
    tokio::pin!(timer);
    let mut byte = [0u8; 1];
    std::future::poll_fn(|cx| {
        // A byte: serve. The end of the stream or an error (a client that connected and
        // left, a reset): nothing to serve.
        if let Poll::Ready(peeked) = stream.poll_peek(cx, &mut tokio::io::ReadBuf::new(&mut byte)) {
            return Poll::Ready(matches!(peeked, Ok(n) if n > 0));
        }
        if connection.poll_close(cx).is_ready() {
            return Poll::Ready(false);
        }
        if timer.as_mut().poll(cx).is_ready() {
            tracing::debug!(peer = %connection.peer.ip(), reason = ?crate::connection::Expired::Head, "closing a connection that sent nothing");
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await
}

/// Waits for a place under the listener's cap, then for a connection: a listener never holds
/// more connections than it has places, and past its cap new clients wait in the backlog.
/// Errors are backed off (see [`AcceptTrouble`]).
pub(super) async fn accept(
    listener: &TcpListener,
    places: &Arc<Semaphore>,
    trouble: &mut AcceptTrouble,
) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
    loop {
        let Ok(permit) = Arc::clone(places).acquire_owned().await else {
            // Never closed; were it, no place would ever free up again.
            return std::future::pending().await;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                trouble.cleared();
                return (stream, peer, permit);
            }
            Err(e) => {
                let pause = trouble.failed(&e);
                drop(permit);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// What went wrong accepting on one listener, said once per interval rather than once per
/// try. Out of descriptors (`EMFILE`, `ENFILE`), every accept fails at once while the client
/// stays in the backlog: without a pause the loop spins, and a line per try buries the log.
pub(super) struct AcceptTrouble {
    listener: &'static str,
    pause: Duration,
    failed: u64,
    said: Option<Instant>,
}

/// The first pause after a failed accept, doubling while they go on, up to the second.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(10);
pub(super) const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);
/// The longest silence while accepts keep failing.
pub(super) const ACCEPT_SAY_EVERY: Duration = Duration::from_secs(10);

impl AcceptTrouble {
    pub(super) fn new(listener: &'static str) -> Self {
        Self { listener, pause: ACCEPT_PAUSE, failed: 0, said: None }
    }

    pub(super) fn cleared(&mut self) {
        self.pause = ACCEPT_PAUSE;
    }

    /// Notes `error`; the pause before the next accept.
    pub(super) fn failed(&mut self, error: &std::io::Error) -> Duration {
        // A client that left before it was accepted: nothing wrong with the listener.
        if matches!(error.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
            tracing::debug!(listener = self.listener, error = %error, "a connection went away before it was accepted");
            return Duration::ZERO;
        }
        self.failed += 1;
        let now = Instant::now();
        if self.said.is_none_or(|at| now.duration_since(at) >= ACCEPT_SAY_EVERY) {
            let exhausted = matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
            if exhausted {
                tracing::warn!(listener = self.listener, error = %error, failed = self.failed, "accept failed: the process is out of file descriptors; backing off (raise RLIMIT_NOFILE or lower max_connections)");
            } else {
                tracing::warn!(listener = self.listener, error = %error, failed = self.failed, "accept failed; backing off");
            }
            self.said = Some(now);
            self.failed = 0;
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_PAUSE_MAX);
        pause
    }
}

/// Serves the admin listener until the process ends: its connections under its own cap and
/// the same header, idle and body deadlines as the proxy's (one [`Connection`] each), so that
/// a flood on the admin port neither starves the proxy of descriptors nor holds connections
/// open for as long as it likes.
pub(super) async fn serve_admin(
    listener: TcpListener,
    admin: Admin,
    draining: CancellationToken,
    limits: Limits,
    cap: usize,
) {
    let builder = Arc::new(http_builder(&limits));
    let places = Arc::new(Semaphore::new(cap));
    let mut trouble = AcceptTrouble::new("admin");
    loop {
        let (stream, peer, permit) = accept(&listener, &places, &mut trouble).await;
        let connection =
            Arc::new(Connection::new(Peer::new(peer, &TrustedProxies::default()), limits.clone(), Some(permit)));
        let (admin, draining, builder) = (admin.clone(), draining.clone(), Arc::clone(&builder));
        let handshake = limits.header_read_timeout;
        tokio::spawn(async move {
            if !first_byte(&stream, &connection).await {
                return;
            }
            let tls = admin.tls();
            let c = Arc::clone(&connection);
            let service = service_fn(move |request: Request<Incoming>| {
                let (admin, draining, c) = (admin.clone(), draining.clone(), Arc::clone(&c));
                async move {
                    let guard = c.request(request.version() == Version::HTTP_2);
                    let response = admin::handle(&admin, &draining, c.peer.ip(), request).await;
                    Ok::<_, Infallible>(response.map(|body| guard.answered(body)))
                }
            });
            let Some(tls) = tls else {
                return serve_connection(stream, connection, &builder, service).await;
            };
            // As on the proxy listener: the handshake counts against the header timeout.
            match tokio::time::timeout(handshake, tls.acceptor().accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, connection, &builder, service).await,
                Ok(Err(e)) => tracing::debug!(peer = %connection.peer.ip(), error = %e, "admin TLS handshake failed"),
                Err(_) => tracing::debug!(peer = %connection.peer.ip(), "admin TLS handshake timed out"),
            }
        });
    }
}

/// Serves one proxy connection: each request through the gateway of the moment.
pub(super) async fn serve_proxy<IO>(
    stream: IO,
    connection: Arc<Connection>,
    live: Arc<Live>,
    builder: Arc<auto::Builder<TokioExecutor>>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let c = Arc::clone(&connection);
    let service = service_fn(move |request: Request<Incoming>| {
        // The gateway of the moment: a reload applies to the next request, on every connection.
        let (gw, c) = (live.gateway(), Arc::clone(&c));
        // Not boxed, though HTTP/1 keeps a slot the size of this future (4.3 KB) for the
        // connection's whole life, idle or not: boxed, each request allocates it from the
        // allocator's slower bins, 2.3% more instructions per pass-through for 4.3 KB less
        // per idle connection (docs/performance.md, "Idle kept-alive connections").
        async move {
            let guard = c.request(request.version() == Version::HTTP_2);
            let response = gw.handle(request, &c).await;
            Ok::<_, Infallible>(response.map(|body| guard.answered(body)))
        }
    });
    serve_connection(stream, connection, &builder, service).await;
}

/// Serves one connection with `service` until it ends, its deadline passes (see
/// [`Connection`]), it asks to close, or the server drains.
pub(super) async fn serve_connection<IO, S, B>(
    stream: IO,
    connection: Arc<Connection>,
    builder: &auto::Builder<TokioExecutor>,
    service: S,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = http::Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(Watched::new(stream, Arc::clone(&connection)));
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    // The connection's one timer (see `Connection::next_check`).
    let timer = tokio::time::sleep_until(connection.next_check(Instant::now()));
    tokio::pin!(timer);
    let (mut closing, mut armed) = (false, false);
    // Polled by hand rather than with `select!`, which would build and poll a future per
    // signal every time the task runs: here the common case costs an atomic load and a
    // timer poll beside the connection itself.
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            if let Err(e) = result {
                tracing::debug!(peer = %connection.peer.ip(), error = %e, "connection ended with an error");
            }
            return Poll::Ready(());
        }
        if !closing && connection.poll_close(cx).is_ready() {
            closing = true;
            conn.as_mut().graceful_shutdown();
            // The shutdown takes effect when the connection is polled again.
            cx.waker().wake_by_ref();
        }
        // Once polled, the timer wakes the task when it fires: until it has, it need not be
        // polled again (an atomic load, where a poll or a clock read costs more, at every
        // wake of the task).
        loop {
            if armed && !timer.is_elapsed() {
                break;
            }
            if timer.as_mut().poll(cx).is_pending() {
                armed = true;
                break;
            }
            let now = Instant::now();
            if let Some((at, why)) = connection.deadline().filter(|(at, _)| *at <= now) {
                tracing::debug!(peer = %connection.peer.ip(), reason = ?why, late = %crate::access::human(at.elapsed()), "closing a connection past its deadline");
                return Poll::Ready(());
            }
            timer.as_mut().reset(connection.next_check(now));
            armed = false;
        }
        Poll::Pending
    })
    .await;
}

/// The connections open now, so that a drain can ask each of them to close.
#[derive(Default)]
pub(super) struct Open {
    list: Mutex<Slab<Weak<Connection>>>,
}

/// A connection's place in [`Open`], given back when its task ends.
pub(super) struct Registered {
    open: Arc<Open>,
    key: usize,
}

impl Open {
    pub(super) fn list(&self) -> std::sync::MutexGuard<'_, Slab<Weak<Connection>>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn add(self: &Arc<Self>, connection: &Arc<Connection>) -> Registered {
        let key = self.list().insert(Arc::downgrade(connection));
        Registered { open: Arc::clone(self), key }
    }

    pub(super) fn ask_all_to_close(&self) {
        for (_, connection) in self.list().iter() {
            if let Some(connection) = connection.upgrade() {
                connection.ask_to_close();
            }
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.list().try_remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forwarded::TrustedProxies;
    use tokio::io::AsyncWriteExt;

    /// A connection accepted the way the server accepts them, its client's end, and its state.
    async fn accepted(header_read_timeout: Duration) -> (TcpStream, TcpStream, Connection) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let connection =
            Connection::new(Peer::new(peer, &TrustedProxies::default()), Limits::for_tests(header_read_timeout), None);
        (stream, client, connection)
    }

    #[tokio::test]
    async fn a_silent_client_is_not_served_until_its_first_byte() {
        let (stream, mut client, connection) = accepted(Duration::from_secs(10)).await;
        let waiting = tokio::time::timeout(Duration::from_millis(200), first_byte(&stream, &connection)).await;
        assert!(waiting.is_err(), "an accepted stream is not readable until its client sends");
        client.write_all(b"G").await.unwrap();
        let served = tokio::time::timeout(Duration::from_secs(5), first_byte(&stream, &connection)).await;
        assert_eq!(served.ok(), Some(true), "its first byte hands it over");
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_at_the_head_deadline_and_one_that_left_at_once() {
        let (stream, _client, connection) = accepted(Duration::from_millis(100)).await;
        let waited = tokio::time::timeout(Duration::from_secs(5), first_byte(&stream, &connection)).await;
        assert_eq!(waited.ok(), Some(false), "the head deadline passed");

        let (stream, client, connection) = accepted(Duration::from_secs(10)).await;
        drop(client);
        let waited = tokio::time::timeout(Duration::from_secs(5), first_byte(&stream, &connection)).await;
        assert_eq!(waited.ok(), Some(false), "a client that left without a byte has nothing to serve");
    }
}
