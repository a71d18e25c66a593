//! The published policy: what each route promises its clients, as the IETF draft asks a
//! resource to publish (key format, retention, what is fingerprinted), rendered from the
//! running configuration so that it can never drift from what the gateway does.
//!
//! - [`markdown`]: the policy of every idempotent route, for people (`idemgate policy`,
//!   admin `GET /policy`);
//! - [`routes_json`]: the live routing table with each route's policy, for tools (admin
//!   `GET /routes`).

use std::fmt::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::RouteConfig;
use crate::policy::scope::{MissingScope, ScopeSource};
use crate::policy::{IdempotencyPolicy, Mode, StoreFailurePolicy, UnknownOutcomePolicy};

/// A duration the way the config writes it: `"24h"`, `"10s"`, `"250ms"`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// ` on api.example.com, *.example.com`, or nothing for a route that serves every host.
fn on_hosts(route: &RouteConfig) -> String {
    if route.hosts.is_empty() {
        return String::new();
    }
    let hosts: Vec<String> = route.hosts.iter().map(ToString::to_string).collect();
    format!(" on {}", hosts.join(", "))
}

fn methods(route: &RouteConfig) -> String {
    route.methods.as_ref().map_or_else(
        || "any method".to_owned(),
        |ms| ms.iter().map(http::Method::as_str).collect::<Vec<_>>().join(", "),
    )
}

fn scope(policy: &IdempotencyPolicy) -> String {
    match &policy.scope {
        ScopeSource::Global => "none: every caller shares one key space".into(),
        ScopeSource::Caller(sources) => {
            let names: Vec<String> = sources
                .iter()
                .map(|s| match s.optional {
                    false => format!("`{}`", s.describe()),
                    true => format!("`{}` when present", s.describe().trim_end_matches('?')),
                })
                .collect();
            let missing = match policy.on_missing_scope {
                MissingScope::Reject => "a keyed request without it is refused (400 `scope-missing`)",
                MissingScope::Anonymous => "requests without it share one anonymous key space",
            };
            let mut out =
                format!("keys are kept per caller, identified by {} (hashed); {missing}", names.join(" and "));
            if sources.iter().any(|s| s.optional) {
                out.push_str(
                    "; a part marked \"when present\" is optional: a request without it has a key space of its own, \
                     apart from every request that sends it",
                );
            }
            out
        }
    }
}

fn fingerprint(policy: &IdempotencyPolicy) -> String {
    let mut out = String::from(
        "method, path, query parameters (sorted by name), media type and `Content-Encoding`, body \
         (JSON and forms canonicalised, other bodies byte for byte)",
    );
    if !policy.fingerprint.ignore.is_empty() {
        let ignored: Vec<String> = policy.fingerprint.ignore.iter().map(|p| format!("`{p}`")).collect();
        let _ = write!(out, "; JSON fields ignored: {}", ignored.join(", "));
    }
    if !policy.fingerprint.headers.is_empty() {
        let headers: Vec<String> = policy.fingerprint.headers.iter().map(|h| format!("`{h}`")).collect();
        let _ = write!(out, "; headers: {}", headers.join(", "));
    }
    out
}

/// What a retry gets after a request was sent and no complete answer came back.
fn unknown_outcome(policy: &IdempotencyPolicy) -> String {
    match (policy.on_unknown_outcome, &policy.reconcile) {
        (UnknownOutcomePolicy::Hold, None) => "held: retries get 502 `outcome-unknown` and are not run again; \
            check the state of the resource before sending the request with a new key, which would run it a \
            second time if it ran"
            .into(),
        (UnknownOutcomePolicy::Hold, Some(_)) => format!(
            "settled by retrying with the same key: the gateway asks the API what became of the request, and \
             the retry gets the original answer (marked `{}: true` and `Idempotency-Status: reconciled`) or, \
             if the request never ran, runs it. Until that is known, a retry gets 502 `outcome-unknown` (409 \
             `in-progress` while the gateway is still asking) and is not run; the `Retry-After` on that answer \
             says when to retry. Never with a new key: the request may have run, and a new key would run it \
             again",
            policy.replay_header
        ),
        (UnknownOutcomePolicy::Release, _) => "released: a retry runs again (the API deduplicates on the key)".into(),
    }
}

fn size(bytes: usize) -> String {
    bytesize::ByteSize(bytes as u64).display().iec().to_string()
}

