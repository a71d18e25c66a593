//! Where the store's Redis is: `store.url` read into one of three topologies.
//!
//! - `redis://` / `rediss://`: one primary, at a fixed address (the redis crate's own syntax,
//!   including `/DB`).
//! - `redis+sentinel://h1:p1,h2:p2/MASTER` (`rediss+sentinel://` for TLS): the primary named
//!   MASTER, as the Sentinels say; followed through failovers.
//! - `redis+cluster://h1:p1,h2:p2,...` (`rediss+cluster://`): a Redis Cluster, reached through
//!   any of these seed nodes.
//!
//! `user:password@` before the addresses is for the Redis data nodes (the primary, or every
//! cluster node); Sentinels are asked without credentials, over TLS when the scheme says so.
//! Credentials are percent-decoded and never appear in an error.

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo};

/// Default port of a Sentinel, when an address has none.
const SENTINEL_PORT: u16 = 26379;
/// Default port of a Redis node, when an address has none.
const REDIS_PORT: u16 = 6379;

/// The Redis topology named by `store.url`.
#[derive(Clone)]
pub enum Target {
    /// One primary at a fixed address.
    Single(ConnectionInfo),
    /// The primary named `master`, found through `sentinels`.
    Sentinel { sentinels: Vec<Address>, master: String, tls: bool, auth: Auth },
    /// A Redis Cluster, reached through any of `seeds`.
    Cluster { seeds: Vec<Address>, tls: bool, auth: Auth },
}

/// `host:port` of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// ACL user and password for the data nodes.
#[derive(Clone, Default)]
pub struct Auth {
    pub username: Option<String>,
    pub password: Option<String>,
}

impl fmt::Debug for Target {
    // Hand-written so that no password can reach a log through `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Single(info) => write!(f, "Single({:?})", info.addr()),
            Target::Sentinel { sentinels, master, tls, .. } => {
                write!(f, "Sentinel({master} via {} sentinels, tls={tls})", sentinels.len())
            }
            Target::Cluster { seeds, tls, .. } => write!(f, "Cluster({} seeds, tls={tls})", seeds.len()),
        }
    }
}

impl Target {
    /// Where the store is, for logs: the addresses the URL names, never its credentials.
    pub fn describe(&self) -> String {
        let list = |addresses: &[Address]| addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        match self {
            Target::Single(info) => format!("redis {}", info.addr()),
            Target::Sentinel { sentinels, master, .. } => format!("sentinel master {master} via {}", list(sentinels)),
            Target::Cluster { seeds, .. } => format!("cluster via {}", list(seeds)),
        }
    }

    /// Reads `url`; the error says what is wrong without repeating the URL (it may hold a
    /// password).
    pub fn parse(url: &str) -> Result<Target, String> {
        let (scheme, rest) = url.split_once("://").ok_or("a Redis URL starts with redis:// or rediss://")?;
        let (tls, kind) = match scheme.to_ascii_lowercase().as_str() {
            "redis" | "rediss" | "unix" | "redis+unix" => {
                let info =
                    url.into_connection_info().map_err(|e| format!("not a usable Redis URL ({:?})", e.kind()))?;
                return Ok(Target::Single(info));
            }
            "redis+sentinel" => (false, Kind::Sentinel),
            "rediss+sentinel" => (true, Kind::Sentinel),
            "redis+cluster" => (false, Kind::Cluster),
            "rediss+cluster" => (true, Kind::Cluster),
            other => {
                return Err(format!(
                    "not a usable Redis URL: unknown scheme {other:?}; use redis://, rediss://, redis+sentinel://, \
                     rediss+sentinel://, redis+cluster:// or rediss+cluster://"
                ));
            }
        };
        // The password may hold '@' or '/', percent-encoded or not: the addresses start after
        // the last '@', and the path after the first '/' that follows them.
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        if path.contains('?') || hosts.contains('?') {
            return Err("query parameters are not supported in a Sentinel or Cluster URL".into());
        }
        let default_port = match kind {
            Kind::Sentinel => SENTINEL_PORT,
            Kind::Cluster => REDIS_PORT,
        };
        let addresses = hosts.split(',').map(|a| address(a, default_port)).collect::<Result<Vec<_>, _>>()?;
        let auth = userinfo.map(credentials).transpose()?.unwrap_or_default();
        match kind {
            Kind::Sentinel => {
                let master = decode(path, "master name")?;
                if master.is_empty() {
                    return Err("a Sentinel URL names its master: redis+sentinel://HOST:PORT,.../MASTER_NAME".into());
                }
                Ok(Target::Sentinel { sentinels: addresses, master, tls, auth })
            }
            Kind::Cluster => {
                if !path.is_empty() {
                    return Err("a Cluster URL has no path: a Redis Cluster has only database 0".into());
                }
                Ok(Target::Cluster { seeds: addresses, tls, auth })
            }
        }
    }

