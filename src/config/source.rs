//! Reading the text of `gateway.toml` into its schema, collecting every problem on the way.
//!
//! An operator fixing a file should see everything that is wrong with it in one run of
//! `idemgate check`. So the file is not deserialized in one go (which stops at the first bad
//! value): each section (`[server]`, `[store]`, every upstream and every route) is read on its
//! own, unknown keys are collected instead of aborting, and every problem gets the line it is
//! on. Only invalid TOML itself stops reading, since nothing after it can be trusted.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue};

use super::Issue;
use super::file::{ErrorsSection, File, RouteSection, ServerSection, StoreSection, TelemetrySection, UpstreamSection};

/// The sections a file may have.
const SECTIONS: [&str; 6] = ["server", "store", "upstreams", "routes", "errors", "telemetry"];

/// Where each key of a file is, by dotted path (`routes[0].idempotency.lease`), and the name
/// the file gives each route (`routes[0]`: `create-order`), which people know it by.
#[derive(Default)]
pub struct Lines {
    at: BTreeMap<String, usize>,
    routes: Vec<Option<String>>,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lines({} keys)", self.at.len())
    }
}

impl Lines {
    /// Indexes every key of a parsed file.
    fn index(text: &str, table: &DeTable<'_>) -> Self {
        let mut lines = Self::default();
        let starts = LineStarts::new(text);
        lines.walk_table("", table, &starts);
        lines
    }

    fn walk_table(&mut self, prefix: &str, table: &DeTable<'_>, starts: &LineStarts) {
        for (key, value) in table {
            let path =
                if prefix.is_empty() { key.get_ref().to_string() } else { format!("{prefix}.{}", key.get_ref()) };
            self.at.insert(path.clone(), starts.line_of(key.span().start));
            self.walk_value(&path, value.get_ref(), starts);
        }
    }

    fn walk_value(&mut self, path: &str, value: &DeValue<'_>, starts: &LineStarts) {
        match value {
            DeValue::Table(table) => self.walk_table(path, table, starts),
            DeValue::Array(items) => {
                if path == "routes" {
                    self.routes = items.iter().map(|item| route_name(item.get_ref())).collect();
                }
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    self.at.entry(path.clone()).or_insert_with(|| starts.line_of(item.span().start));
                    self.walk_value(&path, item.get_ref(), starts);
                }
            }
            _ => {}
        }
    }

    /// The line of `path`, or of the nearest enclosing key that is in the file (a missing
    /// `store.url` is reported on the line of `[store]`).
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let mut path = path;
        loop {
            if let Some(line) = self.at.get(path) {
                return Some(*line);
            }
            let cut = path.rfind(['.', '['])?;
            path = &path[..cut];
        }
    }

    /// Whether the file has `path` itself (`server.max_connections`), not only a table it is in.
    pub fn has(&self, path: &str) -> bool {
        self.at.contains_key(path)
    }

    /// The name of the route `path` is in (`routes[3].hosts`: the fourth route's), when the
    /// file gives it one.
    pub fn route_of(&self, path: &str) -> Option<String> {
        let (index, _) = path.strip_prefix("routes[")?.split_once(']')?;
        self.routes.get(index.parse::<usize>().ok()?)?.clone()
    }
}

/// A `[[routes]]` table's `name`, if it is a string.
fn route_name(route: &DeValue<'_>) -> Option<String> {
    let DeValue::Table(table) = route else { return None };
    table.iter().find(|(key, _)| key.get_ref() == "name").and_then(|(_, value)| match value.get_ref() {
        DeValue::String(name) => Some(name.to_string()),
        _ => None,
    })
}

/// Byte offsets of line starts, for turning spans into 1-based line numbers.
struct LineStarts(Vec<usize>);

impl LineStarts {
    fn new(text: &str) -> Self {
        Self(std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect())
    }

    fn line_of(&self, offset: usize) -> usize {
        self.0.partition_point(|&start| start <= offset).max(1)
    }
}

/// Invalid TOML: the message and its 1-based line and column.
#[derive(Debug)]
pub struct SyntaxError {
    pub message: String,
    pub position: Option<(usize, usize)>,
}

