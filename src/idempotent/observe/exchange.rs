//! The claimant's exchange on a route in observe mode: forwarded as a pass-through route
//! forwards it, in a task of its own that outlives the client, and settled as enforcement
//! would settle it, so that a retry after a switch to enforce replays this answer instead of
//! running the request again.
//!
//! | how it ended | the key | the client gets |
//! |---|---|---|
//! | not sent (no connection, or none yet when the timeout passed) | released, attempt given back | the pass-through route's error |
//! | sent, no answer head (timeout, reset) | released (`unknown_outcome`) | the pass-through route's error |
//! | whole answer within `max_stored_body`, status in `store_statuses` | completed | the answer, streamed; its end waits for the settle |
//! | larger answer, status in `store_statuses` | executed (`response-not-stored`) | the answer, streamed |
//! | other status | released | the answer, streamed |
//! | the upstream broke the answer off | released (`unknown_outcome`) | what came of it |
//! | the client left mid-answer | read on (within the upstream's timeout), then as above | nothing more |

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::tee::{Tee, TeeEnd};
use crate::body::{self, Body, Payload};
use crate::error::GatewayError;
use crate::headers;
use crate::idempotent::context::{Claimed, Handler};
use crate::idempotent::settle::Keeper;
use crate::metrics::{GaugeHold, ReleaseReason, Would, status_class};
use crate::proxy;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Final, Sent, StoredResponse};
use crate::telemetry::ChildSpan;

type Answer = Result<Response<Body>, GatewayError>;

/// Sends the claimant's request upstream in an exchange of its own and waits for the answer's
/// head. Dropping the returned future (the client went away) does not stop the exchange.
pub async fn forward(h: &mut Handler<'_>, claimed: Claimed, mut parts: Parts, body: Bytes) -> Answer {
    let (rt, route, notes) = (h.rt, h.route, &mut *h.notes);
    route.upstream.prepare(&mut parts, &h.connection.peer);
    let mut request = Request::from_parts(parts, body::full(body));
    // The upstream gets this span as its parent (`traceparent`).
    let span = notes.span.as_ref().map(|s| s.upstream(request.headers_mut()));
    notes.attempt = claimed.attempt();
    let exchange = Exchange { rt: Arc::clone(rt), route: Arc::clone(route), claimed, request, span };
    let (tx, rx) = oneshot::channel();
    let started = Instant::now();
    rt.exchanges.spawn(Box::pin(exchange.run(tx)));
    let answer =
        rx.await.unwrap_or_else(|_| Err(GatewayError::Internal("the exchange ended without an answer".into())));
    notes.upstream = Some(started.elapsed());
    answer
}

struct Exchange {
    rt: Arc<Runtime>,
    route: Arc<IdempotentRoute>,
    claimed: Claimed,
    request: Request<Body>,
    span: Option<ChildSpan>,
}

/// How the answer's body ended, once the exchange knows.
enum Ending {
    /// Whole; its body when it fit in `max_stored_body`.
    Complete(Option<Payload>),
    /// Broken off, or not read to the end in time.
    Broken,
}

