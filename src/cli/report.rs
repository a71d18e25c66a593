//! `idemgate report`: what enforcement would change, per route, from the counters of one or
//! more running gateways (their admin listeners' `/metrics`, summed), for an operator to
//! paste into a change request before enforcing on a live API.
//!
//! A route that observes (`mode = "observe"`) reports what each request would have met:
//! first requests, retries that would have been replayed instead of run again, duplicates
//! that ran beside the first, reused keys, requests without a key or with one enforcement
//! refuses. A route that enforces with `required = false` reports its share of keyless
//! requests, which says when its clients are ready for `required = true`. The counts run
//! from each gateway's start; docs/operations.md gives the PromQL for time windows.
//!
//! Exit status: 0 done, 1 a gateway could not be read, 2 unusable input.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use crate::keys::client::{AdminClient, AdminUrl, parse_admin_url, problem_line};
use crate::keys::failure::Failure;

/// The `report` command line.
#[derive(Args)]
#[command(after_help = "\
Reads /metrics, which needs no token. Counts run from each gateway's start.
Exit status: 0 done, 1 a gateway could not be read, 2 unusable input.")]
pub struct ReportArgs {
    /// A gateway's admin listener, e.g. http://127.0.0.1:9090; repeat it for each gateway of a
    /// fleet (their counts are summed).
    #[arg(long, value_name = "URL", required = true, value_parser = parse_admin_url)]
    admin: Vec<AdminUrl>,
    /// Only this route.
    #[arg(long, value_name = "ROUTE")]
    route: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// What each request on an observing route would have met, in the order the report lists
/// them: the label of `idemgate_observed_total`, and what enforcement does with it.
const OBSERVED: &[(&str, &str)] = &[
    ("first", "first requests: run, as enforcement runs them"),
    ("would_replay", "retries after an answer: replayed instead of run again"),
    ("would_conflict", "duplicates while the first ran: wait for its answer instead of running"),
    ("would_answer_unknown", "retries of an unknown outcome: 502 or a lookup instead of running"),
    ("would_reject_reuse", "keys reused for another request: 422"),
    ("would_throttle", "new keys past the caller's max_new_keys: 429"),
    ("missing_key", "without a key: 400 with required = true, passed through without"),
    ("malformed_key", "with a key enforcement refuses: 400 key-malformed"),
    ("missing_scope", "keyed, without the caller's scope: 400 scope-missing"),
    ("unsafe_headers", "Connection naming a header the route reads, or an upgrade: 400"),
    ("too_large", "bodies over max_request_body: 413"),
    ("unread_body", "bodies not read in time or broken off: 408 or 400"),
    ("store_error", "claims the store failed: forwarded (enforcement: on_store_error)"),
];

/// Counted beside the above, on some of the same requests.
const ALSO: &[(&str, &str)] = &[
    ("answer_differed", "duplicates the upstream answered differently from the first"),
    ("unknown_outcome", "first requests sent without a complete answer (key released)"),
];

/// Runs `idemgate report` and prints its outcome.
pub fn run(args: ReportArgs) -> ExitCode {
    match execute(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(message)) => {
            eprintln!("idemgate report: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(message)) => {
            eprintln!("idemgate report: {message}");
            ExitCode::FAILURE
        }
    }
}

fn execute(args: &ReportArgs) -> Result<String, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))?;
    let mut counts = Counts::default();
    for url in &args.admin {
        let client = AdminClient::anonymous(url)?;
        let answer = runtime.block_on(client.get("/metrics"))?;
        if !answer.status.is_success() {
            let doc = serde_json::from_slice::<Value>(&answer.body).ok();
            return Err(Failure::Failed(format!(
                "{url}/metrics: {}",
                problem_line(answer.status, doc.as_ref(), &answer.body)
            )));
        }
        let text = std::str::from_utf8(&answer.body)
            .map_err(|_| Failure::Failed(format!("{url}/metrics is not text: is {url} an admin listener?")))?;
        counts.add(text).map_err(|e| Failure::Failed(format!("{url}/metrics: {e}")))?;
    }
    let mut routes = counts.routes();
    if let Some(only) = &args.route {
        if !routes.contains_key(only.as_str()) {
            let known: Vec<&str> = routes.keys().map(String::as_str).collect();
            return Err(Failure::Failed(format!(
                "no idempotent route {only:?} in the gateways' counters (they have: {})",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        }
        routes.retain(|name, _| name == only);
    }
    let gateways = args.admin.len();
    Ok(if args.json { json_report(&routes, gateways) } else { text_report(&routes, gateways) })
}

/// The counters the report reads, summed over the gateways.
#[derive(Default)]
struct Counts {
    /// route → would → count.
    observed: BTreeMap<String, BTreeMap<String, u64>>,
    /// route → outcome → count.
    requests: BTreeMap<String, BTreeMap<String, u64>>,
}

/// One route's part of the report.
enum Route<'a> {
    Observing(&'a BTreeMap<String, u64>),
    /// An enforcing route: its requests in all, and those that passed without a key.
    Enforcing {
        requests: u64,
        keyless: u64,
    },
}

impl Counts {
    /// Adds one gateway's `/metrics` (Prometheus text format).
    fn add(&mut self, text: &str) -> Result<(), String> {
        // Every gateway exports some (`idemgate_unmatched_requests_total` at least).
        if !text.lines().any(|l| l.starts_with("idemgate_")) {
            return Err("no idemgate metric in the answer: is this a gateway's admin listener?".into());
        }
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let Some(sample) = Sample::parse(line) else { continue };
            let into = match sample.name {
                "idemgate_observed_total" => &mut self.observed,
                "idemgate_requests_total" => &mut self.requests,
                _ => continue,
            };
            let label = if sample.name == "idemgate_observed_total" { "would" } else { "outcome" };
            let (Some(route), Some(value)) = (sample.label("route"), sample.label(label)) else {
                return Err(format!("a sample without its labels: {line}"));
            };
            // Counters are whole numbers; a float that is not one is a sign of another exporter.
            if !(sample.value >= 0.0 && sample.value.fract() == 0.0 && sample.value < 2f64.powi(53)) {
                return Err(format!("not a count: {line}"));
            }
            *into.entry(route).or_default().entry(value).or_default() += sample.value as u64;
        }
        Ok(())
    }

    /// Every idempotent route: observing ones (with observed counts), and enforcing ones (with
    /// an `executed` series, which only an idempotent route has).
    fn routes(&self) -> BTreeMap<String, Route<'_>> {
        let mut out = BTreeMap::new();
        for (name, outcomes) in &self.requests {
            if outcomes.contains_key("executed") {
                let requests = outcomes.values().sum();
                let keyless = outcomes.get("passed_through").copied().unwrap_or(0);
                out.insert(name.clone(), Route::Enforcing { requests, keyless });
            }
        }
        for (name, observed) in &self.observed {
            out.insert(name.clone(), Route::Observing(observed));
        }
        out
    }
}

