//! Exchange: the one upstream call of a claimed key, in a task of its own that outlives the
//! client, for both modes.
//!
//! If the client hangs up, the session's future is dropped but the exchange goes on, settles
//! the key, and the client's retry is answered from the store: this is the "request arrived,
//! response lost" case the gateway exists for.
//!
//! The call ([`call`]) is the mode's: enforcing reads the whole answer within the upstream's
//! timeout (up to `max_stored_body`, else streams it), and tells the upstream its attempt
//! (`Idempotency-Attempt: N`) so that it can refuse or log a re-execution; observing sends
//! the request as a plain route would and streams every answer back as it comes. Then every
//! way the call can end is decided in `outcome` (what becomes of the key, what the client
//! gets), and done here in that order of effects; the claim is ended on every path, once.
//!
//! While the call runs, the lease is renewed every third of its duration (see `settle`); when
//! settling finds it lost, the first answer says so with `Idempotency-Status: lease-lost`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::capture::{self, Captured, StreamEnd, Tee};
use super::context::{Claimed, Ctx, Session, Slots};
use super::outcome::{self, Ended, Plan, Settle, Then};
use super::reply::{self, Served};
use super::settle::Keeper;
use super::trail::Trail;
use crate::body::{self, Body, Payload};
use crate::error::{GatewayError, Settling};
use crate::headers;
use crate::metrics::{GaugeHold, Outcome, ReleaseReason, Would};
use crate::policy::{Mode, UnknownOutcomePolicy};
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Final, Lifecycle, Records, Sent, State, StoredResponse};
use crate::telemetry::{ChildSpan, RequestSpan};
use crate::upstream::Upstream;

/// What the first client gets.
type Reply = Result<Response<Body>, GatewayError>;

/// Sends an admitted request upstream in an exchange of its own, and waits for the first
/// client's answer. Dropping the returned future (the client went away) does not stop the
/// exchange.
pub async fn forward(s: &mut Session<'_>, ctx: Ctx) -> Result<Served, GatewayError> {
    let (rt, route, peer, notes) = (s.rt, s.route, &s.connection.peer, &mut *s.notes);
    // The last phase: what the exchange needs of the request moves into it.
    let Ctx { mut parts, body, claimant, claimed, slots } = ctx;
    let Some(claimed) = claimed else {
        return Err(GatewayError::Internal("an exchange without a claim".into()));
    };
    let outcome = match (route.policy.mode, &claimed) {
        (Mode::Observe, _) => Outcome::Observed,
        (Mode::Enforce, Claimed::Confirmed(_)) => Outcome::Executed,
        (Mode::Enforce, Claimed::Unconfirmed(_)) => Outcome::Bypassed,
    };
    // An unconfirmed claim (the store failed) may have no record at all: nothing to index.
    let trail = match &claimed {
        Claimed::Confirmed(_) => Trail::of(route, &parts, claimant, peer),
        Claimed::Unconfirmed(_) => None,
    };
    route.upstream.prepare(&mut parts, peer);
    notes.attempt = claimed.attempt();
    let exchange = Exchange {
        rt: Arc::clone(rt),
        route: Arc::clone(route),
        claimed: Keeping(claimed),
        _slots: slots,
        request: Request::from_parts(parts, body),
        trail,
        span: notes.span.clone(),
    };
    let (tx, rx) = oneshot::channel();
    // The exchange's state machine is several KiB; boxed once here, it is not copied again on
    // its way into the task.
    rt.exchanges.spawn(Box::pin(exchange.run(tx)));
    let (reply, report) = rx.await.unwrap_or_else(|_| {
        (Err(GatewayError::Internal("the exchange ended without an answer".into())), Report::default())
    });
    notes.upstream = Some(report.upstream);
    notes.store += report.store;
    let mut response = reply?;
    if outcome == Outcome::Bypassed {
        response.headers_mut().insert(reply::STATUS_HEADER, HeaderValue::from_static("bypassed"));
    }
    Ok(Served::Answered(outcome, response))
}

/// The claim an exchange keeps, until its keeper takes it.
struct Keeping(Claimed);

/// A claimed request on its way upstream, in a task of its own.
struct Exchange {
    rt: Arc<Runtime>,
    route: Arc<IdempotentRoute>,
    claimed: Keeping,
    /// Its places under the limits, held until the exchange ends (after its client, if the
    /// client goes first).
    _slots: Option<Slots>,
    /// The request, prepared for the upstream, with its body read.
    request: Request<Bytes>,
    /// What the key's record may need after the exchange (enforcing only).
    trail: Option<Trail>,
    /// The request's span, when it is traced: the exchange adds `upstream` and `settle`.
    span: Option<RequestSpan>,
}

