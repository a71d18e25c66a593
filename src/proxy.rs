//! Proxy: streaming pass-through for routes (or requests) without idempotency.
//!
//! Neither body is buffered: the request streams to the upstream and the response streams
//! back, so large uploads and downloads cost the gateway no memory.
//!
//! A protocol upgrade (`Upgrade: websocket`) is bridged: the request goes upstream with its
//! `Upgrade` and `Connection: upgrade`, and when the upstream switches protocols (101), the
//! two connections are joined byte for byte until either side closes or nothing moves for
//! `idle_timeout`. (Idempotent routes refuse upgrades: a stream of messages has no single
//! answer to store.)
//!
//! A request an observing route forwards as a duplicate of one it stored may carry what its
//! answer is expected to be ([`Expected`]): the answer is compared on its way, counted once if
//! it differs, and not a byte of it changes.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::Instant;

use crate::access::Notes;
use crate::body::{self, Body, BoxError};
use crate::connection::Connection;
use crate::headers;
use crate::metrics::status_class;
use crate::runtime::Route;
use crate::upgrade;
use crate::upstream::{Upstream, UpstreamError};

/// Streams a request to its route's upstream and back, as a plain route does, timing the
/// exchange for the route's upstream latency histogram and the access line; an answer
/// `expected` is compared on its way.
pub async fn pass_through<B>(
    route: &Route,
    request: Request<B>,
    connection: &Arc<Connection>,
    notes: &mut Notes,
    expected: Option<Expected>,
) -> Result<Response<Body>, UpstreamError>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let sent = Instant::now();
    let mut request = request;
    // Traced: the upstream gets the gateway's span as its parent.
    let span = notes.span.as_ref().map(|s| s.upstream(request.headers_mut()));
    let forwarded = send(&route.upstream, request.map(body::boxed), connection).await;
    if let Some(span) = span {
        match &forwarded {
            Ok(response) => {
                span.set("http.response.status_code", i64::from(response.status().as_u16()));
                span.end(None);
            }
            Err(e) => span.end(Some(e.to_string())),
        }
    }
    let class = forwarded.as_ref().map_or("error", |r| status_class(r.status()));
    let took = sent.elapsed();
    notes.upstream = Some(took);
    // Not into the route's answer-time quantile: that is of keyed exchanges (their whole
    // answer), for a duplicate's `Retry-After`.
    route.metrics.passed_latency(class, took);
    match expected {
        Some(expected) => forwarded.map(|response| expected.compare(response)),
        None => forwarded,
    }
}

/// Forwards `request` to `upstream` and relays the response.
pub async fn send(
    upstream: &Upstream,
    mut request: Request<Body>,
    connection: &Arc<Connection>,
) -> Result<Response<Body>, UpstreamError> {
    let peer = &connection.peer;
    let upgrade = headers::upgrade_requested(request.headers());
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    upstream.prepare(&mut parts, peer);
    if let Some(protocol) = &upgrade {
        // Hop-by-hop, so `prepare` removed them; an upgrade is the one hop they are for.
        parts.headers.insert(UPGRADE, protocol.clone());
        parts.headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // The deadline covers the response head; the body then streams as long as it flows.
    let deadline = tokio::time::Instant::now() + upstream.timeout();
    let mut response = upstream.send(Request::from_parts(parts, body), deadline).await?;
    match client_side {
        Some(client_side) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            let upstream_side = hyper::upgrade::on(&mut response);
            let protocol = response.headers().get(UPGRADE).cloned();
            // The bridge holds the connection (and its place under max_connections) while
            // the switched protocol runs.
            tokio::spawn(upgrade::bridge(client_side, upstream_side, Arc::clone(connection)));
            let mut switched = relay(response);
            if let Some(protocol) = protocol {
                switched.headers_mut().insert(UPGRADE, protocol);
            }
            switched.headers_mut().insert(CONNECTION, HeaderValue::from_static("upgrade"));
            Ok(switched)
        }
        _ => Ok(relay(response)),
    }
}

