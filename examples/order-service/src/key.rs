//! `Idempotency-Key` header normalisation.
//!
//! The IETF draft defines the header as an RFC 8941 sf-string (`"abc"`), but many clients
//! send the bare value (`abc`). Both spellings must map to the same stored key, otherwise a
//! retry that switches spelling would slip past the `UNIQUE(user_id, idem_key)` backstop.

use axum::http::HeaderMap;

use crate::error::ApiError;

pub const HEADER: &str = "idempotency-key";

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
}
