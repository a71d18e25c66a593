//! Decide: what an exchange does with its key and its first client, from how its upstream
//! call ended and nothing else. `forward` then does it, in this order of effects: the key is
//! settled before the client hears the answer (so that a retry finds it), except that after a
//! failed first try the client is answered and settling goes on behind it, and a streamed
//! answer is settled once its stream has ended.
//!
//! | how it ended | the key | the first client gets |
//! |---|---|---|
//! | not sent (connection refused, DNS, TLS handshake, none made before the deadline) | released, attempt given back | 502 `upstream-unavailable` |
//! | complete answer, status in `store_statuses` | completed: replayed to retries | the answer |
//! | complete answer, other status | released | the answer |
//! | answer too large to store, delivered | executed: retries get `response-not-stored` | the answer, streamed |
//! | answer too large to store, other status | released | the answer, streamed |
//! | sent, no complete answer (timeout, reset, truncated body) | `hold`: unknown, retries get 502 `outcome-unknown`; `release`: released | 502/504 `outcome-unknown` (`release`: the upstream error) |
//! | abandoned at the end of the shutdown grace period | as the row above | 503 `shutting-down` |
//!
//! The unit tests below are this table.

use http::response;
use tokio::sync::oneshot;

use super::capture::StreamEnd;
use crate::body::{Body, Payload};
use crate::error::{GatewayError, Settling};
use crate::metrics::{ReleaseReason, status_class};
use crate::policy::{StatusSet, UnknownOutcomePolicy};
use crate::store::Sent;
use crate::telemetry::ChildSpan;
use crate::upstream::UpstreamError;

/// How the call to the upstream ended.
pub enum Ended {
    /// The whole response, within `max_stored_body`.
    Whole(response::Parts, Payload),
    /// A response too large to store, streaming to the client.
    Streamed(response::Parts, Body, oneshot::Receiver<StreamEnd>),
    /// The request never reached the upstream.
    NotSent(UpstreamError),
    /// The request was sent and no complete answer came back.
    NoAnswer(UpstreamError),
    /// Shutdown gave up on the exchange.
    Abandoned,
}

/// What to do with the key, and so with the client, carrying what each needs.
pub enum Plan {
    /// Keep the whole answer (completed), then answer the client with it.
    Keep(response::Parts, Payload),
    /// Answer with the stream now; keep its status and headers (executed) once it has ended,
    /// or settle as unknown if the upstream broke it off.
    KeepHead(response::Parts, Body, oneshot::Receiver<StreamEnd>),
    /// Release the key (`Sent::No` gives the attempt back), then answer with `then`.
    Release {
        /// Whether the request may have reached the upstream.
        sent: Sent,
        /// The counter's reason.
        reason: ReleaseReason,
        /// What the client gets once the key is released.
        then: Then,
    },
    /// The outcome is unknown: the route's `on_unknown_outcome` holds or releases the key,
    /// and the client gets [`refusal`]'s answer. A lookup's "not found" is trusted at once
    /// when the upstream closed the connection itself, else after its timeout.
    Unknown {
        /// "Not found" is trusted at once.
        trusted_at_once: bool,
        /// Why there is no answer.
        unanswered: Unanswered,
    },
}

/// What the client of a released key gets.
pub enum Then {
    /// The upstream's whole answer.
    Whole(response::Parts, Payload),
    /// The upstream's answer, streamed.
    Streamed(response::Parts, Body),
    /// The upstream's error.
    Failed(UpstreamError),
}

/// What the exchange does, from how the call ended and which statuses the route stores.
pub fn plan(ended: Ended, store_statuses: &StatusSet) -> Plan {
    let released = |sent, reason, then| Plan::Release { sent, reason, then };
    match ended {
        Ended::Whole(parts, body) if store_statuses.contains(parts.status) => Plan::Keep(parts, body),
        Ended::Streamed(parts, body, end) if store_statuses.contains(parts.status) => Plan::KeepHead(parts, body, end),
        Ended::Whole(parts, body) => released(Sent::Maybe, ReleaseReason::Status, Then::Whole(parts, body)),
        Ended::Streamed(parts, body, _) => released(Sent::Maybe, ReleaseReason::Status, Then::Streamed(parts, body)),
        Ended::NotSent(e) => released(Sent::No, ReleaseReason::NotSent, Then::Failed(e)),
        Ended::NoAnswer(e) => Plan::Unknown {
            trusted_at_once: matches!(e, UpstreamError::Failed { .. }),
            unanswered: Unanswered::NoAnswer(e),
        },
        Ended::Abandoned => Plan::Unknown { trusted_at_once: false, unanswered: Unanswered::Abandoned },
    }
}

/// Why a request whose outcome is unknown got no answer of the upstream's.
#[derive(Debug)]
pub enum Unanswered {
    /// The call failed after the request was sent.
    NoAnswer(UpstreamError),
    /// Shutdown gave up on it.
    Abandoned,
}

