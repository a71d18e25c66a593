//! Identify: which record a request names, and what makes it this request.
//!
//! key → request checks → scope → bounded body → fingerprint → record key, and the owner
//! token its claim will carry. Both modes read a request alike, so that a retry sent after a
//! route switched from observing to enforcing matches its first request; they differ in what
//! a request that cannot be identified gets:
//!
//! | the request | enforce | observe |
//! |---|---|---|
//! | no key, `required` | 400 `key-missing` | forwarded, counted `missing_key` |
//! | no key, optional | forwarded as on a plain route | forwarded, counted `missing_key` |
//! | a malformed key | 400 `key-malformed` | forwarded, counted `malformed_key` |
//! | `Connection` names a header the route reads, an upgrade | 400 (checked by the gateway) | forwarded, counted `unsafe_headers` |
//! | no scope, `on_missing_scope = "reject"` | 400 `scope-missing` | forwarded, counted `missing_scope` |
//! | a body over `max_request_body` | 413 | forwarded as it comes, counted `too_large` |
//! | a body late or broken off | 408, 400 | forwarded as it came, counted `unread_body` |
//!
//! The attempt header is the gateway's word to the upstream: enforcing removes a client's,
//! observing forwards it as a plain route would, and neither fingerprints it.

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use hyper::body::Incoming;

use super::context::{Claimant, Ctx, Session};
use crate::body::{self, Body, Readout, Unread};
use crate::check;
use crate::error::GatewayError;
use crate::host;
use crate::metrics::{Outcome, Pin, Would};
use crate::policy::fingerprint::{self, Fingerprint};
use crate::policy::identity::PinHit;
use crate::policy::key::KeyError;
use crate::policy::{IdempotencyPolicy, Mode};
use crate::runtime::IdempotentRoute;
use crate::store::OwnerToken;

/// What identifying a request found.
#[allow(clippy::large_enum_variant)] // moved once; the keyed request is the common case, and a box would cost an allocation for it
pub enum Identified {
    /// A keyed request, read in full.
    Keyed(Ctx),
    /// A request to forward as a plain route would, unclaimed, and how it is counted: an
    /// enforcing route's request without its optional key (`passed_through`), or what an
    /// observing route cannot claim (`observed`, its `would` counted).
    Unclaimed(Outcome, Request<Body>),
}

/// Reads the key, checks and scopes the request, reads its body (bounded, within the body
/// deadline) and fingerprints it; on an enforcing route, what cannot be identified is the
/// error its client gets.
pub async fn identify(s: &mut Session<'_>, request: Request<Incoming>) -> Result<Identified, GatewayError> {
    let (route, policy) = (s.route, &*s.route.policy);
    let observing = policy.mode == Mode::Observe;
    // What an observing route forwards instead of refusing, counted.
    let mut unobserved = |would, request: Request<Body>| {
        route.metrics.observed(would);
        s.notes.observed = Some(would);
        Identified::Unclaimed(Outcome::Observed, request)
    };
    let key = match policy.key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if observing => return Ok(unobserved(Would::MissingKey, request.map(body::boxed))),
        Ok(None) if policy.required => return Err(KeyError::Missing { header: policy.header.clone() }.into()),
        Ok(None) => return Ok(Identified::Unclaimed(Outcome::PassedThrough, request.map(body::boxed))),
        Err(_) if observing => return Ok(unobserved(Would::MalformedKey, request.map(body::boxed))),
        Err(e) => return Err(e.into()),
    };
    // Enforced, the gateway checked these before routing here; observed, nothing refuses.
    if observing && check::keyed(request.headers(), policy).is_err() {
        return Ok(unobserved(Would::UnsafeHeaders, request.map(body::boxed)));
    }
    let host = policy.identity.needs_host().then(|| host::of_head(request.uri(), request.headers())).flatten();
    let scope = match policy.scope(request.headers(), host.as_deref(), policy.on_missing_scope) {
        Ok(scope) => scope,
        Err(_) if observing => return Ok(unobserved(Would::MissingScope, request.map(body::boxed))),
        Err(e) => return Err(e.into()),
    };
    count_pin(route, host.as_deref());
    drop(host);
    let (mut parts, incoming) = request.into_parts();
    let deadline = route.settings.body_read_timeout;
    let body = if observing {
        match body::read_or_pass(&parts.headers, incoming, policy.max_request_body, deadline).await {
            Readout::Whole(body) => body,
            Readout::Unread(why, body) => {
                let would = if why == Unread::TooLarge { Would::TooLarge } else { Would::UnreadBody };
                return Ok(unobserved(would, Request::from_parts(parts, body)));
            }
        }
    } else {
        body::read_bounded(&parts.headers, incoming, policy.max_request_body, deadline).await?
    };
    let (fingerprint, previous) = fingerprints(policy, &mut parts, &body);
    let record = s.rt.record_key(&policy.identity.name, &scope, &key);
    let claimant = Claimant { record, key, scope, fingerprint, previous, owner: OwnerToken::generate() };
    Ok(Identified::Keyed(Ctx { parts, body, claimant, claimed: None, slots: None }))
}

/// Counts a request whose record name a pin of the route's identity decides.
fn count_pin(route: &IdempotentRoute, host: Option<&str>) {
    match route.policy.identity.pin_hit(host) {
        Some(PinHit::Name) => route.metrics.pin_hit(Pin::Name),
        Some(PinHit::Host) => route.metrics.pin_hit(Pin::Host),
        None => {}
    }
}

/// The request's fingerprint under the route's identity, and under its previous fingerprint
/// settings where it has some that tell this request apart otherwise; never of the attempt
/// header, which enforcing removes here and observing forwards.
fn fingerprints(policy: &IdempotencyPolicy, parts: &mut Parts, body: &Bytes) -> (Fingerprint, Option<Fingerprint>) {
    let attempt = policy.attempt_header.as_ref().and_then(|name| parts.headers.remove(name));
    let identity = &policy.identity;
    let now = fingerprint::compute(&identity.name, &policy.fingerprint, parts, body);
    let previous =
        identity.previous_fingerprint.as_ref().map(|spec| fingerprint::compute(&identity.name, spec, parts, body));
    if let (Some(name), Some(value), Mode::Observe) = (&policy.attempt_header, attempt, policy.mode) {
        parts.headers.insert(name.clone(), value);
    }
    (now, previous.filter(|previous| *previous != now))
}
