//! Fingerprint: what makes two requests "the same request".
//!
//! A retry must carry the same key AND the same meaning; a reused key with another body is a
//! client bug that gets 422 instead of someone else's response. The fingerprint is SHA-256
//! over a versioned canonical form of:
//!
//! 1. the route name, the method, the path as sent, the query pairs sorted;
//! 2. the request headers the route names in `fingerprint_headers`, in that order;
//! 3. the body: for JSON bodies (`application/json`, `application/*+json`) the canonical JSON
//!    (object keys sorted, no whitespace, numbers exactly as written) after removing the
//!    fields named by the route's `ignore` pointers; for anything else, the raw bytes.
//!
//! Every part is length-prefixed, so no two different inputs share one canonical form. The
//! version tag lets a future change of the form coexist with records written by this one.

mod json;

pub use json::JsonPointer;

use http::{HeaderName, Method, request::Parts};
use sha2::{Digest, Sha256};

const VERSION: &[u8] = b"idemgate-fingerprint-v1";

/// What a route feeds into its fingerprints besides method, path, query and body.
#[derive(Debug, Clone, Default)]
pub struct FingerprintSpec {
    /// Body fields left out (volatile fields such as client timestamps).
    pub ignore: Vec<JsonPointer>,
    /// Request headers that change the meaning of a request on this route.
    pub headers: Vec<HeaderName>,
}

/// SHA-256 of a request's canonical form.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The raw digest, as stored beside the record.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a fingerprint read back from the store.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", hex::encode(&self.0[..8]))
    }
}

/// Computes the fingerprint of a request whose body has been read in full.
pub fn compute(route: &str, spec: &FingerprintSpec, parts: &Parts, body: &[u8]) -> Fingerprint {
    let mut h = Canonical(Sha256::new());
    h.raw(VERSION);
    h.field(route.as_bytes());
    h.field(method_bytes(&parts.method));
    h.field(parts.uri.path().as_bytes());

    let mut query: Vec<&str> = parts.uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty()).collect();
    query.sort_unstable();
    h.count(query.len());
    for pair in query {
        h.field(pair.as_bytes());
    }

    h.count(spec.headers.len());
    for name in &spec.headers {
        let values = parts.headers.get_all(name);
        h.field(name.as_str().as_bytes());
        h.count(values.iter().count());
        for value in values {
            h.field(value.as_bytes());
        }
    }

    match is_json(parts).then(|| json::canonicalize(body, &spec.ignore)).flatten() {
        Some(canonical) => {
            h.raw(b"json");
            h.field(&canonical);
        }
        None => {
            h.raw(b"raw");
            h.field(body);
        }
    }
    Fingerprint(h.0.finalize().into())
}

fn method_bytes(method: &Method) -> &[u8] {
    method.as_str().as_bytes()
}

