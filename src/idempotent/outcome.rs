//! Decide: what a claim's reply leads to ([`after_claim`]), and what an exchange does with
//! its key and its first client, from the route's mode and how its upstream call ended, and
//! nothing else. The claim's table is on [`after_claim`]; the exchange's follows.
//!
//! An exchange's plan: `exchange` does it, in this order of
//! effects: the key is settled before the client hears the answer (so that a retry finds it),
//! except that after a failed first try the client is answered and settling goes on behind
//! it, and a streamed answer is settled once its stream has ended (an observing route holds
//! the stream's last bytes back until then).
//!
//! | how the call ended | enforce: the key | enforce: the client | observe: the key | observe: the client |
//! |---|---|---|---|---|
//! | not sent (connection refused, DNS, TLS handshake) | released, attempt given back | 502 `upstream-unavailable` | released, attempt given back | the same |
//! | complete answer, status in `store_statuses` | completed | the answer | (streamed, below) | |
//! | complete answer, other status | released | the answer | (streamed, below) | |
//! | answer too large to store, status stored | executed once streamed | the answer, streamed | (streamed, below) | |
//! | answer too large to store, other status | released | the answer, streamed | (streamed, below) | |
//! | an answer's head (observe: every answer) | | | settled as its stream ends (below) | the answer, streamed |
//! | sent, no complete answer (timeout, reset, truncated body) | `hold`: unknown; `release`: released | 502/504 `outcome-unknown` (`release`: the upstream's error) | released (`unknown_outcome`) | the upstream's error |
//! | abandoned at the end of the shutdown grace period | as the row above | 503 `shutting-down` | released | 503 `shutting-down` |
//!
//! And how a streamed answer's end settles its key ([`after_stream`]):
//!
//! | the stream | enforce (a stored status) | observe, status stored | observe, other status |
//! |---|---|---|---|
//! | complete, within `max_stored_body` | executed | completed with the answer | released |
//! | complete, larger | executed | executed (`response-not-stored`) | released |
//! | the client left before the end | executed (it was delivered as far as anyone reads) | read on, then as above | read on, then released |
//! | the upstream broke it off | unknown (as the route holds) | released (`unknown_outcome`) | released (`unknown_outcome`) |
//!
//! The unit tests below are these tables.

use http::response;
use tokio::sync::oneshot;

use super::capture::{StreamEnd, Tee};
use super::claim::{self, Tried};
use super::context::{Claimant, Claimed, Session};
use super::reconcile::Asked;
use crate::body::{Body, Payload};
use crate::error::{GatewayError, Settling};
use crate::metrics::Would;
use crate::metrics::{ReleaseReason, status_class};
use crate::policy::StoreFailurePolicy;
use crate::policy::{Mode, StatusSet, UnknownOutcomePolicy};
use crate::proxy::Expected;
use crate::store::Sent;
use crate::store::{Claim, Lease, StoredResponse};
use crate::telemetry::ChildSpan;
use crate::upstream::UpstreamError;

/// What follows a claim.
pub enum Next {
    /// Forward the request under this claim, counting what an observing route would have done.
    Forward(Claimed, Option<Would>),
    /// Replay the stored answer (`true`: settled by asking the upstream, and said so).
    Replay(StoredResponse, bool),
    /// The request ran and its answer was too large to keep: `response-not-stored`.
    NotStored(StoredResponse),
    /// Refused, nothing forwarded.
    Refuse(GatewayError),
    /// Observing: forwarded as a plain route would, unclaimed, counted as `Would`; a
    /// duplicate's answer is expected to be the one stored for its key.
    Pass(Would, Option<Expected>),
}

