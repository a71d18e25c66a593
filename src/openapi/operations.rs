//! The operations of a document, as the gateway would route them: method, the path clients
//! send (the `servers` path prefix, then the template in the router's syntax), the
//! idempotency key the operation declares, and who the caller is (`securitySchemes`).

use std::collections::HashMap;

use http::Method;

use super::document::{Document, OpenApiError};
use super::node::Node;

/// The methods a path item may hold, in the order OpenAPI lists them.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// One operation of the document.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub method: Method,
    /// The path as the document writes it (`/payments/{payment_id}`).
    pub path: String,
    /// What clients send, in the router's syntax (`/v1/payments/{payment_id}`).
    pub pattern: String,
    /// Where it is: `paths./payments/{payment_id}.post`.
    pub place: String,
    pub operation_id: Option<String>,
    /// The idempotency key header it declares, if any.
    pub key: Option<KeyParameter>,
    /// Who calls it, from its security requirements.
    pub scope: Scope,
    /// What a reader of generated routes should know (a template widened, a prefix chosen).
    pub notes: Vec<String>,
}

/// An `Idempotency-Key` (or `X-Idempotency-Key`, ...) header parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyParameter {
    /// The header's name as written.
    pub header: String,
    pub required: bool,
    /// The schema's `maxLength`.
    pub max_len: Option<u64>,
}

/// The route scope an operation's security gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Sources that together name the caller (`header:X-Api-Key`); `optional`: the document
    /// also lets a caller in without them (an empty requirement).
    Callers { sources: Vec<String>, optional: bool },
    /// No scope can be read from the document: why (said in the routes, not guessed).
    Unknown(String),
}

impl Operation {
    /// How generated routes and reports name it: `createPayment (POST /v1/payments)`.
    pub fn label(&self) -> String {
        match &self.operation_id {
            Some(id) => format!("{id} ({} {})", self.method, self.pattern),
            None => format!("{} {}", self.method, self.pattern),
        }
    }
}

