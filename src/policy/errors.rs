//! The shape of the gateway's own errors (`[errors]`, `[routes.errors]`): today's
//! problem+json, or the API's own envelope, so that its clients and SDKs can read them.
//!
//! A shape is a content type and a body template, and per problem type (`key-reused`,
//! `in-progress`, ...) an optional status, body and extra headers. Templates take the
//! placeholders `{type}` (the slug), `{type_uri}` (the problem+json `type`), `{title}`,
//! `{detail}`, `{status}` and `{retry_after}` (whole seconds, `0` when the answer has none).
//!
//! The hazard is `{detail}`, which can echo client input (a header name, a path): in a JSON
//! body every value is JSON-escaped (the template puts the quotes), and in text every control
//! character is dropped, so no value can close a string, add a member or split a line.

use std::collections::HashMap;

use http::{HeaderMap, StatusCode};

/// Every problem type the gateway answers with (the `type` slugs), for `[errors.TYPE]`.
pub const PROBLEM_TYPES: [&str; 22] = [
    "no-route",
    "key-missing",
    "key-malformed",
    "body-too-large",
    "body-unreadable",
    "body-timeout",
    "scope-missing",
    "bad-host",
    "misdirected-request",
    "upgrade-refused",
    "connection-header",
    "too-many-new-keys",
    "in-progress",
    "key-reused",
    "overloaded",
    "outcome-unknown",
    "store-unavailable",
    "upstream-unavailable",
    "upstream-timeout",
    "shutting-down",
    "internal",
    "response-not-stored",
];

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 6] = ["type", "type_uri", "title", "detail", "status", "retry_after"];

/// How the gateway's errors look on a route (or before any route matched).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorShape {
    /// `None`: problem+json, as documented in the error docs.
    pub envelope: Option<Envelope>,
    /// Per problem type (slug): its own status, body and headers.
    pub types: HashMap<String, TypeShape>,
}

/// The API's own error envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// What the body is.
    pub kind: BodyKind,
    /// The `Content-Type` sent.
    pub content_type: http::HeaderValue,
    /// The body for every problem type without one of its own.
    pub body: Template,
}

/// What one problem type changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeShape {
    /// The status instead of the gateway's.
    pub status: Option<StatusCode>,
    /// The body instead of the envelope's.
    pub body: Option<Template>,
    /// Headers added to the answer.
    pub headers: HeaderMap,
}

/// JSON or text: how values are escaped into a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `application/json` and `application/*+json`: values JSON-escaped.
    Json,
    /// `text/plain`: control characters dropped.
    Text,
}

impl BodyKind {
    /// The kind of a `content_type`, or why it cannot carry a template.
    pub fn of(content_type: &str) -> Result<Self, String> {
        let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match essence.as_str() {
            "text/plain" => Ok(Self::Text),
            "application/json" => Ok(Self::Json),
            json if json.starts_with("application/") && json.ends_with("+json") => Ok(Self::Json),
            _ => Err(format!("{content_type:?}: templates are JSON (application/json) or text/plain only")),
        }
    }
}

/// A body with placeholders, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(usize),
}

/// The values a problem fills a template with.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    /// The slug.
    pub kind: &'a str,
    /// The full type URI.
    pub type_uri: &'a str,
    /// The title.
    pub title: &'a str,
    /// The detail.
    pub detail: &'a str,
    /// The status sent.
    pub status: u16,
    /// Retry-After in whole seconds, 0 for none.
    pub retry_after: u64,
}

impl Template {
    /// Parses `text`: `{name}` with `name` made of `a-z` and `_` is a placeholder and must be
    /// a known one; every other brace is text (a JSON body is full of them).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            literal.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let name_len = after.bytes().take_while(|b| b.is_ascii_lowercase() || *b == b'_').count();
            if name_len > 0 && after.as_bytes().get(name_len) == Some(&b'}') {
                let name = &after[..name_len];
                let Some(index) = PLACEHOLDERS.iter().position(|p| *p == name) else {
                    return Err(format!(
                        "{{{name}}} is not a placeholder; the placeholders are {}",
                        PLACEHOLDERS.iter().map(|p| format!("{{{p}}}")).collect::<Vec<_>>().join(", ")
                    ));
                };
                if !literal.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                }
                parts.push(Part::Field(index));
                rest = &after[name_len + 1..];
            } else {
                literal.push('{');
                rest = after;
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Self(parts))
    }

    /// The body for `values`, each escaped for `kind`.
    pub fn render(&self, kind: BodyKind, values: &Values<'_>) -> String {
        let mut out = String::new();
        for part in &self.0 {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(index) => {
                    let number;
                    let value = match *index {
                        0 => values.kind,
                        1 => values.type_uri,
                        2 => values.title,
                        3 => values.detail,
                        4 => {
                            number = values.status.to_string();
                            &number
                        }
                        _ => {
                            number = values.retry_after.to_string();
                            &number
                        }
                    };
                    escape(kind, value, &mut out);
                }
            }
        }
        out
    }
}

/// `value` as it may stand inside the template: inside a JSON string, or in text.
fn escape(kind: BodyKind, value: &str, out: &mut String) {
    match kind {
        BodyKind::Json => {
            let quoted = serde_json::Value::String(value.to_owned()).to_string();
            // The serialised string without its quotes: the template writes those.
            out.push_str(&quoted[1..quoted.len() - 1]);
        }
        BodyKind::Text => out.extend(value.chars().filter(|c| !c.is_control())),
    }
}

/// Values chosen to break a body that does not escape them: quotes, backslashes, braces,
/// control characters, and numbers that are zero and not.
pub fn sample_values(retry_after: u64) -> Values<'static> {
    Values {
        kind: "key-reused",
        type_uri: "https://example.com/errors#key-reused",
        title: "Idempotency \"key\" reused",
        detail: "a \"quoted\" \\ detail, {braces},\nnew line\u{7}",
        status: 422,
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_cannot_break_out_of_their_string() {
        let t = Template::parse(r#"{"error": {"type": "{type}", "message": "{detail}", "status": {status}}}"#).unwrap();
        let body = t.render(BodyKind::Json, &sample_values(0));
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["error"]["message"], sample_values(0).detail);
        assert_eq!(doc["error"]["status"], 422);
        assert_eq!(doc.as_object().unwrap().len(), 1);
    }

    #[test]
    fn text_drops_control_characters() {
        let t = Template::parse("{title}: {detail} (retry in {retry_after}s)").unwrap();
        let body = t.render(BodyKind::Text, &sample_values(3));
        assert!(!body.contains('\n') && !body.contains('\u{7}'), "{body:?}");
        assert!(body.ends_with("(retry in 3s)"), "{body}");
    }

    #[test]
    fn unknown_placeholders_are_refused_and_other_braces_are_text() {
        assert!(Template::parse("{typo}").unwrap_err().contains("{typo} is not a placeholder"));
        let t = Template::parse("{\"a\": {}, \"b\": \"{ x }\"}").unwrap();
        assert_eq!(t.render(BodyKind::Json, &sample_values(0)), "{\"a\": {}, \"b\": \"{ x }\"}");
    }

    #[test]
    fn content_types_are_json_or_text() {
        assert_eq!(BodyKind::of("application/json; charset=utf-8"), Ok(BodyKind::Json));
        assert_eq!(BodyKind::of("application/vnd.api+json"), Ok(BodyKind::Json));
        assert_eq!(BodyKind::of("text/plain"), Ok(BodyKind::Text));
        assert!(BodyKind::of("text/html").is_err());
        assert!(BodyKind::of("application/xml").is_err());
    }
}