/// `application/json` or any `application/*+json`, parameters ignored.
fn is_json(parts: &Parts) -> bool {
    let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Feeds length-prefixed fields into the hash so that field boundaries are unambiguous.
struct Canonical(Sha256);

impl Canonical {
    fn raw(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn count(&mut self, n: usize) {
        self.0.update((n as u64).to_be_bytes());
    }
    fn field(&mut self, bytes: &[u8]) {
        self.count(bytes.len());
        self.0.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn json_parts() -> Parts {
        parts("POST", "/orders", &[("content-type", "application/json")])
    }

    fn fp(spec: &FingerprintSpec, p: &Parts, body: &str) -> Fingerprint {
        compute("create-order", spec, p, body.as_bytes())
    }

    fn spec_ignoring(pointers: &[&str]) -> FingerprintSpec {
        FingerprintSpec { ignore: pointers.iter().map(|p| JsonPointer::parse(p).unwrap()).collect(), headers: vec![] }
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        let s = FingerprintSpec::default();
        let p = json_parts();
        assert_eq!(
            fp(&s, &p, r#"{"sku":"A","quantity":2,"meta":{"x":1,"y":[1,2]}}"#),
            fp(&s, &p, "{ \"quantity\": 2,\n \"meta\": {\"y\": [1, 2], \"x\": 1}, \"sku\": \"A\" }")
        );
    }

    #[test]
    fn json_values_do_matter() {
        let s = FingerprintSpec::default();
        let p = json_parts();
        let base = fp(&s, &p, r#"{"sku":"A","quantity":2}"#);
        assert_ne!(base, fp(&s, &p, r#"{"sku":"A","quantity":3}"#));
        assert_ne!(base, fp(&s, &p, r#"{"sku":"A","quantity":"2"}"#));
        assert_ne!(base, fp(&s, &p, r#"{"sku":"A","quantity":2,"extra":null}"#));
        // Array order is meaning.
        assert_ne!(fp(&s, &p, "[1,2]"), fp(&s, &p, "[2,1]"));
    }

    #[test]
    fn large_numbers_are_not_rounded_together() {
        let s = FingerprintSpec::default();
        let p = json_parts();
        assert_ne!(
            fp(&s, &p, r#"{"amount":12345678901234567890123}"#),
            fp(&s, &p, r#"{"amount":12345678901234567890124}"#)
        );
    }

    #[test]
    fn string_escapes_are_normalised() {
        let s = FingerprintSpec::default();
        let p = json_parts();
        assert_eq!(fp(&s, &p, r#"{"n":"caf\u00e9"}"#), fp(&s, &p, "{\"n\":\"café\"}"));
    }

    #[test]
    fn ignored_fields_do_not_matter_but_others_do() {
        let s = spec_ignoring(&["/client_ts", "/meta/nonce"]);
        let p = json_parts();
        let a = fp(&s, &p, r#"{"sku":"A","client_ts":1,"meta":{"nonce":"x","k":1}}"#);
        assert_eq!(a, fp(&s, &p, r#"{"sku":"A","client_ts":2,"meta":{"nonce":"y","k":1}}"#));
        assert_eq!(a, fp(&s, &p, r#"{"sku":"A","meta":{"k":1}}"#));
        assert_ne!(a, fp(&s, &p, r#"{"sku":"B","client_ts":1,"meta":{"nonce":"x","k":1}}"#));
        assert_ne!(a, fp(&s, &p, r#"{"sku":"A","client_ts":1,"meta":{"nonce":"x","k":2}}"#));
    }

    #[test]
    fn non_json_bodies_are_compared_byte_for_byte() {
        let s = FingerprintSpec::default();
        let p = parts("POST", "/orders", &[("content-type", "text/plain")]);
        assert_ne!(fp(&s, &p, r#"{"a":1,"b":2}"#), fp(&s, &p, r#"{"b":2,"a":1}"#));
        // Invalid JSON under a JSON content type falls back to the raw bytes.
        let j = json_parts();
        assert_ne!(fp(&s, &j, "{not json"), fp(&s, &j, "{not  json"));
    }

    #[test]
    fn structured_json_content_types_count_as_json() {
        let s = FingerprintSpec::default();
        let p = parts("POST", "/x", &[("content-type", "application/merge-patch+json; charset=utf-8")]);
        assert_eq!(fp(&s, &p, r#"{"a":1,"b":2}"#), fp(&s, &p, r#"{"b":2,"a":1}"#));
    }

    #[test]
    fn method_path_and_query_matter_query_order_does_not() {
        let s = FingerprintSpec::default();
        let body = "{}";
        let base = fp(&s, &parts("POST", "/orders?a=1&b=2", &[]), body);
        assert_eq!(base, fp(&s, &parts("POST", "/orders?b=2&a=1", &[]), body));
        assert_ne!(base, fp(&s, &parts("PUT", "/orders?a=1&b=2", &[]), body));
        assert_ne!(base, fp(&s, &parts("POST", "/orders/?a=1&b=2", &[]), body));
        assert_ne!(base, fp(&s, &parts("POST", "/orders?a=1&b=3", &[]), body));
        assert_ne!(base, compute("other-route", &s, &parts("POST", "/orders?a=1&b=2", &[]), body.as_bytes()));
    }

    #[test]
    fn only_configured_headers_matter() {
        let s = FingerprintSpec { ignore: vec![], headers: vec![HeaderName::from_static("x-currency")] };
        let a = fp(&s, &parts("POST", "/p", &[("x-currency", "EUR"), ("x-trace", "1")]), "");
        assert_eq!(a, fp(&s, &parts("POST", "/p", &[("x-currency", "EUR"), ("x-trace", "2")]), ""));
        assert_ne!(a, fp(&s, &parts("POST", "/p", &[("x-currency", "USD")]), ""));
        assert_ne!(a, fp(&s, &parts("POST", "/p", &[]), ""));
    }
}
