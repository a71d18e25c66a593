//! HTTP routes, request validation and response shapes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Map, Value, json};

use crate::auth::{self, User};
use crate::db::{Database, Insert, NewOrder, Order};
use crate::error::ApiError;
use crate::fault::{self, Fault, Options};
use crate::key;

pub const BACKSTOP_HEADER: HeaderName = HeaderName::from_static("idempotency-backstop");

#[derive(Clone)]
struct AppState {
    db: Database,
    backstop_hits: Arc<AtomicU64>,
    options: Options,
}

/// The service's routes over `db`, with the default [`Options`] (no demo faults). The
/// backstop counter lives in the returned router, so each call starts a fresh count.
pub fn router(db: Database) -> Router {
    router_with(db, Options::default())
}

/// [`router`] with `options`.
pub fn router_with(db: Database, options: Options) -> Router {
    let state = AppState { db, backstop_hits: Arc::new(AtomicU64::new(0)), options };
    Router::new()
        .route("/orders", post(create_order))
        // A literal segment outranks `{id}` in axum's router, whatever the order here.
        .route("/orders/lookup", get(lookup_order))
        .route("/orders/{id}", get(get_order))
        .route("/healthz", get(healthz))
        .route("/stats", get(stats))
        .fallback(no_route)
        .with_state(state)
}

/// The success body is a pure function of the order id, so a replay produced from the
/// stored row is byte-identical to the response the first request got.
fn created(order_id: i64) -> Response {
    order_response(StatusCode::CREATED, order_id)
}

/// A lookup answers with the create's body, so a client that lost the create's response
/// gets the very bytes it would have read, only with 200 instead of 201.
fn found(order_id: i64) -> Response {
    order_response(StatusCode::OK, order_id)
}

fn order_response(status: StatusCode, order_id: i64) -> Response {
    let body = format!(r#"{{"order_id": {order_id}, "status": "created"}}"#);
    let content_type = HeaderValue::from_static("application/json");
    (status, [(CONTENT_TYPE, content_type)], body).into_response()
}

async fn create_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let response = make_order(&state, &headers, body).await?;
    // A demo fault applies to an answer that says the order exists: the order is made (or
    // was already there), and only then is the answer lost. Errors are answered as usual.
    match state.options.fault(&headers) {
        Some(Fault::DropAnswer) => {
            tracing::warn!("demo fault drop-answer: the order is stored; breaking its answer off");
            Ok(fault::drop_answer(response).await)
        }
        None => Ok(response),
    }
}

async fn make_order(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // Who asks comes first: an anonymous caller learns nothing about keys or payloads.
    let user = auth::from_headers(headers)?;
    let idem_key = key::from_headers(headers)?;
    let body =
        body.map_err(|rejection| ApiError::Body { status: rejection.status(), message: rejection.body_text() })?;
    let order = parse_order(&body, &user, idem_key)?;

    match state.db.insert_or_fetch(&order).await? {
        Insert::Created(id) => Ok(created(id)),
        Insert::Existing(existing) if existing.sku == order.sku && existing.quantity == order.quantity => {
            let hits = state.backstop_hits.fetch_add(1, Ordering::Relaxed) + 1;
            // A hit means a duplicate got past the gateway (lost cache entry, bypassed proxy).
            tracing::warn!(
                order_id = existing.id,
                user_id = %existing.user_id,
                idem_key = %existing.idem_key,
                backstop_hits = hits,
                "idempotency backstop hit: replaying the stored order"
            );
            let mut response = created(existing.id);
            response.headers_mut().insert(BACKSTOP_HEADER, HeaderValue::from_static("hit"));
            Ok(response)
        }
        Insert::Existing(existing) => {
            tracing::info!(
                order_id = existing.id,
                user_id = %existing.user_id,
                idem_key = %existing.idem_key,
                "idempotency key reused with a different payload"
            );
            Err(ApiError::KeyReused { order_id: existing.id })
        }
    }
}

/// The order is always stored under the authenticated `user`. A `user_id` in the body is
/// only a claim, checked after the body is known to be well-formed, so that a malformed
/// request gets the same 400 whoever sends it.
fn parse_order(body: &[u8], user: &User, idem_key: String) -> Result<NewOrder, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::NotAnObject);
    };
    let claimed_user = optional_text_field(&fields, "user_id")?;
    let sku = text_field(&fields, "sku")?;
    let quantity = quantity_field(&fields)?;
    if claimed_user.is_some_and(|claimed| claimed != user.as_str()) {
        return Err(ApiError::UserMismatch);
    }
    Ok(NewOrder { user_id: user.as_str().to_owned(), sku, quantity, idem_key })
}

