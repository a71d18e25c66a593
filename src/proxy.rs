//! Proxy: streaming pass-through for routes (or requests) without idempotency.
//!
//! Neither body is buffered: the request streams to the upstream and the response streams
//! back, so large uploads and downloads cost the gateway no memory.
//!
//! A protocol upgrade (`Upgrade: websocket`) is bridged: the request goes upstream with its
//! `Upgrade` and `Connection: upgrade`, and when the upstream switches protocols (101), the
//! two connections are joined byte for byte until either side closes or nothing moves for
//! `idle_timeout`. (Idempotent routes refuse upgrades: a stream of messages has no single
//! answer to store.)

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Instant;

use crate::access::Notes;
use crate::body::{self, Body};
use crate::connection::Connection;
use crate::headers;
use crate::metrics::status_class;
use crate::runtime::Route;
use crate::upgrade;
use crate::upstream::{Upstream, UpstreamError};

/// Streams a request on a plain route to its upstream and back, timing the exchange for the
/// route's upstream latency and the access line.
pub async fn pass_through<B>(
    route: &Route,
    request: Request<B>,
    connection: &Arc<Connection>,
    notes: &mut Notes,
) -> Result<Response<Body>, UpstreamError>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let sent = Instant::now();
    let mut request = request;
    // Traced: the upstream gets the gateway's span as its parent.
    let span = notes.span.as_ref().map(|s| s.upstream(request.headers_mut()));
    let forwarded = send(&route.upstream, request.map(body::boxed), connection).await;
    if let Some(span) = span {
        match &forwarded {
            Ok(response) => {
                span.set("http.response.status_code", i64::from(response.status().as_u16()));
                span.end(None);
            }
            Err(e) => span.end(Some(e.to_string())),
        }
    }
    let class = forwarded.as_ref().map_or("error", |r| status_class(r.status()));
    let took = sent.elapsed();
    notes.upstream = Some(took);
    route.metrics.upstream_latency(class, took);
    forwarded
}

/// Forwards `request` to `upstream` and relays the response.
pub async fn send(
    upstream: &Upstream,
    mut request: Request<Body>,
    connection: &Arc<Connection>,
) -> Result<Response<Body>, UpstreamError> {
    let peer = &connection.peer;
    let upgrade = headers::upgrade_requested(request.headers());
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    upstream.prepare(&mut parts, peer);
    if let Some(protocol) = &upgrade {
        // Hop-by-hop, so `prepare` removed them; an upgrade is the one hop they are for.
        parts.headers.insert(UPGRADE, protocol.clone());
        parts.headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // The deadline covers the response head; the body then streams as long as it flows.
    let deadline = tokio::time::Instant::now() + upstream.timeout();
    let mut response = upstream.send(Request::from_parts(parts, body), deadline).await?;
    match client_side {
        Some(client_side) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            let upstream_side = hyper::upgrade::on(&mut response);
            let protocol = response.headers().get(UPGRADE).cloned();
            // The bridge holds the connection (and its place under max_connections) while
            // the switched protocol runs.
            tokio::spawn(upgrade::bridge(client_side, upstream_side, Arc::clone(connection)));
            let mut switched = relay(response);
            if let Some(protocol) = protocol {
                switched.headers_mut().insert(UPGRADE, protocol);
            }
            switched.headers_mut().insert(CONNECTION, HeaderValue::from_static("upgrade"));
            Ok(switched)
        }
        _ => Ok(relay(response)),
    }
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
