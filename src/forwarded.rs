//! Forwarding headers: who the client is, as the upstream learns it.
//!
//! The hazard: `Forwarded`, `X-Forwarded-For`, `X-Forwarded-Host`, `X-Forwarded-Proto` and
//! `X-Real-IP` are plain request headers, so any client can send them. An upstream that trusts
//! them for rate limits, audit logs or redirects can be lied to through the gateway. So they
//! are believed only from a peer in `server.trusted_proxies` (a load balancer in front of the
//! gateway), whose entries are kept and appended to. From anyone else they are dropped and
//! replaced by what the gateway itself saw.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Networks whose forwarding headers are believed (`server.trusted_proxies`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Network>);

/// One CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Network {
    base: IpAddr,
    prefix: u8,
}

impl TrustedProxies {
    /// Parses `["10.0.0.0/8", "192.168.1.7", "fd00::/8"]`; an address without a prefix is one
    /// host.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        entries.iter().map(|e| parse_network(e.as_ref())).collect::<Result<_, _>>().map(Self)
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }
}

fn parse_network(text: &str) -> Result<Network, String> {
    let bad = || format!("{text:?} is not an IP address or a CIDR block like \"10.0.0.0/8\"");
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let base: IpAddr = addr.trim().parse().map_err(|_| bad())?;
    let max = if base.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
        None => max,
    };
    let network = Network { base, prefix };
    if network.masked(base) != base {
        return Err(format!("{text:?} has host bits set; write the network, e.g. {}/{prefix}", network.masked(base)));
    }
    Ok(network)
}

