//! The limits of the house, kept as tests so that they cannot lapse unseen
//! (docs/architecture.md, "Modules"):
//!
//! - every file of `src/` has at most 450 lines before its tests;
//! - no module uses one on its own layer or above, as the table of layers in
//!   docs/architecture.md draws them;
//! - no store role (a `pub trait` under `src/store/`) has more than 8 methods;
//! - the request path (`src/idempotent/`) holds the store's roles, never the whole backend
//!   nor the operator's role;
//! - inside `src/store/`, no file imports the facade above it (`store/mod.rs`, and each
//!   engine's `mod.rs`): the store's parts import one another by their own names.
//!
//! They read the source tree as text, as a reader would: nothing is built or run. Comments and
//! the insides of string and character literals are blanked first ([`code`]), so that what is
//! read is code.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Lines a file of `src/` may have before its tests.
const MOST_LINES: usize = 450;

/// Methods a store role may have.
const MOST_METHODS: usize = 8;

/// The modules of the binary (`main.rs`, and `cli/` that it declares): a crate of its own,
/// whose `crate::` names its own modules, never the library's. They stand on the top layer.
const BINARY: &[&str] = &["main", "cli"];

#[test]
fn every_file_of_src_is_at_most_450_lines_before_its_tests() {
    let over: Vec<String> = rust_files(&src())
        .iter()
        .filter_map(|file| {
            let lines = lines_before_tests(&read_to_string(file));
            (lines > MOST_LINES).then(|| format!("{}: {lines} lines", shown(file)))
        })
        .collect();
    assert!(
        over.is_empty(),
        "files of src/ past {MOST_LINES} lines before their tests (split each by concern):\n  {}",
        over.join("\n  ")
    );
}

#[test]
fn no_module_uses_one_on_its_own_layer_or_above() {
    let layers = layers();
    let modules = modules();
    let mut faults = Vec::new();
    for module in modules.iter().filter(|m| !layers.contains_key(*m)) {
        faults.push(format!("`{module}` (src/) is on no layer of the table: place it"));
    }
    for (module, layer) in layers.iter().filter(|(m, _)| !modules.contains(*m)) {
        faults.push(format!("`{module}` is on layer {layer} of the table, but src/ has no such module"));
    }
    let top = layers.values().copied().max().unwrap_or(0);
    for module in BINARY.iter().filter(|m| layers.get(**m) != Some(&top)) {
        faults.push(format!("`{module}` belongs to the binary: it stands on the top layer, {top}"));
    }
    let mut paths = 0;
    for file in rust_files(&src()) {
        let module = module_of(&file);
        let Some(&own) = layers.get(&module).filter(|_| !BINARY.contains(&module.as_str())) else { continue };
        for (line, used) in uses(&code(&read_to_string(&file)), depth_of(&file)) {
            paths += 1;
            if used == module {
                continue;
            }
            let place = format!("{}:{line}: `{module}` (layer {own}) uses `{used}`", shown(&file));
            match layers.get(&used) {
                Some(&layer) if layer < own => {}
                Some(&layer) if layer == own => faults.push(format!("{place}, beside it on layer {layer}")),
                Some(&layer) => faults.push(format!("{place}, above it on layer {layer}")),
                None if modules.contains(&used) => faults.push(format!("{place}, which is on no layer")),
                None => faults.push(format!("{place}, which is no module of src/ (the crate's root?)")),
            }
        }
    }
    assert!(paths > 0, "no `crate::` path read under src/: the scan reads nothing");
    assert!(
        faults.is_empty(),
        "the layers of docs/architecture.md (\"Modules\") do not hold: a module uses only modules on layers \
         below its own:\n  {}",
        faults.join("\n  ")
    );
}

#[test]
fn no_store_role_has_more_than_8_methods() {
    let mut roles = Vec::new();
    for file in rust_files(&src().join("store")) {
        for (role, methods) in traits(&code(&read_to_string(&file))) {
            roles.push((shown(&file), role, methods));
        }
    }
    assert!(!roles.is_empty(), "no `pub trait` read under src/store/: the scan reads nothing");
    let over: Vec<String> = roles
        .iter()
        .filter(|(_, _, methods)| *methods > MOST_METHODS)
        .map(|(file, role, methods)| format!("{file}: {role} has {methods} methods"))
        .collect();
    assert!(
        over.is_empty(),
        "store roles past {MOST_METHODS} methods (split each by who calls it):\n  {}",
        over.join("\n  ")
    );
}

