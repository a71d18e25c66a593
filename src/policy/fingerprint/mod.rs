//! Fingerprint: what makes two requests "the same request".
//!
//! A retry must carry the same key AND the same meaning; a reused key with another body is a
//! client bug that gets 422 instead of someone else's response. The fingerprint is SHA-256
//! over a versioned canonical form of:
//!
//! 1. the route name, the method, and the (normalised) path without a trailing slash;
//! 2. the query parameters, sorted by name only: `?b=2&a=1` is `?a=1&b=2`, but repeated names
//!    keep their order (`?ids=2&ids=1` is not `?ids=1&ids=2`: many APIs read that order);
//! 3. the request headers the route names in `fingerprint_headers`, in that order;
//! 4. the media type (the essence of `Content-Type`: `application/json` and
//!    `application/merge-patch+json` are different requests) and `Content-Encoding`;
//! 5. the body: for JSON (`application/json`, `application/*+json`) without a content coding,
//!    the canonical JSON (object keys sorted, no whitespace, numbers exactly as written)
//!    without the fields named by the route's `ignore` pointers; for a form
//!    (`application/x-www-form-urlencoded`), its decoded pairs sorted by name like the
//!    query; for anything else, the raw bytes. JSON that names one member twice is compared
//!    as raw bytes too, since parsers disagree on which of the two counts.
//!
//! Every part is length-prefixed, so no two different inputs share one canonical form. The
//! version tag changes whenever the form does: a record written under another version then
//! answers 422 to its retry rather than a wrong replay.

mod json;

pub use json::JsonPointer;

use std::borrow::Cow;

use http::{HeaderName, request::Parts};
use sha2::{Digest, Sha256};

const VERSION: &[u8] = b"idemgate-fingerprint-v2";

/// What a route feeds into its fingerprints besides method, path, query and body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    h.field(parts.method.as_str().as_bytes());
    h.field(route_path(parts.uri.path()).as_bytes());
    h.pairs(raw_pairs(parts.uri.query().unwrap_or("")));

    h.count(spec.headers.len());
    for name in &spec.headers {
        let values = parts.headers.get_all(name);
        h.field(name.as_str().as_bytes());
        h.count(values.iter().count());
        for value in values {
            h.field(value.as_bytes());
        }
    }

    let media = media_type(parts);
    h.field(media.as_deref().unwrap_or("").as_bytes());
    let encodings = parts.headers.get_all(http::header::CONTENT_ENCODING);
    h.count(encodings.iter().count());
    for value in encodings {
        h.field(value.as_bytes());
    }
    let encoded = parts.headers.contains_key(http::header::CONTENT_ENCODING);
    match body_form(media.as_deref(), encoded) {
        BodyForm::Json => match json::canonicalize(body, &spec.ignore) {
            Ok(canonical) => {
                h.raw(b"json");
                h.field(&canonical);
            }
            Err(_) => h.raw_body(body),
        },
        BodyForm::Form => {
            h.raw(b"form");
            h.pairs(form_urlencoded::parse(body).collect());
        }
        BodyForm::Raw => h.raw_body(body),
    }
    Fingerprint(h.0.finalize().into())
}

/// The path as routes see it: `/orders/` and `/orders` are one resource.
fn route_path(path: &str) -> &str {
    match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() => trimmed,
        _ => path,
    }
}

/// `name=value` pairs of a query, split but not decoded: whether `+` means a space in a query
/// is up to the upstream, so `a+b` and `a%20b` stay different requests.
fn raw_pairs(query: &str) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (Cow::Borrowed(name), Cow::Borrowed(value)),
            // `?flag` and `?flag=` are different requests to some frameworks.
            None => (Cow::Borrowed(pair), Cow::Borrowed("\0")),
        })
        .collect()
}