/// The policy of every idempotent route, as Markdown.
pub fn markdown(routes: &[RouteConfig]) -> String {
    let mut out = String::from(
        "# Idempotency policy\n\nSend one `Idempotency-Key` per logical request and the same key on every \
         retry of it. Errors are `application/problem+json`.\n",
    );
    for route in routes {
        let Some(p) = &route.idempotency else { continue };
        let _ = write!(out, "\n## {} {}{} (route `{}`)\n\n", methods(route), route.path, on_hosts(route), route.name);
        if p.mode == Mode::Observe {
            out.push_str(
                "**Observed only: not enforced yet.** Every request, retries included, is forwarded as \
                 sent and answered by the API itself, with no replay and no refusal. Send keys as below \
                 now: the table is what this route enforces once it does.\n\n",
            );
        }
        out.push_str("| | |\n|---|---|\n");
        let mut row = |name: &str, value: String| {
            let _ = writeln!(out, "| {name} | {} |", value.replace('|', "\\|"));
        };
        row(
            "key",
            format!(
                "`{}` header: a Structured Field string (`\"...\"`) or a bare token, 1 to {} printable ASCII characters",
                p.header, p.max_key_len
            ),
        );
        row(
            "required",
            if p.required {
                "yes: a request without a key gets 400 `key-missing`".into()
            } else {
                "no: a request without a key is forwarded without protection".into()
            },
        );
        let scope = if p.identity.needs_host() { format!("{}, on each host apart", scope(p)) } else { scope(p) };
        row("scope", scope);
        row("what makes two requests the same", fingerprint(p));
        let renew = if p.renew { "renewed while the request runs" } else { "not renewed" };
        row(
            "lease",
            format!("{} ({renew}); a gateway that dies mid-request frees the key after it", duration(p.lease)),
        );
        row(
            "a retry while the first runs",
            format!("waits up to {}, then 409 `in-progress` with `Retry-After`", duration(p.wait)),
        );
        row("retention", format!("answers are replayed for {}", duration(p.retention)));
        row(
            "stored statuses",
            format!("{}; any other status releases the key, and a retry runs again", p.store_statuses.describe()),
        );
        row("outcome unknown (sent, no complete answer)", unknown_outcome(p));
        row(
            "store unavailable",
            match p.on_store_error {
                StoreFailurePolicy::FailClosed => "503 `store-unavailable`, nothing forwarded".into(),
                StoreFailurePolicy::FailOpen => {
                    "forwarded without protection, marked `Idempotency-Status: bypassed`".into()
                }
            },
        );
        let mut limits = vec![
            format!("request body at most {} (413)", size(p.max_request_body)),
            format!("answers over {} are not kept: retries get `response-not-stored`", size(p.max_stored_body)),
        ];
        if let Some(q) = p.max_new_keys {
            limits.push(format!("at most {} new keys per caller per {} (429)", q.count, duration(q.window)));
        }
        row("limits", limits.join("; "));
        row("replays", format!("marked `{}: true`; cookies and credentials are never replayed", p.replay_header));
        if let Some(name) = &p.attempt_header {
            row("attempts", format!("the API receives `{name}: N`, 1 for a key's first execution"));
        }
    }
    out
}

/// The live routing table, each route with its policy, as JSON.
pub fn routes_json(routes: &[RouteConfig]) -> Value {
    Value::Array(
        routes
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "methods": r.methods.as_ref().map(|ms| ms.iter().map(|m| m.as_str().to_owned()).collect::<Vec<_>>()),
                    "path": r.path,
                    "hosts": (!r.hosts.is_empty()).then(|| r.hosts.iter().map(ToString::to_string).collect::<Vec<_>>()),
                    "upstream": r.upstream,
                    "idempotency": r.idempotency.as_ref().map(|p| policy_json(p)),
                })
            })
            .collect(),
    )
}

