//! An OpenAPI document read: YAML or JSON, version 3.0 or 3.1, with its references inside
//! the document followed. Everything that is wrong is said with the place it is at, in the
//! document's own terms (`paths./orders.post.parameters[1]: ...`).
//!
//! Hazards: a YAML alias can expand a small file into a huge tree (the parser's budget refuses
//! it); a `$ref` can loop (followed at most [`MOST_HOPS`] times); a `$ref` to another file or
//! a URL would make what the gateway protects depend on what the network answers today, so
//! it is refused, and the document must be bundled into one file first.

use std::fmt;

use percent_encoding::percent_decode_str;

use super::node::Node;

/// References followed from one place before it is called a loop.
const MOST_HOPS: usize = 32;

/// The largest document read (a real API's is a few MiB).
pub const MOST_BYTES: u64 = 64 << 20;

/// What is wrong with a document, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenApiError {
    /// `paths./orders.post`, `components.parameters.Key`, or empty for the whole document.
    pub place: String,
    pub message: String,
}

impl OpenApiError {
    pub fn at(place: impl Into<String>, message: impl Into<String>) -> Self {
        Self { place: place.into(), message: message.into() }
    }
}

impl fmt::Display for OpenApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.place.is_empty() { f.write_str(&self.message) } else { write!(f, "{}: {}", self.place, self.message) }
    }
}

/// How the document was written, so that a merged document is written the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

/// A parsed OpenAPI 3.0 or 3.1 document.
#[derive(Debug, Clone)]
pub struct Document {
    pub root: Node,
    pub format: Format,
    /// `3.0.3`, `3.1.0`, ...
    pub version: String,
}

impl Document {
    /// Reads `text`; JSON when it starts with `{`, YAML otherwise.
    pub fn parse(text: &str) -> Result<Self, OpenApiError> {
        let format = if text.trim_start().starts_with('{') { Format::Json } else { Format::Yaml };
        let root: Node = match format {
            Format::Json => serde_json::from_str(text).map_err(|e| OpenApiError::at("", format!("not JSON: {e}")))?,
            Format::Yaml => serde_saphyr::from_str(text).map_err(|e| OpenApiError::at("", format!("not YAML: {e}")))?,
        };
        if root.as_object().is_none() {
            return Err(OpenApiError::at("", format!("the document is {}, not a mapping", root.kind())));
        }
        if let Some(swagger) = root.get("swagger") {
            let version = scalar(swagger);
            return Err(OpenApiError::at(
                "swagger",
                format!(
                    "this is a Swagger {version} document; idemgate reads OpenAPI 3.0 and 3.1. Convert it first \
                     (converters from Swagger 2.0 to OpenAPI 3 are widely available)"
                ),
            ));
        }
        let version = match root.get("openapi") {
            None => return Err(OpenApiError::at("openapi", "missing: this is not an OpenAPI document")),
            Some(v) => scalar(v),
        };
        if !(version.starts_with("3.0") || version.starts_with("3.1")) {
            return Err(OpenApiError::at(
                "openapi",
                format!("version {version:?} is not read; idemgate reads OpenAPI 3.0 and 3.1"),
            ));
        }
        match root.get("paths") {
            None | Some(Node::Object(_)) => {}
            Some(other) => return Err(OpenApiError::at("paths", format!("must be a mapping, not {}", other.kind()))),
        }
        Ok(Self { root, format, version })
    }

    /// Whether the document is OpenAPI 3.1 (whose schemas are JSON Schema 2020-12).
    pub fn is_3_1(&self) -> bool {
        self.version.starts_with("3.1")
    }