/// Absent is fine; present must still be a valid text field (`null` included: a client that
/// sends the field means something by it).
fn optional_text_field(fields: &Map<String, Value>, field: &'static str) -> Result<Option<String>, ApiError> {
    if fields.contains_key(field) { text_field(fields, field).map(Some) } else { Ok(None) }
}

/// Blank strings and NUL are refused here because Postgres rejects NUL in TEXT with an
/// error that would otherwise become a 500, and SQLite would silently accept it.
fn text_field(fields: &Map<String, Value>, field: &'static str) -> Result<String, ApiError> {
    match fields.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() && !s.contains('\0') => Ok(s.clone()),
        _ => Err(ApiError::InvalidField { field, expected: "a non-empty string" }),
    }
}

/// `as_i64` refuses floats (`1.0`, `1e2`) and values outside i64, whether or not
/// `serde_json`'s `arbitrary_precision` feature is unified in by another workspace member.
fn quantity_field(fields: &Map<String, Value>) -> Result<i64, ApiError> {
    match fields.get("quantity").and_then(Value::as_i64) {
        Some(quantity) if quantity > 0 => Ok(quantity),
        _ => Err(ApiError::InvalidField { field: "quantity", expected: "a positive integer that fits in 64 bits" }),
    }
}

/// The caller's order for an idempotency key: what a client asks after losing the create's
/// response, without risking a second order. Another user's key is a 404, like a key
/// nobody used, so a lookup never reveals that someone else holds it.
async fn lookup_order(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> Result<Response, ApiError> {
    let user = auth::from_headers(&headers)?;
    let idem_key = key::for_lookup(&headers, uri.query())?;
    let order = state.db.by_key(user.as_str(), &idem_key).await?.ok_or(ApiError::NotFound)?;
    Ok(found(order.id))
}

/// Scoped like the lookup: another user's order is a 404, not a 403, so ids do not reveal
/// which orders exist.
async fn get_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Order>, ApiError> {
    let user = auth::from_headers(&headers)?;
    let Ok(Path(id)) = id else {
        return Err(ApiError::InvalidOrderId);
    };
    state.db.order(user.as_str(), id).await?.map(Json).ok_or(ApiError::NotFound)
}

async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn stats(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let orders = state.db.count_orders().await?;
    let backstop_hits = state.backstop_hits.load(Ordering::Relaxed);
    Ok(Json(json!({ "orders": orders, "backstop_hits": backstop_hits })))
}

async fn no_route() -> ApiError {
    ApiError::NoRoute
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> User {
        match auth::parse("Bearer alice") {
            Ok(user) => user,
            Err(err) => panic!("alice rejected: {err}"),
        }
    }

    fn quantity(body: &str) -> Result<i64, ApiError> {
        parse_order(body.as_bytes(), &alice(), "k".into()).map(|o| o.quantity)
    }

    #[test]
    fn quantity_must_be_a_positive_i64() {
        let ok = |q: &str| format!(r#"{{"user_id":"alice","sku":"s","quantity":{q}}}"#);
        assert_eq!(quantity(&ok("1")).ok(), Some(1));
        assert_eq!(quantity(&ok("9223372036854775807")).ok(), Some(i64::MAX));
        for bad in ["0", "-1", "-0", "1.0", "1.5", "1e2", "\"3\"", "null", "true", "9223372036854775808", "1e400"] {
            assert!(quantity(&ok(bad)).is_err(), "quantity {bad} accepted");
        }
    }

    #[test]
    fn the_order_belongs_to_the_bearer_and_the_body_may_only_agree() {
        let user_of = |body: &str| parse_order(body.as_bytes(), &alice(), "k".into()).map(|o| o.user_id);
        assert_eq!(user_of(r#"{"sku":"s","quantity":1}"#).ok().as_deref(), Some("alice"));
        assert_eq!(user_of(r#"{"user_id":"alice","sku":"s","quantity":1}"#).ok().as_deref(), Some("alice"));
        for other in ["bob", "Alice", "alice ", " alice"] {
            let body = serde_json::json!({ "user_id": other, "sku": "s", "quantity": 1 }).to_string();
            assert!(matches!(user_of(&body), Err(ApiError::UserMismatch)), "{other:?}");
        }
        // Malformed beats mismatched: the 400 does not depend on who asks.
        assert!(matches!(user_of(r#"{"user_id":"bob","sku":"","quantity":1}"#), Err(ApiError::InvalidField { .. })));
        assert!(matches!(user_of(r#"{"user_id":null,"sku":"s","quantity":1}"#), Err(ApiError::InvalidField { .. })));
    }
}