/// Every operation of `doc`, in the document's order, or every problem that stops reading one.
pub fn operations(doc: &Document) -> Result<Vec<Operation>, Vec<OpenApiError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut names = ParameterNames::default();
    let Some(paths) = doc.root.get("paths").and_then(Node::as_object) else { return Ok(out) };
    for (path, item) in paths {
        let place = format!("paths.{path}");
        if path.starts_with("x-") {
            continue;
        }
        if !path.starts_with('/') {
            errors.push(OpenApiError::at(place, "a path must start with '/'"));
            continue;
        }
        let item = match doc.resolve(item, &place) {
            Ok((item, _)) if item.as_object().is_some() => item,
            Ok((other, _)) => {
                errors.push(OpenApiError::at(place, format!("must be a mapping, not {}", other.kind())));
                continue;
            }
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let item = Item { path, node: item, place: &place };
        for method in METHODS {
            let Some(operation) = item.node.get(method) else { continue };
            match operation_of(doc, &item, method, operation, &mut names) {
                Ok(op) => out.push(op),
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() { Ok(out) } else { Err(errors) }
}

/// A path item, where its operations are read.
struct Item<'a> {
    path: &'a str,
    node: &'a Node,
    place: &'a str,
}

fn operation_of(
    doc: &Document,
    item: &Item<'_>,
    method: &str,
    operation: &Node,
    names: &mut ParameterNames,
) -> Result<Operation, OpenApiError> {
    let (operation, place) = doc.resolve(operation, &format!("{}.{method}", item.place))?;
    if operation.as_object().is_none() {
        return Err(OpenApiError::at(place, format!("must be a mapping, not {}", operation.kind())));
    }
    let operation_id = match operation.get("operationId") {
        None => None,
        Some(Node::String(id)) => Some(id.chars().filter(|c| !c.is_control()).collect()),
        Some(other) => {
            return Err(OpenApiError::at(
                format!("{place}.operationId"),
                format!("must be a string, not {}", other.kind()),
            ));
        }
    };
    let mut key = None;
    // The operation's own parameters after the path item's: it overrides one of the same name.
    let lists = [
        (item.node.get("parameters"), format!("{}.parameters", item.place)),
        (operation.get("parameters"), format!("{place}.parameters")),
    ];
    for (list, at) in lists {
        let Some(list) = list else { continue };
        let Some(items) = list.as_array() else {
            return Err(OpenApiError::at(at, format!("must be a list, not {}", list.kind())));
        };
        for (i, parameter) in items.iter().enumerate() {
            let (parameter, p_at) = doc.resolve(parameter, &format!("{at}[{i}]"))?;
            let name = parameter.get("name").and_then(Node::as_str);
            let location = parameter.get("in").and_then(Node::as_str);
            let (Some(name), Some(location)) = (name, location) else {
                return Err(OpenApiError::at(p_at, "a parameter needs a string `name` and `in`"));
            };
            if location == "header" && name.to_ascii_lowercase().ends_with("idempotency-key") {
                let required = parameter.get("required").and_then(Node::as_bool).unwrap_or(false);
                let schema = match parameter.get("schema") {
                    Some(schema) => Some(doc.resolve(schema, &format!("{p_at}.schema"))?.0),
                    None => None,
                };
                let max_len = schema.and_then(|s| s.get("maxLength")).and_then(Node::as_u64);
                key = Some(KeyParameter { header: name.to_owned(), required, max_len });
            }
        }
    }
    let (prefix, mut notes) = server_prefix(doc, item.node, operation, &place)?;
    let pattern = names.pattern(&prefix, item.path, &mut notes);
    let scope = scope(doc, operation, &place)?;
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| OpenApiError::at(place.clone(), "not an HTTP method"))?;
    Ok(Operation { method, path: item.path.to_owned(), pattern, place, operation_id, key, scope, notes })
}

/// The path prefix clients send before the operation's path: the first of its `servers` (the
/// operation's, else the path item's, else the document's), with its variables at their
/// defaults; and a note when other servers have another prefix.
fn server_prefix(
    doc: &Document,
    item: &Node,
    operation: &Node,
    place: &str,
) -> Result<(String, Vec<String>), OpenApiError> {
    let servers = operation.get("servers").or_else(|| item.get("servers")).or_else(|| doc.root.get("servers"));
    let Some(servers) = servers else { return Ok((String::new(), Vec::new())) };
    let Some(list) = servers.as_array() else {
        return Err(OpenApiError::at(format!("{place}.servers"), format!("must be a list, not {}", servers.kind())));
    };
    let mut prefixes = Vec::new();
    for (i, server) in list.iter().enumerate() {
        let at = format!("servers[{i}]");
        let Some(url) = server.get("url").and_then(Node::as_str) else {
            return Err(OpenApiError::at(at, "a server needs a string `url`"));
        };
        let mut url = url.to_owned();
        if let Some(variables) = server.get("variables").and_then(Node::as_object) {
            for (name, variable) in variables {
                let value = variable.get("default").and_then(Node::as_str).unwrap_or_default();
                url = url.replace(&format!("{{{name}}}"), value);
            }
        }
        prefixes.push(path_of(&url).map_err(|why| OpenApiError::at(format!("{at}.url"), why))?);
    }
    let Some(first) = prefixes.first().cloned() else { return Ok((String::new(), Vec::new())) };
    let mut notes = Vec::new();
    if prefixes.iter().any(|p| *p != first) {
        notes.push(format!(
            "servers differ in their path prefix ({}); routed under the first, {:?}",
            prefixes.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", "),
            if first.is_empty() { "/" } else { &first }
        ));
    }
    Ok((first, notes))
}

/// The path of a server URL, without a trailing slash (`https://api.example.com/v1/` → `/v1`).
fn path_of(url: &str) -> Result<String, String> {
    let rest = match url.split_once("://") {
        Some((_, rest)) => rest,
        None => url.strip_prefix("//").unwrap_or(url),
    };
    let path =
        if url.contains("://") || url.starts_with("//") { rest.find('/').map_or("", |i| &rest[i..]) } else { rest };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.contains('{') {
        return Err(format!("{url:?} has a variable without a default in its path"));
    }
    let path = path.trim_end_matches('/');
    Ok(if path.is_empty() || path.starts_with('/') { path.to_owned() } else { format!("/{path}") })
}

/// Parameter names by position: the router wants one name per position of a path (`/o/{id}`
/// and `/o/{order_id}/items` conflict), while names mean nothing to it.
#[derive(Default)]
struct ParameterNames(HashMap<String, String>);

