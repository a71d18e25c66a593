//! `GET /audit`: the audit trail the store keeps, newest first, a page at a time.
//!
//! ```text
//! GET /audit[?cursor=C&limit=N]   {"entries": [{"id": ..., "action": ..., ...}], "next_cursor": C | null}
//! ```
//!
//! Each entry is the document the gateway that served the change wrote (see
//! `operator::audit`), with its place in the trail as `id`; `next_cursor` asks for the entries
//! before the page's last.

use http::{Response, StatusCode};
use serde_json::{Map, Value, json};

use super::keys::{MAX_LIMIT, store_failed};
use super::respond::{json_response, problem};
use crate::body::Body;
use crate::gateway::Gateway;
use crate::store::{Audit as _, AuditId};

/// The page `GET /audit` answers without a `limit`.
const DEFAULT_LIMIT: usize = 50;

pub(super) async fn page(gw: &Gateway, query: &str) -> Response<Body> {
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let (mut cursor, mut limit) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match &*k {
            "cursor" => &mut cursor,
            "limit" => &mut limit,
            other => {
                let other: String = other.chars().take(64).collect();
                return bad(&format!("{other:?} is not a parameter of /audit, which takes cursor and limit."));
            }
        };
        if slot.is_some() {
            return bad(&format!("{k} is given twice: give each parameter once."));
        }
        *slot = Some(v.into_owned());
    }
    let limit = match limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        Some(_) => return bad(&format!("limit must be between 1 and {MAX_LIMIT}.")),
    };
    let before = match cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => match AuditId::parse(text) {
            Some(id) => Some(id),
            None => return bad("cursor is not one this endpoint handed out."),
        },
    };
    let page = match gw.runtime().audit().trail(before, limit).await {
        Ok(page) => page,
        Err(e) => return store_failed(gw, e),
    };
    let entries: Vec<Value> = page
        .entries
        .into_iter()
        .map(|entry| {
            let mut fields = match serde_json::from_str::<Value>(&entry.document) {
                Ok(Value::Object(fields)) => fields,
                // Not one the gateway wrote (added by hand): shown as it is, as text.
                _ => Map::from_iter([("document".to_owned(), Value::String(entry.document))]),
            };
            fields.insert("id".to_owned(), Value::String(entry.id.to_string()));
            Value::Object(fields)
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "entries": entries, "next_cursor": page.next.map(|id| id.to_string()) }))
}
