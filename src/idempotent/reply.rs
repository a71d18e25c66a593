//! Reply: what the client gets, when the upstream answered it now and when the store does.
//!
//! A replay sends the stored status, headers and body exactly as stored, plus the replay
//! header, so that clients and logs can tell a replay from a first execution; it never
//! touches the upstream. It is framed by the gateway from the body it sends (no stored length
//! or transfer coding is ever sent), and a status without a body (204, 205, 304) goes out
//! without one. A first answer goes out as the upstream gave it, in the client's
//! protocol version, marked when its claim was taken over while it ran.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, header, response};

use crate::body::{self, Body};
use crate::error::Problem;
use crate::headers;
use crate::metrics::Outcome;
use crate::policy::errors::ErrorShape;
use crate::proxy::Expected;
use crate::store::StoredResponse;

/// What the idempotent path did with a request.
pub enum Served {
    /// Answered (by the upstream, the store or a refusal the gateway counts as served), and
    /// how the request is counted.
    Answered(Outcome, Response<Body>),
    /// Not claimed: to forward as a plain route would.
    Pass(Pass),
}

/// A request the idempotent path did not claim, to forward as a plain route would: an
/// enforcing route's request without its optional key, or anything an observing route does
/// not claim.
pub struct Pass {
    /// The request, whole.
    pub request: Request<Body>,
    /// How it is counted (`passed_through`, or `observed`).
    pub outcome: Outcome,
    /// A duplicate's answer, expected to be the one stored for its key.
    pub expected: Option<Expected>,
}

/// The header that tells a client how its key was handled when that is not plain: its
/// claim was taken over while the request ran (`lease-lost`), the store was bypassed, or its
/// answer was found by asking the upstream after it had been lost (`reconciled`).
pub const STATUS_HEADER: &str = "idempotency-status";

