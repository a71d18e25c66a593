//! Hosts: the origin a request names, and the host patterns a route serves.
//!
//! A request names its host in `Host` (HTTP/1.1), in `:authority` (HTTP/2, which hyper puts
//! in the URI) or in an absolute-form target (HTTP/1.1 through a proxy). Compared and routed
//! on, a host is lower-case, without its port and without a trailing dot (`API.Example.com.:443`
//! is `api.example.com`): the same origin however the client spells it (RFC 9110 §4.2.3).
//!
//! The hazard: a request that names two hosts (`:authority: a.example.com` with `Host:
//! b.example.com`, or an absolute-form target and a Host that differ) lets the gateway route
//! on one while the upstream, or a cache between, believes the other. Such a request is
//! refused, never guessed at (RFC 9113 §8.3.1).

use std::borrow::Cow;
use std::fmt;

/// A host a route serves: a name (`api.example.com`, or an IP address) or every name under a
/// domain (`*.example.com`: `a.example.com` and `a.b.example.com`, not `example.com` itself,
/// as nginx and Envoy match them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// One host, normalised.
    Exact(String),
    /// Every host under a domain: the suffix with its leading dot (`.example.com`).
    Wildcard(String),
}

impl HostPattern {
    /// Parses a `hosts` entry; the error says what is wrong in the config's terms.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("an empty host; leave `hosts` out to serve every host".into());
        }
        if trimmed == "*" {
            return Err("\"*\" is every host: leave `hosts` out instead".into());
        }
        if trimmed.contains("://") || trimmed.contains('/') {
            return Err(format!("{text:?} is a URL; write the host alone, like \"api.example.com\""));
        }
        let (wildcard, name) = match trimmed.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, trimmed),
        };
        if name.contains('*') {
            return Err(format!(
                "{text:?}: a wildcard is a whole first label, written \"*.example.com\"; no other '*' is allowed"
            ));
        }
        let Some(host) = normalize(name) else {
            // Clients send an internationalised name in its ASCII form (RFC 5890), and so
            // must the route name it.
            if !name.is_ascii() {
                return Err(format!(
                    "{text:?} is not ASCII: write an internationalised name in its ASCII form (\"xn--...\"), as clients send it"
                ));
            }
            return Err(format!("{text:?} is not a host name (letters, digits, '-', '_' and dots) or an IP address"));
        };
        if host.len() != name.trim_end_matches('.').len() {
            return Err(format!("{text:?} has a port; a route matches its host on every port, so leave the port out"));
        }
        if wildcard {
            if host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok() {
                return Err(format!("{text:?}: a wildcard stands for names under a domain, not for addresses"));
            }
            if !host.contains('.') {
                return Err(format!(
                    "{text:?} would match every name under a top-level domain; name the domain, like \"*.example.com\""
                ));
            }
            return Ok(Self::Wildcard(format!(".{host}")));
        }
        Ok(Self::Exact(host.into_owned()))
    }

    /// Whether `host` (normalised) is one this pattern serves.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Exact(name) => name == host,
            Self::Wildcard(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_str()),
        }
    }

    /// Whether this is a wildcard.
    pub fn is_wildcard(&self) -> bool {
        matches!(self, Self::Wildcard(_))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(name) => f.write_str(name),
            Self::Wildcard(suffix) => write!(f, "*{suffix}"),
        }
    }
}

/// Why a request's host cannot be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// More than one `Host` header.
    Several,
    /// A `Host` that is not a host (nor `host:port`).
    Malformed,
    /// `Host` and the target's authority (`:authority`, or an absolute-form target) name
    /// different hosts.
    Disagree,
}

impl HostError {
    /// What the client is told.
    pub fn detail(self) -> &'static str {
        match self {
            Self::Several => "The request has more than one Host header. HTTP/1.1 requests carry exactly one.",
            Self::Malformed => "The request's Host header is not a host name or address, with an optional port.",
            Self::Disagree => {
                "The request names two different hosts: its Host header and its target's authority \
                 (:authority in HTTP/2) must agree."
            }
        }
    }
}

/// The host a request names, normalised; `None` when it names none (HTTP/1.0 without Host).
/// `authority` is the target's (from the URI), `hosts` the values of its `Host` headers.
pub fn of_request<'a>(
    authority: Option<&'a str>,
    mut hosts: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<Cow<'a, str>>, HostError> {
    let header = match (hosts.next(), hosts.next()) {
        (None, _) => None,
        (Some(one), None) => {
            let text = std::str::from_utf8(one).map_err(|_| HostError::Malformed)?;
            Some(normalize(text).ok_or(HostError::Malformed)?)
        }
        (Some(_), Some(_)) => return Err(HostError::Several),
    };
    // hyper has parsed the target's authority; an empty one (`http:///x`) names nothing.
    let target = authority.and_then(normalize);
    match (target, header) {
        (Some(target), Some(header)) if target != header => Err(HostError::Disagree),
        (Some(target), _) => Ok(Some(target)),
        (None, header) => Ok(header),
    }
}

