//! The gateway's contract written into the API's document (`idemgate openapi`): for every
//! operation a keyed route enforces, the key header parameter, the headers the gateway adds
//! to its answers, and every answer the gateway itself may give on that route, from the one
//! error table ([`GatewayError::problem`]) in the shape the route gives its errors
//! (problem+json, or the API's own envelope from `[errors]`).
//!
//! One change, two forms: merged into the document, or as an OpenAPI Overlay 1.0 whose
//! actions are the difference between the document and the merged one ([`overlay`]), so
//! that applying the overlay gives the merged document.

use std::time::Duration;

use http::HeaderName;
use indexmap::IndexMap;

use super::node::{Node, object};
use crate::body::BodyError;
use crate::config::RouteConfig;
use crate::error::{GatewayError, Settling};
use crate::policy::errors::{BodyKind, ErrorShape, Values};
use crate::policy::key::KeyError;
use crate::policy::scope::{MissingScope, ScopeMissing, ScopeSource};
use crate::policy::{IdempotencyPolicy, StoreFailurePolicy, UnknownOutcomePolicy};
use crate::store::StoreError;
use crate::upstream::UpstreamError;

/// The schema of the gateway's problem documents, under `components.schemas`.
pub const PROBLEM_SCHEMA: &str = "IdempotencyProblem";

/// The media type of problem documents (RFC 9457).
const PROBLEM_JSON: &str = "application/problem+json";

/// What the gateway may answer on a route by itself: the error table's rows that can happen
/// there, with the route's settings.
fn answers(policy: &IdempotencyPolicy) -> Vec<GatewayError> {
    let header = policy.header.clone();
    let u = || "upstream".to_owned();
    let mut out: Vec<GatewayError> = Vec::new();
    if policy.required {
        out.push(KeyError::Missing { header: header.clone() }.into());
    }
    out.push(KeyError::Empty { header }.into());
    if let ScopeSource::Caller(sources) = &policy.scope
        && policy.on_missing_scope == MissingScope::Reject
        && sources.iter().any(|s| !s.optional)
    {
        out.push(ScopeMissing { missing: sources.iter().map(|s| s.describe()).collect::<Vec<_>>().join(", ") }.into());
    }
    out.push(GatewayError::ConnectionHeader { header: "idempotency-key".into() });
    out.push(GatewayError::BadHost { detail: "The request has no Host header." });
    out.push(GatewayError::UpgradeRefused);
    out.push(BodyError::Read("the connection failed".into()).into());
    out.push(BodyError::Timeout { limit: Duration::from_secs(30) }.into());
    out.push(BodyError::TooLarge { limit: policy.max_request_body }.into());
    out.push(GatewayError::Mismatch);
    out.push(GatewayError::InFlight { retry_after: Duration::from_secs(1) });
    if policy.max_new_keys.is_some() {
        out.push(GatewayError::TooManyNewKeys { retry_after: Duration::from_secs(1) });
    }
    out.push(UpstreamError::Unreachable { upstream: u(), detail: u() }.into());
    match policy.on_unknown_outcome {
        UnknownOutcomePolicy::Hold => {
            let settling = Settling::of(policy.reconcile.is_some(), Some(Duration::from_secs(1)));
            out.push(GatewayError::OutcomeUnknown { timed_out: false, settling });
            out.push(GatewayError::OutcomeUnknown { timed_out: true, settling });
        }
        UnknownOutcomePolicy::Release => {
            out.push(UpstreamError::Timeout { upstream: u(), timeout: Duration::from_secs(30) }.into());
        }
    }
    if policy.on_store_error == StoreFailurePolicy::FailClosed {
        out.push(GatewayError::StoreUnavailable(StoreError::Full));
    }
    out.push(GatewayError::Overloaded);
    out.push(GatewayError::ShuttingDown { held: None });
    out
}

/// One answer as the route gives it: status, media type, schema, and whether Retry-After
/// comes with it.
struct Shaped {
    slug: &'static str,
    title: &'static str,
    status: u16,
    media: String,
    schema: Node,
    retry_after: bool,
    headers: Vec<String>,
}

