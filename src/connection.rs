//! One client connection: who is at the other end, and how much of the gateway it may hold.
//!
//! The hazards are clients that hold resources without using them: a connection that sends
//! nothing, or a request head one byte every few seconds (slowloris), keeps a file descriptor
//! for as long as the server lets it; an HTTP/2 connection can open and reset streams faster
//! than their upstream calls end (the rapid-reset pattern), each reset leaving an exchange
//! running, since exchanges outlive their clients by design. So each connection has:
//!
//! - a deadline, recomputed as it changes phase: a new connection must send a complete head
//!   within `header_read_timeout`; between requests it may stay idle for `idle_timeout`; a
//!   head, once its first byte arrived, must complete within `header_read_timeout`. Past the
//!   deadline the connection is dropped. One timer per connection enforces it, never reset
//!   per request: it fires at the deadline or within the shorter of the two timeouts,
//!   whichever comes first, and the serving task re-reads the phase then (see
//!   [`Connection::next_check`]), so that a phase change never has to wake the task;
//! - a count of the exchanges it started that still run (`max_exchanges_per_connection`);
//! - a count of its wasted requests: abandoned (reset) before they were answered, or refused
//!   because the connection already runs its limit of exchanges. Past `max_reset_streams`
//!   the connection is asked to close (GOAWAY on HTTP/2). A client that opens streams and
//!   resets them at once gets nothing but this: its exchanges are capped, and its connection
//!   ends.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::config::{Limits, Served};
use crate::forwarded::Peer;

/// One accepted connection's state, shared by its requests and its serving task.
#[derive(Debug)]
pub struct Connection {
    /// The client.
    pub peer: Peer,
    limits: Limits,
    phase: Mutex<Phase>,
    /// Requests being handled right now.
    in_flight: AtomicUsize,
    /// Exchanges this connection started that still run (they may outlive it).
    exchanges: AtomicUsize,
    /// Requests abandoned by the client before they were answered, or refused for the
    /// connection's exchange limit.
    wasted: AtomicUsize,
    /// Set when the connection should close gracefully (too many wasted requests, or the
    /// server drains); `waker` wakes its serving task to act on it. An atomic, not a
    /// `Notify`: the serving task looks at it every time it runs, several times a request.
    closing: AtomicBool,
    waker: AtomicWaker,
    /// Its place under `max_connections`, held as long as anything uses the connection: its
    /// requests, the exchanges it started, a protocol it upgraded to.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The certificate its TLS handshake served, on a listener with several: the hosts its
    /// requests may name.
    certificate: OnceLock<Arc<Served>>,
}

/// Where a connection is between requests, for its deadline.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for the next request since `since` (its last byte in or out).
    Idle { since: Instant },
    /// A head has begun arriving at `since` (or the connection was accepted then: its first
    /// head is due within the header timeout from its start).
    Head { since: Instant },
    /// Requests are being handled: no deadline of the connection's own.
    Busy,
    /// An HTTP/2 connection between requests: frames (pings, window updates) keep arriving,
    /// so only time without a request counts.
    IdleH2 { since: Instant },
}

/// Why a connection's deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No complete head in time (a silent or slow client).
    Head,
    /// Idle between requests for too long.
    Idle,
}

impl Connection {
    /// The state of a connection accepted now, holding its place under `max_connections`.
    pub fn new(peer: Peer, limits: Limits, place: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        Self {
            peer,
            limits,
            // Accepted: its first head is due within the header timeout, as if it had begun.
            phase: Mutex::new(Phase::Head { since: Instant::now() }),
            in_flight: AtomicUsize::new(0),
            exchanges: AtomicUsize::new(0),
            wasted: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            _place: place,
            certificate: OnceLock::new(),
        }
    }

    /// Notes the certificate the handshake served (none: the listener has only one).
    pub fn served(&self, certificate: Option<Arc<Served>>) {
        if let Some(certificate) = certificate {
            let _ = self.certificate.set(certificate);
        }
    }

