//! Bodies: one boxed body type for every response, and bounded reading of request bodies.
//!
//! An idempotent route must read the whole request body before it can fingerprint it, so the
//! read is bounded: a declared Content-Length over the limit is refused before a byte is read,
//! and a chunked body is cut off as soon as it passes the limit. Unbounded buffering would let
//! one client exhaust the gateway's memory.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use thiserror::Error;

/// Errors of any body, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the gateway produces and every request it forwards.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// A body holding `payload`'s pieces as they are: one frame each, nothing joined.
pub fn payload(payload: Payload) -> Body {
    if payload.pieces().nth(1).is_none() {
        return full(payload.to_bytes());
    }
    Pieces { left: payload.len(), pieces: payload.pieces().cloned().collect::<Vec<_>>().into_iter() }.boxed_unsync()
}

/// The frames of a [`payload`] in pieces; its exact size is known, as for a `Full` body.
struct Pieces {
    pieces: std::vec::IntoIter<Bytes>,
    left: usize,
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let next = self.pieces.next();
        if let Some(piece) = &next {
            self.left -= piece.len();
        }
        std::task::Poll::Ready(next.map(|piece| Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left as u64)
    }
}

/// Boxes any body whose errors convert into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// Why a request body could not be read.
#[derive(Debug, Error)]
pub enum BodyError {
    /// The body is larger than the route accepts.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The route's limit.
        limit: usize,
    },
    /// The client's connection failed mid-body.
    #[error("cannot read request body: {0}")]
    Read(BoxError),
    /// The whole body did not arrive in time (a stalled or trickling client).
    #[error("request body not received within {limit:?}")]
    Timeout {
        /// The deadline.
        limit: std::time::Duration,
    },
}

/// Reads a whole request body of at most `limit` bytes, all of it within `deadline`: a slow
/// body must not hold a connection (and, on an idempotent route, delay everything after it)
/// for as long as the client likes.
pub async fn read_bounded<B>(
    headers: &HeaderMap,
    body: B,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared =
        headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let read = tokio::time::timeout(deadline, Limited::new(body, limit).collect());
    match read.await {
        Err(_) => Err(BodyError::Timeout { limit: deadline }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge { limit }),
        Ok(Err(e)) => Err(BodyError::Read(e)),
    }
}

/// A request body as a route that only observes reads it ([`read_or_pass`]).
pub enum Readout {
    /// The whole body, within the limit and the deadline.
    Whole(Bytes),
    /// Not read whole, for the reason given: what was read, then the rest as it comes, to be
    /// forwarded as a pass-through route forwards it.
    Unread(Unread, Body),
}

/// Why a body was not read whole ([`Readout::Unread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Over the limit (declared, or as it arrived).
    TooLarge,
    /// Not all there by the deadline.
    Slow,
    /// The client's connection failed mid-body.
    Broken,
}

/// Reads a request body whole when it fits in `limit` bytes and arrives within `deadline`;
/// otherwise hands back what was read followed by the rest, so that nothing is lost and the
/// upstream gets the body a pass-through route would send it (the gateway never answers for
/// a body on a route that only observes).
pub async fn read_or_pass(
    headers: &HeaderMap,
    mut body: hyper::body::Incoming,
    limit: usize,
    deadline: std::time::Duration,
) -> Readout {
    let declared =
        headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Readout::Unread(Unread::TooLarge, boxed(body));
    }
    let until = tokio::time::Instant::now() + deadline;
    let mut read: Vec<http_body::Frame<Bytes>> = Vec::new();
    let mut size = 0usize;
    loop {
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => return Readout::Unread(Unread::Slow, then(read, boxed(body))),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                let failed =
                    futures_util::stream::once(async move { Err::<http_body::Frame<Bytes>, BoxError>(e.into()) });
                return Readout::Unread(
                    Unread::Broken,
                    then(read, http_body_util::StreamBody::new(failed).boxed_unsync()),
                );
            }
            Ok(Some(Ok(frame))) => frame,
        };
        size += frame.data_ref().map_or(0, Bytes::len);
        read.push(frame);
        if size > limit {
            return Readout::Unread(Unread::TooLarge, then(read, boxed(body)));
        }
    }
    let mut whole = BytesMut::with_capacity(size);
    // Trailers are not part of what is fingerprinted or forwarded, as on an enforcing route.
    for data in read.into_iter().filter_map(|frame| frame.into_data().ok()) {
        whole.extend_from_slice(&data);
    }
    Readout::Whole(whole.freeze())
}

