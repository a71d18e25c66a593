//! Canonical JSON and JSON Pointer removal, for the body part of the fingerprint.

use std::io::Write;

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

    /// Removes the addressed member from `doc`. An object member is removed; an array element
    /// is replaced by null so that the indices after it keep their meaning. A pointer that
    /// addresses nothing leaves the document as it is.
    fn remove_from(&self, doc: &mut Value) {
        let Some((last, parents)) = self.0.split_last() else {
            return;
        };
        let mut node = doc;
        for token in parents {
            let next = match node {
                Value::Object(map) => map.get_mut(token),
                Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => return,
            }
        }
        match node {
            Value::Object(map) => {
                map.remove(last);
            }
            Value::Array(items) => {
                if let Some(item) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    *item = Value::Null;
                }
            }
            _ => {}
        }
    }
}

/// The canonical form of a JSON body, or `None` if it is not valid JSON.
pub(super) fn canonicalize(body: &[u8], ignore: &[JsonPointer]) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body).ok()?;
    for pointer in ignore {
        pointer.remove_from(&mut doc);
    }
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&doc, &mut out);
    Some(out)
}

/// Sorted keys, no whitespace, strings re-escaped the one way serde_json writes them, numbers
/// exactly as written (the `arbitrary_precision` feature keeps their text).
///
/// Recursion depth is bounded by serde_json's parse limit (128 levels).
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
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
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sort explicitly: serde_json's map keeps insertion order when any crate in the
            // build enables its `preserve_order` feature.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(body: &str, ignore: &[&str]) -> String {
        let ptrs: Vec<_> = ignore.iter().map(|p| JsonPointer::parse(p).unwrap()).collect();
        String::from_utf8(canonicalize(body.as_bytes(), &ptrs).unwrap()).unwrap()
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
        assert_eq!(canon(r#"{"items":[{"n":1},{"n":2}]}"#, &["/items/0"]), r#"{"items":[null,{"n":2}]}"#);
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
    fn invalid_json_has_no_canonical_form() {
        assert!(canonicalize(b"{", &[]).is_none());
        assert!(canonicalize(b"", &[]).is_none());
    }
}
