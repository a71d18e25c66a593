//! Reconciliation: how a route asks its upstream what became of a request whose answer the
//! gateway lost (`[routes.idempotency.reconcile]`).
//!
//! The lookup names the key in the route's key header, and where the path says `{key}`, in
//! the path or the query. There the key is percent-encoded byte by byte outside
//! `A-Za-z0-9-_~`: no key (`..`, `/`, `?`, `#`, `%2F`) can move the lookup to another path or
//! add a parameter. (An upstream behind a proxy that decodes `%2F` or `%2E` before routing
//! could still be misled by a key in the path; `check` says so.)

use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Method, StatusCode};

use super::StatusSet;

/// What `[routes.idempotency.reconcile]` decides.
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// Where the lookup goes.
    pub path: LookupPath,
    /// The lookup's method.
    pub method: Method,
    /// Statuses whose answer is the request's answer.
    pub found: StatusSet,
    /// Statuses that say the request never ran.
    pub not_found: StatusSet,
    /// How long after an unknown outcome the gateway that lost it asks by itself; `None`:
    /// only when a retry meets the key.
    pub after: Option<Duration>,
    /// How long past the upstream's timeout a "not found" becomes proof, for a request whose
    /// connection the upstream did not close itself.
    pub release_after: Duration,
    /// The status a found answer is replayed with, instead of the lookup's.
    pub answer_status: Option<StatusCode>,
}

/// The lookup's path and query, with `{key}` where the key goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupPath {
    parts: Vec<Part>,
    /// Whether `{key}` appears before the query.
    key_in_path: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Key,
}

const KEY: &str = "{key}";

impl LookupPath {
    /// Parses a path such as `/orders/lookup`, `/orders/lookup?key={key}` or
    /// `/orders/by-key/{key}`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if !text.starts_with('/') {
            return Err(format!("{text:?} must start with /"));
        }
        if text.contains('#') {
            return Err(format!("{text:?} must not have a fragment"));
        }
        let mut parts = Vec::new();
        let mut key_in_path = false;
        let query_at = text.find('?').unwrap_or(text.len());
        let mut rest = text;
        let mut at = 0;
        while let Some(i) = rest.find('{') {
            if !rest[i..].starts_with(KEY) {
                return Err(format!("{text:?}: the only placeholder is {KEY}"));
            }
            if i > 0 {
                parts.push(Part::Text(rest[..i].to_owned()));
            }
            parts.push(Part::Key);
            key_in_path |= at + i < query_at;
            at += i + KEY.len();
            rest = &rest[i + KEY.len()..];
        }
        if rest.contains('}') {
            return Err(format!("{text:?}: the only placeholder is {KEY}"));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        let path = Self { parts, key_in_path };
        // Whatever the key, the result must be a valid path and query.
        path.expand("k").parse::<PathAndQuery>().map_err(|e| format!("{text:?} is not a valid path: {e}"))?;
        Ok(path)
    }

    /// Whether the key goes into the path (not only the query).
    pub fn key_in_path(&self) -> bool {
        self.key_in_path
    }

    /// The path and query for `key`.
    pub fn expand(&self, key: &str) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Key => encode_key(key, &mut out),
            }
        }
        out
    }
}

impl std::fmt::Display for LookupPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(text) => f.write_str(text)?,
                Part::Key => f.write_str(KEY)?,
            }
        }
        Ok(())
    }
}

/// Percent-encodes every byte of `key` outside `A-Za-z0-9-_~` (so `.` too: `..` cannot be a
/// path segment).
fn encode_key(key: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'~' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_key_stays_one_path_segment_or_one_query_value() {
        let path = LookupPath::parse("/orders/by-key/{key}/status?key={key}&v=1").unwrap();
        assert!(path.key_in_path());
        for key in ["..", "../admin", "a/b", "?x=1", "#frag", "%2F", "a b", "é", "{key}", "&v=2"] {
            let out = path.expand(key);
            let pq: PathAndQuery = out.parse().unwrap();
            let segments: Vec<&str> = pq.path().split('/').collect();
            assert_eq!(segments.len(), 5, "{key:?} -> {out}");
            assert_eq!(segments[4], "status", "{key:?} -> {out}");
            assert!(!segments[3].contains(['/', '?', '#', '.']), "{key:?} -> {out}");
            assert_eq!(pq.query().unwrap().split('&').count(), 2, "{key:?} -> {out}");
            // The encoded key decodes back to the key.
            let decoded = percent_encoding::percent_decode_str(segments[3]).decode_utf8().unwrap();
            assert_eq!(decoded, key);
        }
        assert_eq!(path.expand("a.b"), "/orders/by-key/a%2Eb/status?key=a%2Eb&v=1");
    }

    #[test]
    fn paths_are_checked() {
        assert!(!LookupPath::parse("/orders/lookup").unwrap().key_in_path());
        assert!(!LookupPath::parse("/orders/lookup?key={key}").unwrap().key_in_path());
        assert_eq!(LookupPath::parse("/o?k={key}").unwrap().to_string(), "/o?k={key}");
        for bad in ["orders", "/o/{id}", "/o/{key", "/o/}", "/o#x", "/o p"] {
            assert!(LookupPath::parse(bad).is_err(), "{bad}");
        }
    }
}