    /// The certificate served on this connection, when the listener chooses among several.
    pub fn certificate(&self) -> Option<&Served> {
        self.certificate.get().map(|c| &**c)
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the connection may go without traffic (for an upgraded one: without a byte
    /// moving either way).
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.limits.idle_timeout
    }

    /// When the connection's deadline passes, and why; `None` while requests run.
    pub fn deadline(&self) -> Option<(Instant, Expired)> {
        let l = &self.limits;
        match *self.phase() {
            Phase::Head { since } => Some((since + l.header_read_timeout, Expired::Head)),
            Phase::Idle { since } | Phase::IdleH2 { since } => Some((since + l.idle_timeout, Expired::Idle)),
            Phase::Busy => None,
        }
    }

    /// When the serving task should next look at the deadline: at the deadline, or within
    /// the shorter timeout from `now`, whichever is first. A phase change can only move the
    /// deadline to at least that far ahead (a head that begins now is due within the header
    /// timeout; an idle period, within the idle timeout), so the timer is never late for it.
    pub fn next_check(&self, now: Instant) -> Instant {
        let l = &self.limits;
        let soonest = now + l.header_read_timeout.min(l.idle_timeout);
        self.deadline().map_or(soonest, |(at, _)| at.min(soonest))
    }

    fn read(&self) {
        let mut phase = self.phase();
        if let Phase::Idle { .. } = *phase {
            *phase = Phase::Head { since: Instant::now() };
        }
    }

    fn wrote(&self) {
        let mut phase = self.phase();
        if let Phase::Idle { .. } = *phase {
            *phase = Phase::Idle { since: Instant::now() };
        }
    }

    /// A request has arrived (its head is complete). The guard marks it answered or
    /// abandoned when dropped.
    pub fn request(self: &Arc<Self>, http2: bool) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        *self.phase() = Phase::Busy;
        RequestGuard { connection: Arc::clone(self), http2, answered: false }
    }

    /// A slot for one more exchange of this connection, if it has one left. A refusal counts
    /// as a wasted request.
    pub fn exchange_slot(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let max = self.limits.max_exchanges_per_connection;
        let taken = self.exchanges.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        match taken {
            Ok(_) => Some(ConnectionSlot(Arc::clone(self))),
            Err(_) => {
                self.waste("refused for its exchange limit");
                None
            }
        }
    }

    fn waste(&self, how: &str) {
        let wasted = self.wasted.fetch_add(1, Ordering::AcqRel) + 1;
        if wasted == self.limits.max_reset_streams + 1 {
            tracing::warn!(peer = %self.peer.ip(), wasted, last = how, "client wastes requests; closing its connection");
            self.ask_to_close();
        }
    }

    /// Asks the connection to close gracefully: it finishes the requests it has.
    pub fn ask_to_close(&self) {
        self.closing.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Ready once the connection has been asked to close; otherwise wakes `cx` when it is.
    pub fn poll_close(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.closing.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Asked between the load and the registration: its wake may have found no waker.
        if self.closing.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }
    }
}

/// One request in flight on a connection, until its response body has been sent.
#[derive(Debug)]
pub struct RequestGuard {
    connection: Arc<Connection>,
    http2: bool,
    answered: bool,
}

impl RequestGuard {
    /// The response head is ready: the request was not abandoned. The request stays in
    /// flight while `body` streams (a long download or a quiet event stream is not idle).
    pub fn answered<B>(mut self, body: B) -> InFlightBody<B> {
        self.answered = true;
        InFlightBody { inner: body, guard: Some(self) }
    }
}

/// A response body that keeps its request in flight until it ends.
#[derive(Debug)]
pub struct InFlightBody<B> {
    inner: B,
    guard: Option<RequestGuard>,
}

impl<B: http_body::Body + Unpin> http_body::Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let c = &self.connection;
        if !self.answered {
            c.waste("abandoned before its answer");
        }
        if c.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            let since = Instant::now();
            *c.phase() = if self.http2 { Phase::IdleH2 { since } } else { Phase::Idle { since } };
        }
    }
}

/// An exchange counted against its connection until it ends.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<Connection>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.exchanges.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection's socket, reporting reads and writes to its [`Connection`].
pub struct Watched<T> {
    inner: T,
    connection: Arc<Connection>,
}

