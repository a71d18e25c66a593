//! `[[routes]]` written for a document's operations: the ones that declare an idempotency key
//! (or, asked, every POST and PATCH), as a block of the file between two marker lines that a
//! later run replaces whole, so that regenerating is a diff of the block alone.
//!
//! Hazards:
//! - A route's name is part of its records' identity and of every fingerprint: renaming it
//!   turns retries in retention into new requests. Names come from the method and the path
//!   (`post-payments`), never from the `operationId`, which teams rename freely; and a route
//!   the block already had for an operation keeps its name, whatever the rule would give now.
//! - The default scope (`Authorization`, missing → 400) would refuse every request of an API
//!   that names callers another way: the scope comes from the document's security schemes,
//!   and where they say nothing usable the route says so in its comments (`scope = "global"`,
//!   to be set by a person), never a guess.
//! - A hand-written route the file already has for an operation is left alone: the block
//!   never shadows what an operator wrote.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::operations::{Operation, Scope};
use crate::config::reach::Reach;
use crate::config::{Config, RouteConfig};

/// The default key header, which a generated route need not name.
const DEFAULT_HEADER: &str = "Idempotency-Key";

/// The default `max_key_len`.
const DEFAULT_MAX_KEY_LEN: u64 = 255;

/// What to generate.
pub struct Options<'a> {
    /// The document's name as the markers and comments write it (`payments.yaml`).
    pub source: &'a str,
    /// The upstream the routes send to.
    pub upstream: &'a str,
    /// Every POST and PATCH too, not only the operations that declare a key.
    pub all: bool,
}

/// The generated block and what was left out of it, for the person running it.
pub struct Block {
    pub text: String,
    pub routes: usize,
    /// Operations skipped, each with why.
    pub skipped: Vec<String>,
    /// Routes with something a person must decide (a scope the document does not give), and why.
    pub to_decide: Vec<(String, String)>,
}

/// The first line of the block for `source`.
fn begin_marker(source: &str) -> String {
    format!("# --- routes from {source}: written by `idemgate routes --from-openapi`, which replaces this block")
}

/// The last line of the block for `source`.
fn end_marker(source: &str) -> String {
    format!("# --- end of routes from {source}")
}

/// The block for `operations`; `existing` is the file it goes into, if any.
pub fn block(operations: &[Operation], options: &Options<'_>, existing: Option<(&Config, &str)>) -> Block {
    let in_block = existing.map(|(config, text)| names_in_block(text, options.source, config)).unwrap_or_default();
    let routes: &[RouteConfig] = existing.map_or(&[], |(config, _)| &config.routes);
    // What the hand-written routes alone would do with each operation.
    let kept: Vec<RouteConfig> = routes.iter().filter(|r| !in_block.contains(&r.name)).cloned().collect();
    let reach = Reach::new(&kept);
    let mut taken: HashSet<String> = kept.iter().map(|r| r.name.clone()).collect();
    // Operations the router cannot tell apart (`/a/{x}` and `/a/{y}`) get one route.
    let mut routed: HashMap<(http::Method, String), &str> = HashMap::new();
    let mut out = Block { text: String::new(), routes: 0, skipped: Vec::new(), to_decide: Vec::new() };
    let _ = writeln!(out.text, "{}", begin_marker(options.source));
    for op in operations {
        let declared = op.key.is_some();
        let asked = options.all && (op.method == http::Method::POST || op.method == http::Method::PATCH);
        if !declared && !asked {
            continue;
        }
        if let Some(reach) = &reach
            && let Some(r) = reach.find(None, &op.method, &reach.sample(&op.pattern))
        {
            let route = &kept[r];
            if route.idempotency.is_some() {
                out.skipped.push(format!("{}: route {:?} of the file covers it already", op.label(), route.name));
                continue;
            }
            if route.path == op.pattern && route.methods.as_ref().is_some_and(|m| m.contains(&op.method)) {
                out.skipped.push(format!(
                    "{}: route {:?} of the file takes it without idempotency; give that route a [routes.idempotency] \
                     table, or take {} out of its methods",
                    op.label(),
                    route.name,
                    op.method
                ));
                continue;
            }
        }
        if let Some(first) = routed.get(&(op.method.clone(), op.pattern.clone())) {
            out.skipped.push(format!("{}: the router cannot tell it from {first}, whose route takes it", op.place));
            continue;
        }
        routed.insert((op.method.clone(), op.pattern.clone()), &op.place);
        let previous = routes.iter().find(|r| {
            in_block.contains(&r.name)
                && r.path == op.pattern
                && r.methods.as_deref() == Some(std::slice::from_ref(&op.method))
        });
        let name = match previous {
            Some(r) => r.name.clone(),
            None => unused(&route_name(&op.method, &op.path), &taken, &in_block),
        };
        taken.insert(name.clone());
        out.text.push('\n');
        route(&mut out, op, &name, options);
    }
    let _ = write!(out.text, "\n{}\n", end_marker(options.source));
    out
}

