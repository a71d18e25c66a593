//! Test harness: a real `redis-server` per test binary, a counting upstream, the gateway on
//! port 0, and a small HTTP client. Everything binds to loopback.

#![allow(dead_code)]

pub mod client;
pub mod gateway;
pub mod process;
pub mod redis;
pub mod upstream;

use std::sync::atomic::{AtomicUsize, Ordering};

/// A name unique within this test process and across concurrently running test processes, for
/// key prefixes, so tests sharing one Redis never see each other's records.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}