/// The essence of `Content-Type` (`type/subtype`, lower case, parameters dropped).
fn media_type(parts: &Parts) -> Option<String> {
    let ct = parts.headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    Some(ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

enum BodyForm {
    Json,
    Form,
    Raw,
}

/// How the body is read: only an uncompressed body can be parsed.
fn body_form(media: Option<&str>, encoded: bool) -> BodyForm {
    match media {
        _ if encoded => BodyForm::Raw,
        Some("application/json") => BodyForm::Json,
        Some(m) if m.starts_with("application/") && m.ends_with("+json") => BodyForm::Json,
        Some("application/x-www-form-urlencoded") => BodyForm::Form,
        _ => BodyForm::Raw,
    }
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
    fn raw_body(&mut self, body: &[u8]) {
        self.raw(b"raw");
        self.field(body);
    }
    /// Pairs sorted by name only; a stable sort keeps repeated names in their order.
    fn pairs(&mut self, mut pairs: Vec<(Cow<'_, str>, Cow<'_, str>)>) {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        self.count(pairs.len());
        for (name, value) in &pairs {
            self.field(name.as_bytes());
            self.field(value.as_bytes());
        }
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
        assert_eq!(base, fp(&s, &parts("POST", "/orders/?a=1&b=2", &[]), body), "a trailing slash is one resource");
        assert_ne!(base, fp(&s, &parts("POST", "/orders?a=1&b=3", &[]), body));
        assert_ne!(base, compute("other-route", &s, &parts("POST", "/orders?a=1&b=2", &[]), body.as_bytes()));
    }

    #[test]
    fn repeated_query_names_keep_their_order() {
        let s = FingerprintSpec::default();
        let a = fp(&s, &parts("POST", "/o?ids=2&ids=1", &[]), "");
        assert_ne!(a, fp(&s, &parts("POST", "/o?ids=1&ids=2", &[]), ""));
        assert_eq!(
            fp(&s, &parts("POST", "/o?ids=2&x=0&ids=1", &[]), ""),
            fp(&s, &parts("POST", "/o?x=0&ids=2&ids=1", &[]), "")
        );
        assert_ne!(fp(&s, &parts("POST", "/o?flag", &[]), ""), fp(&s, &parts("POST", "/o?flag=", &[]), ""));
        assert_ne!(fp(&s, &parts("POST", "/o?q=a+b", &[]), ""), fp(&s, &parts("POST", "/o?q=a%20b", &[]), ""));
    }

    #[test]
    fn the_media_type_and_content_coding_are_part_of_the_request() {
        let s = FingerprintSpec::default();
        let body = r#"{"a":1}"#;
        let json = fp(&s, &parts("POST", "/o", &[("content-type", "application/json")]), body);
        let patch = fp(&s, &parts("POST", "/o", &[("content-type", "application/merge-patch+json")]), body);
        assert_ne!(json, patch);
        assert_eq!(json, fp(&s, &parts("POST", "/o", &[("content-type", "Application/JSON; charset=utf-8")]), body));
        assert_ne!(json, fp(&s, &parts("POST", "/o", &[]), body));
        let gzip = parts("POST", "/o", &[("content-type", "application/json"), ("content-encoding", "gzip")]);
        assert_ne!(json, fp(&s, &gzip, body));
        // An encoded body is not parsed: its bytes count.
        assert_ne!(fp(&s, &gzip, r#"{"a":1,"b":2}"#), fp(&s, &gzip, r#"{"b":2,"a":1}"#));
    }

    #[test]
    fn form_bodies_are_sorted_by_name_like_the_query() {
        let s = FingerprintSpec::default();
        let form =
            |body: &str| fp(&s, &parts("POST", "/o", &[("content-type", "application/x-www-form-urlencoded")]), body);
        assert_eq!(form("b=2&a=1"), form("a=1&b=2"));
        assert_eq!(form("a=x+y"), form("a=x%20y"), "a form's + is a space by definition");
        assert_ne!(form("ids=2&ids=1"), form("ids=1&ids=2"));
        assert_ne!(form("a=1"), form("a=2"));
    }

    #[test]
    fn json_with_a_duplicate_member_is_compared_byte_for_byte() {
        let s = FingerprintSpec::default();
        let p = json_parts();
        assert_ne!(fp(&s, &p, r#"{"amount":1,"amount":100}"#), fp(&s, &p, r#"{"amount":100}"#));
        assert_ne!(fp(&s, &p, r#"{"amount":1,"amount":100}"#), fp(&s, &p, r#"{"amount":1, "amount":100}"#));
    }

    #[test]
    fn only_configured_headers_matter() {
        let s = FingerprintSpec { ignore: vec![], headers: vec![HeaderName::from_static("x-currency")] };
        let a = fp(&s, &parts("POST", "/p", &[("x-currency", "EUR"), ("x-trace", "1")]), "");
        assert_eq!(a, fp(&s, &parts("POST", "/p", &[("x-currency", "EUR"), ("x-trace", "2")]), ""));
        assert_ne!(a, fp(&s, &parts("POST", "/p", &[("x-currency", "USD")]), ""));
        assert_ne!(a, fp(&s, &parts("POST", "/p", &[]), ""));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A request reduced to what the fingerprint is defined over, in a small alphabet so
        /// that random pairs often share parts.
        #[derive(Debug, Clone)]
        struct Model {
            method: &'static str,
            path: &'static str,
            query: Vec<(String, String)>,
            media: Option<&'static str>,
            encoding: Option<&'static str>,
            currency: Option<&'static str>,
            body: String,
        }

        fn model() -> impl Strategy<Value = Model> {
            let pair = ("[ab]{1,2}", "[12]{0,2}");
            (
                prop::sample::select(vec!["POST", "PUT"]),
                prop::sample::select(vec!["/o", "/o/", "/p"]),
                prop::collection::vec(pair, 0..4),
                prop::sample::select(vec![
                    None,
                    Some("application/json"),
                    Some("text/plain"),
                    Some("application/x-www-form-urlencoded"),
                ]),
                prop::sample::select(vec![None, Some("gzip")]),
                prop::sample::select(vec![None, Some("EUR"), Some("USD")]),
                prop::sample::select(
                    vec!["", "a=1", "a=1&b=2", "b=2&a=1", r#"{"a":1}"#, r#"{ "a": 1 }"#, r#"{"a":2}"#]
                        .into_iter()
                        .map(String::from)
                        .collect::<Vec<_>>(),
                ),
            )
                .prop_map(|(method, path, query, media, encoding, currency, body)| Model {
                    method,
                    path,
                    query,
                    media,
                    encoding,
                    currency,
                    body,
                })
        }

        fn parts_of(m: &Model) -> Parts {
            let query: Vec<String> = m.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let uri = if query.is_empty() { m.path.to_owned() } else { format!("{}?{}", m.path, query.join("&")) };
            let mut headers = vec![];
            if let Some(t) = m.media {
                headers.push(("content-type", t));
            }
            if let Some(e) = m.encoding {
                headers.push(("content-encoding", e));
            }
            if let Some(c) = m.currency {
                headers.push(("x-currency", c));
            }
            parts(m.method, &uri, &headers)
        }

        /// What the request means, computed the obvious way: two models with the same meaning
        /// are the same request, two with different meanings are not.
        fn meaning(m: &Model) -> impl PartialEq + std::fmt::Debug {
            let mut query = m.query.clone();
            query.sort_by(|a, b| a.0.cmp(&b.0));
            let body: String = match (m.media, m.encoding) {
                (Some("application/json"), None) => serde_json::from_str::<serde_json::Value>(&m.body)
                    .map(|v| format!("json:{v}"))
                    .unwrap_or_else(|_| format!("raw:{}", m.body)),
                (Some("application/x-www-form-urlencoded"), None) => {
                    let mut pairs: Vec<(String, String)> =
                        form_urlencoded::parse(m.body.as_bytes()).into_owned().collect();
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                    format!("form:{pairs:?}")
                }
                _ => format!("raw:{}", m.body),
            };
            (m.method, m.path.trim_end_matches('/').to_owned(), query, m.media, m.encoding, m.currency, body)
        }

        /// `a` changed in one part: a new value for that part (which may or may not change the
        /// meaning), or the query pairs shuffled.
        fn neighbour(a: Model, part: usize, other: Model, shuffle: Vec<usize>) -> Model {
            let mut b = a.clone();
            match part {
                0 => b.method = other.method,
                1 => b.path = other.path,
                2 => b.query = other.query,
                3 => {
                    let mut keyed: Vec<_> = shuffle.iter().zip(b.query.drain(..)).collect();
                    keyed.sort_by_key(|(k, _)| **k);
                    b.query = keyed.into_iter().map(|(_, p)| p).collect();
                }
                4 => b.media = other.media,
                5 => b.encoding = other.encoding,
                6 => b.currency = other.currency,
                _ => b.body = other.body,
            }
            b
        }

        fn check(a: &Model, b: &Model) -> Result<(), TestCaseError> {
            let spec = FingerprintSpec { ignore: vec![], headers: vec![HeaderName::from_static("x-currency")] };
            let fa = compute("r", &spec, &parts_of(a), a.body.as_bytes());
            let fb = compute("r", &spec, &parts_of(b), b.body.as_bytes());
            prop_assert_eq!(meaning(a) == meaning(b), fa == fb, "{:?} vs {:?}", a, b);
            Ok(())
        }

        proptest! {
            #[test]
            fn requests_share_a_fingerprint_exactly_when_they_mean_the_same(
                a in model(),
                other in model(),
                part in 0usize..8,
                shuffle in prop::collection::vec(0usize..4, 4),
            ) {
                let b = neighbour(a.clone(), part, other.clone(), shuffle);
                check(&a, &b)?;
                check(&a, &other)?;
            }
        }
    }
}
