//! The scenarios, in the order of the summary table.

mod crash;
mod disconnect;
mod failover;
mod flaky_upstream;
mod lease;
mod lost_answers;
mod redis_blip;
mod redis_down;
mod redis_loss;
mod replication;
mod reshard;
mod shutdown_deadline;
mod sigterm;
mod storm;
mod topologies;

use std::future::Future;
use std::pin::Pin;

use crate::common::Report;

type Scenario = fn() -> Pin<Box<dyn Future<Output = Report> + Send>>;

pub const ALL: &[(&str, Scenario)] = &[
    ("1 storm: 2 gateways, 500 keys x 8 duplicates", || Box::pin(storm::run())),
    ("2 lease shorter than the upstream call", || Box::pin(lease::run())),
    ("3 kill -9 of a gateway mid-request", || Box::pin(crash::run())),
    ("4 redis restarted empty before the retry", || Box::pin(redis_loss::run())),
    ("5 redis stopped during load", || Box::pin(redis_down::run())),
    ("6 client disconnects after sending", || Box::pin(disconnect::run())),
    ("7 SIGTERM under load", || Box::pin(sigterm::run())),
    ("8 upstream 5xx, then success", || Box::pin(flaky_upstream::run())),
    ("9 shutdown deadline with a request still running", || Box::pin(shutdown_deadline::run())),
    ("10 storm on a 3-primary Redis Cluster", || Box::pin(topologies::cluster())),
    ("11 storm, SENTINEL FAILOVER, retries, storm", || Box::pin(topologies::sentinel_failover())),
    ("12 redis down 0.5s, 1.5s, 3s while the upstream answers", || Box::pin(redis_blip::run())),
    ("13 cluster slots MIGRATING for 2s under small and 20 KiB answers", || Box::pin(reshard::run())),
    ("14 cluster primary killed while the upstream answers", || Box::pin(failover::cluster())),
    ("15 sentinel primary killed while the upstream answers", || Box::pin(failover::sentinel())),
    (
        "16 upstream drops after executing, before executing, times out while executing; 2 gateways, reconcile on and off",
        || Box::pin(lost_answers::run()),
    ),
    ("17 sentinel primary's host killed, its replica 300 ms behind", || Box::pin(replication::without_replica_acks())),
    ("18 sentinel primary's host killed, its replica 300 ms behind, replica_acks = 1", || {
        Box::pin(replication::with_replica_acks())
    }),
    ("19 replica frozen, replica_acks = 1", || Box::pin(replication::frozen_replica_with_replica_acks())),
];