impl Network {
    fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 peer may arrive as an IPv4-mapped IPv6 address on a dual-stack listener.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        ip.is_ipv4() == self.base.is_ipv4() && self.masked(ip) == self.base
    }

    fn masked(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

/// The client at the other end of a connection, rendered once per connection.
#[derive(Debug, Clone)]
pub struct Peer {
    ip: IpAddr,
    /// Its address as an `X-Forwarded-For` entry.
    plain: HeaderValue,
    /// Its `Forwarded` element (`for=192.0.2.1`, `for="[2001:db8::1]"`).
    element: String,
    /// Whether its forwarding headers are believed.
    trusted: bool,
    /// The scheme it reached the gateway with.
    proto: &'static str,
}

impl Peer {
    /// Whether this client is a trusted proxy (its forwarding headers, and its trace sampling
    /// decision, are believed).
    pub fn trusted(&self) -> bool {
        self.trusted
    }

    /// The peer of an accepted connection.
    pub fn new(addr: std::net::SocketAddr, trusted: &TrustedProxies) -> Self {
        let ip = addr.ip();
        // An IP address is always a valid header value; the fallback is unreachable.
        let plain = HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        let element = match ip {
            IpAddr::V4(v4) => format!("for={v4}"),
            IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
        };
        Self { ip, plain, element, trusted: trusted.trusts(ip), proto: "http" }
    }

    /// The same peer on a TLS listener (`X-Forwarded-Proto: https`).
    pub fn over_tls(mut self) -> Self {
        self.proto = "https";
        self
    }

    /// The peer's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

/// Readies a request's headers for the upstream: removes, in one scan, the hop-by-hop
/// headers and (from a peer that is not a trusted proxy) every forwarding header the client
/// sent about itself, then sets the forwarding headers. `host` is the Host (or `:authority`)
/// the client asked for; the scheme is the one the peer used.
pub fn apply(headers: &mut HeaderMap, peer: &Peer, host: Option<&HeaderValue>) {
    let proto = peer.proto;
    let untrusted = !peer.trusted;
    crate::headers::strip(headers, |name| untrusted && is_client_claim(name));
    // From anyone but a trusted proxy the client's own entries are gone: nothing to chain.
    let chained = peer
        .trusted
        .then(|| headers.get(&X_FORWARDED_FOR))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .filter(|prior| !prior.trim().is_empty())
        .and_then(|prior| HeaderValue::from_str(&format!("{prior}, {}", peer.ip)).ok());
    headers.insert(X_FORWARDED_FOR, chained.unwrap_or_else(|| peer.plain.clone()));

    // Sized once: this runs for every request.
    let host_text = host.and_then(|h| h.to_str().ok()).filter(|h| is_token_or_host(h));
    let mut element =
        String::with_capacity(peer.element.len() + 7 + proto.len() + host_text.map_or(0, |h| 6 + h.len()));
    element.push_str(&peer.element);
    element.push_str(";proto=");
    element.push_str(proto);
    if let Some(host) = host_text {
        element.push_str(";host=");
        element.push_str(host);
    }
    let prior = peer.trusted.then(|| headers.get(header::FORWARDED)).flatten();
    let forwarded = match prior.and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {element}"),
        _ => element,
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded) {
        headers.insert(header::FORWARDED, value);
    }
    // A trusted proxy's view of the original scheme, host and client wins over ours. (From
    // anyone else these headers were stripped above: no need to look for them.)
    if untrusted || !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let Some(host) = host
        && (untrusted || !headers.contains_key(&X_FORWARDED_HOST))
    {
        headers.insert(X_FORWARDED_HOST, host.clone());
    }
    if untrusted || !headers.contains_key(&X_REAL_IP) {
        headers.insert(X_REAL_IP, peer.plain.clone());
    }
}

/// Whether `name` is a forwarding header, which a client could send about itself.
fn is_client_claim(name: &HeaderName) -> bool {
    name == header::FORWARDED || name == X_REAL_IP || name.as_str().starts_with("x-forwarded-")
}

/// Whether a Host value can stand unquoted in a `Forwarded` element (RFC 7239 §4).
fn is_token_or_host(host: &str) -> bool {
    !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:_~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_map as map;

    fn trusted(entries: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(entries).unwrap()
    }

    #[test]
    fn networks_parse_and_match() {
        let t = trusted(&["10.0.0.0/8", "192.168.1.7", "fd00::/8"]);
        for ip in ["10.1.2.3", "192.168.1.7", "fd12::1", "::ffff:10.0.0.1"] {
            assert!(t.trusts(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["11.0.0.1", "192.168.1.8", "fe80::1", "127.0.0.1"] {
            assert!(!t.trusts(ip.parse().unwrap()), "{ip}");
        }
        assert!(trusted(&["0.0.0.0/0"]).trusts("203.0.113.9".parse().unwrap()));
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "ten", "10.0.0.0/x", ""] {
            assert!(TrustedProxies::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_untrusted_client_cannot_speak_for_itself() {
        let none = TrustedProxies::default();
        let peer = Peer::new("203.0.113.9:5000".parse().unwrap(), &none);
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-port", "443"),
            ("x-real-ip", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
        ]);
        let host = HeaderValue::from_static("shop.example");
        apply(&mut h, &peer, Some(&host));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9");
        assert_eq!(h["x-forwarded-host"], "shop.example");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-real-ip"], "203.0.113.9");
        assert_eq!(h["forwarded"], "for=203.0.113.9;proto=http;host=shop.example");
        assert!(h.get("x-forwarded-port").is_none());
    }

    #[test]
    fn a_trusted_proxy_is_appended_to() {
        let lb = trusted(&["10.0.0.0/8"]);
        let peer = Peer::new("10.0.0.2:5000".parse().unwrap(), &lb);
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-real-ip", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9;proto=https"),
        ]);
        apply(&mut h, &peer, Some(&HeaderValue::from_static("shop.example")));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.2");
        assert_eq!(h["x-forwarded-proto"], "https", "the proxy saw the client's scheme");
        assert_eq!(h["x-real-ip"], "203.0.113.9");
        assert_eq!(h["forwarded"], "for=203.0.113.9;proto=https, for=10.0.0.2;proto=http;host=shop.example");
    }

    #[test]
    fn ipv6_peers_are_quoted_in_forwarded() {
        let peer = Peer::new("[2001:db8::1]:5000".parse().unwrap(), &TrustedProxies::default());
        let mut h = HeaderMap::new();
        apply(&mut h, &peer, None);
        assert_eq!(h["forwarded"], "for=\"[2001:db8::1]\";proto=http");
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        assert!(h.get("x-forwarded-host").is_none());
    }
}
