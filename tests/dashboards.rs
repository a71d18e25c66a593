//! The Grafana dashboard (`deploy/grafana/idemgate.json`) and the Prometheus alerting rules
//! (`deploy/prometheus/idemgate-rules.yml`) name only metrics the gateway exports, every panel
//! and rule has a query, and every alert links to a runbook that exists in
//! `docs/operations.md`.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use support::client::Client;
use support::gateway_proc::{GatewayProc, Toml};
use support::upstream::TestUpstream;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;
const DASHBOARD: &str = "deploy/grafana/idemgate.json";
const RULES: &str = "deploy/prometheus/idemgate-rules.yml";
const OPERATIONS: &str = "docs/operations.md";

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn dashboard() -> Json {
    serde_json::from_str(&repo_file(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

fn rules() -> Yaml {
    serde_yaml_ng::from_str(&repo_file(RULES)).unwrap_or_else(|e| panic!("{RULES} is not YAML: {e}"))
}

/// Every panel of the dashboard, rows' nested panels included, rows themselves excluded.
fn panels(dashboard: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for panel in list.as_array().into_iter().flatten() {
            if panel["type"] == "row" {
                walk(&panel["panels"], out);
            } else {
                out.push(panel);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// `(where, expr)` for every target of every panel; a target without `expr` gives `""`.
fn panel_exprs(dashboard: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("<untitled>");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let at = format!("panel {title:?} target {}", target["refId"].as_str().unwrap_or("?"));
            out.push((at, target["expr"].as_str().unwrap_or("").to_owned()));
        }
    }
    out
}

/// `(where, query)` for every query variable of the dashboard.
fn variable_queries(dashboard: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let query = match &var["query"] {
            Json::String(s) => s.clone(),
            other => other["query"].as_str().unwrap_or("").to_owned(),
        };
        out.push((format!("variable {}", var["name"]), query));
    }
    out
}

/// Every rule of every group.
fn rule_list(rules: &Yaml) -> Vec<&Yaml> {
    let groups = rules["groups"].as_sequence().unwrap_or_else(|| panic!("{RULES}: no `groups` list"));
    groups.iter().flat_map(|g| g["rules"].as_sequence().into_iter().flatten()).collect()
}

fn rule_name(rule: &Yaml) -> String {
    rule["alert"].as_str().or_else(|| rule["record"].as_str()).unwrap_or("<unnamed>").to_owned()
}

/// `(where, expr)` for every rule; a rule without `expr` gives `""`.
fn rule_exprs(rules: &Yaml) -> Vec<(String, String)> {
    rule_list(rules)
        .into_iter()
        .map(|rule| (format!("rule {}", rule_name(rule)), rule["expr"].as_str().unwrap_or("").to_owned()))
        .collect()
}

/// The `idemgate_*` metric names a query uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    for (at, _) in expr.match_indices("idemgate_") {
        if expr[..at].chars().next_back().is_some_and(is_name) {
            continue;
        }
        let name: String = expr[at..].chars().take_while(|&c| is_name(c)).collect();
        names.insert(name);
    }
    names
}

/// The series names an exposition makes queryable: every sample's name, and for every family
/// declared by `# TYPE` the names its type gives it.
fn exported_series(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(family), Some(kind)) = (words.next(), words.next()) else { continue };
            match kind {
                "counter" if family.ends_with("_total") => {
                    names.insert(family.to_owned());
                }
                "counter" => {
                    names.insert(format!("{family}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{family}{suffix}"));
                    }
                }
                _ => {
                    names.insert(family.to_owned());
                }
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name: String = line.chars().take_while(|&c| c != '{' && c != ' ').collect();
            names.insert(name);
        }
    }
    names
}

/// One name with its histogram or counter suffix taken off, for the report of a missing name.
fn family_of(name: &str) -> &str {
    ["_bucket", "_sum", "_count", "_total"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name)
}

/// GitHub's anchors for the headings of a Markdown file (code blocks skipped): lowercased,
/// punctuation but `-` and `_` dropped, spaces turned into `-`, repeats numbered `-1`, `-2`.
fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|&c| c.is_alphanumeric() || c == ' ' || c == '-' || c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    anchors
}

