//! The idempotent request path. [`handle`] strings the steps together in this order, one
//! module per step:
//!
//! ```text
//! key ─▶ connection check ─▶ scope ─▶ bounded body ─▶ fingerprint ─▶ claim ─┐
//!   ┌───────────────────────────────────────────────────────────────────────┘
//!   ├─ Acquired(lease)  ─▶ exchange (forward, renew, capture, settle|release) ─▶ respond
//!   ├─ Completed(rec)   ─▶ replay
//!   ├─ Executed(head)   ─▶ 'response-not-stored' with the original status
//!   ├─ Unknown          ─▶ 502 'outcome-unknown'
//!   ├─ InFlight         ─▶ wait (bounded, woken by the store) ─▶ replay | 409
//!   └─ Mismatch         ─▶ 422
//! ```

pub mod capture;
pub mod claim;
pub mod exchange;
pub mod fingerprint;
pub mod key;
pub mod policy;
pub mod replay;
pub mod scope;

use std::sync::Arc;

use tokio::time::Instant;

use http::{HeaderMap, HeaderValue, Request, Response, header};
use hyper::body::Incoming;

use crate::access::Trace;
use crate::body::{self, Body};
use crate::connection::Connection;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::metrics::Outcome;
use crate::proxy;
use crate::route::Route;
use crate::store::{Claim, Lease, OwnerToken, QuotaKey, RecordKey, Store};

use self::exchange::{Exchange, ExchangeSlots};
use self::key::KeyError;
use self::policy::{IdempotencyPolicy, StoreFailurePolicy};

/// Serves one request on an idempotent route.
pub async fn handle(
    gw: &Gateway,
    route: &Arc<Route>,
    policy: &Arc<IdempotencyPolicy>,
    mut request: Request<Incoming>,
    connection: &Arc<Connection>,
    trace: &mut Trace,
) -> Result<(Outcome, Response<Body>), GatewayError> {
    let peer = &connection.peer;
    let Some(key) = key::extract(request.headers(), &policy.header, policy.max_key_len)? else {
        if policy.required {
            return Err(KeyError::Missing { header: policy.header.clone() }.into());
        }
        let response = proxy::forward(&route.upstream, request.map(body::boxed), connection).await?;
        return Ok((Outcome::PassedThrough, response));
    };
    check_connection(request.headers(), policy)?;
    // The attempt header is the gateway's word to the upstream, never the client's.
    if let Some(name) = &policy.attempt_header {
        request.headers_mut().remove(name);
    }
    if proxy::upgrade_requested(request.headers()).is_some() {
        return Err(GatewayError::UpgradeRefused);
    }
    let scope = scope::derive(&policy.scope, policy.on_missing_scope, request.headers())?;
    let (mut parts, body) = request.into_parts();
    let body = body::read_bounded(&parts.headers, body, policy.max_request_body, gw.body_read_timeout).await?;
    let fingerprint = fingerprint::compute(&route.name, &policy.fingerprint, &parts, &body);
    let record = RecordKey::new(&gw.key_prefix, &route.name, &scope, &key);
    trace.record = Some(record.short().to_owned());

    let owner = OwnerToken::generate();
    let claiming = Instant::now();
    let claimed = claim::settled(gw, &record, &fingerprint, owner, policy).await;
    trace.store += claiming.elapsed();
    let claim = match claimed {
        Ok(claim) => claim,
        Err(e) => {
            route.metrics.store_error();
            tracing::warn!(route = %route.name, key = record.short(), error = %e, "store failed on claim");
            return match policy.on_store_error {
                StoreFailurePolicy::FailClosed => {
                    // The claim may have been made, its reply lost: release it, or the client's
                    // retry would wait out a whole lease.
                    claim::release_ghost(gw, route, &record, owner, policy);
                    Err(GatewayError::StoreUnavailable(e))
                }
                StoreFailurePolicy::FailOpen => {
                    // Forward under the owner token all the same: if the claim was made after
                    // all, the exchange settles it and retries replay its answer; if not,
                    // settling finds nothing. A ghost claim never lets a retry run it twice.
                    let Some(slots) = exchange_slots(gw, connection) else {
                        return Err(GatewayError::Overloaded);
                    };
                    let lease = Lease::new(record, owner, 0, policy.lease, policy.in_progress_ttl());
                    route.upstream.prepare(&mut parts, peer);
                    let mut exchange = exchange(gw, route, policy, lease, false, Request::from_parts(parts, body));
                    exchange.slots = Some(slots);
                    let (answer, report) = exchange.spawn(&gw.exchanges).await;
                    trace.record_exchange(report);
                    let mut response = answer?;
                    response.headers_mut().insert("idempotency-status", HeaderValue::from_static("bypassed"));
                    Ok((Outcome::Bypassed, response))
                }
            };
        }
    };

    match claim {
        Claim::Acquired(lease) => {
            tracing::debug!(route = %route.name, key = record.short(), attempt = lease.attempt(), "claimed");
            let lease_attempt = lease.attempt();
            // Held until the exchange takes it: if this future is dropped at the await below
            // (the client went away), the claim is given back instead of blocking its key.
            let held = claim::Held::new(gw, lease);
            // Checked after the claim so that replays and retries are never refused for load
            // or quota; a refused exchange gives its claim (and its attempt number) back.
            let refused = match exchange_slots(gw, connection) {
                None => GatewayError::Overloaded,
                Some(slots) => match new_key_budget(gw, route, policy, &scope, held.lease()).await {
                    Some(exceeded) => exceeded,
                    None => {
                        route.upstream.prepare(&mut parts, peer);
                        let request = Request::from_parts(parts, body);
                        let mut exchange = exchange(gw, route, policy, held.take(), true, request);
                        exchange.slots = Some(slots);
                        trace.attempt = Some(lease_attempt);
                        let (answer, report) = exchange.spawn(&gw.exchanges).await;
                        trace.record_exchange(report);
                        return Ok((Outcome::Executed, answer?));
                    }
                },
            };
            let (key, owner, ttl) = held.take().into_release();
            claim::release_unsent(gw, route, &key, owner, ttl).await;
            Err(refused)
        }
        Claim::Completed(stored) => Ok((Outcome::Replayed, replay::respond(stored, &policy.replay_header))),
        Claim::Executed(head) => {
            Ok((Outcome::Replayed, replay::not_stored(head, &policy.replay_header, &gw.problem_base)))
        }
        Claim::Unknown { .. } => Err(GatewayError::OutcomeUnknown { timed_out: false }),
        Claim::InFlight { lease_left } => Err(GatewayError::InFlight { retry_after: lease_left }),
        Claim::Mismatch => Err(GatewayError::Mismatch),
    }
}

