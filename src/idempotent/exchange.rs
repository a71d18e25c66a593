//! Exchange: the one upstream call of a claimed key, detached from the client.
//!
//! The exchange runs in its own task. If the client hangs up, the handler's future is dropped
//! but the exchange goes on, settles the key, and the client's retry is answered from the
//! store: this is the "request arrived, response lost" case the gateway exists for.
//!
//! Every way an exchange can end is classified, and the lease is consumed on every path:
//!
//! | how it ended | the key | the first client gets |
//! |---|---|---|
//! | not sent (connection refused, DNS, TLS handshake) | released, attempt given back | 502 `upstream-unavailable` |
//! | complete answer, status in `store_statuses` | completed: replayed to retries | the answer |
//! | complete answer, other status | released | the answer |
//! | answer too large to store, delivered | executed: retries get `response-not-stored` | the answer, streamed |
//! | sent, no complete answer (timeout, reset, truncated body) | `hold`: unknown, retries get 502 `outcome-unknown`; `release`: released | 502/504 `outcome-unknown` (`release`: the upstream error) |
//! | abandoned at the end of the shutdown grace period | as the row above | 503 `shutting-down` |
//!
//! Every forwarded request carries the attempt header (`Idempotency-Attempt: N`), so the
//! upstream can refuse or log a re-execution. While the call runs, the lease is renewed every
//! third of its duration; when settling finds it lost, the first response says so with
//! `Idempotency-Status: lease-lost`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, response};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::capture::{self, Captured, StreamEnd};
use super::policy::{IdempotencyPolicy, UnknownOutcomePolicy};
use crate::body::{self, Body};
use crate::error::GatewayError;
use crate::headers;
use crate::metrics::ReleaseReason;
use crate::route::Route;
use crate::store::{Backend, Final, Lease, Renewal, Sent, Settled, Store, StoreError, StoredResponse};
use crate::upstream::{Upstream, UpstreamError};

/// The header that tells the first client its claim was taken over while its request ran.
const STATUS_HEADER: &str = "idempotency-status";

/// A claimed request, ready to go upstream.
pub struct Exchange {
    /// The route, with its upstream and counters.
    pub route: Arc<Route>,
    /// The route's policy.
    pub policy: Arc<IdempotencyPolicy>,
    /// The store holding the claim.
    pub store: Arc<Backend>,
    /// The claim.
    pub lease: Lease,
    /// Whether the store confirmed the claim. `false` when the claim call failed and the route
    /// fails open: the claim may or may not exist (its reply was lost), so the exchange settles
    /// it if it does, but neither renews it nor counts a lost lease.
    pub confirmed: bool,
    /// The request, already prepared for the upstream, with its body read.
    pub request: Request<Bytes>,
    /// Fires when shutdown gives up waiting for exchanges.
    pub abandon: CancellationToken,
    /// The exchange's places under `max_exchanges` and its connection's limit, held until it
    /// ends (after its client, if the client goes away first).
    pub slots: Option<ExchangeSlots>,
    /// The gauge of exchanges running now.
    pub running: Gauge,
}

/// An exchange's places under the global and the per-connection limits.
#[derive(Debug)]
pub struct ExchangeSlots {
    /// Under `server.max_exchanges`.
    pub _global: tokio::sync::OwnedSemaphorePermit,
    /// Under `server.max_exchanges_per_connection`.
    pub _connection: crate::connection::ConnectionSlot,
}

/// How the call to the upstream ended.
enum Ended {
    /// The whole response, within `max_stored_body`.
    Whole(response::Parts, Bytes),
    /// A response too large to store, streaming to the client.
    Streamed(response::Parts, Body, oneshot::Receiver<StreamEnd>),
    /// The request never reached the upstream.
    NotSent(UpstreamError),
    /// The request was sent and no complete answer came back.
    NoAnswer(UpstreamError),
    /// Shutdown gave up on the exchange.
    Abandoned,
}

type Answer = Result<Response<Body>, GatewayError>;

/// Where an exchange's time went, for the access log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    /// Sending the request and reading the answer.
    pub upstream: Duration,
    /// Settling or releasing the key before the answer went out.
    pub store: Duration,
}

