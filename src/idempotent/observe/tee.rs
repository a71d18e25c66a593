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
