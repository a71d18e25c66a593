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
//! What a gateway answers is read as hostile input ([`exposition`]): every label printed is
//! escaped, every sum checked, a series given twice refused.
//!
//! Exit status: 0 done, 1 a gateway could not be read, 2 unusable input.

mod exposition;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use self::exposition::{Series, escaped};
use crate::keys::client::{AdminClient, AdminUrl, admin_url_of, parse_admin_url, problem_line};
use crate::keys::failure::Failure;

/// The counters the report reads, and the label each is counted by besides `route`.
const OBSERVED_TOTAL: &str = "idemgate_observed_total";
const REQUESTS_TOTAL: &str = "idemgate_requests_total";

/// The `report` command line.
#[derive(Args)]
#[command(after_help = "\
Reads /metrics, which needs no token. Counts run from each gateway's start.
Exit status: 0 done, 1 a gateway could not be read, 2 unusable input.")]
pub struct ReportArgs {
    #[command(flatten)]
    gateways: Gateways,
    /// Only this route.
    #[arg(long, value_name = "ROUTE")]
    route: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The gateways to read: `--admin` (repeated), `--config`, or both; at least one.
#[derive(Args)]
#[group(id = "gateways", required = true, multiple = true)]
struct Gateways {
    /// A gateway's admin listener, e.g. http://127.0.0.1:9090; repeat it for each gateway of a
    /// fleet (their counts are summed).
    #[arg(long, value_name = "URL", value_parser = parse_admin_url)]
    admin: Vec<AdminUrl>,
    /// Read a gateway's admin listener from its configuration file (server.admin_listen;
    /// 0.0.0.0 and [::] mean this machine), as `idemgate keys --config` does; with --admin,
    /// one gateway more.
    #[arg(long, short, value_name = "PATH")]
    config: Option<std::path::PathBuf>,
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
    let mut gateways: Vec<AdminUrl> = args.gateways.admin.clone();
    if let Some(path) = &args.gateways.config {
        gateways.push(admin_url_of(path)?);
    }
    for url in &gateways {
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
    let mut routes = counts.routes().map_err(Failure::Failed)?;
    if let Some(only) = &args.route {
        if !routes.contains_key(only.as_str()) {
            let known: Vec<String> = routes.keys().map(|name| escaped(name)).collect();
            return Err(Failure::Failed(format!(
                "no idempotent route {only:?} in the gateways' counters (they have: {})",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        }
        routes.retain(|name, _| name == only);
    }
    let gateways = gateways.len();
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
    Observing(&'a BTreeMap<String, u64>, Summary),
    /// An enforcing route: its requests in all, and those that passed without a key.
    Enforcing {
        requests: u64,
        keyless: u64,
    },
}

impl Counts {
    /// Adds one gateway's `/metrics` (Prometheus text format), refusing it whole when it is
    /// not what a gateway writes (see [`exposition`]) or a sum would pass 2^64 - 1.
    fn add(&mut self, text: &str) -> Result<(), String> {
        // Every gateway exports some (`idemgate_unmatched_requests_total` at least).
        if !text.lines().any(|l| l.starts_with("idemgate_")) {
            return Err("no idemgate metric in the answer: is this a gateway's admin listener?".into());
        }
        for sample in exposition::read(text, &[OBSERVED_TOTAL, REQUESTS_TOTAL])? {
            let series = &sample.series;
            let (into, label) = if series.name() == OBSERVED_TOTAL {
                (&mut self.observed, "would")
            } else {
                (&mut self.requests, "outcome")
            };
            let (Some(route), Some(value)) = (series.label("route"), series.label(label)) else {
                return Err(format!("{series}: a sample without its route and {label} labels"));
            };
            let sum = into.entry(route.to_owned()).or_default().entry(value.to_owned()).or_default();
            // Unchecked, 2049 counts of 2^53 - 1 wrapped and printed as a small number.
            *sum = sum.checked_add(sample.value).ok_or_else(|| {
                format!("{series}: the sum of its route's {label} counts passes 2^64 - 1, which no gateway counts to")
            })?;
        }
        Ok(())
    }

    /// Every idempotent route: observing ones (with observed counts), and enforcing ones (with
    /// an `executed` series, which only an idempotent route has). A sum past 2^64 - 1 is
    /// refused, naming the route's series.
    fn routes(&self) -> Result<BTreeMap<String, Route<'_>>, String> {
        let mut out = BTreeMap::new();
        for (name, outcomes) in &self.requests {
            if outcomes.contains_key("executed") {
                let requests = checked_sum(outcomes.values().copied())
                    .ok_or_else(|| too_large(REQUESTS_TOTAL, name, "its outcomes"))?;
                let keyless = outcomes.get("passed_through").copied().unwrap_or(0);
                out.insert(name.clone(), Route::Enforcing { requests, keyless });
            }
        }
        for (name, observed) in &self.observed {
            let summary = summary(observed).ok_or_else(|| too_large(OBSERVED_TOTAL, name, "what it observed"))?;
            out.insert(name.clone(), Route::Observing(observed, summary));
        }
        Ok(out)
    }
}

fn checked_sum(counts: impl IntoIterator<Item = u64>) -> Option<u64> {
    counts.into_iter().try_fold(0u64, u64::checked_add)
}

fn too_large(metric: &str, route: &str, what: &str) -> String {
    let series = Series::named(metric, &[("route", route)]);
    format!("{series}: the sum of {what} passes 2^64 - 1, which no gateway counts to")
}

/// What an observing route's counts add up to.
struct Summary {
    requests: u64,
    saved: u64,
    refused: u64,
    keyless: u64,
}

/// What `observed` adds up to; `None` when a sum passes 2^64 - 1.
fn summary(observed: &BTreeMap<String, u64>) -> Option<Summary> {
    let n = |label: &str| observed.get(label).copied().unwrap_or(0);
    Some(Summary {
        requests: checked_sum(OBSERVED.iter().map(|(label, _)| n(label)))?,
        saved: checked_sum(["would_replay", "would_conflict", "would_answer_unknown"].map(n))?,
        refused: checked_sum(
            [
                "would_reject_reuse",
                "would_throttle",
                "malformed_key",
                "missing_scope",
                "unsafe_headers",
                "too_large",
                "unread_body",
            ]
            .map(n),
        )?,
        keyless: n("missing_key"),
    })
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
            // The name as the answer gave it, escaped: a newline in it printed a line of its own.
            Route::Observing(observed, s) => {
                let _ = writeln!(out, "\nroute {}: observing, {} requests", escaped(name), s.requests);
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
                let _ = writeln!(out, "\nroute {}: enforcing, {requests} requests", escaped(name));
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
            // JSON escapes control characters itself; the name stays the answer's, for scripts.
            Route::Observing(observed, s) => {
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
    fn two_gateways_are_summed_and_each_route_reported_as_it_runs() {
        let mut counts = Counts::default();
        counts.add(ONE).unwrap();
        counts.add(ONE).unwrap();
        let routes = counts.routes().unwrap();
        assert_eq!(routes.keys().collect::<Vec<_>>(), ["orders", "pay"], "a plain route is not reported");
        let Route::Observing(_, s) = &routes["orders"] else { panic!("orders observes") };
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
        let e = counts.add("idemgate_observed_total{would=\"first\"} 1").unwrap_err();
        assert_eq!(e, "idemgate_observed_total{would=\"first\"}: a sample without its route and would labels");
        assert!(counts.add("idemgate_observed_total{route=\"r\",would=\"first\"} -1").is_err());
    }

    /// Each count is below 2^53, and their sums are checked: over the gateways, over a
    /// route's outcomes, and in what an observing route adds up to.
    #[test]
    fn a_sum_past_what_a_u64_holds_is_refused_naming_its_series() {
        let max = (1u64 << 53) - 1;
        let mut counts = Counts::default();
        let one = format!("idemgate_observed_total{{route=\"r\",would=\"first\"}} {max}\n");
        for _ in 0..2048 {
            counts.add(&one).unwrap();
        }
        let e = counts.add(&one).unwrap_err();
        assert!(e.starts_with("idemgate_observed_total{route=\"r\",would=\"first\"}: the sum"), "{e}");

        let mut counts = Counts::default();
        for _ in 0..1100 {
            let labels = ["first", "would_replay"]
                .map(|w| format!("idemgate_observed_total{{route=\"r\",would=\"{w}\"}} {max}"));
            counts.add(&labels.join("\n")).unwrap();
        }
        let e = counts.routes().err().unwrap_or_default();
        assert!(e.starts_with("idemgate_observed_total{route=\"r\"}: the sum of what it observed"), "{e}");

        let mut counts = Counts::default();
        for _ in 0..1100 {
            let labels = ["executed", "replayed"]
                .map(|o| format!("idemgate_requests_total{{route=\"p\",outcome=\"{o}\"}} {max}"));
            counts.add(&labels.join("\n")).unwrap();
        }
        let e = counts.routes().err().unwrap_or_default();
        assert!(e.starts_with("idemgate_requests_total{route=\"p\"}: the sum of its outcomes"), "{e}");
    }

    #[test]
    fn route_names_from_the_answer_are_printed_escaped() {
        let mut counts = Counts::default();
        let forged = "idemgate_observed_total{route=\"pay\\nroute payments: observing, 0 requests\u{1b}[2J\",would=\"first\"} 5\n\
                      idemgate_requests_total{route=\"x\\ny\",outcome=\"executed\"} 1\n";
        counts.add(forged).unwrap();
        let routes = counts.routes().unwrap();
        let text = text_report(&routes, 1);
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(!text.lines().any(|l| l.starts_with("route payments")), "{text}");
        assert!(
            text.contains(r"route pay\nroute payments: observing, 0 requests\u{1b}[2J: observing, 5 requests"),
            "{text}"
        );
        assert!(text.contains(r"route x\ny: enforcing, 1 requests"), "{text}");
        let doc: Value = serde_json::from_str(&json_report(&routes, 1)).unwrap();
        assert_eq!(
            doc["routes"][0]["route"], "pay\nroute payments: observing, 0 requests\u{1b}[2J",
            "JSON keeps the name"
        );
    }
}