fn shaped(problem: &crate::error::Problem, shape: &ErrorShape, base: &str) -> Shaped {
    let own = shape.types.get(problem.slug);
    let status = own.and_then(|t| t.status).unwrap_or(problem.status).as_u16();
    let headers = own.map(|t| t.headers.keys().map(|h| h.as_str().to_owned()).collect()).unwrap_or_default();
    let (media, schema) = match &shape.envelope {
        None => (PROBLEM_JSON.to_owned(), reference("schemas", PROBLEM_SCHEMA)),
        Some(envelope) => {
            let template = own.and_then(|t| t.body.as_ref()).unwrap_or(&envelope.body);
            let type_uri = format!("{base}{}", problem.slug);
            let values = Values {
                kind: problem.slug,
                type_uri: &type_uri,
                title: problem.title,
                detail: &problem.detail,
                status,
                retry_after: 1,
            };
            let schema = match envelope.kind {
                BodyKind::Json => serde_json::from_str::<serde_json::Value>(&template.render(envelope.kind, &values))
                    .map_or_else(|_| object([]), |v| inferred(&v)),
                BodyKind::Text => object([("type", "string".into())]),
            };
            let media = envelope.content_type.to_str().unwrap_or("application/json");
            (media.split(';').next().unwrap_or(media).trim().to_owned(), schema)
        }
    };
    Shaped {
        slug: problem.slug,
        title: problem.title,
        status,
        media,
        schema,
        retry_after: problem.retry_after.is_some(),
        headers,
    }
}

/// The schema of a JSON value as the API's own error template writes it.
fn inferred(value: &serde_json::Value) -> Node {
    use serde_json::Value as V;
    match value {
        V::Object(members) => {
            let properties: IndexMap<String, Node> = members.iter().map(|(k, v)| (k.clone(), inferred(v))).collect();
            let required: Vec<Node> = members.keys().map(|k| Node::from(k.as_str())).collect();
            object([
                ("type", "object".into()),
                ("properties", Node::Object(properties)),
                ("required", Node::Array(required)),
            ])
        }
        V::Array(_) => object([("type", "array".into())]),
        V::String(_) => object([("type", "string".into())]),
        V::Number(n) if n.is_i64() || n.is_u64() => object([("type", "integer".into())]),
        V::Number(_) => object([("type", "number".into())]),
        V::Bool(_) => object([("type", "boolean".into())]),
        V::Null => object([]),
    }
}

/// The gateway's answers on `route`, by status, as OpenAPI response objects.
pub fn responses(route: &RouteConfig, policy: &IdempotencyPolicy, base: &str) -> IndexMap<String, Node> {
    let mut by_status: IndexMap<u16, Vec<Shaped>> = IndexMap::new();
    for error in answers(policy) {
        let answer = shaped(&error.problem(), &route.errors, base);
        by_status.entry(answer.status).or_default().push(answer);
    }
    by_status.sort_keys();
    let mut out = IndexMap::new();
    for (status, answers) in by_status {
        let mut titles: Vec<String> = Vec::new();
        let mut schemas: IndexMap<String, Vec<Node>> = IndexMap::new();
        for answer in &answers {
            let title = format!("`{}` ({})", answer.slug, answer.title);
            if !titles.contains(&title) {
                titles.push(title);
            }
            let list = schemas.entry(answer.media.clone()).or_default();
            if !list.contains(&answer.schema) {
                list.push(answer.schema.clone());
            }
        }
        let description = format!("Answered by the idempotency gateway itself: {}.", titles.join(", "));
        let content: IndexMap<String, Node> = schemas
            .into_iter()
            .map(|(media, mut list)| {
                let schema = if list.len() == 1 { list.remove(0) } else { object([("oneOf", Node::Array(list))]) };
                (media, object([("schema", schema)]))
            })
            .collect();
        let mut response = object([("description", description.into())]);
        let mut headers: IndexMap<String, Node> = IndexMap::new();
        if answers.iter().any(|a| a.retry_after) {
            headers.insert("Retry-After".into(), reference("headers", RETRY_AFTER));
        }
        for name in answers.iter().flat_map(|a| &a.headers) {
            headers.entry(name.clone()).or_insert_with(|| object([("schema", object([("type", "string".into())]))]));
        }
        if let Some(map) = response.as_object_mut() {
            if !headers.is_empty() {
                map.insert("headers".into(), Node::Object(headers));
            }
            map.insert("content".into(), Node::Object(content));
        }
        out.insert(status.to_string(), response);
    }
    out
}

