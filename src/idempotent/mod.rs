//! The idempotent request path. [`handle`] strings the steps together in this order, one
//! module per step:
//!
//! ```text
//! key ─▶ scope ─▶ bounded body ─▶ fingerprint ─▶ store.claim ─┐
//!   ┌─────────────────────────────────────────────────────────┘
//!   ├─ Acquired(lease) ─▶ exchange (forward, renew, capture, complete|release) ─▶ respond
//!   ├─ Completed(rec)  ─▶ replay
//!   ├─ InFlight        ─▶ wait (bounded, woken by the store) ─▶ replay | 409
//!   └─ Mismatch        ─▶ 422
//! ```

pub mod capture;
pub mod exchange;
pub mod fingerprint;
pub mod key;
pub mod policy;
pub mod replay;
pub mod scope;

use std::sync::Arc;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::body::{self, Body};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::headers::Peer;
use crate::metrics::Outcome;
use crate::proxy;
use crate::route::Route;
use crate::store::{Claim, RecordKey, Store, StoreError, Watch};

use self::exchange::Exchange;
use self::fingerprint::Fingerprint;
use self::key::KeyError;
use self::policy::{IdempotencyPolicy, StoreFailurePolicy};

/// Serves one request on an idempotent route.
pub async fn handle(
    gw: &Gateway,
    route: &Arc<Route>,
    policy: &Arc<IdempotencyPolicy>,
    request: Request<Incoming>,
    peer: &Peer,
) -> Result<(Outcome, Response<Body>), GatewayError> {
    let Some(key) = key::extract(request.headers(), &policy.header, policy.max_key_len)? else {
        if policy.required {
            return Err(KeyError::Missing { header: policy.header.clone() }.into());
        }
        let response = proxy::forward(&route.upstream, request.map(body::boxed), peer).await?;
        return Ok((Outcome::PassedThrough, response));
    };
    let scope = scope::derive(&policy.scope, request.headers());
    let (mut parts, body) = request.into_parts();
    let body = body::read_bounded(&parts.headers, body, policy.max_request_body).await?;
    let fingerprint = fingerprint::compute(&route.name, &policy.fingerprint, &parts, &body);
    let record = RecordKey::new(&gw.key_prefix, &route.name, &scope, &key);

    let claim = match claim_settled(&*gw.store, &record, &fingerprint, policy).await {
        Ok(claim) => claim,
        Err(e) => {
            route.metrics.store_error();
            tracing::warn!(route = %route.name, key = record.short(), error = %e, "store failed on claim");
            return match policy.on_store_error {
                StoreFailurePolicy::FailClosed => Err(GatewayError::StoreUnavailable(e)),
                StoreFailurePolicy::FailOpen => {
                    let request = Request::from_parts(parts, body::full(body));
                    let mut response = proxy::forward(&route.upstream, request, peer).await?;
                    response.headers_mut().insert("idempotency-status", HeaderValue::from_static("bypassed"));
                    Ok((Outcome::Bypassed, response))
                }
            };
        }
    };

    match claim {
        Claim::Acquired(lease) => {
            tracing::debug!(route = %route.name, key = record.short(), attempt = lease.attempt(), "claimed");
            route.upstream.prepare(&mut parts, peer);
            let exchange = Exchange {
                route: Arc::clone(route),
                policy: Arc::clone(policy),
                store: Arc::clone(&gw.store),
                lease,
                request: Request::from_parts(parts, body),
                abandon: gw.abandon.clone(),
            };
            let response = exchange.spawn(&gw.exchanges).await?;
            Ok((Outcome::Executed, response))
        }
        Claim::Completed(stored) => Ok((Outcome::Replayed, replay::respond(stored, &policy.replay_header))),
        Claim::InFlight { lease_left } => Err(GatewayError::InFlight { retry_after: lease_left }),
        Claim::Mismatch => Err(GatewayError::Mismatch),
    }
}

/// Claims the key; while another request holds it, waits up to the route's `wait` for it to
/// settle. The wait sleeps on a [`Watch`] (woken when the holder completes or releases, or
/// when its lease runs out and the key can be taken over), never in a polling loop, and holds
/// no store connection while asleep.
async fn claim_settled<S: Store>(
    store: &S,
    record: &RecordKey,
    fingerprint: &Fingerprint,
    policy: &IdempotencyPolicy,
) -> Result<Claim, StoreError> {
    let claim_once = || store.claim(record, fingerprint, policy.lease, policy.in_progress_ttl());
    let deadline = Instant::now() + policy.wait;
    let mut claim = claim_once().await?;
    // The watch that was registered before `claim` was read: only then is sleeping on it safe,
    // since a settle between the read and a later registration would never wake us.
    let mut watch: Option<Watch> = None;
    loop {
        let Claim::InFlight { lease_left } = claim else {
            return Ok(claim);
        };
        let now = Instant::now();
        if now >= deadline {
            return Ok(claim);
        }
        if let Some(watch) = watch.take() {
            watch.changed(deadline.min(now + lease_left)).await;
        }
        watch = Some(store.watch(record));
        claim = claim_once().await?;
    }
}
