//! Every key the configuration file accepts is in `gateway.toml` (set, or commented out) and in
//! `docs/configuration.md` (a row of its section's table), as both promise.
//!
//! The keys come from the schema itself, `src/config/file.rs`: each `struct` there reads a
//! table of the file, and each of its `pub` fields is a key, or a table below it. A plain text
//! scan, no macro: the schema is written one field per line. Every table is listed below with
//! the struct that reads it; a struct or a table without a line fails the test, so a new
//! section cannot go undocumented by accident.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every table of the file: (its name in `gateway.toml`, the struct of `src/config/file.rs`
/// that reads it, the heading of its table in `docs/configuration.md`). `*` stands for a name
/// the operator chooses (`[upstreams.NAME]`, `[errors.TYPE]`). The root, the file itself, has
/// neither name nor heading. A new section is one line here.
const TABLES: &[(&str, &str, &str)] = &[
    ("", "File", ""),
    ("server", "ServerSection", "[server]"),
    ("server.admin_tokens", "AdminTokenSection", "[[server.admin_tokens]]"),
    ("server.admin_tls", "AdminTlsSection", "[server.admin_tls]"),
    ("server.tls", "TlsSection", "[server.tls]"),
    ("server.tls.certs", "HostCertSection", "[[server.tls.certs]]"),
    ("store", "StoreSection", "[store]"),
    ("upstreams.*", "UpstreamSection", "[upstreams.NAME]"),
    ("routes", "RouteSection", "[[routes]]"),
    ("routes.idempotency", "IdempotencySection", "[routes.idempotency]"),
    ("routes.idempotency.reconcile", "ReconcileSection", "[routes.idempotency.reconcile]"),
    ("routes.idempotency.identity", "IdentitySection", "[routes.idempotency.identity]"),
    (
        "routes.idempotency.identity.previous_fingerprint",
        "PreviousFingerprintSection",
        "[routes.idempotency.identity.previous_fingerprint]",
    ),
    ("errors", "ErrorsSection", "[errors]"),
    ("errors.*", "ErrorTypeSection", "[errors.TYPE]"),
    // A route's errors take the same keys, documented once with the file's.
    ("routes.errors", "ErrorsSection", "[errors]"),
    ("routes.errors.*", "ErrorTypeSection", "[errors.TYPE]"),
    ("telemetry", "TelemetrySection", "[telemetry]"),
];

/// Fields that hold tables the operator names, beside the table's own keys, rather than a key
/// of their own: (struct, field). Their tables are `TABLE.*`.
const BESIDE: &[(&str, &str)] = &[("ErrorsSection", "types")];

/// Structs of `src/config/file.rs` that read no table of the file, and so have no keys to
/// document. Any other struct without a line in `TABLES` fails the test.
const NOT_TABLES: &[&str] = &[];

/// One field of a schema struct.
#[derive(Debug)]
struct Field {
    /// The key, as written in the file (after any `#[serde(rename = "...")]`).
    key: String,
    /// The field's type, as written.
    ty: String,
}

