//! Every error the proxy can answer with, and the ONE table that says, for each, how it is
//! answered, counted and logged ([`GatewayError::problem`]).
//!
//! Each error becomes one [`Problem`] value (linkerd2-proxy's `respond.rs` does the same):
//! status, problem `type`, title, detail, `Retry-After`, whether the connection closes, the
//! metrics outcome and the log level. Nothing else matches on an error to learn any of these.
//! Responses are `application/problem+json` (RFC 9457) with a `type` URI into the published
//! error docs, a fixed `title` per kind and a `detail` in words. Internals (store addresses,
//! upstream error chains) go to the log, never to the client.

use std::time::Duration;

use http::StatusCode;
use thiserror::Error;

mod problem;

pub use self::problem::Problem;
use self::problem::SOON;
use crate::body::BodyError;
use crate::metrics::Outcome;
use crate::policy::key::KeyError;
use crate::policy::scope::ScopeMissing;
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
    /// The host of a request cannot be told: an HTTP/1.1 request without exactly one Host
    /// header, two hosts that differ, or a Host that is none.
    #[error("bad Host header")]
    BadHost {
        /// What is wrong with it.
        detail: &'static str,
    },
    /// A request for a host the certificate served on its connection does not cover.
    #[error("misdirected request for {host}")]
    Misdirected {
        /// The host it named.
        host: String,
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
    /// the upstream acted on it; the key is held and no retry runs it again until a lookup or
    /// an operator settles it.
    #[error("the outcome of the request with this key is unknown")]
    OutcomeUnknown {
        /// The exchange ran out of time (504) rather than broke (502).
        timed_out: bool,
        /// How the key gets settled, which decides what the client is told to do.
        settling: Settling,
    },
    /// Shutdown abandoned the exchange before the upstream answered; its outcome is unknown.
    #[error("the gateway shut down before the upstream answered")]
    ShuttingDown {
        /// How the key gets settled; `None` when the route released it (`on_unknown_outcome =
        /// "release"`: a retry runs again).
        held: Option<Settling>,
    },
    /// A bug: an exchange task panicked.
    #[error("internal error: {0}")]
    Internal(String),
}

/// How a key held as unknown gets settled: what a client must be told, since the one thing it
/// must never do is send the request again under a new key while it may have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settling {
    /// By an operator, or not at all (the record expires): the route does not reconcile, and
    /// every retry with the key is refused.
    Held,
    /// By asking the upstream (`[routes.idempotency.reconcile]`): a retry with the same key
    /// after `retry_after` gets the original answer, or runs if the request never did.
    Asking {
        /// When asking (again) may settle it: a lookup still running or not yet trustworthy, the
        /// one the gateway makes by itself, or a pause after one that failed.
        retry_after: Duration,
    },
}

