//! Reconcile: asking the upstream what became of a request whose answer was lost.
//!
//! A key held as unknown is a dead end for its client unless somebody finds out what happened.
//! On a route with `[routes.idempotency.reconcile]` the gateway asks the upstream's lookup
//! (`GET /orders/lookup` with the key header and the caller's scope sources, as the original
//! request had them):
//!
//! - when a retry meets the key ([`on_retry`]), and waits for the answer within the route's
//!   `wait`; a retry that finds a lookup already running waits for that one, as a duplicate
//!   waits for the request holding its key;
//! - in the background, `after` an unknown outcome, from the gateway that lost it and still
//!   holds the request in memory ([`later`]): credentials are never written to the store or
//!   the log, so if that gateway dies, the next retry asks.
//!
//! What the lookup answers:
//!
//! | answer | the record | the retry |
//! |---|---|---|
//! | a `found` status | completed with that answer | replayed, `Idempotency-Status: reconciled` |
//! | a `not_found` status, trusted | released | runs upstream as attempt N+1 |
//! | a `not_found` status, too early | still unknown, asked again later | 502 with `Retry-After` |
//! | anything else (error, timeout, other status) | still unknown | 502 with `Retry-After` |
//! | nothing yet: the lookup outlasts the retry's `wait` | a lookup runs | 409 with `Retry-After` |
//!
//! Every one of these answers tells the client to retry with the same key: on a route that
//! reconciles, that retry is what settles the key, and a new key could run the request twice.
//!
//! The hazard is a "not found" from an upstream that is still running the request (after a
//! timeout, the request may be executing): released then, the key would run twice. So the
//! store keeps, on the record's own clock, when "not found" becomes proof: at once when the
//! upstream closed or reset the connection itself, otherwise the upstream's `timeout` plus
//! `release_after` after the request was sent; the decision is part of the same
//! compare-and-set that releases the key.
//!
//! At most one lookup runs per key across all gateways: it holds a token on the record as an
//! exchange holds its owner token, and every way out of unknown (found, not found, an
//! operator's PUT or DELETE) is a compare-and-set, so they race safely.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::capture::{self, Captured};
use super::context::{Ctx, Session};

use crate::forwarded::Peer;
use crate::headers;
use crate::metrics::{GaugeHold, Reconciliation};
use crate::policy::fingerprint::Fingerprint;
use crate::policy::key::IdempotencyKey;
use crate::policy::reconcile::Reconcile;
use crate::policy::scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{
    EntryState, Index, IndexKey, Lifecycle, Lookup, LookupEnd, LookupEnded, Lookups, OwnerToken, RecordKey, Records,
    StoredResponse, Watch,
};
use crate::upstream::UpstreamError;

/// How many times, at most, the gateway that lost an answer asks by itself.
const BACKGROUND_TRIES: u32 = 6;
/// The longest pause between two of those tries.
const MAX_PAUSE: Duration = Duration::from_secs(60);
/// Asked again this long after "not found" becomes trustworthy, so the store agrees it is.
const TRUST_MARGIN: Duration = Duration::from_millis(100);

/// What a lookup needs of the request that lost its answer. Lives in memory only.
#[derive(Clone)]
pub struct Question {
    record: RecordKey,
    fingerprint: Fingerprint,
    /// The parsed key, for `{key}` in the lookup's path.
    key: String,
    /// The key header and the scope sources, as the request had them.
    headers: HeaderMap,
    peer: Peer,
}

impl Question {
    /// The question for a request with `headers` (its key header and scope sources are
    /// copied, nothing else).
    pub fn new(
        route: &IdempotentRoute,
        headers: &HeaderMap,
        key: &IdempotencyKey,
        record: RecordKey,
        fingerprint: Fingerprint,
        peer: &Peer,
    ) -> Self {
        let policy = &route.policy;
        let mut asked = HeaderMap::new();
        for value in headers.get_all(&policy.header) {
            asked.append(policy.header.clone(), value.clone());
        }
        scope::copy_sources(&policy.scope, headers, &mut asked);
        Self { record, fingerprint, key: key.as_str().to_owned(), headers: asked, peer: peer.clone() }
    }
}

impl Question {
    /// The record asked about.
    pub fn record(&self) -> &RecordKey {
        &self.record
    }
}

