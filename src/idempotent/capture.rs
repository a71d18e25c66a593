//! Capture: reading an upstream answer so that it can be stored, and watching the answers
//! that stream to the client while the exchange waits to settle.
//!
//! An enforcing route reads the answer whole up to its `max_stored_body` ([`capture`]). A
//! larger answer is not an error: it streams to the client (the part already read, then the
//! rest) through a [`Tee`] that tells the exchange how the stream ended: the request ran
//! whether or not the body is kept, and a body that broke off leaves its outcome unknown.
//!
//! An observing route streams every answer, as a plain route would, through a [`Tee`] that
//! also captures it up to the limit and holds its last bytes back until the key is settled,
//! so that a retry sent after the whole answer finds it settled. Neither tee changes a byte of
//! what the client gets.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::response::Parts;
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;

use crate::body::{self, Body, BoxError, Payload};

/// An upstream answer after capture.
pub enum Captured {
    /// The whole body, within the limit, in the pieces it arrived in.
    Whole(Parts, Payload),
    /// The body passed the limit; the tee replays the captured prefix and streams the rest,
    /// and `end` says how that stream ended.
    TooLarge(Parts, Tee, oneshot::Receiver<StreamEnd>),
}

/// How an answer streamed through a [`Tee`] ended.
pub enum StreamEnd {
    /// The whole answer went by; its body, when the tee captured it within the limit. When
    /// the tee holds the last bytes back, they wait until `settled` is answered or dropped.
    Complete {
        /// The body, within the limit (observing only).
        body: Option<Payload>,
        /// Answered (or dropped) once the key is settled (observing only).
        settled: Option<oneshot::Sender<()>>,
    },
    /// The upstream broke its answer off.
    Broken,
    /// The client went away before the end: what was captured (`None` once it outgrew the
    /// limit, or when nothing is captured) and the rest of the upstream's body.
    Left {
        /// The pieces read so far, within the limit.
        captured: Option<Vec<Bytes>>,
        /// Their size.
        size: usize,
        /// The rest of the answer.
        rest: Body,
    },
}