/// What reading a file gave: its schema (when every section could be read) and where its
/// keys are. Problems found on the way are in `issues`, each with its line.
pub struct Read {
    pub file: Option<File>,
    pub lines: Lines,
    pub issues: Vec<Issue>,
}

/// Reads `text`; only invalid TOML is an error, every other problem lands in `Read::issues`.
pub fn read(text: &str) -> Result<Read, SyntaxError> {
    let syntax = |e: &toml::de::Error| SyntaxError {
        message: e.message().trim().to_owned(),
        position: e.span().map(|span| line_column(text, span.start)),
    };
    let spanned = DeTable::parse(text).map_err(|e| syntax(&e))?;
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax(&e))?;
    let lines = Lines::index(text, spanned.get_ref());
    let mut reader = Reader { lines, issues: Vec::new() };

    for key in table.keys().filter(|k| !SECTIONS.contains(&k.as_str())) {
        reader.issue(key.clone(), format!("unknown section; a file has {}", SECTIONS.join(", ")));
    }
    let server = reader.section::<ServerSection>("server", table.get("server"));
    let store = reader.section::<StoreSection>("store", table.get("store"));
    let upstreams = reader.upstreams(table.get("upstreams"));
    let routes = reader.routes(table.get("routes"));
    let errors = match table.get("errors") {
        None => Some(None),
        Some(value) => reader.value::<ErrorsSection>("errors", value.clone()).map(Some),
    };
    let telemetry = match table.get("telemetry") {
        None => Some(None),
        Some(value) => reader.value::<TelemetrySection>("telemetry", value.clone()).map(Some),
    };
    let file = match (server, store, upstreams, routes, errors, telemetry) {
        (Some(server), Some(store), Some(upstreams), Some(routes), Some(errors), Some(telemetry)) => {
            Some(File { server, store, upstreams, routes, errors, telemetry })
        }
        _ => None,
    };
    Ok(Read { file, lines: reader.lines, issues: reader.issues })
}

struct Reader {
    lines: Lines,
    issues: Vec<Issue>,
}

impl Reader {
    fn issue(&mut self, key: String, reason: String) {
        let (line, route) = (self.lines.line_of(&key), self.lines.route_of(&key));
        self.issues.push(Issue { key, reason, line, route });
    }

    /// Reads one required table.
    fn section<T: DeserializeOwned>(&mut self, key: &str, value: Option<&toml::Value>) -> Option<T> {
        let Some(value) = value else {
            self.issue(key.to_owned(), format!("the [{key}] table is missing"));
            return None;
        };
        self.value(key, value.clone())
    }

