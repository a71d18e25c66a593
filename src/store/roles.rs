//! What the store does, as seven narrow roles: the key's [`Lifecycle`] (what every request
//! calls), [`Lookups`] of unknown outcomes, [`Records`] read as they are, the [`Index`] of
//! records that need an operator, what an [`Operator`] does to them, the [`Audit`] trail of
//! what operators did, and the [`Quota`] of new keys. Each call is atomic in the store. The
//! request path holds the lifecycle, lookups, records, index and quota; the admin API holds
//! records, the index, the operator's and the audit trail.
//!
//! Redis and the memory store implement every role. The configured backend implements them
//! too (see `backend`), by forwarding each call to its engine. The roles are written once, in
//! [`with_roles`]: declared here from that list, forwarded there from the same list, so that
//! each signature is written once here and once per engine.

use std::future::Future;
use std::time::Duration;

use super::audit::{AuditId, AuditPage};
use super::entry::{Entry, Purged, Resolved};
use super::error::StoreError;
use super::index::{Cursor, IndexEntry, IndexKey, Page};
use super::lifecycle::{Claim, Final, Lease, Renewal, Sent, Settled, Terms};
use super::lookups::{Lookup, LookupEnd, LookupEnded};
use super::names::{OwnerToken, QuotaKey, RecordKey};
use super::record::StoredResponse;
use super::state::State;
use super::waiters::Watch;
use crate::policy::fingerprint::Fingerprint;

