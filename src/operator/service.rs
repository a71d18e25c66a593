//! The operator's calls on one route's keys. Each is a store call or two with the index kept
//! in step (a released or resolved key no longer needs an operator; a listed entry whose
//! record moved on is dropped), and every change is audited: one line under the target
//! `idemgate::audit`, saying who changed which key, from what, to what.

use std::net::IpAddr;
use std::time::Duration;

use super::wire;
use crate::runtime::{IdempotentRoute, Runtime};
use crate::store::{
    Cursor, Index as _, IndexKey, Operator as _, Purged, RecordKey, Records as _, Resolved, State, StoreError,
    StoredResponse,
};

/// Why an operator's change was not made.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A request holds the key, its lease live for `lease_left`: it may be running upstream
    /// now, and released, a retry would run it a second time beside it.
    Running {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// Only an unknown or executed record can be resolved; this one is in `state` (`None`:
    /// absent).
    NotHeld {
        /// Its state.
        state: Option<State>,
    },
    /// The store failed; nothing is known to have changed.
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// What an operator, calling from `by`, does to the keys of one idempotent route.
pub(crate) struct Keys<'a> {
    rt: &'a Runtime,
    route: &'a IdempotentRoute,
    index: IndexKey,
    by: IpAddr,
}

impl<'a> Keys<'a> {
    /// The keys of `route`, for an operator calling from `by`.
    pub fn new(rt: &'a Runtime, route: &'a IdempotentRoute, by: IpAddr) -> Self {
        Self { rt, route, index: IndexKey::new(rt.key_prefix(), &route.policy.identity.name), by }
    }

    /// What the store holds for `record`.
    pub async fn inspect(&self, record: &RecordKey) -> Result<Option<wire::Record>, StoreError> {
        Ok(self.rt.records().get(record).await?.as_ref().map(wire::Record::from))
    }

    /// Releases `record`, keeping its attempt count: a retry runs again. A key a running
    /// request holds is released only when `force`d.
    pub async fn release(&self, record: &RecordKey, force: bool) -> Result<wire::Released, Refusal> {
        let action = if force { "forced-release" } else { "release" };
        match self.rt.operator().purge(record, force).await {
            Ok(Purged::Released { was }) => {
                self.audit(action, record, Some(was), "released");
                // Best effort: an entry left behind is dropped when next listed.
                let _ = self.rt.index().unindex(&self.index, record).await;
                Ok(wire::Released { released: true, was: Some(was) })
            }
            Ok(Purged::Nothing) => {
                self.audit(action, record, None, "nothing to release");
                Ok(wire::Released { released: false, was: None })
            }
            Ok(Purged::Refused { lease_left }) => {
                self.audit(action, record, Some(State::InProgress), "refused: a request holds the key");
                Err(Refusal::Running { lease_left })
            }
            Err(e) => {
                self.audit(action, record, None, "store error");
                Err(e.into())
            }
        }
    }

    /// Completes an unknown or executed `record` with the operator's `answer`, replayed to
    /// every retry for the route's retention.
    pub async fn resolve(&self, record: &RecordKey, answer: &StoredResponse) -> Result<wire::Resolved, Refusal> {
        match self.rt.operator().resolve(record, answer, self.route.policy.retention).await {
            Ok(Resolved::Done { was }) => {
                self.audit("resolve", record, Some(was), &format!("resolved with {}", answer.status.as_u16()));
                let _ = self.rt.index().unindex(&self.index, record).await;
                Ok(wire::Resolved { resolved: true, was })
            }
            Ok(Resolved::Refused { state }) => {
                let before = state.map_or(wire::ABSENT, State::name);
                self.audit_named("resolve", record, before, "refused: not unknown or executed");
                Err(Refusal::NotHeld { state })
            }
            Err(e) => {
                self.audit("resolve", record, None, "store error");
                Err(e.into())
            }
        }
    }

    /// Notes a resolve refused before the store was asked: its body was not an answer.
    pub fn refused_answer(&self, record: &RecordKey) {
        self.audit("resolve", record, None, "refused: not an answer");
    }

    /// One page of the route's records in `held` (a state that needs an operator), oldest
    /// first, from `cursor`. Each entry of the index is checked against its record (the index
    /// is best-effort): one that moved on is dropped from the index and not listed.
    pub async fn list(&self, held: State, cursor: Option<Cursor>, limit: usize) -> Result<wire::Page, StoreError> {
        let (index, store) = (self.rt.index(), self.rt.records());
        let page = index.list(&self.index, held, cursor, limit).await?;
        let now = crate::store::unix_ms();
        let mut records = Vec::with_capacity(page.entries.len());
        for (entry, _score) in page.entries {
            let record = entry.record_key();
            let found = store.get(&record).await?;
            let Some(found) = found.filter(|found| found.state.state() == held) else {
                let _ = index.unindex(&self.index, &record).await;
                continue;
            };
            records.push(wire::Listed {
                attempt: found.attempt,
                key: entry.key,
                method: entry.method,
                path: entry.path,
                scope_hash: entry.scope_hash,
                since_ms: now.saturating_sub(entry.since_unix_ms),
                state: held,
            });
        }
        let next_cursor = page.next.map(|c| c.encode());
        Ok(wire::Page { next_cursor, records, route: self.route.name.clone(), state: held })
    }

    /// How many of `route`'s records are unknown, as its index has them (for the gauge).
    pub async fn count_unknown(rt: &Runtime, route: &IdempotentRoute) -> Result<u64, StoreError> {
        rt.index().count(&IndexKey::new(rt.key_prefix(), &route.policy.identity.name), State::Unknown).await
    }

    fn audit(&self, action: &'static str, record: &RecordKey, before: Option<State>, result: &str) {
        self.audit_named(action, record, before.map_or("-", State::name), result);
    }

    fn audit_named(&self, action: &'static str, record: &RecordKey, before: &str, result: &str) {
        tracing::info!(
            target: "idemgate::audit",
            peer = %self.by,
            action,
            route = %self.route.name,
            key = record.short(),
            before,
            result,
            "operator changed a key"
        );
    }
}
