//! The access log: one line per request, with where its time went.
//!
//! The line names the route, method, outcome, status and, on idempotent routes, the attempt,
//! the time spent upstream, in store calls and (a duplicate) waiting for the request holding
//! its key, and a short prefix of the record's hash, so that an operator can follow one key
//! across gateways. Never the key itself or a credential. Times are in milliseconds, to the
//! microsecond.
//!
//! It is a `tracing` event (target `idemgate::access`), filtered like every other line. In
//! the binary, though, the line is formatted here, in the shape the log subscriber would give
//! it (JSON or uncoloured text, see [`format_line`]), into a buffer each thread reuses, and
//! handed to the log writer's buffer (`log_writer`): the subscriber's generic formatting,
//! field by field through `fmt::Debug`, cost more than the rest of a pass-through request.
//! A test holds the two shapes equal.

use std::cell::RefCell;
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};

use crate::log_writer::AccessFormat;
use crate::metrics::Outcome;

/// What the idempotent path learned about a request, for its access line.
#[derive(Debug, Default)]
pub struct Notes {
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
    /// On a route in observe mode: what enforcement would have done.
    pub observed: Option<crate::metrics::Would>,
    /// The request's span, when it is traced (`[telemetry]`); its phases add theirs below it.
    pub span: Option<crate::telemetry::RequestSpan>,
}

/// Writes the access line of one request (target `idemgate::access`, level info).
pub fn log(route: &str, method: &Method, outcome: Outcome, status: StatusCode, total: Duration, notes: &Notes) {
    if !tracing::enabled!(target: "idemgate::access", tracing::Level::INFO) {
        return;
    }
    let Some(format) = crate::log_writer::access_format() else {
        return event(route, method, outcome, status, total, notes);
    };
    thread_local! {
        static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
    }
    LINE.with(|line| {
        // Not re-entered: nothing below logs.
        let Ok(mut line) = line.try_borrow_mut() else { return };
        line.clear();
        format_line(&mut line, format, SystemTime::now(), route, method, outcome, status, total, notes);
        crate::log_writer::write_access_line(&line);
    });
}

/// The access line as a `tracing` event, for the log subscriber to format.
fn event(route: &str, method: &Method, outcome: Outcome, status: StatusCode, total: Duration, notes: &Notes) {
    let ms = millis;
    tracing::info!(
        target: "idemgate::access",
        route,
        method = %method,
        outcome = outcome.as_str(),
        would = notes.observed.map(crate::metrics::Would::as_str),
        status = status.as_u16(),
        attempt = notes.attempt,
        total_ms = ms(total),
        upstream_ms = notes.upstream.map(ms),
        store_ms = ms(notes.store),
        wait_ms = ms(notes.wait),
        record = notes.record.as_deref(),
        "request"
    );
}

/// Formats one access line, newline included, exactly as the log subscriber formats the
/// [`event`] (JSON with the event's fields flattened, or text without colours).
#[allow(clippy::too_many_arguments)] // the access line's fields, as `log` has them
fn format_line(
    out: &mut Vec<u8>,
    format: AccessFormat,
    now: SystemTime,
    route: &str,
    method: &Method,
    outcome: Outcome,
    status: StatusCode,
    total: Duration,
    notes: &Notes,
) {
    // One sequence of fields, compiled once per format (the format is a constant in each).
    if format == AccessFormat::Json {
        out.extend_from_slice(b"{\"timestamp\":\"");
        timestamp(out, now);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"request\"");
        fields(&mut Fields::<true> { out }, route, method, outcome, status, notes, total);
        out.extend_from_slice(b",\"target\":\"idemgate::access\"}\n");
    } else {
        timestamp(out, now);
        out.extend_from_slice(b"  INFO idemgate::access: request");
        fields(&mut Fields::<false> { out }, route, method, outcome, status, notes, total);
        out.push(b'\n');
    }
}

