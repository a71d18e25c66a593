//! `[server]`: listeners, the admin token, limits, forwarding, logging, TLS.

use std::net::SocketAddr;

use http::Uri;

use super::{Issues, positive_duration, positive_size};
use crate::config::defaults;
use crate::config::file;
use crate::config::file::{AdminTokenSection, HostCertSection};
use crate::config::{
    AdminAccess, AdminRole, AdminToken, AuditRetention, HostCert, HostPattern, Limits, ListenerTls, LogFormat,
    ServerConfig,
};
use crate::forwarded::TrustedProxies;

pub(super) fn server(
    s: &file::ServerSection,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<ServerConfig> {
    let listen = issues.check("server.listen", socket_addr(&s.listen));
    let admin_listen = s.admin_listen.as_ref().and_then(|a| issues.check("server.admin_listen", socket_addr(a)));
    if let (Some(l), Some(a)) = (listen, admin_listen)
        && l == a
        && l.port() != 0
    {
        issues.add("server.admin_listen", "must differ from server.listen");
    }
    let admin_token = match (&s.admin_token, &s.admin_token_env) {
        (Some(_), Some(_)) => {
            issues.add("server.admin_token_env", "give admin_token or admin_token_env, not both");
            None
        }
        (Some(token), None) => Some((token.clone(), "server.admin_token")),
        (None, Some(var)) => match env(var) {
            Some(token) => Some((token, "server.admin_token_env")),
            None => {
                issues.add("server.admin_token_env", format!("the environment variable {var:?} is not set"));
                None
            }
        },
        (None, None) => None,
    };
    if let Some((token, key)) = &admin_token {
        token_rules(token, key, issues);
    }
    let admin_token = admin_token.map(|(token, _)| token);
    let admin_tokens = admin_tokens(admin_token.as_deref(), s.admin_tokens.as_deref().unwrap_or_default(), env, issues);
    let audit = audit(s, issues);
    let problem_base = s.problem_base.clone().unwrap_or_else(|| defaults::PROBLEM_BASE.to_owned());
    if problem_base.parse::<Uri>().map_or(true, |u| u.scheme().is_none()) {
        issues.add("server.problem_base", format!("{problem_base:?} is not an absolute URI"));
    }
    if s.worker_threads.is_some_and(|n| !(1..=1024).contains(&n)) {
        issues.add("server.worker_threads", "must be between 1 and 1024");
    }
    let limits = limits(s, issues);
    let trusted_proxies =
        issues.check("server.trusted_proxies", TrustedProxies::parse(s.trusted_proxies.as_deref().unwrap_or_default()));
    let log_format =
        issues.check("server.log_format", LogFormat::parse(s.log_format.as_deref().unwrap_or(defaults::LOG_FORMAT)));
    let tls = s.tls.as_ref().and_then(|t| {
        let by_host = host_certs(t.certs.as_deref().unwrap_or_default(), issues)?;
        issues.check(
            "server.tls",
            ListenerTls::load_all(t.cert.clone(), t.key.clone(), by_host).map_err(|e| e.to_string()),
        )
    });
    let admin_tls = s.admin_tls.as_ref().and_then(|t| {
        issues.check(
            "server.admin_tls",
            ListenerTls::load_all(t.cert.clone(), t.key.clone(), Vec::new()).map_err(|e| e.to_string()),
        )
    });
    if s.admin_tls.is_some() && s.admin_listen.is_none() {
        issues.add("server.admin_tls", "there is no admin listener to serve it on: set server.admin_listen");
    }
    Some(ServerConfig {
        tls,
        admin_tls,
        log_format: log_format?,
        worker_threads: s.worker_threads,
        listen: listen?,
        admin_listen,
        admin_token,
        access: AdminAccess { tokens: admin_tokens, audit },
        shutdown_grace: s.shutdown_grace.map_or(defaults::SHUTDOWN_GRACE, |d| d.0),
        problem_base,
        limits: limits?,
        trusted_proxies: trusted_proxies?,
    })
}

/// What a client can send in `Authorization: Bearer ...`: visible ASCII, no spaces; and long
/// enough to guess at no rate. The character itself is never printed: it is part of a secret.
fn token_rules(token: &str, key: &str, issues: &mut Issues) {
    let token = token.trim();
    match token.chars().position(|c| !c.is_ascii_graphic()) {
        Some(at) => issues.add(
            key,
            format!(
                "character {} of the token is not visible ASCII: a token is letters, digits and visible \
                 symbols (no spaces or other characters), which is all a client can send in a bearer header",
                at + 1
            ),
        ),
        None if token.len() < 16 => {
            issues.add(key, "the token must be at least 16 characters (it guards key purges)");
        }
        None => {}
    }
}

/// Every admin token: `admin_token` as the operate token `"admin"`, then each of
/// `[[server.admin_tokens]]`, its secret read from the environment or its file. Names are
/// unique (the audit trail names who acted by them), and so are secrets (a secret two holders
/// share names neither).
fn admin_tokens(
    admin_token: Option<&str>,
    named: &[AdminTokenSection],
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Vec<AdminToken> {
    let mut tokens: Vec<AdminToken> = admin_token
        .map(|secret| AdminToken {
            name: defaults::ADMIN_TOKEN_NAME.to_owned(),
            role: AdminRole::Operate,
            secret: secret.trim().to_owned(),
        })
        .into_iter()
        .collect();
    for (i, t) in named.iter().enumerate() {
        let key = format!("server.admin_tokens[{i}]");
        let name_ok = if t.name.len() > 64 || !super::valid_route_name(&t.name) {
            issues.add(
                format!("{key}.name"),
                format!(
                    "{:?} must be 1 to 64 characters of A-Z a-z 0-9 - _ .",
                    t.name.chars().take(80).collect::<String>()
                ),
            );
            false
        } else if let Some(earlier) = tokens.iter().find(|e| e.name == t.name) {
            let by = if earlier.name == defaults::ADMIN_TOKEN_NAME && admin_token.is_some() {
                "server.admin_token, which the audit trail names \"admin\""
            } else {
                "an earlier token"
            };
            issues.add(
                format!("{key}.name"),
                format!("{:?} is taken by {by}: each holder needs a name of their own", t.name),
            );
            false
        } else {
            true
        };
        let role = issues.check(&format!("{key}.role"), AdminRole::parse(&t.role));
        let secret = match (&t.token_env, &t.token_file) {
            (Some(_), Some(_)) => {
                issues.add(format!("{key}.token_file"), "give token_env or token_file, not both");
                None
            }
            (None, None) => {
                issues.add(
                    &key,
                    "give token_env (an environment variable holding the token) or token_file (a file holding it): \
                     a token is never written in the configuration itself",
                );
                None
            }
            (Some(var), None) => match env(var) {
                Some(secret) => Some((secret, format!("{key}.token_env"))),
                None => {
                    issues.add(format!("{key}.token_env"), format!("the environment variable {var:?} is not set"));
                    None
                }
            },
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(secret) => Some((secret, format!("{key}.token_file"))),
                // The path, never the content: it may be a secret read from the wrong file.
                Err(e) => {
                    issues.add(format!("{key}.token_file"), format!("cannot read {}: {e}", path.display()));
                    None
                }
            },
        };
        let Some((secret, secret_key)) = secret else { continue };
        let secret = secret.trim().to_owned();
        token_rules(&secret, &secret_key, issues);
        if let Some(twin) = tokens.iter().find(|e| e.secret == secret) {
            issues.add(
                secret_key,
                format!(
                    "is the same token as {:?}'s: each holder needs a token of their own (the audit trail names \
                     who acted by the token they presented)",
                    twin.name
                ),
            );
            continue;
        }
        if let (true, Some(role)) = (name_ok, role) {
            tokens.push(AdminToken { name: t.name.clone(), role, secret });
        }
    }
    tokens
}

/// `server.audit_max_entries` and `server.audit_max_age`.
fn audit(s: &file::ServerSection, issues: &mut Issues) -> AuditRetention {
    let max_entries = s.audit_max_entries.unwrap_or(defaults::AUDIT_MAX_ENTRIES);
    if !(1..=1_000_000).contains(&max_entries) {
        issues.add("server.audit_max_entries", "must be between 1 and 1000000");
    }
    let max_age = positive_duration(issues, "server.audit_max_age", s.audit_max_age, defaults::AUDIT_MAX_AGE);
    AuditRetention { max_entries, max_age }
}

fn limits(s: &file::ServerSection, issues: &mut Issues) -> Option<Limits> {
    let count = |issues: &mut Issues, key: &str, value: Option<usize>, default: usize, max: usize| {
        let n = value.unwrap_or(default);
        if !(1..=max).contains(&n) {
            issues.add(format!("server.{key}"), format!("must be between 1 and {max}"));
        }
        n
    };
    let header_read_timeout =
        positive_duration(issues, "server.header_read_timeout", s.header_read_timeout, defaults::HEADER_READ_TIMEOUT);
    let max_header_bytes =
        positive_size(issues, "server.max_header_bytes", s.max_header_bytes, defaults::MAX_HEADER_BYTES);
    // hyper reads a head into a buffer of at least 8 KiB; a smaller limit cannot be kept.
    if !(8 << 10..=1 << 20).contains(&max_header_bytes) {
        issues.add("server.max_header_bytes", "must be between 8KiB and 1MiB");
    }
    Some(Limits {
        header_read_timeout,
        body_read_timeout: positive_duration(
            issues,
            "server.body_read_timeout",
            s.body_read_timeout,
            defaults::BODY_READ_TIMEOUT,
        ),
        idle_timeout: positive_duration(issues, "server.idle_timeout", s.idle_timeout, defaults::IDLE_TIMEOUT),
        max_connections: count(issues, "max_connections", s.max_connections, defaults::MAX_CONNECTIONS, 1 << 20),
        admin_max_connections: count(
            issues,
            "admin_max_connections",
            s.admin_max_connections,
            defaults::ADMIN_MAX_CONNECTIONS,
            1 << 16,
        ),
        max_header_bytes: usize::try_from(max_header_bytes).ok()?,
        max_exchanges: count(issues, "max_exchanges", s.max_exchanges, defaults::MAX_EXCHANGES, 1 << 20),
        max_exchanges_per_connection: count(
            issues,
            "max_exchanges_per_connection",
            s.max_exchanges_per_connection,
            defaults::MAX_EXCHANGES_PER_CONNECTION,
            1 << 16,
        ),
        max_reset_streams: count(
            issues,
            "max_reset_streams",
            s.max_reset_streams,
            defaults::MAX_RESET_STREAMS,
            1 << 20,
        ),
        h2_keepalive_interval: Some(s.h2_keepalive_interval.map_or(defaults::H2_KEEPALIVE_INTERVAL, |d| d.0))
            .filter(|d| !d.is_zero()),
    })
}

fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an IP address with a port, like \"0.0.0.0:8080\""))
}