/// The structs of `file.rs` and their fields, in order.
fn schema(source: &str) -> BTreeMap<String, Vec<Field>> {
    let mut structs = BTreeMap::new();
    let mut current: Option<(String, Vec<Field>)> = None;
    let mut rename: Option<String> = None;
    for raw in source.lines() {
        let line = raw.trim();
        if current.is_none() {
            // Items of the module only, at the start of their line: not a helper struct
            // declared inside a function (a visitor in a `Deserialize` impl).
            let declared = raw.strip_prefix("pub struct ").or_else(|| raw.strip_prefix("struct "));
            if let Some(rest) = declared {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if rest.trim_end().ends_with('{') {
                    current = Some((name, Vec::new()));
                } else {
                    // A unit or tuple struct: no keys, but a struct all the same.
                    structs.insert(name, Vec::new());
                }
            }
            continue;
        }
        if line == "}" {
            let (name, fields) = current.take().unwrap();
            structs.insert(name, fields);
            continue;
        }
        if line.starts_with("#[serde(") {
            if let Some(at) = line.find("rename = \"") {
                let value = &line[at + "rename = \"".len()..];
                rename = value.split('"').next().map(str::to_owned);
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("pub ") else { continue };
        let Some((name, ty)) = rest.split_once(':') else { continue };
        let name = name.trim().trim_start_matches("r#");
        let key = rename.take().unwrap_or_else(|| name.to_owned());
        if let Some((_, fields)) = current.as_mut() {
            fields.push(Field { key, ty: ty.trim().trim_end_matches(',').to_owned() });
        }
    }
    structs
}

/// Whether `ty` names the struct `name` (as a whole word: `Option<TlsSection>`,
/// `BTreeMap<String, UpstreamSection>`, `Vec<RouteSection>`).
fn names(ty: &str, name: &str) -> bool {
    ty.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|word| word == name)
}

/// Whether a table of `gateway.toml` called `table` is what `pattern` stands for.
fn matches(pattern: &str, table: &str) -> bool {
    match pattern.strip_suffix(".*") {
        Some(prefix) => {
            table.strip_prefix(prefix).and_then(|rest| rest.strip_prefix('.')).is_some_and(|n| !n.is_empty())
        }
        None => pattern == table,
    }
}

/// The tables of a TOML file and the keys in each, set or commented out (`key =` or
/// `# key =`); a commented-out table header (`# [server.tls]`) opens a table too.
fn toml_keys(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table = String::new();
    tables.insert(table.clone(), BTreeSet::new());
    for line in text.lines() {
        let line = line.trim().trim_start_matches('#').trim();
        if let Some(rest) = line.strip_prefix('[') {
            let header = rest.trim_start_matches('[');
            if let Some(end) = header.find(']') {
                let name = &header[..end];
                let after = header[end..].trim_start_matches(']').trim();
                let is_name = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || "_.-".contains(c));
                if is_name && (after.is_empty() || after.starts_with('#')) {
                    table = name.to_owned();
                    tables.entry(table.clone()).or_default();
                    continue;
                }
            }
        }
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || c == '_') {
                tables.get_mut(&table).unwrap().insert(key.to_owned());
            }
        }
    }
    tables
}

/// The `## ` headings of a Markdown file (the text inside their backticks, when they have
/// some) and the lines under each, up to the next heading of that level or above.
fn doc_sections(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            let title = title.split('`').nth(1).unwrap_or(title).trim().to_owned();
            sections.entry(title.clone()).or_default();
            current = Some(title);
        } else if line.starts_with("# ") {
            current = None;
        } else if let Some(title) = &current {
            sections.get_mut(title).unwrap().push(line.to_owned());
        }
    }
    sections
}

