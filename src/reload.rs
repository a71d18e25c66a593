//! Reload: a new `gateway.toml` without a restart (SIGHUP, or `POST /reload` on the admin
//! listener).
//!
//! The file is read and validated in full first; a bad file is logged and the running
//! configuration stays. A good one becomes a new [`Gateway`] (routes, upstreams, policies,
//! problem base, body timeout) that shares the running one's store, metrics and exchanges,
//! and is swapped in atomically, with the listener's TLS certificate read again: requests in flight finish on the gateway they started with,
//! new requests get the new one. The admin tokens and the audit trail's retention are applied
//! too: a token added or revoked counts from the next admin call. What lives outside the gateway — the listeners, the store,
//! connection limits, trusted proxies, threads, logging — cannot change
//! under a running process; such changes are reported as needing a restart, and the running
//! values stay.
//!
//! A file that would rename the records in retention (a route's identity, its host split,
//! its scope) or turn honest retries into 422 (its fingerprint settings) is refused: see
//! [`crate::config::change`]. The comparison is with the configuration that runs, so a chain
//! of reloads cannot walk records away one harmless-looking step at a time.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use thiserror::Error;

use crate::config::change::{self, Comparison, Verdict};
use crate::config::{AdminAccess, Config, ConfigError, Limits, ListenerTls};
use crate::gateway::{Gateway, SetupError};

/// The gateway in service, and how to reload it.
pub struct Live {
    gateway: ArcSwap<Gateway>,
    /// The proxy listener's TLS, if it has any: renewed certificates are read on reload.
    tls: Option<ArcSwap<ListenerTls>>,
    /// The admin listener's, likewise.
    admin_tls: Option<ArcSwap<ListenerTls>>,
    /// Who may call the admin API, as the running configuration says.
    access: ArcSwap<AdminAccess>,
    /// The configuration the process started with: what it runs of `[server]` and `[store]`
    /// until a restart.
    started: Config,
    /// Where to read a reloaded configuration from; none for a gateway built in memory.
    source: Option<PathBuf>,
    /// The configuration that runs, what a reload is compared with; its lock makes one
    /// reload at a time.
    running: Mutex<Config>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings that changed in the file but keep their running value until a restart.
    pub needs_restart: Vec<&'static str>,
}

/// Why a reload did not happen. The running configuration stays in every case.
#[derive(Debug, Error)]
pub enum ReloadError {
    /// This gateway was not started from a file.
    #[error("no configuration file to reload from")]
    NoSource,
    /// The file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The new routes or upstreams could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The file would rename records in retention, or turn their retries into 422.
    #[error("the new file would change what records in retention are named by: {}", .0.lines_of(Verdict::Refused).join("; "))]
    Identity(Comparison),
}

impl Live {
    /// The gateway built from `started`, reloadable from `source`.
    pub fn new(gateway: Gateway, started: Config, source: Option<PathBuf>) -> Self {
        let tls = started.server.tls.as_ref().map(|tls| ArcSwap::from_pointee(tls.clone()));
        let running = Mutex::new(started.clone());
        let admin_tls = started.server.admin_tls.as_ref().map(|tls| ArcSwap::from_pointee(tls.clone()));
        let access = ArcSwap::from_pointee(started.server.access.clone());
        Self { gateway: ArcSwap::from_pointee(gateway), tls, admin_tls, access, started, source, running }
    }

    /// The admin listener's TLS of the moment, if it uses TLS.
    pub fn admin_tls(&self) -> Option<Arc<ListenerTls>> {
        self.admin_tls.as_ref().map(ArcSwap::load_full)
    }

    /// Who may call the admin API now, and what the audit trail keeps.
    pub fn access(&self) -> Arc<AdminAccess> {
        self.access.load_full()
    }

    /// The proxy listener's TLS of the moment (its certificates), if the listener uses TLS.
    pub fn tls(&self) -> Option<Arc<ListenerTls>> {
        self.tls.as_ref().map(ArcSwap::load_full)
    }

    /// The gateway new requests are served by.
    pub fn gateway(&self) -> Arc<Gateway> {
        self.gateway.load_full()
    }

