//! `[errors]` and `[routes.errors]`: the gateway's errors in the API's own shape.
//!
//! A route's table is read over the file's: its `content_type` and `body` replace the file's,
//! and each `[routes.errors.TYPE]` replaces the file's table for that type. Every template is
//! checked once here: known placeholders only, and a JSON body must be JSON once filled, with
//! values chosen to break one that does not escape them.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue, StatusCode};

use super::Issues;
use crate::config::file::{ErrorTypeSection, ErrorsSection};
use crate::headers;
use crate::policy::errors::{BodyKind, Envelope, ErrorShape, PROBLEM_TYPES, Template, TypeShape, sample_values};

/// The shape `section` (at `key`) gives, over `base` (the file's, for a route).
pub(super) fn shape(
    key: &str,
    section: Option<&ErrorsSection>,
    base: &ErrorShape,
    issues: &mut Issues,
) -> Option<ErrorShape> {
    let Some(section) = section else { return Some(base.clone()) };
    let mut ok = true;
    let kind_and_type = match &section.content_type {
        None => None,
        Some(text) => match (BodyKind::of(text), HeaderValue::from_str(text)) {
            (Ok(kind), Ok(value)) => Some((kind, value)),
            (Err(e), _) => {
                issues.add(format!("{key}.content_type"), e);
                ok = false;
                None
            }
            (_, Err(_)) => {
                issues.add(format!("{key}.content_type"), format!("{text:?} is not a header value"));
                ok = false;
                None
            }
        },
    };
    // The content type this level writes with: its own, or the one it inherits.
    let inherited = base.envelope.as_ref().map(|e| (e.kind, e.content_type.clone()));
    let writing = kind_and_type.clone().or(inherited);
    let envelope = match (&section.body, &writing) {
        (None, _) if kind_and_type.is_some() && base.envelope.is_none() => {
            issues
                .add(format!("{key}.body"), "is required with content_type: the body template for every problem type");
            ok = false;
            None
        }
        (None, _) => match (kind_and_type, &base.envelope) {
            // A new content type for the inherited body: checked again in the new kind.
            (Some((kind, content_type)), Some(inherited)) => {
                ok &= checked(&format!("{key}.content_type"), &inherited.body, kind, "no-route", issues);
                Some(Envelope { kind, content_type, body: inherited.body.clone() })
            }
            _ => base.envelope.clone(),
        },
        (Some(_), None) => {
            issues.add(format!("{key}.body"), "needs a content_type (application/json or text/plain)");
            ok = false;
            None
        }
        (Some(text), Some((kind, content_type))) => {
            match template(&format!("{key}.body"), text, *kind, "no-route", issues) {
                Some(body) => Some(Envelope { kind: *kind, content_type: content_type.clone(), body }),
                None => {
                    ok = false;
                    None
                }
            }
        }
    };
    let mut types = base.types.clone();
    for (slug, section) in &section.types {
        let at = format!("{key}.{slug}");
        if !PROBLEM_TYPES.contains(&slug.as_str()) {
            issues.add(&at, format!("is not a problem type; the types are {}", PROBLEM_TYPES.join(", ")));
            ok = false;
            continue;
        }
        match type_shape(&at, slug, section, writing.as_ref().map(|(k, _)| *k), issues) {
            Some(shape) => {
                types.insert(slug.clone(), shape);
            }
            None => ok = false,
        }
    }
    ok.then_some(ErrorShape { envelope, types })
}

fn type_shape(
    key: &str,
    slug: &str,
    section: &ErrorTypeSection,
    kind: Option<BodyKind>,
    issues: &mut Issues,
) -> Option<TypeShape> {
    let mut ok = true;
    let status = match section.status {
        None => None,
        Some(code) => match u16::try_from(code).ok().filter(|c| (200..600).contains(c)).map(StatusCode::from_u16) {
            Some(Ok(status)) => Some(status),
            _ => {
                issues.add(format!("{key}.status"), format!("{code} is not a status between 200 and 599"));
                ok = false;
                None
            }
        },
    };
    let body = match (&section.body, kind) {
        (None, _) => None,
        (Some(_), None) => {
            issues.add(format!("{key}.body"), "needs a content_type in [errors] (or the route's [routes.errors])");
            ok = false;
            None
        }
        (Some(text), Some(kind)) => {
            let body = template(&format!("{key}.body"), text, kind, slug, issues);
            ok &= body.is_some();
            body
        }
    };
    let headers = headers_of(key, section.headers.as_ref(), issues);
    ok &= headers.is_some();
    ok.then(|| TypeShape { status, body, headers: headers.unwrap_or_default() })
}

fn headers_of(key: &str, headers: Option<&BTreeMap<String, String>>, issues: &mut Issues) -> Option<http::HeaderMap> {
    let mut out = http::HeaderMap::new();
    let mut ok = true;
    for (name, value) in headers.into_iter().flatten() {
        let at = format!("{key}.headers.{name}");
        let parsed = HeaderName::from_bytes(name.as_bytes()).ok();
        match (parsed, HeaderValue::from_str(value)) {
            (Some(name), _) if headers::is_hop_by_hop(&name) => {
                issues.add(at, "a hop-by-hop header cannot be set on an answer");
                ok = false;
            }
            (Some(name), _)
                if name == http::header::CONTENT_TYPE
                    || name == http::header::CONTENT_LENGTH
                    || name == http::header::RETRY_AFTER =>
            {
                issues.add(at, "is set by the gateway (content_type sets Content-Type)");
                ok = false;
            }
            (Some(name), Ok(value)) => {
                out.append(name, value);
            }
            (None, _) => {
                issues.add(at, format!("{name:?} is not a header name"));
                ok = false;
            }
            (_, Err(_)) => {
                issues.add(at, format!("{value:?} is not a header value"));
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn template(key: &str, text: &str, kind: BodyKind, slug: &str, issues: &mut Issues) -> Option<Template> {
    let template = issues.check(key, Template::parse(text))?;
    checked(key, &template, kind, slug, issues).then_some(template)
}

/// Whether a JSON template is JSON once filled (with and without a Retry-After).
fn checked(key: &str, template: &Template, kind: BodyKind, slug: &str, issues: &mut Issues) -> bool {
    if kind != BodyKind::Json {
        return true;
    }
    for retry_after in [0, 30] {
        let values = crate::policy::errors::Values { kind: slug, ..sample_values(retry_after) };
        let body = template.render(kind, &values);
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&body) {
            issues.add(key, format!("is not JSON once filled ({e}): {body}"));
            return false;
        }
    }
    true
}
