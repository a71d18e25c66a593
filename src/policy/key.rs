//! Key: reading the `Idempotency-Key` header.
//!
//! The IETF draft defines the key as a Structured Field string (RFC 8941): `"8e03978e-..."`
//! with `\"` and `\\` as the only escapes. Many clients send a bare value instead, so a bare
//! token is accepted as well. Anything else is rejected rather than guessed at: a key that is
//! read two ways could make two retries of one request look like different requests.

use std::fmt;

use http::{HeaderMap, HeaderName};
use thiserror::Error;

/// Why a key header was refused. Every variant becomes a 400.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The route requires a key and the request has none.
    #[error("the {header} header is required on this route")]
    Missing { header: HeaderName },
    /// The header was sent more than once.
    #[error("the {header} header must be sent once")]
    Repeated { header: HeaderName },
    /// The header is present but holds no key.
    #[error("the {header} header is empty")]
    Empty { header: HeaderName },
    /// The key is longer than the route allows.
    #[error("the {header} header is longer than {max} characters")]
    TooLong { header: HeaderName, max: usize },
    /// The header holds bytes outside printable ASCII.
    #[error("the {header} header must hold printable ASCII only")]
    NotAscii { header: HeaderName },
    /// The header is not a Structured Field string or a bare token.
    #[error("the {header} header is not a quoted string or a token: {reason}")]
    Malformed { header: HeaderName, reason: &'static str },
}

/// A validated idempotency key, as the client meant it (quotes and escapes removed).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key's characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a header carries it: bare when it is a token, else an sf-string (quoted,
    /// `"` and `\` escaped). Reading it back gives the same key; operators pass it to `key=`.
    pub fn header_form(&self) -> String {
        if parse_bare(self.0.as_bytes()).is_ok() && !self.0.is_empty() {
            return self.0.clone();
        }
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

// Keys are client secrets of a sort (they may embed user ids); never print them in full.
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} chars>)", self.0.len())
    }
}

/// Reads the key from `header`. `Ok(None)` means the header is absent; whether that is an
/// error is the route's decision.
pub fn extract(headers: &HeaderMap, header: &HeaderName, max_len: usize) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated { header: header.clone() });
    }
    let raw = value.as_bytes();
    if raw.iter().any(|&b| !(0x20..=0x7e).contains(&b) && b != b'\t') {
        return Err(KeyError::NotAscii { header: header.clone() });
    }
    let text = trim_ows(raw);
    let key = if text.first() == Some(&b'"') {
        parse_sf_string(text).map_err(|reason| KeyError::Malformed { header: header.clone(), reason })?
    } else {
        parse_bare(text).map_err(|reason| KeyError::Malformed { header: header.clone(), reason })?
    };
    if key.is_empty() {
        return Err(KeyError::Empty { header: header.clone() });
    }
    if key.len() > max_len {
        return Err(KeyError::TooLong { header: header.clone(), max: max_len });
    }
    Ok(Some(IdempotencyKey(key)))
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 8941 §4.2.5: a string is `"` *( unescaped / `\"` / `\\` ) `"`, printable ASCII only.
fn parse_sf_string(text: &[u8]) -> Result<String, &'static str> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text[1..].iter();
    loop {
        match chars.next() {
            None => return Err("the closing quote is missing"),
            Some(b'"') => break,
            Some(b'\\') => match chars.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c as char),
                _ => return Err("only \\\" and \\\\ may be escaped"),
            },
            Some(&c) if (0x20..=0x7e).contains(&c) => out.push(c as char),
            Some(_) => return Err("a quoted key holds printable ASCII only"),
        }
    }
    if chars.next().is_some() {
        return Err("nothing may follow the closing quote");
    }
    Ok(out)
}