impl ParameterNames {
    /// `prefix` + `path` in the router's syntax: each parameter a whole segment named
    /// `A-Z a-z 0-9 _`; a segment with text around its parameter is widened to the whole
    /// segment (and noted).
    fn pattern(&mut self, prefix: &str, path: &str, notes: &mut Vec<String>) -> String {
        let mut out = String::from(prefix);
        let mut shape = String::from(prefix);
        for segment in path.trim_end_matches('/').split('/').skip(1) {
            out.push('/');
            shape.push('/');
            let Some(open) = segment.find('{') else {
                out.push_str(segment);
                shape.push_str(segment);
                continue;
            };
            let close = segment[open..].find('}').map_or(segment.len(), |c| open + c);
            let name: String = segment[open + 1..close]
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
                .collect();
            let name = if name.is_empty() { "param".to_owned() } else { name };
            if segment != format!("{{{}}}", &segment[open + 1..close]) {
                notes.push(format!("the segment {segment:?} is routed whole, as {{{name}}}"));
            }
            let chosen = self.0.entry(shape.clone()).or_insert(name);
            out.push_str(&format!("{{{chosen}}}"));
            shape.push_str("{}");
        }
        if out.is_empty() { "/".to_owned() } else { out }
    }
}

/// The route scope of an operation: its `security` (or the document's), each requirement's
/// schemes read from `components.securitySchemes`.
fn scope(doc: &Document, operation: &Node, place: &str) -> Result<Scope, OpenApiError> {
    let (security, at) = match operation.get("security") {
        Some(s) => (s, format!("{place}.security")),
        None => match doc.root.get("security") {
            Some(s) => (s, "security".to_owned()),
            None => return Ok(Scope::Unknown("the document declares no security for it".into())),
        },
    };
    let Some(requirements) = security.as_array() else {
        return Err(OpenApiError::at(at, format!("must be a list, not {}", security.kind())));
    };
    if requirements.is_empty() {
        return Ok(Scope::Unknown("its security is empty: anyone may call it".into()));
    }
    let optional = requirements.iter().any(|r| r.as_object().is_some_and(|m| m.is_empty()));
    let mut chosen: Option<Vec<String>> = None;
    let mut unknown = None;
    for (i, requirement) in requirements.iter().enumerate() {
        let Some(schemes) = requirement.as_object() else {
            return Err(OpenApiError::at(format!("{at}[{i}]"), "a security requirement must be a mapping"));
        };
        if schemes.is_empty() {
            continue;
        }
        let mut sources = Vec::new();
        for name in schemes.keys() {
            match source(doc, name)? {
                Ok(source) => sources.push(source),
                Err(why) => {
                    unknown.get_or_insert(why);
                    sources.clear();
                    break;
                }
            }
        }
        if !sources.is_empty() && chosen.is_none() {
            chosen = Some(sources);
        }
    }
    Ok(match (chosen, unknown) {
        (Some(sources), _) => Scope::Callers { sources, optional },
        (None, Some(why)) => Scope::Unknown(why),
        (None, None) => Scope::Unknown("its security lets anyone call it".into()),
    })
}

