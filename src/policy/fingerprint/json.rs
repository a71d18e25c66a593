//! Canonical JSON and JSON Pointer removal, for the body part of the fingerprint.

use std::io::Write;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// An RFC 6901 JSON Pointer such as `/client_ts` or `/items/0/note`, parsed at config load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer(Vec<String>);

impl JsonPointer {
    /// Parses a pointer; the empty pointer (the whole document) cannot be ignored.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("{text:?} is not a JSON Pointer (it must start with '/')"));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => return Err(format!("{text:?}: '~' must be followed by 0 or 1")),
                }
            }
            tokens.push(token);
        }
        Ok(Self(tokens))
    }
}

impl std::fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for token in &self.0 {
            write!(f, "/{}", token.replace('~', "~0").replace('/', "~1"))?;
        }
        Ok(())
    }
}

/// Why a body has no canonical JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotCanonical {
    /// Not JSON at all.
    Invalid,
    /// An object names one member twice (`{"amount":1,"amount":100}`). Parsers disagree on
    /// which one counts (first, last, error), so such a body is compared byte for byte.
    DuplicateMember,
}

/// The canonical form of a JSON body, without the members `ignore` points at.
pub(super) fn canonicalize(body: &[u8], ignore: &[JsonPointer]) -> Result<Vec<u8>, NotCanonical> {
    let doc = parse_strict(body)?;
    let pointers: Vec<&[String]> = ignore.iter().map(|p| p.0.as_slice()).collect();
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&doc, &pointers, &mut out);
    Ok(out)
}

/// Written in place of an ignored array element. A raw NUL byte never occurs in canonical
/// JSON (strings escape control characters), so an ignored element cannot look like any real
/// value, `null` included, while the indices after it keep their meaning.
const IGNORED_ELEMENT: u8 = 0;

/// Sorted keys, no whitespace, strings re-escaped the one way serde_json writes them, numbers
/// exactly as written (the `arbitrary_precision` feature keeps their text). `pointers` are the
/// remaining tokens of the ignore pointers that lead into `value`.
///
/// Recursion depth is bounded by serde_json's parse limit (128 levels).
fn write_canonical(value: &Value, pointers: &[&[String]], out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            // Writing into a Vec cannot fail.
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let index = i.to_string();
                match descend(pointers, &index) {
                    Descend::Ignored => out.push(IGNORED_ELEMENT),
                    Descend::Into(inner) => write_canonical(item, &inner, out),
                }
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sort explicitly: serde_json's map keeps insertion order when any crate in the
            // build enables its `preserve_order` feature.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            let mut first = true;
            for (k, v) in entries {
                let Descend::Into(inner) = descend(pointers, k) else { continue };
                if !first {
                    out.push(b',');
                }
                first = false;
                write_string(k, out);
                out.push(b':');
                write_canonical(v, &inner, out);
            }
            out.push(b'}');
        }
    }
}

enum Descend<'a> {
    /// A pointer ends at this child: leave it out.
    Ignored,
    /// The pointers that continue below this child.
    Into(Vec<&'a [String]>),
}

fn descend<'a>(pointers: &[&'a [String]], child: &str) -> Descend<'a> {
    let mut inner = Vec::new();
    for pointer in pointers {
        if let Some((first, rest)) = pointer.split_first()
            && first == child
        {
            if rest.is_empty() {
                return Descend::Ignored;
            }
            inner.push(rest);
        }
    }
    Descend::Into(inner)
}

/// Parses JSON like `serde_json::from_slice`, but refuses an object with a repeated member.
fn parse_strict(body: &[u8]) -> Result<Value, NotCanonical> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = match Strict.deserialize(&mut de) {
        Ok(v) => v,
        Err(e) if e.to_string().starts_with(DUPLICATE) => return Err(NotCanonical::DuplicateMember),
        Err(_) => return Err(NotCanonical::Invalid),
    };
    de.end().map_err(|_| NotCanonical::Invalid)?;
    Ok(value)
}

const DUPLICATE: &str = "duplicate member";

/// A serde seed that builds a [`Value`] and fails on a repeated object member.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // With `arbitrary_precision`, serde_json hands a number over as a one-member map with a
        // private key; `Value`'s own deserializer turns that back into a number.
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Object(serde_json::Map::new()));
        };
        if first == NUMBER_TOKEN {
            let text: String = map.next_value()?;
            return serde_json::from_str::<serde_json::Number>(&text)
                .map(Value::Number)
                .map_err(|e| de::Error::custom(e.to_string()));
        }
        let mut out = serde_json::Map::new();
        let mut key = Some(first);
        while let Some(k) = key {
            let value = map.next_value_seed(Strict)?;
            if out.insert(k, value).is_some() {
                return Err(de::Error::custom(DUPLICATE));
            }
            key = map.next_key()?;
        }
        Ok(Value::Object(out))
    }
}

