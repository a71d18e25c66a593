//! The chaos suite: tries hard to make the gateway run a request twice or lose a response,
//! and checks the upstream's own ledger after each attempt.
//!
//! Every scenario starts its own `redis-server`, gateway processes (the real binary) and a
//! ledger upstream on loopback, and asserts exact counts from the ledger. The suite prints a
//! summary table at the end; `docs/guarantees.md` shows the latest one.
//!
//! ```text
//! cargo test --test chaos              # every scenario
//! cargo test --test chaos -- storm     # scenarios whose name contains "storm"
//! ```

#[path = "../support/mod.rs"]
mod support;

mod common;
mod ledger;
mod scenarios;

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

/// A scenario must finish within this, or it fails.
const SCENARIO_LIMIT: Duration = Duration::from_secs(180);

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let mut rows = Vec::new();
    for (name, scenario) in scenarios::ALL {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        eprintln!("chaos: {name} ...");
        let started = Instant::now();
        let outcome = runtime.block_on(async {
            AssertUnwindSafe(tokio::time::timeout(SCENARIO_LIMIT, scenario())).catch_unwind().await
        });
        let seconds = started.elapsed().as_secs_f64();
        let (report, verdict) = match outcome {
            Ok(Ok(report)) => (report, "pass".to_owned()),
            Ok(Err(_)) => (common::Report::default(), format!("FAIL: over {}s", SCENARIO_LIMIT.as_secs())),
            Err(panic) => (common::Report::default(), format!("FAIL: {}", panic_message(&panic))),
        };
        eprintln!("chaos: {name}: {verdict} ({seconds:.1}s)");
        rows.push((*name, report, verdict, seconds));
    }
    print_table(&rows);
    let passed = rows.iter().filter(|(_, _, verdict, _)| verdict == "pass").count();
    let failed = rows.len() - passed;
    let filtered = scenarios::ALL.len() - rows.len();
    let seconds: f64 = rows.iter().map(|(_, _, _, s)| s).sum();
    // libtest's summary line, so that whatever sums cargo's summaries counts these too.
    println!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered} filtered out; finished in {seconds:.2}s",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panic".into());
    text.lines().next().unwrap_or("").chars().take(120).collect()
}

fn print_table(rows: &[(&str, common::Report, String, f64)]) {
    println!();
    println!(
        "| scenario | requests | upstream executions | duplicates caught by the backstop | client errors | result | seconds | what it shows |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|---|");
    for (name, r, verdict, seconds) in rows {
        println!(
            "| {name} | {} | {} | {} | {} | {verdict} | {seconds:.1} | {} |",
            r.requests, r.executions, r.caught, r.errors, r.note
        );
    }
    println!();
}
