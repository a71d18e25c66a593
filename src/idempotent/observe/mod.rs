//! Observe: a route with `mode = "observe"` answers every request exactly as a pass-through
//! route would, and counts what enforcement would have done (`idemgate_observed_total`), so
//! that an operator can measure a live API before enforcing on it.
//!
//! ```text
//! classify ─┬─ no key, bad key, no scope, unsafe headers, body too large or slow ─▶ pass through
//!           └─ keyed, read ─▶ claim (one store call) ─┬─ Acquired, store error ─▶ exchange (settles)
//!                                                     ├─ Completed, Executed ──▶ pass through, compared
//!                                                     └─ InFlight, Mismatch, Unknown ─▶ pass through
//! ```
//!
//! Every path counts one `would` (and a duplicate whose answer differs from the stored one,
//! `answer_differed` as well). The one cost is the claim, one store round trip before
//! forwarding; a store that fails or is slow forwards at once and is counted.
//!
//! What observing keeps, so that switching the route to enforce by reload never runs again a
//! request first sent while observing: the claimant holds the key as enforcement does (owner,
//! lease, renewal) and settles it with its own answer (see `exchange`); nobody else writes,
//! so a record an enforcing gateway made is never written over. An unknown outcome releases
//! its key, so enforcing never starts with keys held from observing. Concurrent duplicates
//! all run: that is what observing measures.

mod exchange;
mod tee;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;

use super::answer::Served;
use super::claim;
use super::context::{Claimant, Claimed, Handler};
use super::{admit, identify, settle};
use crate::body::{self, Body, Readout, Unread};
use crate::check;
use crate::error::GatewayError;
use crate::host;
use crate::metrics::{Outcome, Would};
use crate::proxy;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Claim, Lease, OwnerToken, StoredResponse};

/// Serves one request on a route in observe mode.
pub async fn observe(mut h: Handler<'_>, request: Request<Incoming>) -> Result<Served, GatewayError> {
    let (rt, route) = (h.rt, h.route);
    let Keyed { parts, body, mut claimant } = match classify(rt, route, request).await {
        Classified::Keyed(keyed) => keyed,
        Classified::Unobserved(would, request) => {
            counted(&mut h, would);
            return pass(&mut h, request, None).await;
        }
    };
    h.notes.record = Some(claimant.record.short().to_owned());

    let span = h.notes.span.as_ref().map(|s| s.child("claim"));
    let (reply, sent) = claim::once(rt, route, &mut claimant).await;
    h.notes.store += sent.elapsed();
    if let Some(span) = span {
        span.end(reply.as_ref().err().map(ToString::to_string));
    }
    let (would, stored) = match reply {
        Ok(Claim::Acquired(lease)) => {
            // Past the caller's budget of new keys, enforcing would answer 429: the claim is
            // given back (one caller must not fill the store), and the request goes unclaimed.
            let attempt = Some(lease.attempt());
            let held = settle::Unadmitted::new(rt, lease);
            if admit::new_key_budget(rt, route, &claimant.scope, attempt).await.is_some() {
                settle::release_unsent(rt, route, held).await;
                counted(&mut h, Would::Throttle);
                return pass(&mut h, Request::from_parts(parts, body::full(body)), None).await;
            }
            counted(&mut h, Would::First);
            return claimant_forward(&mut h, Claimed::Confirmed(held.take()), parts, body).await;
        }
        // Forwarded at once. The claim may have been made, its reply lost: the exchange settles
        // it under this request's owner token if so, exactly as a fail-open route does.
        Err(e) => {
            route.metrics.store_error();
            tracing::debug!(route = %route.name, key = claimant.record.short(), error = %e, "store failed on an observed claim; forwarding");
            counted(&mut h, Would::StoreError);
            let terms = claim::terms(&route.policy);
            let lease = Lease::unconfirmed(claimant.record.clone(), claimant.owner, terms, sent);
            return claimant_forward(&mut h, Claimed::Unconfirmed(lease), parts, body).await;
        }
        Ok(Claim::Completed(stored)) => (Would::Replay, Some(Stored::Answer(stored))),
        Ok(Claim::Executed(head)) => (Would::Replay, Some(Stored::Head(head))),
        Ok(Claim::InFlight { .. }) => (Would::Conflict, None),
        Ok(Claim::Mismatch) => (Would::RejectReuse, None),
        Ok(Claim::Unknown { .. }) => (Would::AnswerUnknown, None),
    };
    counted(&mut h, would);
    pass(&mut h, Request::from_parts(parts, body::full(body)), stored).await
}

