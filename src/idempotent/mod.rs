//! The idempotent request path, for a route that enforces its policy and for one that only
//! observes it. [`serve`] runs the phases in this order, one module each:
//!
//! ```text
//! identify ─┬─ keyed ─▶ claim ─┬─ Acquired ─▶ admit ─▶ exchange (forward, settle) ─▶ the first answer
//!           │                  ├─ Completed, Executed ─────────────────────────────▶ a replay, or 'response-not-stored'
//!           │                  ├─ Unknown ─▶ reconcile ─┬─ found ──────────────────▶ a replay, reconciled
//!           │                  │                        ├─ released ───────────────▶ claim again (attempt N+1)
//!           │                  │                        └─ still asking, unknown ──▶ 409, 502 'outcome-unknown'
//!           │                  ├─ InFlight (after the bounded wait) ───────────────▶ 409 + Retry-After
//!           │                  ├─ Mismatch ────────────────────────────────────────▶ 422
//!           │                  └─ anything but Acquired, observing ────────────────▶ handed back (counted)
//!           └─ unclaimed (no key where it is optional; what an observing route cannot claim) ─▶ handed back
//! ```
//!
//! - [`identify`]: the key, the request checks, the scope, the bounded body, the fingerprint
//!   and the record's name;
//! - [`claim`]: taking the key, or waiting out the request that holds it; never a ghost; and
//!   what the store's reply leads to, by mode, is [`outcome`]'s first table;
//! - [`reconcile`]: asking the upstream what became of a request whose answer was lost (on an
//!   enforcing route with `[routes.idempotency.reconcile]`; without it, `Unknown` is 502 at once);
//! - [`admit`]: room for one more exchange and the caller's budget of new keys;
//! - [`ghost`]: a claim no exchange will end, given back in the background;
//! - [`exchange`]: the upstream call, in a task of its own that outlives the client, decided by
//!   [`outcome`]'s table and settled through [`settle`]; answers read by [`capture`]; what a
//!   key left for an operator indexed by [`trail`];
//! - [`reply`]: the first answer, a replay, or what a retry of an unstored answer gets.
//!
//! A route in observe mode takes the same phases: what enforcing would refuse or replay is
//! handed back to be forwarded as a plain route would (a duplicate's answer compared with the
//! stored one), counted in `idemgate_observed_total` as what enforcing would have done; a
//! claimed request goes through the exchange, which streams the answer and settles the key
//! as enforcing would, so that switching to enforce never runs it again. Each table
//! (`identify`, and the two of `outcome`) has a column per mode.
//!
//! The phases share a [`Session`] (borrowed, made in `Gateway::handle`) and a `Ctx` (owned,
//! made by `identify`, moved into the exchange); see `context`.
//!
//! A store that fails on the claim gets the route's `on_store_error`: fail-closed refuses,
//! fail-open goes through `admit` and the exchange all the same, unconfirmed, as an observing
//! route does.

mod admit;
mod capture;
mod claim;
mod context;
mod exchange;
mod ghost;
mod identify;
mod outcome;
mod reconcile;
mod reply;
mod settle;
mod trail;

use http::Request;
use hyper::body::Incoming;

use self::admit::Admission;
pub use self::context::Session;
use self::identify::Identified;
use self::outcome::Next;
pub use self::reply::{Pass, Served};
use crate::error::GatewayError;
use crate::metrics::{Outcome, Would};

/// Serves one request on an idempotent route, enforcing or observing: answered here, or
/// handed back to be forwarded as a plain route would.
pub async fn serve(mut s: Session<'_>, request: Request<Incoming>) -> Result<Served, GatewayError> {
    let mut ctx = match identify::identify(&mut s, request).await? {
        Identified::Keyed(ctx) => ctx,
        Identified::Unclaimed(outcome, request) => return Ok(Served::Pass(Pass { request, outcome, expected: None })),
    };
    s.notes.record = Some(ctx.claimant.record.short().to_owned());

    let tried = claim::claim(&mut s, &mut ctx).await;
    let (claimed, would, expected) = match outcome::after_claim(&s, &ctx.claimant, tried) {
        Next::Forward(claimed, would) => (Some(claimed), would, None),
        Next::Pass(would, expected) => (None, Some(would), expected),
        Next::Replay(stored, reconciled) => {
            let header = &s.route.policy.replay_header;
            let replay = if reconciled { reply::reconciled(stored, header) } else { reply::replay(stored, header) };
            return Ok(Served::Answered(Outcome::Replayed, replay));
        }
        Next::NotStored(head) => {
            let (policy, route) = (&s.route.policy, s.route);
            let answer = reply::not_stored(head, &policy.replay_header, &route.settings.problem_base, &route.errors);
            return Ok(Served::Answered(Outcome::Replayed, answer));
        }
        Next::Refuse(e) => return Err(e),
    };
    let (admitted, would) = match claimed {
        None => (false, would),
        Some(claimed) => match admit::admit(&s, &mut ctx, claimed).await {
            Admission::Admitted => (true, would),
            Admission::Refused(e) => return Err(e),
            Admission::Throttled => (false, Some(Would::Throttle)),
        },
    };
    // What enforcing would have done, once it is known, whatever happens next.
    if let Some(would) = would {
        s.route.metrics.observed(would);
        s.notes.observed = Some(would);
    }
    if !admitted {
        return Ok(Served::Pass(Pass { request: ctx.into_request(), outcome: Outcome::Observed, expected }));
    }
    exchange::forward(&mut s, ctx).await
}
