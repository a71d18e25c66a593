//! Header hygiene at the two borders of the proxy.
//!
//! Hop-by-hop headers describe one connection and must not cross the proxy (RFC 9110 §7.6.1):
//! forwarding `Connection`, `Transfer-Encoding` or `Upgrade` invites request smuggling and
//! broken framing. Stored responses get a stricter filter still: a replay must never hand one
//! client's session cookie or credential challenge to whoever retries.

use http::header::{self, HeaderMap, HeaderName};

/// Whether `name` is always hop-by-hop, whatever `Connection` says. A match on the name,
/// not a table of `HeaderName`s: a `const` table is built and dropped at every use, and this
/// runs for every header of every request.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The tokens of every `Connection` header, trimmed, empty ones skipped. The one reading of
/// `Connection` that stripping, the upgrade check and the idempotent route's check share, so
/// they cannot disagree on what a request names.
pub fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

/// The protocol a request asks to switch to: `Upgrade` with `upgrade` among the `Connection`
/// tokens (RFC 9110 §7.8).
pub fn upgrade_requested(headers: &HeaderMap) -> Option<http::HeaderValue> {
    let asks = connection_tokens(headers).any(|token| token.eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned()).flatten()
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, |_| false);
}

/// Removes hop-by-hop headers, every header named in `Connection`, and every header `also`
/// picks, in one scan of the map: each header name is looked at once, and only the names
/// found are removed (a request rarely carries any of them, so the common case removes
/// nothing and allocates nothing).
pub fn strip(headers: &mut HeaderMap, also: impl Fn(&HeaderName) -> bool) {
    let named = headers.contains_key(header::CONNECTION);
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            is_hop_by_hop(name)
                || also(name)
                || (named && connection_tokens(headers).any(|token| token.eq_ignore_ascii_case(name.as_str())))
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// Whether an answer with `status` has no body, so that a replay sends none and no length:
/// 204 No Content, 205 Reset Content and 304 Not Modified (RFC 9110 §15.3.5, §15.3.6,
/// §15.4.5), and the informational statuses.
pub fn has_no_body(status: http::StatusCode) -> bool {
    use http::StatusCode;
    status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::RESET_CONTENT | StatusCode::NOT_MODIFIED)
}

/// Why a response header is never stored for replay, whatever a route says; `None` for one
/// that may be. A replay must never hand one client's session cookie or credential challenge
/// to whoever retries, nor carry anything of one connection or a framing of its own.
pub fn never_stored(name: &HeaderName) -> Option<&'static str> {
    if is_hop_by_hop(name) {
        return Some("it describes one connection (hop-by-hop), and a replay is framed by the gateway");
    }
    match name.as_str() {
        // A length that does not match the body replayed with it splits the connection's
        // responses; the replay is framed from the body it sends.
        "content-length" => Some("a replay is framed from the body it sends"),
        "set-cookie" | "set-cookie2" => Some("a replay would hand one client's session to whoever retries"),
        "www-authenticate" | "authentication-info" => Some("it is a credential or a challenge for one client"),
        "date" => Some("a replay is dated when it is sent"),
        n if n.starts_with("proxy-") => Some("it is meant for a proxy, not for the client"),
        _ => None,
    }
}

/// Which response headers a route stores for replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredHeaders {
    /// `replay_headers`: when set, only these are stored (still never the ones above).
    pub allow: Option<Vec<HeaderName>>,
    /// `exclude_headers`: never stored, besides the ones above.
    pub exclude: Vec<HeaderName>,
}

impl StoredHeaders {
    /// Whether the route's own lists let `name` be stored (the fixed list aside).
    pub fn stores(&self, name: &HeaderName) -> bool {
        !self.exclude.contains(name) && self.allow.as_ref().is_none_or(|allow| allow.contains(name))
    }
}

/// The headers of an upstream response that may be stored and replayed. `headers` come
/// without their hop-by-hop headers (the exchange strips them once, as the response
/// arrives); the fixed hop-by-hop names are left out here as well, so that nothing of the
/// one connection is ever stored.
pub fn storable(headers: &HeaderMap, policy: &StoredHeaders) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter().filter(|(name, _)| never_stored(name).is_none() && policy.stores(name)) {
        out.append(name.clone(), value.clone());
    }
    out
}

/// A header map from `(name, value)` pairs, in order, for unit tests.
#[cfg(test)]
pub(crate) fn test_map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::test_map as map;
    use super::*;

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("idempotency-key", "\"k\""),
            ("content-type", "application/json"),
        ]);
        strip_hop_by_hop(&mut h);
        // The order of fields with different names carries no meaning (RFC 9110 §5.3), and
        // removing one may move another.
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "idempotency-key"]);
    }

    #[test]
    fn stored_headers_drop_cookies_challenges_proxy_and_excluded() {
        let h = map(&[
            ("content-type", "application/json"),
            ("set-cookie", "session=abc"),
            ("www-authenticate", "Bearer"),
            ("proxy-authenticate", "Basic"),
            ("proxy-status", "x"),
            ("transfer-encoding", "chunked"),
            ("x-internal-trace", "t"),
            ("location", "/orders/1"),
            ("content-length", "9"),
        ]);
        let policy = StoredHeaders { allow: None, exclude: vec![HeaderName::from_static("x-internal-trace")] };
        let kept = storable(&h, &policy);
        let names: Vec<_> = kept.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "location"]);
    }

    #[test]
    fn credentials_of_every_kind_and_the_date_are_never_stored() {
        let h = map(&[
            ("set-cookie2", "a=b"),
            ("authentication-info", "nextnonce=x"),
            ("proxy-authentication-info", "y"),
            ("date", "Mon, 30 Nov 2026 10:00:00 GMT"),
            ("content-type", "application/json"),
        ]);
        let kept = storable(&h, &StoredHeaders::default());
        assert_eq!(kept.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["content-type"]);
    }

    #[test]
    fn an_allowlist_stores_only_what_it_names() {
        let h = map(&[("content-type", "a/b"), ("location", "/o/1"), ("x-trace", "t"), ("set-cookie", "s=1")]);
        let allow = ["content-type", "location", "set-cookie"].map(HeaderName::from_static).to_vec();
        let kept = storable(&h, &StoredHeaders { allow: Some(allow), exclude: vec![] });
        assert_eq!(kept.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["content-type", "location"]);
    }
}