/// What the store's reply to a claim leads to, by the route's mode.
///
/// | the reply | enforce | observe |
/// |---|---|---|
/// | acquired | forward | forward (`first`) |
/// | completed | replay (said reconciled after a lookup) | forward, the answer compared (`would_replay`) |
/// | executed | `response-not-stored` | forward, the status compared (`would_replay`) |
/// | in flight after the wait | 409 + `Retry-After` | forward (`would_conflict`) |
/// | another request's key | 422 | forward (`would_reject_reuse`) |
/// | unknown, the upstream's lookup found it | replay, reconciled | (never asked) |
/// | unknown, the lookup still runs | 409 + `Retry-After` | |
/// | unknown otherwise | 502 `outcome-unknown` | forward (`would_answer_unknown`) |
/// | the store failed | fail-closed: 503 (the claim given back); fail-open: forward unconfirmed | forward unconfirmed (`store_error`) |
pub fn after_claim(s: &Session<'_>, claimant: &Claimant, tried: Tried) -> Next {
    let (route, policy) = (s.route, &*s.route.policy);
    let observing = policy.mode == Mode::Observe;
    let reconciles = policy.reconcile.is_some();
    let unconfirmed =
        |sent| Claimed::Unconfirmed(Lease::new(claimant.record.clone(), claimant.owner, claim::terms(policy), sent));
    let expected = |stored: StoredResponse, whole: bool| Expected {
        status: stored.status,
        body: whole.then(|| stored.body.to_bytes()),
        differed: route.metrics.observed_counter(Would::AnswerDiffered),
    };
    let unknown = |retry_after| {
        Next::Refuse(GatewayError::OutcomeUnknown { timed_out: false, settling: Settling::of(reconciles, retry_after) })
    };
    match (tried.reply, tried.asked) {
        (Ok(Claim::Acquired(lease)), _) => Next::Forward(Claimed::Confirmed(lease), observing.then_some(Would::First)),
        (Err(e), _) => match (observing, policy.on_store_error) {
            (true, _) => Next::Forward(unconfirmed(tried.sent), Some(Would::StoreError)),
            (false, StoreFailurePolicy::FailOpen) => Next::Forward(unconfirmed(tried.sent), None),
            (false, StoreFailurePolicy::FailClosed) => Next::Refuse(GatewayError::StoreUnavailable(e)),
        },
        (Ok(Claim::Completed(stored)), _) if observing => Next::Pass(Would::Replay, Some(expected(stored, true))),
        (Ok(Claim::Executed(head)), _) if observing => Next::Pass(Would::Replay, Some(expected(head, false))),
        (Ok(Claim::InFlight { .. }), _) if observing => Next::Pass(Would::Conflict, None),
        (Ok(Claim::Mismatch), _) if observing => Next::Pass(Would::RejectReuse, None),
        (Ok(Claim::Unknown { .. }), _) if observing => Next::Pass(Would::AnswerUnknown, None),
        (Ok(Claim::Completed(stored)), asked) => Next::Replay(stored, matches!(asked, Some(Asked::Changed))),
        (Ok(Claim::Executed(head)), _) => Next::NotStored(head),
        (Ok(Claim::InFlight { .. }), _) => Next::Refuse(GatewayError::InFlight { retry_after: tried.retry_after }),
        (Ok(Claim::Mismatch), _) => Next::Refuse(GatewayError::Mismatch),
        (Ok(Claim::Unknown { .. }), Some(Asked::Found(stored))) => Next::Replay(stored, true),
        // The lookup outlasted the wait: what a duplicate gets when its key is still taken.
        (Ok(Claim::Unknown { .. }), Some(Asked::Running { left })) => {
            Next::Refuse(GatewayError::InFlight { retry_after: left })
        }
        (Ok(Claim::Unknown { .. }), Some(Asked::TooEarly { left })) => unknown(Some(left)),
        (Ok(Claim::Unknown { .. }), _) => unknown(None),
    }
}

/// How the call to the upstream ended.
pub enum Ended {
    /// The whole answer, within `max_stored_body` (enforcing).
    Whole(response::Parts, Payload),
    /// An answer streaming to the client through a tee: an enforcing route's too large to
    /// store, every observing route's.
    Streamed(response::Parts, Tee, oneshot::Receiver<StreamEnd>),
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
    /// Answer with the stream now; settle the key once it has ended, as [`after_stream`] says
    /// (`stored`: its status is one the route stores).
    Stream(response::Parts, Tee, oneshot::Receiver<StreamEnd>, bool),
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
    /// The error a plain route gives.
    Failed(GatewayError),
}

/// What the exchange does, from the route's mode, how the call ended and which statuses the
/// route stores.
pub fn plan(mode: Mode, ended: Ended, store_statuses: &StatusSet) -> Plan {
    let released = |sent, reason, then| Plan::Release { sent, reason, then };
    let observing = mode == Mode::Observe;
    match ended {
        Ended::NotSent(e) => released(Sent::No, ReleaseReason::NotSent, Then::Failed(e.into())),
        Ended::Streamed(parts, tee, end) if observing => {
            let stored = store_statuses.contains(parts.status);
            Plan::Stream(parts, tee, end, stored)
        }
        // Sent without an answer: never held from observing, so enforcing starts clean.
        Ended::NoAnswer(e) if observing => released(Sent::Maybe, ReleaseReason::Unknown, Then::Failed(e.into())),
        Ended::Abandoned if observing => {
            released(Sent::Maybe, ReleaseReason::Unknown, Then::Failed(GatewayError::ShuttingDown { held: None }))
        }
        Ended::Whole(parts, body) if store_statuses.contains(parts.status) => Plan::Keep(parts, body),
        Ended::Streamed(parts, tee, end) if store_statuses.contains(parts.status) => {
            Plan::Stream(parts, tee, end, true)
        }
        Ended::Whole(parts, body) => released(Sent::Maybe, ReleaseReason::Status, Then::Whole(parts, body)),
        Ended::Streamed(parts, tee, _) => {
            released(Sent::Maybe, ReleaseReason::Status, Then::Streamed(parts, crate::body::boxed(tee)))
        }
        Ended::NoAnswer(e) => Plan::Unknown {
            trusted_at_once: matches!(e, UpstreamError::Failed { .. }),
            unanswered: Unanswered::NoAnswer(e),
        },
        Ended::Abandoned => Plan::Unknown { trusted_at_once: false, unanswered: Unanswered::Abandoned },
    }
}

