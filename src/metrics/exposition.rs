//! The text exposition in a stable order.
//!
//! prometheus_client keeps a family's series in a hash map, so their order changes from one
//! start to the next, and a series created later (a store call's first latency) lands
//! anywhere. Diffing two scrapes, or reading one, needs one order: each family's series are
//! sorted by their labels; a histogram's lines of one series (buckets in `le` order, sum,
//! count) stay together, as the format requires.

/// `text` with each family's series sorted by their labels.
pub fn sorted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The current family's series: (labels without `le`, its lines in order).
    let mut series: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut out, &mut series);
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let key = series_key(line);
        match series.last_mut() {
            Some((last, lines)) if *last == key => lines.push(line),
            _ => series.push((key, vec![line])),
        }
    }
    flush(&mut out, &mut series);
    out
}

fn flush(out: &mut String, series: &mut Vec<(String, Vec<&str>)>) {
    // Stable: lines of one key keep their order (a family's `_total` and `_created`).
    series.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, lines) in series.drain(..) {
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
    }
}

/// A sample line's series: its labels without `le`, so that a histogram's buckets, sum and
/// count are one series.
fn series_key(line: &str) -> String {
    let labels = match (line.find('{'), line.rfind('}')) {
        (Some(open), Some(close)) if open < close => &line[open + 1..close],
        _ => "",
    };
    labels.split(',').filter(|label| !label.starts_with("le=")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::sorted;

    #[test]
    fn series_are_sorted_and_histograms_kept_whole() {
        let text = "\
# HELP c A counter.
# TYPE c counter
c_total{route=\"b\"} 1
c_total{route=\"a\"} 2
# HELP h A histogram.
# TYPE h histogram
h_sum{route=\"b\"} 0.5
h_count{route=\"b\"} 1
h_bucket{le=\"0.1\",route=\"b\"} 0
h_bucket{le=\"+Inf\",route=\"b\"} 1
h_sum{route=\"a\"} 0
h_count{route=\"a\"} 0
h_bucket{le=\"0.1\",route=\"a\"} 0
h_bucket{le=\"+Inf\",route=\"a\"} 0
# EOF
";
        let want = "\
# HELP c A counter.
# TYPE c counter
c_total{route=\"a\"} 2
c_total{route=\"b\"} 1
# HELP h A histogram.
# TYPE h histogram
h_sum{route=\"a\"} 0
h_count{route=\"a\"} 0
h_bucket{le=\"0.1\",route=\"a\"} 0
h_bucket{le=\"+Inf\",route=\"a\"} 0
h_sum{route=\"b\"} 0.5
h_count{route=\"b\"} 1
h_bucket{le=\"0.1\",route=\"b\"} 0
h_bucket{le=\"+Inf\",route=\"b\"} 1
# EOF
";
        assert_eq!(sorted(text), want);
        assert_eq!(sorted(want), want, "sorting is idempotent");
    }
}
