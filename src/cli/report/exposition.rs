//! The Prometheus text format as `idemgate report` reads it: hostile input. Whatever answers
//! at the URL an operator gives may be another exporter, a proxy, or a gateway whose labels
//! someone else chose, and what the report prints from it lands on a terminal and in change
//! requests. So:
//!
//! - a label value is only ever printed escaped ([`escaped`]): a newline in a route label
//!   printed a forged report line of its own, and an ESC reached the terminal raw;
//! - a sample of a metric the report counts must be read whole, or the answer is refused
//!   (a line skipped in silence would be a count left out in silence);
//! - a count is a whole number below 2^53 (from there a float no longer holds every whole
//!   number), never NaN, infinite, negative or fractional;
//! - a series (a metric and its label set, in any order) is given once per answer: a repeat
//!   was summed twice (5 + 5 = 10), and 2049 repeats of 2^53 − 1 wrapped past 2^64.

use std::collections::HashSet;
use std::fmt;

/// 2^53: from here on, the float the format writes a count as no longer holds every whole
/// number (2^53 + 1 reads as 2^53).
const EXACT_BELOW: f64 = 9_007_199_254_740_992.0;

/// How much of a line or a value an error quotes.
const QUOTED: usize = 200;

/// `text` as it may be printed: control characters (newline, ESC, ...), the characters that
/// reorder or hide text (bidirectional overrides, zero-width joiners), backslashes and quotes
/// written as Rust escapes (`\n`, `\u{1b}`). Route names a gateway accepts (`A-Z a-z 0-9 - _ .`)
/// are printed as they are.
pub(super) fn escaped(text: &str) -> String {
    text.escape_debug().to_string()
}

/// A bounded, escaped quote of what an answer held, for an error message.
fn quoted(text: &str) -> String {
    let cut: String = text.chars().take(QUOTED).collect();
    let more = if cut.len() < text.len() { "..." } else { "" };
    format!("{}{more}", escaped(&cut))
}

/// A series: a metric and its labels, sorted by name (the order an answer writes them in
/// does not make another series).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

impl Series {
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The series of `name` with only `labels`: for an error about a sum over several series.
    pub(super) fn named(name: &str, labels: &[(&str, &str)]) -> Self {
        let labels = labels.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        Self { name: name.to_owned(), labels }
    }
}

/// `name{label="value",...}`, every part escaped: what errors name a series by.
impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escaped(&self.name))?;
        if self.labels.is_empty() {
            return Ok(());
        }
        let labels: Vec<String> =
            self.labels.iter().map(|(n, v)| format!("{}=\"{}\"", escaped(n), escaped(v))).collect();
        write!(f, "{{{}}}", labels.join(","))
    }
}

/// One sample the report counts.
pub(super) struct Counted {
    pub(super) series: Series,
    pub(super) value: u64,
}

/// Reads one answer: every sample of the metrics named in `wanted`, each a count. Refuses the
/// answer, naming the series or quoting the line, when a series is given twice, a sample of a
/// wanted metric cannot be read, or its value is not a count.
pub(super) fn read(text: &str, wanted: &[&str]) -> Result<Vec<Counted>, String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let wants = wanted.contains(&line.split(['{', ' ', '\t']).next().unwrap_or_default());
        let Some(sample) = Sample::parse(line) else {
            if wants {
                return Err(format!("a sample that cannot be read as the Prometheus text format: {}", quoted(line)));
            }
            // Another exporter's syntax (an exemplar, a line this parser does not know) in a
            // series the report does not count: nothing of it is printed.
            continue;
        };
        let mut labels = sample.labels;
        labels.sort();
        if let Some(pair) = labels.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            let name = escaped(&pair[0].0);
            let series = Series { name: sample.name.to_owned(), labels: labels.clone() };
            return Err(format!("{series}: the label {name} is given twice in one sample"));
        }
        let series = Series { name: sample.name.to_owned(), labels };
        if !seen.insert(series.clone()) {
            return Err(format!(
                "{series} is given twice in one answer: a gateway writes each series once, and which count \
                 is meant (or their sum) cannot be told"
            ));
        }
        if wants {
            let value = count(sample.value).ok_or_else(|| {
                format!("{series}: {} is not a count (a whole number below 2^53)", quoted(sample.value))
            })?;
            out.push(Counted { series, value });
        }
    }
    Ok(out)
}

/// A value that is a count: a whole number below 2^53 (the format writes floats).
fn count(text: &str) -> Option<u64> {
    let value: f64 = text.parse().ok()?;
    // NaN and both infinities are outside the range.
    ((0.0..EXACT_BELOW).contains(&value) && value.fract() == 0.0).then_some(value as u64)
}

