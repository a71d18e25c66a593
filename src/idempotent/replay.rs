//! Replay: answering a retry from the store.
//!
//! The stored status, headers and body go out exactly as stored, plus the replay header so
//! that clients and logs can tell a replay from a first execution. A replay never touches
//! the upstream.

use http::{HeaderName, HeaderValue, Response};

use crate::body::{self, Body};
use crate::store::StoredResponse;

/// The response for a replayed request.
pub fn respond(stored: StoredResponse, replay_header: &HeaderName) -> Response<Body> {
    let StoredResponse { status, mut headers, body } = stored;
    headers.insert(replay_header.clone(), HeaderValue::from_static("true"));
    let mut response = Response::new(body::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
