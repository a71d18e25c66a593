//! Identify: which record a request names, and what makes it this request.
//!
//! key → scope → bounded body → fingerprint → record key, and the owner token its claim will
//! carry (the request was checked before it was routed here). A request without a key is not the idempotent path's when the route's
//! key is optional: it goes through as on a plain route.

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use hyper::body::Incoming;

use super::context::Claimant;
use crate::body;
use crate::error::GatewayError;
use crate::host;
use crate::metrics::Pin;
use crate::policy::fingerprint::{self, Fingerprint};
use crate::policy::identity::PinHit;
use crate::policy::key::KeyError;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::OwnerToken;

/// What identifying a request found.
pub enum Identity {
    /// A keyed request, read in full.
    Keyed(Identified),
    /// No key, on a route where it is optional.
    Unkeyed(Request<Incoming>),
}

/// A keyed request, read and named.
pub struct Identified {
    /// Its head, without a client's attempt header.
    pub parts: Parts,
    /// Its whole body.
    pub body: Bytes,
    /// Who claims its key.
    pub claimant: Claimant,
}

/// Reads the key, derives the scope, reads its body (bounded, within the
/// body deadline) and fingerprints it.
pub async fn identify(
    rt: &Runtime,
    route: &IdempotentRoute,
    request: Request<Incoming>,
) -> Result<Identity, GatewayError> {
    let policy = &route.policy;
    let Some(key) = policy.key(request.headers())? else {
        if policy.required {
            return Err(KeyError::Missing { header: policy.header.clone() }.into());
        }
        return Ok(Identity::Unkeyed(request));
    };
    let (mut parts, body) = request.into_parts();
    // The attempt header is the gateway's word to the upstream, never the client's.
    if let Some(name) = &policy.attempt_header {
        parts.headers.remove(name);
    }
    let host = policy.identity.needs_host().then(|| host::of_head(&parts.uri, &parts.headers)).flatten();
    let scope = policy.scope(&parts.headers, host.as_deref(), policy.on_missing_scope)?;
    count_pin(route, host.as_deref());
    drop(host);
    let body =
        body::read_bounded(&parts.headers, body, policy.max_request_body, route.settings.body_read_timeout).await?;
    let (fingerprint, previous) = fingerprints(route, &parts, &body);
    let record = rt.record_key(&policy.identity.name, &scope, &key);
    let claimant = Claimant { record, key, scope, fingerprint, previous, owner: OwnerToken::generate() };
    Ok(Identity::Keyed(Identified { parts, body, claimant }))
}

/// Counts a request whose record name a pin of the route's identity decides.
pub(super) fn count_pin(route: &IdempotentRoute, host: Option<&str>) {
    match route.policy.identity.pin_hit(host) {
        Some(PinHit::Name) => route.metrics.pin_hit(Pin::Name),
        Some(PinHit::Host) => route.metrics.pin_hit(Pin::Host),
        None => {}
    }
}

/// The request's fingerprint under the route's identity, and under its previous fingerprint
/// settings where it has some that tell this request apart otherwise.
pub(super) fn fingerprints(route: &IdempotentRoute, parts: &Parts, body: &[u8]) -> (Fingerprint, Option<Fingerprint>) {
    let identity = &route.policy.identity;
    let now = fingerprint::compute(&identity.name, &route.policy.fingerprint, parts, body);
    let previous =
        identity.previous_fingerprint.as_ref().map(|spec| fingerprint::compute(&identity.name, spec, parts, body));
    (now, previous.filter(|previous| *previous != now))
}