/// `{"$ref": "#/components/KIND/NAME"}`.
fn reference(kind: &str, name: &str) -> Node {
    object([("$ref", format!("#/components/{kind}/{name}").into())])
}

/// The names of the gateway's headers under `components.headers`.
const RETRY_AFTER: &str = "IdempotencyRetryAfter";
const REPLAYED: &str = "IdempotentReplay";
const STATUS: &str = "IdempotencyStatus";

/// What the contract puts under `components`: the problem schema and the headers.
pub fn components() -> [(&'static str, &'static str, Node); 4] {
    [
        ("schemas", PROBLEM_SCHEMA, problem_schema()),
        (
            "headers",
            RETRY_AFTER,
            object([
                ("description", "Seconds to wait before retrying with the same key.".into()),
                ("schema", object([("type", "integer".into()), ("minimum", 1u64.into())])),
            ]),
        ),
        (
            "headers",
            REPLAYED,
            object([
                ("description", "`true` on an answer replayed for a retry: the request ran once, earlier.".into()),
                ("schema", object([("type", "string".into()), ("enum", Node::Array(vec!["true".into()]))])),
            ]),
        ),
        (
            "headers",
            STATUS,
            object([
                (
                    "description",
                    "How the key was handled, when that is not plain: `reconciled` (the answer was found by asking \
                     the API after it had been lost), `bypassed` (the idempotency store was down and the request \
                     ran unprotected), `lease-lost` (the request's claim was taken over while it ran)."
                        .into(),
                ),
                (
                    "schema",
                    object([
                        ("type", "string".into()),
                        ("enum", Node::Array(vec!["reconciled".into(), "bypassed".into(), "lease-lost".into()])),
                    ]),
                ),
            ]),
        ),
    ]
}

/// The key header parameter of a route.
pub fn parameter(policy: &IdempotencyPolicy) -> Node {
    let description = if policy.required {
        "A unique key for this operation (a UUID, say). Send the same key, with the same request, on every \
         retry: the first request runs once, and retries get its answer."
    } else {
        "A unique key for this operation (a UUID, say); without one the request is not protected against \
         running twice. Send the same key, with the same request, on every retry."
    };
    object([
        ("name", header_name(&policy.header).into()),
        ("in", "header".into()),
        ("required", policy.required.into()),
        ("description", description.into()),
        (
            "schema",
            object([
                ("type", "string".into()),
                ("minLength", 1u64.into()),
                ("maxLength", (policy.max_key_len as u64).into()),
            ]),
        ),
    ])
}

/// The headers the gateway adds to the operation's own answers.
pub fn answer_headers(policy: &IdempotencyPolicy) -> IndexMap<String, Node> {
    let mut out = IndexMap::new();
    out.insert(header_name(&policy.replay_header), reference("headers", REPLAYED));
    out.insert("Idempotency-Status".into(), reference("headers", STATUS));
    out
}

/// How a retry of a request whose answer was too large to keep is answered: with the
/// original status and a problem document (`response-not-stored`), when the route's errors
/// are problem+json.
pub fn not_stored(route: &RouteConfig) -> Option<(&'static str, Node)> {
    route.errors.envelope.is_none().then(|| (PROBLEM_JSON, object([("schema", reference("schemas", PROBLEM_SCHEMA))])))
}

/// `Idempotency-Key` as it is usually written (HeaderName keeps names in lower case).
pub fn header_name(name: &HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |c| c.to_ascii_uppercase().to_string() + chars.as_str())
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The problem+json schema (RFC 9457), as the gateway writes its documents.
pub fn problem_schema() -> Node {
    let string = || object([("type", "string".into())]);
    object([
        ("type", "object".into()),
        ("description", "An error the idempotency gateway answered itself (RFC 9457).".into()),
        (
            "properties",
            object([
                ("type", object([("type", "string".into()), ("format", "uri".into())])),
                ("title", string()),
                ("status", object([("type", "integer".into())])),
                ("detail", string()),
            ]),
        ),
        ("required", Node::Array(vec!["type".into(), "title".into(), "status".into(), "detail".into()])),
    ])
}
