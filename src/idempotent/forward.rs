//! Forward: the one upstream call of a claimed key, in an exchange detached from the client.
//!
//! The exchange runs in its own task. If the client hangs up, the handler's future is dropped
//! but the exchange goes on, settles the key, and the client's retry is answered from the
//! store: this is the "request arrived, response lost" case the gateway exists for.
//!
//! Every way an exchange can end is classified (`outcome`: what becomes of the key and what
//! the first client gets, decided from how the call ended alone), and the lease is consumed
//! on every path.
//!
//! Every forwarded request carries the attempt header (`Idempotency-Attempt: N`), so the
//! upstream can refuse or log a re-execution. While the call runs, the lease is renewed every
//! third of its duration (see `settle`); when settling finds it lost, the first response says
//! so with `Idempotency-Status: lease-lost`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, Uri};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::admit::Admitted;
use super::answer;
use super::capture::{self, Captured, StreamEnd};
use super::context::{Claimant, Handler};
use super::outcome::{self, Ended, Plan, Then};
use super::reconcile::{self, Question};
use super::settle::Keeper;
use crate::body::Payload;
use crate::body::{self, Body};
use crate::error::{GatewayError, Settling};
use crate::headers;
use crate::policy::UnknownOutcomePolicy;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Final, IndexEntry, IndexKey, Operator, State, StoredResponse};
use crate::telemetry::{ChildSpan, RequestSpan};
use crate::upstream::Upstream;

/// Sends an admitted request upstream in an exchange of its own, and waits for the first
/// client's answer. Dropping the returned future (the client went away) does not stop the
/// exchange.
pub async fn forward(
    h: &mut Handler<'_>,
    claimant: Claimant,
    admitted: Admitted,
    mut parts: Parts,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    let (rt, route, peer, notes) = (h.rt, h.route, &h.connection.peer, &mut *h.notes);
    // The last phase: what the exchange needs of the request moves into it.
    let Claimant { record, key, scope, fingerprint, .. } = claimant;
    // Only a route that reconciles keeps what a lookup needs (a few headers, the peer).
    let question =
        route.policy.reconcile.as_ref().map(|_| Question::new(route, &parts.headers, &key, record, fingerprint, peer));
    let trail = Trail { key, scope, method: parts.method.clone(), uri: parts.uri.clone(), question };
    route.upstream.prepare(&mut parts, peer);
    notes.attempt = admitted.claimed.attempt();
    let exchange = Exchange {
        rt: Arc::clone(rt),
        route: Arc::clone(route),
        admitted,
        request: Request::from_parts(parts, body),
        trail,
        span: notes.span.clone(),
    };
    let (tx, rx) = oneshot::channel();
    // The exchange's state machine is several KiB; boxed once here, it is not copied again on
    // its way into the task.
    rt.exchanges.spawn(Box::pin(exchange.run(tx)));
    let (answer, report) = rx.await.unwrap_or_else(|_| {
        (Err(GatewayError::Internal("the exchange ended without an answer".into())), Report::default())
    });
    notes.upstream = Some(report.upstream);
    notes.store += report.store;
    answer
}

/// A claimed request on its way upstream, in a task of its own.
struct Exchange {
    rt: Arc<Runtime>,
    route: Arc<IdempotentRoute>,
    admitted: Admitted,
    /// The request, prepared for the upstream, with its body read.
    request: Request<Bytes>,
    /// What the key's record may need after the exchange.
    trail: Trail,
    /// The request's span, when it is traced: the exchange adds `upstream` and `settle`.
    span: Option<RequestSpan>,
}

/// What an exchange keeps of its request for a key that ends needing attention: the index
/// entry of an unknown or executed record, and the question a lookup asks.
struct Trail {
    key: IdempotencyKey,
    scope: Scope,
    method: Method,
    /// The path and query as the client sent them.
    uri: Uri,
    /// On a route that reconciles.
    question: Option<Question>,
}

type Answer = Result<Response<Body>, GatewayError>;

