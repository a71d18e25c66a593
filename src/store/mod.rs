//! Store: the state of every key, shared by all gateway instances.
//!
//! Each key is a small state machine ([`State`]: in progress, completed, executed, unknown,
//! released), drawn once, with every transition, in docs/architecture.md ("The state of a
//! key"). What the store does is six narrow roles (see `roles`), each held by who needs it:
//! the key's [`Lifecycle`], [`Lookups`] of unknown outcomes, [`Records`] read, the [`Index`]
//! of records that need an operator, what an [`Operator`] does, the [`Quota`] of new keys;
//! each call is one atomic step in the store. What each role speaks lives beside it:
//! `lifecycle`, `lookups`, `entry`, `index`, and `error` for every call.
//!
//! Two engines implement every role and pass one conformance suite
//! (`tests/store_contract.rs`): [`RedisStore`] (Lua scripts, any number of instances) and
//! [`MemoryStore`] (one process). The configured one is a [`Backend`], which also times every
//! call.
//!
//! This file only names the parts: nothing below imports it.

mod audit;
mod backend;
mod entry;
mod error;
mod health;
mod index;
mod lifecycle;
mod lookups;
mod memory;
mod names;
mod record;
mod redis;
mod roles;
mod state;
mod waiters;

pub use self::audit::{AuditEntry, AuditId, AuditPage};
pub use self::backend::{Backend, CallLabel, Engine};
pub use self::entry::{Entry, EntryState, Purged, Resolved};
pub use self::error::{Result, StoreError};
pub use self::index::{Cursor, IndexEntry, IndexKey, Page, unix_ms};
pub use self::lifecycle::{Claim, Final, Granted, Lease, Renewal, Sent, Settled, Terms};
pub use self::lookups::{Lookup, LookupEnd, LookupEnded};
pub use self::memory::MemoryStore;
pub use self::names::{OwnerToken, QuotaKey, RecordKey};
pub use self::record::{RecordError, StoredResponse};
pub use self::redis::{Acks, Persistence, RedisStore, ReplicaMetrics, Settings, Severity};
pub use self::roles::{Audit, Index, Lifecycle, Lookups, Operator, Quota, Records};
pub use self::state::State;
pub use self::waiters::Watch;
pub use crate::body::Payload;