/// What the first client of an unknown outcome gets, once the route's policy has `done` its
/// part (held the key, or released it); `settling` says how a held key gets settled.
pub fn refusal(unanswered: Unanswered, done: UnknownOutcomePolicy, settling: Settling) -> GatewayError {
    let held = done == UnknownOutcomePolicy::Hold;
    match unanswered {
        Unanswered::NoAnswer(e) if held => {
            GatewayError::OutcomeUnknown { timed_out: matches!(e, UpstreamError::Timeout { .. }), settling }
        }
        Unanswered::NoAnswer(e) => e.into(),
        Unanswered::Abandoned => GatewayError::ShuttingDown { held: held.then_some(settling) },
    }
}

impl Ended {
    /// Ends the upstream span with how the call ended.
    pub fn trace(&self, span: ChildSpan) {
        match self {
            Self::Whole(parts, _) | Self::Streamed(parts, _, _) => {
                span.set("http.response.status_code", i64::from(parts.status.as_u16()));
                span.end(None);
            }
            Self::NotSent(e) | Self::NoAnswer(e) => span.end(Some(e.to_string())),
            Self::Abandoned => span.end(Some("abandoned at shutdown".into())),
        }
    }

    /// The status class for the upstream latency histogram.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Whole(parts, _) | Self::Streamed(parts, _, _) => status_class(parts.status),
            Self::NotSent(_) | Self::NoAnswer(_) => "error",
            Self::Abandoned => "abandoned",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;

    fn stored() -> StatusSet {
        let mut set = StatusSet::empty();
        for code in [200, 201, 404, 422] {
            set.insert(code);
        }
        set
    }

    fn parts(status: StatusCode) -> response::Parts {
        http::Response::builder().status(status).body(()).map(|r| r.into_parts().0).unwrap()
    }

    fn timeout() -> UpstreamError {
        UpstreamError::Timeout { upstream: "app".into(), timeout: Duration::from_secs(1) }
    }

    fn failed() -> UpstreamError {
        UpstreamError::Failed { upstream: "app".into(), detail: "reset".into() }
    }

    /// The outcome table, row by row: how the call ended -> what becomes of the key.
    #[test]
    fn each_ending_has_one_plan() {
        let (ok, err) = (StatusCode::CREATED, StatusCode::SERVICE_UNAVAILABLE);
        let plan = |ended| plan(ended, &stored());
        let streamed = |status| Ended::Streamed(parts(status), crate::body::full(""), oneshot::channel().1);
        let unreachable = UpstreamError::Unreachable { upstream: "app".into(), detail: "refused".into() };

        assert!(matches!(
            plan(Ended::NotSent(unreachable)),
            Plan::Release { sent: Sent::No, reason: ReleaseReason::NotSent, then: Then::Failed(_) }
        ));
        assert!(matches!(plan(Ended::Whole(parts(ok), Payload::default())), Plan::Keep(p, _) if p.status == ok));
        assert!(matches!(
            plan(Ended::Whole(parts(err), Payload::default())),
            Plan::Release { sent: Sent::Maybe, reason: ReleaseReason::Status, then: Then::Whole(p, _) } if p.status == err
        ));
        assert!(matches!(plan(streamed(ok)), Plan::KeepHead(p, _, _) if p.status == ok));
        assert!(matches!(
            plan(streamed(err)),
            Plan::Release { sent: Sent::Maybe, reason: ReleaseReason::Status, then: Then::Streamed(p, _) } if p.status == err
        ));
        assert!(matches!(
            plan(Ended::NoAnswer(failed())),
            Plan::Unknown { trusted_at_once: true, unanswered: Unanswered::NoAnswer(UpstreamError::Failed { .. }) }
        ));
        assert!(matches!(
            plan(Ended::NoAnswer(timeout())),
            Plan::Unknown { trusted_at_once: false, unanswered: Unanswered::NoAnswer(UpstreamError::Timeout { .. }) }
        ));
        assert!(matches!(
            plan(Ended::Abandoned),
            Plan::Unknown { trusted_at_once: false, unanswered: Unanswered::Abandoned }
        ));
    }

    /// The first client of an unknown outcome: 502/504 while the key is held, the upstream's
    /// error once released, 503 at shutdown either way (saying whether the key is held).
    #[test]
    fn an_unknown_outcome_is_answered_by_what_the_route_did_with_the_key() {
        let (hold, release) = (UnknownOutcomePolicy::Hold, UnknownOutcomePolicy::Release);
        assert!(matches!(
            refusal(Unanswered::NoAnswer(timeout()), hold, Settling::Held),
            GatewayError::OutcomeUnknown { timed_out: true, settling: Settling::Held }
        ));
        assert!(matches!(
            refusal(Unanswered::NoAnswer(failed()), hold, Settling::Held),
            GatewayError::OutcomeUnknown { timed_out: false, settling: Settling::Held }
        ));
        assert!(matches!(
            refusal(Unanswered::NoAnswer(failed()), release, Settling::Held),
            GatewayError::Upstream(UpstreamError::Failed { .. })
        ));
        assert!(matches!(
            refusal(Unanswered::Abandoned, hold, Settling::Held),
            GatewayError::ShuttingDown { held: Some(Settling::Held) }
        ));
        assert!(matches!(
            refusal(Unanswered::Abandoned, release, Settling::Held),
            GatewayError::ShuttingDown { held: None }
        ));
    }
}
