//! The idempotent request path. [`handle`] runs the phases in this order, one module each:
//!
//! ```text
//! identify ─▶ claim ─┬─ Acquired ─▶ admit ─▶ forward ─▶ settle ─▶ answer (first)
//!                    ├─ Completed ───────────────────────────────▶ answer (replay)
//!                    ├─ Executed ────────────────────────────────▶ answer ('response-not-stored')
//!                    ├─ Unknown ─▶ reconcile ─┬─ found ──────────▶ answer (replay, reconciled)
//!                    │                        ├─ released ───────▶ claim again (attempt N+1)
//!                    │                        ├─ still asking ───▶ 409 + Retry-After
//!                    │                        └─ still unknown ──▶ 502 'outcome-unknown' + Retry-After
//!                    ├─ InFlight (after the bounded wait) ───────▶ 409 + Retry-After
//!                    └─ Mismatch ────────────────────────────────▶ 422
//! ```
//!
//! - [`identify`]: the key, the request checks, the scope, the bounded body, the fingerprint
//!   and the record's name;
//! - [`claim`]: taking the key, or waiting out the request that holds it; never a ghost;
//! - [`admit`]: room for one more exchange and the caller's budget of new keys;
//! - [`forward`]: the exchange with the upstream, in a task of its own that outlives the client;
//! - [`settle`]: every store write after the claim (renew, settle, release);
//! - [`reconcile`]: asking the upstream what became of a request whose answer was lost (on a
//!   route with `[routes.idempotency.reconcile]`; without it, `Unknown` is 502 at once);
//! - [`answer`]: the first answer, a replay, or what a retry of an unstored answer gets.
//!
//! A store that fails on the claim gets the route's `on_store_error`: fail-closed refuses,
//! fail-open goes through `admit` and `forward` all the same, unconfirmed.

mod admit;
mod answer;
mod capture;
mod claim;
mod context;
mod forward;
mod identify;
mod reconcile;
mod settle;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request};
use hyper::body::Incoming;

use crate::access::Trace;
use crate::body;
use crate::connection::Connection;
use crate::error::GatewayError;
use crate::metrics::Outcome;
use crate::policy::StoreFailurePolicy;
use crate::policy::fingerprint::Fingerprint;
use crate::proxy;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Claim, Lease, OwnerToken, StoreError};

use self::admit::Admitted;
pub use self::answer::Served;
use self::context::Ctx;
use self::identify::{Identified, Identity};

/// Serves one request on an idempotent route.
pub async fn handle(
    rt: &Arc<Runtime>,
    route: &Arc<IdempotentRoute>,
    request: Request<Incoming>,
    connection: &Arc<Connection>,
    trace: &mut Trace,
) -> Result<Served, GatewayError> {
    let Identified { parts, body, key, scope, fingerprint, record } =
        match identify::identify(rt, route, request).await? {
            Identity::Keyed(identified) => identified,
            Identity::Unkeyed(request) => {
                let response = proxy::forward(&route.upstream, request.map(body::boxed), connection).await?;
                return Ok((Outcome::PassedThrough, response));
            }
        };
    trace.record = Some(record.short().to_owned());
    let owner = OwnerToken::generate();
    let claim_sent = tokio::time::Instant::now();
    let mut ctx = Ctx { route, record, key, scope, fingerprint, owner, trace, holder_ran: Duration::ZERO, claim_sent };

    let mut claimed = traced_claim(rt, &mut ctx, &fingerprint).await;
    // An unknown outcome on a route that reconciles: ask the upstream (once per request).
    let mut reconciled = false;
    if let Ok(Claim::Unknown { .. }) = claimed
        && route.policy.reconcile.is_some()
    {
        let question = reconcile::Question::new(
            route,
            &parts.headers,
            &ctx.key,
            ctx.record.clone(),
            fingerprint,
            &connection.peer,
        );
        let span = ctx.trace.span.as_ref().map(|s| s.child("reconcile"));
        let asked = reconcile::on_retry(rt, route, question).await;
        if let Some(span) = span {
            span.set("idemgate.reconciled", asked.describe());
            span.end(None);
        }
        match asked {
            reconcile::Asked::Found(stored) => {
                return Ok((Outcome::Replayed, answer::reconciled(stored, &route.policy.replay_header)));
            }
            // The lookup outlasted the wait: what a duplicate gets when its key is still held.
            reconcile::Asked::Running { left } => {
                return Err(GatewayError::InFlight { retry_after: left });
            }
            reconcile::Asked::TooEarly { left } => {
                return Err(GatewayError::OutcomeUnknown {
                    timed_out: false,
                    settling: reconcile::settling(route, Some(left)),
                });
            }
            reconcile::Asked::Failed => {
                return Err(GatewayError::OutcomeUnknown {
                    timed_out: false,
                    settling: reconcile::settling(route, None),
                });
            }
            reconcile::Asked::Changed => {
                reconciled = true;
                claimed = traced_claim(rt, &mut ctx, &fingerprint).await;
            }
        }
    }
    let lease = match claimed {
        Ok(Claim::Acquired(lease)) => lease,
        Ok(Claim::Completed(stored)) if reconciled => {
            return Ok((Outcome::Replayed, answer::reconciled(stored, &route.policy.replay_header)));
        }
        Ok(Claim::Completed(stored)) => {
            return Ok((Outcome::Replayed, answer::replay(stored, &route.policy.replay_header)));
        }
        Ok(Claim::Executed(head)) => {
            let response =
                answer::not_stored(head, &route.policy.replay_header, &route.settings.problem_base, &route.errors);
            return Ok((Outcome::Replayed, response));
        }
        Ok(Claim::Unknown { .. }) => {
            return Err(GatewayError::OutcomeUnknown { timed_out: false, settling: reconcile::settling(route, None) });
        }
        Ok(Claim::InFlight { lease_left }) => {
            let retry_after = claim::retry_after(route, lease_left, ctx.holder_ran);
            return Err(GatewayError::InFlight { retry_after });
        }
        Ok(Claim::Mismatch) => return Err(GatewayError::Mismatch),
        Err(e) => return store_failed(rt, ctx, e, connection, Request::from_parts(parts, body)).await,
    };
    tracing::debug!(route = %route.name, key = ctx.record.short(), attempt = lease.attempt(), "claimed");

    let admitted = admit::admit(rt, &ctx, connection, &scope, lease).await?;
    let response = forward::forward(rt, &mut ctx, admitted, parts, body, &connection.peer).await?;
    Ok((Outcome::Executed, response))
}

