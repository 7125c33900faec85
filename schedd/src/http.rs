//! The scheduler's HTTP API. [`router`] builds it over a [`Service`]; every error becomes a JSON
//! body in one place ([`ApiError`]), naming the field that was wrong.
//!
//! | route | what |
//! |---|---|
//! | `POST /api/v1/jobs` | submit ([`SubmitRequest`]): `201 {job_id}`, `400` bad field, `422` refused with the reason |
//! | `GET /api/v1/jobs/{id}` | one job |
//! | `DELETE /api/v1/jobs/{id}` | cancel |
//! | `POST /api/v1/jobs/{id}/checkpoint` | the job reports a checkpoint |
//! | `GET /api/v1/queue` | running and pending jobs with reason and estimated start (as `squeue`) |
//! | `GET /api/v1/share` | fair share per account (as `sshare`) |
//! | `GET/POST /api/v1/reservations`, `DELETE /api/v1/reservations/{name}` | advance reservations |
//! | `GET /api/v1/allocations` | which job holds each GPU, for exporters' labels |
//! | `GET /metrics` | jobs by state, pending jobs by account and reason, GPUs allocated/idle/reserved, starts, preemptions, cycles |
//! | `GET /healthz` | liveness |

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use gpuledger_model::JobId;
use gpuledger_scheduler::reservation::ReservationEntry;

use crate::state::SubmitRequest;
use crate::{Error, Service};

/// An error as the API answers it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    field: Option<String>,
    message: String,
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, field) = match &e {
            Error::Invalid { field, .. } => (StatusCode::BAD_REQUEST, Some(field.clone())),
            Error::Refused(_) | Error::Reservation(_) => (StatusCode::UNPROCESSABLE_ENTITY, None),
            Error::UnknownJob(_) => (StatusCode::NOT_FOUND, None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        ApiError {
            status,
            field,
            message: match &e {
                Error::Invalid { message, .. } => message.clone(),
                other => other.to_string(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"field": self.field, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Reads a JSON body; a bad one is a 400 naming the field serde stumbled on.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        let message = e.to_string();
        let field = message
            .split('`')
            .nth(1)
            .map(str::to_owned)
            .unwrap_or_else(|| "body".into());
        ApiError {
            status: StatusCode::BAD_REQUEST,
            field: Some(field),
            message,
        }
    })
}

fn job_id(raw: &str) -> ApiResult<JobId> {
    JobId::new(raw).map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        field: Some("id".into()),
        message: e.to_string(),
    })
}

/// The API over a service.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/api/v1/jobs", post(submit))
        .route("/api/v1/jobs/{id}", get(job).delete(cancel))
        .route("/api/v1/jobs/{id}/checkpoint", post(checkpoint))
        .route("/api/v1/queue", get(queue))
        .route("/api/v1/share", get(share))
        .route("/api/v1/reservations", get(reservations).post(reserve))
        .route(
            "/api/v1/reservations/{name}",
            axum::routing::delete(unreserve),
        )
        .route("/api/v1/allocations", get(allocations))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(service)
}

async fn submit(State(s): State<Arc<Service>>, body: Bytes) -> ApiResult<Response> {
    let request: SubmitRequest = parse_body(&body)?;
    let id = s.submit(request)?;
    Ok((StatusCode::CREATED, Json(json!({"job_id": id}))).into_response())
}

async fn job(State(s): State<Arc<Service>>, Path(id): Path<String>) -> ApiResult<Response> {
    let id = job_id(&id)?;
    match s.job(&id) {
        Some(info) => Ok(Json(info).into_response()),
        None => Err(Error::UnknownJob(id).into()),
    }
}

async fn cancel(State(s): State<Arc<Service>>, Path(id): Path<String>) -> ApiResult<Response> {
    let id = job_id(&id)?;
    Ok(Json(s.cancel(&id)?).into_response())
}

async fn checkpoint(State(s): State<Arc<Service>>, Path(id): Path<String>) -> ApiResult<Response> {
    let id = job_id(&id)?;
    s.checkpointed(&id)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn queue(State(s): State<Arc<Service>>) -> Response {
    Json(json!({"jobs": s.queue()})).into_response()
}

async fn share(State(s): State<Arc<Service>>) -> Response {
    Json(json!({"accounts": s.share()})).into_response()
}

async fn allocations(State(s): State<Arc<Service>>) -> Response {
    Json(json!({"gpus": s.allocations()})).into_response()
}

async fn metrics(State(s): State<Arc<Service>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics(),
    )
        .into_response()
}

async fn reservations(State(s): State<Arc<Service>>) -> Response {
    Json(json!({"reservations": s.reservations()})).into_response()
}

async fn reserve(State(s): State<Arc<Service>>, body: Bytes) -> ApiResult<Response> {
    let entry: ReservationEntry = parse_body(&body)?;
    let placed = s.reserve(entry)?;
    Ok((StatusCode::CREATED, Json(placed)).into_response())
}

async fn unreserve(State(s): State<Arc<Service>>, Path(name): Path<String>) -> ApiResult<Response> {
    if s.unreserve(&name)? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            field: Some("name".into()),
            message: format!("reservation `{name}` does not exist"),
        })
    }
}