impl<T> Watched<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, connection: Arc<Connection>) -> Self {
        Self { inner, connection }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.connection.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.connection.wrote();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.connection.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forwarded::TrustedProxies;
    use std::time::Duration;

    fn connection() -> Arc<Connection> {
        Arc::new(Connection::new(
            Peer::new("127.0.0.1:1".parse().unwrap(), &TrustedProxies::default()),
            Limits::for_tests(Duration::from_secs(10)),
            None,
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_phase() {
        let c = connection();
        let start = Instant::now();
        assert_eq!(c.deadline(), Some((start + Duration::from_secs(10), Expired::Head)), "a new connection");
        c.read();
        assert_eq!(c.deadline(), Some((start + Duration::from_secs(10), Expired::Head)), "bytes do not extend it");
        let request = c.request(false);
        assert_eq!(c.deadline(), None, "busy");
        tokio::time::advance(Duration::from_secs(5)).await;
        let body = request.answered(());
        assert_eq!(c.deadline(), None, "still busy while the body streams");
        drop(body);
        let idle = Instant::now();
        assert_eq!(c.deadline(), Some((idle + Duration::from_secs(60), Expired::Idle)));
        tokio::time::advance(Duration::from_secs(3)).await;
        c.wrote();
        assert_eq!(c.deadline().unwrap().0, Instant::now() + Duration::from_secs(60), "writing is activity");
        c.read();
        assert_eq!(c.deadline(), Some((Instant::now() + Duration::from_secs(10), Expired::Head)), "a head began");
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_is_never_later_than_a_deadline_a_phase_change_can_bring() {
        let c = connection();
        let start = Instant::now();
        assert_eq!(c.next_check(start), start + Duration::from_secs(10), "the first head's deadline");
        let request = c.request(false);
        assert_eq!(c.next_check(start), start + Duration::from_secs(10), "busy: the shorter timeout");
        drop(request.answered(()));
        let idle = Instant::now();
        assert_eq!(c.next_check(idle), idle + Duration::from_secs(10), "idle for 60 s, but a head may begin");
        tokio::time::advance(Duration::from_secs(7)).await;
        c.read();
        let head = Instant::now();
        assert_eq!(c.next_check(head), head + Duration::from_secs(10), "a head began: due in 10 s");
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(c.next_check(Instant::now()), head + Duration::from_secs(10), "the deadline, not later");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_http2_connection_counts_requests_not_frames() {
        let c = connection();
        drop(c.request(true).answered(()));
        let since = Instant::now();
        c.read();
        assert_eq!(c.deadline(), Some((since + Duration::from_secs(60), Expired::Idle)));
    }

    #[tokio::test]
    async fn exchange_slots_are_bounded_and_given_back() {
        let c = connection();
        let a = c.exchange_slot().unwrap();
        let _b = c.exchange_slot().unwrap();
        assert!(c.exchange_slot().is_none());
        drop(a);
        assert!(c.exchange_slot().is_some());
    }

    #[tokio::test]
    async fn refusals_for_the_exchange_limit_count_as_waste() {
        let c = connection();
        let _a = c.exchange_slot().unwrap();
        let _b = c.exchange_slot().unwrap();
        for _ in 0..3 {
            assert!(c.exchange_slot().is_none());
        }
        assert!(!c.closing.load(Ordering::Acquire));
        assert!(c.exchange_slot().is_none());
        tokio::time::timeout(Duration::from_millis(50), std::future::poll_fn(|cx| c.poll_close(cx))).await.unwrap();
    }

    #[tokio::test]
    async fn too_many_abandoned_requests_ask_the_connection_to_close() {
        let c = connection();
        for _ in 0..3 {
            drop(c.request(true));
        }
        assert!(!c.closing.load(Ordering::Acquire), "three are allowed");
        let asked = tokio::spawn({
            let c = Arc::clone(&c);
            async move { std::future::poll_fn(|cx| c.poll_close(cx)).await }
        });
        tokio::task::yield_now().await;
        drop(c.request(true));
        tokio::time::timeout(Duration::from_millis(50), asked).await.unwrap().unwrap();
    }
}