/// Where an exchange's time went, for the access log.
#[derive(Debug, Clone, Copy, Default)]
struct Report {
    /// Sending the request and reading the answer.
    upstream: Duration,
    /// Settling or releasing the key before the answer went out.
    store: Duration,
}

impl Exchange {
    async fn run(self, client: oneshot::Sender<(Answer, Report)>) {
        let Self { rt, route, admitted, mut request, trail, span } = self;
        // The slots are held until the exchange ends, after its client if it goes first.
        let Admitted { claimed, slots: _slots } = admitted;
        let (policy, abandon) = (&*route.policy, &rt.abandon);
        let running = rt.metrics.exchanges_running.clone();
        running.inc();
        let _running = scopeguard(move || {
            running.dec();
        });
        // The attempt is the gateway's word; whatever a client sent under that name is gone
        // (identify removed it), and an unconfirmed claim has no attempt number to give.
        if let (Some(name), Some(attempt)) = (policy.attempt_header.as_ref(), claimed.attempt()) {
            request.headers_mut().insert(name.clone(), HeaderValue::from(attempt));
        }
        // The upstream gets this span as its parent (`traceparent`).
        let upstream_span = span.as_ref().map(|s| s.upstream(request.headers_mut()));
        let settle = Keeper::new(&route, &rt.store, &claimed);
        // An unconfirmed claim (fail-open) may have no record at all: nothing to index.
        let indexed = claimed.is_confirmed();
        let lease = claimed.into_lease();
        let work = std::pin::pin!(async {
            tokio::select! {
                ended = call(&route.upstream, request, policy.max_stored_body) => ended,
                () = abandon.cancelled() => Ended::Abandoned,
            }
        });
        let started = Instant::now();
        let ended = settle.renewing(&lease, work).await;
        let upstream_done = Instant::now();
        if let Some(upstream_span) = upstream_span {
            ended.trace(upstream_span);
        }
        let mut settle_span = span.as_ref().map(|s| s.child("settle"));
        let upstream_time = upstream_done - started;
        route.metrics.upstream_latency(ended.class(), upstream_time);
        let report = || Report { upstream: upstream_time, store: upstream_done.elapsed() };

        // When a lookup's "not found" can be trusted (see `reconcile`): at once if the upstream
        // closed the connection itself; else not before it would have given up on the request.
        let trusted_in = |closed_by_upstream: bool| match closed_by_upstream {
            true => Duration::ZERO,
            false => {
                let release_after = policy.reconcile.as_ref().map_or(Duration::ZERO, |r| r.release_after);
                (started + route.upstream.timeout() + release_after).saturating_duration_since(Instant::now())
            }
        };
        // Decide (see `outcome`), then do, in this order of effects.
        let mut held = None;
        let reply = match outcome::plan(ended, &policy.store_statuses) {
            Plan::Keep(parts, body) => {
                let stored = StoredResponse {
                    status: parts.status,
                    headers: headers::storable(&parts.headers, &policy.stored_headers),
                    body: body.clone(),
                };
                // Settled before the client hears the answer, so that its retry finds it. If the
                // store fails, the client is answered anyway and settling goes on behind it:
                // until then the key is in progress, and retries wait for it.
                let settled = settle.first_try(&lease, Final::Response(&stored)).await;
                if let Err(e) = settled {
                    tracing::debug!(route = %route.name, error = %e, "settle failed; answering first, then retrying");
                    let _ = client.send((Ok(answer::first(parts, body::payload(body), false)), report()));
                    settle.finish(lease, Final::Response(&stored), 1).await;
                    end_span(settle_span.take());
                    return;
                }
                let lost = settle.logged("settle", settled);
                Ok(answer::first(parts, body::payload(body), lost))
            }
            Plan::KeepHead(parts, body, end) => {
                let head = StoredResponse {
                    status: parts.status,
                    headers: headers::storable(&parts.headers, &policy.stored_headers),
                    body: Payload::default(),
                };
                // The client gets the stream now; the key is settled once it has ended.
                // (Its settle span covers the stream, which the settle waits for.)
                let _ = client.send((Ok(answer::first(parts, body, false)), report()));
                // Shutdown does not wait for a slow reader: past the grace period the stream
                // counts as delivered (the upstream answered; the request ran).
                let ended = std::pin::pin!(async {
                    tokio::select! {
                        end = end => end.unwrap_or(StreamEnd::ClientGone),
                        () = abandon.cancelled() => StreamEnd::ClientGone,
                    }
                });
                let end = settle.renewing(&lease, ended).await;
                let held = match end {
                    StreamEnd::Complete | StreamEnd::ClientGone => {
                        route.metrics.not_stored();
                        settle.finish(lease, Final::Executed(&head), 0).await;
                        Some(State::Executed)
                    }
                    // The upstream broke its own answer off.
                    StreamEnd::Broken => held_by(settle.unknown(lease, Duration::ZERO).await),
                };
                end_span(settle_span);
                trail.record(&rt, &route, held.filter(|_| indexed));
                return;
            }
            Plan::Release { sent, reason, then } => {
                settle.release(lease, sent, reason).await;
                match then {
                    Then::Whole(parts, body) => Ok(answer::first(parts, body::payload(body), false)),
                    Then::Streamed(parts, body) => Ok(answer::first(parts, body, false)),
                    Then::Failed(e) => Err(e.into()),
                }
            }
            Plan::Unknown { trusted_at_once, unanswered } => {
                let done = settle.unknown(lease, trusted_in(trusted_at_once)).await;
                held = held_by(done);
                Err(outcome::refusal(unanswered, done, settling(&route)))
            }
        };
        end_span(settle_span);
        let _ = client.send((reply, report()));
        trail.record(&rt, &route, held.filter(|_| indexed));
    }
}

