//! What a new configuration does to the records the running one made.
//!
//! Records outlive the configuration that named them: a retry may come a whole retention
//! after its first request, across a reload, a restart or a rolling deploy that runs the old
//! and the new file side by side on one store. So a change to what enters a record's name
//! (the route's identity name, how hosts split it, the scope's sources) or a fingerprint
//! (`ignore`, `fingerprint_headers`) is compared here, per route, before it serves:
//!
//! - **kept**: records in retention keep their names and retries their fingerprints (nothing
//!   changed, or a pin under `[routes.idempotency.identity]` keeps them);
//! - **refused**: retries of requests answered before the change would run again, or get
//!   422; the reload refuses the file and `check --running` fails, naming the safe way;
//! - **said**: what the change does that no setting can keep (a new store prefix, another
//!   key header, a route gone), printed plainly.
//!
//! Matching an old route to a new one goes by identity (the name its records are made under),
//! then by route name, then by path: a route renamed without a pin is found by its path and
//! refused, with the pin that keeps its records. How hosts split names is compared in
//! [`hosts`].

mod hosts;

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{Config, RouteConfig};
use crate::policy::IdempotencyPolicy;
use crate::policy::fingerprint::FingerprintSpec;

/// What one change does to records in retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Records keep their names, retries their fingerprints.
    Kept,
    /// Retries of earlier requests would run again or get 422: the change is refused.
    Refused,
    /// Said plainly: nothing in the configuration can keep it.
    Said,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Kept => "kept",
            Self::Refused => "refused",
            Self::Said => "said",
        }
    }
}

/// One finding about one route (or the store).
#[derive(Debug, Clone)]
pub struct Finding {
    /// The route, in the new file (or the old one, for a route that is gone); `None` for the
    /// store as a whole.
    pub route: Option<String>,
    /// The setting that changed (`hosts`, `scope`, `name`, `fingerprint`, `header`, ...).
    pub setting: &'static str,
    /// What it does.
    pub verdict: Verdict,
    /// What happens to records in retention, in words.
    pub records: String,
    /// The safe way to make the change, for a refused one.
    pub remedy: Option<String>,
}

impl Finding {
    fn line(&self) -> String {
        let mut line = match &self.route {
            Some(route) => format!("route {route:?}: "),
            None => "store: ".to_owned(),
        };
        let _ = write!(line, "{}: {}: {}.", self.setting, self.verdict.as_str(), self.records);
        if let Some(remedy) = &self.remedy {
            let _ = write!(line, " Safe: {remedy}");
        }
        line
    }
}

/// Every finding of a comparison, in route order.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl Comparison {
    /// The findings that refuse the change.
    pub fn refused(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.verdict == Verdict::Refused)
    }

    /// Whether the change may be applied.
    pub fn is_safe(&self) -> bool {
        self.refused().next().is_none()
    }

    /// One line per finding: `route "orders": hosts: refused: ... Safe: ...`.
    pub fn lines(&self) -> Vec<String> {
        self.findings.iter().map(Finding::line).collect()
    }

    /// The lines of the findings with `verdict`.
    pub fn lines_of(&self, verdict: Verdict) -> Vec<String> {
        self.findings.iter().filter(|f| f.verdict == verdict).map(Finding::line).collect()
    }

    /// The comparison as JSON: `{"safe": bool, "findings": [...]}`.
    pub fn to_json(&self) -> Value {
        let findings: Vec<Value> = self
            .findings
            .iter()
            .map(|f| {
                json!({
                    "route": f.route,
                    "setting": f.setting,
                    "verdict": f.verdict.as_str(),
                    "records": f.records,
                    "remedy": f.remedy,
                })
            })
            .collect();
        json!({ "safe": self.is_safe(), "findings": findings })
    }

    pub(super) fn add(&mut self, route: Option<&str>, setting: &'static str, verdict: Verdict, records: String) {
        self.findings.push(Finding { route: route.map(str::to_owned), setting, verdict, records, remedy: None });
    }

    pub(super) fn refuse(&mut self, route: &str, setting: &'static str, records: String, remedy: String) {
        self.findings.push(Finding {
            route: Some(route.to_owned()),
            setting,
            verdict: Verdict::Refused,
            records,
            remedy: Some(remedy),
        });
    }
}

