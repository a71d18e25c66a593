//! Dial: the connector below each instance's pool. It makes the TCP connection (to the
//! instance's pinned address when it has one) and the TLS handshake above it, whatever
//! authority the request's URI carries (see [`super::prepare::POOL_KEY`]).
//!
//! Each dial, TLS handshake included, is bounded by `connect_timeout` and by the deadline of
//! the request that started it ([`by`]), whichever comes first, and its result is noted
//! against the instance here ([`Health`]). Why here: the request's own deadline cannot tell
//! a connection never made from a request sent and unanswered. The pool races a kept
//! connection against a new dial, and a future dropped at the deadline says nothing, so a
//! dial that hung past the deadline would leave the request's outcome "unknown" although
//! not a byte was written, and the instance, never counted, would never be left out. Bounded
//! here, a dial that runs out of time fails as a connect error, first: the request learns it
//! was never sent, and the instance's health learns it failed to connect.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::time::Instant;

use super::health::Health;

tokio::task_local! {
    /// The deadline of the request being sent on this task, read by a dial it starts.
    static DEADLINE: Instant;
}

/// Runs `send` with `deadline` as the latest end of any dial it starts.
///
/// Hazard: the deadline is read when the dial starts ([`Dial`]'s `call`, which the pool calls
/// while polling the request's own future), never while it runs: a dial whose request got a
/// kept connection instead goes on in a task of the pool's, outside this scope, and keeps
/// the bound it started with.
pub(super) fn by<F: Future>(deadline: Instant, send: F) -> impl Future<Output = F::Output> {
    DEADLINE.scope(deadline, send)
}

/// Why a dial failed.
#[derive(Debug, Error)]
enum DialError {
    /// No connection within the time the dial had.
    #[error("no connection within {0:?}")]
    TimedOut(Duration),
    /// The connector's own error (refused, DNS, TLS).
    #[error(transparent)]
    Failed(BoxError),
}

/// The pooled client's connector: connects to the upstream's real address, whatever
/// authority the request's URI carries (see [`super::prepare::POOL_KEY`]).
#[derive(Clone)]
pub(super) struct Dial {
    connector: HttpsConnector<Pinned>,
    /// The cleartext upstream's address; `None`: the URI's own (TLS upstreams).
    address: Option<Uri>,
    connect_timeout: Duration,
    /// Where each dial's result is noted.
    health: Arc<Health>,
}

type DialFuture =
    Pin<Box<dyn Future<Output = Result<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Dial {
    /// A connector over `tls`, each dial bounded by `connect_timeout` (and by its request's
    /// deadline) and noted in `health`; to `pinned`, when given, instead of what the name
    /// resolves to, and to `address` (a cleartext upstream's), when given, instead of the
    /// URI's authority.
    pub(super) fn new(
        tls: rustls::ClientConfig,
        connect_timeout: Duration,
        pinned: Option<SocketAddr>,
        address: Option<Uri>,
        health: Arc<Health>,
    ) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let to = pinned.and_then(|address| {
            Uri::builder().scheme("http").authority(address.to_string()).path_and_query("/").build().ok()
        });
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(Pinned { http, to });
        Self { connector, address, connect_timeout, health }
    }
}

impl tower_service::Service<Uri> for Dial {
    type Response = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
    type Error = BoxError;
    type Future = DialFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let dst = self.address.clone().unwrap_or(dst);
        let started = Instant::now();
        let bound = started + self.connect_timeout;
        // Outside a request's scope (a dial the pool started on its own), `connect_timeout`.
        let until = DEADLINE.try_with(|deadline| (*deadline).min(bound)).unwrap_or(bound);
        Box::pin(bounded(self.connector.call(dst), started, until, Arc::clone(&self.health)))
    }
}

/// `connecting`, failed at `until` if it has not connected by then, its result noted in
/// `health`. A dial given no time at all (its request's deadline had passed) is not the
/// instance's failure, and is not counted.
async fn bounded<S>(
    connecting: impl Future<Output = Result<S, BoxError>>,
    started: Instant,
    until: Instant,
    health: Arc<Health>,
) -> Result<S, BoxError> {
    let mut noted = Noted { health: &health, until, pending: until > started };
    let mut timed = std::pin::pin!(tokio::time::timeout_at(until, connecting));
    // The clock is read before the timer is polled: when the request's deadline fires, the
    // request's future is polled and reaches this dial first; it must fail here, as a connect
    // error, whether or not the runtime has marked this dial's own timer fired yet, or the
    // request would be taken for sent.
    let made = std::future::poll_fn(|cx| {
        if Instant::now() >= until {
            return Poll::Ready(Err(DialError::TimedOut(until - started)));
        }
        timed.as_mut().poll(cx).map(|made| match made {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(DialError::Failed(e)),
            Err(_) => Err(DialError::TimedOut(until - started)),
        })
    })
    .await;
    let counted = std::mem::replace(&mut noted.pending, false);
    match made {
        Ok(stream) => {
            health.dialed();
            Ok(stream)
        }
        Err(e) => {
            if counted {
                health.dial_failed();
            }
            Err(Box::new(e))
        }
    }
}