    /// `node` with its `$ref` followed (within this document), and the place it was found at.
    pub fn resolve<'a>(&'a self, node: &'a Node, place: &str) -> Result<(&'a Node, String), OpenApiError> {
        let mut node = node;
        let mut place = place.to_owned();
        for _ in 0..MOST_HOPS {
            let Some(reference) = node.get("$ref") else { return Ok((node, place)) };
            let Some(reference) = reference.as_str() else {
                return Err(OpenApiError::at(format!("{place}.$ref"), "must be a string"));
            };
            let (target, at) = self.pointer(reference).map_err(|why| OpenApiError::at(format!("{place}.$ref"), why))?;
            node = target;
            place = at;
        }
        Err(OpenApiError::at(place, format!("references lead on more than {MOST_HOPS} times: a loop?")))
    }

    /// The node a `#/...` reference names, and its place in dotted form.
    fn pointer(&self, reference: &str) -> Result<(&Node, String), String> {
        let Some(pointer) = reference.strip_prefix('#') else {
            return Err(format!(
                "{reference:?} points outside this document; only references inside it (\"#/...\") are followed. \
                 Bundle the document into one file first"
            ));
        };
        let pointer = percent_decode_str(pointer)
            .decode_utf8()
            .map_err(|_| format!("{reference:?} is not valid UTF-8 once percent-decoded"))?;
        let mut node = &self.root;
        let mut place: Vec<String> = Vec::new();
        if pointer.is_empty() {
            return Ok((node, String::new()));
        }
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(format!("{reference:?} is not a JSON Pointer (\"#/components/...\")"));
        };
        for token in rest.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            node = match node {
                Node::Object(map) => map.get(&token),
                Node::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => None,
            }
            .ok_or_else(|| format!("{reference:?} names nothing in this document"))?;
            place.push(token);
        }
        Ok((node, place.join(".")))
    }
}

/// A scalar as text (`3.0.3`, or `3.1` written as a number).
fn scalar(node: &Node) -> String {
    match node {
        Node::String(s) => s.clone(),
        Node::Int(n) => n.to_string(),
        Node::Float(f) => f.to_string(),
        other => other.kind().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_shapes_are_told_apart() {
        assert!(Document::parse("openapi: 3.1.0\npaths: {}\n").is_ok_and(|d| d.is_3_1()));
        assert!(Document::parse("{\"openapi\": \"3.0.3\", \"paths\": {}}").is_ok_and(|d| d.format == Format::Json));
        let e = Document::parse("swagger: \"2.0\"\npaths: {}\n").unwrap_err();
        assert_eq!(e.place, "swagger");
        assert!(e.message.contains("Swagger 2.0"), "{e}");
        assert!(Document::parse("openapi: 2.5.0\n").unwrap_err().message.contains("\"2.5.0\""));
        assert!(Document::parse("- a\n- b\n").unwrap_err().message.contains("a list"));
        assert!(Document::parse("openapi: 3.1.0\npaths: [1]\n").unwrap_err().to_string().starts_with("paths: "));
        assert!(Document::parse("openapi: 3.1.0\na: 1\na: 2\n").unwrap_err().message.contains("duplicate"));
        assert!(Document::parse("{\"openapi\": \"3.1.0\", \"a\": 1, \"a\": 2}").unwrap_err().message.contains("twice"));
        assert!(Document::parse("{\"openapi\": ").unwrap_err().message.starts_with("not JSON"));
    }

    #[test]
    fn references_are_followed_inside_the_document_only() {
        let doc = Document::parse(
            "openapi: 3.1.0\ncomponents:\n  parameters:\n    A: {$ref: '#/components/parameters/B'}\n    B: {name: k}\n    \
             L: {$ref: '#/components/parameters/L'}\n    R: {$ref: 'other.yaml#/x'}\n    M: {$ref: '#/nope'}\n\
             paths:\n  /o/{id}:\n    get: {}\n  /x:\n    $ref: '#/paths/~1o~1%7Bid%7D'\n",
        )
        .unwrap();
        let at = |name: &str| doc.root.get("components").unwrap().get("parameters").unwrap().get(name).unwrap();
        let (b, place) = doc.resolve(at("A"), "here").unwrap();
        assert_eq!((b.get("name").and_then(Node::as_str), place.as_str()), (Some("k"), "components.parameters.B"));
        assert!(doc.resolve(at("L"), "here").unwrap_err().message.contains("loop"));
        let remote = doc.resolve(at("R"), "here").unwrap_err();
        assert_eq!(remote.place, "here.$ref");
        assert!(remote.message.contains("outside this document"), "{remote}");
        assert!(doc.resolve(at("M"), "here").unwrap_err().message.contains("names nothing"));
        let x = doc.root.get("paths").unwrap().get("/x").unwrap();
        assert_eq!(doc.resolve(x, "paths./x").unwrap().1, "paths./o/{id}");
    }
}