/// Compares the configuration that runs (or ran) with the one about to: what the change does
/// to the records in retention, route by route.
pub fn compare(running: &Config, next: &Config) -> Comparison {
    let mut out = Comparison::default();
    if running.store.key_prefix != next.store.key_prefix {
        out.add(
            None,
            "key_prefix",
            Verdict::Said,
            format!(
                "{:?} becomes {:?}: a new prefix is a new store; every record in retention is left behind under \
                 the old one and retries of those requests run again",
                running.store.key_prefix, next.store.key_prefix
            ),
        );
    }
    let (old, new) = (keyed(running), keyed(next));
    let mut matched = vec![false; new.len()];
    for &(o, op) in &old {
        let by_identity = new.iter().position(|(_, np)| np.identity.name == op.identity.name);
        let by_name = || new.iter().position(|(n, _)| n.name == o.name);
        let by_path = || new.iter().position(|(n, _)| n.path == o.path && n.methods == o.methods);
        match by_identity {
            Some(i) => {
                matched[i] = true;
                let (n, np) = new[i];
                same_identity(&mut out, (o, op), (n, np));
            }
            None => match by_name().or_else(by_path) {
                Some(i) => {
                    matched[i] = true;
                    let (n, np) = new[i];
                    renamed(&mut out, (o, op), (n, np));
                }
                None => gone(&mut out, o, op, next),
            },
        }
    }
    for (i, (n, np)) in new.iter().enumerate() {
        if !matched[i] {
            out.add(
                Some(&n.name),
                "route",
                Verdict::Kept,
                format!("new: its records are made under identity {:?}", np.identity.name),
            );
        }
    }
    out
}

/// The routes of `config` with idempotency, and their policies.
fn keyed(config: &Config) -> Vec<(&RouteConfig, &IdempotencyPolicy)> {
    config.routes.iter().filter_map(|r| r.idempotency.as_deref().map(|p| (r, p))).collect()
}

/// An old route whose identity no new route has, by name or by path: its records are named
/// anew unless the new route pins the old identity.
fn renamed(
    out: &mut Comparison,
    (o, op): (&RouteConfig, &IdempotencyPolicy),
    (n, np): (&RouteConfig, &IdempotencyPolicy),
) {
    let was = &op.identity.name;
    // A new route that names an identity of its own on purpose starts a new one.
    if np.identity.unpinned.renamed {
        out.add(
            Some(&n.name),
            "name",
            Verdict::Said,
            format!(
                "starts a new identity {:?} on purpose: the records route {:?} made under {was:?} are left behind, and \
                 retries of requests answered in the last {} run again (the upstream's own constraint must catch them)",
                np.identity.name,
                o.name,
                words(op.retention)
            ),
        );
        return;
    }
    out.refuse(
        &n.name,
        "name",
        format!(
            "its records would be named {:?} where route {:?} made them under {was:?}: retries of requests answered in \
             the last {} would run again",
            np.identity.name,
            o.name,
            words(op.retention)
        ),
        format!("keep them with [routes.idempotency.identity] name = {was:?} on route {:?}.", n.name),
    );
    settings(out, (o, op), (n, np));
}

/// A route with idempotency in the running file that no route of the next one continues.
fn gone(out: &mut Comparison, o: &RouteConfig, op: &IdempotencyPolicy, next: &Config) {
    let records = match next.route(&o.name) {
        Some(_) => format!(
            "no longer idempotent: retries of requests answered in the last {} are forwarded as new requests",
            words(op.retention)
        ),
        None => format!(
            "removed: its records are no longer read; retries of requests answered in the last {} get whatever the \
             routes that serve them now give",
            words(op.retention)
        ),
    };
    out.add(Some(&o.name), "route", Verdict::Said, records);
}

/// Two routes, old and new, with one identity: what else of their names and fingerprints
/// changed.
fn same_identity(
    out: &mut Comparison,
    (o, op): (&RouteConfig, &IdempotencyPolicy),
    (n, np): (&RouteConfig, &IdempotencyPolicy),
) {
    let before = out.findings.len();
    if o.name != n.name {
        out.add(
            Some(&n.name),
            "name",
            Verdict::Kept,
            format!("renamed from {:?}; its records stay under identity {:?}", o.name, np.identity.name),
        );
    }
    settings(out, (o, op), (n, np));
    if out.findings.len() == before {
        out.add(Some(&n.name), "identity", Verdict::Kept, "unchanged: records in retention keep their names".into());
    }
}