#[test]
fn the_request_path_holds_store_roles_not_the_backend() {
    // Words that would mean the request path reaches past its roles: the backend itself, the
    // operator's role, or the runtime's handle for the server's wiring.
    const FORBIDDEN: &[&str] = &["Backend", "Operator", ".backend()", ".operator()", "Engine"];
    let files = rust_files(&src().join("idempotent"));
    assert!(!files.is_empty(), "no file read under src/idempotent/: the scan reads nothing");
    let mut found = Vec::new();
    for file in files {
        let code = code(&read_to_string(&file));
        for (n, line) in code.lines().enumerate() {
            for word in FORBIDDEN {
                let hit = line.match_indices(word).any(|(at, _)| {
                    let before = line[..at].chars().next_back();
                    let after = line[at + word.len()..].chars().next();
                    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    word.starts_with('.') || (!ident(before) && !ident(after))
                });
                if hit {
                    found.push(format!("{}:{}: {}", shown(&file), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "the request path names what it should not hold:\n  {}", found.join("\n  "));
}

#[test]
fn no_file_of_the_store_imports_a_facade_above_it() {
    let store = src().join("store");
    let mut found = Vec::new();
    for file in rust_files(&store) {
        let code = code(&read_to_string(&file));
        let depth = file.strip_prefix(&store).map_or(0, |p| p.components().count());
        for (n, line) in code.lines().enumerate() {
            let line = line.trim();
            // `super::` from a file of `store/` names store/mod.rs when the file sits right
            // under it (one component below), and an engine's mod.rs from its own files; a
            // path that goes on to a module of its own (`super::lifecycle::Lease`) is not the
            // facade. `crate::store::Name` (a name straight from the facade) is too.
            let up = |rest: &str| names_from_facade(rest);
            let via_super =
                line.strip_prefix("use super::").is_some_and(|rest| up(rest) && !line.contains("use super::*"));
            let via_crate = line.strip_prefix("use crate::store::").is_some_and(up);
            let in_mod = file.file_name().is_some_and(|f| f == "mod.rs");
            if (via_super || via_crate) && !in_mod && depth >= 1 && !line.starts_with("use super::*") {
                found.push(format!("{}:{}: {line}", shown(&file), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "files of src/store/ that import a facade:\n  {}", found.join("\n  "));
}

/// Whether the rest of a `use super::` or `use crate::store::` line takes a name straight
/// from the module it starts at (`Lease`, `{Lease, lifecycle::Final}`), rather than only
/// going on into its modules (`lifecycle::Lease`, `{epoch, notify}`).
fn names_from_facade(rest: &str) -> bool {
    let name = |item: &str| {
        let item = item.trim();
        !item.contains("::") && (item.chars().next().is_some_and(char::is_uppercase) || item == "self")
    };
    match rest.strip_prefix('{') {
        None => name(rest.trim_end_matches(';')),
        Some(inner) => {
            let (mut depth, mut start, mut any) = (0usize, 0usize, false);
            let inner = inner.trim_end_matches(';').trim_end_matches('}');
            for (at, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth = depth.saturating_sub(1),
                    ',' if depth == 0 => {
                        any |= name(&inner[start..at]);
                        start = at + 1;
                    }
                    _ => {}
                }
            }
            any || name(&inner[start..])
        }
    }
}

/// The readers below, on what each must tell apart.
#[test]
fn the_scan_reads_what_the_compiler_reads() {
    let text = r#"
//! A comment naming crate::gateway is no import.
use crate::store::{self, State};
use crate::{
    config::Config,
    metrics::{self, Outcome},
};
use super::sibling;
macro_rules! m { () => { $crate::log_writer::f() } }
fn f() -> u8 {
    let _ = "crate::admin in a string";
    let _ = '{';
    crate::body::full(b'"');
    0
}
mod inner {
    use super::super::headers::strip;
}
"#;
    let found: Vec<(usize, String)> = uses(&code(text), 1);
    let found: Vec<(usize, &str)> = found.iter().map(|(line, m)| (*line, m.as_str())).collect();
    assert_eq!(found, [(3, "store"), (4, "config"), (4, "metrics"), (8, "sibling"), (13, "body"), (17, "headers")]);

    let roles = r#"
macro_rules! roles { ($(pub trait $role:ident { $(fn $call:ident(&self) -> $out:ty => $kind:tt;)* })*) => {} }
roles! {
    /// Says fn in a comment.
    pub trait Small {
        fn one(&self) -> u8 => "one";
        fn two(&self, x: u8) -> () => plain;
    }
}
pub trait Plain: Send {
    fn a(&self) {
        let f = |x: u8| x;
        fn inner() {}
    }
    async fn b(&self);
    type Out;
}
"#;
    assert_eq!(traits(&code(roles)), [("Small".to_owned(), 2), ("Plain".to_owned(), 2)]);
    assert!(names_from_facade("Lease;") && names_from_facade("{Lease, lifecycle::Final};"));
    assert!(names_from_facade("{epoch, Links};") && names_from_facade("{self, x};"));
    assert!(!names_from_facade("lifecycle::Lease;") && !names_from_facade("{epoch, notify};"));
    assert!(!names_from_facade("{links::{Links, Opened}, round_trip::Reply};"));

    assert_eq!(
        lines_before_tests("a\nb\n#[cfg(test)]\nfn helper() {}\nc\n#[cfg(test)]\n#[allow(x)]\nmod tests {}\n"),
        5
    );
    assert_eq!(lines_before_tests("a\nb\n"), 2);
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read_to_string(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `path` as the failures name it: from the repository's root.
fn shown(path: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The modules of `src/`: each file (`gateway.rs` is `gateway`) and each folder (`store/` is
/// `store`, whatever files it holds).
fn modules() -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src()).expect("src/") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).expect("a name in UTF-8");
        if path.is_dir() {
            modules.insert(name.to_owned());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            modules.insert(stem.to_owned());
        }
    }
    modules
}

/// The module of `src/` a file belongs to: its first name under `src/`.
fn module_of(file: &Path) -> String {
    let inside = file.strip_prefix(src()).expect("a file under src/");
    let first = inside.components().next().expect("a file under src/").as_os_str().to_string_lossy();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

/// How many modules deep a file's own module is: `gateway.rs` and `store/mod.rs` 1,
/// `store/index.rs` 2; the crate's root, `lib.rs` (or `main.rs`), 0.
fn depth_of(file: &Path) -> usize {
    let inside = file.strip_prefix(src()).expect("a file under src/");
    let names = inside.components().count();
    match inside.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs") if names == 1 => 0,
        Some("mod.rs") => names - 1,
        _ => names,
    }
}

/// The layers of the table in docs/architecture.md's section "Modules": each module with its
/// layer. A row is `| N | `a.rs`, `b/` | what they are |`; other rows are not read.
fn layers() -> BTreeMap<String, u32> {
    let doc = read_to_string(&Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"));
    let section = doc.split("\n## Modules\n").nth(1).expect("docs/architecture.md has a section \"## Modules\"");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut layers = BTreeMap::new();
    for row in section.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|cell| cell.parse::<u32>().ok()) else { continue };
        for name in cells.get(2).unwrap_or(&"").split(',') {
            let name = name.trim().trim_matches('`');
            let module = name.strip_suffix(".rs").or_else(|| name.strip_suffix('/')).unwrap_or_else(|| {
                panic!("layer {layer} names `{name}`: a module is a file (`a.rs`) or a folder (`a/`)")
            });
            if let Some(before) = layers.insert(module.to_owned(), layer) {
                panic!("`{name}` is on two layers of the table, {before} and {layer}");
            }
        }
    }
    assert!(layers.len() > 1, "docs/architecture.md: no table of layers read in \"Modules\"");
    layers
}

/// The lines of a file before its tests: up to its first `#[cfg(test)]` that opens a module
/// (other attributes may stand between), or all of them. A `#[cfg(test)]` helper among the
/// code counts as code.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let opens_module = |line: &str| {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("mod") => true,
            Some(word) if word.starts_with("pub") => words.next() == Some("mod"),
            _ => false,
        }
    };
    for (at, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            let next = lines[at + 1..].iter().map(|l| l.trim_start()).find(|l| !l.starts_with("#["));
            if next.is_some_and(opens_module) {
                return at;
            }
        }
    }
    lines.len()
}

/// `text` with its comments and the insides of its string and character literals blanked,
/// lines kept: what is left is code, at the same offsets.
fn code(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, from: usize, to: usize| {
        out.extend(text[from..to].chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
    };
    let ident = |at: usize| at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_');
    let mut at = 0;
    while at < bytes.len() {
        let rest = &text[at..];
        let end = if rest.starts_with("//") {
            at + rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            let mut end = at;
            while end < bytes.len() {
                if text[end..].starts_with("/*") {
                    depth += 1;
                    end += 2;
                } else if text[end..].starts_with("*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            end
        } else if let Some(end) = raw_string(text, at).filter(|_| at == 0 || !ident(at - 1)) {
            end
        } else if rest.starts_with('"') {
            let mut end = at + 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            end + 1
        } else if let Some(after) = rest.strip_prefix('\'') {
            // A character literal ('x', '\n', '→'), else a lifetime ('a).
            match after.chars().next() {
                Some('\\') => at + 3 + rest.get(3..).and_then(|r| r.find('\'')).unwrap_or(0) + 1,
                Some(c) if after[c.len_utf8()..].starts_with('\'') => at + 2 + c.len_utf8(),
                _ => {
                    out.push('\'');
                    at += 1;
                    continue;
                }
            }
        } else {
            let c = rest.chars().next().expect("a character");
            out.push(c);
            at += c.len_utf8();
            continue;
        };
        let end = end.min(bytes.len());
        blank(&mut out, at, end);
        at = end;
    }
    out
}

/// Where a raw string literal that starts at `at` (`r"…"`, `r#"…"#`, `br"…"`) ends.
fn raw_string(text: &str, at: usize) -> Option<usize> {
    let rest = &text[at..];
    let rest = rest.strip_prefix('b').unwrap_or(rest).strip_prefix('r')?;
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    let body = rest[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(text.len() - body.len() + end + close.len())
}

/// The modules of the crate that `code` names, each with its line: every path from the
/// crate's root, `crate::x` (`crate::{x, y::z}` names both), and every `super::` that climbs
/// out of the file's top module to the root (`depth` is how deep the file's own module is).
/// `$crate::` (a macro's) is not read.
fn uses(code: &str, depth: usize) -> Vec<(usize, String)> {
    let bytes = code.as_bytes();
    let ident = |at: usize| at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_');
    let word_at = |at: usize| {
        let mut end = at;
        while ident(end) {
            end += 1;
        }
        &code[at..end]
    };
    let skip_space = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    // The modules a path names from `at`: one name, or each of a `{…}` group's.
    let heads = |at: usize| -> Vec<String> {
        if bytes.get(at) != Some(&b'{') {
            return vec![word_at(at).to_owned()];
        }
        let mut names = Vec::new();
        let (mut depth, mut item) = (0, at + 1);
        for (i, &b) in bytes.iter().enumerate().skip(at) {
            match b {
                b'{' => depth += 1,
                b'}' | b',' if depth == 1 => {
                    let name = word_at(skip_space(item));
                    if !name.is_empty() && name != "self" {
                        names.push(name.to_owned());
                    }
                    item = i + 1;
                    if b == b'}' {
                        break;
                    }
                }
                b'}' => depth -= 1,
                _ => {}
            }
        }
        names
    };
    let mut found = Vec::new();
    let mut braces = 0usize;
    // The brace depth at which each inline module (`mod tests {`) opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'{' => braces += 1,
            b'}' => {
                braces = braces.saturating_sub(1);
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
            }
            b if (b.is_ascii_alphabetic() || b == b'_')
                && (at == 0 || !(ident(at - 1) || b"$:".contains(&bytes[at - 1]))) =>
            {
                let word = word_at(at);
                let after = at + word.len();
                match word {
                    "mod" => {
                        let name = skip_space(after);
                        let open = skip_space(name + word_at(name).len());
                        if !word_at(name).is_empty() && bytes.get(open) == Some(&b'{') {
                            inline.push(braces);
                        }
                    }
                    "crate" if code[after..].starts_with("::") => {
                        found.extend(heads(after + 2).into_iter().map(|m| (line_of(at), m)));
                    }
                    "super" if code[after..].starts_with("::") => {
                        let mut end = at;
                        let mut climbs = 0;
                        while code[end..].starts_with("super::") {
                            climbs += 1;
                            end += "super::".len();
                        }
                        if climbs >= depth + inline.len() {
                            found.extend(heads(end).into_iter().map(|m| (line_of(at), m)));
                        }
                        at = end;
                        continue;
                    }
                    _ => {}
                }
                at = after;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    found
}

/// Each `pub trait` of `code`, with the methods it declares: the `fn`s at the first level of
/// its body. A role of the `roles!` macro is declared so too (`fn call(&self) -> Out => "label";`);
/// the macro's own pattern (`pub trait $role`) is none.
fn traits(code: &str) -> Vec<(String, usize)> {
    let bytes = code.as_bytes();
    let ident = |at: usize| at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_');
    let mut traits = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("pub trait ") {
        let at = from + found;
        from = at + "pub trait ".len();
        if at > 0 && ident(at - 1) {
            continue;
        }
        let mut end = from;
        while ident(end) {
            end += 1;
        }
        let name = &code[from..end];
        let Some(open) = code[end..].find('{').map(|o| end + o) else { continue };
        if name.is_empty() {
            continue;
        }
        let mut depth = 0;
        let mut methods = 0;
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                b'f' if depth == 1 && code[i..].starts_with("fn") && !ident(i - 1) && !ident(i + 2) => methods += 1,
                _ => {}
            }
        }
        traits.push((name.to_owned(), methods));
    }
    traits
}