/// What `gateway.toml` and `docs/configuration.md` miss of the schema in `source`.
fn missing(source: &str, toml: &str, docs: &str) -> Vec<String> {
    let structs = schema(source);
    let tables = toml_keys(toml);
    let headings = doc_sections(docs);
    let mut missing = Vec::new();

    for name in structs.keys() {
        if !TABLES.iter().any(|&(_, s, _)| s == name) && !NOT_TABLES.contains(&name.as_str()) {
            missing.push(format!(
                "src/config/file.rs: struct {name} reads no table listed in TABLES (or NOT_TABLES) of tests/config_docs.rs"
            ));
        }
    }
    for &(table, name, _) in TABLES {
        if !structs.contains_key(name) {
            missing.push(format!(
                "tests/config_docs.rs: TABLES reads [{table}] with {name}, which src/config/file.rs no longer has"
            ));
        }
    }

    let toml_table = |pattern: &str| -> Option<BTreeSet<&String>> {
        let found: Vec<_> = tables.iter().filter(|(table, _)| matches(pattern, table)).collect();
        (!found.is_empty()).then(|| found.into_iter().flat_map(|(_, keys)| keys).collect())
    };
    let row = |heading: &str, key: &str| {
        let row = format!("| `{key}` |");
        headings.get(heading).is_some_and(|lines| lines.iter().any(|l| l.starts_with(&row)))
    };

    for &(table, name, heading) in TABLES {
        let Some(fields) = structs.get(name) else { continue };
        let shown = if table.is_empty() { "the file's top level".to_owned() } else { format!("[{table}]") };
        for field in fields {
            let child_struct = structs.keys().find(|s| names(&field.ty, s));
            let Some(child_struct) = child_struct else {
                // A key.
                if table.is_empty() {
                    missing.push(format!(
                        "src/config/file.rs: top-level key {} is not a table; extend tests/config_docs.rs",
                        field.key
                    ));
                    continue;
                }
                match toml_table(table) {
                    Some(keys) if keys.contains(&field.key) => {}
                    Some(_) => missing.push(format!("gateway.toml {shown}: {} (as `{0} =` or `# {0} =`)", field.key)),
                    None => missing
                        .push(format!("gateway.toml: no {shown} table (set or commented out), for {}", field.key)),
                }
                if !headings.contains_key(heading) {
                    missing.push(format!("docs/configuration.md: no \"## `{heading}`\" heading, for {}", field.key));
                } else if !row(heading, &field.key) {
                    missing.push(format!("docs/configuration.md `{heading}`: no row \"| `{}` |\"", field.key));
                }
                continue;
            };
            // A table below this one: `KEY`, `KEY.*` for a map of them, or `*` beside this
            // table's keys.
            let beside = BESIDE.contains(&(name, field.key.as_str()));
            let map = field.ty.contains("Map<");
            let child = match (table.is_empty(), beside, map) {
                (_, true, _) => format!("{table}.*"),
                (true, false, false) => field.key.clone(),
                (true, false, true) => format!("{}.*", field.key),
                (false, false, false) => format!("{table}.{}", field.key),
                (false, false, true) => format!("{table}.{}.*", field.key),
            };
            let Some(&(_, reader, child_heading)) = TABLES.iter().find(|&&(t, _, _)| t == child) else {
                missing.push(format!(
                    "tests/config_docs.rs: no line in TABLES for [{child}] ({child_struct}, from {name}.{})",
                    field.key
                ));
                continue;
            };
            if reader != child_struct {
                missing.push(format!(
                    "tests/config_docs.rs: TABLES reads [{child}] with {reader}, but file.rs with {child_struct}"
                ));
            }
            if toml_table(&child).is_none() {
                missing.push(format!("gateway.toml: no [{child}] table (set or commented out)"));
            }
            if !headings.contains_key(child_heading) {
                missing.push(format!("docs/configuration.md: no \"## `{child_heading}`\" heading, for [{child}]"));
            }
            if !table.is_empty() && !beside && !row(heading, &field.key) {
                missing.push(format!("docs/configuration.md `{heading}`: no row \"| `{}` |\"", field.key));
            }
        }
    }
    missing
}

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_key_of_the_schema_is_in_gateway_toml_and_the_configuration_reference() {
    let source = read("src/config/file.rs");
    let structs = schema(&source);
    // The scan found the schema: a broken scan must not pass for want of keys.
    let keys: usize = structs.values().map(Vec::len).sum();
    assert!(structs.len() >= 8 && keys > 50, "scanned {} structs, {keys} keys: {structs:#?}", structs.len());
    let missing = missing(&source, &read("gateway.toml"), &read("docs/configuration.md"));
    assert!(missing.is_empty(), "{} missing:\n  {}", missing.len(), missing.join("\n  "));
}