/// One sample line: `name{label="value",...} value [timestamp]`, the value as written.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(String, String)>,
    value: &'a str,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let i = line.find(['{', ' ', '\t'])?;
        let (name, mut rest) = line.split_at(i);
        if name.is_empty() {
            return None;
        }
        let mut labels = Vec::new();
        if let Some(mut inside) = rest.strip_prefix('{') {
            loop {
                inside = inside.trim_start_matches([',', ' ']);
                if let Some(after) = inside.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (label, after) = inside.split_once("=\"")?;
                let (value, after) = unescape(after)?;
                labels.push((label.trim().to_owned(), value));
                inside = after;
            }
        }
        let value = rest.split_whitespace().next()?;
        Some(Self { name, labels, value })
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

    const WANTED: &[&str] = &["idemgate_observed_total"];

    fn refused(text: &str) -> String {
        match read(text, WANTED) {
            Ok(samples) => panic!("taken: {} samples of {text:?}", samples.len()),
            Err(e) => e,
        }
    }

    #[test]
    fn samples_parse_with_their_labels() {
        let s = Sample::parse(r#"idemgate_observed_total{route="a\"b",would="first"} 3 1700000000"#).unwrap();
        assert_eq!((s.name, s.value), ("idemgate_observed_total", "3"));
        assert_eq!(s.labels[0], ("route".to_owned(), "a\"b".to_owned()));
        let s = Sample::parse("idemgate_store_commands_total 12").unwrap();
        assert_eq!((s.name, s.labels.len(), s.value), ("idemgate_store_commands_total", 0, "12"));
        for bad in ["", "x", "{a=\"b\"} 1", "x{route=\"a} 1", "x{route=\"a\"}", "x{route} 1"] {
            assert!(Sample::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn only_whole_counts_are_taken() {
        for (value, taken) in
            [("0", Some(0)), ("12", Some(12)), ("1e3", Some(1000)), ("9007199254740991", Some((1 << 53) - 1))]
        {
            assert_eq!(count(value), taken, "{value}");
        }
        for value in
            ["NaN", "nan", "+Inf", "-Inf", "inf", "-1", "1.5", "9007199254740992", "9007199254740993", "1e", "0x10", ""]
        {
            assert_eq!(count(value), None, "{value}");
        }
        let e = refused("idemgate_observed_total{route=\"r\",would=\"first\"} -1\n");
        assert_eq!(
            e,
            "idemgate_observed_total{route=\"r\",would=\"first\"}: -1 is not a count (a whole number below 2^53)"
        );
    }

    #[test]
    fn a_series_is_given_once_whatever_the_order_of_its_labels() {
        let e = refused("x{b=\"2\",a=\"1\"} 1\nx{a=\"1\",b=\"2\"} 1\n");
        assert!(e.starts_with("x{a=\"1\",b=\"2\"} is given twice in one answer"), "{e}");
        let e = refused("idemgate_observed_total{route=\"r\",route=\"s\",would=\"first\"} 1\n");
        assert!(e.contains("the label route is given twice in one sample"), "{e}");
        // The same series in two answers (two gateways) is what the report sums.
        let one = "idemgate_observed_total{route=\"r\",would=\"first\"} 1\n";
        assert!(read(one, WANTED).is_ok() && read(one, WANTED).is_ok());
        // Another metric's lines are read for their identity only, whatever their syntax.
        let other = "other_bucket{le=\"1\"} 3 # {trace_id=\"x\"} 1.0\nother weird\n";
        assert_eq!(read(&format!("{other}{one}"), WANTED).map(|s| s.len()), Ok(1));
    }

    #[test]
    fn what_is_printed_of_an_answer_is_escaped() {
        let forged = "pay\nroute payments: observing, 0 requests\u{1b}[2J\u{202e}";
        assert_eq!(escaped(forged), r"pay\nroute payments: observing, 0 requests\u{1b}[2J\u{202e}");
        assert_eq!(escaped("create-order.v2_x"), "create-order.v2_x", "route names print as they are");
        let unreadable = refused(&format!("idemgate_observed_total{{route=\"\u{1b}{}", "x".repeat(500)));
        assert!(
            !unreadable.contains('\u{1b}') && unreadable.ends_with("...") && unreadable.len() < 300,
            "{unreadable}"
        );
        let series = Series::named("m", &[("route", "a\nb\"")]);
        assert_eq!(series.to_string(), r#"m{route="a\nb\""}"#);
    }
}
