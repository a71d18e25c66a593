//! Proxy: streaming pass-through for routes (or requests) without idempotency.
//!
//! Neither body is buffered: the request streams to the upstream and the response streams
//! back, so large uploads and downloads cost the gateway no memory.

use http::{Request, Response};
use hyper::body::Incoming;

use crate::body::{self, Body};
use crate::forwarded::Peer;
use crate::headers;
use crate::upstream::{Upstream, UpstreamError};

/// Forwards `request` to `upstream` and relays the response.
pub async fn forward(
    upstream: &Upstream,
    request: Request<Body>,
    peer: &Peer,
) -> Result<Response<Body>, UpstreamError> {
    let (mut parts, body) = request.into_parts();
    upstream.prepare(&mut parts, peer);
    // The deadline covers the response head; the body then streams as long as it flows.
    let response = tokio::time::timeout(upstream.timeout(), upstream.send(Request::from_parts(parts, body)))
        .await
        .map_err(|_| upstream.timed_out())??;
    Ok(relay(response))
}

/// The upstream's response as the client gets it: hop-by-hop headers removed, and in the
/// client's protocol version rather than the upstream's (an HTTP/1.0 upstream must not turn
/// a client's keep-alive HTTP/1.1 connection into an HTTP/1.0 one).
pub fn relay(response: Response<Incoming>) -> Response<Body> {
    let (mut parts, incoming) = response.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    parts.version = http::Version::HTTP_11;
    Response::from_parts(parts, body::boxed(incoming))
}
