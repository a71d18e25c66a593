//! What `idemgate keys` prints for people: tables, a record's fields, readable durations, and
//! client input made safe for a terminal.

use std::io::Write;

use serde_json::Value;

use super::failure::Failure;

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub(super) fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::Failed(format!("writing stdout: {e}"))),
        _ => Ok(()),
    }
}

pub(super) fn records_table(records: &[Value]) -> String {
    let header = ["KEY", "STATE", "ATTEMPT", "SINCE", "METHOD", "PATH", "SCOPE_HASH"];
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let text = |name: &str| r.get(name).map_or_else(|| "-".to_owned(), json_text);
            vec![
                text("key"),
                text("state"),
                text("attempt"),
                r.get("since_ms").and_then(Value::as_u64).map_or_else(|| "-".to_owned(), human_duration),
                text("method"),
                text("path"),
                // Whole, and last: what `--scope-hash` takes, copied from here as it is.
                r.get("scope_hash").and_then(Value::as_str).map_or_else(|| "-".to_owned(), printable),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// One key's record as `field value` lines, the durations made readable.
pub(super) fn record_details(route: &str, key: &str, doc: &Value) -> String {
    let mut rows = vec![vec!["route".to_owned(), printable(route)], vec!["key".to_owned(), printable(key)]];
    let Some(fields) = doc.as_object() else {
        rows.push(vec!["record".to_owned(), json_text(doc)]);
        return table(&[], &rows);
    };
    // The known fields first, in the order people read them; whatever else the API adds after.
    let known = [
        ("state", "state"),
        ("attempt", "attempt"),
        ("status", "status"),
        ("body_bytes", "body bytes"),
        ("lease_left_ms", "lease left"),
        ("expires_in_ms", "expires in"),
        ("lookup_in_flight", "lookup in flight"),
        ("lookup_left_ms", "lookup left"),
        ("not_found_trusted_in_ms", "not found trusted in"),
    ];
    let rest = fields.keys().filter(|name| !known.iter().any(|(k, _)| k == name));
    let labelled = known.iter().map(|(name, label)| (*name, (*label).to_owned()));
    for (name, label) in labelled.chain(rest.map(|name| (name.as_str(), label_for(name)))) {
        let Some(value) = fields.get(name) else { continue };
        let text = match value.as_u64() {
            Some(ms) if name.ends_with("_ms") => human_duration(ms),
            _ => json_text(value),
        };
        rows.push(vec![label, text]);
    }
    table(&[], &rows)
}

/// A field the list above does not know yet, labelled as the others are: `retry_after_ms` is
/// "retry after" (its value a duration).
fn label_for(name: &str) -> String {
    printable(name.strip_suffix("_ms").unwrap_or(name)).replace('_', " ")
}

/// Columns padded to their widest cell, two spaces apart; no header row when `header` is empty.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let all: Vec<&Vec<String>> = std::iter::once(&header).filter(|h| !h.is_empty()).chain(rows).collect();
    let columns = all.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| all.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in all {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = widths[c].saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON value as a table cell: strings without quotes, the rest as JSON.
pub(super) fn json_text(value: &Value) -> String {
    match value {
        Value::String(s) => printable(s),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        Value::Null => "-".to_owned(),
        other => printable(&other.to_string()),
    }
}

/// The text with control characters escaped: a key is client input, and a terminal would
/// obey the escape sequences in it.
pub(super) fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// The start of a body that is not the expected JSON, for the error message.
pub(super) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let cut: String = text.chars().take(200).collect();
    let more = if cut.len() < text.len() { "..." } else { "" };
    format!("{}{more}", printable(&cut))
}

/// Milliseconds as the two largest units: 850ms, 12s, 3m12s, 2h5m, 1d3h.
pub(super) fn human_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let units = [(s / 86_400, "d"), (s / 3600 % 24, "h"), (s / 60 % 60, "m"), (s % 60, "s")];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut text = format!("{}{}", units[first].0, units[first].1);
    if let Some((n, unit)) = units.get(first + 1).filter(|(n, _)| *n > 0) {
        text.push_str(&format!("{n}{unit}"));
    }
    text
}

/// A value to paste into a shell: single-quoted unless it is plainly safe.
pub(super) fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:/=+".contains(c)) {
        return s.to_owned();
    }
    format!("'{}'", printable(s).replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_two_units() {
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_000), "12s");
        assert_eq!(human_duration(192_000), "3m12s");
        assert_eq!(human_duration(3_600_000), "1h");
        assert_eq!(human_duration(90_061_000), "1d1h");
    }

    #[test]
    fn every_field_has_a_label_for_people() {
        let doc = serde_json::json!({
            "state": "unknown", "attempt": 1, "expires_in_ms": 60_000, "lookup_in_flight": true,
            "lookup_left_ms": 2_000, "not_found_trusted_in_ms": 0, "retry_after_ms": 1_500,
        });
        let text = record_details("r", "k", &doc);
        assert!(text.contains("lookup left           2s\n"), "{text}");
        assert!(text.contains("not found trusted in  0ms\n"), "{text}");
        assert!(text.contains("retry after           1s\n"), "{text}");
        assert!(!text.contains('_'), "{text}");
    }
}