/// Where the runbooks live: docs/operations.md in the repository the problem types link to.
fn runbook_base() -> String {
    let config =
        idemgate::config::Config::from_toml(&Toml::new("127.0.0.1:1".parse().unwrap()).render(), "<test>").unwrap();
    let problem_base = &config.server.problem_base;
    let repo = problem_base
        .strip_suffix("docs/errors.md#")
        .unwrap_or_else(|| panic!("the default problem base {problem_base} is not docs/errors.md in a repository"));
    format!("{repo}{OPERATIONS}#")
}

/// Scrapes a gateway on Redis (so that the Redis-only families are registered) after a few
/// requests through an idempotent route. A labelled family without a sample is left out of the
/// exposition altogether, `# TYPE` line included: the route's families are created at start,
/// and `idemgate_unknown_records` is counted at the scrape because the route holds unknown
/// outcomes (the default).
async fn scrape_gateway() -> String {
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::shared();
    let store =
        format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"", redis.url(), support::unique("dashboards"));
    // The route asks the upstream about unknown outcomes, so that its reconciliation series
    // exist (a route without a lookup has none).
    let policy = "[routes.idempotency.reconcile]\npath = \"/orders/lookup\"";
    // And a route that only observes, for `idemgate_observed_total`.
    let routes = "\n[[routes]]\nname = \"watched\"\nmethods = [\"POST\"]\npath = \"/watched\"\nupstream = \"app\"\n\n\
                  [routes.idempotency]\nmode = \"observe\"\n"
        .to_owned();
    // And an upstream of two instances, for the `idemgate_upstream_instance_*` series.
    let routes = format!(
        "{routes}\n[[routes]]\nname = \"spread\"\npath = \"/spread\"\nupstream = \"many\"\n\n\
         [upstreams.many]\nurls = [\"http://{0}\", \"http://127.0.0.1:9\"]\n\n\
         [[routes]]\nname = \"named\"\npath = \"/named\"\nupstream = \"named\"\n\n\
         [upstreams.named]\nurl = \"http://localhost:{1}\"\nresolve_every = \"1s\"\n",
        upstream.addr,
        upstream.addr.port()
    );
    let gw = GatewayProc::start(&Toml { store: &store, policy, routes, ..Toml::new(upstream.addr) }.render());
    let client = gw.client();
    assert_eq!(client.post_json("/orders", Some("d-1"), ORDER).await.status, 201);
    assert!(client.post_json("/orders", Some("d-1"), ORDER).await.is_replay());
    assert_eq!(client.post_json("/orders", Some("d-1"), r#"{"sku":"B-2"}"#).await.status, 422);
    assert_eq!(client.get("/elsewhere", &[]).await.status, 201);
    assert_eq!(client.post_json("/watched", Some("d-2"), ORDER).await.status, 201);
    // The resolved upstream's lookups run on their own: wait for the first (5 s at most).
    for _ in 0..50 {
        let reply = Client::new(gw.admin).get("/metrics", &[]).await;
        assert_eq!(reply.status, 200);
        let text = String::from_utf8(reply.body.to_vec()).unwrap();
        if text.contains("idemgate_upstream_lookups_total{") {
            return text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no lookup of the resolved upstream's name within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_name_only_exported_metrics() {
    let exposition = scrape_gateway().await;
    let exported = exported_series(&exposition);
    assert!(exported.iter().any(|n| n.starts_with("idemgate_")), "no idemgate metric in\n{exposition}");

    let dashboard = dashboard();
    let rules = rules();
    let mut queries = panel_exprs(&dashboard);
    queries.extend(variable_queries(&dashboard));
    let dashboard_queries = queries.len();
    queries.extend(rule_exprs(&rules));

    let mut used = BTreeSet::new();
    let mut missing = Vec::new();
    for (at, expr) in &queries {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                let known: Vec<&String> = exported.iter().filter(|e| family_of(e) == family_of(&name)).collect();
                missing.push(format!("{at}: {name} (the gateway exports {known:?} of that family)"));
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard or the rules name metrics the gateway does not export:\n  {}\n\nexported: {exported:#?}",
        missing.join("\n  ")
    );
    assert!(dashboard_queries > 0 && used.len() > 10, "too few queries checked: {used:?}");
    // What observing counts has its row, and its alert.
    let titles: Vec<&str> =
        dashboard["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    assert!(titles.contains(&"What enforcement would change"), "{titles:?}");
    let on_board: BTreeSet<String> = panel_exprs(&dashboard).iter().flat_map(|(_, e)| metric_names(e)).collect();
    assert!(on_board.contains("idemgate_observed_total"), "the board does not show idemgate_observed_total");
    let in_rules: BTreeSet<String> = rule_exprs(&rules).iter().flat_map(|(_, e)| metric_names(e)).collect();
    assert!(in_rules.contains("idemgate_observed_total"), "no rule reads idemgate_observed_total");
    // The upstream instances have their row.
    assert!(titles.contains(&"Upstream instances"), "{titles:?}");
    for name in [
        "idemgate_upstream_instance_requests_total",
        "idemgate_upstream_instance_failures_total",
        "idemgate_upstream_lookups_total",
    ] {
        assert!(on_board.contains(name), "the board does not show {name}");
    }
}

#[test]
fn every_panel_and_rule_has_a_query_and_every_alert_a_runbook() {
    let dashboard = dashboard();
    let rules = rules();
    let mut problems = Vec::new();

    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("<untitled>");
        if panel["targets"].as_array().is_none_or(Vec::is_empty) {
            problems.push(format!("panel {title:?} has no targets"));
        }
    }
    for (at, expr) in panel_exprs(&dashboard).into_iter().chain(variable_queries(&dashboard)).chain(rule_exprs(&rules))
    {
        if expr.trim().is_empty() {
            problems.push(format!("{at}: empty expr"));
        }
    }
    let route_var = variable_queries(&dashboard).into_iter().find(|(at, _)| at == "variable \"route\"");
    match route_var {
        Some((_, query)) if query == "label_values(idemgate_requests_total, route)" => {}
        other => problems.push(format!("the `route` variable is {other:?}")),
    }

    let base = runbook_base();
    let anchors = heading_anchors(&repo_file(OPERATIONS));
    let alerts: Vec<&Yaml> = rule_list(&rules).into_iter().filter(|r| r["alert"].is_string()).collect();
    if alerts.is_empty() {
        problems.push(format!("{RULES} has no alert"));
    }
    for rule in alerts {
        let name = rule_name(rule);
        if rule["for"].as_str().is_none() {
            problems.push(format!("alert {name}: no `for`"));
        }
        if rule["labels"]["severity"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("alert {name}: no labels.severity"));
        }
        for field in ["summary", "description"] {
            if rule["annotations"][field].as_str().is_none_or(|s| s.trim().is_empty()) {
                problems.push(format!("alert {name}: no annotations.{field}"));
            }
        }
        match rule["annotations"]["runbook_url"].as_str() {
            None => problems.push(format!("alert {name}: no annotations.runbook_url")),
            Some(url) => match url.strip_prefix(&base) {
                None => problems.push(format!("alert {name}: runbook_url {url} is not under {base}")),
                Some(anchor) if !anchors.contains(anchor) => {
                    problems.push(format!("alert {name}: {OPERATIONS} has no heading #{anchor}"))
                }
                Some(_) => {}
            },
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn names_and_anchors_are_read_as_prometheus_and_github_do() {
    assert_eq!(
        metric_names(r#"sum(rate(idemgate_requests_total{job="idemgate"}[5m])) / x_idemgate_y + idemgate_a:b"#),
        BTreeSet::from(["idemgate_requests_total".to_owned(), "idemgate_a:b".to_owned()])
    );
    let exported = exported_series(
        "# TYPE idemgate_requests counter\n# TYPE idemgate_lat histogram\n# TYPE idemgate_up gauge\n\
         idemgate_requests_total{route=\"a\"} 1\n# EOF\n",
    );
    for name in
        ["idemgate_requests_total", "idemgate_lat_bucket", "idemgate_lat_sum", "idemgate_lat_count", "idemgate_up"]
    {
        assert!(exported.contains(name), "{name} in {exported:?}");
    }
    assert!(!exported.contains("idemgate_requests"), "a counter is queried with _total");
    let anchors = heading_anchors("# Ops\n## A key is `stuck`, in unknown\n```sh\n# not a heading\n```\n## Ops\n");
    assert_eq!(anchors, BTreeSet::from(["ops".to_owned(), "a-key-is-stuck-in-unknown".to_owned(), "ops-1".to_owned()]));
}