    /// Whether connections use TLS (and the `[store]` TLS files apply).
    pub fn tls(&self) -> bool {
        match self {
            Target::Single(info) => matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }),
            Target::Sentinel { tls, .. } | Target::Cluster { tls, .. } => *tls,
        }
    }
}

enum Kind {
    Sentinel,
    Cluster,
}

fn address(text: &str, default_port: u16) -> Result<Address, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an empty address in the list (HOST:PORT,HOST:PORT)".into());
    }
    // `[v6]:port`, `[v6]`, `host:port` or `host`.
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| format!("{text:?}: unclosed '['"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("{text:?} is not HOST:PORT")),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    if host.contains(':') && !text.starts_with('[') {
        return Err(format!("{text:?}: an IPv6 address goes in brackets, [ADDRESS]:PORT"));
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("{text:?}: bad port {p:?}"))?,
        None => default_port,
    };
    Ok(Address { host: host.to_owned(), port })
}

fn credentials(userinfo: &str) -> Result<Auth, String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let user = decode(user, "user name")?;
    Ok(Auth {
        username: Some(user).filter(|u| !u.is_empty()),
        password: password.map(|p| decode(p, "password")).transpose()?.filter(|p| !p.is_empty()),
    })
}

fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: &str, port: u16) -> Address {
        Address { host: host.into(), port }
    }

    #[test]
    fn sentinel_urls_name_sentinels_and_master() {
        let Ok(Target::Sentinel { sentinels, master, tls, auth }) =
            Target::parse("rediss+sentinel://app:p%40ss@s1:5000,s2,[::1]:5001/orders")
        else {
            panic!("not a sentinel target")
        };
        assert_eq!(sentinels, vec![addr("s1", 5000), addr("s2", SENTINEL_PORT), addr("::1", 5001)]);
        assert_eq!(master, "orders");
        assert!(tls);
        assert_eq!(auth.username.as_deref(), Some("app"));
        assert_eq!(auth.password.as_deref(), Some("p@ss"));
    }

    #[test]
    fn cluster_urls_name_seeds() {
        let Ok(Target::Cluster { seeds, tls, auth }) = Target::parse("redis+cluster://:secret@a:7000,b") else {
            panic!("not a cluster target")
        };
        assert_eq!(seeds, vec![addr("a", 7000), addr("b", REDIS_PORT)]);
        assert!(!tls);
        assert_eq!(auth.username, None);
        assert_eq!(auth.password.as_deref(), Some("secret"));
    }

    #[test]
    fn single_urls_are_the_crates_own() {
        assert!(matches!(Target::parse("redis://127.0.0.1:6379/2"), Ok(Target::Single(_))));
        assert!(Target::parse("rediss://h:6380").is_ok_and(|t| t.tls()));
    }

    #[test]
    fn bad_urls_say_why_without_the_password() {
        for (url, says) in [
            ("redis+sentinel://s1:1,s2:2", "names its master"),
            ("redis+sentinel://s1:1,,s2/m", "empty address"),
            ("redis+cluster://a:1/0", "no path"),
            ("redis+cluster://a:99999", "bad port"),
            ("redis+cluster://u:hunter2@a:x", "bad port"),
            ("redis+cluster://::1", "in brackets"),
            ("memcached://a", "not a usable Redis URL: unknown scheme"),
            ("127.0.0.1:6379", "starts with"),
        ] {
            let err = Target::parse(url).err().unwrap_or_else(|| panic!("{url} was accepted"));
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{url}: {err}");
        }
    }

    #[test]
    fn debug_never_shows_the_password() {
        for url in ["redis+sentinel://u:hunter2@s/m", "redis+cluster://u:hunter2@a", "redis://u:hunter2@h"] {
            let shown = format!("{:?}", Target::parse(url).unwrap());
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