impl GatewayError {
    /// The one table: how this error is answered, counted and logged.
    pub fn problem(&self) -> Problem {
        use Problem as P;
        use StatusCode as S;
        match self {
            Self::NoRoute { method, path } => {
                P::refused(S::NOT_FOUND, "no-route", "No route", format!("No route is configured for {method} {path}."))
            }
            Self::Key(e @ KeyError::Missing { .. }) => {
                P::refused(S::BAD_REQUEST, "key-missing", "Idempotency key missing", key_detail(e))
            }
            Self::Key(e) => P::refused(S::BAD_REQUEST, "key-malformed", "Idempotency key malformed", key_detail(e)),
            Self::Body(BodyError::TooLarge { limit }) => P::refused(
                S::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("This route accepts request bodies of at most {limit} bytes."),
            ),
            Self::Body(BodyError::Read(_)) => P::refused(
                S::BAD_REQUEST,
                "body-unreadable",
                "Request body unreadable",
                "The request body could not be read.",
            ),
            // The rest of a body that was too slow may still arrive; the connection cannot be
            // reused for another request, so it closes after this answer.
            Self::Body(BodyError::Timeout { limit }) => P::refused(
                S::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
                format!(
                    "The request body did not arrive within {}s; nothing was claimed or forwarded.",
                    limit.as_secs_f64()
                ),
            )
            .closing(),
            Self::Scope(e) => P::refused(
                S::BAD_REQUEST,
                "scope-missing",
                "Idempotency scope missing",
                format!(
                    "{}. Idempotency keys are kept per caller, and this route takes the caller from \
                     that source; send it with the request.",
                    capitalise(&e.to_string())
                ),
            ),
            Self::BadHost { detail } => P::refused(S::BAD_REQUEST, "bad-host", "Bad Host header", (*detail).to_owned()),
            Self::Misdirected { host } => P::refused(
                S::MISDIRECTED_REQUEST,
                "misdirected-request",
                "Misdirected request",
                format!(
                    "The certificate this connection was served does not cover {host}: send the request on a \
                     new connection to {host}. Nothing was forwarded."
                ),
            ),
            Self::UpgradeRefused => P::refused(
                S::BAD_REQUEST,
                "upgrade-refused",
                "Protocol upgrade refused",
                "This route makes requests idempotent by storing their one answer; a switched \
                 protocol (such as a WebSocket) has none. Open it on a route without idempotency.",
            ),
            Self::ConnectionHeader { header } => P::refused(
                S::BAD_REQUEST,
                "connection-header",
                "Connection header names a needed header",
                format!(
                    "The Connection header names {header}, which would remove it before the request \
                     is forwarded, although this route needs it. Do not list it in Connection."
                ),
            ),
            Self::TooManyNewKeys { retry_after } => P::refused(
                S::TOO_MANY_REQUESTS,
                "too-many-new-keys",
                "Too many new idempotency keys",
                "You sent more new idempotency keys on this route than it allows per caller; the \
                 request was not forwarded. Retries of requests already sent are not limited. \
                 Retry after Retry-After.",
            )
            .counted(Outcome::QuotaExceeded)
            .retry_after(*retry_after),
            Self::Mismatch => P::refused(
                S::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency key reused",
                "This idempotency key was already used for a different request. Use a new key for \
                 a new request.",
            )
            .counted(Outcome::Mismatch),
            Self::InFlight { retry_after } => P::refused(
                S::CONFLICT,
                "in-progress",
                "Request in progress",
                "A request with this idempotency key is still being processed. Retry after the \
                 time given in Retry-After to receive its result.",
            )
            .counted(Outcome::InFlight)
            .retry_after(*retry_after),
            Self::Overloaded => P::failed(
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                "Gateway overloaded",
                "The gateway is running as many upstream requests as it allows; this one was not \
                 forwarded. Retry with the same key after Retry-After.",
                Outcome::Overloaded,
            )
            .retry_after(SOON),
            Self::OutcomeUnknown { timed_out, settling } => P::failed(
                if *timed_out { S::GATEWAY_TIMEOUT } else { S::BAD_GATEWAY },
                "outcome-unknown",
                "Outcome unknown",
                match settling {
                    Settling::Held => UNKNOWN_HELD,
                    Settling::Asking { .. } => UNKNOWN_ASKING,
                },
                Outcome::Unknown,
            )
            .retry_after_if(settling.retry_after()),
            Self::StoreUnavailable(_) => P::failed(
                S::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The request was not forwarded because its idempotency could not be guaranteed. \
                 Retry with the same key.",
                Outcome::StoreUnavailable,
            )
            .retry_after(SOON)
            // The outage is logged once by the store; each refusal is in the access line.
            .quiet(),
            Self::Upstream(UpstreamError::Unreachable { .. }) => P::failed(
                S::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream unavailable",
                "The upstream service could not be reached; the request was not sent. Retrying \
                 with the same key is safe.",
                Outcome::UpstreamFailed,
            ),
            Self::Upstream(UpstreamError::Timeout { .. }) => P::failed(
                S::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timeout",
                "The upstream service did not answer in time; it may or may not have processed the \
                 request. A retry with the same key runs it again on this route, whose upstream is \
                 expected to deduplicate on the key.",
                Outcome::UpstreamFailed,
            ),
            Self::Upstream(UpstreamError::Failed { .. }) => P::failed(
                S::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream unavailable",
                "The upstream service failed before it answered in full; it may or may not have \
                 processed the request. A retry with the same key runs it again on this route, \
                 whose upstream is expected to deduplicate on the key.",
                Outcome::UpstreamFailed,
            ),
            Self::ShuttingDown { held } => P::failed(
                S::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Gateway shutting down",
                match held {
                    Some(Settling::Held) => SHUTDOWN_HELD,
                    Some(Settling::Asking { .. }) => SHUTDOWN_ASKING,
                    None => SHUTDOWN_RELEASED,
                },
                Outcome::UpstreamFailed,
            )
            .retry_after(held.and_then(|h| h.retry_after()).unwrap_or(SOON)),
            Self::Internal(_) => P::failed(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "The gateway failed unexpectedly.",
                Outcome::Internal,
            ),
        }
    }
}

