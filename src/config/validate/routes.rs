//! `[[routes]]`, with each route's `[routes.idempotency]` policy.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};

use super::{Issues, body_limit, header_name, positive_duration};
use crate::config::defaults;
use crate::config::file::{File, IdempotencySection, OneOrMany, ReconcileSection, StatusEntry};
use crate::config::{HostPattern, RouteConfig};
use crate::headers::{self, StoredHeaders};
use crate::policy::errors::ErrorShape;
use crate::policy::fingerprint::{FingerprintSpec, JsonPointer};
use crate::policy::reconcile::{LookupPath, Reconcile};
use crate::policy::scope::{MissingScope, ScopeSource};
use crate::policy::{IdempotencyPolicy, Mode, Quota, StatusSet, StoreFailurePolicy, UnknownOutcomePolicy};
use crate::router::{RouteSpec, Router, RouterError};

/// Longest key anyone could reasonably need; bounds the work done per key.
const MAX_KEY_LEN_LIMIT: usize = 8192;

pub(super) fn routes(file: &File, errors: &ErrorShape, issues: &mut Issues) -> Vec<RouteConfig> {
    if file.routes.is_empty() {
        issues.add("routes", "no [[routes]] are defined; the gateway would answer 404 to everything");
    }
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(file.routes.len());
    for (i, r) in file.routes.iter().enumerate() {
        let key = format!("routes[{i}]");
        if !super::valid_route_name(&r.name) {
            issues.add(format!("{key}.name"), format!("{:?} must be non-empty and use only A-Z a-z 0-9 - _ .", r.name));
        } else if !names.insert(r.name.as_str()) {
            issues.add(format!("{key}.name"), format!("{:?} is used by an earlier route", r.name));
        }
        if !file.upstreams.contains_key(&r.upstream) {
            issues.add(format!("{key}.upstream"), format!("{:?} is not defined under [upstreams]", r.upstream));
        }
        let hosts = r.hosts.as_ref().map_or_else(Vec::new, |hs| hosts(&format!("{key}.hosts"), hs, issues));
        let methods = r.methods.as_ref().map(|ms| methods(&format!("{key}.methods"), ms, issues));
        let idempotency =
            r.idempotency.as_ref().and_then(|s| policy(&format!("{key}.idempotency"), &r.name, &hosts, s, issues));
        let errors = super::errors::shape(&format!("{key}.errors"), r.errors.as_ref(), errors, issues)
            .map_or_else(|| Arc::new(errors.clone()), Arc::new);
        out.push(RouteConfig {
            name: r.name.clone(),
            hosts,
            methods,
            path: r.path.clone(),
            upstream: r.upstream.clone(),
            idempotency: idempotency.map(Arc::new),
            errors,
        });
    }
    let specs = out.iter().map(|r| RouteSpec {
        name: &r.name,
        hosts: &r.hosts,
        pattern: &r.path,
        methods: r.methods.as_deref(),
        value: (),
    });
    super::identity::distinct(&out, issues);
    if let Err(e) = Router::new(specs) {
        let index = match &e {
            RouterError::Pattern { index, .. } | RouterError::Overlap { index, .. } => *index,
        };
        issues.add(format!("routes[{index}].path"), e.to_string());
    }
    out
}

fn hosts(key: &str, entries: &[String], issues: &mut Issues) -> Vec<HostPattern> {
    if entries.is_empty() {
        issues.add(key, "is empty; leave it out to serve every host");
    }
    let mut out: Vec<HostPattern> = Vec::with_capacity(entries.len());
    for entry in entries {
        match HostPattern::parse(entry) {
            Ok(host) if out.contains(&host) => issues.add(key, format!("{entry:?} is listed twice (as {host})")),
            Ok(host) => out.push(host),
            Err(e) => issues.add(key, e),
        }
    }
    out
}

fn methods(key: &str, names: &[String], issues: &mut Issues) -> Vec<Method> {
    if names.is_empty() {
        issues.add(key, "is empty; leave it out to match every method");
    }
    let mut out = Vec::new();
    for name in names {
        match Method::from_bytes(name.as_bytes()) {
            Ok(m) if name.bytes().all(|b| b.is_ascii_uppercase()) => {
                if out.contains(&m) {
                    issues.add(key, format!("{name:?} is listed twice"));
                }
                out.push(m);
            }
            _ => issues.add(key, format!("{name:?} is not an HTTP method in upper case, like \"POST\"")),
        }
    }
    out
}

