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
//! CHAOS_LANES=1 cargo test --test chaos # one scenario at a time (default: two at once)
//! ```

#[path = "../support/mod.rs"]
mod support;

mod common;
mod ledger;
mod scenarios;

use std::cell::RefCell;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// A scenario must finish within this, or it fails.
const SCENARIO_LIMIT: Duration = Duration::from_secs(180);
/// The verdict of a scenario this build cannot run (see `common::skip`).
const SKIPPED: &str = "skipped";

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let lanes = match lanes() {
        Ok(lanes) => lanes,
        Err(message) => {
            eprintln!("chaos: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let selected: Vec<_> = scenarios::ALL
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    // Scenarios mostly wait (on failovers, outages, leases), so `lanes` of them run at once,
    // each as its own task, started in the table's order. Each owns its Redis, gateways and
    // ledger on ports of its own, so they share nothing but the machine.
    let began = Instant::now();
    let rows = runtime.block_on(async {
        let permits = Arc::new(Semaphore::new(lanes));
        let runs: Vec<_> = selected
            .iter()
            .map(|&&(name, scenario)| {
                let permits = permits.clone();
                tokio::spawn(async move {
                    let _lane = permits.acquire_owned().await.expect("the semaphore is never closed");
                    eprintln!("chaos: {name} ...");
                    let started = Instant::now();
                    let run = common::SKIPPED.scope(RefCell::new(None), async move {
                        let report = tokio::time::timeout(SCENARIO_LIMIT, scenario()).await;
                        (report, common::SKIPPED.with(|s| s.borrow_mut().take()))
                    });
                    let outcome = tokio::spawn(run).await;
                    let seconds = started.elapsed().as_secs_f64();
                    let (report, verdict) = match outcome {
                        Ok((Ok(report), None)) => (report, "pass".to_owned()),
                        Ok((Ok(report), Some(why))) => (report, format!("{SKIPPED}: {why}")),
                        Ok((Err(_), _)) => {
                            (common::Report::default(), format!("FAIL: over {}s", SCENARIO_LIMIT.as_secs()))
                        }
                        Err(failed) => (common::Report::default(), format!("FAIL: {}", failure_message(failed))),
                    };
                    eprintln!("chaos: {name}: {verdict} ({seconds:.1}s)");
                    (name, report, verdict, seconds)
                })
            })
            .collect();
        let mut rows = Vec::with_capacity(runs.len());
        for run in runs {
            rows.push(run.await.expect("a scenario's runner never panics"));
        }
        rows
    });
    print_table(&rows);
    let passed = rows.iter().filter(|(_, _, verdict, _)| verdict == "pass").count();
    let ignored = rows.iter().filter(|(_, _, verdict, _)| verdict.starts_with(SKIPPED)).count();
    let failed = rows.len() - passed - ignored;
    let filtered = scenarios::ALL.len() - rows.len();
    let seconds = began.elapsed().as_secs_f64();
    // libtest's summary line, so that whatever sums cargo's summaries counts these too.
    println!(
        "test result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out; finished in {seconds:.2}s",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// How many scenarios run at once: `CHAOS_LANES` (1 runs them one by one), 2 by default.
fn lanes() -> Result<usize, String> {
    match std::env::var("CHAOS_LANES") {
        Err(_) => Ok(2),
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if (1..=16).contains(&n) => Ok(n),
            _ => Err(format!("CHAOS_LANES must be a whole number from 1 to 16, not {text:?}")),
        },
    }
}

fn failure_message(failed: tokio::task::JoinError) -> String {
    match failed.try_into_panic() {
        Ok(panic) => panic_message(&panic),
        Err(failed) => failed.to_string(),
    }
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