/// Counts a new key against the caller's budget on this route (`max_new_keys`); the error
/// when the budget is spent. Only first attempts count: a re-run of a released key is not a
/// new key. A store that fails to count lets the request through (the claim just succeeded,
/// so the store is up; the budget is a guard against floods, not a guarantee).
async fn new_key_budget(
    gw: &Gateway,
    route: &Route,
    policy: &IdempotencyPolicy,
    scope: &scope::Scope,
    lease: &Lease,
) -> Option<GatewayError> {
    let quota = policy.max_new_keys?;
    if lease.attempt() != 1 {
        return None;
    }
    let budget = QuotaKey::new(&gw.key_prefix, &route.name, scope);
    match gw.store.count_new_key(&budget, quota.window).await {
        Ok((count, left)) if count > quota.count => Some(GatewayError::TooManyNewKeys { retry_after: left }),
        Ok(_) => None,
        Err(e) => {
            route.metrics.store_error();
            tracing::warn!(route = %route.name, error = %e, "cannot count a new key; letting it through");
            None
        }
    }
}

/// A slot for one more exchange, in all and for this connection, if both have one.
fn exchange_slots(gw: &Gateway, connection: &Arc<Connection>) -> Option<ExchangeSlots> {
    let global = Arc::clone(&gw.exchange_slots).try_acquire_owned().ok()?;
    let local = connection.exchange_slot()?;
    Some(ExchangeSlots { _global: global, _connection: local })
}

fn exchange(
    gw: &Gateway,
    route: &Arc<Route>,
    policy: &Arc<IdempotencyPolicy>,
    lease: Lease,
    confirmed: bool,
    request: Request<bytes::Bytes>,
) -> Exchange {
    Exchange {
        route: Arc::clone(route),
        policy: Arc::clone(policy),
        store: Arc::clone(&gw.store),
        lease,
        confirmed,
        request,
        abandon: gw.abandon.clone(),
        slots: None,
        running: gw.metrics.exchanges_running.clone(),
    }
}

impl Trace {
    fn record_exchange(&mut self, report: exchange::Report) {
        self.upstream = Some(report.upstream);
        self.store += report.store;
    }
}

/// Refuses a request whose `Connection` header names a header this route reads. Hop-by-hop
/// stripping would remove it before forwarding, so the upstream would see another request
/// than the one fingerprinted: without the key its own UNIQUE constraint cannot work, without
/// the credential it may act as someone else, without Content-Type it may read the body
/// differently.
fn check_connection(headers: &HeaderMap, policy: &IdempotencyPolicy) -> Result<(), GatewayError> {
    for token in crate::headers::connection_tokens(headers) {
        let needed = [&policy.header, &header::CONTENT_TYPE, &header::CONTENT_LENGTH, &header::HOST]
            .into_iter()
            .cloned()
            .chain(policy.scope.sources().iter().map(scope::Source::header))
            .chain(policy.fingerprint.headers.iter().cloned())
            .any(|name| name.as_str().eq_ignore_ascii_case(token));
        if needed {
            return Err(GatewayError::ConnectionHeader { header: token.to_ascii_lowercase() });
        }
    }
    Ok(())
}