/// Reads `response` whole if it fits in `limit` bytes; else streams it through a [`Tee`]
/// that captures nothing.
pub async fn capture(response: http::Response<Incoming>, limit: usize) -> Result<Captured, hyper::Error> {
    let (parts, mut body) = response.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let (tee, end) = Tee::watching(body::boxed(body));
        return Ok(Captured::TooLarge(parts, tee, end));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        // Trailers are not stored; few APIs send them on JSON responses.
        let Ok(data) = frame?.into_data() else { continue };
        size += data.len();
        chunks.push(data);
        if size > limit {
            let (tee, end) = Tee::watching(prefixed(chunks, body));
            return Ok(Captured::TooLarge(parts, tee, end));
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

/// An answer on its way to the client, watched: the exchange learns how it ended, and, when
/// the tee captures, what it was (up to a limit), with its last bytes held back until the
/// key is settled.
pub struct Tee {
    inner: Option<Body>,
    limit: usize,
    /// The pieces read so far while they fit in `limit`; `None` once the answer outgrew it,
    /// or when the tee does not capture.
    captured: Option<Vec<Bytes>>,
    size: usize,
    /// Whether the end waits for the settle (a capturing tee).
    holds: bool,
    /// Told how the answer ended; taken once it is.
    end: Option<oneshot::Sender<StreamEnd>>,
    /// After the end was told: the settle's word, and the last frame (or the end) held back
    /// until it comes.
    settling: Option<(oneshot::Receiver<()>, Option<Frame<Bytes>>)>,
    done: bool,
}

impl Tee {
    /// Watches `inner` without capturing or holding anything: the receiver learns how it
    /// ended (an enforcing route's answer too large to store).
    pub fn watching(inner: Body) -> (Self, oneshot::Receiver<StreamEnd>) {
        Self::new(inner, 0, false)
    }

    /// Watches `inner`, capturing it up to `limit` bytes and holding its end back until the
    /// key is settled (an observing route's answer).
    pub fn capturing(inner: Body, limit: usize) -> (Self, oneshot::Receiver<StreamEnd>) {
        Self::new(inner, limit, true)
    }

    fn new(inner: Body, limit: usize, holds: bool) -> (Self, oneshot::Receiver<StreamEnd>) {
        let (tx, rx) = oneshot::channel();
        let captured = holds.then(Vec::new);
        let tee =
            Self { inner: Some(inner), limit, captured, size: 0, holds, end: Some(tx), settling: None, done: false };
        (tee, rx)
    }

    fn capture(&mut self, data: &Bytes) {
        self.size += data.len();
        if self.size > self.limit {
            self.captured = None;
        } else if let Some(pieces) = &mut self.captured {
            pieces.push(data.clone());
        }
    }

    fn tell(&mut self, end: StreamEnd) -> bool {
        self.end.take().is_some_and(|tx| tx.send(end).is_ok())
    }

    /// The answer is complete: tell the exchange, and (holding) keep `last` back until it has
    /// settled.
    fn complete(&mut self, last: Option<Frame<Bytes>>) -> Option<Frame<Bytes>> {
        self.inner = None;
        if !self.holds {
            self.tell(StreamEnd::Complete { body: None, settled: None });
            self.done = true;
            return last;
        }
        let (settled, wait) = oneshot::channel();
        let body = self.captured.take().map(Payload::from_pieces);
        // Nobody to wait for when the exchange is gone: a closed receiver is ready at once.
        let wait = if self.tell(StreamEnd::Complete { body, settled: Some(settled) }) { wait } else { closed() };
        self.settling = Some((wait, last));
        None
    }
}

/// A receiver whose sender is gone: it is ready at once.
fn closed() -> oneshot::Receiver<()> {
    oneshot::channel().1
}

impl http_body::Body for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some((settled, _)) = &mut this.settling {
                // Either word will do: settled, or the exchange gave up waiting.
                let _ = ready!(Pin::new(settled).poll(cx));
                let last = this.settling.take().and_then(|(_, last)| last);
                this.done = true;
                return Poll::Ready(last.map(Ok));
            }
            let polled = match this.inner.as_mut() {
                Some(inner) if !this.done => ready!(Pin::new(inner).poll_frame(cx)),
                _ => return Poll::Ready(None),
            };
            match polled {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        this.capture(data);
                    }
                    // The last frame, when the body knows it is (a Content-Length answer): a
                    // holding tee keeps it back, since the client has the whole answer once
                    // it is written.
                    if !this.holds || !this.inner.as_ref().is_none_or(http_body::Body::is_end_stream) {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.complete(Some(frame));
                }
                Some(Err(e)) => {
                    this.tell(StreamEnd::Broken);
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    if let Some(last) = this.complete(None) {
                        return Poll::Ready(Some(Ok(last)));
                    }
                    if this.done {
                        return Poll::Ready(None);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match (&self.inner, self.holds) {
            // Never ahead of the settle: an empty answer is polled, and waits for it too.
            (_, true) | (None, false) => self.done,
            (Some(inner), false) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match (&self.inner, &self.settling) {
            (Some(inner), _) => inner.size_hint(),
            (None, Some((_, Some(last)))) => {
                http_body::SizeHint::with_exact(last.data_ref().map_or(0, |d| d.len() as u64))
            }
            (None, _) => http_body::SizeHint::with_exact(0),
        }
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        // Gone before the end: a capturing tee's exchange reads on, to settle with the whole
        // answer; a watching one's takes the answer as delivered.
        if let (Some(end), Some(rest)) = (self.end.take(), self.inner.take()) {
            let _ = end.send(StreamEnd::Left { captured: self.captured.take(), size: self.size, rest });
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::task::Waker;

    use http_body::Body as _;

    use super::*;

    type Sent = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

    /// A body whose frames the test sends, one at a time.
    pub(crate) fn fed() -> (Sent, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        (tx, http_body_util::StreamBody::new(frames).boxed_unsync())
    }

    pub(crate) fn poll(
        body: &mut (impl http_body::Body<Data = Bytes, Error = BoxError> + Unpin),
    ) -> Poll<Option<Bytes>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(body)
            .poll_frame(&mut cx)
            .map(|f| f.map(|f| f.ok().and_then(|f| f.into_data().ok()).unwrap_or_default()))
    }

    #[tokio::test]
    async fn the_last_bytes_of_an_answer_wait_for_the_settle() {
        let (mut tee, end) = Tee::capturing(body::full("abc"), 10);
        assert!(poll(&mut tee).is_pending(), "the only frame is the last: held back");
        let Ok(StreamEnd::Complete { body: Some(captured), settled }) = end.await else { panic!("not complete") };
        assert_eq!(captured.to_bytes(), "abc");
        assert!(poll(&mut tee).is_pending() && !tee.is_end_stream());
        drop(settled);
        assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from("abc"))));
        assert!(tee.is_end_stream());
        assert_eq!(poll(&mut tee), Poll::Ready(None));
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_streams_whole_and_is_not_kept() {
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::capturing(inner, 4);
        for piece in ["abc", "def"] {
            tx.send(Ok(Frame::data(Bytes::from(piece)))).await.unwrap();
            assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from(piece))));
        }
        drop(tx);
        assert!(poll(&mut tee).is_pending(), "the end waits for the settle");
        let Ok(StreamEnd::Complete { body: None, settled: Some(settled) }) = end.await else {
            panic!("kept a body over the limit")
        };
        settled.send(()).unwrap();
        assert_eq!(poll(&mut tee), Poll::Ready(None));
    }

    #[tokio::test]
    async fn a_client_gone_mid_answer_leaves_the_rest_to_the_exchange() {
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::capturing(inner, 100);
        tx.send(Ok(Frame::data(Bytes::from("head")))).await.unwrap();
        assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from("head"))));
        drop(tee);
        let Ok(StreamEnd::Left { captured: Some(captured), size: 4, rest }) = end.await else { panic!("not left") };
        assert_eq!(captured, [Bytes::from("head")]);
        tx.send(Ok(Frame::data(Bytes::from("tail")))).await.unwrap();
        drop(tx);
        assert_eq!(rest.collect().await.unwrap().to_bytes(), "tail");
    }

    #[tokio::test]
    async fn a_broken_answer_is_told_as_broken() {
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::capturing(inner, 100);
        tx.send(Err("reset".into())).await.unwrap();
        assert!(matches!(poll(&mut tee), Poll::Ready(Some(_))));
        assert!(matches!(end.await, Ok(StreamEnd::Broken)));
    }

    /// A watching tee passes every frame at once and tells the end without waiting for it.
    #[tokio::test]
    async fn a_watching_tee_holds_nothing_back() {
        let (mut tee, end) = Tee::watching(body::full("abc"));
        assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from("abc"))));
        assert_eq!(poll(&mut tee), Poll::Ready(None));
        assert!(matches!(end.await, Ok(StreamEnd::Complete { body: None, settled: None })));
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::watching(inner);
        tx.send(Ok(Frame::data(Bytes::from("head")))).await.unwrap();
        assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from("head"))));
        drop(tee);
        assert!(matches!(end.await, Ok(StreamEnd::Left { captured: None, .. })));
    }
}