/// When a retry that met an unknown outcome should come back after a lookup that failed:
/// nothing says the next will fail too, so soon.
const AFTER_FAILED: Duration = Duration::from_secs(1);

impl Settling {
    /// How an unknown outcome gets settled on a route: by asking the upstream when it
    /// `reconciles` (a retry `retry_after` from now at the soonest, or soon after a lookup
    /// that failed), else by an operator.
    pub fn of(reconciles: bool, retry_after: Option<Duration>) -> Self {
        match reconciles {
            true => Self::Asking { retry_after: retry_after.unwrap_or(AFTER_FAILED) },
            false => Self::Held,
        }
    }

    /// When to come back, for a route that reconciles.
    fn retry_after(self) -> Option<Duration> {
        match self {
            Self::Held => None,
            Self::Asking { retry_after } => Some(retry_after),
        }
    }
}

// What a client whose request's outcome is unknown is told. Each says, in the sentence that
// mentions a new key, that the request may have run and a new key may run it again: a client
// that takes "use a new key" alone as advice makes the double charge the gateway exists to
// prevent.
const UNKNOWN_HELD: &str = "The request with this idempotency key was sent to the upstream service, and no \
     complete answer came back: it may or may not have been processed. It will not be run again \
     under this key. Check the state of the resource (for example, list your recent orders or \
     payments) before you send the request again with a new key: it may already have been \
     processed, and a new key would process it a second time.";
const UNKNOWN_ASKING: &str = "The request with this idempotency key was sent to the upstream service, and no \
     complete answer came back: it may or may not have been processed. To find out, retry with the \
     same key after Retry-After: the gateway asks the upstream service what became of it, and you \
     get the original answer, or the request runs if it never did. Do not send it with a new key: \
     it may already have been processed, and a new key would process it a second time.";
const SHUTDOWN_HELD: &str = "The gateway shut down before the upstream answered; the request may or may not \
     have been processed. A retry with the same key is told its outcome is unknown and does not \
     run it again. Check the state of the resource before you send the request again with a new \
     key: it may already have been processed, and a new key would process it a second time.";
const SHUTDOWN_ASKING: &str = "The gateway shut down before the upstream answered; the request may or may \
     not have been processed. To find out, retry with the same key after Retry-After: the gateway \
     asks the upstream service what became of it, and you get the original answer, or the request \
     runs if it never did. Do not send it with a new key: it may already have been processed, and \
     a new key would process it a second time.";
const SHUTDOWN_RELEASED: &str = "The gateway shut down before the upstream answered; the request may or may \
     not have been processed. A retry with the same key runs it again on this route, whose \
     upstream is expected to deduplicate on the key.";