/// The scope source of one security scheme, or why none can be read from it.
fn source(doc: &Document, name: &str) -> Result<Result<String, String>, OpenApiError> {
    let at = format!("components.securitySchemes.{name}");
    let scheme = doc.root.get("components").and_then(|c| c.get("securitySchemes")).and_then(|s| s.get(name));
    let Some(scheme) = scheme else {
        return Err(OpenApiError::at(at, "a security requirement names this scheme, which is not declared"));
    };
    let (scheme, at) = doc.resolve(scheme, &at)?;
    let kind = scheme.get("type").and_then(Node::as_str).unwrap_or_default();
    Ok(match kind {
        "apiKey" => {
            let key = scheme.get("name").and_then(Node::as_str).unwrap_or_default();
            match scheme.get("in").and_then(Node::as_str) {
                Some("header") if !key.is_empty() => Ok(format!("header:{key}")),
                Some("cookie") if !key.is_empty() => Ok(format!("cookie:{key}")),
                Some("query") => Err(format!("scheme {name:?} sends its key in the query, which a scope cannot read")),
                _ => {
                    return Err(OpenApiError::at(
                        at,
                        "an apiKey scheme needs `name` and `in` (header, query or cookie)",
                    ));
                }
            }
        }
        "http" | "oauth2" | "openIdConnect" => Ok("header:Authorization".to_owned()),
        "mutualTLS" => {
            Err(format!("scheme {name:?} names the caller by its client certificate, which a scope cannot read"))
        }
        other => {
            return Err(OpenApiError::at(format!("{at}.type"), format!("{other:?} is not a security scheme type")));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(yaml: &str) -> Vec<Operation> {
        let doc = Document::parse(yaml).unwrap_or_else(|e| panic!("{e}"));
        operations(&doc).unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn paths_are_routed_as_clients_send_them() {
        let found = ops("openapi: 3.0.3\n\
             servers:\n  - url: 'https://{region}.example.com/{version}/'\n    variables:\n      region: {default: eu}\n      version: {default: v2}\n\
             paths:\n  /o/{order-id}:\n    get: {}\n  /o/{id}/items:\n    post:\n      servers: [{url: /other}]\n  /files/{name}.json:\n    put: {}\n");
        let patterns: Vec<&str> = found.iter().map(|o| o.pattern.as_str()).collect();
        // One name per position (the router's rule), the first one's; a partial segment widened.
        assert_eq!(patterns, ["/v2/o/{order_id}", "/other/o/{id}/items", "/v2/files/{name}"]);
        assert_eq!(found[0].place, "paths./o/{order-id}.get");
        assert!(found[2].notes[0].contains("routed whole"), "{:?}", found[2].notes);
        assert_eq!(path_of("//cdn.example.com").as_deref(), Ok(""));
        assert_eq!(path_of("v1").as_deref(), Ok("/v1"));
        assert!(path_of("https://x/{v}").is_err());
    }

    #[test]
    fn the_key_and_the_scope_come_from_the_document() {
        let found = ops("openapi: 3.1.0\nsecurity: [{key: []}]\n\
             components:\n  securitySchemes:\n    key: {type: apiKey, in: header, name: X-Api-Key}\n    bearer: {type: http, scheme: bearer}\n    \
             q: {type: apiKey, in: query, name: k}\n    c: {type: apiKey, in: cookie, name: sid}\n    \
             acct: {type: apiKey, in: header, name: X-Account}\n  parameters:\n    K: {name: Idempotency-Key, in: header, required: true, schema: {$ref: '#/components/schemas/S'}}\n  \
             schemas:\n    S: {type: string, maxLength: 64}\n\
             paths:\n  /a:\n    parameters: [{$ref: '#/components/parameters/K'}]\n    post: {}\n    \
             put: {security: [{bearer: []}], parameters: [{name: X-Idempotency-Key, in: header}]}\n    \
             patch: {security: [{q: []}]}\n    delete: {security: [{}, {c: [], acct: []}]}\n  /b:\n    post: {security: []}\n");
        let by = |m: Method| found.iter().find(|o| o.method == m && o.path == "/a").unwrap_or_else(|| panic!("{m}"));
        let (post, put, patch, delete) = (by(Method::POST), by(Method::PUT), by(Method::PATCH), by(Method::DELETE));
        assert_eq!(
            post.key,
            Some(KeyParameter { header: "Idempotency-Key".into(), required: true, max_len: Some(64) })
        );
        assert_eq!(post.scope, Scope::Callers { sources: vec!["header:X-Api-Key".into()], optional: false });
        // The operation's own key parameter over the path item's.
        assert_eq!(put.key.as_ref().map(|k| (k.header.as_str(), k.required)), Some(("X-Idempotency-Key", false)));
        assert_eq!(put.scope, Scope::Callers { sources: vec!["header:Authorization".into()], optional: false });
        assert!(matches!(&patch.scope, Scope::Unknown(why) if why.contains("query")), "{:?}", patch.scope);
        let both = vec!["cookie:sid".to_owned(), "header:X-Account".to_owned()];
        assert_eq!(delete.scope, Scope::Callers { sources: both, optional: true });
        assert!(matches!(&found[4].scope, Scope::Unknown(why) if why.contains("anyone")));
        assert!(found[4].key.is_none());
    }
}