/// A dial not yet over. Dropped while still pending past its end (its request's future went
/// at its deadline before the dial was polled), it counts as failed: a dropped future says
/// nothing else, and the instance would never be left out. Dropped before (the client went,
/// or shutdown), it says nothing about the instance.
struct Noted<'a> {
    health: &'a Health,
    until: Instant,
    pending: bool,
}

impl Drop for Noted<'_> {
    fn drop(&mut self) {
        if self.pending && Instant::now() >= self.until {
            self.health.dial_failed();
        }
    }
}

/// The TCP connector below TLS: connects to the instance's pinned address when it has one.
/// TLS, above, still takes the name from the URI, so the server name sent and the
/// certificate checked stay the configured host's, whatever address it resolved to.
#[derive(Clone)]
struct Pinned {
    http: HttpConnector,
    /// `http://ADDRESS:PORT/`: only its host and port are read.
    to: Option<Uri>,
}

impl tower_service::Service<Uri> for Pinned {
    type Response = <HttpConnector as tower_service::Service<Uri>>::Response;
    type Error = <HttpConnector as tower_service::Service<Uri>>::Error;
    type Future = <HttpConnector as tower_service::Service<Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let dst = self.to.clone().unwrap_or(dst);
        self.http.call(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Ejection;

    /// An instance's health that leaves it out at its first connect failure.
    fn health() -> Arc<Health> {
        let rule = Ejection { after: 1, ..crate::config::default_ejection() };
        Arc::new(Health::new("app", "10.0.0.5:3000", rule, true, None))
    }

    /// A connect that never ends.
    fn never() -> std::future::Pending<Result<(), BoxError>> {
        std::future::pending()
    }

    #[tokio::test(start_paused = true)]
    async fn a_dial_past_its_end_fails_as_a_connect_error_and_counts_if_it_had_time() {
        // Past its end when first polled: it fails at once, as a dial that timed out, and counts.
        let h = health();
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(20)).await;
        let e = bounded(never(), started, started + Duration::from_millis(10), Arc::clone(&h)).await.unwrap_err();
        assert!(matches!(e.downcast_ref::<DialError>(), Some(DialError::TimedOut(_))), "{e}");
        assert!(h.load.out(Instant::now()), "not counted");
        // Given no time at all (its request's deadline had passed): not the instance's doing.
        let h = health();
        let now = Instant::now();
        assert!(bounded(never(), now, now, Arc::clone(&h)).await.is_err());
        assert!(!h.load.out(Instant::now()));
        // Dropped while pending: counted past its end (its request's deadline went first), not
        // before (the client went away).
        for (wait, counted) in [(Duration::from_millis(20), true), (Duration::from_millis(5), false)] {
            let h = health();
            let now = Instant::now();
            let mut dial = Box::pin(bounded(never(), now, now + Duration::from_millis(10), Arc::clone(&h)));
            let waker = std::task::Waker::noop();
            assert!(dial.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
            tokio::time::advance(wait).await;
            drop(dial);
            assert_eq!(h.load.out(Instant::now()), counted, "dropped after {wait:?}");
        }
    }

    #[tokio::test]
    async fn a_pinned_instance_connects_to_its_address_whatever_name_it_is_asked_for() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let mut pinned = Pinned { http, to: Some(format!("http://{address}/").parse().unwrap()) };
        // A name that resolves nowhere (RFC 6761's .invalid) on another port: only the pinned
        // address can have been connected to.
        let target: Uri = "https://orders.invalid:1/".parse().unwrap();
        let connecting = tower_service::Service::call(&mut pinned, target);
        let (accepted, connected) =
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(listener.accept(), connecting) })
                .await
                .expect("no connection within 5 s");
        let (accepted, connected) = (accepted.unwrap().0, connected.unwrap());
        assert_eq!(connected.inner().peer_addr().unwrap(), address);
        assert_eq!(accepted.peer_addr().unwrap(), connected.inner().local_addr().unwrap());
    }
}
