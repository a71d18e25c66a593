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
//! - [`settle`]: every store write after the claim (renew, settle, release, and the release in
//!   the background of a claim whose request is gone);
//! - [`reconcile`]: asking the upstream what became of a request whose answer was lost (on a
//!   route with `[routes.idempotency.reconcile]`; without it, `Unknown` is 502 at once);
//! - [`answer`]: the first answer, a replay, or what a retry of an unstored answer gets.
//!
//! The phases share a [`Handler`] (borrowed, made in `Gateway::handle`) and a `Claimant`
//! (owned, made by `identify`, moved into the exchange); see `context`.
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
mod observe;
mod outcome;
mod reconcile;
mod settle;

use http::{HeaderValue, Request};
use hyper::body::Incoming;

use crate::body;
use crate::error::GatewayError;
use crate::metrics::Outcome;
use crate::proxy;
use crate::store::Claim;

pub use self::answer::Served;
use self::context::Claimed;
pub use self::context::Handler;
use self::identify::{Identified, Identity};
pub use self::observe::observe;

/// Serves one request on an idempotent route.
pub async fn handle(mut h: Handler<'_>, request: Request<Incoming>) -> Result<Served, GatewayError> {
    let (rt, route) = (h.rt, h.route);
    let Identified { parts, body, mut claimant } = match identify::identify(rt, route, request).await? {
        Identity::Keyed(identified) => identified,
        Identity::Unkeyed(request) => {
            let response = proxy::send(&route.upstream, request.map(body::boxed), h.connection).await?;
            return Ok((Outcome::PassedThrough, response));
        }
    };
    h.notes.record = Some(claimant.record.short().to_owned());

    let mut tried = claim::traced(&mut h, &mut claimant).await;
    // An unknown outcome on a route that reconciles: ask the upstream (once per request).
    let mut reconciled = false;
    if let Ok(Claim::Unknown { .. }) = tried.reply
        && route.policy.reconcile.is_some()
    {
        let question = reconcile::Question::new(
            route,
            &parts.headers,
            &claimant.key,
            claimant.record.clone(),
            claimant.fingerprint,
            &h.connection.peer,
        );
        let span = h.notes.span.as_ref().map(|s| s.child("reconcile"));
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
                tried = claim::traced(&mut h, &mut claimant).await;
            }
        }
    }
    let claimed = match tried.reply {
        Ok(Claim::Acquired(lease)) => Claimed::Confirmed(lease),
        Ok(Claim::InFlight { lease_left }) => {
            let retry_after = claim::retry_after(route, lease_left, tried.holder_ran);
            return Err(GatewayError::InFlight { retry_after });
        }
        Err(e) => claim::store_failed(&h, &claimant, e, tried.sent)?,
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
        Ok(Claim::Mismatch) => return Err(GatewayError::Mismatch),
    };
    let confirmed = claimed.is_confirmed();
    if let Some(attempt) = claimed.attempt() {
        tracing::debug!(route = %route.name, key = claimant.record.short(), attempt, "claimed");
    }

    let admitted = admit::admit(&h, &claimant, claimed).await?;
    let mut response = forward::forward(&mut h, claimant, admitted, parts, body).await?;
    if confirmed {
        return Ok((Outcome::Executed, response));
    }
    response.headers_mut().insert(answer::STATUS_HEADER, HeaderValue::from_static("bypassed"));
    Ok((Outcome::Bypassed, response))
}
