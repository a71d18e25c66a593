//! Where the contract goes ([`Target`]: an operation and the route that enforces it), the
//! contract merged into a document ([`merge`]), and the same change as an OpenAPI Overlay 1.0
//! ([`overlay`]): the difference between the document and the merged one, as actions.
//!
//! Hazard: an Overlay `update` replaces a list it names, and can only append to a list it
//! targets; so every list is only ever appended to (a parameter), and a response that was a
//! `$ref` (shared with operations the gateway does not touch) is copied into the operation
//! before headers are added to it, never changed where it is shared.

use indexmap::IndexMap;

use super::contract::{answer_headers, components, not_stored, parameter, responses};
use super::document::Document;
use super::node::{Node, object};
use super::operations::Operation;
use crate::config::reach::{Reach, enforces};
use crate::config::{Config, RouteConfig};
use crate::policy::IdempotencyPolicy;

/// One operation the gateway enforces idempotency on, and the route that does.
pub struct Target<'a> {
    /// The path as the document writes it.
    pub path: String,
    /// `post`, as the document writes it.
    pub method: String,
    pub route: &'a RouteConfig,
    pub policy: &'a IdempotencyPolicy,
}

/// The operations of a document that reach a route enforcing idempotency (for some host).
pub fn targets_in<'a>(config: &'a Config, operations: &[Operation], notes: &mut Vec<String>) -> Vec<Target<'a>> {
    let Some(reach) = Reach::new(&config.routes) else { return Vec::new() };
    let probes = reach.probes();
    let mut out = Vec::new();
    for op in operations {
        let path = reach.sample(&op.pattern);
        let routes = probes.iter().filter_map(|p| reach.find(p.host.as_deref(), &op.method, &path));
        let mut observed = None;
        let mut found = None;
        for r in routes {
            let route = &config.routes[r];
            if enforces(route) {
                found = found.or(Some(route));
            } else if route.idempotency.is_some() {
                observed = observed.or(Some(route));
            }
        }
        match (found, observed) {
            (Some(route), _) => {
                let Some(policy) = route.idempotency.as_deref() else { continue };
                out.push(Target {
                    path: op.path.clone(),
                    method: op.method.as_str().to_ascii_lowercase(),
                    route,
                    policy,
                });
            }
            (None, Some(route)) => notes.push(format!(
                "{}: route {:?} only observes (mode = \"observe\"): clients see no change until it enforces",
                op.place, route.name
            )),
            (None, None) => {}
        }
    }
    out
}

/// Without a document: the operations the keyed routes name, at their paths less `base_path`.
pub fn targets_of_routes<'a>(config: &'a Config, base_path: &str, notes: &mut Vec<String>) -> Vec<Target<'a>> {
    let mut out = Vec::new();
    for route in config.routes.iter().filter(|r| enforces(r)) {
        let Some(policy) = route.idempotency.as_deref() else { continue };
        if route.path.contains("{*") {
            notes.push(format!(
                "route {:?}: {} is a tail, which names no operation of a document; give --spec",
                route.name, route.path
            ));
            continue;
        }
        let Some(path) = route.path.strip_prefix(base_path).filter(|p| p.starts_with('/') || p.is_empty()) else {
            notes.push(format!("route {:?}: {} is not under --base-path {base_path}", route.name, route.path));
            continue;
        };
        let path = if path.is_empty() { "/" } else { path };
        let methods: Vec<String> = match &route.methods {
            Some(methods) => methods.iter().map(|m| m.as_str().to_ascii_lowercase()).collect(),
            None => {
                notes.push(format!(
                    "route {:?} takes every method: written for POST (give --spec for the rest)",
                    route.name
                ));
                vec!["post".to_owned()]
            }
        };
        for method in methods {
            out.push(Target { path: path.to_owned(), method, route, policy });
        }
    }
    out
}

