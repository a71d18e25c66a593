//! `Idempotency-Key` header normalisation, and the key of a lookup.
//!
//! The IETF draft defines the header as an RFC 8941 sf-string (`"abc"`), but many clients
//! send the bare value (`abc`). Both spellings must map to the same stored key, otherwise a
//! retry that switches spelling would slip past the `UNIQUE(user_id, idem_key)` backstop.
//!
//! `GET /orders/lookup` reads the header the same way, or, without it, a `key` query
//! parameter that holds the stored key itself, percent-encoded.

use axum::http::HeaderMap;

use crate::error::ApiError;

pub const HEADER: &str = "idempotency-key";

/// The query parameter `GET /orders/lookup` reads when the header is absent.
pub const QUERY_PARAM: &str = "key";

/// Longest key accepted, in bytes after unquoting. Bounds the size of the unique index
/// entry; Postgres rejects btree entries above roughly 2.7 KB with an error that would
/// otherwise surface as a 500.
pub const MAX_LEN: usize = 255;

/// Extracts and normalises the key; every failure is a client error.
pub fn from_headers(headers: &HeaderMap) -> Result<String, ApiError> {
    let mut values = headers.get_all(HEADER).iter();
    let value = values.next().ok_or(ApiError::MissingKey)?;
    if values.next().is_some() {
        return Err(ApiError::InvalidKey("multiple Idempotency-Key headers"));
    }
    let text = value.to_str().map_err(|_| ApiError::InvalidKey("Idempotency-Key must be visible ASCII"))?;
    normalise(text)
}

/// The key of a lookup: the header when there is one, parsed as POST parses it; else the
/// `key` query parameter.
pub fn for_lookup(headers: &HeaderMap, query: Option<&str>) -> Result<String, ApiError> {
    if headers.contains_key(HEADER) {
        return from_headers(headers);
    }
    let value = from_query(query.unwrap_or(""))?.ok_or(ApiError::MissingLookupKey)?;
    stored_form(value)
}

/// The percent-decoded value of the one `key` parameter, if there is one. `+` stays a plus:
/// the key is a URL query value, not a form field, and a space is `%20`.
fn from_query(query: &str) -> Result<Option<String>, ApiError> {
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // Other parameters are none of our business, however they are encoded.
        if percent_decode(name).ok().as_deref() != Some(QUERY_PARAM) {
            continue;
        }
        // As with repeated headers: which of two keys was meant is not ours to guess.
        if found.is_some() {
            return Err(ApiError::InvalidKey("multiple key query parameters"));
        }
        found = Some(percent_decode(value)?);
    }
    Ok(found)
}

/// A query value is the key itself, as stored: percent-encoding already quotes it, so it is
/// not unquoted again as an sf-string. Otherwise `%22x%22` would find the key `x`, and the
/// key `"x"` (sent as the sf-string `"\"x\""`) could not be looked up at all; the
/// gateway's reconcile lookup (`?key={key}`) sends the unquoted key this way. Any value a
/// header can produce is accepted: printable ASCII, spaces included.
fn stored_form(value: String) -> Result<String, ApiError> {
    if value.is_empty() {
        return Err(ApiError::InvalidKey("the key query parameter must not be empty"));
    }
    if value.len() > MAX_LEN {
        return Err(ApiError::InvalidKey("the key query parameter is longer than 255 bytes"));
    }
    if !value.bytes().all(|b| matches!(b, b' '..=b'~')) {
        return Err(ApiError::InvalidKey("the key query parameter must be printable ASCII"));
    }
    Ok(value)
}

/// Decodes `%XX` escapes. A `%` not followed by two hex digits is refused rather than kept:
/// it is a client's encoding mistake, and guessing could look up a key nobody meant.
fn percent_decode(raw: &str) -> Result<String, ApiError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        match (bytes.next().and_then(hex_digit), bytes.next().and_then(hex_digit)) {
            (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
            _ => return Err(ApiError::InvalidKey("malformed percent-encoding in the query")),
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::InvalidKey("the key query parameter must be printable ASCII"))
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Returns the inner value of an sf-string, or a bare value unchanged.
pub fn normalise(raw: &str) -> Result<String, ApiError> {
    let raw = raw.trim_matches(|c| c == ' ' || c == '\t');
    let key = match raw.strip_prefix('"') {
        Some(rest) => parse_sf_string(rest)?,
        None => parse_bare(raw)?,
    };
    if key.is_empty() {
        return Err(ApiError::InvalidKey("Idempotency-Key must not be empty"));
    }
    if key.len() > MAX_LEN {
        return Err(ApiError::InvalidKey("Idempotency-Key is longer than 255 bytes"));
    }
    Ok(key)
}

/// Parses the remainder of an sf-string after its opening quote (RFC 8941 §4.2.5).
/// Parameters after the closing quote are rejected rather than ignored: silently dropping
/// them could merge keys the client meant to keep apart.
fn parse_sf_string(rest: &str) -> Result<String, ApiError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => {
                    return Err(ApiError::InvalidKey("invalid escape in quoted Idempotency-Key"));
                }
            },
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err(ApiError::InvalidKey("unexpected data after quoted Idempotency-Key"))
                };
            }
            ' '..='~' => out.push(c),
            _ => {
                return Err(ApiError::InvalidKey("Idempotency-Key must be visible ASCII"));
            }
        }
    }
    Err(ApiError::InvalidKey("unterminated quoted Idempotency-Key"))
}