impl Exchange {
    /// Runs the exchange in its own task and waits for its response. Dropping the returned
    /// future (the client went away) does not stop the exchange.
    pub async fn spawn(self, tracker: &TaskTracker) -> (Answer, Report) {
        let (tx, rx) = oneshot::channel();
        // The exchange's state machine is several KiB; boxed once here, it is not copied again
        // on its way into the task.
        tracker.spawn(Box::pin(self.run(tx)));
        rx.await.unwrap_or_else(|_| {
            (Err(GatewayError::Internal("the exchange ended without an answer".into())), Report::default())
        })
    }

    async fn run(self, answer: oneshot::Sender<(Answer, Report)>) {
        let Self { route, policy, store, lease, confirmed, mut request, abandon, slots: _slots, running } = self;
        running.inc();
        let _running = scopeguard(move || {
            running.dec();
        });
        // The attempt is the gateway's word; whatever a client sent under that name is gone
        // (the handler removed it), and an unconfirmed claim has no attempt number to give.
        if let Some(name) = policy.attempt_header.as_ref().filter(|_| confirmed) {
            request.headers_mut().insert(name.clone(), HeaderValue::from(lease.attempt()));
        }
        let settle = Settle { route: &route, policy: &policy, store: &store, confirmed };
        let work = std::pin::pin!(async {
            tokio::select! {
                ended = call(&route.upstream, request, policy.max_stored_body) => ended,
                () = abandon.cancelled() => Ended::Abandoned,
            }
        });
        let started = Instant::now();
        let ended = settle.renewing(&lease, work).await;
        let upstream_done = Instant::now();
        let upstream_time = upstream_done - started;
        route.metrics.upstream_latency(ended.class(), upstream_time);
        let report = || Report { upstream: upstream_time, store: upstream_done.elapsed() };

        let reply = match ended {
            Ended::Whole(parts, body) if policy.store_statuses.contains(parts.status) => {
                let stored = StoredResponse {
                    status: parts.status,
                    headers: headers::storable(&parts.headers, &policy.stored_headers),
                    body: body.clone(),
                };
                // Settled before the client hears the answer, so that its retry finds it. If the
                // store fails, the client is answered anyway and settling goes on behind it:
                // until then the key is in progress, and retries wait for it.
                let settled = settle.store.settle(&lease, Final::Response(&stored), policy.retention).await;
                if let Err(e) = settled {
                    tracing::debug!(route = %route.name, error = %e, "settle failed; answering first, then retrying");
                    let _ = answer.send((Ok(first_response(parts, body::full(body), false)), report()));
                    settle.finish(lease, Final::Response(&stored), 1).await;
                    return;
                }
                let lost = settle.logged("settle", settled);
                Ok(first_response(parts, body::full(body), lost))
            }
            Ended::Whole(parts, body) => {
                settle.release(lease, Sent::Maybe, ReleaseReason::Status).await;
                Ok(first_response(parts, body::full(body), false))
            }
            Ended::Streamed(parts, body, end) if policy.store_statuses.contains(parts.status) => {
                let head = StoredResponse {
                    status: parts.status,
                    headers: headers::storable(&parts.headers, &policy.stored_headers),
                    body: Bytes::new(),
                };
                // The client gets the stream now; the key is settled once it has ended.
                let _ = answer.send((Ok(first_response(parts, body, false)), report()));
                // Shutdown does not wait for a slow reader: past the grace period the stream
                // counts as delivered (the upstream answered; the request ran).
                let ended = std::pin::pin!(async {
                    tokio::select! {
                        end = end => end.unwrap_or(StreamEnd::ClientGone),
                        () = abandon.cancelled() => StreamEnd::ClientGone,
                    }
                });
                let end = settle.renewing(&lease, ended).await;
                match end {
                    StreamEnd::Complete | StreamEnd::ClientGone => {
                        route.metrics.not_stored();
                        settle.finish(lease, Final::Executed(&head), 0).await;
                    }
                    StreamEnd::Broken => {
                        settle.unknown(lease).await;
                    }
                }
                return;
            }
            Ended::Streamed(parts, body, _) => {
                settle.release(lease, Sent::Maybe, ReleaseReason::Status).await;
                Ok(first_response(parts, body, false))
            }
            Ended::NotSent(e) => {
                settle.release(lease, Sent::No, ReleaseReason::NotSent).await;
                Err(e.into())
            }
            Ended::NoAnswer(e) => {
                let timed_out = matches!(e, UpstreamError::Timeout { .. });
                match settle.unknown(lease).await {
                    UnknownOutcomePolicy::Hold => Err(GatewayError::OutcomeUnknown { timed_out }),
                    UnknownOutcomePolicy::Release => Err(e.into()),
                }
            }
            Ended::Abandoned => {
                settle.unknown(lease).await;
                Err(GatewayError::ShuttingDown)
            }
        };
        let _ = answer.send((reply, report()));
    }
}