/// What changed, between an old route and the new one that continues it, in the settings
/// that name records and fingerprint requests.
fn settings(
    out: &mut Comparison,
    (o, op): (&RouteConfig, &IdempotencyPolicy),
    (n, np): (&RouteConfig, &IdempotencyPolicy),
) {
    let retention = words(op.retention);
    hosts::compare(out, (o, op), (n, np));
    if op.scope != np.scope {
        let sources = |p: &IdempotencyPolicy| {
            let list: Vec<String> = p.scope.sources().iter().map(|s| s.describe()).collect();
            if list.is_empty() { "global".to_owned() } else { list.join(", ") }
        };
        out.refuse(
            &n.name,
            "scope",
            format!(
                "{} becomes {}: whose key a request is enters its record's name, so retries of requests answered in \
                 the last {retention} would run again",
                sources(op),
                sources(np)
            ),
            format!(
                "keep scope as it is while those records live; to change it, start a new identity on purpose \
                 ([routes.idempotency.identity] name = \"{}-2\"), knowing that retries from before run once more and \
                 the upstream's UNIQUE(idem_key) must catch them.",
                np.identity.name
            ),
        );
    }
    if op.fingerprint != np.fingerprint {
        if np.identity.previous_fingerprint.as_ref() == Some(&op.fingerprint) {
            out.add(
                Some(&n.name),
                "fingerprint",
                Verdict::Kept,
                "changed; a retry of a record made before matches under previous_fingerprint".into(),
            );
        } else {
            out.refuse(
                &n.name,
                "fingerprint",
                format!(
                    "{} becomes {}: honest retries of requests answered in the last {retention} would get 422",
                    spec_words(&op.fingerprint),
                    spec_words(&np.fingerprint)
                ),
                format!(
                    "name the settings those records were made under: [routes.idempotency.identity.previous_fingerprint] \
                     {}; it can go once idemgate_identity_pin_hits_total{{route={:?},pin=\"fingerprint\"}} stays 0 for \
                     {retention}.",
                    spec_toml(&op.fingerprint),
                    n.name
                ),
            );
        }
    }
    if op.header != np.header {
        out.add(
            Some(&n.name),
            "header",
            Verdict::Said,
            format!(
                "the key header {} becomes {}: clients still sending {} are unkeyed ({})",
                op.header,
                np.header,
                op.header,
                if np.required { "400 key-missing" } else { "forwarded without protection" }
            ),
        );
    }
}

fn spec_words(spec: &FingerprintSpec) -> String {
    let ignore: Vec<String> = spec.ignore.iter().map(ToString::to_string).collect();
    let headers: Vec<&str> = spec.headers.iter().map(http::HeaderName::as_str).collect();
    format!("ignore [{}], fingerprint_headers [{}]", ignore.join(", "), headers.join(", "))
}

fn spec_toml(spec: &FingerprintSpec) -> String {
    let quoted = |items: Vec<String>| items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ");
    format!(
        "ignore = [{}], fingerprint_headers = [{}]",
        quoted(spec.ignore.iter().map(ToString::to_string).collect()),
        quoted(spec.headers.iter().map(|h| h.as_str().to_owned()).collect())
    )
}

