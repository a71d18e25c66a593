//! File descriptors: the budget the listeners keep within.
//!
//! Every connection holds a descriptor, and so do the store's connections, the upstreams',
//! the telemetry exporter's and the log files. A process that runs out can neither accept,
//! nor reconnect to Redis, nor reach its upstream: a flood of connections on one listener
//! stops the other from serving, and on a `fail-open` route a claim that cannot reach Redis
//! forwards without one (a possible second execution). So the listeners stop accepting
//! before the process runs out: the proxy at `max_connections`, the admin listener at
//! `admin_max_connections`, both fitted at start into the process's `RLIMIT_NOFILE` with a
//! reserve for everything else. A process whose limit is too low for the caps serves with
//! smaller ones and says so (as Redis lowers `maxclients`): a warning for caps the file sets,
//! which `idemgate check` gives beforehand on their line; a line of the log for the defaults,
//! which are what fits up to 10,000 and 64, so that a file that leaves them alone does not warn
//! on a machine whose limit is lower than they need (20,130 descriptors with one store
//! connection).

use crate::config::{Config, StoreBackendConfig};

/// Descriptors kept for what is not a client connection, besides two per store connection
/// (one in use, one reconnecting): the store's subscriber, Sentinel and Cluster nodes, the
/// telemetry exporter, the log files, the listeners, the runtime's own.
const RESERVE: u64 = 64;

/// The caps the listeners serve with, fitted into a descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The process's limit (`RLIMIT_NOFILE`) the caps were fitted into.
    pub limit: u64,
    /// What the configured caps need: two per proxy connection (each may hold an upstream
    /// connection while its request runs), one per admin connection, and the reserve.
    pub needed: u64,
    /// Proxy connections served at once.
    pub proxy: usize,
    /// Admin connections served at once.
    pub admin: usize,
}

impl Budget {
    /// Fits `config`'s caps into `limit` descriptors.
    pub fn fit(config: &Config, limit: u64) -> Self {
        let limits = &config.server.limits;
        let store = match &config.store.backend {
            StoreBackendConfig::Redis { connections, .. } => *connections as u64,
            StoreBackendConfig::Memory { .. } => 0,
        };
        let reserve = RESERVE + 2 * store;
        let admin = if config.server.admin_listen.is_some() { limits.admin_max_connections as u64 } else { 0 };
        let proxy = limits.max_connections as u64;
        let needed = 2 * proxy + admin + reserve;
        if needed <= limit {
            return Self { limit, needed, proxy: limits.max_connections, admin: limits.admin_max_connections };
        }
        // Too few: the admin listener keeps at most a quarter of what is left after the
        // reserve (it is for operators), the proxy the rest; never less than one each.
        let spare = limit.saturating_sub(reserve);
        let admin = admin.min(spare / 4).max(1);
        let proxy = (spare.saturating_sub(admin) / 2).clamp(1, proxy);
        Self { limit, needed, proxy: usize::try_from(proxy).unwrap_or(1), admin: usize::try_from(admin).unwrap_or(1) }
    }

    /// Whether the configured caps fit as they are.
    pub fn fits(&self) -> bool {
        self.needed <= self.limit
    }

    /// The key of the cap the file sets (`server.max_connections` first), if it sets one: a
    /// cap asked for and not served is a warning; the defaults are fitted without one.
    pub fn asked(config: &Config) -> Option<&'static str> {
        let admin = config.server.admin_listen.is_some();
        ["server.max_connections", "server.admin_max_connections"]
            .into_iter()
            .find(|key| config.sets(key) && (admin || *key == "server.max_connections"))
    }

    /// What does not fit, in words, for the log and `check`.
    pub fn shortfall(&self, config: &Config) -> String {
        let limits = &config.server.limits;
        let admin = config.server.admin_listen.map(|_| limits.admin_max_connections);
        let reserve = self.needed - 2 * limits.max_connections as u64 - admin.unwrap_or(0) as u64;
        let (asked, served) = match admin {
            Some(asked) => (
                format!(" and admin_max_connections = {asked}"),
                format!("{} connections and {} on the admin listener", self.proxy, self.admin),
            ),
            None => (String::new(), format!("{} connections", self.proxy)),
        };
        let (what, advice) = match Self::asked(config) {
            Some(_) => (
                "",
                "Raise the limit (ulimit -n, LimitNOFILE= in systemd, --ulimit nofile= in docker) or lower max_connections",
            ),
            None => ("the defaults ", "Raise the limit for more, or set max_connections to choose what to serve"),
        };
        format!(
            "{what}max_connections = {}{asked} need about {} file descriptors (two per connection, one for its \
             upstream, and {reserve} for the store and the rest), and this process may open {} (RLIMIT_NOFILE): \
             the gateway serves at most {served}. {advice}",
            limits.max_connections, self.needed, self.limit
        )
    }
}

