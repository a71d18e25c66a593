//! The Redis store: a record is one string (`layout`); a claim is one native command where it
//! can be (`SET NX GET PX`: an absent key is claimed, a settled one answered from the reply),
//! and every compare-and-set is one Lua script.
//!
//! Scripts are built once (their SHA computed once), loaded when the gateway starts and sent
//! with EVALSHA; on NOSCRIPT (a restarted or failed-over Redis, a new Cluster node) the call is
//! repeated once as EVAL with the script's text, which runs it and caches it on the node that
//! holds the key (a `SCRIPT LOAD` would go to every node of a Cluster and fail while any is
//! down). Calls go over a few multiplexed connections (`store.connections`), which
//! pipeline every concurrent call instead of holding a connection per call: one round trip per
//! transition (two for a claim that meets a claim in progress: the native try, then the
//! script), and concurrent requests share writes. A broken connection reconnects by itself.
//! Every call is bounded by the store timeout.
//! Times are Redis's own expiry clock (a lease ends at a mark on the record's PTTL), never a
//! gateway's wall clock, so that gateways with skewed clocks agree on every lease.
//!
//! Waiting duplicates are woken through pub/sub: a claim that finds the key in flight sets a
//! flag on the record, and the owner's complete/release script publishes the key name on the
//! gateway's channel only when that flag is set, so uncontended keys cost nothing (see
//! `notify`). One connection and how its errors read is `link`; where Redis is and how connections follow
//! it is `links` (through a Sentinel
//! failover, `sentinel`); writes that replicas must hold before the gateway relies on them
//! (`[store] replica_acks`), `replicas`; data-loss detection is `epoch`, and the recent keys
//! it names, `journal`; the scripts and their loading are
//! `scripts`; what one round trip sends and how its reply is read, `round_trip`; one call's
//! way there and back (NOSCRIPT, MOVED, ASK, the timeout), `transport`, and the room it
//! leaves large answers, `budget`. The roles read as the
//! state machine: the key's life and its lookups in `lifecycle`, an operator's calls and the
//! index in `operator`, the audit trail in `audit`, the store itself and the quota in `engine`.

mod audit;
mod budget;
mod engine;
mod epoch;
mod journal;
mod layout;
mod lifecycle;
mod link;
mod links;
mod notify;
mod operator;
mod replicas;
mod round_trip;
mod scripts;
mod sentinel;
mod settings;
mod transport;

pub use self::engine::RedisStore;
pub use self::replicas::ReplicaMetrics;
pub use self::settings::{Acks, Persistence, Settings, Severity};