fn fields<const JSON: bool>(
    line: &mut Fields<'_, JSON>,
    route: &str,
    method: &Method,
    outcome: Outcome,
    status: StatusCode,
    notes: &Notes,
    total: Duration,
) {
    let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    line.quoted("route", route);
    line.displayed("method", method.as_str());
    line.word("outcome", outcome.as_str());
    if let Some(would) = notes.observed {
        line.word("would", would.as_str());
    }
    line.number("status", u64::from(status.as_u16()));
    if let Some(attempt) = notes.attempt {
        line.number("attempt", u64::from(attempt));
    }
    line.millis("total_ms", micros(total));
    if let Some(upstream) = notes.upstream {
        line.millis("upstream_ms", micros(upstream));
    }
    line.millis("store_ms", micros(notes.store));
    line.millis("wait_ms", micros(notes.wait));
    if let Some(record) = &notes.record {
        line.quoted("record", record);
    }
}

/// The fields of a line, written as the subscriber writes them in each format: `,"key":value`
/// in JSON, ` key=value` in text.
struct Fields<'a, const JSON: bool> {
    out: &'a mut Vec<u8>,
}

impl<const JSON: bool> Fields<'_, JSON> {
    fn key(&mut self, key: &str) {
        if JSON {
            self.out.extend_from_slice(b",\"");
            self.out.extend_from_slice(key.as_bytes());
            self.out.extend_from_slice(b"\":");
        } else {
            self.out.push(b' ');
            self.out.extend_from_slice(key.as_bytes());
            self.out.push(b'=');
        }
    }

    /// A string field (`fmt::Debug` in text, a JSON string in JSON).
    fn quoted(&mut self, key: &str, value: &str) {
        self.key(key);
        if JSON { json_str(self.out, value) } else { debug_str(self.out, value) }
    }

    /// A field recorded with `%` (`fmt::Display`: bare in text, a JSON string in JSON).
    fn displayed(&mut self, key: &str, value: &str) {
        self.key(key);
        if JSON { json_str(self.out, value) } else { self.out.extend_from_slice(value.as_bytes()) }
    }

    /// A string field known to need no escaping (an outcome label).
    fn word(&mut self, key: &str, value: &str) {
        self.key(key);
        self.out.push(b'"');
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(b'"');
    }

    fn number(&mut self, key: &str, value: u64) {
        self.key(key);
        number(self.out, value);
    }

    fn millis(&mut self, key: &str, micros: u64) {
        self.key(key);
        millis_text(self.out, micros);
    }
}

/// `2026-12-02T04:16:12.174250Z`, as the subscriber's timer writes it. The part up to the
/// second is computed once a second per thread.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    thread_local! {
        static SECOND: RefCell<(u64, [u8; 20])> = const { RefCell::new((u64::MAX, [0; 20])) };
    }
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            let mut text = Vec::with_capacity(20);
            let days = i64::try_from(secs / 86_400).unwrap_or(0);
            let (year, month, day) = civil_from_days(days);
            let rest = secs % 86_400;
            let _ = std::io::Write::write_fmt(
                &mut text,
                format_args!(
                    "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.",
                    rest / 3600,
                    rest / 60 % 60,
                    rest % 60
                ),
            );
            if let Ok(prefix) = <[u8; 20]>::try_from(text.as_slice()) {
                *cached = (secs, prefix);
            } else {
                // A year past 9999: not worth a cache.
                out.extend_from_slice(&text);
                digits(out, u64::from(since.subsec_micros()), 6);
                out.push(b'Z');
                return;
            }
        }
        out.extend_from_slice(&cached.1);
        digits(out, u64::from(since.subsec_micros()), 6);
        out.push(b'Z');
    });
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, u32::try_from(month).unwrap_or(1), u32::try_from(day).unwrap_or(1))
}

