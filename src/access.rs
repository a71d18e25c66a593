//! The access log: one line per request, with where its time went.
//!
//! The line names the route, method, outcome, status and, on idempotent routes, the attempt,
//! the time spent upstream, in store calls and (a duplicate) waiting for the request holding
//! its key, and a short prefix of the record's hash, so that an operator can follow one key
//! across gateways. Never the key itself or a credential. Times are in milliseconds, to the
//! microsecond.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::metrics::Outcome;

/// What the idempotent path learned about a request, for its access line.
#[derive(Debug, Default)]
pub struct Trace {
    /// A short prefix of the record's hash.
    pub record: Option<String>,
    /// The attempt that ran upstream, if one did.
    pub attempt: Option<u32>,
    /// Time spent in store calls before the answer.
    pub store: Duration,
    /// Time a duplicate spent waiting for the request holding its key (not in store calls).
    pub wait: Duration,
    /// Time spent on the upstream exchange, if there was one.
    pub upstream: Option<Duration>,
    /// The request's span, when it is traced (`[telemetry]`); its phases add theirs below it.
    pub span: Option<crate::telemetry::RequestSpan>,
}

/// Writes the access line of one request (target `idemgate::access`, level info).
pub fn log(route: &str, method: &Method, outcome: Outcome, status: StatusCode, total: Duration, trace: &Trace) {
    let ms = millis;
    tracing::info!(
        target: "idemgate::access",
        route,
        method = %method,
        outcome = outcome.as_str(),
        status = status.as_u16(),
        attempt = trace.attempt,
        total_ms = ms(total),
        upstream_ms = trace.upstream.map(ms),
        store_ms = ms(trace.store),
        wait_ms = ms(trace.wait),
        record = trace.record.as_deref(),
        "request"
    );
}

/// Milliseconds to the microsecond: `4.105`, never `4.1057120000000005` (what
/// `as_secs_f64() * 1000.0` prints for 4.105712 ms).
fn millis(d: Duration) -> f64 {
    // Whole microseconds divided by 1000 is the closest f64 to the decimal `N.NNN`, and both
    // formats print the shortest decimal that reads back as it.
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX) as f64 / 1000.0
}

/// A duration for other log lines, for people: `4.1s`, or `250ms` under a second.
pub fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) { format!("{:.1}s", d.as_secs_f64()) } else { format!("{}ms", d.as_millis()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people_are_short() {
        assert_eq!(human(Duration::from_nanos(4_105_712_000)), "4.1s");
        assert_eq!(human(Duration::from_nanos(250_999_999)), "250ms");
        assert_eq!(human(Duration::ZERO), "0ms");
    }

    #[test]
    fn milliseconds_print_with_at_most_three_decimals() {
        assert_eq!(millis(Duration::from_nanos(4_105_712)).to_string(), "4.105");
        assert_eq!(format!("{:?}", millis(Duration::from_nanos(4_105_712))), "4.105");
        assert_eq!(serde_json::json!(millis(Duration::from_micros(700))).to_string(), "0.7");
        assert_eq!(serde_json::json!(millis(Duration::from_secs(2))).to_string(), "2000.0");
        for micros in 0..20_000u64 {
            let text = millis(Duration::from_micros(micros)).to_string();
            let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 3, "{micros} µs printed as {text}");
        }
    }
}