fn policy(
    key: &str,
    route: &str,
    hosts: &[HostPattern],
    s: &IdempotencySection,
    issues: &mut Issues,
) -> Option<IdempotencyPolicy> {
    let header = header_name(issues, &format!("{key}.header"), s.header.as_deref().unwrap_or(defaults::KEY_HEADER));
    if header.as_ref().is_some_and(headers::is_hop_by_hop) {
        issues.add(format!("{key}.header"), "a hop-by-hop header cannot carry the key");
    }
    let max_key_len = s.max_key_len.unwrap_or(defaults::MAX_KEY_LEN);
    if !(1..=MAX_KEY_LEN_LIMIT).contains(&max_key_len) {
        issues.add(format!("{key}.max_key_len"), format!("must be between 1 and {MAX_KEY_LEN_LIMIT}"));
    }
    let scope_entries = s.scope.as_ref().map_or_else(|| vec![defaults::SCOPE], OneOrMany::entries);
    let scope = issues.check(&format!("{key}.scope"), ScopeSource::parse(&scope_entries));
    let on_missing_scope = issues.check(
        &format!("{key}.on_missing_scope"),
        MissingScope::parse(s.on_missing_scope.as_deref().unwrap_or(defaults::ON_MISSING_SCOPE)),
    );
    let mode = issues.check(&format!("{key}.mode"), Mode::parse(s.mode.as_deref().unwrap_or(defaults::MODE)));
    let on_unknown_outcome = issues.check(
        &format!("{key}.on_unknown_outcome"),
        UnknownOutcomePolicy::parse(s.on_unknown_outcome.as_deref().unwrap_or(defaults::ON_UNKNOWN_OUTCOME)),
    );
    let attempt_header = match s.attempt_header.as_deref().unwrap_or(defaults::ATTEMPT_HEADER) {
        "" => Some(None),
        name => header_name(issues, &format!("{key}.attempt_header"), name).map(Some),
    };
    let ignore: Vec<JsonPointer> = s
        .ignore
        .iter()
        .flatten()
        .filter_map(|p| issues.check(&format!("{key}.ignore"), JsonPointer::parse(p)))
        .collect();
    let fingerprint_headers: Vec<HeaderName> = s
        .fingerprint_headers
        .iter()
        .flatten()
        .filter_map(|h| header_name(issues, &format!("{key}.fingerprint_headers"), h))
        .collect();
    let fingerprint = FingerprintSpec { ignore, headers: fingerprint_headers };
    let identity =
        super::identity::identity(&format!("{key}.identity"), route, hosts, s.identity.as_ref(), &fingerprint, issues);
    let lease = positive_duration(issues, &format!("{key}.lease"), s.lease, defaults::LEASE);
    if lease < Duration::from_millis(10) {
        issues.add(format!("{key}.lease"), "must be at least 10ms");
    }
    let wait = s.wait.map_or(defaults::WAIT, |d| d.0);
    let retention = positive_duration(issues, &format!("{key}.retention"), s.retention, defaults::RETENTION);
    let store_statuses =
        statuses(&format!("{key}.store_statuses"), s.store_statuses.as_deref(), defaults::STORE_STATUSES, issues);
    let max_request_body =
        body_limit(issues, &format!("{key}.max_request_body"), s.max_request_body, defaults::MAX_REQUEST_BODY);
    let max_stored_body =
        body_limit(issues, &format!("{key}.max_stored_body"), s.max_stored_body, defaults::MAX_STORED_BODY);
    let exclude_headers: Vec<HeaderName> = s
        .exclude_headers
        .iter()
        .flatten()
        .filter_map(|h| header_name(issues, &format!("{key}.exclude_headers"), h))
        .collect();
    let max_new_keys = match &s.max_new_keys {
        None => Some(None),
        Some(text) => issues.check(&format!("{key}.max_new_keys"), Quota::parse(text)).map(Some),
    };
    let replay_headers: Option<Vec<HeaderName>> = s
        .replay_headers
        .as_ref()
        .map(|names| names.iter().filter_map(|h| header_name(issues, &format!("{key}.replay_headers"), h)).collect());
    let on_store_error = issues.check(
        &format!("{key}.on_store_error"),
        StoreFailurePolicy::parse(s.on_store_error.as_deref().unwrap_or(defaults::ON_STORE_ERROR)),
    );
    let replay_header = header_name(
        issues,
        &format!("{key}.replay_header"),
        s.replay_header.as_deref().unwrap_or(defaults::REPLAY_HEADER),
    );
    let reconcile = match &s.reconcile {
        None => Some(None),
        Some(r) => reconcile(&format!("{key}.reconcile"), r, issues).map(Some),
    };
    if let (Some(Some(_)), Some(UnknownOutcomePolicy::Release)) = (&reconcile, on_unknown_outcome) {
        issues.add(
            format!("{key}.reconcile"),
            "on_unknown_outcome = \"release\" leaves no unknown outcome to reconcile; use \"hold\" or remove this table",
        );
    }
    Some(IdempotencyPolicy {
        mode: mode?,
        required: s.required.unwrap_or(true),
        header: header?,
        max_key_len,
        scope: scope?,
        identity: identity?,
        on_missing_scope: on_missing_scope?,
        on_unknown_outcome: on_unknown_outcome?,
        attempt_header: attempt_header?,
        max_new_keys: max_new_keys?,
        fingerprint,
        lease,
        renew: s.renew.unwrap_or(true),
        wait,
        retention,
        store_statuses: store_statuses?,
        max_request_body: max_request_body?,
        max_stored_body: max_stored_body?,
        stored_headers: StoredHeaders { allow: replay_headers, exclude: exclude_headers },
        on_store_error: on_store_error?,
        replay_header: replay_header?,
        reconcile: reconcile?,
        admin_body_preview: s.admin_body_preview.unwrap_or(false),
    })
}