/// A bare key: RFC 7230 token characters plus `:` and `/` (the sf-token alphabet), but
/// without sf-token's rule that the first character be a letter, so that bare UUIDs work.
fn parse_bare(text: &[u8]) -> Result<String, &'static str> {
    let is_token_char = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
    if !text.iter().all(|&c| is_token_char(c)) {
        return Err("an unquoted key holds token characters only (no spaces, quotes, commas)");
    }
    // The check above admits ASCII only, so this conversion cannot fail; keep it total anyway.
    String::from_utf8(text.to_vec()).map_err(|_| "an unquoted key holds ASCII only")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const H: HeaderName = HeaderName::from_static("idempotency-key");

    #[test]
    fn the_header_form_reads_back_as_the_same_key() {
        for raw in [&b"plain-key"[..], b"\"with space\"", b"\"q\\\"uote\\\\\"", b"\"a/b?c=d#e\"", b"uuid:1/2"] {
            let key =
                extract(&HeaderMap::from_iter([(H, HeaderValue::from_bytes(raw).unwrap())]), &H, 255).unwrap().unwrap();
            let form = HeaderValue::from_str(&key.header_form()).unwrap();
            let again = extract(&HeaderMap::from_iter([(H, form)]), &H, 255).unwrap().unwrap();
            assert_eq!(again, key, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    fn read(values: &[&[u8]], max: usize) -> Result<Option<String>, KeyError> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(H, HeaderValue::from_bytes(v).unwrap());
        }
        extract(&h, &H, max).map(|k| k.map(|k| k.as_str().to_owned()))
    }

    fn ok(v: &[u8]) -> String {
        read(&[v], 255).unwrap().unwrap()
    }

    #[test]
    fn absent_header_is_not_an_error_here() {
        assert_eq!(read(&[], 255), Ok(None));
    }

    #[test]
    fn structured_field_strings_are_unquoted_and_unescaped() {
        assert_eq!(ok(b"\"abc\""), "abc");
        assert_eq!(ok(br#""a\"b\\c""#), r#"a"b\c"#);
        assert_eq!(ok(b"  \"with space\"  "), "with space");
    }

    #[test]
    fn bare_tokens_are_accepted_including_leading_digits() {
        assert_eq!(ok(b"abc"), "abc");
        assert_eq!(ok(b"8e03978e-40d5-43e8-bc93-6894a57f9324"), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!(ok(b"order:42/retry"), "order:42/retry");
    }

    #[test]
    fn quoted_and_bare_forms_of_one_key_are_the_same_key() {
        assert_eq!(ok(b"\"abc\""), ok(b"abc"));
    }

    #[test]
    fn empty_keys_are_refused() {
        assert!(matches!(read(&[b"\"\""], 255), Err(KeyError::Empty { .. })));
        assert!(matches!(read(&[b""], 255), Err(KeyError::Empty { .. })));
        assert!(matches!(read(&[b"   "], 255), Err(KeyError::Empty { .. })));
    }

    #[test]
    fn length_is_counted_after_unquoting() {
        assert_eq!(read(&[b"\"abcd\""], 4), Ok(Some("abcd".into())));
        assert!(matches!(read(&[b"abcde"], 4), Err(KeyError::TooLong { max: 4, .. })));
    }

    #[test]
    fn non_ascii_is_refused() {
        assert!(matches!(read(&["\"caf\u{e9}\"".as_bytes()], 255), Err(KeyError::NotAscii { .. })));
        assert!(matches!(read(&[b"\xffabc"], 255), Err(KeyError::NotAscii { .. })));
    }

    #[test]
    fn repeated_header_is_refused() {
        assert!(matches!(read(&[b"a", b"a"], 255), Err(KeyError::Repeated { .. })));
    }

    #[test]
    fn malformed_values_are_refused() {
        for v in [&b"\"unterminated"[..], b"\"bad \\n escape\"", b"\"a\";param=1", b"\"a\" \"b\"", b"two words", b"a,b"]
        {
            assert!(matches!(read(&[v], 255), Err(KeyError::Malformed { .. })), "{:?}", String::from_utf8_lossy(v));
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever bytes a client sends, reading the key answers; it never panics.
            #[test]
            fn any_header_value_is_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                    let mut h = HeaderMap::new();
                    h.insert(H, value);
                    let _ = extract(&h, &H, 255);
                }
            }

            /// Any printable ASCII key, quoted with its `"` and `\` escaped, reads back as itself.
            #[test]
            fn a_quoted_key_round_trips(key in "[ -~]{1,100}") {
                let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
                prop_assert_eq!(read(&[quoted.as_bytes()], 255), Ok(Some(key)));
            }
        }
    }
}