/// `[[server.tls.certs]]`: each entry's hosts, no host selecting two certificates. `None`
/// when one is wrong (each said in `issues`).
fn host_certs(entries: &[HostCertSection], issues: &mut Issues) -> Option<Vec<HostCert>> {
    let mut out = Vec::with_capacity(entries.len());
    let mut seen: Vec<HostPattern> = Vec::new();
    let mut ok = true;
    for (i, entry) in entries.iter().enumerate() {
        let key = format!("server.tls.certs[{i}].hosts");
        if entry.hosts.is_empty() {
            issues.add(&key, "is empty: name the hosts whose name selects this certificate");
            ok = false;
        }
        let mut hosts = Vec::with_capacity(entry.hosts.len());
        for text in &entry.hosts {
            match HostPattern::parse(text) {
                Ok(host) if seen.contains(&host) => {
                    issues.add(&key, format!("{text:?} selects an earlier certificate already (as {host})"));
                    ok = false;
                }
                Ok(host) => {
                    seen.push(host.clone());
                    hosts.push(host);
                }
                Err(e) => {
                    issues.add(&key, e);
                    ok = false;
                }
            }
        }
        out.push(HostCert { hosts, cert: entry.cert.clone(), key: entry.key.clone() });
    }
    ok.then_some(out)
}
