//! Small helpers.

use super::*;

pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `a/./b/../c` → `a/c`, without touching the file system.
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The value of the first of `names` in an argv: `--name value` or `--name=value`.
pub(crate) fn flag_value(argv: &[String], names: &[&str]) -> Option<String> {
    let mut args = argv.iter();
    while let Some(arg) = args.next() {
        for name in names {
            if arg == name {
                return args.next().cloned();
            }
            if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                return Some(v.to_owned());
            }
        }
    }
    None
}

/// `host:port` (with `[v6]` hosts) into its parts.
pub(crate) fn split_host_port(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("`{addr}` is not host:port"))?;
    let port = port.parse().map_err(|_| format!("`{addr}`: bad port"))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_owned(), port))
}

pub(crate) fn is_loopback_host(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The parts of `scheme://[user[:password]@]host[:port][/path][?query]`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Url {
    pub(crate) scheme: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
    pub(crate) path: String,
}

pub(crate) fn parse_url(url: &str) -> Result<Url, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("`{url}` has no scheme"))?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo.map(|u| u.split_once(':').unwrap_or((u, ""))) {
        Some((u, p)) => (Some(u.to_owned()).filter(|u| !u.is_empty()), Some(p.to_owned()).filter(|p| !p.is_empty())),
        None => (None, None),
    };
    let (host, port) = if hostport.ends_with(']') || !hostport.contains(':') {
        (hostport.trim_start_matches('[').trim_end_matches(']').to_owned(), None)
    } else {
        let (h, p) = split_host_port(hostport)?;
        (h, Some(p))
    };
    Ok(Url { scheme: scheme.to_owned(), user, password, host, port, path: path.to_owned() })
}

/// The first `http://` URL in a healthcheck test.
pub(crate) fn healthcheck_url(test: &[String]) -> Option<Url> {
    test.iter()
        .flat_map(|arg| arg.split_whitespace())
        .find(|w| w.starts_with("http://"))
        .and_then(|w| parse_url(w).ok())
}
