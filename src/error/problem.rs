//! One error as it is answered: status, problem type, title, detail, `Retry-After`, whether
//! the connection closes, how it is counted and logged; and its rendering, as problem+json or
//! in the shape the route's API uses for its own errors.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use super::GatewayError;
use crate::body::{self, Body};
use crate::metrics::Outcome;
use crate::policy::errors::{ErrorShape, Values};

/// How one error is answered, counted and logged.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The response status.
    pub status: StatusCode,
    /// The anchor in the error docs: the problem's `type` is `server.problem_base` + slug.
    pub slug: &'static str,
    /// The fixed title of this kind of problem.
    pub title: &'static str,
    /// What the client is told, in words, without internals.
    pub detail: Cow<'static, str>,
    /// When to come back (`Retry-After`, whole seconds, at least 1).
    pub retry_after: Option<Duration>,
    /// Whether the connection closes after this answer.
    pub close: bool,
    /// How the request is counted (`idemgate_requests_total{outcome}`).
    pub outcome: Outcome,
    /// Logged as a warning (the gateway, or what it depends on, failed) rather than at debug
    /// level (the client's request was refused).
    pub warn: bool,
}

/// The problem+json document.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// Until the store, the gateway or the upstream has room again.
pub(super) const SOON: Duration = Duration::from_secs(1);

impl Problem {
    /// A request refused for what it is: counted as rejected, logged at debug level.
    pub fn refused(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
            close: false,
            outcome: Outcome::Rejected,
            warn: false,
        }
    }

    /// A request the gateway could not serve: counted as `outcome`, logged as a warning.
    pub(super) fn failed(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<Cow<'static, str>>,
        outcome: Outcome,
    ) -> Self {
        Self { outcome, warn: true, ..Self::refused(status, slug, title, detail) }
    }

    pub(super) fn counted(self, outcome: Outcome) -> Self {
        Self { outcome, ..self }
    }

    pub(super) fn retry_after(self, after: Duration) -> Self {
        Self { retry_after: Some(after), ..self }
    }

    pub(super) fn retry_after_if(self, after: Option<Duration>) -> Self {
        Self { retry_after: after, ..self }
    }

    /// Logged at debug level: what the log says about it is said elsewhere, once.
    pub(super) fn quiet(self) -> Self {
        Self { warn: false, ..self }
    }

    pub(super) fn closing(self) -> Self {
        Self { close: true, ..self }
    }

    /// The answer to a retry of a request that ran and answered `status`, whose body was too
    /// large to keep: not an error of the retry's, so it is counted as a replay.
    pub fn not_stored(status: StatusCode) -> Self {
        let detail = format!(
            "The request with this idempotency key was processed and answered {}, but its \
             response was too large to keep for retries. It will not be run again; fetch the \
             resource it created or changed to see the result.",
            status.as_u16()
        );
        Self::refused(status, "response-not-stored", "Response not stored", detail).counted(Outcome::Replayed)
    }

    /// The problem+json response, with `type` = `problem_base` + slug.
    pub fn respond(&self, problem_base: &str) -> Response<Body> {
        self.respond_as(problem_base, &ErrorShape::default())
    }

    /// The response in `shape` (the API's own error envelope, see `[errors]`), or problem+json
    /// where the shape leaves it.
    pub fn respond_as(&self, problem_base: &str, shape: &ErrorShape) -> Response<Body> {
        let overrides = shape.types.get(self.slug);
        let status = overrides.and_then(|t| t.status).unwrap_or(self.status);
        // Whole seconds, rounded up, at least 1: "Retry-After: 0" invites a hot loop.
        let retry_after = self.retry_after.map(|after| (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1));
        let type_uri = format!("{problem_base}{}", self.slug);
        let (body, content_type) = match &shape.envelope {
            Some(envelope) => {
                let template = overrides.and_then(|t| t.body.as_ref()).unwrap_or(&envelope.body);
                let values = Values {
                    kind: self.slug,
                    type_uri: &type_uri,
                    title: self.title,
                    detail: &self.detail,
                    status: status.as_u16(),
                    retry_after: retry_after.unwrap_or(0),
                };
                (template.render(envelope.kind, &values).into_bytes(), envelope.content_type.clone())
            }
            None => {
                let document =
                    Document { kind: type_uri, title: self.title, status: status.as_u16(), detail: &self.detail };
                let json = serde_json::to_vec(&document).unwrap_or_else(|_| b"{}".to_vec());
                (json, HeaderValue::from_static("application/problem+json"))
            }
        };
        let mut response = Response::new(body::full(Bytes::from(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Some(overrides) = overrides {
            for (name, value) in &overrides.headers {
                headers.append(name.clone(), value.clone());
            }
        }
        headers.insert(header::CONTENT_TYPE, content_type);
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// Logs `error` on `route` at this problem's level.
    pub fn log(&self, route: &str, error: &GatewayError) {
        if self.warn {
            tracing::warn!(route = %route, error = %error, "request failed");
        } else {
            tracing::debug!(route = %route, error = %error, "request refused");
        }
    }
}
