//! How a request is addressed to an upstream: the URI it carries (the scheme, the base URL's
//! path, the pool's key in place of a cleartext authority), `Host`, and the headers it is sent
//! with (`X-Forwarded-*`, hop-by-hop ones dropped).

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Uri, Version, request};

use crate::forwarded::{self, Peer};

/// The authority every request to a cleartext upstream carries on its way into the pooled
/// client: the pool's key, not an address.
///
/// Why: hyper-util's pool hashes the authority byte by byte three times per request (figures in
/// docs/performance.md), and each `Upstream` has a client of its own, so one letter tells as
/// much apart. Hazard: the key must never reach the wire: the connector (`Dial`) connects to
/// the real address, `Host` is set from the real authority, and HTTP/1 goes out in origin
/// form. Upstreams over TLS keep their real authority (their certificate's name, HTTP/2's
/// `:authority`).
pub(super) const POOL_KEY: Authority = Authority::from_static("u");

/// Where every request to one upstream goes, whichever of its instances sends it.
pub(super) struct Target {
    pub(super) scheme: Scheme,
    /// Path prefix of the base URL without its trailing slash ("" for none), the same for
    /// every instance.
    pub(super) base_path: String,
    /// What a prepared request's URI carries: the first instance's `key`; another instance
    /// puts its own when it sends.
    pub(super) key: Authority,
}

impl Target {
    /// The head of the client's request made the upstream's, as `Upstream::prepare` tells.
    pub(super) fn rewrite(&self, parts: &mut request::Parts, peer: &Peer) {
        // Host names the upstream; the client's Host travels as X-Forwarded-Host.
        let original_host: Option<HeaderValue> = parts
            .headers
            .remove(http::header::HOST)
            .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
        parts.uri = self.uri(&parts.uri);
        // The connection to the upstream is ours: HTTP/1.1 framing, or h2 if ALPN agrees,
        // whatever the client spoke to us.
        parts.version = Version::HTTP_11;
        // Hop-by-hop headers go in the same scan.
        forwarded::apply(&mut parts.headers, peer, original_host.as_ref());
    }

    /// The URI of a request to this upstream, from the client's: its path under the base path.
    fn uri(&self, original: &Uri) -> Uri {
        let path_and_query = match original.path_and_query() {
            // The common case: no prefix, and the client's path-and-query is reused as parsed.
            Some(pq) if self.base_path.is_empty() => Some(pq.clone()),
            pq => {
                let joined = format!("{}{}", self.base_path, pq.map_or("/", PathAndQuery::as_str));
                // A valid path-and-query: the prefix comes from a parsed URL, the rest from one.
                joined.parse().ok().or_else(|| pq.cloned())
            }
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.key.clone());
        parts.path_and_query = path_and_query;
        Uri::from_parts(parts).unwrap_or_else(|_| original.clone())
    }
}

/// The `Host` of a request to `authority`, as hyper-util's client writes it: the port only
/// when it is not the cleartext default.
pub(super) fn host_header(authority: &Authority) -> String {
    match authority.port_u16() {
        Some(port) if port != 80 => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_the_authority_without_the_default_port() {
        let host = |a: &'static str| host_header(&Authority::from_static(a));
        assert_eq!(host("127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(host("orders.internal:80"), "orders.internal");
        assert_eq!(host("orders.internal"), "orders.internal");
        assert_eq!(host("[::1]:9000"), "[::1]:9000");
    }
}
