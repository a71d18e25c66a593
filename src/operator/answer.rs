//! The answer that settles a held key (`PUT /keys`, `idemgate keys resolve`), read and
//! checked in one place for the admin listener and the command line alike.
//!
//! The hazard is framing. An answer is replayed to every retry for the route's retention; a
//! `Content-Length` or `Transfer-Encoding` that does not match its body would make the next
//! response on a keep-alive connection start inside this one (response splitting), and a
//! crafted body would smuggle a whole response to whoever shares the connection. So an answer
//! may carry only headers a replay may carry: every header the gateway never stores from an
//! upstream is refused, by name, and so is a body on a status that has none (204, 205, 304).
//! (Replays are framed from the body they send all the same: see `idempotent::reply`.)

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use thiserror::Error;

use crate::headers::{self, StoredHeaders, has_no_body};
use crate::store::StoredResponse;

/// Why an operator's answer was refused. Each names what to change.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AnswerError {
    /// Not the document `{"status": 201, "headers": {...}, "body": "..."}`.
    #[error("the answer must be {{\"status\": 201, \"headers\": {{\"name\": \"value\"}}, \"body\": \"...\"}}: {0}")]
    Shape(String),
    /// A status no final response has.
    #[error("status {0} is not between 200 and 599")]
    Status(u16),
    /// A name that is not a header name.
    #[error("{0:?} is not a header name")]
    HeaderName(String),
    /// A value a header cannot carry.
    #[error("the value of {0} holds characters a header cannot carry")]
    HeaderValue(String),
    /// A header a replay never carries.
    #[error("the header {name} cannot be part of a stored answer: {why}")]
    NeverStored {
        /// The header.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A header the route does not store (`replay_headers`, `exclude_headers`).
    #[error("the header {0} is not stored on this route (its replay_headers or exclude_headers leave it out)")]
    NotStoredHere(String),
    /// A body on a status that has none.
    #[error("status {0} has no body (RFC 9110 §15); send the answer without one")]
    BodyNotAllowed(u16),
}

/// Why the header `name` can never be part of an answer an operator gives, if it cannot: the
/// headers the gateway never stores from an upstream's answer either.
pub fn refused_header(name: &HeaderName) -> Option<&'static str> {
    headers::never_stored(name)
}

