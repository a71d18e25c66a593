//! Every error the proxy can answer with, and the ONE place that turns them into responses.
//!
//! Responses are `application/problem+json` (RFC 9457) with a `type` URI into the published
//! error docs, a fixed `title` per kind and a `detail` in words. Internals (store addresses,
//! upstream error chains) go to the log, never to the client.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use thiserror::Error;

use crate::body::{self, Body, BodyError};
use crate::idempotent::key::KeyError;
use crate::idempotent::scope::ScopeMissing;
use crate::store::StoreError;
use crate::upstream::UpstreamError;

/// Why a request was not served by the upstream or from the store.
#[derive(Debug, Error)]
pub enum GatewayError {
    /// No route matches the method and path.
    #[error("no route for {method} {path}")]
    NoRoute {
        /// Request method.
        method: http::Method,
        /// Request path.
        path: String,
    },
    /// The idempotency key is missing or malformed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The request body is too large or could not be read.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// A keyed request lacks a source of its route's scope, and the route rejects those.
    #[error(transparent)]
    Scope(#[from] ScopeMissing),
    /// `Connection` names a header the gateway reads (the key, the scope, the body's framing
    /// or type, Host): forwarding the request without it would change what it means.
    #[error("Connection names {header}, which this route needs")]
    ConnectionHeader {
        /// The header named.
        header: String,
    },
    /// An HTTP/1.1 request without exactly one Host header.
    #[error("bad Host header")]
    BadHost {
        /// What is wrong with it.
        detail: &'static str,
    },
    /// The caller used up its budget of new keys on this route.
    #[error("too many new idempotency keys")]
    TooManyNewKeys {
        /// Until the budget's window ends.
        retry_after: Duration,
    },
    /// A protocol upgrade (WebSocket) on an idempotent route.
    #[error("protocol upgrade on an idempotent route")]
    UpgradeRefused,
    /// Too many upstream exchanges run at once (in all, or for this connection).
    #[error("too many requests running upstream")]
    Overloaded,
    /// The key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// The first request with this key is still running.
    #[error("a request with this idempotency key is still in progress")]
    InFlight {
        /// Time left on the first request's lease.
        retry_after: Duration,
    },
    /// The store failed and the route fails closed.
    #[error("idempotency store unavailable: {0}")]
    StoreUnavailable(StoreError),
    /// The upstream could not be reached, failed, or timed out.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The request was sent upstream and no complete answer came back, so nobody knows whether
    /// the upstream acted on it; the key is held and no retry runs it again.
    #[error("the outcome of the request with this key is unknown")]
    OutcomeUnknown {
        /// The exchange ran out of time (504) rather than broke (502).
        timed_out: bool,
    },
    /// The first request ran and answered `status`, but its body was too large to store.
    #[error("the response to this key was not stored")]
    ResponseNotStored {
        /// The status the first request was answered with.
        status: StatusCode,
    },
    /// Shutdown abandoned the exchange before the upstream answered; its outcome is unknown.
    #[error("the gateway shut down before the upstream answered")]
    ShuttingDown,
    /// A bug: an exchange task panicked.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The problem+json document.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
}

impl GatewayError {
    /// Short stable name, used as the anchor in the docs URI and as the metrics outcome.
    pub fn slug(&self) -> &'static str {
        match self {
            Self::NoRoute { .. } => "no-route",
            Self::Key(KeyError::Missing { .. }) => "key-missing",
            Self::Key(_) => "key-malformed",
            Self::Body(BodyError::TooLarge { .. }) => "body-too-large",
            Self::Body(BodyError::Read(_)) => "body-unreadable",
            Self::Scope(_) => "scope-missing",
            Self::BadHost { .. } => "bad-host",
            Self::UpgradeRefused => "upgrade-refused",
            Self::TooManyNewKeys { .. } => "too-many-new-keys",
            Self::Overloaded => "overloaded",
            Self::Body(BodyError::Timeout { .. }) => "body-timeout",
            Self::ConnectionHeader { .. } => "connection-header",
            Self::OutcomeUnknown { .. } => "outcome-unknown",
            Self::ResponseNotStored { .. } => "response-not-stored",
            Self::Mismatch => "key-reused",
            Self::InFlight { .. } => "in-progress",
            Self::StoreUnavailable(_) => "store-unavailable",
            Self::Upstream(UpstreamError::Timeout { .. }) => "upstream-timeout",
            Self::Upstream(_) => "upstream-unavailable",
            Self::ShuttingDown => "shutting-down",
            Self::Internal(_) => "internal",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::NoRoute { .. } => StatusCode::NOT_FOUND,
            Self::Key(_)
            | Self::Body(BodyError::Read(_))
            | Self::Scope(_)
            | Self::ConnectionHeader { .. }
            | Self::BadHost { .. }
            | Self::UpgradeRefused => StatusCode::BAD_REQUEST,
            Self::Body(BodyError::Timeout { .. }) => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::TooManyNewKeys { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::OutcomeUnknown { timed_out: true } => StatusCode::GATEWAY_TIMEOUT,
            Self::OutcomeUnknown { timed_out: false } => StatusCode::BAD_GATEWAY,
            Self::ResponseNotStored { status } => *status,
            Self::Body(BodyError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream(UpstreamError::Timeout { .. }) => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::NoRoute { .. } => "No route",
            Self::Key(KeyError::Missing { .. }) => "Idempotency key missing",
            Self::Key(_) => "Idempotency key malformed",
            Self::Body(BodyError::TooLarge { .. }) => "Request body too large",
            Self::Body(BodyError::Read(_)) => "Request body unreadable",
            Self::Scope(_) => "Idempotency scope missing",
            Self::BadHost { .. } => "Bad Host header",
            Self::UpgradeRefused => "Protocol upgrade refused",
            Self::TooManyNewKeys { .. } => "Too many new idempotency keys",
            Self::Overloaded => "Gateway overloaded",
            Self::Body(BodyError::Timeout { .. }) => "Request body too slow",
            Self::ConnectionHeader { .. } => "Connection header names a needed header",
            Self::OutcomeUnknown { .. } => "Outcome unknown",
            Self::ResponseNotStored { .. } => "Response not stored",
            Self::Mismatch => "Idempotency key reused",
            Self::InFlight { .. } => "Request in progress",
            Self::StoreUnavailable(_) => "Idempotency store unavailable",
            Self::Upstream(UpstreamError::Timeout { .. }) => "Upstream timeout",
            Self::Upstream(_) => "Upstream unavailable",
            Self::ShuttingDown => "Gateway shutting down",
            Self::Internal(_) => "Internal error",
        }
    }

    /// What the client is told; written for the client, without internals.
    fn detail(&self) -> String {
        match self {
            Self::NoRoute { method, path } => format!("No route is configured for {method} {path}."),
            Self::Key(e) => format!("{}{}.", capitalise(&e.to_string()), key_hint(e)),
            Self::Body(BodyError::TooLarge { limit }) => {
                format!("This route accepts request bodies of at most {limit} bytes.")
            }
            Self::Body(BodyError::Read(_)) => "The request body could not be read.".into(),
            Self::Body(BodyError::Timeout { limit }) => format!(
                "The request body did not arrive within {}s; nothing was claimed or forwarded.",
                limit.as_secs_f64()
            ),
            Self::BadHost { detail } => format!("{detail} HTTP/1.1 requests carry exactly one."),
            Self::UpgradeRefused => "This route makes requests idempotent by storing their one answer; a \
                switched protocol (such as a WebSocket) has none. Open it on a route without \
                idempotency."
                .into(),
            Self::TooManyNewKeys { .. } => "You sent more new idempotency keys on this route than it allows \
                per caller; the request was not forwarded. Retries of requests already sent are not \
                limited. Retry after Retry-After."
                .into(),
            Self::Overloaded => "The gateway is running as many upstream requests as it allows; this one \
                was not forwarded. Retry with the same key after Retry-After."
                .into(),
            Self::Scope(e) => format!(
                "{}. Idempotency keys are kept per caller, and this route takes the caller from \
                 that source; send it with the request.",
                capitalise(&e.to_string())
            ),
            Self::ConnectionHeader { header } => format!(
                "The Connection header names {header}, which would remove it before the request is \
                 forwarded, although this route needs it. Do not list it in Connection."
            ),
            Self::OutcomeUnknown { .. } => "The request with this idempotency key was sent to the upstream \
                service, and no complete answer came back: it may or may not have been processed. \
                It will not be run again under this key. Check the state of the resource (for \
                example, list your recent orders or payments) before you send it again with a new key."
                .into(),
            Self::ResponseNotStored { status } => format!(
                "The request with this idempotency key was processed and answered {}, but its \
                 response was too large to keep for retries. It will not be run again; fetch the \
                 resource it created or changed to see the result.",
                status.as_u16()
            ),
            Self::Mismatch => "This idempotency key was already used for a different request. \
                Use a new key for a new request."
                .into(),
            Self::InFlight { .. } => "A request with this idempotency key is still being processed. \
                Retry after the time given in Retry-After to receive its result."
                .into(),
            Self::StoreUnavailable(_) => "The request was not forwarded because its idempotency \
                could not be guaranteed. Retry with the same key."
                .into(),
            Self::Upstream(UpstreamError::Unreachable { .. }) => "The upstream service could not be reached; \
                the request was not sent. Retrying with the same key is safe."
                .into(),
            Self::Upstream(UpstreamError::Timeout { .. }) => "The upstream service did not answer in time; \
                it may or may not have processed the request. A retry with the same key runs it \
                again on this route, whose upstream is expected to deduplicate on the key."
                .into(),
            Self::Upstream(UpstreamError::Failed { .. }) => "The upstream service failed before it \
                answered in full; it may or may not have processed the request. A retry with the \
                same key runs it again on this route, whose upstream is expected to deduplicate on \
                the key."
                .into(),
            Self::ShuttingDown => "The gateway shut down before the upstream answered; the request \
                may or may not have been processed. Check the state of the resource before sending it \
                again: a retry with the same key is told its outcome is unknown."
                .into(),
            Self::Internal(_) => "The gateway failed unexpectedly.".into(),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } | Self::TooManyNewKeys { retry_after } => Some(*retry_after),
            Self::StoreUnavailable(_) | Self::ShuttingDown | Self::Overloaded => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}

fn key_hint(e: &KeyError) -> &'static str {
    match e {
        KeyError::Missing { .. } | KeyError::Malformed { .. } => {
            "; send a unique value per request, e.g. Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
        }
        _ => "",
    }
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

/// Builds the problem+json response for `error`, with `type` = `problem_base` + slug.
pub fn respond(error: &GatewayError, problem_base: &str) -> Response<Body> {
    let status = error.status();
    let problem = Problem {
        kind: format!("{problem_base}{}", error.slug()),
        title: error.title(),
        status: status.as_u16(),
        detail: error.detail(),
    };
    let mut response = problem_response(status, &problem);
    if matches!(error, GatewayError::Body(BodyError::Timeout { .. })) {
        // The rest of a body that was too slow may still arrive; the connection cannot be
        // reused for another request, so it closes after this answer.
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(after) = error.retry_after() {
        // Whole seconds, rounded up, at least 1: "Retry-After: 0" invites a hot loop.
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    response
}

/// A problem+json response for the admin listener's own errors (401, 404, 400).
pub fn admin_problem(status: StatusCode, problem_base: &str, slug: &str, title: &str, detail: &str) -> Response<Body> {
    let problem =
        Problem { kind: format!("{problem_base}{slug}"), title, status: status.as_u16(), detail: detail.into() };
    problem_response(status, &problem)
}

fn problem_response(status: StatusCode, problem: &Problem<'_>) -> Response<Body> {
    let json = serde_json::to_vec(problem).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(body::full(Bytes::from(json)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn json(r: Response<Body>) -> serde_json::Value {
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn problem_documents_carry_type_title_status_detail() {
        let r = respond(&GatewayError::Mismatch, "https://docs.example/errors#");
        assert_eq!(r.status(), 422);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let doc = json(r).await;
        assert_eq!(doc["type"], "https://docs.example/errors#key-reused");
        assert_eq!(doc["title"], "Idempotency key reused");
        assert_eq!(doc["status"], 422);
        assert!(doc["detail"].as_str().unwrap().contains("different request"));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let r = respond(&GatewayError::InFlight { retry_after: Duration::from_millis(1200) }, "x:");
        assert_eq!(r.headers()["retry-after"], "2");
        let r = respond(&GatewayError::InFlight { retry_after: Duration::ZERO }, "x:");
        assert_eq!(r.headers()["retry-after"], "1");
        let r = respond(&GatewayError::StoreUnavailable(StoreError::Timeout(Duration::from_secs(1))), "x:");
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn internals_do_not_leak() {
        let e = GatewayError::StoreUnavailable(StoreError::Unavailable("redis://:secret@10.1.2.3".into()));
        let doc = json(respond(&e, "x:")).await.to_string();
        assert!(!doc.contains("secret") && !doc.contains("10.1.2.3"), "{doc}");
        let e = GatewayError::Upstream(UpstreamError::Unreachable {
            upstream: "orders".into(),
            detail: "10.0.0.9:80 refused".into(),
        });
        let doc = json(respond(&e, "x:")).await.to_string();
        assert!(!doc.contains("10.0.0.9"), "{doc}");
    }

    #[test]
    fn statuses_per_kind() {
        use http::HeaderName;
        let h = HeaderName::from_static("idempotency-key");
        let cases: Vec<(GatewayError, u16)> = vec![
            (GatewayError::NoRoute { method: http::Method::GET, path: "/x".into() }, 404),
            (KeyError::Missing { header: h.clone() }.into(), 400),
            (KeyError::Empty { header: h }.into(), 400),
            (BodyError::TooLarge { limit: 1 }.into(), 413),
            (GatewayError::Mismatch, 422),
            (GatewayError::InFlight { retry_after: Duration::ZERO }, 409),
            (UpstreamError::Timeout { upstream: "u".into(), timeout: Duration::ZERO }.into(), 504),
            (UpstreamError::Unreachable { upstream: "u".into(), detail: String::new() }.into(), 502),
        ];
        for (e, status) in cases {
            assert_eq!(respond(&e, "x:").status().as_u16(), status, "{e}");
        }
    }
}