/// The check itself: it names what a file leaves out, and refuses a struct it cannot place.
/// (Each case is compared with what the files as they are already miss, so that this test
/// says only whether the check works.)
#[test]
fn the_check_names_each_key_left_out_and_each_unmapped_struct() {
    let source = read("src/config/file.rs");
    let (toml, docs) = (read("gateway.toml"), read("docs/configuration.md"));
    let already = missing(&source, &toml, &docs);
    let new = |found: Vec<String>| found.into_iter().filter(|m| !already.contains(m)).collect::<Vec<_>>();
    let without = |text: &str, line: &str| {
        text.lines().filter(|l| !l.starts_with(line)).map(|l| format!("{l}\n")).collect::<String>()
    };

    assert_eq!(
        new(missing(&source, &without(&toml, "# log_format ="), &docs)),
        ["gateway.toml [server]: log_format (as `log_format =` or `# log_format =`)"]
    );
    assert_eq!(
        new(missing(&source, &toml, &without(&docs, "| `log_format` |"))),
        ["docs/configuration.md `[server]`: no row \"| `log_format` |\""]
    );
    assert_eq!(
        new(missing(&source, &toml, &without(&docs, "| `cert` |"))),
        [
            "docs/configuration.md `[server.admin_tls]`: no row \"| `cert` |\"",
            "docs/configuration.md `[server.tls]`: no row \"| `cert` |\"",
            "docs/configuration.md `[[server.tls.certs]]`: no row \"| `cert` |\""
        ]
    );
    // Without its header, the TLS keys are no table's: the table and both keys are missing.
    assert_eq!(
        new(missing(&source, &without(&toml, "# [server.tls]"), &docs)),
        [
            "gateway.toml: no [server.tls] table (set or commented out)",
            "gateway.toml: no [server.tls] table (set or commented out), for cert",
            "gateway.toml: no [server.tls] table (set or commented out), for key",
        ]
    );

    let with_new_section = format!(
        "{source}\n/// `[surprise]`\n#[derive(Debug, Deserialize)]\npub struct SurpriseSection {{\n    pub endpoint: Option<String>,\n}}\n"
    );
    assert_eq!(
        new(missing(&with_new_section, &toml, &docs)),
        [
            "src/config/file.rs: struct SurpriseSection reads no table listed in TABLES (or NOT_TABLES) of tests/config_docs.rs"
        ]
    );
}

