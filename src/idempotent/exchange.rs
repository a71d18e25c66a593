//! Exchange: the one upstream call of a claimed key, detached from the client.
//!
//! The exchange runs in its own task. If the client hangs up, the handler's future is dropped
//! but the exchange goes on, stores the result, and the client's retry is answered from the
//! store: this is the "request arrived, response lost" case the gateway exists for.
//!
//! The lease is consumed on every path out: `complete` when the response is stored, `release`
//! when it is not storable (status, size), when the upstream fails, or when shutdown abandons
//! the exchange. While the call runs, the lease is renewed every third of its duration.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::body::{self, Body};
use crate::error::GatewayError;
use crate::headers;
use crate::idempotent::capture::{self, Captured};
use crate::idempotent::policy::IdempotencyPolicy;
use crate::metrics::ReleaseReason;
use crate::route::Route;
use crate::store::{Backend, Lease, Renewal, Settled, Store, StoreError, StoredResponse};
use crate::upstream::UpstreamError;

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
    /// The request, already prepared for the upstream, with its body read.
    pub request: Request<Bytes>,
    /// Fires when shutdown gives up waiting for exchanges.
    pub abandon: CancellationToken,
}

/// How an exchange ended, before it is settled in the store.
enum Ended {
    Answered(Captured),
    Failed(UpstreamError),
    Abandoned,
}

impl Exchange {
    /// Runs the exchange in its own task and waits for its response. Dropping the returned
    /// future (the client went away) does not stop the exchange.
    pub async fn spawn(self, tracker: &TaskTracker) -> Result<Response<Body>, GatewayError> {
        // The exchange's state machine is ~10 KiB; boxed once here, it is not copied again on its
        // way into the task (a by-value spawn moves it through several frames).
        match tracker.spawn(Box::pin(self.run())).await {
            Ok(result) => result,
            Err(e) => Err(GatewayError::Internal(format!("exchange task failed: {e}"))),
        }
    }

    async fn run(self) -> Result<Response<Body>, GatewayError> {
        let Self { route, policy, store, lease, request, abandon } = self;
        let upstream = &route.upstream;
        // Pinned in place and passed on by reference: moving these futures by value would copy
        // kilobytes of state per request.
        let work = std::pin::pin!(async {
            let call = async {
                let response = upstream.send(request.map(body::full)).await?;
                capture::capture(response, policy.max_stored_body).await.map_err(|e| upstream.body_failed(&e))
            };
            tokio::select! {
                result = tokio::time::timeout(upstream.timeout(), call) => match result {
                    Ok(Ok(captured)) => Ended::Answered(captured),
                    Ok(Err(e)) => Ended::Failed(e),
                    Err(_) => Ended::Failed(upstream.timed_out()),
                },
                () = abandon.cancelled() => Ended::Abandoned,
            }
        });
        let ended = renewing(&*store, &lease, &policy, &route, work).await;

        match ended {
            Ended::Answered(Captured::Whole(parts, body)) if policy.store_statuses.contains(parts.status) => {
                let stored = StoredResponse {
                    status: parts.status,
                    headers: headers::storable(&parts.headers, &policy.exclude_headers),
                    body: body.clone(),
                };
                let result = store.complete(lease, &stored, policy.retention).await;
                settled(&route, "complete", result);
                Ok(first_response(parts, body::full(body)))
            }
            Ended::Answered(Captured::Whole(parts, body)) => {
                release(&*store, lease, &route, ReleaseReason::Status).await;
                Ok(first_response(parts, body::full(body)))
            }
            Ended::Answered(Captured::TooLarge(parts, body)) => {
                release(&*store, lease, &route, ReleaseReason::TooLarge).await;
                Ok(first_response(parts, body))
            }
            Ended::Failed(e) => {
                release(&*store, lease, &route, ReleaseReason::UpstreamFailed).await;
                Err(e.into())
            }
            Ended::Abandoned => {
                release(&*store, lease, &route, ReleaseReason::Shutdown).await;
                Err(GatewayError::ShuttingDown)
            }
        }
    }
}

/// Runs `work` while renewing `lease` every third of its duration. A renewal runs between
/// polls of `work` (a short pause of the exchange; the upstream's bytes wait in the socket).
/// Once the lease is found lost, renewal stops; the exchange still finishes, and its
/// complete will find the lease lost too.
async fn renewing<S: Store, T>(
    store: &S,
    lease: &Lease,
    policy: &IdempotencyPolicy,
    route: &Route,
    mut work: Pin<&mut impl Future<Output = T>>,
) -> T {
    if !policy.renew {
        return work.await;
    }
    let period = lease.duration() / 3;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewing = true;
    loop {
        tokio::select! {
            out = &mut work => return out,
            // Boxed: renewals are rare, and the store call would otherwise swell every
            // exchange's state by its size.
            _ = ticks.tick(), if renewing => match Box::pin(store.renew(lease)).await {
                Ok(Renewal::Renewed) => {}
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

async fn release<S: Store>(store: &S, lease: Lease, route: &Route, reason: ReleaseReason) {
    route.metrics.released(reason);
    let result = store.release(lease).await;
    settled(route, "release", result);
}

/// Logs and counts the end of a claim that did not go as planned. The client is answered
/// either way: the upstream's answer must not be lost because the store hiccuped.
fn settled(route: &Route, action: &str, result: Result<Settled, StoreError>) {
    match result {
        Ok(Settled::Done) => {}
        Ok(Settled::Lost) => {
            route.metrics.lease_lost();
            tracing::warn!(route = %route.name, action, "claim was taken over before it settled; the upstream's own constraint must catch a duplicate");
        }
        Err(e) => {
            route.metrics.store_write_failed();
            tracing::warn!(route = %route.name, action, error = %e, "store failed after the upstream answered; the key stays claimed until its lease passes");
        }
    }
}

fn first_response(mut parts: http::response::Parts, body: Body) -> Response<Body> {
    headers::strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body)
}