/// What an observing route's counts add up to.
struct Summary {
    requests: u64,
    saved: u64,
    refused: u64,
    keyless: u64,
}

fn summary(observed: &BTreeMap<String, u64>) -> Summary {
    let n = |label: &str| observed.get(label).copied().unwrap_or(0);
    Summary {
        requests: OBSERVED.iter().map(|(label, _)| n(label)).sum(),
        saved: n("would_replay") + n("would_conflict") + n("would_answer_unknown"),
        refused: [
            "would_reject_reuse",
            "would_throttle",
            "malformed_key",
            "missing_scope",
            "unsafe_headers",
            "too_large",
            "unread_body",
        ]
        .iter()
        .map(|label| n(label))
        .sum(),
        keyless: n("missing_key"),
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

fn text_report(routes: &BTreeMap<String, Route<'_>>, gateways: usize) -> String {
    let mut out = String::new();
    let from = if gateways == 1 { "one gateway".to_owned() } else { format!("{gateways} gateways, summed") };
    let _ = writeln!(out, "What enforcement would change, since each gateway started ({from})");
    if routes.is_empty() {
        out.push_str("\nNo idempotent route in the counters.\n");
    }
    for (name, route) in routes {
        match route {
            Route::Observing(observed) => {
                let s = summary(observed);
                let _ = writeln!(out, "\nroute {name}: observing, {} requests", s.requests);
                for (label, meaning) in OBSERVED.iter().chain(ALSO) {
                    let count = observed.get(*label).copied().unwrap_or(0);
                    let _ = writeln!(out, "  {count:>10}  {label:<22} {meaning}");
                }
                let _ = writeln!(
                    out,
                    "  executions enforcement would have saved: {} ({:.1}% of requests)",
                    s.saved,
                    100.0 * share(s.saved, s.requests)
                );
                let _ = writeln!(
                    out,
                    "  requests enforcement would refuse: {} ({:.1}%), and {} without a key ({:.1}%) with required = true",
                    s.refused,
                    100.0 * share(s.refused, s.requests),
                    s.keyless,
                    100.0 * share(s.keyless, s.requests)
                );
            }
            Route::Enforcing { requests, keyless } => {
                let _ = writeln!(out, "\nroute {name}: enforcing, {requests} requests");
                let _ = writeln!(
                    out,
                    "  without a key: {keyless} ({:.1}%){}",
                    100.0 * share(*keyless, *requests),
                    if *keyless == 0 { "" } else { ", passed through without protection (required = false)" }
                );
            }
        }
    }
    out
}

fn json_report(routes: &BTreeMap<String, Route<'_>>, gateways: usize) -> String {
    let routes: Vec<Value> = routes
        .iter()
        .map(|(name, route)| match route {
            Route::Observing(observed) => {
                let s = summary(observed);
                let counts: serde_json::Map<String, Value> = OBSERVED
                    .iter()
                    .chain(ALSO)
                    .map(|(label, _)| ((*label).to_owned(), json!(observed.get(*label).copied().unwrap_or(0))))
                    .collect();
                json!({
                    "route": name,
                    "mode": "observe",
                    "requests": s.requests,
                    "observed": counts,
                    "saved_executions": s.saved,
                    "would_refuse": s.refused,
                    "keyless": s.keyless,
                    "keyless_share": share(s.keyless, s.requests),
                })
            }
            Route::Enforcing { requests, keyless } => json!({
                "route": name,
                "mode": "enforce",
                "requests": requests,
                "keyless": keyless,
                "keyless_share": share(*keyless, *requests),
            }),
        })
        .collect();
    let mut text = json!({ "gateways": gateways, "routes": routes }).to_string();
    text.push('\n');
    text
}

/// One sample of the Prometheus text format: `name{label="value",...} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => return None,
        };
        let mut labels = Vec::new();
        let mut rest = rest;
        if let Some(mut inside) = rest.strip_prefix('{') {
            loop {
                inside = inside.trim_start_matches([',', ' ']);
                if let Some(after) = inside.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (label, after) = inside.split_once("=\"")?;
                let (value, after) = unescape(after)?;
                labels.push((label.trim(), value));
                inside = after;
            }
        }
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Self { name, labels, value })
    }

    fn label(&self, name: &str) -> Option<String> {
        self.labels.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
    }
}