fn key_detail(e: &KeyError) -> String {
    let hint = match e {
        KeyError::Missing { .. } | KeyError::Malformed { .. } => {
            "; send a unique value per request, e.g. Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
        }
        _ => "",
    };
    format!("{}{hint}.", capitalise(&e.to_string()))
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;
    use http_body_util::BodyExt;

    use crate::body::Body;

    fn respond(e: &GatewayError, problem_base: &str) -> Response<Body> {
        e.problem().respond(problem_base)
    }

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

    /// A client told its request's outcome is unknown must never read "use a new key" as
    /// advice on its own: wherever an answer mentions a new key, the same sentence says the
    /// request may already have run and a new key would run it again. And an answer on a
    /// route that reconciles always says when to retry with the same key.
    #[test]
    fn no_unknown_outcome_advises_a_new_key_without_its_risk() {
        let asking = Settling::Asking { retry_after: Duration::from_secs(3) };
        let cases = [
            GatewayError::OutcomeUnknown { timed_out: false, settling: Settling::Held },
            GatewayError::OutcomeUnknown { timed_out: true, settling: Settling::Held },
            GatewayError::OutcomeUnknown { timed_out: false, settling: asking },
            GatewayError::ShuttingDown { held: Some(Settling::Held) },
            GatewayError::ShuttingDown { held: Some(asking) },
            GatewayError::ShuttingDown { held: None },
            UpstreamError::Timeout { upstream: "u".into(), timeout: Duration::ZERO }.into(),
            UpstreamError::Failed { upstream: "u".into(), detail: "x".into() }.into(),
        ];
        for error in &cases {
            let problem = error.problem();
            for sentence in problem.detail.split(". ") {
                if sentence.contains("new key") {
                    assert!(
                        sentence.contains("may already have been processed") && sentence.contains("a second time"),
                        "{error:?}: {sentence:?}"
                    );
                }
            }
        }
        for error in [&cases[2], &cases[4]] {
            let problem = error.problem();
            assert_eq!(problem.retry_after, Some(Duration::from_secs(3)), "{error:?}");
            assert!(problem.detail.contains("retry with the same key after Retry-After"), "{error:?}");
        }
        assert_eq!(cases[0].problem().retry_after, None, "nothing settles a held key by itself");
    }

    /// `[errors.TYPE]` accepts exactly the types this table answers with: every variant's
    /// slug is in the list, and every entry of the list is some variant's.
    #[test]
    fn the_list_of_problem_types_is_the_tables() {
        use crate::policy::errors::PROBLEM_TYPES;
        use http::HeaderName;
        let h = HeaderName::from_static("idempotency-key");
        let u = || "u".to_owned();
        let every: Vec<GatewayError> = vec![
            GatewayError::NoRoute { method: http::Method::GET, path: "/x".into() },
            KeyError::Missing { header: h.clone() }.into(),
            KeyError::Empty { header: h }.into(),
            BodyError::TooLarge { limit: 1 }.into(),
            BodyError::Read("x".into()).into(),
            BodyError::Timeout { limit: Duration::ZERO }.into(),
            ScopeMissing { missing: "header:a".into() }.into(),
            GatewayError::ConnectionHeader { header: "a".into() },
            GatewayError::BadHost { detail: "x" },
            GatewayError::Misdirected { host: "x".into() },
            GatewayError::TooManyNewKeys { retry_after: Duration::ZERO },
            GatewayError::UpgradeRefused,
            GatewayError::Overloaded,
            GatewayError::Mismatch,
            GatewayError::InFlight { retry_after: Duration::ZERO },
            GatewayError::StoreUnavailable(StoreError::Full),
            UpstreamError::Unreachable { upstream: u(), detail: u() }.into(),
            UpstreamError::Timeout { upstream: u(), timeout: Duration::ZERO }.into(),
            UpstreamError::Failed { upstream: u(), detail: u() }.into(),
            GatewayError::OutcomeUnknown { timed_out: false, settling: Settling::Held },
            GatewayError::ShuttingDown { held: None },
            GatewayError::Internal(u()),
        ];
        let mut slugs: Vec<&str> = every.iter().map(|e| e.problem().slug).collect();
        slugs.push(Problem::not_stored(StatusCode::CREATED).slug);
        for slug in &slugs {
            assert!(PROBLEM_TYPES.contains(slug), "{slug} is answered but not in PROBLEM_TYPES");
        }
        for listed in PROBLEM_TYPES {
            assert!(slugs.contains(&listed), "{listed} is in PROBLEM_TYPES but never answered");
        }
    }
}