    fn upstreams(&mut self, value: Option<&toml::Value>) -> Option<BTreeMap<String, UpstreamSection>> {
        let Some(value) = value else { return Some(BTreeMap::new()) };
        let Some(table) = value.as_table() else {
            self.issue("upstreams".into(), "must be a table of [upstreams.NAME] tables".into());
            return None;
        };
        let mut out = BTreeMap::new();
        let mut ok = true;
        for (name, section) in table {
            match self.value::<UpstreamSection>(&format!("upstreams.{name}"), section.clone()) {
                Some(s) => {
                    out.insert(name.clone(), s);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn routes(&mut self, value: Option<&toml::Value>) -> Option<Vec<RouteSection>> {
        let Some(value) = value else { return Some(Vec::new()) };
        let Some(items) = value.as_array() else {
            self.issue("routes".into(), "must be an array of [[routes]] tables".into());
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match self.value::<RouteSection>(&format!("routes[{i}]"), item.clone()) {
                Some(r) => out.push(r),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// Deserializes one section; its unknown keys and every wrongly typed value become issues
    /// under `prefix`. A value that does not fit is reported and taken out, and the section
    /// read again without it (its default stands in), so that one bad value hides neither
    /// the next one nor the checks that need the whole file (an unknown upstream, say).
    fn value<T: DeserializeOwned>(&mut self, prefix: &str, mut value: toml::Value) -> Option<T> {
        let mut unknown = std::collections::BTreeSet::new();
        // Each pass takes one value out; a section has fewer values than this.
        for _ in 0..256 {
            let mut track = serde_path_to_error::Track::new();
            let result = {
                let tracked = serde_path_to_error::Deserializer::new(value.clone(), &mut track);
                serde_ignored::deserialize(tracked, |path| {
                    unknown.insert(join(prefix, &ignored_path(&path)));
                })
            };
            let error = match result {
                Ok(section) => {
                    self.unknown(unknown);
                    return Some(section);
                }
                Err(e) => e,
            };
            let path = track.path().to_string();
            let key = if path == "." { prefix.to_owned() } else { join(prefix, &path) };
            self.issue(key, super::words::plain(error.message().trim()));
            // A missing field, or a section that is not a table: nothing to take out.
            if path == "." || !remove(&mut value, &path) {
                self.unknown(unknown);
                return None;
            }
        }
        self.unknown(unknown);
        None
    }

    fn unknown(&mut self, keys: std::collections::BTreeSet<String>) {
        for key in keys {
            // The last part of the path, without a list's index: `routes[0].idempotency.leas`.
            let name = key.rsplit('.').next().unwrap_or(&key).split('[').next().unwrap_or_default();
            let reason = match super::known::nearest(name) {
                Some(meant) => {
                    format!("unknown key (misspelt? did you mean `{meant}`? docs/configuration.md lists every key)")
                }
                None => "unknown key (misspelt? docs/configuration.md lists every key)".to_owned(),
            };
            self.issue(key, reason);
        }
    }
}

/// Takes the value at `path` (`idempotency.lease`, `idempotency.ignore[2]`) out of `value`;
/// false when there is none. A list loses the whole list: its other entries were not read.
fn remove(value: &mut toml::Value, path: &str) -> bool {
    // A bad entry of a list is the list's problem: the list goes, and its default stands in.
    let path = path.split('[').next().unwrap_or(path);
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return false };
    let mut table = value;
    for part in parts {
        match table.get_mut(part) {
            Some(inner) => table = inner,
            None => return false,
        }
    }
    table.as_table_mut().and_then(|t| t.remove(last)).is_some()
}

fn join(prefix: &str, path: &str) -> String {
    if path.starts_with('[') { format!("{prefix}{path}") } else { format!("{prefix}.{path}") }
}

/// `serde_ignored`'s path in this module's notation (`idempotency.ignore[2]`).
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() { key.clone() } else { format!("{parent}.{key}") }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_fall_back_to_the_enclosing_key() {
        let text = "[server]\nlisten = \"x\"\n\n[[routes]]\nname = \"a\"\n[routes.idempotency]\nlease = \"1s\"\n";
        let table = DeTable::parse(text).unwrap();
        let lines = Lines::index(text, table.get_ref());
        assert_eq!(lines.line_of("server.listen"), Some(2));
        assert_eq!(lines.line_of("server.admin_listen"), Some(1));
        assert_eq!(lines.line_of("routes[0].idempotency.lease"), Some(7));
        assert_eq!(lines.line_of("routes[0].idempotency.wait"), Some(6));
        assert_eq!(lines.line_of("upstreams.x.url"), None);
    }

    #[test]
    fn a_key_in_a_route_knows_the_routes_name() {
        let text =
            "[[routes]]\nname = \"a\"\n[[routes]]\npath = \"/\"\n[[routes]]\nname = 7\n[[routes]]\nname = \"d\"\n";
        let table = DeTable::parse(text).unwrap();
        let lines = Lines::index(text, table.get_ref());
        assert_eq!(lines.route_of("routes[0].idempotency.lease").as_deref(), Some("a"));
        assert_eq!(lines.route_of("routes[3]").as_deref(), Some("d"));
        // No name, a name that is not a string, no such route, not a route.
        for key in ["routes[1].path", "routes[2].name", "routes[4].path", "server.listen", "routes"] {
            assert_eq!(lines.route_of(key), None, "{key}");
        }
    }
}
