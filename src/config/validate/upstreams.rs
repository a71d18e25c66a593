//! `[upstreams.NAME]`: each service's instances, how they are looked up, when one is left
//! out, and its deadlines.

use std::time::Duration;

use http::Uri;

use super::{Issues, positive_duration};
use crate::config::defaults;
use crate::config::file;
use crate::config::{Ejection, UpstreamConfig};

pub(super) fn upstream(name: &str, s: &file::UpstreamSection, issues: &mut Issues) -> Option<UpstreamConfig> {
    let key = format!("upstreams.{name}");
    let urls = instance_urls(&key, s, issues);
    let url = urls.as_ref().and_then(|u| u.first().cloned());
    let eject_after = s.eject_after.unwrap_or(defaults::EJECT_AFTER);
    if !(1..=1000).contains(&eject_after) {
        issues.add(format!("{key}.eject_after"), "must be between 1 and 1000 connect failures");
    }
    let after_broken = s.eject_after_broken.unwrap_or(defaults::EJECT_AFTER_BROKEN);
    if after_broken > 1000 {
        issues.add(format!("{key}.eject_after_broken"), "must be between 1 and 1000 broken exchanges, or 0 for never");
    }
    let after_gateway_errors = s.eject_after_gateway_errors.unwrap_or(defaults::EJECT_AFTER_GATEWAY_ERRORS);
    if after_gateway_errors > 1000 {
        issues.add(
            format!("{key}.eject_after_gateway_errors"),
            "must be between 1 and 1000 answers 502, 503 or 504, or 0 for never",
        );
    }
    let eject_for = positive_duration(issues, &format!("{key}.eject_for"), s.eject_for, defaults::EJECT_FOR);
    if eject_for > defaults::EJECT_MAX {
        issues.add(format!("{key}.eject_for"), format!("must be at most {:?}", defaults::EJECT_MAX));
    }
    let timeout = positive_duration(issues, &format!("{key}.timeout"), s.timeout, defaults::UPSTREAM_TIMEOUT);
    let connect_timeout =
        positive_duration(issues, &format!("{key}.connect_timeout"), s.connect_timeout, defaults::CONNECT_TIMEOUT);
    if let Some(path) = &s.ca_file {
        if url.as_ref().is_some_and(|u| u.scheme_str() != Some("https")) {
            issues.add(format!("{key}.ca_file"), "applies to https:// upstreams only");
        } else if let Err(e) = std::fs::metadata(path) {
            issues.add(format!("{key}.ca_file"), format!("cannot read {}: {e}", path.display()));
        }
    }
    let resolve_every = resolve_every(&key, s, url.as_ref(), issues);
    let ejection = Ejection {
        after: eject_after,
        after_broken,
        after_gateway_errors,
        base: eject_for,
        max: defaults::EJECT_MAX.max(eject_for),
    };
    Some(UpstreamConfig {
        name: name.to_owned(),
        urls: urls?,
        resolve_every,
        ejection,
        timeout,
        connect_timeout,
        ca_file: s.ca_file.clone(),
    })
}

/// `url`, or `urls`: one base URL per instance, all with one scheme and one path prefix (a
/// request must mean the same on each), none twice.
fn instance_urls(key: &str, s: &file::UpstreamSection, issues: &mut Issues) -> Option<Vec<Uri>> {
    match (&s.url, &s.urls) {
        (Some(url), None) => issues.check(&format!("{key}.url"), upstream_url(url)).map(|u| vec![u]),
        (None, Some(list)) => {
            let field = format!("{key}.urls");
            if list.is_empty() {
                issues.add(&field, "is empty: list each instance's base URL, like [\"http://10.0.0.5:3000\"]");
                return None;
            }
            if list.len() > defaults::MAX_INSTANCES {
                issues.add(&field, format!("lists {} instances; at most {}", list.len(), defaults::MAX_INSTANCES));
                return None;
            }
            let mut out: Vec<Uri> = Vec::with_capacity(list.len());
            for text in list {
                let Some(url) = issues.check(&field, upstream_url(text)) else { continue };
                if let Some(first) = out.first() {
                    if url.scheme() != first.scheme() {
                        issues.add(&field, format!("{text:?}: every instance uses one scheme ({first} does not)"));
                        continue;
                    }
                    if url.path().trim_end_matches('/') != first.path().trim_end_matches('/') {
                        issues.add(&field, format!("{text:?}: every instance has the same path prefix as {first}"));
                        continue;
                    }
                }
                if let Some(same) = out.iter().find(|u| same_instance(u, &url)) {
                    issues.add(&field, format!("{text:?} is listed twice (as {same})"));
                    continue;
                }
                out.push(url);
            }
            (out.len() == list.len()).then_some(out)
        }
        (Some(_), Some(_)) => {
            issues.add(format!("{key}.urls"), "give url (one instance) or urls (several), not both");
            None
        }
        (None, None) => {
            issues.add(format!("{key}.url"), "is required (or urls, for several instances)");
            None
        }
    }
}

/// `resolve_every`: only beside `url`, whose host must be a name (an address resolves to
/// itself), within [`defaults::RESOLVE_MIN`] and [`defaults::RESOLVE_MAX`].
fn resolve_every(key: &str, s: &file::UpstreamSection, url: Option<&Uri>, issues: &mut Issues) -> Option<Duration> {
    let every = s.resolve_every?.0;
    let field = format!("{key}.resolve_every");
    if s.urls.is_some() {
        issues.add(&field, "looks up the host name of url again; with urls, each instance is listed instead");
        return None;
    }
    if !(defaults::RESOLVE_MIN..=defaults::RESOLVE_MAX).contains(&every) {
        issues.add(&field, format!("must be between {:?} and {:?}", defaults::RESOLVE_MIN, defaults::RESOLVE_MAX));
        return None;
    }
    let host = url?.host()?;
    if host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok() {
        issues.add(&field, format!("needs a host name in url to look up; {host} is an address"));
        return None;
    }
    Some(every)
}

fn upstream_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text.parse().map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{text:?} must start with http:// or https://")),
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(format!("{text:?} has no host"));
    };
    // Hazard: credentials in the URL would be neither sent nor kept secret (they show in
    // logs and metrics labels); the client's own Authorization is what goes upstream.
    if authority.as_str().contains('@') {
        return Err(format!(
            "{text:?} carries credentials (user:password@); leave them out: the client's own Authorization goes upstream"
        ));
    }
    // `port_u16` cannot tell a missing port from one past 65535: read what was written.
    let written = authority.as_str();
    let port = if written.ends_with(']') { None } else { written.rsplit_once(':').map(|(_, port)| port) };
    if port.is_some_and(|port| !matches!(port.parse::<u16>(), Ok(1..))) {
        return Err(format!("{text:?}: the port must be a number from 1 to 65535"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(format!("{text:?} must not have a query or a fragment"));
    }
    Ok(uri)
}

/// Whether two base URLs of one scheme reach the same instance: the same host, in any case,
/// and the same port, written or implied (`http://a` is `http://a:80`).
fn same_instance(a: &Uri, b: &Uri) -> bool {
    let default = if a.scheme() == Some(&http::uri::Scheme::HTTPS) { 443 } else { 80 };
    let port = |u: &Uri| u.port_u16().unwrap_or(default);
    a.host().zip(b.host()).is_some_and(|(x, y)| x.eq_ignore_ascii_case(y)) && port(a) == port(b)
}