/// Hands the roles, as written below, to the macro `$then`: each role a trait whose calls
/// return `Result<_, StoreError>` and are timed under their `call` label (`=> "label"`), or
/// answer at once (`=> plain`). The types they name are resolved where `$then` is invoked.
macro_rules! with_roles {
    ($then:ident) => {
        $then! {
            /// The life of one key, as the request path lives it: claimed, renewed while it runs,
            /// settled with its outcome or released, and watched by the duplicates that wait for it.
            ///
            /// The attempt counts the executions that may have reached the upstream; the next
            /// execution of a released or taken-over key is announced upstream as attempt + 1 (a
            /// release of an attempt that never left gives its number back). Every call after the
            /// claim names the owner token, so a gateway whose lease was taken over can neither settle
            /// nor release the new owner's claim. The owner token is made before the claim call: a
            /// claim whose reply was lost (timeout) can still be released by its owner.
            pub trait Lifecycle {
                /// Claims `key` for a request with fingerprint `fp` under the caller's fresh `owner`
                /// token, on `terms`: acquires it if absent or released (or its lease has passed),
                /// else reports what is there (claim, fingerprint compare, replay read and takeover
                /// in one call).
                fn claim(&self, key: &RecordKey, fp: &Fingerprint, owner: OwnerToken, terms: Terms) -> Claim => "claim";

                /// Extends a live lease by its full duration.
                fn renew(&self, lease: &Lease) -> Renewal => "renew";

                /// Ends the claim with its outcome, kept for `retention`. Takes the lease by reference
                /// so that a call that failed can be repeated; the caller drops the lease once it is
                /// settled.
                fn settle(&self, lease: &Lease, outcome: Final<'_>, retention: Duration) -> Settled => "settle";

                /// Ends the claim of `owner` on `key` without an outcome: a retry runs again. Takes
                /// the owner rather than a [`Lease`] so that a claim whose reply never arrived can be
                /// released.
                fn release(&self, key: &RecordKey, owner: OwnerToken, sent: Sent, ttl: Duration) -> Settled => "release";

                /// Whether the store answers.
                fn ping(&self) -> () => "ping";

                /// Starts watching `key`: the returned [`Watch`] fires when the key is settled or
                /// released after this call. Register BEFORE re-reading the key, or a change between
                /// the read and the registration is missed.
                fn watch(&self, key: &RecordKey) -> Watch => plain;
            }

            /// Lookups of unknown outcomes (see `reconcile`): at most one per key at a time, across
            /// all gateways, each ended by a compare-and-set.
            pub trait Lookups {
                /// Starts a lookup of an `unknown` record made by a request with fingerprint `fp`,
                /// under the caller's fresh `token`, held for `lease`. A record that is no longer unknown, or was made by another request, is
                /// reported, not touched.
                fn lookup(&self, key: &RecordKey, fp: &Fingerprint, token: OwnerToken, lease: Duration) -> Lookup => "lookup";

                /// Ends the lookup `token` holds on `key` with what the upstream said: nothing changes
                /// unless the record is still unknown and the lookup still ours.
                fn end_lookup(&self, key: &RecordKey, token: OwnerToken, end: LookupEnd<'_>) -> LookupEnded => "lookup";
            }

            /// Records read as the store holds them: by an operator, and by a retry that waits for a
            /// lookup of its unknown outcome.
            pub trait Records {
                /// What the store holds for `key`.
                fn get(&self, key: &RecordKey) -> Option<Entry> => "get";
            }

            /// The index of the records that need an operator ([`State::HELD`]): written when an
            /// exchange leaves its key unknown or executed, cleared when the key is settled, read by
            /// the admin API. Best effort: the index may live on another node than the record, and
            /// every entry is checked against its record when read.
            pub trait Index {
                /// Adds `entry` to the index of records in `held`, until `expires_in` from now.
                fn index(&self, index: &IndexKey, held: State, entry: &IndexEntry, expires_in: Duration) -> () => "index";

                /// Takes `record` out of the index (it no longer needs an operator).
                fn unindex(&self, index: &IndexKey, record: &RecordKey) -> () => "index";

                /// One page of the index in `held`, oldest first, from `cursor`: the entries as
                /// indexed (the caller checks each against its record) and where the next page starts.
                fn list(&self, index: &IndexKey, held: State, cursor: Option<Cursor>, limit: usize) -> Page => "index";

                /// How many entries the index holds in `held` (not yet expired).
                fn count(&self, index: &IndexKey, held: State) -> u64 => "index";
            }

            /// What only an operator does to a record: resolve it with an answer, or purge it.
            pub trait Operator {
                /// Sets a record in `unknown` or `executed` to `completed` with an operator's answer,
                /// kept for `retention`; any other state is left alone (`Resolved::Refused`).
                fn resolve(&self, key: &RecordKey, response: &StoredResponse, retention: Duration) -> Resolved => "resolve";

                /// Releases `key`, keeping its attempt count: any record but a claim whose lease is
                /// live, which only a `force`d purge releases (its request may be running upstream).
                /// The check and the release are one atomic step.
                fn purge(&self, key: &RecordKey, force: bool) -> Purged => "purge";
            }

            /// The audit trail of what operators did, one per store, shared by every gateway on it.
            pub trait Audit {
                /// Appends `document` (one JSON object) to the trail, which then keeps at most `keep`
                /// entries and none older than `max_age`.
                fn append(&self, document: &str, keep: u64, max_age: Duration) -> () => "audit";

                /// Up to `limit` entries, newest first: the newest, or those older than `before`.
                fn trail(&self, before: Option<AuditId>, limit: usize) -> AuditPage => "audit";
            }

            /// Budgets of new keys per caller.
            pub trait Quota {
                /// Counts one new key against the budget `key`, whose window lasts `window` from its
                /// first key: the count so far in this window, and the time until it ends.
                fn count_new_key(&self, key: &QuotaKey, window: Duration) -> (u64, Duration) => "quota";
            }
        }
    };
}
pub(super) use with_roles;

/// Declares each role handed over by [`with_roles`] as a trait.
macro_rules! declare {
    ($(
        $(#[$doc:meta])*
        pub trait $role:ident {
            $(
                $(#[$call_doc:meta])*
                fn $call:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $out:ty => $kind:tt;
            )*
        }
    )*) => {$(
        $(#[$doc])*
        pub trait $role: Send + Sync {
            $( declare!(@call $kind, $(#[$call_doc])* $call, ($($arg: $ty),*), $out); )*
        }
    )*};

    (@call plain, $(#[$doc:meta])* $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        $(#[$doc])*
        fn $call(&self $(, $arg: $ty)*) -> $out;
    };
    (@call $label:literal, $(#[$doc:meta])* $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        $(#[$doc])*
        fn $call(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$out, StoreError>> + Send;
    };
}

with_roles!(declare);
