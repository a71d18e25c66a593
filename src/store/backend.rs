//! The configured backend: the engine `[store]` names, and how long each kind of call takes.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{
    Claim, Cursor, Entry, Final, IndexEntry, IndexKey, Lease, LookupEnd, LookupEnded, LookupStart, MemoryStore,
    OwnerToken, Page, Purged, QuotaKey, RecordKey, RedisStore, Renewal, Resolved, Sent, Settled, State, Store,
    StoreError, StoredResponse, Watch,
};
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
    /// Each call's histogram in `calls`, once it was first used. Looking it up in the family
    /// at every call took a read lock and a SipHash of the label (450 instructions per call);
    /// it is the same histogram every time.
    by_call: [OnceLock<Histogram>; CALLS.len()],
}

/// The `call` labels, in the order of `Backend::by_call`.
const CALLS: [&str; 11] =
    ["claim", "renew", "settle", "release", "get", "purge", "resolve", "lookup", "index", "quota", "ping"];

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
            StoreBackendConfig::Redis { url, connections, tls, password } => {
                let password = password.as_ref().map(|p| p.0.as_str());
                Engine::Redis(RedisStore::open(url, tls, password, *connections, config.timeout, &config.key_prefix)?)
            }
            StoreBackendConfig::Memory { max_entries, max_bytes } => {
                Engine::Memory(MemoryStore::new(*max_entries, *max_bytes))
            }
        }))
    }

    /// `"redis"` or `"memory"`, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self.engine {
            Engine::Redis(_) => "redis",
            Engine::Memory(_) => "memory",
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
    pub async fn settings(&self) -> Option<super::Settings> {
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
        self.health.saw(out.as_ref().err());
    }
}

// Inline in each call rather than a `timed(work)` wrapper: an async fn keeps the future it is
// given as an argument beside the copy it awaits, so the wrapper doubled the engine's future
// (1.4 KB for a claim) in every future above it, each of them copied whole when created.
macro_rules! delegate {
    ($self:ident, $name:literal, $s:ident => $call:expr) => {{
        let started = std::time::Instant::now();
        let out = match &$self.engine {
            Engine::Redis($s) => $call,
            Engine::Memory($s) => $call,
        };
        $self.observe(const { call_index($name) }, started, &out);
        out
    }};
}

impl Store for Backend {
    async fn claim(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        owner: OwnerToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        delegate!(self, "claim", s => s.claim(key, fp, owner, lease, ttl).await)
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal, StoreError> {
        delegate!(self, "renew", s => s.renew(lease).await)
    }
    async fn settle(&self, lease: &Lease, outcome: Final<'_>, retention: Duration) -> Result<Settled, StoreError> {
        delegate!(self, "settle", s => s.settle(lease, outcome, retention).await)
    }
    async fn release(
        &self,
        key: &RecordKey,
        owner: OwnerToken,
        sent: Sent,
        ttl: Duration,
    ) -> Result<Settled, StoreError> {
        delegate!(self, "release", s => s.release(key, owner, sent, ttl).await)
    }
    async fn get(&self, key: &RecordKey) -> Result<Option<Entry>, StoreError> {
        delegate!(self, "get", s => s.get(key).await)
    }
    async fn purge(&self, key: &RecordKey, force: bool) -> Result<Purged, StoreError> {
        delegate!(self, "purge", s => s.purge(key, force).await)
    }
    async fn resolve(
        &self,
        key: &RecordKey,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Resolved, StoreError> {
        delegate!(self, "resolve", s => s.resolve(key, response, retention).await)
    }
    async fn begin_lookup(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        token: OwnerToken,
        lease: Duration,
    ) -> Result<LookupStart, StoreError> {
        delegate!(self, "lookup", s => s.begin_lookup(key, fp, token, lease).await)
    }
    async fn end_lookup(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        end: LookupEnd<'_>,
    ) -> Result<LookupEnded, StoreError> {
        delegate!(self, "lookup", s => s.end_lookup(key, token, end).await)
    }
    async fn index(
        &self,
        index: &IndexKey,
        held: State,
        entry: &IndexEntry,
        expires_in: Duration,
    ) -> Result<(), StoreError> {
        delegate!(self, "index", s => s.index(index, held, entry, expires_in).await)
    }
    async fn unindex(&self, index: &IndexKey, record: &RecordKey) -> Result<(), StoreError> {
        delegate!(self, "index", s => s.unindex(index, record).await)
    }
    async fn list(
        &self,
        index: &IndexKey,
        held: State,
        cursor: Option<Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        delegate!(self, "index", s => s.list(index, held, cursor, limit).await)
    }
    async fn count(&self, index: &IndexKey, held: State) -> Result<u64, StoreError> {
        delegate!(self, "index", s => s.count(index, held).await)
    }
    fn watch(&self, key: &RecordKey) -> Watch {
        match &self.engine {
            Engine::Redis(s) => s.watch(key),
            Engine::Memory(s) => s.watch(key),
        }
    }
    async fn count_new_key(&self, key: &QuotaKey, window: Duration) -> Result<(u64, Duration), StoreError> {
        delegate!(self, "quota", s => s.count_new_key(key, window).await)
    }
    async fn ping(&self) -> Result<(), StoreError> {
        delegate!(self, "ping", s => s.ping().await)
    }
}
