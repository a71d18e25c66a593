//! The integration tests, in one binary: one link of the dependency graph instead of one per
//! file. Each file of `tests/` is a module here (`cargo test --test integration gateway::`
//! runs one file's tests); `support` is the harness they share. The chaos suite, which prints
//! a table of its own, is a binary of its own (`cargo test --test chaos`).
//!
//! One process runs them all, so what a process has once is shared: a test never changes the
//! process's environment (a gateway that must read a variable runs as a child process given
//! it), never installs a process-wide default (rustls provider, tracing subscriber), and
//! never signals its own process; each takes its own ports (port 0), its own Redis key
//! prefix (`support::unique`) and, to stop or break Redis, a `redis-server` of its own.

mod support;

mod compose;
mod config;
mod config_docs;
mod dashboards;
mod edges;
mod end_to_end;
mod error_shapes;
mod footprint;
mod gateway;
mod hardening;
mod hosts;
mod house;
mod identity;
mod instances;
mod keys_cli;
mod kubernetes;
mod listener_tls;
mod observability;
mod observe;
mod openapi;
mod reconcile;
mod redis_tls;
mod redis_tls_topologies;
mod reload;
mod replicas;
mod roles;
mod store_contract;
mod store_model;
mod telemetry;
mod tls_upstream;
mod upgrade;
