//! Scope: whose key is this?
//!
//! Two callers who both pick the key `"1"` must never share a record, or one of them would be
//! answered with the other's order. The scope comes from authentication (by default the
//! `Authorization` header, hashed, never stored or logged in clear), never from the body.

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

/// Where a route takes the caller's identity from (`scope` in `gateway.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeSource {
    /// Every caller shares one key space (`scope = "global"`).
    Global,
    /// The named header's value identifies the caller (`scope = "header:Authorization"`).
    Header(HeaderName),
}

impl ScopeSource {
    /// Parses the config syntax: `"global"` or `"header:NAME"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "global" {
            return Ok(Self::Global);
        }
        let Some(name) = text.strip_prefix("header:") else {
            return Err(format!("{text:?} is neither \"global\" nor \"header:NAME\""));
        };
        HeaderName::from_bytes(name.trim().as_bytes())
            .map(Self::Header)
            .map_err(|_| format!("{name:?} is not a valid header name"))
    }
}

/// The caller's key space, as a fixed-size digest so that credentials never reach the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; 32]);

impl Scope {
    /// The digest that goes into the record's key name.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Derives the scope of a request.
///
/// Requests without the scope header share one anonymous scope: the gateway is not an
/// authentication layer, and an upstream that accepts anonymous calls accepts them all alike.
/// A header given several times is hashed with all its values in order.
pub fn derive(source: &ScopeSource, headers: &HeaderMap) -> Scope {
    let mut hasher = Sha256::new();
    hasher.update(b"idemgate-scope-v1\0");
    match source {
        ScopeSource::Global => hasher.update(b"global"),
        ScopeSource::Header(name) => {
            let mut values = headers.get_all(name).iter().peekable();
            if values.peek().is_none() {
                hasher.update(b"anonymous");
            } else {
                hasher.update(b"caller\0");
                for value in values {
                    hasher.update((value.len() as u64).to_be_bytes());
                    hasher.update(value.as_bytes());
                }
            }
        }
    }
    Scope(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(auth: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for a in auth {
            h.append(http::header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn by_auth() -> ScopeSource {
        ScopeSource::Header(http::header::AUTHORIZATION)
    }

    #[test]
    fn parses_config_syntax() {
        assert_eq!(ScopeSource::parse("global"), Ok(ScopeSource::Global));
        assert_eq!(
            ScopeSource::parse("header:X-User-Id"),
            Ok(ScopeSource::Header(HeaderName::from_static("x-user-id")))
        );
        assert!(ScopeSource::parse("header:bad header").is_err());
        assert!(ScopeSource::parse("user").is_err());
    }

    #[test]
    fn different_callers_get_different_scopes() {
        let a = derive(&by_auth(), &headers(&["Bearer alice"]));
        let b = derive(&by_auth(), &headers(&["Bearer bob"]));
        assert_ne!(a, b);
        assert_eq!(a, derive(&by_auth(), &headers(&["Bearer alice"])));
    }

    #[test]
    fn anonymous_differs_from_any_caller_and_from_global() {
        let anon = derive(&by_auth(), &headers(&[]));
        assert_ne!(anon, derive(&by_auth(), &headers(&[""])));
        assert_ne!(anon, derive(&ScopeSource::Global, &headers(&[])));
    }

    #[test]
    fn global_ignores_the_caller() {
        let g = ScopeSource::Global;
        assert_eq!(derive(&g, &headers(&["a"])), derive(&g, &headers(&["b"])));
    }

    #[test]
    fn repeated_header_values_are_not_concatenated_ambiguously() {
        assert_ne!(derive(&by_auth(), &headers(&["ab", "c"])), derive(&by_auth(), &headers(&["a", "bc"])));
    }
}