/// What a request is to a route that observes.
enum Classified {
    /// Keyed, and read whole: it can be claimed.
    Keyed(Keyed),
    /// What enforcement would have refused or passed by without a claim, ready to forward.
    Unobserved(Would, Request<Body>),
}

struct Keyed {
    parts: Parts,
    body: Bytes,
    claimant: Claimant,
}

/// Reads the request as enforcement would (key, headers, scope, body, fingerprint), but
/// where enforcement would refuse, says why and hands the request back whole.
async fn classify(rt: &Runtime, route: &IdempotentRoute, request: Request<Incoming>) -> Classified {
    let policy = &route.policy;
    let unobserved = |would, request: Request<Incoming>| Classified::Unobserved(would, request.map(body::boxed));
    let key = match policy.key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return unobserved(Would::MissingKey, request),
        Err(_) => return unobserved(Would::MalformedKey, request),
    };
    if check::keyed(request.headers(), policy).is_err() {
        return unobserved(Would::UnsafeHeaders, request);
    }
    let host = policy.identity.needs_host().then(|| host::of_head(request.uri(), request.headers())).flatten();
    let Ok(scope) = policy.scope(request.headers(), host.as_deref(), policy.on_missing_scope) else {
        return unobserved(Would::MissingScope, request);
    };
    identify::count_pin(route, host.as_deref());
    drop(host);
    let (parts, incoming) = request.into_parts();
    let deadline = route.settings.body_read_timeout;
    let body = match body::read_or_pass(&parts.headers, incoming, policy.max_request_body, deadline).await {
        Readout::Whole(body) => body,
        Readout::Unread(why, body) => {
            let would = if why == Unread::TooLarge { Would::TooLarge } else { Would::UnreadBody };
            return Classified::Unobserved(would, Request::from_parts(parts, body));
        }
    };
    // As enforcement computes them (less its own attempt header, which a client does not
    // send), so that a retry after the switch matches its first request.
    let mut fingerprinted = parts;
    let attempt = policy.attempt_header.as_ref().and_then(|name| fingerprinted.headers.remove(name));
    let (fingerprint, previous) = identify::fingerprints(route, &fingerprinted, &body);
    if let (Some(name), Some(value)) = (&policy.attempt_header, attempt) {
        fingerprinted.headers.insert(name.clone(), value);
    }
    let record = rt.record_key(&policy.identity.name, &scope, &key);
    let claimant = Claimant { record, key, scope, fingerprint, previous, owner: OwnerToken::generate() };
    Classified::Keyed(Keyed { parts: fingerprinted, body, claimant })
}

/// Counts what enforcement would have done, and notes it for the access line.
fn counted(h: &mut Handler<'_>, would: Would) {
    h.route.metrics.observed(would);
    h.notes.observed = Some(would);
}

/// What the store holds for a duplicate's key, to compare its answer with.
enum Stored {
    /// A whole answer.
    Answer(StoredResponse),
    /// The status and headers of an answer too large to store.
    Head(StoredResponse),
}

/// Forwards as a pass-through route does; a duplicate's answer is compared with the stored one
/// on its way (status, then body), counting `answer_differed` once if they differ.
async fn pass(h: &mut Handler<'_>, request: Request<Body>, stored: Option<Stored>) -> Result<Served, GatewayError> {
    let response = proxy::pass_through(h.route, request, h.connection, h.notes).await?;
    let Some(stored) = stored else { return Ok((Outcome::Observed, response)) };
    let differed = h.route.metrics.observed_counter(Would::AnswerDiffered);
    let (status, expected) = match stored {
        Stored::Answer(answer) => (answer.status, Some(answer.body.to_bytes())),
        Stored::Head(head) => (head.status, None),
    };
    let response = match expected {
        _ if response.status() != status => {
            differed.inc();
            response
        }
        Some(expected) => response.map(|body| body::boxed(tee::Compared::new(body, expected, differed))),
        None => response,
    };
    Ok((Outcome::Observed, response))
}

async fn claimant_forward(
    h: &mut Handler<'_>,
    claimed: Claimed,
    parts: Parts,
    body: Bytes,
) -> Result<Served, GatewayError> {
    let response: Response<Body> = exchange::forward(h, claimed, parts, body).await?;
    Ok((Outcome::Observed, response))
}