/// Reads an operator's answer: `{"status": 201, "headers": {"name": "value" or ["v1", "v2"]},
/// "body": "..."}`, for a route that stores `stored` headers. Every header must be one a
/// replay may carry on that route, and a status without a body must come without one.
pub fn parse_answer(document: &[u8], stored: &StoredHeaders) -> Result<StoredResponse, AnswerError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Answer {
        status: u16,
        #[serde(default)]
        headers: BTreeMap<String, OneOrMany>,
        #[serde(default)]
        body: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let answer: Answer = serde_json::from_slice(document).map_err(|e| AnswerError::Shape(e.to_string()))?;
    let status = StatusCode::from_u16(answer.status)
        .ok()
        .filter(|s| (200..600).contains(&s.as_u16()))
        .ok_or(AnswerError::Status(answer.status))?;
    if has_no_body(status) && !answer.body.is_empty() {
        return Err(AnswerError::BodyNotAllowed(status.as_u16()));
    }
    let mut headers = HeaderMap::new();
    for (name, values) in answer.headers {
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| AnswerError::HeaderName(name.clone()))?;
        if let Some(why) = refused_header(&header) {
            return Err(AnswerError::NeverStored { name: header.as_str().to_owned(), why });
        }
        if !stored.stores(&header) {
            return Err(AnswerError::NotStoredHere(header.as_str().to_owned()));
        }
        let values = match values {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(vs) => vs,
        };
        for value in values {
            let value =
                HeaderValue::from_str(&value).map_err(|_| AnswerError::HeaderValue(header.as_str().to_owned()))?;
            headers.append(header.clone(), value);
        }
    }
    Ok(StoredResponse { status, headers, body: Bytes::from(answer.body).into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(doc: &str) -> Result<StoredResponse, AnswerError> {
        parse_answer(doc.as_bytes(), &StoredHeaders::default())
    }

    #[test]
    fn an_answer_reads_with_its_headers_and_body() {
        let answer = parse(
            r#"{"status": 201, "headers": {"Content-Type": "application/json", "link": ["<a>", "<b>"]}, "body": "{\"id\":1}"}"#,
        )
        .unwrap();
        assert_eq!(answer.status, 201);
        assert_eq!(answer.headers["content-type"], "application/json");
        assert_eq!(answer.headers.get_all("link").iter().count(), 2);
        assert_eq!(answer.body.to_bytes(), Bytes::from_static(b"{\"id\":1}"));
    }

    #[test]
    fn framing_and_connection_headers_are_refused_by_name() {
        for name in ["content-length", "Content-Length", "transfer-encoding", "connection", "keep-alive", "upgrade"] {
            let doc = format!(r#"{{"status": 201, "headers": {{"{name}": "2"}}, "body": "{{\"order_id\":1}}"}}"#);
            match parse(&doc) {
                Err(AnswerError::NeverStored { name: refused, .. }) => assert_eq!(refused, name.to_lowercase()),
                other => panic!("{name}: {other:?}"),
            }
        }
        for name in ["set-cookie", "date", "www-authenticate", "proxy-status"] {
            let doc = format!(r#"{{"status": 200, "headers": {{"{name}": "x"}}}}"#);
            assert!(matches!(parse(&doc), Err(AnswerError::NeverStored { .. })), "{name}");
        }
    }

    #[test]
    fn the_message_names_the_header_and_why() {
        let e = parse(r#"{"status": 201, "headers": {"content-length": "2"}, "body": "{}"}"#).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("the header content-length cannot be part of a stored answer"), "{text}");
        assert!(text.contains("framed from the body"), "{text}");
    }

    #[test]
    fn statuses_without_a_body_take_none() {
        for status in [204, 205, 304] {
            let with = format!(r#"{{"status": {status}, "body": "x"}}"#);
            assert_eq!(parse(&with), Err(AnswerError::BodyNotAllowed(status)));
            let without = format!(r#"{{"status": {status}}}"#);
            assert!(parse(&without).unwrap().body.is_empty());
        }
    }

    #[test]
    fn a_route_that_leaves_a_header_out_refuses_it() {
        let stored = StoredHeaders { allow: None, exclude: vec![HeaderName::from_static("x-internal")] };
        let doc = br#"{"status": 200, "headers": {"x-internal": "1"}}"#;
        assert_eq!(parse_answer(doc, &stored), Err(AnswerError::NotStoredHere("x-internal".into())));
        let allow = StoredHeaders { allow: Some(vec![HeaderName::from_static("location")]), exclude: vec![] };
        let doc = br#"{"status": 201, "headers": {"content-type": "a/b"}}"#;
        assert_eq!(parse_answer(doc, &allow), Err(AnswerError::NotStoredHere("content-type".into())));
    }

    #[test]
    fn bad_documents_and_statuses_are_refused() {
        assert!(matches!(parse("{"), Err(AnswerError::Shape(_))));
        assert!(matches!(parse(r#"{"status": 201, "extra": 1}"#), Err(AnswerError::Shape(_))));
        assert_eq!(parse(r#"{"status": 101}"#), Err(AnswerError::Status(101)));
        assert_eq!(parse(r#"{"status": 600}"#), Err(AnswerError::Status(600)));
        assert!(matches!(parse(r#"{"status": 200, "headers": {"a b": "x"}}"#), Err(AnswerError::HeaderName(_))));
        assert!(matches!(parse(r#"{"status": 200, "headers": {"a": "x\ny"}}"#), Err(AnswerError::HeaderValue(_))));
    }
}