/// The host a request's head names, when it names one host (the gateway refuses one that
/// names two before it is routed).
pub fn of_head<'a>(uri: &'a http::Uri, headers: &'a http::HeaderMap) -> Option<Cow<'a, str>> {
    let hosts = headers.get_all(http::header::HOST).into_iter().map(http::HeaderValue::as_bytes);
    of_request(uri.authority().map(http::uri::Authority::as_str), hosts).ok().flatten()
}

/// `host[:port]` lower-cased, without its port or a trailing dot; `None` when it is no host.
/// Borrowed when it needs no change (the common case: a lower-case name without a port).
pub fn normalize(authority: &str) -> Option<Cow<'_, str>> {
    // Userinfo has no place in a Host, and hyper refuses it in a target.
    if authority.contains('@') {
        return None;
    }
    let host = if let Some(rest) = authority.strip_prefix('[') {
        // An IPv6 literal, kept in its brackets: `[::1]:8080` is `[::1]`.
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        let inner = &rest[..end];
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return None;
        }
        &authority[..end + 2]
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if is_port(port) => host,
            Some(_) => return None,
            None => authority,
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    if !host.starts_with('[') {
        let label_ok = |label: &str| {
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !host.split('.').all(label_ok) {
            return None;
        }
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Some(Cow::Owned(host.to_ascii_lowercase()))
    } else {
        Some(Cow::Borrowed(host))
    }
}

/// A port: 1 to 5 digits (an empty port, `host:`, is allowed by RFC 3986 and means none).
fn is_port(text: &str) -> bool {
    text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_normalised_however_it_is_spelt() {
        for (raw, want) in [
            ("api.example.com", Some("api.example.com")),
            ("API.Example.COM", Some("api.example.com")),
            ("api.example.com:8443", Some("api.example.com")),
            ("api.example.com.", Some("api.example.com")),
            ("api.example.com.:443", Some("api.example.com")),
            ("api.example.com:", Some("api.example.com")),
            ("10.0.0.5:3000", Some("10.0.0.5")),
            ("[::1]:8080", Some("[::1]")),
            ("[::1]", Some("[::1]")),
            ("", None),
            (":80", None),
            ("a..b", None),
            ("a b", None),
            ("user@host", None),
            ("host:http", None),
            ("[::1", None),
            ("[zz]", None),
            ("[::1]x", None),
            ("host:123456", None),
        ] {
            assert_eq!(normalize(raw).as_deref(), want, "{raw:?}");
        }
        assert!(matches!(normalize("api.example.com"), Some(Cow::Borrowed(_))));
    }

    #[test]
    fn a_request_names_one_host_or_is_refused() {
        let one = |a: Option<&'static str>, h: &[&'static str]| of_request(a, h.iter().map(|s| s.as_bytes()));
        assert_eq!(one(None, &["A.example.com:80"]).unwrap().as_deref(), Some("a.example.com"));
        assert_eq!(one(Some("a.example.com"), &[]).unwrap().as_deref(), Some("a.example.com"));
        assert_eq!(one(Some("a.example.com:443"), &["A.EXAMPLE.com"]).unwrap().as_deref(), Some("a.example.com"));
        assert_eq!(one(None, &[]).unwrap(), None);
        assert_eq!(one(Some("a.example.com"), &["b.example.com"]), Err(HostError::Disagree));
        assert_eq!(one(None, &["a", "a"]), Err(HostError::Several));
        assert_eq!(one(None, &["a/b"]), Err(HostError::Malformed));
    }

    #[test]
    fn patterns_say_what_is_wrong() {
        assert_eq!(HostPattern::parse("API.example.com").unwrap(), HostPattern::Exact("api.example.com".into()));
        assert_eq!(HostPattern::parse("api.example.com.").unwrap(), HostPattern::Exact("api.example.com".into()));
        assert_eq!(HostPattern::parse("*.Example.com").unwrap(), HostPattern::Wildcard(".example.com".into()));
        assert_eq!(HostPattern::parse("10.0.0.5").unwrap(), HostPattern::Exact("10.0.0.5".into()));
        assert_eq!(HostPattern::parse("[::1]").unwrap(), HostPattern::Exact("[::1]".into()));
        for (bad, says) in [
            ("", "empty"),
            ("*", "every host"),
            ("api.example.com:443", "port"),
            ("https://api.example.com", "URL"),
            ("a.*.com", "whole first label"),
            ("*example.com", "whole first label"),
            ("*.com", "top-level"),
            ("*.10.0.0.5", "addresses"),
            ("a..b", "not a host"),
            ("bücher.example", "ASCII form"),
            ("a b", "not a host"),
        ] {
            let err = HostPattern::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_wildcard_matches_names_under_its_domain_only() {
        let w = HostPattern::parse("*.example.com").unwrap();
        assert!(w.matches("a.example.com"));
        assert!(w.matches("a.b.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("badexample.com"));
        assert!(!w.matches(".example.com"));
        assert_eq!(w.to_string(), "*.example.com");
    }
}