/// A document with only the operations of `targets`, each with an empty list of parameters
/// and no responses: what an overlay is written against when the document is not given.
pub fn skeleton(targets: &[Target<'_>]) -> Node {
    let mut paths: IndexMap<String, Node> = IndexMap::new();
    for target in targets {
        let item = paths.entry(target.path.clone()).or_insert_with(Node::object);
        if let Some(item) = item.as_object_mut() {
            item.insert(
                target.method.clone(),
                object([("parameters", Node::Array(Vec::new())), ("responses", Node::object())]),
            );
        }
    }
    object([("openapi", "3.1.0".into()), ("paths", Node::Object(paths))])
}

/// Writes the contract of every target into `root`; `original` resolves its references.
pub fn merge(root: &mut Node, original: &Document, targets: &[Target<'_>], base: &str, notes: &mut Vec<String>) {
    let mut shaped_otherwise = Vec::new();
    for target in targets {
        let at = format!("paths.{}.{}", target.path, target.method);
        let Some(operation) = operation_mut(root, &target.path, &target.method) else {
            notes.push(format!("{at}: written by reference; the contract is not added to it"));
            continue;
        };
        let Some(operation) = operation.as_object_mut() else { continue };
        // The key parameter, unless the operation declares it already.
        let key = target.policy.header.as_str();
        let declares = |p: &Node| {
            let p = original.resolve(p, "").map_or(p, |(p, _)| p);
            p.get("in").and_then(Node::as_str) == Some("header")
                && p.get("name").and_then(Node::as_str).is_some_and(|n| n.eq_ignore_ascii_case(key))
        };
        let parameters = operation.entry("parameters".to_owned()).or_insert_with(|| Node::Array(Vec::new()));
        if let Node::Array(list) = parameters
            && !list.iter().any(declares)
        {
            list.push(parameter(target.policy));
        }
        let responses_node = operation.entry("responses".to_owned()).or_insert_with(Node::object);
        let Some(existing) = responses_node.as_object_mut() else { continue };
        let headers = answer_headers(target.policy);
        let not_stored = not_stored(target.route);
        for (status, response) in existing.iter_mut() {
            inline(response, original);
            add_all(response, "headers", &headers);
            // A 2xx with a body may come back, to a retry, as a problem document with its status.
            if let Some((media, schema)) = &not_stored
                && status.starts_with('2')
                && response.get("content").is_some()
            {
                add_all(response, "content", &IndexMap::from([((*media).to_owned(), schema.clone())]));
            }
        }
        // Statuses the API describes in another shape: a generated client reads one shape per
        // status (the first), so the gateway's answer there is read in the API's.
        let mut described = Vec::new();
        for (status, ours) in responses(target.route, target.policy, base) {
            match existing.get_mut(&status) {
                None => {
                    existing.insert(status, ours);
                }
                Some(theirs) => {
                    let media = |n: &Node| {
                        n.get("content").and_then(Node::as_object).map(|c| c.keys().cloned().collect::<Vec<_>>())
                    };
                    if let (Some(their), Some(our)) = (media(theirs), media(&ours))
                        && !their.is_empty()
                        && !our.iter().all(|m| their.contains(m))
                    {
                        described.push(status.clone());
                    }
                    if let Some(content) = ours.get("content").and_then(Node::as_object) {
                        add_all(theirs, "content", content);
                    }
                    if let Some(headers) = ours.get("headers").and_then(Node::as_object) {
                        add_all(theirs, "headers", headers);
                    }
                }
            }
        }
        if !described.is_empty() {
            shaped_otherwise.push(format!("{at} ({})", described.join(", ")));
        }
    }
    if !shaped_otherwise.is_empty() {
        let more = shaped_otherwise.len().saturating_sub(3);
        shaped_otherwise.truncate(3);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        notes.push(format!(
            "the API describes its own answers, in another shape than the gateway's, for statuses the gateway also \
             gives at {}{more}: a client generated from the document reads the gateway's answers there in the \
             API's shape; give those routes the API's error shape ([errors], docs/errors.md)",
            shaped_otherwise.join(", ")
        ));
    }
    if targets.is_empty() {
        return;
    }
    // What the answers refer to; a document's own component of the same name is kept.
    for (kind, name, value) in components() {
        let Some(root) = root.as_object_mut() else { return };
        let components = root.entry("components".to_owned()).or_insert_with(Node::object);
        let Some(kinds) = components.as_object_mut() else { return };
        if let Some(named) = kinds.entry(kind.to_owned()).or_insert_with(Node::object).as_object_mut() {
            named.entry(name.to_owned()).or_insert(value);
        }
    }
}

/// The operation at `path` and `method`, unless the path item or it is a reference.
fn operation_mut<'a>(root: &'a mut Node, path: &str, method: &str) -> Option<&'a mut Node> {
    let item = root.as_object_mut()?.get_mut("paths")?.as_object_mut()?.get_mut(path)?;
    if item.get("$ref").is_some() {
        return None;
    }
    let operation = item.as_object_mut()?.get_mut(method)?;
    (operation.get("$ref").is_none()).then_some(operation)
}

