//! The configured backend: the engine `[store]` names, and how long each kind of call takes.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::audit::{AuditId, AuditPage};
use super::entry::{Entry, Purged, Resolved};
use super::error::StoreError;
use super::index::{Cursor, IndexEntry, IndexKey, Page};
use super::lifecycle::{Claim, Final, Lease, Renewal, Sent, Settled, Terms};
use super::lookups::{Lookup, LookupEnd, LookupEnded};
use super::memory::MemoryStore;
use super::names::{OwnerToken, QuotaKey, RecordKey};
use super::record::StoredResponse;
use super::redis::{RedisStore, Settings};
use super::roles::{Audit, Index, Lifecycle, Lookups, Operator, Quota, Records, with_roles};
use super::state::State;
use super::waiters::Watch;
use crate::config::{StoreBackendConfig, StoreConfig};
use crate::policy::fingerprint::Fingerprint;

/// The configured store engine.
pub enum Engine {
    /// Redis.
    Redis(RedisStore),
    /// In-process memory.
    Memory(MemoryStore),
}

/// The configured backend: its engine, how long each kind of call takes, and whether the
/// store answers (see `health`).
pub struct Backend {
    engine: Engine,
    health: super::health::Health,
    /// Latency of store calls, by call (`claim`, `settle`, ...).
    calls: Family<CallLabel, Histogram>,
    /// Each call's histogram in `calls`, once it was first used: the same every time, so not
    /// looked up (a lock and a hash of the label) at every call.
    by_call: [OnceLock<Histogram>; CALLS.len()],
}

/// The `call` labels, in the order of `Backend::by_call`.
const CALLS: [&str; 12] =
    ["claim", "renew", "settle", "release", "get", "purge", "resolve", "lookup", "index", "audit", "quota", "ping"];

/// Where `call` is in [`CALLS`]; evaluated at compile time, so a call without a label does
/// not build.
const fn call_index(call: &str) -> usize {
    let mut i = 0;
    while i < CALLS.len() {
        if CALLS[i].len() == call.len() && const_eq(CALLS[i].as_bytes(), call.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("a store call without a label in CALLS");
}

const fn const_eq(a: &[u8], b: &[u8]) -> bool {
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The `call` label of the store latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CallLabel {
    call: &'static str,
}

impl Backend {
    /// A backend over `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            health: super::health::Health::default(),
            calls: Family::new_with_constructor(crate::metrics::latency_histogram),
            by_call: Default::default(),
        }
    }

    /// Builds the backend named by the config. Redis connects lazily: a gateway starts (and
    /// answers by its `on_store_error` policy) even while Redis is down.
    pub fn from_config(config: &StoreConfig) -> Result<Self, StoreError> {
        Ok(Self::new(match &config.backend {
            StoreBackendConfig::Redis { url, connections, tls, password, replicas } => {
                let password = password.as_ref().map(|p| p.0.as_str());
                let store = RedisStore::open(url, tls, password, *connections, config.timeout, &config.key_prefix)?;
                Engine::Redis(store.requiring(*replicas))
            }
            StoreBackendConfig::Memory { max_entries, max_bytes } => {
                Engine::Memory(MemoryStore::new(*max_entries, *max_bytes))
            }
        }))
    }

    /// Where the store is, for a log line: its addresses (never credentials), or `memory`.
    pub fn describe(&self) -> String {
        match &self.engine {
            Engine::Redis(redis) => redis.describe(),
            Engine::Memory(_) => "memory".to_owned(),
        }
    }

    /// The longest one call may take (`store.timeout`; nothing for the memory store): a call
    /// sent now may be applied that much later.
    pub fn call_timeout(&self) -> Duration {
        match &self.engine {
            Engine::Redis(redis) => redis.timeout(),
            Engine::Memory(_) => Duration::ZERO,
        }
    }

    /// The Redis engine, if that is the engine.
    pub fn redis(&self) -> Option<&RedisStore> {
        match &self.engine {
            Engine::Redis(redis) => Some(redis),
            Engine::Memory(_) => None,
        }
    }

    /// The settings of the store that decide whether records last their retention (Redis
    /// only: the memory store evicts only what its own bounds say, see `memory`).
    pub async fn settings(&self) -> Option<Settings> {
        match &self.engine {
            Engine::Redis(redis) => Some(redis.settings().await),
            Engine::Memory(_) => None,
        }
    }

    /// The store latency histograms, for the metrics registry.
    pub fn call_latency(&self) -> Family<CallLabel, Histogram> {
        self.calls.clone()
    }

    /// Notes how one store call went: its time under the label `CALLS[call]`, and whether
    /// the store answered.
    fn observe<T>(&self, call: usize, started: std::time::Instant, out: &Result<T, StoreError>) {
        // `call` comes from `call_index` at compile time: always in range.
        if let (Some(histogram), Some(&label)) = (self.by_call.get(call), CALLS.get(call)) {
            let histogram = histogram.get_or_init(|| self.calls.get_or_create(&CallLabel { call: label }).clone());
            histogram.observe(started.elapsed().as_secs_f64());
        }
        self.health.saw(out.as_ref().err(), || self.describe());
    }
}

/// Implements each role handed over by [`with_roles`] for [`Backend`]: each call forwarded to
/// the engine, timed under its label, and told to the store's health.
macro_rules! forward {
    ($(
        $(#[$doc:meta])*
        pub trait $role:ident {
            $(
                $(#[$call_doc:meta])*
                fn $call:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $out:ty => $kind:tt;
            )*
        }
    )*) => {$(
        impl $role for Backend {
            $( forward!(@call $kind, $role, $call, ($($arg: $ty),*), $out); )*
        }
    )*};

    (@call plain, $role:ident, $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        fn $call(&self $(, $arg: $ty)*) -> $out {
            match &self.engine {
                Engine::Redis(s) => $role::$call(s $(, $arg)*),
                Engine::Memory(s) => $role::$call(s $(, $arg)*),
            }
        }
    };
    // Timed inline rather than by a `timed(work)` wrapper: an async fn keeps the future it is
    // given beside the copy it awaits, which doubled the engine's future (1.4 KB for a claim)
    // in every future above it.
    (@call $label:literal, $role:ident, $call:ident, ($($arg:ident: $ty:ty),*), $out:ty) => {
        async fn $call(&self $(, $arg: $ty)*) -> Result<$out, StoreError> {
            let started = std::time::Instant::now();
            let out = match &self.engine {
                Engine::Redis(s) => $role::$call(s $(, $arg)*).await,
                Engine::Memory(s) => $role::$call(s $(, $arg)*).await,
            };
            self.observe(const { call_index($label) }, started, &out);
            out
        }
    };
}

with_roles!(forward);
