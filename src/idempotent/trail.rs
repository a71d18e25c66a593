//! Trail: what an enforcing exchange keeps of its request for a key that may end needing an
//! operator (unknown, or executed without its body): the entry of the index of held records,
//! and, on a route that reconciles, the question its lookup asks. Written after the client's
//! answer, which neither delays.

use std::sync::Arc;

use http::request::Parts;
use http::{Method, Uri};

use super::context::Claimant;
use super::reconcile::{self, Question};
use crate::forwarded::Peer;
use crate::policy::Mode;
use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{Index, IndexEntry, IndexKey, RecordKey, State};

/// What an enforcing exchange keeps of its request for a key that ends needing an operator:
/// the index entry of an unknown or executed record, and the question a lookup asks.
pub struct Trail {
    key: IdempotencyKey,
    scope: Scope,
    method: Method,
    /// The record, unless the question holds it.
    record: Option<RecordKey>,
    /// The path and query as the client sent them.
    uri: Uri,
    /// On a route that reconciles.
    question: Option<Question>,
}

impl Trail {
    /// What an enforcing exchange keeps of `claimant`'s request; an observing one holds no
    /// key for an operator.
    pub fn of(route: &IdempotentRoute, parts: &Parts, claimant: Claimant, peer: &Peer) -> Option<Self> {
        if route.policy.mode == Mode::Observe {
            return None;
        }
        let Claimant { record, key, scope, fingerprint, .. } = claimant;
        // Only a route that reconciles keeps what a lookup needs (a few headers, the peer).
        let (question, record) = match &route.policy.reconcile {
            Some(_) => (Some(Question::new(route, &parts.headers, &key, record, fingerprint, peer)), None),
            None => (None, Some(record)),
        };
        Some(Self { key, scope, method: parts.method.clone(), record, uri: parts.uri.clone(), question })
    }

    /// After a key ended needing attention (`held`): its entry in the index of records that
    /// need an operator, and, on a route that reconciles, a lookup in the background. After
    /// the client's answer, which neither delays. Best effort: the index is checked against
    /// the record when read.
    pub fn record(self, rt: &Arc<Runtime>, route: &Arc<IdempotentRoute>, held: Option<State>) {
        let Some(held) = held else { return };
        let Self { key, scope, method, record, uri, question } = self;
        let Some(record) = record.or_else(|| question.as_ref().map(|q| q.record().clone())) else { return };
        let entry = IndexEntry {
            record: record.as_str().to_owned(),
            key: key.header_form(),
            scope_hash: scope.to_hex(),
            method: method.as_str().to_owned(),
            path: uri.path_and_query().map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
            since_unix_ms: crate::store::unix_ms(),
        };
        let (rt2, route2) = (Arc::clone(rt), Arc::clone(route));
        tokio::spawn(async move {
            let index = IndexKey::new(rt2.key_prefix(), &route2.policy.identity.name);
            if let Err(e) = rt2.index().index(&index, held, &entry, route2.policy.retention).await {
                tracing::debug!(route = %route2.name, key = record.short(), error = %e, "cannot index a record that needs an operator");
            }
        });
        if let Some(question) = question.filter(|_| held == State::Unknown) {
            reconcile::later(rt, route, question);
        }
    }
}