/// Where an exchange's time went, for the access log.
#[derive(Debug, Clone, Copy, Default)]
struct Report {
    /// Sending the request and reading the answer (observing: its head).
    upstream: Duration,
    /// Writing to the key before the answer went out.
    store: Duration,
}

impl Exchange {
    /// The exchange's future. Not an `async fn`: one would keep `self` beside the fields taken
    /// out of it, for the whole exchange.
    fn run(self, client: oneshot::Sender<(Reply, Report)>) -> impl Future<Output = ()> + Send + 'static {
        let Self { rt, route, claimed: Keeping(claimed), _slots, mut request, trail, span } = self;
        async move {
            // Named, so that the future takes the slots and holds them until it ends (an
            // unnamed field would be dropped here, freeing the places while the call runs).
            let _slots = _slots;
            let (policy, abandon, mode) = (&*route.policy, &rt.abandon, route.policy.mode);
            let _running = GaugeHold::new(&rt.metrics.exchanges_running);
            // The attempt is the gateway's word; whatever a client sent under that name is gone
            // (identify removed it), and an unconfirmed claim has no attempt number to give. An
            // observing route forwards the request as a plain route would.
            if let (Mode::Enforce, Some(name), Some(attempt)) =
                (mode, policy.attempt_header.as_ref(), claimed.attempt())
            {
                request.headers_mut().insert(name.clone(), HeaderValue::from(attempt));
            }
            // The upstream gets this span as its parent (`traceparent`).
            let upstream_span = span.as_ref().map(|s| s.upstream(request.headers_mut()));
            let keeper = Keeper::new(&route, rt.lifecycle(), rt.records(), claimed);
            let started = Instant::now();
            // In a block of its own: the call's state is gone once it has ended, and its place in
            // this future is free for what settles.
            let ended = {
                let work = std::pin::pin!(async {
                    tokio::select! {
                        ended = call(mode, &route.upstream, request, policy.max_stored_body) => ended,
                        () = abandon.cancelled() => Ended::Abandoned,
                    }
                });
                keeper.renewing(work).await
            };
            let upstream_done = Instant::now();
            if let Some(upstream_span) = upstream_span {
                ended.trace(upstream_span);
            }
            let settle_span = span.as_ref().map(|s| s.child("settle"));
            let upstream = upstream_done - started;
            route.metrics.upstream_latency(ended.class(), upstream);
            // Answers the client, once: what it waited for the store is store time.
            let mut client = Some(client);
            let mut answer = |reply: Reply| {
                if let Some(client) = client.take() {
                    let _ = client.send((reply, Report { upstream, store: upstream_done.elapsed() }));
                }
            };
            // What the client waits for a store write, at most, before it is answered: enforcing,
            // the write (so that its retry finds it); observing, as a plain route makes it wait
            // for none, a store call's time (a store that is down must not hold answers for a
            // whole lease).
            let cap = (mode == Mode::Observe).then(|| rt.store_call_timeout().max(Duration::from_secs(1)));
            let held = match outcome::plan(mode, ended, &policy.store_statuses) {
                Plan::Keep(parts, body) => {
                    let stored = StoredResponse {
                        status: parts.status,
                        headers: headers::storable(&parts.headers, &policy.stored_headers),
                        body: body.clone(),
                    };
                    // Settled before the client hears the answer, so that its retry finds it. If the
                    // store fails, the client is answered anyway and settling goes on behind it:
                    // until then the key is in progress, and retries wait for it.
                    match keeper.first_try(Final::Response(&stored)).await {
                        Ok(settled) => {
                            let lost = keeper.logged("settle", Ok(settled)).await;
                            answer(Ok(reply::first(parts, body::payload(body), lost)));
                        }
                        Err(e) => {
                            tracing::debug!(route = %route.name, error = %e, "settle failed; answering first, then retrying");
                            answer(Ok(reply::first(parts, body::payload(body), false)));
                            keeper.finish(Final::Response(&stored), 1).await;
                        }
                    }
                    None
                }
                Plan::Stream(parts, tee, end, stored) => {
                    let head = StoredResponse {
                        status: parts.status,
                        headers: headers::storable(&parts.headers, &policy.stored_headers),
                        body: Payload::default(),
                    };
                    // The client gets the stream now; the key is settled once it has ended.
                    // (Its settle span covers the stream, which the settle waits for.)
                    answer(Ok(reply::first(parts, body::boxed(tee), false)));
                    let end =
                        stream_end(&keeper, mode, end, abandon, policy.max_stored_body, route.upstream.timeout()).await;
                    // Boxed: streamed answers are the rare ones, and this is the largest branch.
                    Box::pin(settle_streamed(&route, keeper, mode, end, stored, head, cap)).await
                }
                Plan::Release { sent, reason, then } => {
                    if mode == Mode::Observe && reason == ReleaseReason::Unknown {
                        route.metrics.observed(Would::UnknownOutcome);
                    }
                    let reply = match then {
                        Then::Whole(parts, body) => Ok(reply::first(parts, body::payload(body), false)),
                        Then::Streamed(parts, body) => Ok(reply::first(parts, body, false)),
                        Then::Failed(e) => Err(e),
                    };
                    within(cap, keeper.release(sent, reason), || answer(reply)).await;
                    None
                }
                Plan::Unknown { trusted_at_once, unanswered } => {
                    // When a lookup's "not found" can be trusted (see `reconcile`): at once if the
                    // upstream closed the connection itself; else not before it would have given up
                    // on the request.
                    let trusted_in = if trusted_at_once {
                        Duration::ZERO
                    } else {
                        let release_after = policy.reconcile.as_ref().map_or(Duration::ZERO, |r| r.release_after);
                        (started + route.upstream.timeout() + release_after).saturating_duration_since(Instant::now())
                    };
                    let done = keeper.unknown(trusted_in).await;
                    answer(Err(outcome::refusal(unanswered, done, settling(&route))));
                    held_by(done)
                }
            };
            end_span(settle_span);
            if let Some(trail) = trail {
                trail.record(&rt, &route, held);
            }
        }
    }
}

