//! Replay: answering a retry from the store.
//!
//! The stored status, headers and body go out exactly as stored, plus the replay header so
//! that clients and logs can tell a replay from a first execution. A replay never touches
//! the upstream.

use http::{HeaderName, HeaderValue, Response, header};

use crate::body::{self, Body};
use crate::error::{self, GatewayError};
use crate::store::StoredResponse;

/// The response for a replayed request.
pub fn respond(stored: StoredResponse, replay_header: &HeaderName) -> Response<Body> {
    let StoredResponse { status, mut headers, body } = stored;
    headers.insert(replay_header.clone(), HeaderValue::from_static("true"));
    headers.insert(header::DATE, now());
    let mut response = Response::new(body::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The response for a retry of a request that ran but whose body was too large to store: a
/// problem `response-not-stored` with the original status and the stored headers (a
/// `Location` still says where the resource is), and the replay header. Never a re-run.
pub fn not_stored(head: StoredResponse, replay_header: &HeaderName, problem_base: &str) -> Response<Body> {
    let mut response = error::respond(&GatewayError::ResponseNotStored { status: head.status }, problem_base);
    for (name, value) in &head.headers {
        // The problem document brings its own type and length.
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH && name != header::CONTENT_ENCODING {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response.headers_mut().insert(replay_header.clone(), HeaderValue::from_static("true"));
    response.headers_mut().insert(header::DATE, now());
    response
}

/// `Date` for a replay: when it is sent, not when the first answer was (RFC 9110 §6.6.1).
fn now() -> HeaderValue {
    // An HTTP date is ASCII; the fallback is unreachable.
    HeaderValue::from_str(&httpdate::fmt_http_date(std::time::SystemTime::now()))
        .unwrap_or(HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}