impl Ended {
    /// The status class for the upstream latency histogram.
    fn class(&self) -> &'static str {
        match self {
            Self::Whole(parts, _) | Self::Streamed(parts, _, _) => status_class(parts.status),
            Self::NotSent(_) | Self::NoAnswer(_) => "error",
            Self::Abandoned => "abandoned",
        }
    }
}

/// Runs `f` when dropped: the exchange's gauge goes down on every path out of `run`.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// `"2xx"` … `"5xx"` for a status.
pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// Sends the request and reads the answer, all within the upstream's timeout: one deadline
/// for the whole exchange.
async fn call(upstream: &Upstream, request: Request<Bytes>, limit: usize) -> Ended {
    let deadline = Instant::now() + upstream.timeout();
    let response = match tokio::time::timeout_at(deadline, upstream.send(request.map(body::full))).await {
        Err(_) => return Ended::NoAnswer(upstream.timed_out()),
        Ok(Err(e)) if e.sent() == Sent::No => return Ended::NotSent(e),
        Ok(Err(e)) => return Ended::NoAnswer(e),
        Ok(Ok(mut response)) => {
            // Once, for what is stored and what the client gets alike.
            headers::strip_hop_by_hop(response.headers_mut());
            response
        }
    };
    match tokio::time::timeout_at(deadline, capture::capture(response, limit)).await {
        Err(_) => Ended::NoAnswer(upstream.timed_out()),
        Ok(Err(e)) => Ended::NoAnswer(upstream.body_failed(&e)),
        Ok(Ok(Captured::Whole(parts, body))) => Ended::Whole(parts, body),
        Ok(Ok(Captured::TooLarge(parts, body, end))) => Ended::Streamed(parts, body, end),
    }
}

/// Settling a lease: the store calls, their logs and counters.
struct Settle<'a> {
    route: &'a Route,
    policy: &'a IdempotencyPolicy,
    store: &'a Backend,
    confirmed: bool,
}