/// The claim phase, as a trace shows it: a `claim` span, and a `wait` span for the time a
/// duplicate waited for the request holding its key. Without tracing, the claim alone.
async fn traced_claim(rt: &Runtime, ctx: &mut Ctx<'_>, fingerprint: &Fingerprint) -> Result<Claim, StoreError> {
    let Some(span) = ctx.trace.span.clone() else { return claim::claim(rt, ctx, fingerprint).await };
    let waited_before = ctx.trace.wait;
    let child = span.child("claim");
    let claimed = claim::claim(rt, ctx, fingerprint).await;
    let waited = ctx.trace.wait.saturating_sub(waited_before);
    if !waited.is_zero() {
        let end = std::time::SystemTime::now();
        span.child_between("wait", end.checked_sub(waited).unwrap_or(end), end);
    }
    child.end(claimed.as_ref().err().map(ToString::to_string));
    claimed
}

/// The claim call failed: the route's `on_store_error` decides.
async fn store_failed(
    rt: &Arc<Runtime>,
    mut ctx: Ctx<'_>,
    error: StoreError,
    connection: &Arc<Connection>,
    request: Request<bytes::Bytes>,
) -> Result<Served, GatewayError> {
    let (route, policy) = (ctx.route, &ctx.route.policy);
    route.metrics.store_error();
    // The outage itself is logged once by the store (see `store::health`); this request's
    // outcome is in the access line.
    tracing::debug!(route = %route.name, key = ctx.record.short(), error = %error, "store failed on claim");
    match policy.on_store_error {
        StoreFailurePolicy::FailClosed => {
            // The claim may have been made, its reply lost: release it, or the client's retry
            // would wait out a whole lease.
            claim::release_ghost(rt, &ctx);
            Err(GatewayError::StoreUnavailable(error))
        }
        StoreFailurePolicy::FailOpen => {
            // Forward under the owner token all the same: if the claim was made after all, the
            // exchange settles it and retries replay its answer; if not, settling finds
            // nothing. A ghost claim never lets a retry run it twice.
            let slots = admit::slots(rt, connection).ok_or(GatewayError::Overloaded)?;
            let lease = Lease::new(ctx.record.clone(), ctx.owner, 0, claim::terms(policy), ctx.claim_sent);
            let admitted = Admitted { lease, confirmed: false, slots };
            let (parts, body) = request.into_parts();
            let mut response = forward::forward(rt, &mut ctx, admitted, parts, body, &connection.peer).await?;
            response.headers_mut().insert(answer::STATUS_HEADER, HeaderValue::from_static("bypassed"));
            Ok((Outcome::Bypassed, response))
        }
    }
}