    /// Reads the file again and, if it is valid, swaps in a gateway built from it.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let source = self.source.as_ref().ok_or(ReloadError::NoSource)?;
        // Loading reads the listener's certificate and key again: a bad pair refuses the
        // whole reload here, before anything changes.
        let config = Config::load(source)?;
        let comparison = change::compare(&running, &config);
        if !comparison.is_safe() {
            return Err(ReloadError::Identity(comparison));
        }
        let next = self.gateway.load().rebuild(&config)?;
        self.gateway.store(Arc::new(next));
        if let (Some(current), Some(tls)) = (&self.tls, &config.server.tls) {
            current.store(Arc::new(tls.clone()));
        }
        if let (Some(current), Some(tls)) = (&self.admin_tls, &config.server.admin_tls) {
            current.store(Arc::new(tls.clone()));
        }
        self.access.store(Arc::new(config.server.access.clone()));
        let needs_restart = needs_restart(&self.started, &config);
        for warning in config.warning_lines(&source.display().to_string()) {
            tracing::warn!("{warning}");
        }
        // A plain string reads the same in both log formats (`?` of a Vec logs `"[]"`).
        let restart = if needs_restart.is_empty() { "none".to_owned() } else { needs_restart.join(", ") };
        for line in comparison.lines_of(Verdict::Said) {
            tracing::warn!("{line}");
        }
        tracing::info!(routes = config.routes.len(), needs_restart = %restart, "configuration reloaded");
        *running = config;
        Ok(Reloaded { needs_restart })
    }
}

/// The settings that differ between what runs and `next`, among those a reload cannot apply.
fn needs_restart(running: &Config, next: &Config) -> Vec<&'static str> {
    let (a, b) = (&running.server, &next.server);
    // body_read_timeout is the gateway's own, applied live; the other limits are the server's.
    let server_limits = |c: &Config| Limits { body_read_timeout: Duration::ZERO, ..c.server.limits.clone() };
    [
        ("server.listen", a.listen != b.listen),
        ("server.admin_listen", a.admin_listen != b.admin_listen),
        ("server.worker_threads", a.worker_threads != b.worker_threads),
        ("server.shutdown_grace", a.shutdown_grace != b.shutdown_grace),
        ("server.log_format", a.log_format != b.log_format),
        ("server.tls (on or off)", a.tls.is_some() != b.tls.is_some()),
        ("server.admin_tls (on or off)", a.admin_tls.is_some() != b.admin_tls.is_some()),
        ("server.trusted_proxies", a.trusted_proxies != b.trusted_proxies),
        ("server limits (timeouts, connections, exchanges)", server_limits(running) != server_limits(next)),
        ("store", running.store != next.store),
        // The exporter is started once, with the runtime every reloaded gateway keeps.
        ("telemetry", running.telemetry != next.telemetry),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(store_password: &str, body_read_timeout: &str, idle_timeout: &str) -> Config {
        let text = format!(
            r#"
[server]
listen = "127.0.0.1:0"
body_read_timeout = "{body_read_timeout}"
idle_timeout = "{idle_timeout}"

[store]
backend = "redis"
url = "redis://127.0.0.1:6390"
password_env = "PASSWORD"

[upstreams.app]
url = "http://127.0.0.1:3000"

[[routes]]
name = "rest"
path = "/{{*rest}}"
upstream = "app"
"#
        );
        let password = store_password.to_owned();
        match Config::from_toml_with_env(&text, "<test>", &|_| Some(password.clone())) {
            Ok(config) => config,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_changed_secret_or_server_limit_needs_a_restart_and_the_body_timeout_does_not() {
        let running = config("one", "30s", "60s");
        assert!(needs_restart(&running, &config("one", "30s", "60s")).is_empty());
        assert!(needs_restart(&running, &config("one", "5s", "60s")).is_empty(), "applied live");
        assert_eq!(needs_restart(&running, &config("two", "30s", "60s")), ["store"]);
        assert_eq!(
            needs_restart(&running, &config("one", "30s", "5s")),
            ["server limits (timeouts, connections, exchanges)"]
        );
    }
}
