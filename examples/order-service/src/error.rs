//! Error types and their single mapping to HTTP responses.

use axum::Json;
use axum::http::header::WWW_AUTHENTICATE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Failures of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Only the scheme is kept: the full URL may carry a password.
    #[error("unsupported database URL scheme {0:?}: expected sqlite:PATH or postgres://...")]
    UnsupportedScheme(String),
    #[error("the order for this idempotency key disappeared between insert and read")]
    RowVanished,
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
}

/// Failures of [`crate::serve`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("HTTP server failed: {0}")]
    Serve(#[from] std::io::Error),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Everything a request handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No bearer credentials at all (no header, or another scheme).
    #[error("{0}")]
    MissingBearer(&'static str),
    /// Bearer credentials that cannot name a user.
    #[error("{0}")]
    InvalidBearer(&'static str),
    #[error("user_id in the body does not match the authenticated user")]
    UserMismatch,
    #[error("missing Idempotency-Key header")]
    MissingKey,
    #[error("missing Idempotency-Key header or key query parameter")]
    MissingLookupKey,
    #[error("{0}")]
    InvalidKey(&'static str),
    #[error("{message}")]
    Body { status: StatusCode, message: String },
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    #[error("request body must be a JSON object")]
    NotAnObject,
    #[error("{field} must be {expected}")]
    InvalidField { field: &'static str, expected: &'static str },
    #[error("Idempotency-Key was already used by this user for a different order")]
    KeyReused { order_id: i64 },
    #[error("order id must be a positive integer")]
    InvalidOrderId,
    #[error("order not found")]
    NotFound,
    #[error("no such route")]
    NoRoute,
    #[error(transparent)]
    Db(#[from] DbError),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::MissingBearer(_) | Self::InvalidBearer(_) => StatusCode::UNAUTHORIZED,
            Self::UserMismatch => StatusCode::FORBIDDEN,
            Self::MissingKey
            | Self::MissingLookupKey
            | Self::InvalidKey(_)
            | Self::MalformedJson(_)
            | Self::NotAnObject
            | Self::InvalidField { .. }
            | Self::InvalidOrderId => StatusCode::BAD_REQUEST,
            Self::Body { status, .. } => *status,
            Self::KeyReused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::Db(DbError::Sqlx(sqlx::Error::PoolTimedOut)) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Db(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// RFC 6750 §3: a 401 names the scheme it wants; `invalid_token` tells a client that
    /// sent credentials that sending the same ones again will not help.
    fn challenge(&self) -> Option<HeaderValue> {
        match self {
            Self::MissingBearer(_) => Some(HeaderValue::from_static("Bearer")),
            Self::InvalidBearer(_) => Some(HeaderValue::from_static(r#"Bearer error="invalid_token""#)),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            Self::Db(err) => {
                // Database details stay in the log: they can echo user input and schema names.
                tracing::error!(error = %err, "database failure");
                json!({ "error": "internal database error" })
            }
            Self::InvalidField { field, .. } => {
                json!({ "error": self.to_string(), "field": field })
            }
            Self::UserMismatch => json!({ "error": self.to_string(), "field": "user_id" }),
            Self::KeyReused { order_id } => {
                json!({ "error": self.to_string(), "order_id": order_id })
            }
            _ => json!({ "error": self.to_string() }),
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(challenge) = self.challenge() {
            response.headers_mut().insert(WWW_AUTHENTICATE, challenge);
        }
        response
    }
}