/// How a streamed answer ended, waited for while the lease is renewed. Shutdown does not wait
/// for a slow reader: past the grace period the stream counts as delivered (the upstream
/// answered; the request ran), as does a stream whose tee is gone without a word. A client
/// that left an observing route's answer early is read on (within the upstream's timeout), to
/// settle with the whole answer.
async fn stream_end(
    keeper: &Keeper<'_, impl Lifecycle, impl Records>,
    mode: Mode,
    end: oneshot::Receiver<StreamEnd>,
    abandon: &tokio_util::sync::CancellationToken,
    limit: usize,
    deadline: Duration,
) -> StreamEnd {
    let ended = std::pin::pin!(async {
        tokio::select! {
            end = end => end.ok(),
            () = abandon.cancelled() => None,
        }
    });
    match keeper.renewing(ended).await {
        Some(StreamEnd::Left { captured, size, rest }) if mode == Mode::Observe => {
            keeper.renewing(std::pin::pin!(read_on(captured, size, rest, limit, deadline))).await
        }
        Some(end) => end,
        None => StreamEnd::Complete { body: None, settled: None },
    }
}

/// Settles the key of a streamed answer once the stream has ended, as `outcome::after_stream`
/// says; the stream's last bytes, held back by an observing route's tee, go once the write is
/// done (or after `cap`). The state the key is left in when it needs an operator.
async fn settle_streamed(
    route: &IdempotentRoute,
    keeper: Keeper<'_, impl Lifecycle, impl Records>,
    mode: Mode,
    end: StreamEnd,
    stored: bool,
    head: StoredResponse,
    cap: Option<Duration>,
) -> Option<State> {
    let settle = outcome::after_stream(mode, &end, stored);
    let hold = match end {
        StreamEnd::Complete { settled, .. } => settled,
        _ => None,
    };
    let (stored, executed) = match settle {
        Settle::Keep(body) => (StoredResponse { body, ..head }, false),
        Settle::Executed => {
            // Too large to keep: executed, retries get `response-not-stored`.
            route.metrics.not_stored();
            (head, true)
        }
        Settle::Release(reason) => {
            if reason == ReleaseReason::Unknown {
                route.metrics.observed(Would::UnknownOutcome);
            }
            within(cap, keeper.release(Sent::Maybe, reason), || drop(hold)).await;
            return None;
        }
        Settle::Unknown => return held_by(keeper.unknown(Duration::ZERO).await),
    };
    let outcome = || if executed { Final::Executed(&stored) } else { Final::Response(&stored) };
    match within(cap, keeper.first_try(outcome()), || drop(hold)).await {
        Ok(done) => {
            keeper.logged("settle", Ok(done)).await;
        }
        Err(e) => {
            tracing::debug!(route = %route.name, error = %e, "settle failed; trying again behind the answer");
            keeper.finish(outcome(), 1).await;
        }
    }
    executed.then_some(State::Executed)
}