/// What asking found, for the request that asked.
pub enum Asked {
    /// The upstream had the answer; the key now replays it.
    Found(StoredResponse),
    /// The key is no longer unknown (released, or settled by someone else): claim it again.
    Changed,
    /// A lookup still runs at the end of the retry's wait; it ends within `left` at the latest.
    Running {
        /// Time left on that lookup's lease.
        left: Duration,
    },
    /// Still unknown: the upstream says it never ran the request, but it may still be running
    /// it; "not found" is proof only in `left`.
    TooEarly {
        /// Until "not found" can be trusted.
        left: Duration,
    },
    /// Still unknown: the lookup failed (an error, a timeout, an answer that is neither found
    /// nor not found), or could not start.
    Failed,
}

impl Asked {
    /// A word for the trace.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Found(_) => "found",
            Self::Changed => "settled",
            Self::Running { .. } => "running",
            Self::TooEarly { .. } | Self::Failed => "unknown",
        }
    }
}

/// A retry met an unknown outcome: ask the upstream, or wait for the lookup another request
/// started, within the route's `wait`, exactly as a duplicate waits for the request holding
/// its key.
pub async fn on_retry(s: &mut Session<'_>, ctx: &Ctx) -> Asked {
    let claimant = &ctx.claimant;
    let question = Question::new(
        s.route,
        &ctx.parts.headers,
        &claimant.key,
        claimant.record.clone(),
        claimant.fingerprint,
        &s.connection.peer,
    );
    let span = s.notes.span.as_ref().map(|span| span.child("reconcile"));
    let asked = ask_on_retry(s.rt, s.route, question).await;
    if let Some(span) = span {
        span.set("idemgate.reconciled", asked.describe());
        span.end(None);
    }
    asked
}

/// Asks for a retry (see [`on_retry`]), or waits for the lookup another request runs.
async fn ask_on_retry(rt: &Arc<Runtime>, route: &Arc<IdempotentRoute>, question: Question) -> Asked {
    let Some(reconcile) = &route.policy.reconcile else { return Asked::Failed };
    let deadline = Instant::now() + route.policy.wait;
    let lease = lookup_lease(rt, route);
    // A lookup whose gateway died holds the key until its lease passes; a retry that waited it
    // out starts one of its own, once.
    let mut second_chance = true;
    let (token, sent) = loop {
        // Registered before the lookup is tried, so that the end of a running one wakes us.
        let watch = rt.lifecycle().watch(&question.record);
        let token = OwnerToken::generate();
        let sent = Instant::now();
        match rt.lookups().lookup(&question.record, &question.fingerprint, token, lease).await {
            Ok(Lookup::Moved) => return Asked::Changed,
            Ok(Lookup::Busy { left }) => {
                match wait_for_lookup(rt, route, &question.record, watch, deadline, left).await {
                    Waited::Abandoned if second_chance && Instant::now() < deadline => second_chance = false,
                    Waited::Abandoned => return Asked::Failed,
                    Waited::Ended(asked) => return asked,
                }
            }
            Ok(Lookup::Started { .. }) => break (token, sent),
            Err(e) => {
                route.metrics.store_error();
                tracing::debug!(route = %route.name, key = question.record.short(), error = %e, "cannot start a lookup");
                return Asked::Failed;
            }
        }
    };
    // In a task of its own: if the client goes away, the lookup still ends and frees its token.
    let (tx, rx) = oneshot::channel();
    let (rt2, route2, reconcile) = (Arc::clone(rt), Arc::clone(route), reconcile.clone());
    rt.exchanges.spawn(async move {
        let _ = tx.send(ask(&rt2, &route2, &reconcile, &question, token).await);
    });
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(asked)) => asked,
        // Its lease began no earlier than the call that took it was sent.
        _ => Asked::Running { left: (sent + lease).saturating_duration_since(Instant::now()) },
    }
}

/// How waiting for another request's lookup ended.
enum Waited {
    /// It ended (or the retry's wait did): what to answer.
    Ended(Asked),
    /// Its lease passed and nobody ended it: its gateway died or stalled.
    Abandoned,
}