/// A body that yields `first`, then whatever `rest` holds.
fn then(first: Vec<http_body::Frame<Bytes>>, rest: Body) -> Body {
    let head = futures_util::stream::iter(first.into_iter().map(Ok::<_, BoxError>));
    let tail = http_body_util::BodyStream::new(rest);
    http_body_util::StreamBody::new(futures_util::StreamExt::chain(head, tail)).boxed_unsync()
}

/// A body held in shared buffers: one, as a store returns it, or the pieces an upstream's
/// answer arrived in. The pieces are never joined: the client's answer and the store's write
/// both read them where they are, so a captured answer is not copied by the gateway itself.
#[derive(Clone, Default)]
pub struct Payload {
    first: Bytes,
    /// The pieces after `first`, rarely any for small answers.
    rest: Vec<Bytes>,
    len: usize,
}

impl Payload {
    /// A body in the pieces it arrived in (empty pieces are left out).
    pub fn from_pieces(pieces: Vec<Bytes>) -> Self {
        let mut pieces = pieces.into_iter().filter(|b| !b.is_empty());
        let first = pieces.next().unwrap_or_default();
        let rest: Vec<Bytes> = pieces.collect();
        let len = first.len() + rest.iter().map(Bytes::len).sum::<usize>();
        Self { first, rest, len }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its pieces, in order (none for an empty body).
    pub fn pieces(&self) -> impl Iterator<Item = &Bytes> {
        std::iter::once(&self.first).chain(&self.rest).filter(|b| !b.is_empty())
    }

    /// The body in one buffer: shared when it is one piece, else joined (a copy).
    pub fn to_bytes(&self) -> Bytes {
        if self.rest.is_empty() {
            return self.first.clone();
        }
        let mut out = BytesMut::with_capacity(self.len);
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out.freeze()
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Self {
        let len = bytes.len();
        Self { first: bytes, rest: Vec::new(), len }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Bytes::from(bytes).into()
    }
}

impl From<&'static [u8]> for Payload {
    fn from(bytes: &'static [u8]) -> Self {
        Bytes::from_static(bytes).into()
    }
}

impl From<&'static str> for Payload {
    fn from(text: &'static str) -> Self {
        Bytes::from_static(text.as_bytes()).into()
    }
}

/// Equal when the bytes are, however they are cut into pieces.
impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        let (mut a, mut b) = (self.pieces().flat_map(|p| p.iter()), other.pieces().flat_map(|p| p.iter()));
        loop {
            match (a.next(), b.next()) {
                (None, None) => return true,
                (x, y) if x != y => return false,
                _ => {}
            }
        }
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first: Vec<u8> = self.pieces().flat_map(|p| p.iter().copied()).take(64).collect();
        f.debug_struct("Payload")
            .field("len", &self.len)
            .field("pieces", &(usize::from(!self.first.is_empty()) + self.rest.len()))
            .field("start", &Bytes::from(first))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

    #[tokio::test]
    async fn a_payload_in_pieces_is_sent_as_its_pieces_with_its_exact_length() {
        let pieces = vec![Bytes::from_static(b"{\"order"), Bytes::from_static(b"_id\":1}")];
        let addresses: Vec<*const u8> = pieces.iter().map(|p| p.as_ptr()).collect();
        let mut body = payload(Payload::from_pieces(pieces));
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(14), "sized like a Full body");
        let mut seen = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.expect("no error").into_data().expect("data");
            seen.push(data.as_ptr());
        }
        assert_eq!(seen, addresses, "the pieces themselves, not a copy");
        assert!(http_body::Body::is_end_stream(&body));
    }

    fn chunked(chunks: &[&'static [u8]]) -> impl http_body::Body<Data = Bytes, Error = BoxError> {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            chunks.iter().map(|c| Ok(Frame::data(Bytes::from_static(c)))).collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    fn with_length(n: u64) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_LENGTH, n.into());
        h
    }

    #[tokio::test]
    async fn reads_bodies_up_to_the_limit() {
        let b = read_bounded(&HeaderMap::new(), chunked(&[b"ab", b"cd"]), 4, SECOND).await.unwrap();
        assert_eq!(&b[..], b"abcd");
    }

    #[tokio::test]
    async fn declared_length_over_the_limit_is_refused_unread() {
        let err = read_bounded(&with_length(5), chunked(&[]), 4, SECOND).await.unwrap_err();
        assert!(matches!(err, BodyError::TooLarge { limit: 4 }));
    }

    #[tokio::test]
    async fn streamed_bodies_are_cut_at_the_limit() {
        let err = read_bounded(&HeaderMap::new(), chunked(&[b"abc", b"de"]), 4, SECOND).await.unwrap_err();
        assert!(matches!(err, BodyError::TooLarge { limit: 4 }));
    }
}