/// A label value up to its closing quote (`\\`, `\"` and `\n` unescaped), and what follows.
fn unescape(text: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &text[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"# HELP idemgate_observed_total Requests on routes in observe mode
# TYPE idemgate_observed_total counter
idemgate_observed_total{route="orders",would="first"} 90
idemgate_observed_total{route="orders",would="would_replay"} 7
idemgate_observed_total{route="orders",would="would_conflict"} 2
idemgate_observed_total{route="orders",would="missing_key"} 1
idemgate_observed_total{route="orders",would="answer_differed"} 3
idemgate_requests_total{route="orders",outcome="observed"} 100
idemgate_requests_total{route="pay",outcome="executed"} 40
idemgate_requests_total{route="pay",outcome="passed_through"} 10
idemgate_requests_total{route="rest",outcome="passed_through"} 500
idemgate_store_commands_total 12
"#;

    #[test]
    fn samples_parse_with_their_labels() {
        let s = Sample::parse(r#"idemgate_observed_total{route="a\"b",would="first"} 3 1700000000"#).unwrap();
        assert_eq!((s.name, s.value), ("idemgate_observed_total", 3.0));
        assert_eq!(s.label("route").as_deref(), Some("a\"b"));
        let s = Sample::parse("idemgate_store_commands_total 12").unwrap();
        assert_eq!((s.name, s.labels.len(), s.value), ("idemgate_store_commands_total", 0, 12.0));
        for bad in ["", "x{route=\"a} 1", "x{route=\"a\"}", "x{route} 1", "x 1e"] {
            assert!(Sample::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn two_gateways_are_summed_and_each_route_reported_as_it_runs() {
        let mut counts = Counts::default();
        counts.add(ONE).unwrap();
        counts.add(ONE).unwrap();
        let routes = counts.routes();
        assert_eq!(routes.keys().collect::<Vec<_>>(), ["orders", "pay"], "a plain route is not reported");
        let Route::Observing(observed) = &routes["orders"] else { panic!("orders observes") };
        let s = summary(observed);
        assert_eq!((s.requests, s.saved, s.keyless), (200, 18, 2));
        let doc: Value = serde_json::from_str(&json_report(&routes, 2)).unwrap();
        assert_eq!(doc["routes"][0]["observed"]["answer_differed"], 6);
        assert_eq!(doc["routes"][1]["keyless_share"], 0.2);
        let text = text_report(&routes, 2);
        assert!(text.contains("executions enforcement would have saved: 18 (9.0% of requests)"), "{text}");
        assert!(text.contains("without a key: 20 (20.0%)"), "{text}");
    }

    #[test]
    fn what_is_not_a_count_is_refused() {
        let mut counts = Counts::default();
        assert!(counts.add("{\"order_id\":1}").is_err(), "not a gateway's metrics");
        assert!(counts.add("idemgate_observed_total{route=\"r\",would=\"first\"} 1.5").is_err());
        assert!(counts.add("idemgate_observed_total{would=\"first\"} 1").is_err());
        assert!(counts.add("idemgate_observed_total{route=\"r\",would=\"first\"} -1").is_err());
    }
}