/// Waits, until `deadline`, for the lookup another request runs on `record` (`left` on its
/// lease) to end, and says how it ended.
///
/// The hazard is taking a wake-up for an end. The watch also fires every poll interval
/// (pub/sub can drop a message) and at the wait's own bounds; a retry that then claimed again
/// would find the key still unknown and be answered as if asking had failed, while the lookup
/// is about to find the answer. So every wake reads the record again, and only a lookup that
/// is no longer running ends the wait.
async fn wait_for_lookup(
    rt: &Runtime,
    route: &IdempotentRoute,
    record: &RecordKey,
    mut watch: Watch,
    deadline: Instant,
    left: Duration,
) -> Waited {
    let _waiting = GaugeHold::new(&rt.metrics.waiting_duplicates);
    let mut lease_end = Instant::now() + left;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Waited::Ended(Asked::Running { left: lease_end.saturating_duration_since(now) });
        }
        // Past the lookup's lease the record is read again all the same: a lookup whose
        // gateway died holds nothing once its lease has passed.
        watch.changed(deadline.min(lease_end)).await;
        // Registered before the read, so that an end between the two is not missed.
        watch = rt.lifecycle().watch(record);
        let state = match rt.records().get(record).await {
            Ok(entry) => entry.map(|e| e.state),
            Err(e) => {
                route.metrics.store_error();
                tracing::debug!(route = %route.name, key = record.short(), error = %e, "cannot read a key whose lookup this retry waits for");
                return Waited::Ended(Asked::Failed);
            }
        };
        match state {
            Some(EntryState::Unknown { lookup: Some(running), .. }) => lease_end = Instant::now() + running,
            // Not running, and its lease is over: nobody ended it.
            Some(EntryState::Unknown { lookup: None, .. }) if Instant::now() >= lease_end => return Waited::Abandoned,
            // It ended and settled nothing: "not found" too early to trust, or no answer.
            Some(EntryState::Unknown { lookup: None, trusted_in: Some(left) }) if !left.is_zero() => {
                return Waited::Ended(Asked::TooEarly { left });
            }
            Some(EntryState::Unknown { lookup: None, .. }) => return Waited::Ended(Asked::Failed),
            // Completed, released or gone: the claim says which.
            _ => return Waited::Ended(Asked::Changed),
        }
    }
}

/// The gateway that lost an answer asks by itself, `after` the outcome became unknown, and
/// again while the answer is too early to trust or the lookup fails (a few times, further
/// apart). Stops at shutdown; retries then ask.
pub fn later(rt: &Arc<Runtime>, route: &Arc<IdempotentRoute>, question: Question) {
    let Some(reconcile) = route.policy.reconcile.clone() else { return };
    let Some(after) = reconcile.after else { return };
    let (rt, route) = (Arc::clone(rt), Arc::clone(route));
    // Not tracked with the exchanges: a pause must not hold shutdown for its grace period.
    tokio::spawn(async move {
        let mut pause = after;
        for _ in 0..BACKGROUND_TRIES {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = rt.abandon.cancelled() => return,
            }
            let token = OwnerToken::generate();
            let lease = lookup_lease(&rt, &route);
            let started = rt.lookups().lookup(&question.record, &question.fingerprint, token, lease).await;
            pause = match started {
                Ok(Lookup::Moved) => return,
                // Another gateway is asking; look again once it must have finished.
                Ok(Lookup::Busy { left }) => left + TRUST_MARGIN,
                Err(_) => (pause * 2).clamp(Duration::from_secs(1), MAX_PAUSE),
                Ok(Lookup::Started { .. }) => match ask(&rt, &route, &reconcile, &question, token).await {
                    Asked::Found(_) | Asked::Changed => return,
                    Asked::TooEarly { left } => left + TRUST_MARGIN,
                    Asked::Failed | Asked::Running { .. } => (pause * 2).clamp(Duration::from_secs(1), MAX_PAUSE),
                },
            };
        }
    });
}

/// How long a lookup holds its key: its call, and a store call at each end.
fn lookup_lease(rt: &Runtime, route: &IdempotentRoute) -> Duration {
    route.upstream.timeout() + rt.store_call_timeout() * 2 + Duration::from_secs(1)
}

/// What the upstream's lookup said.
enum Heard {
    Found(StoredResponse),
    NotFound,
    Failed(String),
}