fn reconcile(key: &str, s: &ReconcileSection, issues: &mut Issues) -> Option<Reconcile> {
    let path = match &s.path {
        Some(path) => issues.check(&format!("{key}.path"), LookupPath::parse(path)),
        None => {
            issues.add(format!("{key}.path"), "is required: where the upstream answers what became of a key");
            None
        }
    };
    let method_name = s.method.as_deref().unwrap_or(defaults::RECONCILE_METHOD);
    let method = methods(&format!("{key}.method"), &[method_name.to_owned()], issues).pop();
    let found = statuses(&format!("{key}.found"), s.found.as_deref(), defaults::RECONCILE_FOUND, issues);
    let not_found =
        statuses(&format!("{key}.not_found"), s.not_found.as_deref(), defaults::RECONCILE_NOT_FOUND, issues);
    if let (Some(found), Some(not_found)) = (&found, &not_found)
        && let Some(both) = (100..600).find(|&c| found.contains_code(c) && not_found.contains_code(c))
    {
        issues.add(format!("{key}.not_found"), format!("{both} is in found too: an answer cannot be both"));
    }
    let after = match s.after.as_deref() {
        None => Some(Some(defaults::RECONCILE_AFTER)),
        Some("off") => Some(None),
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) => Some(Some(d)),
            Err(_) => {
                issues.add(format!("{key}.after"), format!("{text:?} is neither a duration like \"1s\" nor \"off\""));
                None
            }
        },
    };
    let release_after = s.release_after.map_or(defaults::RECONCILE_RELEASE_AFTER, |d| d.0);
    let answer_status = match s.answer_status {
        None => Some(None),
        Some(code) => match u16::try_from(code).ok().filter(|c| (200..600).contains(c)) {
            Some(code) => http::StatusCode::from_u16(code).ok().map(Some),
            None => {
                issues.add(format!("{key}.answer_status"), format!("{code} is not a status between 200 and 599"));
                None
            }
        },
    };
    Some(Reconcile {
        path: path?,
        method: method?,
        found: found?,
        not_found: not_found?,
        after: after?,
        release_after,
        answer_status: answer_status?,
    })
}

fn statuses(key: &str, entries: Option<&[StatusEntry]>, default: &[&str], issues: &mut Issues) -> Option<StatusSet> {
    let texts: Vec<String> = match entries {
        None => default.iter().map(|s| (*s).to_owned()).collect(),
        Some(entries) => entries
            .iter()
            .map(|entry| match entry {
                StatusEntry::Code(code) => code.to_string(),
                StatusEntry::Text(text) => text.clone(),
            })
            .collect(),
    };
    match StatusSet::from_entries(&texts) {
        Ok(set) => Some(set),
        Err(errors) => {
            for e in errors {
                issues.add(key, e);
            }
            None
        }
    }
}
