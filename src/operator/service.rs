//! The operator's calls on one route's keys. Each is a store call or two with the index kept
//! in step (a released or resolved key no longer needs an operator; a listed entry whose
//! record moved on is dropped), and every change is audited (see `audit`): who changed which
//! key, from what, to what.

use std::time::Duration;

use super::audit::{self, Actor, Change, Outcome};
use super::wire;
use crate::config::AuditRetention;
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

/// What an operator (`by`) does to the keys of one idempotent route, each change written to
/// the audit trail kept as `retention` says.
pub(crate) struct Keys<'a> {
    rt: &'a Runtime,
    route: &'a IdempotentRoute,
    index: IndexKey,
    by: &'a Actor,
    retention: AuditRetention,
}

impl<'a> Keys<'a> {
    /// The keys of `route`, for the operator `by`.
    pub fn new(rt: &'a Runtime, route: &'a IdempotentRoute, by: &'a Actor, retention: AuditRetention) -> Self {
        Self { rt, route, index: IndexKey::new(rt.key_prefix(), &route.policy.identity.name), by, retention }
    }

    /// What the store holds for `record`, the stored answer included.
    pub async fn inspect(&self, record: &RecordKey) -> Result<Option<crate::store::Entry>, StoreError> {
        self.rt.records().get(record).await
    }

    /// Releases `record`, keeping its attempt count: a retry runs again. A key a running
    /// request holds is released only when `force`d.
    pub async fn release(&self, record: &RecordKey, force: bool) -> Result<wire::Released, Refusal> {
        let action = if force { "forced-release" } else { "release" };
        match self.rt.operator().purge(record, force).await {
            Ok(Purged::Released { was }) => {
                // Best effort: an entry left behind is dropped when next listed.
                let _ = self.rt.index().unindex(&self.index, record).await;
                let (before, after) = (Some(was.name()), Some(State::Released.name()));
                self.audit(action, record, (before, after), Outcome::Done, 200, "released").await;
                Ok(wire::Released { released: true, was: Some(was) })
            }
            Ok(Purged::Nothing) => {
                self.audit(action, record, (None, None), Outcome::Nothing, 200, "nothing to release").await;
                Ok(wire::Released { released: false, was: None })
            }
            Ok(Purged::Refused { lease_left }) => {
                let held = Some(State::InProgress.name());
                let detail = "refused: a request holds the key";
                self.audit(action, record, (held, held), Outcome::Conflict, 409, detail).await;
                Err(Refusal::Running { lease_left })
            }
            Err(e) => {
                self.audit(action, record, (None, None), Outcome::Failed, failed_status(&e), "store error").await;
                Err(e.into())
            }
        }
    }

    /// Completes an unknown or executed `record` with the operator's `answer`, replayed to
    /// every retry for the route's retention.
    pub async fn resolve(&self, record: &RecordKey, answer: &StoredResponse) -> Result<wire::Resolved, Refusal> {
        match self.rt.operator().resolve(record, answer, self.route.policy.retention).await {
            Ok(Resolved::Done { was }) => {
                let _ = self.rt.index().unindex(&self.index, record).await;
                let detail = format!("resolved with {}", answer.status.as_u16());
                let states = (Some(was.name()), Some(State::Completed.name()));
                self.audit("resolve", record, states, Outcome::Done, 200, &detail).await;
                Ok(wire::Resolved { resolved: true, was })
            }
            Ok(Resolved::Refused { state }) => {
                let held = Some(state.map_or(wire::ABSENT, State::name));
                let detail = "refused: not unknown or executed";
                self.audit("resolve", record, (held, held), Outcome::Conflict, 409, detail).await;
                Err(Refusal::NotHeld { state })
            }
            Err(e) => {
                self.audit("resolve", record, (None, None), Outcome::Failed, failed_status(&e), "store error").await;
                Err(e.into())
            }
        }
    }

    /// Notes a resolve refused before the store was asked: its body was not an answer.
    pub async fn refused_answer(&self, record: &RecordKey, status: u16) {
        self.audit("resolve", record, (None, None), Outcome::BadRequest, status, "refused: not an answer").await;
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

    async fn audit(
        &self,
        action: &'static str,
        record: &RecordKey,
        (before, after): (Option<&str>, Option<&str>),
        outcome: Outcome,
        status: u16,
        detail: &str,
    ) {
        let change = Change {
            action,
            route: Some(&self.route.name),
            record: Some(record.short()),
            before,
            after,
            outcome,
            status,
            detail,
        };
        audit::write(self.rt, self.retention, self.by, change).await;
    }
}

/// The status a store failure is answered with (see `admin::keys::store_failed`).
fn failed_status(e: &StoreError) -> u16 {
    match e {
        StoreError::Rejected(_) => 500,
        _ => 503,
    }
}