fn policy_json(p: &IdempotencyPolicy) -> Value {
    let ms = |d: Duration| d.as_millis() as u64;
    json!({
        "mode": p.mode.as_str(),
        "header": p.header.as_str(),
        "required": p.required,
        "max_key_len": p.max_key_len,
        "scope": p.scope.sources().iter().map(|s| s.describe()).collect::<Vec<_>>(),
        "scope_global": matches!(p.scope, ScopeSource::Global),
        "scope_per_host": p.identity.needs_host(),
        "on_missing_scope": match p.on_missing_scope { MissingScope::Reject => "reject", MissingScope::Anonymous => "anonymous" },
        "ignore": p.fingerprint.ignore.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "fingerprint_headers": p.fingerprint.headers.iter().map(|h| h.as_str().to_owned()).collect::<Vec<_>>(),
        "lease_ms": ms(p.lease),
        "renew": p.renew,
        "wait_ms": ms(p.wait),
        "retention_ms": ms(p.retention),
        "store_statuses": p.store_statuses.describe(),
        "on_unknown_outcome": match p.on_unknown_outcome { UnknownOutcomePolicy::Hold => "hold", UnknownOutcomePolicy::Release => "release" },
        "on_store_error": match p.on_store_error { StoreFailurePolicy::FailClosed => "fail-closed", StoreFailurePolicy::FailOpen => "fail-open" },
        "max_request_body": p.max_request_body,
        "max_stored_body": p.max_stored_body,
        "max_new_keys": p.max_new_keys.map(|q| json!({ "count": q.count, "window_ms": ms(q.window) })),
        "attempt_header": p.attempt_header.as_ref().map(|h| h.as_str().to_owned()),
        "replay_header": p.replay_header.as_str(),
        "admin_body_preview": p.admin_body_preview,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    /// Three routes that differ only in what becomes of an unknown outcome.
    fn routes() -> Vec<crate::config::RouteConfig> {
        let route = |name: &str, policy: &str| {
            format!(
                "\n[[routes]]\nname = \"{name}\"\nmethods = [\"POST\"]\npath = \"/{name}\"\nupstream = \"app\"\n\n\
                 [routes.idempotency]\n{policy}\n"
            )
        };
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\nbackend = \"memory\"\n\n[upstreams.app]\nurl = \
             \"http://127.0.0.1:9\"\n{}{}{}",
            route("held", ""),
            route("released", "on_unknown_outcome = \"release\""),
            route("asked", "[routes.idempotency.reconcile]\npath = \"/asked/lookup?key={key}\""),
        ) + &route("watched", "mode = \"observe\"");
        Config::from_toml(&toml, "<test>").unwrap().routes
    }

    fn section<'a>(markdown: &'a str, route: &str) -> &'a str {
        let start = markdown.find(&format!("(route `{route}`)")).unwrap();
        let end = markdown[start..].find("\n## ").map_or(markdown.len(), |i| start + i);
        &markdown[start..end]
    }

    const ROW: &str = "| outcome unknown (sent, no complete answer) | ";

    #[test]
    fn routes_without_reconcile_publish_their_unknown_outcome_as_before() {
        let markdown = super::markdown(&routes());
        assert!(
            section(&markdown, "held")
                .contains(&format!("{ROW}held: retries get 502 `outcome-unknown` and are not run again; check the state of the resource before sending the request with a new key, which would run it a second time if it ran |\n")),
            "{markdown}"
        );
        assert!(
            section(&markdown, "released")
                .contains(&format!("{ROW}released: a retry runs again (the API deduplicates on the key) |\n")),
            "{markdown}"
        );
        // Apart from their names, the two held routes publish the same table but for that row.
        let rows = |route: &str| -> Vec<String> {
            section(&markdown, route).lines().skip(1).map(|l| l.replace(&format!("/{route}"), "/R")).collect()
        };
        let (held, asked) = (rows("held"), rows("asked"));
        assert_eq!(held.len(), asked.len());
        let differ: Vec<_> = held.iter().zip(&asked).filter(|(a, b)| a != b).collect();
        assert_eq!(differ.len(), 1, "{differ:?}");
        assert!(differ[0].0.starts_with(ROW));
    }

    /// A route that only observes says so first: its clients get no guarantee yet.
    #[test]
    fn a_route_that_only_observes_says_nothing_is_enforced_yet() {
        let routes = routes();
        let markdown = super::markdown(&routes);
        let watched = section(&markdown, "watched");
        assert!(watched.contains("**Observed only: not enforced yet.**"), "{watched}");
        assert!(!section(&markdown, "held").contains("Observed only"), "{markdown}");
        let json = super::routes_json(&routes);
        assert_eq!(json[3]["idempotency"]["mode"], "observe");
        assert_eq!(json[0]["idempotency"]["mode"], "enforce");
    }

    #[test]
    fn a_route_that_reconciles_tells_clients_to_retry_with_the_same_key() {
        let markdown = super::markdown(&routes());
        let asked = section(&markdown, "asked");
        let row = asked.lines().find(|l| l.starts_with(ROW)).unwrap();
        for needle in [
            "settled by retrying with the same key",
            "the original answer",
            "`idempotent-replay: true` and `Idempotency-Status: reconciled`",
            "if the request never ran, runs it",
            "502 `outcome-unknown`",
            "`Retry-After`",
        ] {
            assert!(row.contains(needle), "missing {needle:?} in {row}");
        }
        // Nothing about how the gateway asks (the lookup's path is the API's business).
        assert!(!asked.contains("/asked/lookup"), "{asked}");
    }

    #[test]
    fn optional_scope_parts_are_published_as_optional() {
        let toml = "[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\nbackend = \"memory\"\n\n[upstreams.app]\nurl = \
                    \"http://127.0.0.1:9\"\n\n[[routes]]\nname = \"charges\"\npath = \"/charges\"\nupstream = \"app\"\n\n\
                    [routes.idempotency]\nscope = [\"header:Authorization\", \"header:Stripe-Account?\"]\n";
        let routes = Config::from_toml(toml, "<test>").unwrap().routes;
        let markdown = super::markdown(&routes);
        assert!(
            markdown.contains("identified by `header:authorization` and `header:stripe-account` when present (hashed)"),
            "{markdown}"
        );
        assert!(markdown.contains("a request without it has a key space of its own"), "{markdown}");
        let json = super::routes_json(&routes);
        assert_eq!(json[0]["idempotency"]["scope"][1], "header:stripe-account?", "{json}");
    }
}
