//! What a client is told when a request fails: one type for every route, turned into a status
//! and a JSON body in one place (`{"error": ..., "errors": [{row, field, message}],
//! "stored_rows": n}` for batches with refused rows).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::validate::RowError;
use crate::Error;

/// An error as the client sees it.
#[derive(Debug)]
pub enum ApiError {
    /// 400: the request itself is malformed (headers, body encoding, parameters).
    BadRequest {
        field: String,
        message: String,
    },
    /// 422: well-formed, but rows are invalid: those were refused, the batch's other rows
    /// (`stored_rows`, perhaps none) stored.
    Invalid {
        errors: Vec<RowError>,
        /// Bad values found.
        total: usize,
        /// The rows refused (each one), where the batch had good rows too.
        refused: Option<Vec<usize>>,
        stored_rows: usize,
    },
    /// 401: no token where one is needed, or one nobody issued.
    Unauthenticated(String),
    /// 403: a valid token whose role may not do this.
    Forbidden(String),
    NotFound(String),
    /// 409: the batch's key is stored already with other content; nothing was stored.
    Conflict {
        field: String,
        message: String,
    },
    Unavailable(String),
    Internal(String),
}

impl ApiError {
    /// A batch refused whole for `errors`.
    pub(crate) fn invalid(errors: Vec<RowError>) -> Self {
        ApiError::Invalid {
            total: errors.len(),
            errors,
            refused: None,
            stored_rows: 0,
        }
    }

    pub(crate) fn bad(field: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(errors) => ApiError::invalid(errors),
            Error::RowsRefused {
                refusal,
                stored_rows,
                ..
            } => ApiError::Invalid {
                refused: Some(
                    (refusal.bad_rows.iter().enumerate())
                        .filter(|(_, bad)| **bad)
                        .map(|(row, _)| row)
                        .collect(),
                ),
                errors: refusal.errors,
                total: refusal.total,
                stored_rows,
            },
            Error::Unavailable(m) => ApiError::Unavailable(m),
            Error::BadRequest { field, message } => ApiError::BadRequest { field, message },
            Error::Conflict { field, message } => ApiError::Conflict { field, message },
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::BadRequest { field, message } => (
                StatusCode::BAD_REQUEST,
                json!({"error": format!("`{field}`: {message}"), "errors": [{"row": null, "field": field, "message": message}]}),
            ),
            ApiError::Invalid {
                errors,
                total,
                refused,
                stored_rows,
            } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({
                    "error": match &refused {
                        Some(rows) => format!("{} row(s) refused for {total} bad value(s); the batch's other {stored_rows} row(s) were stored", rows.len()),
                        None => format!("batch refused: {total} bad value(s); nothing was stored"),
                    },
                    "errors": errors,
                    "refused_rows": refused,
                    "stored_rows": stored_rows,
                }),
            ),
            ApiError::Unauthenticated(m) => {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer realm=\"gpuledger\"")],
                    Json(json!({"error": m})),
                )
                    .into_response()
            }
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, json!({"error": m})),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, json!({"error": m})),
            ApiError::Conflict { field, message } => (
                StatusCode::CONFLICT,
                json!({"error": format!("`{field}`: {message}"), "errors": [{"row": null, "field": field, "message": message}]}),
            ),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, json!({"error": m})),
            ApiError::Internal(m) => {
                tracing::error!(error = %m, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": m}))
            }
        };
        (status, Json(body)).into_response()
    }
}
