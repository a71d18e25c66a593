//! Capture: reading an upstream response so that it can be stored.
//!
//! The response is buffered up to the route's `max_stored_body`. A larger response is not an
//! error: it is delivered to the client as a stream (the part already read, then the rest),
//! and the exchange learns how that stream ended ([`StreamEnd`]): the request ran whether or
//! not the body is kept, and a body that broke off leaves its outcome unknown.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::response::Parts;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use tokio::sync::oneshot;

use crate::body::Payload;
use crate::body::{self, Body, BoxError};

/// An upstream response after capture.
pub enum Captured {
    /// The whole body, within the limit, in the pieces it arrived in.
    Whole(Parts, Payload),
    /// The body passed the limit; `body` replays the captured prefix and streams the rest,
    /// and `end` says how that stream ended.
    TooLarge(Parts, Body, oneshot::Receiver<StreamEnd>),
}

/// How a streamed response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream's body arrived in full.
    Complete,
    /// The upstream's body broke off: its answer is incomplete.
    Broken,
    /// The client stopped reading before the end (the upstream had answered).
    ClientGone,
}

/// Reads `response` whole if it fits in `limit` bytes.
pub async fn capture(response: http::Response<Incoming>, limit: usize) -> Result<Captured, hyper::Error> {
    let (parts, mut body) = response.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let (body, end) = Watched::new(body::boxed(body));
        return Ok(Captured::TooLarge(parts, body::boxed(body), end));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        // Trailers are not stored; few APIs send them on JSON responses.
        let Ok(data) = frame?.into_data() else { continue };
        size += data.len();
        chunks.push(data);
        if size > limit {
            let (body, end) = Watched::new(prefixed(chunks, body));
            return Ok(Captured::TooLarge(parts, body::boxed(body), end));
        }
    }
    // Not joined: the client's answer and the store's write read the pieces where they are.
    Ok(Captured::Whole(parts, Payload::from_pieces(chunks)))
}

/// A body that yields `prefix` first, then whatever `rest` still holds.
fn prefixed(prefix: Vec<Bytes>, rest: Incoming) -> Body {
    let head = futures_util::stream::iter(prefix.into_iter().map(|b| Ok::<_, BoxError>(Frame::data(b))));
    let tail = http_body_util::BodyStream::new(rest.map_err(BoxError::from));
    body::boxed(http_body_util::StreamBody::new(futures_util::StreamExt::chain(head, tail)))
}

/// A body that reports how it ended: complete, broken, or dropped before the end.
struct Watched {
    inner: Body,
    end: Option<oneshot::Sender<StreamEnd>>,
}

impl Watched {
    fn new(inner: Body) -> (Self, oneshot::Receiver<StreamEnd>) {
        let (tx, rx) = oneshot::channel();
        (Self { inner, end: Some(tx) }, rx)
    }

    fn report(&mut self, end: StreamEnd) {
        if let Some(tx) = self.end.take() {
            let _ = tx.send(end);
        }
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.report(StreamEnd::Complete),
            Poll::Ready(Some(Err(_))) => self.report(StreamEnd::Broken),
            _ => {}
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

impl Drop for Watched {
    fn drop(&mut self) {
        self.report(StreamEnd::ClientGone);
    }
}