/// One route, with comments saying where it came from and what a person must still decide.
fn route(out: &mut Block, op: &Operation, name: &str, options: &Options<'_>) {
    let text = &mut out.text;
    match &op.operation_id {
        Some(id) => writeln!(text, "# {}: {} {} ({})", comment(id), op.method, op.pattern, op.place),
        None => writeln!(text, "# {} {} ({})", op.method, op.pattern, op.place),
    }
    .unwrap_or_default();
    for note in &op.notes {
        let _ = writeln!(text, "# note: {}", comment(note));
    }
    let _ = writeln!(text, "[[routes]]\nname = {}", quoted(name));
    let _ = writeln!(text, "methods = [{}]", quoted(op.method.as_str()));
    let _ = writeln!(text, "path = {}\nupstream = {}\n", quoted(&op.pattern), quoted(options.upstream));
    let _ = writeln!(text, "[routes.idempotency]");
    match &op.key {
        Some(key) => {
            if !key.header.eq_ignore_ascii_case(DEFAULT_HEADER) {
                let _ = writeln!(text, "header = {}", quoted(&key.header));
            }
            if !key.required {
                let _ = writeln!(
                    text,
                    "# The document makes the key optional: a request without one passes unprotected.\nrequired = false"
                );
            }
            if let Some(max) = key.max_len.filter(|&m| m != DEFAULT_MAX_KEY_LEN && (1..=8192).contains(&m)) {
                let _ = writeln!(text, "max_key_len = {max}");
            }
        }
        None => {
            let _ = writeln!(
                text,
                "# The document declares no {DEFAULT_HEADER} here: a client that sends none gets 400 until it does \
                 (mode = \"observe\" first, on a live API)."
            );
        }
    }
    match &op.scope {
        Scope::Callers { sources, optional } => {
            let value = match sources.as_slice() {
                [one] => quoted(one),
                many => format!("[{}]", many.iter().map(|s| quoted(s)).collect::<Vec<_>>().join(", ")),
            };
            let _ = writeln!(text, "scope = {value}");
            if *optional {
                let _ = writeln!(
                    text,
                    "# The document also lets callers in without credentials: their keys are pooled.\n\
                     on_missing_scope = \"anonymous\""
                );
            }
        }
        Scope::Unknown(why) => {
            let _ = writeln!(
                text,
                "# TO DECIDE: no caller can be read from the document ({}): every caller's keys are one\n\
                 # pool. Set scope to the header or cookie that names a caller (docs/configuration.md).\n\
                 scope = \"global\"",
                comment(why)
            );
            out.to_decide.push((name.to_owned(), why.clone()));
        }
    }
    out.routes += 1;
}

/// `post-payments-payment_id-refunds`: the method and the document's path, in the characters a
/// route name may use.
fn route_name(method: &http::Method, path: &str) -> String {
    let mut name = method.as_str().to_ascii_lowercase();
    for c in path.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c.to_ascii_lowercase() } else { '-' };
        if c != '-' || !name.ends_with('-') {
            name.push(c);
        }
    }
    let name = name.trim_end_matches('-');
    if name.contains('-') { name.to_owned() } else { format!("{name}-root") }
}

/// `name`, or `name-2`, `name-3`, ... when a route has it already.
fn unused(name: &str, taken: &HashSet<String>, in_block: &HashSet<String>) -> String {
    let free = |n: &str| !taken.contains(n) && !in_block.contains(n);
    if free(name) {
        return name.to_owned();
    }
    (2..).map(|i| format!("{name}-{i}")).find(|n| free(n)).unwrap_or_else(|| name.to_owned())
}

/// The names of the routes inside the file's block for `source`.
fn names_in_block(text: &str, source: &str, config: &Config) -> HashSet<String> {
    let Ok(Some((start, end))) = block_span(text, source) else { return HashSet::new() };
    let inside = &text[start..end];
    config
        .routes
        .iter()
        .filter(|r| inside.lines().any(|line| line.trim() == format!("name = {}", quoted(&r.name))))
        .map(|r| r.name.clone())
        .collect()
}