/// The private key serde_json's `arbitrary_precision` feature uses for numbers.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(body: &str, ignore: &[&str]) -> String {
        let ptrs: Vec<_> = ignore.iter().map(|p| JsonPointer::parse(p).unwrap()).collect();
        String::from_utf8(canonicalize(body.as_bytes(), &ptrs).unwrap()).unwrap().replace('\0', "<ignored>")
    }

    #[test]
    fn canonical_form_is_sorted_and_compact() {
        assert_eq!(canon(r#" { "b" : [ 1 , {"d":1,"c":2} ], "a" : "x" } "#, &[]), r#"{"a":"x","b":[1,{"c":2,"d":1}]}"#);
    }

    #[test]
    fn numbers_keep_their_text() {
        assert_eq!(canon("[1.0, 1, 12345678901234567890123]", &[]), "[1.0,1,12345678901234567890123]");
        // The parser normalises only the exponent's sign.
        assert_eq!(canon("[1e2]", &[]), canon("[1e+2]", &[]));
    }

    #[test]
    fn pointers_remove_members_and_blank_array_items() {
        assert_eq!(canon(r#"{"a":1,"b":{"c":2,"d":3}}"#, &["/a", "/b/c"]), r#"{"b":{"d":3}}"#);
        assert_eq!(canon(r#"{"items":[{"n":1},{"n":2}]}"#, &["/items/0"]), r#"{"items":[<ignored>,{"n":2}]}"#);
        assert_eq!(canon(r#"{"items":[{"n":1,"t":5}]}"#, &["/items/0/t"]), r#"{"items":[{"n":1}]}"#);
        assert_eq!(canon(r#"{"a":1}"#, &["/missing/deep", "/a/b"]), r#"{"a":1}"#);
    }

    #[test]
    fn pointer_escapes_follow_rfc_6901() {
        assert_eq!(canon(r#"{"a/b":1,"m~n":2,"k":3}"#, &["/a~1b", "/m~0n"]), r#"{"k":3}"#);
    }

    #[test]
    fn invalid_pointers_are_rejected() {
        assert!(JsonPointer::parse("").is_err());
        assert!(JsonPointer::parse("client_ts").is_err());
        assert!(JsonPointer::parse("/a~2").is_err());
        assert!(JsonPointer::parse("/a~").is_err());
    }

    #[test]
    fn an_ignored_array_element_differs_from_a_real_null() {
        assert_ne!(canon(r#"[1,2]"#, &["/0"]), canon(r#"[null,2]"#, &[]));
        assert_ne!(canon(r#"[1,2]"#, &["/0"]), canon(r#"[null,2]"#, &["/5"]));
    }

    #[test]
    fn invalid_json_has_no_canonical_form() {
        assert_eq!(canonicalize(b"{", &[]), Err(NotCanonical::Invalid));
        assert_eq!(canonicalize(b"", &[]), Err(NotCanonical::Invalid));
        assert_eq!(canonicalize(b"{} {}", &[]), Err(NotCanonical::Invalid));
    }

    #[test]
    fn duplicate_members_have_no_canonical_form() {
        assert_eq!(canonicalize(br#"{"amount":1,"amount":100}"#, &[]), Err(NotCanonical::DuplicateMember));
        assert_eq!(canonicalize(br#"{"a":{"b":1,"b":1}}"#, &[]), Err(NotCanonical::DuplicateMember));
        assert_eq!(canonicalize(br#"[{"b":1},{"b":1}]"#, &[]).map(|_| ()), Ok(()));
    }

    #[test]
    fn the_strict_parser_agrees_with_serde_json() {
        for body in [r#"{"a":[1,2.5,-3e7,12345678901234567890123,"x",true,null,{}]}"#, r#""\u00e9\n""#, "[]", "0"] {
            let strict = parse_strict(body.as_bytes()).unwrap();
            let plain: Value = serde_json::from_str(body).unwrap();
            assert_eq!(strict, plain, "{body}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                "[a-z\\u{e9}\"\\\\ ]{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map("[a-d]{1,3}", inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            /// Any bytes at all: a canonical form or a refusal, never a panic.
            #[test]
            fn any_body_is_canonicalised_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
                let _ = canonicalize(&bytes, &[JsonPointer::parse("/a/0").unwrap()]);
            }

            /// The canonical form is JSON meaning the same document, and canonical itself.
            #[test]
            fn the_canonical_form_means_the_same_and_is_a_fixed_point(doc in json()) {
                let text = serde_json::to_vec_pretty(&doc).unwrap();
                let canonical = canonicalize(&text, &[]).unwrap();
                prop_assert_eq!(serde_json::from_slice::<Value>(&canonical).unwrap(), doc);
                prop_assert_eq!(canonicalize(&canonical, &[]).unwrap(), canonical);
            }
        }
    }
}
