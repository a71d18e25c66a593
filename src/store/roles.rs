//! What the store does, as four narrow roles: the key's [`Lifecycle`] (what every request
//! calls), [`Lookups`] of unknown outcomes, what an [`Operator`] does to held records, and the
//! [`Quota`] of new keys. Each call is atomic in the store.
//!
//! Redis and the memory store implement every role. The configured [`Backend`] implements
//! them too, by one `match` over its engine per call, which also times the call and tells the
//! store's health whether it answered; `roles!` writes those forwarding methods from the
//! declarations below, so that each signature is written once here and once per engine.

use std::future::Future;
use std::time::Duration;

use super::backend::{Backend, Engine, call_index};
use super::{
    Claim, Cursor, Entry, Final, IndexEntry, IndexKey, Lease, Lookup, LookupEnd, LookupEnded, OwnerToken, Page, Purged,
    QuotaKey, RecordKey, Renewal, Resolved, Sent, Settled, State, StoreError, StoredResponse, Terms, Watch,
};
use crate::policy::fingerprint::Fingerprint;

/// Declares each role (a trait whose calls return `Result<_, StoreError>` and are timed under
/// their `call` label, `=> "label"`, or that answer at once, `=> plain`) and implements it for
/// [`Backend`]: each call forwarded to the engine.
macro_rules! roles {
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
            $( roles!(@declare $kind, $(#[$call_doc])* $call, ($($arg: $ty),*), $out); )*
        }

        impl $role for Backend {
            $( roles!(@forward $kind, $role, $call, ($($arg: $ty),*), $out); )*
        }
    )*};

    (@declare plain, $(#[$doc:meta])* $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        $(#[$doc])*
        fn $call(&self $(, $arg: $ty)*) -> $out;
    };
    (@declare $label:literal, $(#[$doc:meta])* $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        $(#[$doc])*
        fn $call(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$out, StoreError>> + Send;
    };

    (@forward plain, $role:ident, $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        fn $call(&self $(, $arg: $ty)*) -> $out {
            match self.engine() {
                Engine::Redis(s) => $role::$call(s $(, $arg)*),
                Engine::Memory(s) => $role::$call(s $(, $arg)*),
            }
        }
    };
    // Timed inline rather than by a `timed(work)` wrapper: an async fn keeps the future it is
    // given beside the copy it awaits, which doubled the engine's future (1.4 KB for a claim)
    // in every future above it.
    (@forward $label:literal, $role:ident, $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        async fn $call(&self $(, $arg: $ty)*) -> Result<$out, StoreError> {
            let started = std::time::Instant::now();
            let out = match self.engine() {
                Engine::Redis(s) => $role::$call(s $(, $arg)*).await,
                Engine::Memory(s) => $role::$call(s $(, $arg)*).await,
            };
            self.observe(const { call_index($label) }, started, &out);
            out
        }
    };
}

roles! {
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

    /// What an operator sees and does: a record inspected, resolved with an answer or purged,
    /// and the index of the records that need one ([`State::HELD`]).
    pub trait Operator {
        /// What the store holds for `key`.
        fn get(&self, key: &RecordKey) -> Option<Entry> => "get";

        /// Sets a record in `unknown` or `executed` to `completed` with an operator's answer,
        /// kept for `retention`; any other state is left alone (`Resolved::Refused`).
        fn resolve(&self, key: &RecordKey, response: &StoredResponse, retention: Duration) -> Resolved => "resolve";

        /// Releases `key`, keeping its attempt count: any record but a claim whose lease is
        /// live, which only a `force`d purge releases (its request may be running upstream).
        /// The check and the release are one atomic step.
        fn purge(&self, key: &RecordKey, force: bool) -> Purged => "purge";

        /// Adds `entry` to the index of records in `held`, until `expires_in` from now. Best
        /// effort: the index may live on another node than the record.
        fn index(&self, index: &IndexKey, held: State, entry: &IndexEntry, expires_in: Duration) -> () => "index";

        /// Takes `record` out of the index (it no longer needs an operator).
        fn unindex(&self, index: &IndexKey, record: &RecordKey) -> () => "index";

        /// One page of the index in `held`, oldest first, from `cursor`: the entries as
        /// indexed (the caller checks each against its record) and where the next page starts.
        fn list(&self, index: &IndexKey, held: State, cursor: Option<Cursor>, limit: usize) -> Page => "index";

        /// How many entries the index holds in `held` (not yet expired).
        fn count(&self, index: &IndexKey, held: State) -> u64 => "index";
    }

    /// Budgets of new keys per caller.
    pub trait Quota {
        /// Counts one new key against the budget `key`, whose window lasts `window` from its
        /// first key: the count so far in this window, and the time until it ends.
        fn count_new_key(&self, key: &QuotaKey, window: Duration) -> (u64, Duration) => "quota";
    }
}