/// Asks the upstream under `token` and writes what it said to the record.
async fn ask(
    rt: &Runtime,
    route: &IdempotentRoute,
    reconcile: &Reconcile,
    question: &Question,
    token: OwnerToken,
) -> Asked {
    let heard = call(route, reconcile, question).await;
    let end = match &heard {
        Heard::Found(response) => LookupEnd::Found { response, retention: route.policy.retention },
        Heard::NotFound => LookupEnd::NotFound { ttl: route.policy.in_progress_ttl() },
        Heard::Failed(_) => LookupEnd::Failed,
    };
    let (name, key) = (&route.name, question.record.short());
    let ended = rt.lookups().end_lookup(&question.record, token, end).await;
    let (result, asked) = match (heard, ended) {
        (Heard::Found(response), Ok(LookupEnded::Done)) => {
            tracing::info!(route = %name, key, status = response.status.as_u16(), "unknown outcome reconciled: the upstream had the answer");
            (Reconciliation::Found, Asked::Found(response))
        }
        (Heard::NotFound, Ok(LookupEnded::Done)) => {
            tracing::info!(route = %name, key, "unknown outcome reconciled: the upstream never ran it; released");
            (Reconciliation::NotFound, Asked::Changed)
        }
        (Heard::NotFound, Ok(LookupEnded::TooEarly { left })) => {
            tracing::debug!(route = %name, key, left = %crate::access::human(left), "the upstream has no answer yet, and may still be running the request");
            (Reconciliation::TooEarly, Asked::TooEarly { left })
        }
        // An operator, or another lookup after this one's lease, settled it meanwhile.
        (_, Ok(LookupEnded::Lost)) => return Asked::Changed,
        (answer, Ok(_)) => {
            let why = match answer {
                Heard::Failed(why) => why,
                _ => "the store refused the lookup's answer".to_owned(),
            };
            tracing::warn!(route = %name, key, reason = %why, "lookup of an unknown outcome failed; the key stays unknown");
            (Reconciliation::Failed, Asked::Failed)
        }
        (_, Err(e)) => {
            route.metrics.store_error();
            tracing::debug!(route = %name, key, error = %e, "cannot write a lookup's answer; the key stays unknown until it is asked again");
            (Reconciliation::Failed, Asked::Failed)
        }
    };
    route.metrics.reconciled(result);
    if matches!(result, Reconciliation::Found | Reconciliation::NotFound) {
        // Best effort: a stale entry is dropped when the index is read.
        let _ =
            rt.index().unindex(&IndexKey::new(rt.key_prefix(), &route.policy.identity.name), &question.record).await;
    }
    asked
}

/// Sends the lookup and reads its answer, within the upstream's timeout.
async fn call(route: &IdempotentRoute, reconcile: &Reconcile, question: &Question) -> Heard {
    let upstream = &route.upstream;
    let Ok(uri) = reconcile.path.expand(&question.key).parse::<http::Uri>() else {
        // Unreachable: the path was checked at load, and the key is percent-encoded.
        return Heard::Failed("the lookup's path is not a valid URI".into());
    };
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = reconcile.method.clone();
    parts.uri = uri;
    parts.headers = question.headers.clone();
    route.upstream.prepare(&mut parts, &question.peer);
    let deadline = Instant::now() + upstream.timeout();
    // A lookup asks any instance that connects (they answer from one shared database).
    let request = Request::from_parts(parts, Bytes::new());
    let response = match upstream.send_buffered(request, deadline).await {
        Err(UpstreamError::Timeout { .. }) => {
            return Heard::Failed(format!("no answer within {:?}", upstream.timeout()));
        }
        Err(e) => return Heard::Failed(e.to_string()),
        Ok(mut response) => {
            headers::strip_hop_by_hop(response.headers_mut());
            response
        }
    };
    let status = response.status();
    let (parts, body) =
        match tokio::time::timeout_at(deadline, capture::capture(response, route.policy.max_stored_body)).await {
            Ok(Ok(Captured::Whole(parts, body))) => (parts, body),
            Ok(Ok(Captured::TooLarge(..))) => {
                return Heard::Failed(format!("a {status} answer larger than max_stored_body"));
            }
            Ok(Err(e)) => return Heard::Failed(format!("the answer broke off: {e}")),
            Err(_) => return Heard::Failed(format!("no whole answer within {:?}", upstream.timeout())),
        };
    if reconcile.found.contains(status) {
        let headers = headers::storable(&parts.headers, &route.policy.stored_headers);
        let status = reconcile.answer_status.unwrap_or(status);
        // A status without a body (`answer_status = 204`) is replayed without one: none is kept.
        let body = if headers::has_no_body(status) { Default::default() } else { body };
        return Heard::Found(StoredResponse { status, headers, body });
    }
    if reconcile.not_found.contains(status) {
        return Heard::NotFound;
    }
    Heard::Failed(format!("the lookup answered {status}, neither found nor not_found"))
}
