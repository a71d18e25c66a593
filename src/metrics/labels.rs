//! The label values: how a request ended, why a claim was released, an upstream answer's
//! status class. Each is a closed set, so that every counter is created once, at start.

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// A label whose values index a fixed array of counters. The index comes from an exhaustive
/// match, so adding a variant without its counter does not compile, and no counter is found
/// by the variant's position in a list.
pub trait Label: Copy + 'static {
    /// Every value, in index order.
    const ALL: &'static [Self];
    /// The position of this value's counter.
    fn index(self) -> usize;
}

/// How a request through a route ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Claimed and sent upstream (whatever the upstream answered).
    Executed,
    /// Answered from the store (a stored response, or the problem that says it ran but its
    /// body was not stored).
    Replayed,
    /// Key reused with a different request (422).
    Mismatch,
    /// First request still running after the wait (409).
    InFlight,
    /// The first request's outcome is unknown; refused (502 outcome-unknown).
    Unknown,
    /// Bad key, missing scope, bad Connection, too large or unreadable body (400, 413).
    Rejected,
    /// Store down, route fails closed (503).
    StoreUnavailable,
    /// Store down, route fails open: forwarded without protection.
    Bypassed,
    /// Too many exchanges running (503 overloaded); nothing forwarded.
    Overloaded,
    /// The caller's budget of new keys was spent (429); nothing forwarded.
    QuotaExceeded,
    /// Route without idempotency, or optional key absent.
    PassedThrough,
    /// Upstream unreachable, failed or timed out (502, 504).
    UpstreamFailed,
    /// A gateway bug (500).
    Internal,
    /// On a route in observe mode: forwarded as on a pass-through route, and what enforcement
    /// would have done counted (`idemgate_observed_total`).
    Observed,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Mismatch => "mismatch",
            Self::InFlight => "in_flight",
            Self::Unknown => "outcome_unknown",
            Self::Rejected => "rejected",
            Self::StoreUnavailable => "store_unavailable",
            Self::Bypassed => "bypassed",
            Self::Overloaded => "overloaded",
            Self::QuotaExceeded => "quota_exceeded",
            Self::PassedThrough => "passed_through",
            Self::UpstreamFailed => "upstream_failed",
            Self::Internal => "internal",
            Self::Observed => "observed",
        }
    }
}

impl Label for Outcome {
    const ALL: &'static [Self] = &[
        Self::Executed,
        Self::Replayed,
        Self::Mismatch,
        Self::InFlight,
        Self::Unknown,
        Self::Rejected,
        Self::StoreUnavailable,
        Self::Bypassed,
        Self::PassedThrough,
        Self::UpstreamFailed,
        Self::Internal,
        Self::Overloaded,
        Self::QuotaExceeded,
        Self::Observed,
    ];
    fn index(self) -> usize {
        match self {
            Self::Executed => 0,
            Self::Replayed => 1,
            Self::Mismatch => 2,
            Self::InFlight => 3,
            Self::Unknown => 4,
            Self::Rejected => 5,
            Self::StoreUnavailable => 6,
            Self::Bypassed => 7,
            Self::PassedThrough => 8,
            Self::UpstreamFailed => 9,
            Self::Internal => 10,
            Self::Overloaded => 11,
            Self::QuotaExceeded => 12,
            Self::Observed => 13,
        }
    }
}

/// What enforcement would have done with a request a route in observe mode forwarded
/// (`idemgate_observed_total{would}`), from the claim's reply or from why there was no claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Would {
    /// No key: 400 with `required = true`, passed through without.
    MissingKey,
    /// A key enforcement refuses (400 `key-malformed`).
    MalformedKey,
    /// A keyed request without its scope, on a route that rejects it (400 `scope-missing`).
    MissingScope,
    /// `Connection` names a header the route reads, or an upgrade is asked (400).
    UnsafeHeaders,
    /// A body over `max_request_body` (413); forwarded unobserved.
    TooLarge,
    /// A body that did not arrive within the body deadline, or broke off (408, 400);
    /// forwarded unobserved.
    UnreadBody,
    /// A keyed first request: enforcement runs it too.
    First,
    /// The same key and request after a stored answer: enforcement replays instead of running
    /// it again.
    Replay,
    /// The same key with another request (422).
    RejectReuse,
    /// A new key past the caller's `max_new_keys` budget (429): its claim is given back and
    /// the request forwarded unclaimed, so that one caller cannot fill the store.
    Throttle,
    /// The same key while the first request still runs: a concurrent duplicate (409 after the
    /// wait, or the first's answer).
    Conflict,
    /// The same key while an enforcing gateway holds its outcome as unknown (502, or the
    /// upstream's answer to a lookup).
    AnswerUnknown,
    /// A duplicate the upstream answered differently from the first (status or body).
    AnswerDiffered,
    /// A claimed request whose outcome is unknown (sent, no complete answer): its key is
    /// released, so enforcement never starts with keys held from observing.
    UnknownOutcome,
    /// The claim failed or timed out: forwarded at once.
    StoreError,
}