/// The upstream's response as the client gets it: hop-by-hop headers removed, and in the
/// client's protocol version rather than the upstream's (an HTTP/1.0 upstream must not turn
/// a client's keep-alive HTTP/1.1 connection into an HTTP/1.0 one).
pub fn relay(response: Response<Incoming>) -> Response<Body> {
    let (mut parts, incoming) = response.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    parts.version = http::Version::HTTP_11;
    Response::from_parts(parts, body::boxed(incoming))
}

/// What a forwarded request's answer is expected to be: the status, and the body when it is
/// known whole; `differed` counts an answer that is not the same, once.
pub struct Expected {
    /// The status expected.
    pub status: StatusCode,
    /// The body expected, when known.
    pub body: Option<Bytes>,
    /// Counts an answer that differs.
    pub differed: Counter,
}

impl Expected {
    /// `response`, compared on its way: the status at once, the body as it streams.
    fn compare(self, response: Response<Body>) -> Response<Body> {
        match self.body {
            _ if response.status() != self.status => {
                self.differed.inc();
                response
            }
            Some(expected) => response.map(|body| body::boxed(Compared::new(body, expected, self.differed))),
            None => response,
        }
    }
}

/// A duplicate's answer on its way to the client, compared with the answer stored for its
/// key; `differed` counts it once if it was not the same.
struct Compared {
    inner: Body,
    expected: Bytes,
    /// How much of `expected` matched so far; `None` once something differed.
    matched: Option<usize>,
    differed: Counter,
    judged: bool,
}

impl Compared {
    /// Compares `inner` with `expected`.
    fn new(inner: Body, expected: Bytes, differed: Counter) -> Self {
        Self { inner, expected, matched: Some(0), differed, judged: false }
    }

    fn compare(&mut self, data: &Bytes) {
        self.matched = self.matched.and_then(|at| {
            let end = at.checked_add(data.len())?;
            (self.expected.get(at..end) == Some(&data[..])).then_some(end)
        });
    }

    fn judge(&mut self) {
        if !self.judged {
            self.judged = true;
            if self.matched != Some(self.expected.len()) {
                self.differed.inc();
            }
        }
    }
}

impl http_body::Body for Compared {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.compare(data);
                }
                if this.inner.is_end_stream() {
                    this.judge();
                }
            }
            None => this.judge(),
            // Broken off: not an answer to compare.
            Some(Err(_)) => this.judged = true,
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Compared {
    fn drop(&mut self) {
        // An empty answer may never be polled; one the client left early is not judged.
        if self.inner.is_end_stream() {
            self.judge();
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::body::BoxError;

    type Sent = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

    fn fed() -> (Sent, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        (tx, http_body_util::StreamBody::new(frames).boxed_unsync())
    }

    fn poll(body: &mut (impl http_body::Body<Data = Bytes, Error = BoxError> + Unpin)) -> Poll<Option<Bytes>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(body)
            .poll_frame(&mut cx)
            .map(|f| f.map(|f| f.ok().and_then(|f| f.into_data().ok()).unwrap_or_default()))
    }

    #[tokio::test]
    async fn a_duplicate_answer_is_counted_once_when_it_differs() {
        let counted = |body: Body, expected: &'static str| async move {
            let differed = Counter::default();
            let compared = Compared::new(body, Bytes::from(expected), differed.clone());
            let _ = compared.collect().await;
            differed.get()
        };
        assert_eq!(counted(body::full("same"), "same").await, 0);
        assert_eq!(counted(body::full("other"), "same").await, 1);
        assert_eq!(counted(body::full("sam"), "same").await, 1, "a prefix is another answer");
        assert_eq!(counted(body::full("samee"), "same").await, 1);
        assert_eq!(counted(body::full(""), "same").await, 1);
        assert_eq!(counted(body::full(""), "").await, 0);
        // Left before the end: not an answer to compare.
        let (tx, inner) = fed();
        let differed = Counter::default();
        let mut compared = Compared::new(inner, Bytes::from("same"), differed.clone());
        tx.send(Ok(Frame::data(Bytes::from("xx")))).await.unwrap();
        assert!(poll(&mut compared).is_ready());
        drop(compared);
        assert_eq!(differed.get(), 0);
    }
}