/// `n` in decimal.
fn number(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// `n` in exactly `width` decimal digits, zero-padded.
fn digits(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for i in (start..start + width).rev() {
        out[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Microseconds as the milliseconds that [`millis`] gives print, in `Debug` and in JSON:
/// `96.655`, `10.86`, `0.7`, `2000.0` (checked against both by a test).
fn millis_text(out: &mut Vec<u8>, micros: u64) {
    number(out, micros / 1000);
    out.push(b'.');
    let mut frac = micros % 1000;
    if frac == 0 {
        out.push(b'0');
        return;
    }
    let mut width = 3;
    while frac.is_multiple_of(10) {
        frac /= 10;
        width -= 1;
    }
    digits(out, frac, width);
}

/// A string as `fmt::Debug` writes it (quoted, escaped), as the text format records it.
fn debug_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = std::io::Write::write_fmt(out, format_args!("{s:?}"));
    }
}

/// A string as a JSON string, escaped as `serde_json` escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
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
    use std::sync::{Arc, Mutex};

    /// What the log subscriber writes for the [`event`], as the binary configures it.
    fn through_tracing(json: bool, emit: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let out = Arc::clone(&out);
            move || Sink(Arc::clone(&out))
        };
        let builder = tracing_subscriber::fmt().with_writer(writer).with_ansi(false);
        if json {
            tracing::subscriber::with_default(
                builder.json().flatten_event(true).with_current_span(false).finish(),
                emit,
            );
        } else {
            tracing::subscriber::with_default(builder.finish(), emit);
        }
        let text = out.lock().expect("sink").clone();
        String::from_utf8(text).expect("utf-8")
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The line without its timestamp (the two are taken at different instants).
    fn untimed(line: &str) -> String {
        let at = line.find("Z").expect("a timestamp");
        let start = line.find("20").expect("a year");
        format!("{}{}", &line[..start], &line[at + 1..])
    }

    #[test]
    fn lines_formatted_here_read_exactly_as_the_subscriber_writes_them() {
        let full = Notes {
            record: Some("4b2e730956a5".into()),
            attempt: Some(2),
            store: Duration::from_micros(369),
            wait: Duration::from_micros(2_000_000),
            upstream: Some(Duration::from_micros(96_655)),
            observed: None,
            span: None,
        };
        let observed = Notes { observed: Some(crate::metrics::Would::Conflict), ..Notes::default() };
        let bare = Notes::default();
        let odd = Notes { record: Some("quote\" and \\ and \u{1}".into()), ..Notes::default() };
        let cases: [(&str, Method, Outcome, u16, u64, &Notes); 5] = [
            ("orders", Method::POST, Outcome::Observed, 201, 3_100, &observed),
            ("orders", Method::POST, Outcome::Executed, 201, 710, &full),
            ("pass", Method::GET, Outcome::PassedThrough, 200, 0, &bare),
            ("ünïcode \"route\"\t", Method::from_bytes(b"PURGE").expect("method"), Outcome::Rejected, 400, 21, &odd),
            ("orders", Method::PUT, Outcome::Replayed, 200, 10_860, &full),
        ];
        for (route, method, outcome, status, micros, notes) in cases {
            let status = StatusCode::from_u16(status).expect("status");
            let total = Duration::from_micros(micros);
            for (json, format) in [(true, AccessFormat::Json), (false, AccessFormat::Text)] {
                let theirs = through_tracing(json, || event(route, &method, outcome, status, total, notes));
                let mut ours = Vec::new();
                format_line(&mut ours, format, SystemTime::now(), route, &method, outcome, status, total, notes);
                let ours = String::from_utf8(ours).expect("utf-8");
                assert_eq!(untimed(&ours), untimed(&theirs), "{format:?}");
                assert!(ours.ends_with('\n'));
            }
        }
    }

    #[test]
    fn timestamps_read_as_the_subscriber_writes_them() {
        for (secs, micros, text) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_825_600, 7, "2000-02-29T12:00:00.000007Z"),
            (1_796_185_329, 216_141, "2026-12-02T04:22:09.216141Z"),
            (4_107_542_399, 999_999, "2100-02-28T23:59:59.999999Z"),
        ] {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros);
            let mut out = Vec::new();
            timestamp(&mut out, at);
            assert_eq!(String::from_utf8(out).expect("utf-8"), text);
        }
    }

    #[test]
    fn milliseconds_formatted_here_read_as_debug_and_json_print_them() {
        for micros in (0..20_000u64).chain([1_000_000, 2_000_000, 123_456_789, 999_999_999_999]) {
            let mut ours = Vec::new();
            millis_text(&mut ours, micros);
            let ours = String::from_utf8(ours).expect("utf-8");
            let value = millis(Duration::from_micros(micros));
            assert_eq!(ours, format!("{value:?}"), "{micros} µs");
            assert_eq!(ours, serde_json::json!(value).to_string(), "{micros} µs");
        }
    }

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
