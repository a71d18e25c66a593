//! serde's messages about a value of the wrong type, in the words of a configuration file.
//!
//! serde and the TOML reader speak of Rust types ("invalid type: string \"one\", expected
//! usize"); an operator reading `check`'s output has written TOML, not Rust. Messages of the
//! schema's own (durations, sizes, statuses) already speak plainly and pass through as they are.

/// `message`, with serde's type vocabulary put into the file's words.
pub fn plain(message: &str) -> String {
    let split = |prefix: &str| message.strip_prefix(prefix).and_then(|rest| rest.split_once(", expected "));
    if let Some((got, wanted)) = split("invalid type: ") {
        return format!("expected {}, not {}", expected(wanted), found(got));
    }
    if let Some((got, wanted)) = split("invalid value: ") {
        return format!("{} is out of range: expected {}", found(got), expected(wanted));
    }
    if let Some((got, wanted)) = split("invalid length ") {
        return format!("a list of {got} entries: expected {wanted}");
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("{} is required", field.replace('`', ""));
    }
    if let Some((got, wanted)) = split("unknown variant ") {
        let wanted = wanted.strip_prefix("one of ").unwrap_or(wanted);
        return format!("{} is none of {}", got.replace('`', "\""), wanted.replace('`', "\""));
    }
    message.to_owned()
}

/// What the schema wanted, as an operator would write it.
fn expected(wanted: &str) -> String {
    let plain = match wanted {
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number such as 1",
        "isize" | "i64" | "i32" | "i16" | "i8" => "a whole number such as -1 or 1",
        "f64" | "f32" => "a number such as 0.5",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" | "a character" => "a string in quotes",
        "a sequence" => "a list such as [\"a\", \"b\"]",
        "a map" => "a table",
        _ if wanted.starts_with("struct ") => "a table",
        _ if wanted.starts_with("a sequence") => "a list",
        _ => return wanted.to_owned(),
    };
    plain.to_owned()
}

/// What the file held, as the operator wrote it.
fn found(got: &str) -> String {
    let (kind, value) = match got.split_once(' ') {
        Some((kind, value)) => (kind, Some(value.trim_matches('`'))),
        None => (got, None),
    };
    match (kind, value) {
        ("string", Some(value)) => format!("the string {value}"),
        ("integer" | "floating", Some(value)) => {
            format!("the number {}", value.strip_prefix("point ").unwrap_or(value).trim_matches('`'))
        }
        ("boolean", Some(value)) => value.to_owned(),
        ("sequence", _) => "a list".to_owned(),
        ("map", _) => "a table".to_owned(),
        _ => got.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn rust_types_become_the_file_s_words() {
        let cases = [
            (
                "invalid type: string \"one\", expected usize",
                "expected a whole number such as 1, not the string \"one\"",
            ),
            ("invalid type: integer `5`, expected a string", "expected a string in quotes, not the number 5"),
            ("invalid type: string \"yes\", expected a boolean", "expected true or false, not the string \"yes\""),
            (
                "invalid type: floating point `1.5`, expected u32",
                "expected a whole number such as 1, not the number 1.5",
            ),
            ("invalid type: boolean `true`, expected a sequence", "expected a list such as [\"a\", \"b\"], not true"),
            ("invalid type: sequence, expected struct ReconcileSection", "expected a table, not a list"),
            (
                "invalid value: integer `-1`, expected u16",
                "the number -1 is out of range: expected a whole number such as 1",
            ),
            ("missing field `url`", "url is required"),
            (
                "unknown variant `maybe`, expected one of `fail-open`, `fail-closed`",
                "\"maybe\" is none of \"fail-open\", \"fail-closed\"",
            ),
            // The schema's own messages pass through.
            (
                "\"ten\" is not a duration: expected a duration such as 5s or 250ms",
                "\"ten\" is not a duration: expected a duration such as 5s or 250ms",
            ),
        ];
        for (serde, wanted) in cases {
            assert_eq!(plain(serde), wanted, "for {serde:?}");
        }
    }

    #[test]
    fn no_message_names_a_rust_type() {
        for ty in ["usize", "u64", "u32", "u16", "u8", "i64", "f64", "a boolean", "a sequence", "a map"] {
            let out = plain(&format!("invalid type: string \"x\", expected {ty}"));
            for rust in ["usize", "u64", "u32", "u16", "u8", "i64", "f64", "sequence", "map"] {
                assert!(!out.contains(rust), "{out:?} names {rust}");
            }
        }
    }
}