/// The response for a replayed request.
pub fn replay(stored: StoredResponse, replay_header: &HeaderName) -> Response<Body> {
    let StoredResponse { status, mut headers, body } = stored;
    // Framed from the body it sends, whatever the record holds: a record written by hand, by
    // an earlier version or through an earlier operator API may hold a `Content-Length` that
    // does not match its body, or a transfer coding, and replayed as is the next response on
    // the connection would start inside this one's body (response splitting); nor is
    // anything else a replay never carries (a cookie, a credential, a `Date`). This version
    // stores none of them, so the common case removes nothing.
    headers::strip(&mut headers, |name| headers::never_stored(name).is_some());
    headers.insert(replay_header.clone(), HeaderValue::from_static("true"));
    // No `Date`: it is never stored (`headers::storable`), so hyper dates the replay when it
    // is sent, not when the first answer was (RFC 9110 §6.6.1).
    let body = if headers::has_no_body(status) { body::full(Bytes::new()) } else { body::payload(body) };
    let mut response = Response::new(body);
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
    // The status sent, which `[errors.response-not-stored]` may have changed.
    if headers::has_no_body(response.status()) {
        // A 204 or 304 carries no problem document (nor its type).
        *response.body_mut() = body::full(Bytes::new());
        response.headers_mut().remove(header::CONTENT_TYPE);
    }
    for (name, value) in &head.headers {
        // The problem document brings its own type and length; the record's framing is never
        // replayed (see `replay`).
        let own = name == header::CONTENT_TYPE || name == header::CONTENT_LENGTH || name == header::CONTENT_ENCODING;
        if !own && headers::never_stored(name).is_none() {
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use http::{HeaderMap, StatusCode};
    use hyper_util::rt::TokioIo;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::body::Payload;

    /// The bytes a client reads from one HTTP/1.1 connection that carries two requests: the
    /// first answered with `first`, the second with `200 next`.
    async fn wire(first: Response<Body>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let first = Arc::new(Mutex::new(Some(first)));
        let service = hyper::service::service_fn(move |_request| {
            let first = first.lock().unwrap().take();
            async move { Ok::<_, Infallible>(first.unwrap_or_else(|| Response::new(body::full("next")))) }
        });
        let serving =
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service));
        client
            .write_all(
                b"POST /orders HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n\
                  POST /next HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_to_end(&mut out)).await;
        let _ = serving.await;
        out
    }

    /// One response read off `wire` by RFC 9112 §6.3, independently of the server that wrote
    /// it: its status and body, and what follows it. `Err` when it is not well framed.
    fn one_response(wire: &[u8]) -> Result<(u16, Vec<u8>, &[u8]), String> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(wire).map_err(|e| format!("{e}"))? {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => return Err("a partial head".into()),
        };
        let status = response.code.ok_or("no status")?;
        let rest = &wire[head..];
        if (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok((status, Vec::new(), rest));
        }
        let named = |name: &'static str| response.headers.iter().filter(move |h| h.name.eq_ignore_ascii_case(name));
        if named("transfer-encoding").next().is_some() {
            let mut body = Vec::new();
            let mut at = rest;
            loop {
                let line = at.windows(2).position(|w| w == b"\r\n").ok_or("a chunk without its size line")?;
                let size = std::str::from_utf8(&at[..line]).map_err(|e| e.to_string())?;
                let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|e| format!("chunk size {size:?}: {e}"))?;
                at = &at[line + 2..];
                if size == 0 {
                    let end = at.windows(2).position(|w| w == b"\r\n").ok_or("no end of the trailers")?;
                    return Ok((status, body, &at[end + 2..]));
                }
                body.extend_from_slice(at.get(..size).ok_or("a chunk cut short")?);
                at = at.get(size + 2..).ok_or("a chunk without its CRLF")?;
            }
        }
        let lengths: Vec<&[u8]> = named("content-length").map(|h| h.value).collect();
        let Some(first) = lengths.first() else { return Err("no framing: read until the connection closes".into()) };
        if lengths.iter().any(|l| l != first) {
            return Err(format!("{} differing Content-Length values", lengths.len()));
        }
        let length: usize = std::str::from_utf8(first)
            .ok()
            .and_then(|l| l.trim().parse().ok())
            .ok_or("a Content-Length that is no number")?;
        let body = rest.get(..length).ok_or("a body shorter than its Content-Length")?;
        Ok((status, body.to_vec(), &rest[length..]))
    }

    /// Headers a record might hold if written by hand or by an earlier version: framing,
    /// connection options, and plain ones.
    fn header() -> impl Strategy<Value = (&'static str, String)> {
        let value = "[ -~]{0,12}";
        prop_oneof![
            ("[0-9]{1,4}|[0-9]+, ?[0-9]+|-1|x").prop_map(|v| ("content-length", v)),
            prop_oneof![Just("chunked".to_owned()), Just("gzip, chunked".to_owned()), Just("gzip".to_owned())]
                .prop_map(|v| ("transfer-encoding", v)),
            prop_oneof![Just("close".to_owned()), Just("keep-alive".to_owned()), Just("x-extra".to_owned())]
                .prop_map(|v| ("connection", v)),
            value.prop_map(|v| ("content-type", v)),
            value.prop_map(|v| ("x-extra", v)),
            value.prop_map(|v| ("location", v)),
        ]
    }

    fn stored() -> impl Strategy<Value = StoredResponse> {
        (
            200u16..600,
            proptest::collection::vec(header(), 0..6),
            proptest::collection::vec(any::<u8>(), 0..200),
            1usize..4,
        )
            .prop_map(|(status, pairs, body, pieces)| {
                let mut headers = HeaderMap::new();
                for (name, value) in pairs {
                    if let Ok(value) = HeaderValue::from_str(value.trim()) {
                        headers.append(name, value);
                    }
                }
                let size = body.len().div_ceil(pieces).max(1);
                let body = Payload::from_pieces(body.chunks(size).map(Bytes::copy_from_slice).collect());
                StoredResponse { status: StatusCode::from_u16(status).unwrap(), headers, body }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Whatever a record holds, its replay is one well-formed response carrying the stored
        /// status and body (none for 204, 205 and 304), and the next request on the connection
        /// gets its own answer: no record can split a connection's responses.
        #[test]
        fn a_replay_is_one_response_whatever_the_record_holds(stored in stored()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (status, body) = (stored.status, stored.body.to_bytes());
            let bytes = runtime.block_on(wire(replay(stored, &HeaderName::from_static("idempotent-replay"))));
            let (got, got_body, rest) = one_response(&bytes).map_err(|e| TestCaseError::fail(format!("{e}: {:?}", String::from_utf8_lossy(&bytes))))?;
            prop_assert_eq!(got, status.as_u16());
            let expected = if headers::has_no_body(status) { Bytes::new() } else { body };
            prop_assert_eq!(Bytes::from(got_body), expected);
            let (next, next_body, after) = one_response(rest).map_err(TestCaseError::fail)?;
            prop_assert_eq!((next, next_body.as_slice()), (200, &b"next"[..]));
            prop_assert!(after.is_empty(), "{} bytes after the second response", after.len());
        }
    }

    #[tokio::test]
    async fn a_record_whose_length_lies_is_framed_from_its_body() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        let body = Payload::from(Bytes::from_static(b"{\"order_id\":1}"));
        let stored = StoredResponse { status: StatusCode::CREATED, headers, body };
        let bytes = wire(replay(stored, &HeaderName::from_static("idempotent-replay"))).await;
        let (status, body, rest) = one_response(&bytes).unwrap();
        assert_eq!((status, body.as_slice()), (201, &b"{\"order_id\":1}"[..]));
        assert_eq!(one_response(rest).unwrap().0, 200, "{:?}", String::from_utf8_lossy(&bytes));
    }

    #[tokio::test]
    async fn no_content_goes_out_without_a_body_or_a_length() {
        let body = Payload::from(Bytes::from_static(b"{\"order_id\":1}"));
        let stored = StoredResponse { status: StatusCode::NO_CONTENT, headers: HeaderMap::new(), body };
        let bytes = wire(replay(stored, &HeaderName::from_static("idempotent-replay"))).await;
        let text = String::from_utf8_lossy(&bytes).to_lowercase();
        let first = &text[..text.find("http/1.1 200").unwrap()];
        assert!(first.starts_with("http/1.1 204"), "{text}");
        assert!(!first.contains("content-length"), "{text}");
        assert!(!first.contains("order_id"), "{text}");
    }
}