/// How the key of an exchange that lost its answer gets settled. On a route that reconciles,
/// the client's retry with the same key is what gets the answer: say when (the lookup the
/// gateway makes by itself, or at once with `after = "off"`, where the retry asks).
fn settling(route: &IdempotentRoute) -> Settling {
    let after = route.policy.reconcile.as_ref().map(|r| r.after.unwrap_or(Duration::from_secs(1)));
    reconcile::settling(route, after)
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

impl Trail {
    /// After a key ended needing attention (`held`): its entry in the index of records that
    /// need an operator, and, on a route that reconciles, a lookup in the background. After
    /// the client's answer, which neither delays. Best effort: the index is checked against
    /// the record when read.
    fn record(self, rt: &Arc<Runtime>, route: &Arc<IdempotentRoute>, held: Option<State>) {
        let Some(held) = held else { return };
        let Self { key, scope, method, uri, question } = self;
        let record = match &question {
            Some(q) => q.record().clone(),
            None => rt.record_key(&route.policy.identity.name, &scope, &key),
        };
        let entry = IndexEntry {
            record: record.as_str().to_owned(),
            key: key.header_form(),
            scope_hash: scope.to_hex(),
            method: method.as_str().to_owned(),
            path: uri.path_and_query().map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
            since_unix_ms: crate::store::unix_ms(),
        };
        let (rt2, route2) = (Arc::clone(rt), Arc::clone(route));
        tokio::spawn(async move {
            let index = IndexKey::new(rt2.key_prefix(), &route2.policy.identity.name);
            if let Err(e) = rt2.store.index(&index, held, &entry, route2.policy.retention).await {
                tracing::debug!(route = %route2.name, key = record.short(), error = %e, "cannot index a record that needs an operator");
            }
        });
        if let Some(question) = question.filter(|_| held == State::Unknown) {
            reconcile::later(rt, route, question);
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

/// Sends the request and reads the answer, all within the upstream's timeout: one deadline
/// for the whole exchange.
async fn call(upstream: &Upstream, request: Request<Bytes>, limit: usize) -> Ended {
    let deadline = Instant::now() + upstream.timeout();
    // A request no instance was sent may go to another, within this one deadline; one still
    // waiting for a connection when it passes was never sent either.
    let response = match upstream.send_buffered(request, deadline).await {
        Err(e) if e.never_sent() => return Ended::NotSent(e),
        Err(e) => return Ended::NoAnswer(e),
        Ok(mut response) => {
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