/// The backticked words of `docs/configuration.md` between `from` and `to`.
fn ticked_between(docs: &str, from: &str, to: &str) -> Vec<String> {
    let start = docs.find(from).unwrap_or_else(|| panic!("docs/configuration.md: no {from:?}"));
    let rest = &docs[start + from.len()..];
    let end = rest.find(to).unwrap_or_else(|| panic!("docs/configuration.md: no {to:?} after {from:?}"));
    rest[..end].split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Where a duration goes in a minimal file, for the spellings below.
fn with_wait(wait: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\n[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n\
         [[routes]]\nname = \"orders\"\npath = \"/orders\"\nupstream = \"app\"\n[routes.idempotency]\nwait = \"{wait}\"\n"
    )
}

fn duration_refused(wait: &str) -> bool {
    match idemgate::config::Config::from_toml(&with_wait(wait), "gw.toml") {
        Ok(_) => false,
        Err(e) => e.to_string().contains("is not a duration"),
    }
}

/// Every duration spelling the reference lists is read as one, the examples it gives too, and
/// a number without a unit is refused, as it says.
#[test]
fn every_documented_duration_spelling_is_accepted() {
    let docs = read("docs/configuration.md");
    let units = ticked_between(&docs, "The units, each with every spelling accepted:", "So `");
    assert!(units.len() >= 40, "the list of spellings: {units:?}");
    for unit in &units {
        assert!(!duration_refused(&format!("1{unit}")), "1{unit} is documented but refused");
    }
    for example in ["24 hours", "1 day", "24hrs", "1h 30m"] {
        assert!(docs.contains(&format!("`\"{example}\"`")), "{example} is not in the docs");
        assert!(!duration_refused(example), "{example} is documented but refused");
    }
    assert!(duration_refused("30"), "a number without its unit");
    assert!(duration_refused("5 parsecs"), "a unit nobody listed");
}

/// Every warning `idemgate check` can give is in the reference's list of warnings: a file
/// that earns each one, and each key it names is in the list.
#[test]
fn every_warning_of_check_is_documented() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"0.0.0.0:19091\"\n\
        admin_token = \"change-me-to-a-long-random-string\"\nshutdown_grace = \"30s\"\n\
        [store]\nbackend = \"memory\"\ntimeout = \"2s\"\n\
        [upstreams.app]\nurl = \"http://127.0.0.1:3000\"\ntimeout = \"10s\"\nconnect_timeout = \"10s\"\n\
        [[routes]]\nname = \"a\"\npath = \"/a\"\nupstream = \"app\"\n\
        [routes.idempotency]\nlease = \"5s\"\nrenew = false\n\
        [[routes]]\nname = \"b\"\npath = \"/b\"\nupstream = \"app\"\n\
        [routes.idempotency]\nlease = \"60s\"\n\
        [routes.idempotency.reconcile]\npath = \"/lookup/{key}\"\nanswer_status = 204\n\
        [[routes]]\nname = \"c\"\nhosts = [\"api.example.com\"]\nmethods = [\"POST\"]\npath = \"/c\"\nupstream = \"app\"\n\
        [routes.idempotency]\nlease = \"60s\"\n\
        [[routes]]\nname = \"d\"\nmethods = [\"POST\", \"PUT\"]\npath = \"/{*rest}\"\nupstream = \"app\"\n";
    let config = idemgate::config::Config::from_toml(text, "gw.toml").unwrap_or_else(|e| panic!("{e}"));
    let lines = config.warning_lines("gw.toml");
    let keys: BTreeSet<String> = lines
        .iter()
        .filter_map(|l| l.split(": warning: ").nth(1))
        .filter_map(|rest| rest.split(':').next())
        .map(|key| key.rsplit('.').next().unwrap_or(key).to_owned())
        .collect();
    // admin_token, admin_listen, lease (twice: renew and store timeout), shutdown_grace,
    // idempotency (no lookup), path, answer_status, hosts and methods (what falls through),
    // connect_timeout.
    assert!(keys.len() >= 10, "{lines:#?}");
    let docs = read("docs/configuration.md");
    let listed = ticked_between(&docs, "`idemgate check` also warns", "The gateway logs the same");
    for key in &keys {
        assert!(listed.iter().any(|word| word.contains(key.as_str())), "warning on {key} not in the list: {listed:?}");
    }
}

/// The keys an unknown key is compared with for a suggestion (`src/config/known.rs`) are the
/// schema's keys, no more, no fewer: a key added to `file.rs` and not there fails here.
#[test]
fn the_keys_suggested_for_a_misspelling_are_the_schemas() {
    let source = read("src/config/file.rs");
    let schema: BTreeSet<String> = schema(&source)
        .iter()
        .flat_map(|(name, fields)| {
            fields.iter().filter(move |f| !BESIDE.contains(&(name.as_str(), f.key.as_str()))).map(|f| f.key.clone())
        })
        .collect();
    let known = read("src/config/known.rs");
    let list =
        known.split("KNOWN_KEYS: &[&str] = &[").nth(1).and_then(|rest| rest.split("];").next()).expect("the list");
    let listed: BTreeSet<String> = list.split('"').skip(1).step_by(2).map(str::to_owned).collect();
    assert_eq!(listed, schema, "src/config/known.rs against src/config/file.rs");
    // And the suggestion reaches the error.
    let text = "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\n[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n\
                [[routes]]\nname = \"orders\"\npath = \"/orders\"\nupstream = \"app\"\n[routes.idempotency]\nretension = \"1h\"\n";
    let error = idemgate::config::Config::from_toml(text, "gw.toml").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("unknown key (misspelt? did you mean `retention`?"), "{error}");
}
