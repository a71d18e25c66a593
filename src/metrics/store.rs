//! The store's own metrics, registered by the gateway when it builds its store: latency per
//! call, data losses seen, round trips, and what replicas said of the writes that wait for
//! them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::Metrics;

impl Metrics {
    /// Exposes the store's count of detected data losses (Redis only).
    pub fn register_store_data_loss(&mut self, counter: Counter) {
        self.registry.register(
            "store_data_loss",
            "Times this gateway saw Redis lose its records (epoch marker gone); retries of earlier requests then reach the upstream",
            counter,
        );
    }

    /// Exposes what replicas said of the writes that wait for them (`[store] replica_acks`;
    /// Redis only).
    pub fn register_store_replicas(
        &mut self,
        acks: Family<
            impl EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
            Counter,
        >,
        seconds: Family<
            impl EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
            Histogram,
        >,
        answers_unreplicated: Counter,
        claims_unreplicated: Counter,
    ) {
        self.registry.register(
            "store_replica_acks",
            "Writes that waited for replica_acks replicas, by write (claim, answer, unknown, release, lookup) and outcome: acknowledged in time, timed_out, and for a write answered anyway, late (acknowledged while the gateway kept waiting) or never (not by the end of its lease)",
            acks,
        );
        self.registry.register(
            "store_replica_ack_seconds",
            "Time a write and its WAIT for replicas took, by write",
            seconds,
        );
        self.registry.register(
            "store_answers_unreplicated",
            "Answers sent to the client before replica_acks replicas held them (too few acknowledged within replica_ack_timeout): a failover before they catch up may forget them",
            answers_unreplicated,
        );
        self.registry.register(
            "store_claims_unreplicated",
            "Claims given back, their requests not forwarded (503), because too few replicas acknowledged them within replica_ack_timeout",
            claims_unreplicated,
        );
    }

    /// Exposes the count of round trips to Redis (Redis only).
    pub fn register_store_commands(&mut self, counter: Counter) {
        self.registry.register(
            "store_commands",
            "Round trips this gateway made to Redis: one command, or the pipelined side-key write and settle of a large response (the commands a script runs inside Redis are not counted)",
            counter,
        );
    }

    /// Exposes the store's call latency histograms.
    pub fn register_store_latency(
        &mut self,
        family: Family<
            impl EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
            Histogram,
        >,
    ) {
        self.registry.register("store_call_seconds", "Latency of store calls, by call", family);
    }
}