impl Settle<'_> {
    /// Runs `work` while renewing `lease` every third of its duration. A renewal runs between
    /// polls of `work` (a short pause of the exchange; the upstream's bytes wait in the
    /// socket). Once the lease is found lost, renewal stops; the exchange still finishes, and
    /// settling will find the lease lost too.
    async fn renewing<T>(&self, lease: &Lease, mut work: Pin<&mut impl Future<Output = T>>) -> T {
        // An unconfirmed claim (the claim call's reply was lost, fail-open) is renewed too: if
        // it was made, it must not pass while the forwarded request runs, or a retry would
        // take it over and run the request again. Renewal names the owner, so a claim that
        // was never made is found `Lost` at the first tick and left alone.
        if !self.policy.renew {
            return work.await;
        }
        let (route, store) = (self.route, self.store);
        let period = lease.duration() / 3;
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewing = true;
        loop {
            tokio::select! {
                out = &mut work => return out,
                // Boxed: renewals are rare, and the store call would otherwise swell every
                // exchange's state by its size.
                _ = ticks.tick(), if renewing => match Box::pin(store.renew(lease)).await {
                    Ok(Renewal::Renewed) => {}
                    Ok(Renewal::Lost) if !self.confirmed => renewing = false,
                    Ok(Renewal::Lost) => {
                        renewing = false;
                        route.metrics.lease_lost();
                        tracing::warn!(route = %route.name, key = lease.key().short(), "lease lost while the upstream call ran; the upstream's own constraint must catch a duplicate");
                    }
                    Err(e) => {
                        route.metrics.store_error();
                        tracing::warn!(route = %route.name, key = lease.key().short(), error = %e, "lease renewal failed; retrying");
                    }
                },
            }
        }
    }

    /// Settles the claim with its outcome, after `failed` tries the caller already made; true
    /// when the lease turned out to be lost.
    async fn finish(&self, lease: Lease, outcome: Final<'_>, failed: u32) -> bool {
        let result = persist(failed, || self.store.settle(&lease, outcome, self.policy.retention)).await;
        self.logged("settle", result)
    }

    /// The request was sent without a complete answer: hold the key as unknown, or release
    /// it, as the route says. Returns what was done.
    async fn unknown(&self, lease: Lease) -> UnknownOutcomePolicy {
        match self.policy.on_unknown_outcome {
            UnknownOutcomePolicy::Hold => {
                self.route.metrics.outcome_unknown();
                self.finish(lease, Final::Unknown, 0).await;
            }
            UnknownOutcomePolicy::Release => self.release(lease, Sent::Maybe, ReleaseReason::Unknown).await,
        }
        self.policy.on_unknown_outcome
    }

    async fn release(&self, lease: Lease, sent: Sent, reason: ReleaseReason) {
        self.route.metrics.released(reason);
        let (key, owner, ttl) = lease.into_release();
        let result = persist(0, || self.store.release(&key, owner, sent, ttl)).await;
        self.logged("release", result);
    }

    /// Logs and counts the end of a claim that did not go as planned; true when the lease was
    /// lost. The client is answered either way: the upstream's answer must not be lost
    /// because the store hiccuped.
    fn logged(&self, action: &str, result: Result<Settled, StoreError>) -> bool {
        let route = self.route;
        match result {
            Ok(Settled::Done) => false,
            // Without a confirmed claim there was nothing to lose.
            Ok(Settled::Lost) if !self.confirmed => false,
            Ok(Settled::Lost) => {
                route.metrics.lease_lost();
                tracing::warn!(route = %route.name, action, "claim was taken over before it settled; the upstream's own constraint must catch a duplicate");
                true
            }
            Err(e) => {
                route.metrics.store_write_failed();
                tracing::warn!(route = %route.name, action, error = %e, "store failed after the upstream answered; the key stays claimed until its lease passes");
                false
            }
        }
    }
}

/// How often a settle or release that failed is tried, and the first pause between tries. A
/// store blip after the upstream answered must not leave the key claimed until its lease
/// passes: a retry after that would run the request again.
const SETTLE_TRIES: u32 = 4;
const SETTLE_BACKOFF: Duration = Duration::from_millis(100);

/// Runs a store call, repeating it (with a doubling pause) while it fails, up to
/// `SETTLE_TRIES` tries in all counting the `failed` ones the caller already made. A try that
/// failed may have been applied all the same (its reply was lost), so `Lost` after a failed
/// try means "settled by that try, or taken over": it is reported as `Done`, not as a
/// takeover.
async fn persist<F, Fut>(mut failed: u32, mut call: F) -> Result<Settled, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Settled, StoreError>>,
{
    let mut pause = SETTLE_BACKOFF;
    loop {
        match call().await {
            Err(_) if failed + 1 < SETTLE_TRIES => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                failed += 1;
            }
            Ok(Settled::Lost) if failed > 0 => return Ok(Settled::Done),
            result => return result,
        }
    }
}

/// The upstream's answer as the first client gets it (hop-by-hop headers were stripped as
/// it arrived, in `call`).
fn first_response(mut parts: response::Parts, body: Body, lease_lost: bool) -> Response<Body> {
    // The client's protocol version, not the upstream's (see `proxy::relay`).
    parts.version = http::Version::HTTP_11;
    if lease_lost {
        parts.headers.insert(STATUS_HEADER, HeaderValue::from_static("lease-lost"));
    }
    Response::from_parts(parts, body)
}
