//! The caller, from `Authorization: Bearer <user>`.
//!
//! This is the demo's stand-in for real authentication: the token *is* the user id. A real
//! service would verify a token here and take the user from its claims; everything after
//! this module only sees the resulting [`User`], so orders, the `UNIQUE(user_id, idem_key)`
//! backstop and the lookups are all scoped to the authenticated caller, never to a value
//! the body chose.
//!
//! The spelling rules follow the gateway's `header:Authorization` scope (see
//! `src/policy/scope.rs` in the gateway): the scheme is case-insensitive and the spaces
//! around the token do not count, so that one gateway scope is always one user here.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

use crate::error::ApiError;

/// Longest user id accepted, in bytes. Keeps the index entry and the log lines small.
pub const MAX_LEN: usize = 128;

/// An authenticated user id: 1 to [`MAX_LEN`] visible ASCII characters, no spaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User(String);

impl User {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Reads the caller; every failure is a 401.
pub fn from_headers(headers: &HeaderMap) -> Result<User, ApiError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(ApiError::MissingBearer("missing Authorization: Bearer header"))?;
    // Two credentials would leave the choice of user to whichever one a proxy kept.
    if values.next().is_some() {
        return Err(ApiError::InvalidBearer("multiple Authorization headers"));
    }
    let text = value.to_str().map_err(|_| ApiError::InvalidBearer("Authorization must be visible ASCII"))?;
    parse(text)
}

/// Parses `Bearer <token>` (RFC 6750 §2.1, with the scheme matched case-insensitively as
/// RFC 9110 §11.1 asks).
pub fn parse(raw: &str) -> Result<User, ApiError> {
    let raw = raw.trim_matches(|c| c == ' ' || c == '\t');
    let (scheme, token) = raw.split_once(' ').unwrap_or((raw, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::MissingBearer("Authorization must use the Bearer scheme"));
    }
    user(token.trim_start_matches(' '))
}

fn user(token: &str) -> Result<User, ApiError> {
    let visible = token.bytes().all(|b| b.is_ascii_graphic());
    if token.is_empty() || token.len() > MAX_LEN || !visible {
        return Err(ApiError::InvalidBearer("bearer token must be 1 to 128 visible ASCII characters without spaces"));
    }
    Ok(User(token.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> String {
        match parse(raw) {
            Ok(user) => user.0,
            Err(err) => panic!("{raw:?} rejected: {err}"),
        }
    }

    #[test]
    fn scheme_is_case_insensitive_and_spaces_around_the_token_do_not_count() {
        for raw in ["Bearer alice", "bearer alice", "BEARER alice", "  Bearer   alice  "] {
            assert_eq!(ok(raw), "alice", "{raw:?}");
        }
        assert_eq!(ok("Bearer ALICE"), "ALICE", "the token itself keeps its case");
        assert_eq!(ok("Bearer u-1/x=="), "u-1/x==");
    }

    #[test]
    fn other_schemes_are_missing_credentials() {
        for raw in ["", "Basic YWxpY2U6", "Bearer", "Bearer ", "Beareralice", "Token alice"] {
            let err = parse(raw).err();
            assert!(matches!(err, Some(ApiError::MissingBearer(_) | ApiError::InvalidBearer(_))), "{raw:?}");
        }
        assert!(matches!(parse("Basic YWxpY2U6"), Err(ApiError::MissingBearer(_))));
    }

    #[test]
    fn tokens_that_cannot_be_a_user_are_invalid() {
        for raw in ["Bearer a b", "Bearer a\tb", "Bearer \u{e9}", "Bearer a\u{7f}"] {
            assert!(matches!(parse(raw), Err(ApiError::InvalidBearer(_))), "{raw:?}");
        }
        assert_eq!(ok(&format!("Bearer {}", "u".repeat(MAX_LEN))).len(), MAX_LEN);
        assert!(matches!(parse(&format!("Bearer {}", "u".repeat(MAX_LEN + 1))), Err(ApiError::InvalidBearer(_))));
    }
}