/// How a streamed answer's end settles its key.
pub enum Settle {
    /// Completed with the whole answer (observing, within the limit).
    Keep(Payload),
    /// Executed: it ran and was delivered, its body too large to keep (`response-not-stored`).
    Executed,
    /// Released, for `reason`.
    Release(ReleaseReason),
    /// Unknown, as the route's `on_unknown_outcome` says (enforcing).
    Unknown,
}

/// How the end of a streamed answer settles its key (`stored`: its status is one the route
/// stores; an enforcing route streams only those, having released the others at once). A
/// client that left is first read on by the exchange when observing, then judged here again.
pub fn after_stream(mode: Mode, end: &StreamEnd, stored: bool) -> Settle {
    match (mode, end) {
        (Mode::Enforce, StreamEnd::Broken) => Settle::Unknown,
        (Mode::Enforce, _) => Settle::Executed,
        (Mode::Observe, StreamEnd::Broken) => Settle::Release(ReleaseReason::Unknown),
        (Mode::Observe, _) if !stored => Settle::Release(ReleaseReason::Status),
        (Mode::Observe, StreamEnd::Complete { body: Some(body), .. }) => Settle::Keep(body.clone()),
        (Mode::Observe, _) => Settle::Executed,
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

    fn unreachable() -> UpstreamError {
        UpstreamError::Unreachable { upstream: "app".into(), detail: "refused".into() }
    }

    fn streamed(status: StatusCode) -> Ended {
        let (tee, end) = Tee::watching(crate::body::full(""));
        Ended::Streamed(parts(status), tee, end)
    }

    /// The enforcing rows of the outcome table: how the call ended -> what becomes of the key.
    #[test]
    fn each_ending_has_one_plan_when_enforcing() {
        let (ok, err) = (StatusCode::CREATED, StatusCode::SERVICE_UNAVAILABLE);
        let plan = |ended| plan(Mode::Enforce, ended, &stored());
        assert!(matches!(
            plan(Ended::NotSent(unreachable())),
            Plan::Release { sent: Sent::No, reason: ReleaseReason::NotSent, then: Then::Failed(_) }
        ));
        assert!(matches!(plan(Ended::Whole(parts(ok), Payload::default())), Plan::Keep(p, _) if p.status == ok));
        assert!(matches!(
            plan(Ended::Whole(parts(err), Payload::default())),
            Plan::Release { sent: Sent::Maybe, reason: ReleaseReason::Status, then: Then::Whole(p, _) } if p.status == err
        ));
        assert!(matches!(plan(streamed(ok)), Plan::Stream(p, _, _, true) if p.status == ok));
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

    /// The observing rows: every answer streams and settles at its end; what got no answer is
    /// released, never held, and the client gets what a plain route gives.
    #[test]
    fn each_ending_has_one_plan_when_observing() {
        let (ok, err) = (StatusCode::CREATED, StatusCode::SERVICE_UNAVAILABLE);
        let plan = |ended| plan(Mode::Observe, ended, &stored());
        assert!(matches!(
            plan(Ended::NotSent(unreachable())),
            Plan::Release { sent: Sent::No, reason: ReleaseReason::NotSent, then: Then::Failed(_) }
        ));
        assert!(matches!(plan(streamed(ok)), Plan::Stream(p, _, _, true) if p.status == ok));
        assert!(matches!(plan(streamed(err)), Plan::Stream(p, _, _, false) if p.status == err));
        assert!(matches!(
            plan(Ended::NoAnswer(timeout())),
            Plan::Release {
                sent: Sent::Maybe,
                reason: ReleaseReason::Unknown,
                then: Then::Failed(GatewayError::Upstream(UpstreamError::Timeout { .. }))
            }
        ));
        assert!(matches!(
            plan(Ended::Abandoned),
            Plan::Release {
                sent: Sent::Maybe,
                reason: ReleaseReason::Unknown,
                then: Then::Failed(GatewayError::ShuttingDown { held: None })
            }
        ));
    }

    /// How a stream's end settles its key, by mode.
    #[test]
    fn each_stream_end_settles_one_way() {
        let complete = |body| StreamEnd::Complete { body, settled: None };
        let left = StreamEnd::Left { captured: None, size: 0, rest: crate::body::full("") };
        let (enforce, observe) = (Mode::Enforce, Mode::Observe);
        assert!(matches!(after_stream(enforce, &complete(None), true), Settle::Executed));
        assert!(matches!(after_stream(enforce, &left, true), Settle::Executed));
        assert!(matches!(after_stream(enforce, &StreamEnd::Broken, true), Settle::Unknown));
        assert!(matches!(after_stream(observe, &complete(Some(Payload::default())), true), Settle::Keep(_)));
        assert!(matches!(after_stream(observe, &complete(None), true), Settle::Executed));
        assert!(matches!(
            after_stream(observe, &complete(Some(Payload::default())), false),
            Settle::Release(ReleaseReason::Status)
        ));
        assert!(matches!(after_stream(observe, &StreamEnd::Broken, true), Settle::Release(ReleaseReason::Unknown)));
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