impl Exchange {
    async fn run(self, client: oneshot::Sender<Answer>) {
        let Self { rt, route, claimed, request, span } = self;
        let (policy, abandon, upstream) = (&*route.policy, &rt.abandon, &route.upstream);
        let _running = GaugeHold::new(&rt.metrics.exchanges_running);
        let keeper = Keeper::new(&route, &rt.store, &claimed);
        let lease = claimed.into_lease();
        // What the client waits for a store write, at most: a pass-through route makes it wait
        // for none, and a store that is down must not hold answers for a whole lease.
        let cap = rt.store.call_timeout().max(Duration::from_secs(1));
        // As on a pass-through route, the upstream's timeout covers the answer's head; a
        // request still waiting for a connection when it passes was never sent.
        let deadline = Instant::now() + upstream.timeout();
        let call = std::pin::pin!(async {
            tokio::select! {
                sent = upstream.send(request, deadline) => Some(sent),
                () = abandon.cancelled() => None,
            }
        });
        let started = Instant::now();
        let head = keeper.renewing(&lease, call).await;
        let took = started.elapsed();
        let response = match head {
            Some(Ok(response)) => response,
            Some(Err(e)) if e.never_sent() => {
                end_span(span, Err(e.to_string()), &route, took);
                let release = keeper.release(lease, Sent::No, ReleaseReason::NotSent);
                within(cap, release, || {
                    let _ = client.send(Err(e.into()));
                })
                .await;
                return;
            }
            failed => {
                let failed = match failed {
                    Some(Err(e)) => Err(e),
                    _ => Ok(()),
                };
                // Sent, and no answer: released, so that enforcing never starts with keys held
                // from observing (a retry runs it again, as it would through a plain route).
                route.metrics.observed(Would::UnknownOutcome);
                let answer = match failed {
                    Err(e) => {
                        end_span(span, Err(e.to_string()), &route, took);
                        Err(e.into())
                    }
                    Ok(()) => {
                        end_span(span, Err("abandoned at shutdown".into()), &route, took);
                        Err(GatewayError::ShuttingDown { held: None })
                    }
                };
                let release = keeper.release(lease, Sent::Maybe, ReleaseReason::Unknown);
                within(cap, release, || {
                    let _ = client.send(answer);
                })
                .await;
                return;
            }
        };
        end_span(span, Ok(response.status()), &route, took);
        let response = proxy::relay(response);
        let status = response.status();
        let head = StoredResponse {
            status,
            headers: headers::storable(response.headers(), &policy.stored_headers),
            body: Payload::default(),
        };
        let (parts, incoming) = response.into_parts();
        let (tee, end) = Tee::new(incoming, policy.max_stored_body);
        let _ = client.send(Ok(Response::from_parts(parts, body::boxed(tee))));

        // The answer streams; the key is settled once it has ended (renewed meanwhile).
        let ended = std::pin::pin!(async {
            tokio::select! {
                end = end => end.ok(),
                () = abandon.cancelled() => None,
            }
        });
        let (ending, settled) = match keeper.renewing(&lease, ended).await {
            Some(TeeEnd::Complete { body, settled }) => (Ending::Complete(body), Some(settled)),
            Some(TeeEnd::Broken) => (Ending::Broken, None),
            Some(TeeEnd::Left { captured, size, rest }) => {
                let read = read_on(captured, size, rest, policy.max_stored_body, upstream.timeout());
                (keeper.renewing(&lease, std::pin::pin!(read)).await, None)
            }
            // Shutdown does not wait for a slow reader: the upstream answered, the request ran.
            None => (Ending::Complete(None), None),
        };
        // The last of the answer waits for the settle's first try, at most `cap`.
        match ending {
            Ending::Complete(body) if policy.store_statuses.contains(status) => {
                // Too large to keep: executed, as enforcement records it (`response-not-stored`).
                let (stored, executed) = match body {
                    Some(body) => (StoredResponse { body, ..head }, false),
                    None => {
                        route.metrics.not_stored();
                        (head, true)
                    }
                };
                let outcome = || if executed { Final::Executed(&stored) } else { Final::Response(&stored) };
                match within(cap, keeper.first_try(&lease, outcome()), || drop(settled)).await {
                    Ok(done) => {
                        keeper.logged("settle", Ok(done));
                    }
                    Err(e) => {
                        tracing::debug!(route = %route.name, error = %e, "settle failed; trying again behind the answer");
                        keeper.finish(lease, outcome(), 1).await;
                    }
                }
            }
            Ending::Complete(_) => {
                within(cap, keeper.release(lease, Sent::Maybe, ReleaseReason::Status), || drop(settled)).await;
            }
            Ending::Broken => {
                route.metrics.observed(Would::UnknownOutcome);
                within(cap, keeper.release(lease, Sent::Maybe, ReleaseReason::Unknown), || drop(settled)).await;
            }
        }
    }
}

/// Ends the upstream span and counts the upstream latency, by how the head came back.
fn end_span(span: Option<ChildSpan>, head: Result<StatusCode, String>, route: &IdempotentRoute, took: Duration) {
    let class = head.as_ref().map_or("error", |status| status_class(*status));
    route.metrics.upstream_latency(class, took);
    if let Some(span) = span {
        match head {
            Ok(status) => {
                span.set("http.response.status_code", i64::from(status.as_u16()));
                span.end(None);
            }
            Err(e) => span.end(Some(e)),
        }
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
) -> Ending {
    let Some(mut pieces) = captured else { return Ending::Complete(None) };
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
        Ok(Ok(body)) => Ending::Complete(body),
        Ok(Err(_)) | Err(_) => Ending::Broken,
    }
}

/// Runs `write`, and `then` (which answers the client) once it is done or after `cap`,
/// whichever comes first: the write is made before the client hears (so that its retry finds
/// it), and a slow store delays the answer by at most `cap`.
async fn within<T>(cap: Duration, write: impl Future<Output = T>, then: impl FnOnce()) -> T {
    let mut write = std::pin::pin!(write);
    let mut then = Some(then);
    let out = tokio::select! {
        out = &mut write => out,
        () = tokio::time::sleep(cap) => {
            if let Some(then) = then.take() {
                then();
            }
            write.await
        }
    };
    if let Some(then) = then.take() {
        then();
    }
    out
}