/// Bare values are accepted more loosely than an sf-token: UUIDs, the most common key,
/// may start with a digit, which a strict token parser would reject. Quotes and
/// backslashes are refused because they only make sense inside an sf-string.
fn parse_bare(raw: &str) -> Result<String, ApiError> {
    if raw.chars().all(|c| matches!(c, '!'..='~') && c != '"' && c != '\\') {
        Ok(raw.to_owned())
    } else {
        Err(ApiError::InvalidKey("Idempotency-Key must be a quoted string or a token without spaces"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> String {
        match normalise(raw) {
            Ok(key) => key,
            Err(err) => panic!("{raw:?} rejected: {err}"),
        }
    }

    #[test]
    fn quoted_and_bare_are_the_same_key() {
        assert_eq!(ok("\"abc\""), "abc");
        assert_eq!(ok("abc"), "abc");
        assert_eq!(ok("  \"abc\"  "), "abc");
        assert_eq!(ok("8e03978e-40d5-43e8-bc93-6894a57f9324"), "8e03978e-40d5-43e8-bc93-6894a57f9324");
    }

    #[test]
    fn escapes_are_decoded() {
        assert_eq!(ok(r#""a\"b""#), "a\"b");
        assert_eq!(ok(r#""a\\b""#), "a\\b");
        assert_eq!(ok("\"with space\""), "with space");
    }

    #[test]
    fn malformed_keys_are_rejected() {
        for raw in ["", "\"\"", "\"abc", "\"a\\nb\"", "\"abc\";p=1", "a b", "a\"b", "a\\b", "   "] {
            assert!(normalise(raw).is_err(), "{raw:?} accepted");
        }
        assert!(normalise(&"k".repeat(MAX_LEN)).is_ok());
        assert!(normalise(&"k".repeat(MAX_LEN + 1)).is_err());
    }

    fn lookup(query: &str) -> Result<String, ApiError> {
        for_lookup(&HeaderMap::new(), Some(query))
    }

    #[test]
    fn a_query_key_is_the_stored_key_percent_decoded() {
        let found = |query: &str| match lookup(query) {
            Ok(key) => key,
            Err(err) => panic!("{query:?} rejected: {err}"),
        };
        assert_eq!(found("key=abc"), "abc");
        assert_eq!(found("other=1&key=%61b%63"), "abc");
        assert_eq!(found("x%zz=%zz&key=abc"), "abc", "a broken parameter that is not ours is ignored");
        assert_eq!(found("k%65y=a%2Fb"), "a/b");
        assert_eq!(found("key=a+b"), "a+b", "a plus is a plus");
        assert_eq!(found("key=a%20b"), "a b", "as the sf-string \"a b\" stores it");
        assert_eq!(found("key=%22x%22"), "\"x\"", "not unquoted a second time");
        assert_eq!(found("key=a%5Cb"), "a\\b");
        assert_eq!(found("key=../x"), "../x", "a path-like key is just a key");
        assert_eq!(found("key=%2F"), "/");
        assert_eq!(found(&format!("key={}", "k".repeat(MAX_LEN))).len(), MAX_LEN);
    }

    #[test]
    fn the_gateways_encoding_round_trips() {
        // Every byte outside A-Za-z0-9-_~ as %XX, as the gateway's reconcile lookup sends it.
        let encode = |key: &str| {
            key.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_~".contains(&b) {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect::<String>()
        };
        for key in ["8e03978e-40d5-43e8-bc93-6894a57f9324", "a b", "\"x\"", "a\\b", "..", "%2F", "?x=1&key=y"] {
            assert_eq!(lookup(&format!("key={}", encode(key))).ok().as_deref(), Some(key), "{key:?}");
        }
    }

    #[test]
    fn header_wins_over_query() {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, axum::http::HeaderValue::from_static("\"from-header\""));
        assert_eq!(for_lookup(&headers, Some("key=from-query")).ok().as_deref(), Some("from-header"));
    }

    #[test]
    fn bad_query_keys_are_rejected() {
        assert!(matches!(lookup(""), Err(ApiError::MissingLookupKey)));
        assert!(matches!(lookup("keys=a&xkey=b"), Err(ApiError::MissingLookupKey)));
        assert!(matches!(for_lookup(&HeaderMap::new(), None), Err(ApiError::MissingLookupKey)));
        let too_long = format!("key={}", "k".repeat(MAX_LEN + 1));
        for query in [
            "key=",
            "key",
            "key=a&key=b",
            "key=%2",
            "key=%zz",
            "key=%C3%A9",
            "key=%FF",
            "key=%00",
            "key=a%09b",
            &too_long,
        ] {
            assert!(matches!(lookup(query), Err(ApiError::InvalidKey(_))), "{query:?} accepted");
        }
    }
}