/// `check`'s warning when the caps the file sets do not fit in `limit` (the hard limit of the
/// process that runs `check`, the one the gateway raises its soft limit to), on the line of
/// the cap; `None` when they fit, or when the file leaves both to their defaults.
pub fn check_warning(config: &Config, origin: &str, limit: u64) -> Option<String> {
    let budget = Budget::fit(config, limit);
    let key = Budget::asked(config).filter(|_| !budget.fits())?;
    let reason = format!(
        "{} (checked against this process's hard limit; the service may run with another)",
        budget.shortfall(config)
    );
    Some(config.warning_line(origin, key, &reason))
}

/// The process's descriptor limits now: (soft, hard). `None` where they cannot be read.
pub fn limits() -> Option<(u64, u64)> {
    rlimit::getrlimit(rlimit::Resource::NOFILE).ok()
}

/// Raises the soft limit to the hard one (what a server is allowed to use; many systems start
/// processes at 1024 soft whatever the hard limit is). Returns the soft limit in force.
pub fn raise() -> Option<u64> {
    let (_, hard) = limits()?;
    rlimit::increase_nofile_limit(hard).ok().or_else(|| limits().map(|(soft, _)| soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lines: &str) -> Config {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{lines}\n\n[store]\nbackend = \"memory\"\n\n\
             [upstreams.app]\nurl = \"http://127.0.0.1:9\"\n\n[[routes]]\nname = \"all\"\npath = \"/{{*rest}}\"\nupstream = \"app\"\n"
        );
        Config::from_toml(&toml, "t").unwrap()
    }

    #[test]
    fn caps_that_fit_are_kept() {
        let budget = Budget::fit(&config(""), 1 << 20);
        assert!(budget.fits());
        assert_eq!((budget.proxy, budget.admin), (10_000, 64));
        assert_eq!(budget.needed, 2 * 10_000 + 64 + RESERVE);
    }

    #[test]
    fn only_caps_the_file_sets_are_warned_about() {
        // The defaults (20,130 descriptors with the admin listener and one store connection)
        // under a limit of 20,000: fitted, not warned about.
        let defaults = config("");
        assert!(!Budget::fit(&defaults, 20_000).fits());
        assert_eq!(check_warning(&defaults, "gw.toml", 20_000), None);
        assert!(Budget::fit(&defaults, 20_000).shortfall(&defaults).starts_with("the defaults max_connections"));
        // Set in the file: warned about, on its line (the fourth of the file).
        let set = config("max_connections = 10000");
        let warning = check_warning(&set, "gw.toml", 20_000).expect("a warning");
        assert!(
            warning.starts_with("gw.toml:4: warning: server.max_connections: max_connections = 10000"),
            "{warning}"
        );
        assert_eq!(check_warning(&set, "gw.toml", 1 << 20), None, "it fits");
        let admin = config("admin_max_connections = 64");
        let warning = check_warning(&admin, "gw.toml", 20_000).expect("a warning");
        assert!(warning.starts_with("gw.toml:4: warning: server.admin_max_connections: "), "{warning}");
    }

    #[test]
    fn caps_that_do_not_fit_leave_the_reserve_and_the_admin_listener_its_share() {
        let budget = Budget::fit(&config(""), 512);
        assert!(!budget.fits());
        assert_eq!(budget.admin, 64);
        assert_eq!(budget.proxy, (512 - 64 - 64) / 2);
        assert!(2 * budget.proxy as u64 + budget.admin as u64 + RESERVE <= 512);
        let tiny = Budget::fit(&config(""), 80);
        assert_eq!((tiny.proxy, tiny.admin), (6, 4));
        let none = Budget::fit(&config(""), 10);
        assert_eq!((none.proxy, none.admin), (1, 1), "never less than one");
        let text = budget.shortfall(&config(""));
        assert!(
            text.contains("need about 20128 file descriptors") && text.contains("at most 192 connections"),
            "{text}"
        );
    }
}