/// A duration as the configuration writes it (`24h`, `10m`, `30s`, `1500ms`).
pub(super) fn words(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with one keyed `POST /orders` route: its name, `hosts` lines and policy lines.
    fn config(prefix: &str, route: &str, hosts: &str, policy: &str) -> Config {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\nkey_prefix = \"{prefix}\"\n\
             [upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n\
             [[routes]]\nname = \"{route}\"\n{hosts}\nmethods = [\"POST\"]\npath = \"/orders\"\nupstream = \"app\"\n\
             [routes.idempotency]\n{policy}\n"
        );
        Config::from_toml(&text, "t").unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn orders(hosts: &str, policy: &str) -> Config {
        config("idemgate", "orders", hosts, policy)
    }

    /// The (setting, verdict) of every finding.
    fn verdicts(running: &Config, next: &Config) -> Vec<(&'static str, Verdict)> {
        compare(running, next).findings.iter().map(|f| (f.setting, f.verdict)).collect()
    }

    const T1: &str = "hosts = [\"t1.example.com\"]";
    const T1_T2: &str = "hosts = [\"t1.example.com\", \"t2.example.com\"]";

    #[test]
    fn nothing_changed_keeps_every_record() {
        let c = orders(T1, "");
        assert_eq!(verdicts(&c, &c), [("identity", Verdict::Kept)]);
        assert!(compare(&c, &c).is_safe());
    }

    #[test]
    fn hosts_in_either_direction_are_refused_until_pinned() {
        let added = compare(&orders(T1, ""), &orders(T1_T2, ""));
        assert_eq!(added.findings.len(), 1);
        let f = &added.findings[0];
        assert_eq!((f.setting, f.verdict), ("hosts", Verdict::Refused));
        assert!(f.records.contains("t1.example.com"), "{}", f.records);
        assert!(f.remedy.as_deref().unwrap_or("").contains("host = \"t1.example.com\""), "{f:?}");
        let pinned = orders(T1_T2, "[routes.idempotency.identity]\nhost = \"t1.example.com\"");
        assert_eq!(verdicts(&orders(T1, ""), &pinned), [("hosts", Verdict::Kept)]);
        let wildcard = orders("hosts = [\"*.example.com\"]", "");
        assert_eq!(verdicts(&orders(T1, ""), &wildcard), [("hosts", Verdict::Refused)]);
        // Back to one host: refused until kept apart.
        let back = compare(&orders(T1_T2, ""), &orders(T1, ""));
        assert_eq!(back.findings[0].verdict, Verdict::Refused);
        assert!(back.findings[0].remedy.as_deref().unwrap_or("").contains("per_host = true"));
        let apart = orders(T1, "[routes.idempotency.identity]\nper_host = true");
        assert_eq!(verdicts(&orders(T1_T2, ""), &apart), [("identity", Verdict::Kept)], "t1 stays apart");
        // Removing a pin is a change like any other.
        assert_eq!(verdicts(&pinned, &orders(T1_T2, "")), [("hosts", Verdict::Refused)]);
        // From every host to several: one host can keep the shared names; the others are
        // said, since keeping them would merge tenants.
        let from_all = compare(&orders("", ""), &pinned);
        assert!(from_all.is_safe(), "{:?}", from_all.lines());
        assert!(
            from_all.lines().iter().any(|l| l.contains("t2.example.com") && l.contains("said")),
            "{:?}",
            from_all.lines()
        );
    }

    #[test]
    fn a_rename_is_refused_until_pinned_and_a_new_identity_on_purpose_is_said() {
        let old = orders("", "");
        let renamed = config("idemgate", "orders-v2", "", "");
        let found = compare(&old, &renamed);
        assert_eq!(verdicts(&old, &renamed), [("name", Verdict::Refused)]);
        assert!(found.findings[0].remedy.as_deref().unwrap_or("").contains("name = \"orders\""));
        let pinned = config("idemgate", "orders-v2", "", "[routes.idempotency.identity]\nname = \"orders\"");
        assert_eq!(verdicts(&old, &pinned), [("name", Verdict::Kept)]);
        let fresh = config("idemgate", "orders-v2", "", "[routes.idempotency.identity]\nname = \"orders-2\"");
        assert_eq!(verdicts(&old, &fresh), [("name", Verdict::Said)]);
        // Taking a name pin away renames the records back.
        assert_eq!(verdicts(&pinned, &renamed), [("name", Verdict::Refused)]);
    }

    #[test]
    fn scope_and_fingerprint_changes_are_refused_and_a_previous_fingerprint_keeps_retries() {
        let old = orders("", "ignore = [\"/ts\"]");
        assert_eq!(
            verdicts(&old, &orders("", "ignore = [\"/ts\"]\nscope = \"header:X-User\"")),
            [("scope", Verdict::Refused)]
        );
        let stricter = compare(&old, &orders("", ""));
        assert_eq!(stricter.findings[0].verdict, Verdict::Refused);
        let remedy = stricter.findings[0].remedy.clone().unwrap_or_default();
        assert!(remedy.contains("previous_fingerprint") && remedy.contains("ignore = [\"/ts\"]"), "{remedy}");
        let kept = orders("", "[routes.idempotency.identity.previous_fingerprint]\nignore = [\"/ts\"]");
        assert_eq!(verdicts(&old, &kept), [("fingerprint", Verdict::Kept)]);
        let headers = orders("", "ignore = [\"/ts\"]\nfingerprint_headers = [\"x-currency\"]");
        assert_eq!(verdicts(&old, &headers), [("fingerprint", Verdict::Refused)]);
    }

    #[test]
    fn a_new_prefix_a_new_key_header_and_a_route_gone_are_said() {
        let old = orders("", "");
        assert_eq!(
            verdicts(&old, &config("other", "orders", "", "")),
            [("key_prefix", Verdict::Said), ("identity", Verdict::Kept)]
        );
        assert_eq!(verdicts(&old, &orders("", "header = \"X-Request-Key\"")), [("header", Verdict::Said)]);
        let elsewhere = config("idemgate", "refunds", "", "").routes;
        let mut gone = old.clone();
        gone.routes = elsewhere
            .into_iter()
            .map(|mut r| {
                r.path = "/refunds".into();
                r
            })
            .collect();
        assert_eq!(verdicts(&old, &gone), [("route", Verdict::Said), ("route", Verdict::Kept)]);
        assert!(compare(&old, &gone).is_safe());
    }
}