/// Where the block for `source` is in `text`: from its first line to the end of its last;
/// `Err` when its marker lines are not one pair (a line deleted by hand: replacing from one
/// marker to some other could take routes written by hand with it).
fn block_span(text: &str, source: &str) -> Result<Option<(usize, usize)>, String> {
    let lines = |marker: &str| -> Vec<usize> {
        text.match_indices(marker).map(|(i, _)| i).filter(|&i| i == 0 || text[..i].ends_with('\n')).collect()
    };
    let (begins, end_line) = (lines(&begin_marker(source)), end_marker(source));
    let ends = lines(&end_line);
    match (begins.as_slice(), ends.as_slice()) {
        ([], []) => Ok(None),
        ([start], [end]) if start < end => {
            let end = end + end_line.len();
            Ok(Some((*start, if text[end..].starts_with('\n') { end + 1 } else { end })))
        }
        _ => Err(format!(
            "the block of routes from {source} has {} first and {} last marker lines, not one of each in order: \
             mend it by hand (or delete the block whole) before regenerating",
            begins.len(),
            ends.len()
        )),
    }
}

/// `text` with its block for `source` replaced by `block`, or `block` added at its end.
pub fn merged(text: &str, source: &str, block: &str) -> Result<String, String> {
    Ok(match block_span(text, source)? {
        Some((start, end)) => format!("{}{block}{}", &text[..start], &text[end..]),
        None if text.is_empty() => block.to_owned(),
        None => {
            let sep = if text.ends_with("\n\n") {
                ""
            } else if text.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{text}{sep}{block}")
        }
    })
}

/// A whole configuration around `block`: a listener, a store, the upstream, and a route that
/// passes everything else through as it is today.
pub fn standalone(block: &str, options: &Options<'_>) -> String {
    format!(
        "# A gateway in front of the API of {source}: its keyed operations made idempotent, everything else\n\
         # passed through. Written by `idemgate routes --from-openapi {source}`; set the upstream's address,\n\
         # then `idemgate check --config FILE --openapi {source}` says what is left unprotected.\n\n\
         [server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\n\n\
         [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\n\
         [upstreams.{upstream}]\n# Where the API runs, behind the gateway.\nurl = \"http://127.0.0.1:3000\"\n\n\
         {block}\n\
         # Every other request, as the API answers it today.\n[[routes]]\nname = \"passthrough\"\npath = \"/{{*rest}}\"\n\
         upstream = {quoted_upstream}\n",
        source = comment(options.source),
        upstream = options.upstream,
        quoted_upstream = quoted(options.upstream),
    )
}

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// Text that stays on its comment line.
fn comment(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_method_and_the_path() {
        let post = http::Method::POST;
        assert_eq!(route_name(&post, "/payments/{payment_id}/refunds"), "post-payments-payment_id-refunds");
        assert_eq!(route_name(&post, "/v1.0/Orders/{order-id}"), "post-v1.0-orders-order-id");
        assert_eq!(route_name(&post, "/"), "post-root");
        let taken = HashSet::from(["post-a".to_owned(), "post-a-2".to_owned()]);
        assert_eq!(unused("post-a", &taken, &HashSet::new()), "post-a-3");
    }

    #[test]
    fn a_block_replaces_its_predecessor_and_nothing_else() {
        let block = |body: &str| format!("{}\n{body}\n{}\n", begin_marker("api.yaml"), end_marker("api.yaml"));
        let text = format!("[server]\n{}[[routes]]\nname = \"mine\"\n", block("old"));
        let merge = |text: &str, source: &str, block: &str| merged(text, source, block).unwrap();
        assert_eq!(
            merge(&text, "api.yaml", &block("new")),
            format!("[server]\n{}[[routes]]\nname = \"mine\"\n", block("new"))
        );
        assert_eq!(merge("[server]\n", "api.yaml", &block("new")), format!("[server]\n\n{}", block("new")));
        // A block whose last line was deleted is not guessed at.
        let broken = format!("{}\n[[routes]]\nname = \"mine\"\n", begin_marker("api.yaml"));
        assert!(merged(&broken, "api.yaml", &block("new")).unwrap_err().contains("1 first and 0 last"));
        // Another document's block is another block.
        let other = merge(&text, "other.yaml", "x\n");
        assert!(other.contains("old") && other.ends_with("x\n"), "{other}");
        assert_eq!(quoted("a\"b\\c\n"), r#""a\"b\\c\n""#);
        assert_eq!(comment("a\nb"), "a b");
    }
}
