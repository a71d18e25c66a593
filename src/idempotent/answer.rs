//! Answer: what the client gets, when the upstream answered it now and when the store does.
//!
//! A replay sends the stored status, headers and body exactly as stored, plus the replay
//! header, so that clients and logs can tell a replay from a first execution; it never
//! touches the upstream. A first answer goes out as the upstream gave it, in the client's
//! protocol version, marked when its claim was taken over while it ran.

use http::{HeaderName, HeaderValue, Response, header, response};

use crate::body::{self, Body};
use crate::error::Problem;
use crate::metrics::Outcome;
use crate::policy::errors::ErrorShape;
use crate::store::StoredResponse;

/// How a request is counted, and its response.
pub type Served = (Outcome, Response<Body>);

/// The header that tells a client how its key was handled when that is not plain: its
/// claim was taken over while the request ran (`lease-lost`), the store was bypassed, or its
/// answer was found by asking the upstream after it had been lost (`reconciled`).
pub const STATUS_HEADER: &str = "idempotency-status";

/// The response for a replayed request.
pub fn replay(stored: StoredResponse, replay_header: &HeaderName) -> Response<Body> {
    let StoredResponse { status, mut headers, body } = stored;
    headers.insert(replay_header.clone(), HeaderValue::from_static("true"));
    // No `Date`: it is never stored (`headers::storable`), so hyper dates the replay when it
    // is sent, not when the first answer was (RFC 9110 §6.6.1).
    let mut response = Response::new(body::payload(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The response for a retry whose key was unknown and is now settled by asking the upstream
/// (or by an operator): a replay, marked `Idempotency-Status: reconciled`.
pub fn reconciled(stored: StoredResponse, replay_header: &HeaderName) -> Response<Body> {
    let mut response = replay(stored, replay_header);
    response.headers_mut().insert(STATUS_HEADER, HeaderValue::from_static("reconciled"));
    response
}

/// The response for a retry of a request that ran but whose body was too large to store: a
/// problem `response-not-stored` with the original status and the stored headers (a
/// `Location` still says where the resource is), and the replay header. Never a re-run.
pub fn not_stored(
    head: StoredResponse,
    replay_header: &HeaderName,
    problem_base: &str,
    shape: &ErrorShape,
) -> Response<Body> {
    let mut response = Problem::not_stored(head.status).respond_as(problem_base, shape);
    for (name, value) in &head.headers {
        // The problem document brings its own type and length.
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH && name != header::CONTENT_ENCODING {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response.headers_mut().insert(replay_header.clone(), HeaderValue::from_static("true"));
    // Dated by hyper when it is sent, as a replay is (`Date` is never stored).
    response
}

/// The upstream's answer as the first client gets it (hop-by-hop headers were stripped as it
/// arrived).
pub fn first(mut parts: response::Parts, body: Body, lease_lost: bool) -> Response<Body> {
    // The client's protocol version, not the upstream's (see `proxy::relay`).
    parts.version = http::Version::HTTP_11;
    if lease_lost {
        parts.headers.insert(STATUS_HEADER, HeaderValue::from_static("lease-lost"));
    }
    Response::from_parts(parts, body)
}
