//! Request checks: what a request must be before the gateway acts on it, in one place
//! ([`request`]).
//!
//! - Every request: an HTTP/1.1 request carries exactly one Host (RFC 9112 §3.2). The Host
//!   names the origin the client means; with none or two, the gateway and the upstream could
//!   each pick another.
//! - A request that carries an idempotency key on an idempotent route: its `Connection`
//!   header must not name a header the route reads, and it must not ask for a protocol
//!   upgrade. Hop-by-hop stripping
//!   would remove a named header before forwarding, so the upstream would see another request
//!   than the one fingerprinted: without the key its own UNIQUE constraint cannot work, without
//!   the credential it may act as someone else, without Content-Type it may read the body
//!   differently. And a switched protocol (a WebSocket) has no one answer to store.

use http::{HeaderMap, Request, Version, header};

use crate::error::GatewayError;
use crate::headers;
use crate::policy::IdempotencyPolicy;
use crate::policy::scope::Source;

/// Refuses a request that the gateway must not act on; `policy` is the idempotency policy of
/// the route it matched, if any.
pub fn request<B>(request: &Request<B>, policy: Option<&IdempotencyPolicy>) -> Result<(), GatewayError> {
    host(request)?;
    match policy {
        Some(policy) if request.headers().contains_key(&policy.header) => keyed(request.headers(), policy),
        _ => Ok(()),
    }
}

/// Refuses an HTTP/1.1 request without exactly one Host header.
fn host<B>(request: &Request<B>) -> Result<(), GatewayError> {
    if request.version() != Version::HTTP_11 {
        return Ok(());
    }
    match request.headers().get_all(header::HOST).iter().count() {
        1 => Ok(()),
        0 => Err(GatewayError::BadHost { detail: "The request has no Host header." }),
        _ => Err(GatewayError::BadHost { detail: "The request has more than one Host header." }),
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
