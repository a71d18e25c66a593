//! The Lua scripts, each built once (its SHA computed once) from the files in `lua/`.
//!
//! A Redis that restarted or failed over, or a Cluster node new to the store, does not know a
//! script's SHA and answers EVALSHA with NOSCRIPT; the store's `query` then repeats the call
//! once as EVAL. So that the first calls after a start do not pay that round trip, the
//! scripts are loaded once Redis answers (not on a Cluster, where SCRIPT LOAD goes to every
//! node and fails while any is down).

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::links::Links;

/// A script: its SHA for EVALSHA, its text for EVAL.
pub(super) struct Lua {
    pub script: Script,
    pub code: &'static str,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Self { script: Script::new(code), code }
    }
}

pub(super) struct Scripts {
    pub claim: Lua,
    pub renew: Lua,
    pub settle: Lua,
    pub release: Lua,
    pub purge: Lua,
    pub inspect: Lua,
    pub quota: Lua,
    pub lookup: Lua,
    pub resolve: Lua,
    pub index: Lua,
}

impl Scripts {
    fn all(&self) -> [&Lua; 10] {
        [
            &self.claim,
            &self.renew,
            &self.settle,
            &self.release,
            &self.purge,
            &self.inspect,
            &self.quota,
            &self.lookup,
            &self.resolve,
            &self.index,
        ]
    }

    pub fn new() -> Self {
        // Scripts that read or write a record start with `record.lua`, the layout's one
        // description on the Lua side (offsets, header, tombstone).
        macro_rules! on_records {
            ($file:literal) => {
                Lua::new(concat!(include_str!("lua/record.lua"), include_str!($file)))
            };
        }
        Self {
            claim: on_records!("lua/claim.lua"),
            renew: on_records!("lua/renew.lua"),
            settle: on_records!("lua/settle.lua"),
            release: on_records!("lua/release.lua"),
            purge: on_records!("lua/purge.lua"),
            inspect: on_records!("lua/inspect.lua"),
            quota: Lua::new(include_str!("lua/quota.lua")),
            lookup: on_records!("lua/lookup.lua"),
            resolve: on_records!("lua/resolve.lua"),
            index: Lua::new(include_str!("lua/index.lua")),
        }
    }
}

/// How long one script load may take at startup before it is tried again.
const SCRIPT_LOAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Loads every script once Redis answers, so that the first calls after a start do not begin
/// with a NOSCRIPT round trip. (After a Redis restart or failover, `query` falls back to EVAL.)
pub(super) async fn load_scripts(links: Links, scripts: Arc<Scripts>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Ok(mut conn) = links.pick() else {
            tokio::time::sleep(backoff).await;
            continue;
        };
        let mut loaded = true;
        for script in scripts.all() {
            let load = tokio::time::timeout(SCRIPT_LOAD_TIMEOUT, script.script.load_async(&mut conn)).await;
            loaded &= matches!(load, Ok(Ok(_)));
        }
        if loaded {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
