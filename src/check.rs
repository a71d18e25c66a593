//! Request checks: what a request must be before the gateway acts on it, in one place
//! ([`request`]).
//!
//! - Every request, before it is routed ([`host`]): an HTTP/1.1 request carries exactly one
//!   Host (RFC 9112 §3.2), and a request whose target names a host (`:authority`, an
//!   absolute-form target) names the same one in Host, if it sends one (RFC 9113 §8.3.1). The
//!   Host names the origin the client means; with none, two, or two that differ, the gateway
//!   and the upstream could each pick another.
//! - A request that carries an idempotency key on an idempotent route: its `Connection`
//!   header must not name a header the route reads, and it must not ask for a protocol
//!   upgrade. Hop-by-hop stripping
//!   would remove a named header before forwarding, so the upstream would see another request
//!   than the one fingerprinted: without the key its own UNIQUE constraint cannot work, without
//!   the credential it may act as someone else, without Content-Type it may read the body
//!   differently. And a switched protocol (a WebSocket) has no one answer to store.

use std::borrow::Cow;

use http::uri::Authority;
use http::{HeaderMap, HeaderValue, Request, Version, header};

use crate::config::Served;
use crate::error::GatewayError;
use crate::headers;
use crate::host;
use crate::policy::IdempotencyPolicy;
use crate::policy::scope::Source;

/// Refuses a request that the gateway must not act on; `policy` is the idempotency policy of
/// the route it matched, if any.
pub fn request<B>(request: &Request<B>, policy: Option<&IdempotencyPolicy>) -> Result<(), GatewayError> {
    match policy {
        Some(policy) if request.headers().contains_key(&policy.header) => keyed(request.headers(), policy),
        _ => Ok(()),
    }
}

/// The host `request` names, normalised (see [`crate::host`]), when the routes need it
/// (`by_host`) or its target names one; refuses an HTTP/1.1 request without exactly one Host
/// header, and a request that names two different hosts or a Host that is none.
pub fn host<B>(request: &Request<B>, by_host: bool) -> Result<Option<Cow<'_, str>>, GatewayError> {
    let hosts = request.headers().get_all(header::HOST);
    if request.version() == Version::HTTP_11 {
        let mut values = hosts.iter();
        match (values.next(), values.next()) {
            (Some(_), None) => {}
            (None, _) => {
                return Err(GatewayError::BadHost {
                    detail: "The request has no Host header. HTTP/1.1 requests carry exactly one.",
                });
            }
            (Some(_), Some(_)) => {
                return Err(GatewayError::BadHost {
                    detail: "The request has more than one Host header. HTTP/1.1 requests carry exactly one.",
                });
            }
        }
    }
    let authority = request.uri().authority().map(Authority::as_str);
    // Nothing to route on and nothing to compare (an origin-form target): today's request.
    if !by_host && authority.is_none() {
        return Ok(None);
    }
    host::of_request(authority, hosts.iter().map(HeaderValue::as_bytes))
        .map_err(|e| GatewayError::BadHost { detail: e.detail() })
}

/// Refuses a request for a host the certificate served on its connection does not cover (on
/// a listener that chooses among several): a client may reuse a connection for every host its
/// certificate covers, and only for those (RFC 9113 §9.1.1). 421 tells it to open a new one.
pub fn covered(host: Option<&str>, certificate: Option<&Served>) -> Result<(), GatewayError> {
    match (host, certificate) {
        (Some(host), Some(certificate)) if !certificate.covers(host) => {
            Err(GatewayError::Misdirected { host: host.to_owned() })
        }
        _ => Ok(()),
    }
}

/// Refuses a keyed request whose `Connection` names a header `policy` reads, or that asks to
/// switch protocols.
pub fn keyed(headers: &HeaderMap, policy: &IdempotencyPolicy) -> Result<(), GatewayError> {
    for token in headers::connection_tokens(headers) {
        let needed = [&policy.header, &header::CONTENT_TYPE, &header::CONTENT_LENGTH, &header::HOST]
            .into_iter()
            .cloned()
            .chain(policy.scope.sources().iter().map(Source::header))
            .chain(policy.fingerprint.headers.iter().cloned())
            .any(|name| name.as_str().eq_ignore_ascii_case(token));
        if needed {
            return Err(GatewayError::ConnectionHeader { header: token.to_ascii_lowercase() });
        }
    }
    if headers::upgrade_requested(headers).is_some() {
        return Err(GatewayError::UpgradeRefused);
    }
    Ok(())
}