/// Sends the request and reads the answer, as the mode reads it. Enforcing: the whole answer
/// within the upstream's timeout, one deadline for the whole exchange (a request no instance
/// was sent may go to another, within it). Observing: as a plain route sends it, the timeout
/// covering the answer's head, the answer streamed back through a capturing tee.
async fn call(mode: Mode, upstream: &Upstream, request: Request<Bytes>, limit: usize) -> Ended {
    let deadline = Instant::now() + upstream.timeout();
    let sent = match mode {
        Mode::Enforce => upstream.send_buffered(request, deadline).await,
        Mode::Observe => upstream.send(request.map(body::full), deadline).await,
    };
    let mut response = match sent {
        Err(e) if e.never_sent() => return Ended::NotSent(e),
        Err(e) => return Ended::NoAnswer(e),
        Ok(response) => response,
    };
    // Once, for what is stored and what the client gets alike.
    headers::strip_hop_by_hop(response.headers_mut());
    if mode == Mode::Observe {
        let (parts, incoming) = crate::proxy::relay(response).into_parts();
        let (tee, end) = Tee::capturing(incoming, limit);
        return Ended::Streamed(parts, tee, end);
    }
    match tokio::time::timeout_at(deadline, capture::capture(response, limit)).await {
        Err(_) => Ended::NoAnswer(upstream.timed_out()),
        Ok(Err(e)) => Ended::NoAnswer(upstream.body_failed(&e)),
        Ok(Ok(Captured::Whole(parts, body))) => Ended::Whole(parts, body),
        Ok(Ok(Captured::TooLarge(parts, tee, end))) => Ended::Streamed(parts, tee, end),
    }
}

/// Reads the rest of an answer whose client went away, to settle with it: on from what was
/// `captured` (`None`: it outgrew `limit` already), within `deadline`.
async fn read_on(
    captured: Option<Vec<Bytes>>,
    size: usize,
    mut rest: Body,
    limit: usize,
    deadline: Duration,
) -> StreamEnd {
    let complete = |body| StreamEnd::Complete { body, settled: None };
    let Some(mut pieces) = captured else { return complete(None) };
    let mut size = size;
    let read = async {
        while let Some(frame) = rest.frame().await {
            let Ok(data) = frame?.into_data() else { continue };
            size += data.len();
            if size > limit {
                return Ok::<_, crate::body::BoxError>(None);
            }
            pieces.push(data);
        }
        Ok(Some(Payload::from_pieces(std::mem::take(&mut pieces))))
    };
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(body)) => complete(body),
        Ok(Err(_)) | Err(_) => StreamEnd::Broken,
    }
}

/// Runs `write`, and `then` (which answers the client) once it is done, or after `cap` when
/// there is one, whichever comes first: the write is made before the client hears (so that
/// its retry finds it), and with a cap a slow store delays the answer by at most that much.
///
/// A future written out rather than an `async fn`: one would hold `write` twice (the argument
/// and the copy it awaits), and every future above it, the exchange's included, is copied
/// whole as it is made.
fn within<T, W: Future<Output = T>, F: FnOnce()>(cap: Option<Duration>, write: W, then: F) -> Within<W, F> {
    Within { write, cap: cap.map(tokio::time::sleep), then: Some(then) }
}

pin_project_lite::pin_project! {
    /// See [`within`].
    struct Within<W, F> {
        #[pin]
        write: W,
        #[pin]
        cap: Option<tokio::time::Sleep>,
        then: Option<F>,
    }
}

impl<W: Future, F: FnOnce()> Future for Within<W, F> {
    type Output = W::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<W::Output> {
        let mut this = self.project();
        if let std::task::Poll::Ready(out) = this.write.poll(cx) {
            if let Some(then) = this.then.take() {
                then();
            }
            return std::task::Poll::Ready(out);
        }
        let capped = this.cap.as_mut().as_pin_mut().is_some_and(|cap| cap.poll(cx).is_ready());
        if capped {
            this.cap.set(None);
            if let Some(then) = this.then.take() {
                then();
            }
        }
        std::task::Poll::Pending
    }
}

/// How the key of an exchange that lost its answer gets settled. On a route that reconciles,
/// the client's retry with the same key is what gets the answer: say when (the lookup the
/// gateway makes by itself, or at once with `after = "off"`, where the retry asks).
fn settling(route: &IdempotentRoute) -> Settling {
    let after = route.policy.reconcile.as_ref().map(|r| r.after.unwrap_or(Duration::from_secs(1)));
    Settling::of(after.is_some(), after)
}

/// The state an unknown outcome leaves its key in: held as unknown, or released (nothing to
/// attend to).
fn held_by(policy: UnknownOutcomePolicy) -> Option<State> {
    match policy {
        UnknownOutcomePolicy::Hold => Some(State::Unknown),
        UnknownOutcomePolicy::Release => None,
    }
}

fn end_span(span: Option<ChildSpan>) {
    if let Some(span) = span {
        span.end(None);
    }
}
