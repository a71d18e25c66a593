//! Identify: which record a request names, and what makes it this request.
//!
//! key → scope → bounded body → fingerprint → record key (the request was checked before it
//! was routed here). A request without a key is not the idempotent path's when the route's
//! key is optional: it goes through as on a plain route.

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use hyper::body::Incoming;

use crate::body;
use crate::error::GatewayError;
use crate::policy::fingerprint::{self, Fingerprint};
use crate::policy::key::{IdempotencyKey, KeyError};
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::RecordKey;

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
    /// Its key.
    pub key: IdempotencyKey,
    /// Whose key it is.
    pub scope: Scope,
    /// What makes it this request.
    pub fingerprint: Fingerprint,
    /// The store's name for its key.
    pub record: RecordKey,
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
    let scope = policy.scope(&parts.headers, policy.on_missing_scope)?;
    let body =
        body::read_bounded(&parts.headers, body, policy.max_request_body, route.settings.body_read_timeout).await?;
    let fingerprint = fingerprint::compute(&route.name, &policy.fingerprint, &parts, &body);
    let record = rt.record_key(&route.name, &scope, &key);
    Ok(Identity::Keyed(Identified { parts, body, key, scope, fingerprint, record }))
}
