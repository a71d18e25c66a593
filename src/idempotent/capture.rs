//! Capture: reading an upstream response so that it can be stored.
//!
//! The response is buffered up to the route's `max_stored_body`. A larger response is not an
//! error: it is delivered to the client as a stream (the part already read, then the rest)
//! and its key is released, since it cannot be replayed.

use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};

use crate::body::{self, Body, BoxError};

/// An upstream response after capture.
pub enum Captured {
    /// The whole body, within the limit.
    Whole(Parts, Bytes),
    /// The body passed the limit; `body` replays the captured prefix and streams the rest.
    TooLarge(Parts, Body),
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
        return Ok(Captured::TooLarge(parts, body::boxed(body)));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        // Trailers are not stored; few APIs send them on JSON responses.
        let Ok(data) = frame?.into_data() else { continue };
        size += data.len();
        chunks.push(data);
        if size > limit {
            return Ok(Captured::TooLarge(parts, prefixed(chunks, body)));
        }
    }
    Ok(Captured::Whole(parts, concat(chunks, size)))
}

/// One buffer from many; no copy when the upstream sent a single chunk.
fn concat(mut chunks: Vec<Bytes>, size: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(size);
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out.freeze()
}

/// A body that yields `prefix` first, then whatever `rest` still holds.
fn prefixed(prefix: Vec<Bytes>, rest: Incoming) -> Body {
    let head = futures_util::stream::iter(prefix.into_iter().map(|b| Ok::<_, BoxError>(Frame::data(b))));
    let tail = http_body_util::BodyStream::new(rest.map_err(BoxError::from));
    body::boxed(http_body_util::StreamBody::new(futures_util::StreamExt::chain(head, tail)))
}
