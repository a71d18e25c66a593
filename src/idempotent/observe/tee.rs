//! The answers a route in observe mode streams, watched on the way: the claimant's, captured
//! beside the stream for its settle ([`Tee`]), and a duplicate's, compared with the stored one
//! ([`Compared`]). Neither holds more than the route's `max_stored_body`, and neither changes
//! a byte of what the client gets.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as _, Frame};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::oneshot;

use crate::body::{Body, BoxError, Payload};

/// How the claimant's answer ended, for its settle.
pub enum TeeEnd {
    /// The whole answer went by; its body, when it fit in the limit. The last of the answer
    /// waits until `settled` is answered or dropped: a retry sent after the whole answer then
    /// finds the key settled, as it would under enforcement.
    Complete {
        /// The body, within the limit.
        body: Option<Payload>,
        /// Answered (or dropped) once the key is settled.
        settled: oneshot::Sender<()>,
    },
    /// The upstream broke its answer off.
    Broken,
    /// The client went away before the end: what was captured (`None` once it outgrew the
    /// limit) and the rest of the upstream's body, to read on.
    Left {
        /// The pieces read so far, within the limit.
        captured: Option<Vec<Bytes>>,
        /// Their size.
        size: usize,
        /// The rest of the answer.
        rest: Body,
    },
}

/// The claimant's answer on its way to the client, captured up to `limit` bytes.
pub struct Tee {
    inner: Option<Body>,
    limit: usize,
    /// The pieces read so far while they fit in `limit`; `None` once the answer outgrew it.
    captured: Option<Vec<Bytes>>,
    size: usize,
    /// Told how the answer ended; taken once it is.
    end: Option<oneshot::Sender<TeeEnd>>,
    /// After the end was told: the settle's word, and the last frame (or the end) held back
    /// until it comes.
    settling: Option<(oneshot::Receiver<()>, Option<Frame<Bytes>>)>,
    done: bool,
}

impl Tee {
    /// Watches `inner`; the receiver learns how it ended.
    pub fn new(inner: Body, limit: usize) -> (Self, oneshot::Receiver<TeeEnd>) {
        let (tx, rx) = oneshot::channel();
        let tee = Self {
            inner: Some(inner),
            limit,
            captured: Some(Vec::new()),
            size: 0,
            end: Some(tx),
            settling: None,
            done: false,
        };
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

    /// The answer is complete: tell the exchange, and hold `last` back until it has settled.
    fn complete(&mut self, last: Option<Frame<Bytes>>) {
        self.inner = None;
        let (settled, wait) = oneshot::channel();
        let body = self.captured.take().map(Payload::from_pieces);
        match self.end.take().map(|end| end.send(TeeEnd::Complete { body, settled })) {
            Some(Ok(())) => self.settling = Some((wait, last)),
            // Nobody to wait for.
            _ => self.settling = Some((closed(), last)),
        }
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
                    // The last frame, when the body knows it is (a Content-Length answer): held
                    // back, since the client has the whole answer once it is written.
                    if !this.inner.as_ref().is_none_or(http_body::Body::is_end_stream) {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.complete(Some(frame));
                }
                Some(Err(e)) => {
                    if let Some(end) = this.end.take() {
                        let _ = end.send(TeeEnd::Broken);
                    }
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.complete(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never ahead of the settle: an empty answer is polled, and waits for it too.
        self.done
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
        // Gone before the end: the exchange reads on, to settle with the whole answer.
        if let (Some(end), Some(rest)) = (self.end.take(), self.inner.take()) {
            let _ = end.send(TeeEnd::Left { captured: self.captured.take(), size: self.size, rest });
        }
    }
}

/// A duplicate's answer on its way to the client, compared with the answer stored for its
/// key; `differed` counts it once if it was not the same.
pub struct Compared {
    inner: Body,
    expected: Bytes,
    /// How much of `expected` matched so far; `None` once something differed.
    matched: Option<usize>,
    differed: Counter,
    judged: bool,
}

impl Compared {
    /// Compares `inner` with `expected`.
    pub fn new(inner: Body, expected: Bytes, differed: Counter) -> Self {
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
    use std::task::Waker;

    use http_body_util::BodyExt;

    use super::*;
    use crate::body;

    type Sent = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

    /// A body whose frames the test sends, one at a time.
    fn fed() -> (Sent, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        (tx, http_body_util::StreamBody::new(frames).boxed_unsync())
    }

    fn poll(body: &mut (impl http_body::Body<Data = Bytes, Error = BoxError> + Unpin)) -> Poll<Option<Bytes>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(body)
            .poll_frame(&mut cx)
            .map(|f| f.map(|f| f.ok().and_then(|f| f.into_data().ok()).unwrap_or_default()))
    }

    #[tokio::test]
    async fn the_last_bytes_of_an_answer_wait_for_the_settle() {
        let (mut tee, end) = Tee::new(body::full("abc"), 10);
        assert!(poll(&mut tee).is_pending(), "the only frame is the last: held back");
        let Ok(TeeEnd::Complete { body: Some(captured), settled }) = end.await else { panic!("not complete") };
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
        let (mut tee, end) = Tee::new(inner, 4);
        for piece in ["abc", "def"] {
            tx.send(Ok(Frame::data(Bytes::from(piece)))).await.unwrap();
            assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from(piece))));
        }
        drop(tx);
        assert!(poll(&mut tee).is_pending(), "the end waits for the settle");
        let Ok(TeeEnd::Complete { body: None, settled }) = end.await else { panic!("kept a body over the limit") };
        settled.send(()).unwrap();
        assert_eq!(poll(&mut tee), Poll::Ready(None));
    }

    #[tokio::test]
    async fn a_client_gone_mid_answer_leaves_the_rest_to_the_exchange() {
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::new(inner, 100);
        tx.send(Ok(Frame::data(Bytes::from("head")))).await.unwrap();
        assert_eq!(poll(&mut tee), Poll::Ready(Some(Bytes::from("head"))));
        drop(tee);
        let Ok(TeeEnd::Left { captured: Some(captured), size: 4, rest }) = end.await else { panic!("not left") };
        assert_eq!(captured, [Bytes::from("head")]);
        tx.send(Ok(Frame::data(Bytes::from("tail")))).await.unwrap();
        drop(tx);
        assert_eq!(rest.collect().await.unwrap().to_bytes(), "tail");
    }

    #[tokio::test]
    async fn a_broken_answer_is_told_as_broken() {
        let (tx, inner) = fed();
        let (mut tee, end) = Tee::new(inner, 100);
        tx.send(Err("reset".into())).await.unwrap();
        assert!(matches!(poll(&mut tee), Poll::Ready(Some(_))));
        assert!(matches!(end.await, Ok(TeeEnd::Broken)));
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