impl Would {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingKey => "missing_key",
            Self::MalformedKey => "malformed_key",
            Self::MissingScope => "missing_scope",
            Self::UnsafeHeaders => "unsafe_headers",
            Self::TooLarge => "too_large",
            Self::UnreadBody => "unread_body",
            Self::First => "first",
            Self::Replay => "would_replay",
            Self::RejectReuse => "would_reject_reuse",
            Self::Throttle => "would_throttle",
            Self::Conflict => "would_conflict",
            Self::AnswerUnknown => "would_answer_unknown",
            Self::AnswerDiffered => "answer_differed",
            Self::UnknownOutcome => "unknown_outcome",
            Self::StoreError => "store_error",
        }
    }
}

impl Label for Would {
    const ALL: &'static [Self] = &[
        Self::MissingKey,
        Self::MalformedKey,
        Self::MissingScope,
        Self::UnsafeHeaders,
        Self::TooLarge,
        Self::UnreadBody,
        Self::First,
        Self::Replay,
        Self::RejectReuse,
        Self::Conflict,
        Self::AnswerUnknown,
        Self::AnswerDiffered,
        Self::UnknownOutcome,
        Self::StoreError,
        Self::Throttle,
    ];
    fn index(self) -> usize {
        match self {
            Self::MissingKey => 0,
            Self::MalformedKey => 1,
            Self::MissingScope => 2,
            Self::UnsafeHeaders => 3,
            Self::TooLarge => 4,
            Self::UnreadBody => 5,
            Self::First => 6,
            Self::Replay => 7,
            Self::RejectReuse => 8,
            Self::Conflict => 9,
            Self::AnswerUnknown => 10,
            Self::AnswerDiffered => 11,
            Self::UnknownOutcome => 12,
            Self::StoreError => 13,
            Self::Throttle => 14,
        }
    }
}

impl EncodeLabelValue for Would {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Which pin of a route's identity named a request's record (`idemgate_identity_pin_hits_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pin {
    /// The route name its records were made under (`identity.name`).
    Name,
    /// The host naming its records were made under (`identity.host`, `identity.per_host`).
    Host,
    /// A retry matched its record only under `identity.previous_fingerprint`.
    Fingerprint,
}

impl Label for Pin {
    const ALL: &'static [Self] = &[Self::Name, Self::Host, Self::Fingerprint];
    fn index(self) -> usize {
        match self {
            Self::Name => 0,
            Self::Host => 1,
            Self::Fingerprint => 2,
        }
    }
}

impl EncodeLabelValue for Pin {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Self::Name => "name",
            Self::Host => "host",
            Self::Fingerprint => "fingerprint",
        })
    }
}

/// Why a claim was released instead of settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    /// The upstream's status is not in `store_statuses` (5xx by default).
    Status,
    /// The request never reached the upstream (connection refused).
    NotSent,
    /// The outcome is unknown and the route says `on_unknown_outcome = "release"`.
    Unknown,
    /// The claim call's reply never arrived (store timeout, client gone mid-claim): the claim,
    /// if it was made, is released by its owner in the background.
    Ghost,
}

impl Label for ReleaseReason {
    const ALL: &'static [Self] = &[Self::Status, Self::NotSent, Self::Unknown, Self::Ghost];
    fn index(self) -> usize {
        match self {
            Self::Status => 0,
            Self::NotSent => 1,
            Self::Unknown => 2,
            Self::Ghost => 3,
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl ReleaseReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::NotSent => "not_sent",
            Self::Unknown => "unknown",
            Self::Ghost => "ghost",
        }
    }
}

impl EncodeLabelValue for ReleaseReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// How one lookup of an unknown outcome ended (`idemgate_reconciliations_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reconciliation {
    /// The upstream had the answer; the key now replays it.
    Found,
    /// The upstream never ran the request; the key was released.
    NotFound,
    /// No usable answer (error, timeout, another status); the key stays unknown.
    Failed,
    /// "Not found" while the upstream may still be running the request; asked again later.
    TooEarly,
}

impl Reconciliation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::NotFound => "not_found",
            Self::Failed => "failed",
            Self::TooEarly => "too_early",
        }
    }
}

impl Label for Reconciliation {
    const ALL: &'static [Self] = &[Self::Found, Self::NotFound, Self::Failed, Self::TooEarly];
    fn index(self) -> usize {
        match self {
            Self::Found => 0,
            Self::NotFound => 1,
            Self::Failed => 2,
            Self::TooEarly => 3,
        }
    }
}

impl EncodeLabelValue for Reconciliation {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The `class` label values of the upstream latency histogram.
pub const UPSTREAM_CLASSES: [&str; 7] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error", "abandoned"];

/// The `class` label of an upstream answer's status: `"2xx"` … `"5xx"`.
pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}
