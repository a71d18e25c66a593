//! The admin listener's answers: plain text, JSON documents, and its own errors as
//! problem+json, like the proxy's.

use http::{HeaderValue, Response, StatusCode, header};

use crate::body::{self, Body};
use crate::error::Problem;
use crate::gateway::Gateway;

pub(super) fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

pub(super) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    // Plain data: serialising cannot fail.
    let mut r = Response::new(body::full(serde_json::to_string(value).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The admin listener's own errors (400, 401, 404, 405), as problem+json like the proxy's.
pub(super) fn problem(
    gw: &Gateway,
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: &str,
) -> Response<Body> {
    Problem::refused(status, slug, title, detail.to_owned()).respond(gw.problem_base())
}