/// A response that is a reference becomes a copy of what it names, to be changed alone.
fn inline(response: &mut Node, original: &Document) {
    if response.get("$ref").is_some()
        && let Ok((target, _)) = original.resolve(response, "")
    {
        *response = target.clone();
    }
}

/// Adds each of `members` that `node.field` lacks, creating `field` when absent.
fn add_all(node: &mut Node, field: &str, members: &IndexMap<String, Node>) {
    let Some(node) = node.as_object_mut() else { return };
    let Some(map) = node.entry(field.to_owned()).or_insert_with(Node::object).as_object_mut() else { return };
    for (name, value) in members {
        if !map.keys().any(|k| k.eq_ignore_ascii_case(name)) {
            map.insert(name.clone(), value.clone());
        }
    }
}

/// The Overlay 1.0 document that turns `original` into `merged`: removals first (a reference
/// replaced by its copy), then updates, each on the deepest node that changed.
pub fn overlay(original: &Node, merged: &Node, title: &str, extends: Option<&str>) -> Node {
    let mut removes = Vec::new();
    let mut updates = Vec::new();
    diff(original, merged, "$", &mut removes, &mut updates);
    let info = object([("title", title.into()), ("version", "1.0.0".into())]);
    let mut doc = object([("overlay", "1.0.0".into()), ("info", info)]);
    if let (Some(extends), Some(map)) = (extends, doc.as_object_mut()) {
        map.insert("extends".into(), extends.into());
    }
    removes.extend(updates);
    if let Some(map) = doc.as_object_mut() {
        map.insert("actions".into(), Node::Array(removes));
    }
    doc
}

fn diff(before: &Node, after: &Node, at: &str, removes: &mut Vec<Node>, updates: &mut Vec<Node>) {
    // Only mappings change: the merge adds members and appends to lists, nothing else.
    if let (Node::Object(a), Node::Object(b)) = (before, after) {
        {
            let mut added: IndexMap<String, Node> = IndexMap::new();
            for (key, new) in b {
                match a.get(key) {
                    None => {
                        added.insert(key.clone(), new.clone());
                    }
                    Some(old) if old == new => {}
                    Some(old @ Node::Object(_)) if matches!(new, Node::Object(_)) => {
                        diff(old, new, &member(at, key), removes, updates);
                    }
                    Some(Node::Array(old)) if matches!(new, Node::Array(n) if n.starts_with(old)) => {
                        for item in &new.as_array().unwrap_or_default()[old.len()..] {
                            updates.push(object([("target", member(at, key).into()), ("update", item.clone())]));
                        }
                    }
                    Some(_) => {
                        added.insert(key.clone(), new.clone());
                    }
                }
            }
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                removes.push(object([("target", member(at, key).into()), ("remove", true.into())]));
            }
            if !added.is_empty() {
                updates.push(object([("target", at.into()), ("update", Node::Object(added))]));
            }
        }
    }
}

/// `$['paths']['/orders']`: a member in JSONPath's bracket notation (RFC 9535).
fn member(at: &str, key: &str) -> String {
    format!("{at}['{}']", key.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_is_the_difference_as_removals_then_updates() {
        let parse = |s: &str| -> Node { serde_json::from_str(s).unwrap() };
        let before =
            parse(r##"{"paths": {"/o'x": {"post": {"parameters": [1], "responses": {"400": {"$ref": "#/r"}}}}}}"##);
        let after = parse(
            r#"{"paths": {"/o'x": {"post": {"parameters": [1, 2], "responses": {"400": {"description": "d"}, "409": {}}}}}, "components": {}}"#,
        );
        let doc = overlay(&before, &after, "t", Some("api.yaml"));
        let actions: Vec<String> = doc
            .get("actions")
            .and_then(Node::as_array)
            .unwrap()
            .iter()
            .map(|a| serde_json::to_string(a).unwrap())
            .collect();
        let op = r"$['paths']['/o\'x']['post']";
        assert_eq!(
            actions,
            [
                format!(r#"{{"target":"{op}['responses']['400']['$ref']","remove":true}}"#),
                format!(r#"{{"target":"{op}['parameters']","update":2}}"#),
                format!(r#"{{"target":"{op}['responses']['400']","update":{{"description":"d"}}}}"#),
                format!(r#"{{"target":"{op}['responses']","update":{{"409":{{}}}}}}"#),
                r#"{"target":"$","update":{"components":{}}}"#.to_owned(),
            ]
            .map(|s| s.replace(r"\'", r"\\'"))
        );
        assert_eq!(doc.get("extends").and_then(Node::as_str), Some("api.yaml"));
    }
}
