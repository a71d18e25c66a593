//! Answer: what the client gets, when the upstream answered it now and when the store does.
//!
//! A replay sends the stored status, headers and body exactly as stored, plus the replay
//! header, so that clients and logs can tell a replay from a first execution; it never
//! touches the upstream. A first answer goes out as the upstream gave it, in the client's
//! protocol version, marked when its claim was taken over while it ran.

use std::cell::RefCell;
use std::time::SystemTime;

use bytes::Bytes;
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
    headers.insert(header::DATE, now());
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
    response.headers_mut().insert(header::DATE, now());
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

/// `Date` for a replay: when it is sent, not when the first answer was (RFC 9110 §6.6.1).
///
/// Formatted once a second per thread, as hyper does for the answers it dates itself: an
/// HTTP date counts whole seconds, and formatting one cost each replay 1.2k instructions
/// (callgrind), a seventieth of the replay. A clone shares the formatted bytes.
fn now() -> HeaderValue {
    thread_local! {
        static DATE: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            // An HTTP date is ASCII: the value always parses.
            if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(httpdate::fmt_http_date(now))) {
                *cached = (second, value);
            }
        }
        cached.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parsed(value: &HeaderValue) -> SystemTime {
        httpdate::parse_http_date(value.to_str().unwrap()).unwrap()
    }

    #[test]
    fn a_replays_date_is_the_current_second_though_formatted_once_a_second() {
        let first = parsed(&now());
        let lag = |t: SystemTime| SystemTime::now().duration_since(t).unwrap_or_default();
        assert!(lag(first) < Duration::from_secs(2), "the cached date is the clock's");
        let again = parsed(&now());
        assert!(again == first || again == first + Duration::from_secs(1), "within the second, the same value");
        std::thread::sleep(Duration::from_millis(1100));
        let later = parsed(&now());
        assert!(later > first, "the next second is formatted anew");
        assert!(lag(later) < Duration::from_secs(2));
    }
}
