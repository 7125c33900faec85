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
//! | `GET /api/v1/priority` | each waiting job's priority and its parts, in the order a cycle now would take them (as `sprio`) |
//! | `GET/POST /api/v1/reservations`, `DELETE /api/v1/reservations/{name}` | advance reservations |
//! | `GET /api/v1/allocations` | which job holds each GPU, for exporters' labels |
//! | `GET /api/v1/nodes` | nodes with GPUs allocated and whether in service (as `sinfo`); reasons for operators |
//! | `POST /api/v1/nodes/{node}/drain` `{reason}`, `POST /api/v1/nodes/{node}/resume` | out of and back in service (operators) |
//! | `GET /metrics` | jobs by state, pending jobs by account and reason, GPUs allocated/idle/reserved, starts, preemptions, cycles |
//! | `GET /healthz` | liveness |
//! | `GET /readyz` | readiness: 503 until the first scheduling cycle has run |
//!
//! With a token file ([`router_with`] and a [`Guard`]) every route but `/healthz` and `/readyz` wants a bearer
//! token: a tenant submits, reads, cancels and checkpoints its own account's jobs only (another
//! account's job is answered as one that does not exist) and sees its own rows of the queue,
//! the share, the priorities and the reservations; a node reads its own GPUs of the allocation
//! feed; finance reads the queue, share, priorities and reservations; reservations are changed
//! by operators.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use axum::http::{header, HeaderMap};
use gpuledger_auth::{Action, Denied, Guard, Principal, Scope};
use gpuledger_model::units::ByteSize;
use gpuledger_model::JobId;
use gpuledger_scheduler::reservation::ReservationEntry;
use gpuledger_service::BodyBudget;

use crate::state::{JobInfo, JobState, SubmitRequest};
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
            Error::Refused(refusal) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                refusal.field().map(str::to_owned),
            ),
            Error::Reservation(e) => (StatusCode::UNPROCESSABLE_ENTITY, Some(e.field().into())),
            Error::UnknownJob(_) => (StatusCode::NOT_FOUND, None),
            Error::UnknownNode(_) => (StatusCode::NOT_FOUND, Some("node".into())),
            Error::TooManyJobs { field, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, Some(field.clone()))
            }
            // Not acknowledged: the caller may send it again once the disk has room.
            Error::NotStored { .. } => (StatusCode::SERVICE_UNAVAILABLE, None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        ApiError {
            status,
            field,
            message: match &e {
                Error::Invalid { message, .. } | Error::TooManyJobs { message, .. } => {
                    message.clone()
                }
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
    let json = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // The path of a value that failed (`gpu_share`, `env.X`); an unknown or missing field
        // is named in the message itself.
        let field = if path != "." {
            path
        } else {
            message
                .split('`')
                .nth(1)
                .map(str::to_owned)
                .unwrap_or_else(|| "body".into())
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            field: Some(field),
            message,
        }
    })
}

/// A route's query parameters; a bad one is a 400 naming it, in the JSON every error has.
struct QueryParams<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S>
    for QueryParams<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, ApiError> {
        gpuledger_service::parse_query(parts.uri.query())
            .map(QueryParams)
            .map_err(|bad| ApiError {
                status: StatusCode::BAD_REQUEST,
                field: Some(bad.field),
                message: bad.message,
            })
    }
}

fn job_id(raw: &str) -> ApiResult<JobId> {
    JobId::new(raw).map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        field: Some("id".into()),
        message: e.to_string(),
    })
}

/// The API over a service, authentication off.
pub fn router(service: Arc<Service>) -> Router {
    router_with(
        service,
        Guard::off(),
        BodyBudget::new(ByteSize(256 << 20), MAX_BODY_BYTES),
    )
}

/// The largest request body the scheduler takes (axum's default limit, stated).
pub const MAX_BODY_BYTES: u64 = 2 << 20;

/// What the routes share: the service and who may do what.
#[derive(Debug)]
struct Api {
    service: Arc<Service>,
    guard: Guard,
}

impl std::ops::Deref for Api {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

fn denied(d: Denied, what: &str) -> ApiError {
    let (status, message) = gpuledger_service::denied_message(d, what);
    ApiError {
        status,
        field: Some("authorization".into()),
        message,
    }
}

fn token(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    gpuledger_service::bearer_token(headers).map_err(|d| denied(d, "a request"))
}

impl Api {
    /// Runs a change on a blocking thread: it returns only once the change's journal record
    /// is flushed to disk.
    async fn change<T: Send + 'static>(
        &self,
        change: impl FnOnce(&Service) -> crate::Result<T> + Send + 'static,
    ) -> ApiResult<T> {
        let service = Arc::clone(&self.service);
        tokio::task::spawn_blocking(move || change(&service))
            .await
            .map_err(|e| ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                field: None,
                message: format!("the change failed: {e}"),
            })?
            .map_err(ApiError::from)
    }

    fn principal(&self, headers: &HeaderMap, what: &str) -> ApiResult<Principal> {
        self.guard
            .principal(token(headers)?)
            .map_err(|d| denied(d, what))
    }

    fn check(&self, headers: &HeaderMap, action: Action<'_>, what: &str) -> ApiResult<Principal> {
        self.guard
            .check(token(headers)?, action)
            .map_err(|d| denied(d, what))
    }

    /// The accounts a read covers; a node or anonymous principal reads nothing here.
    fn read_scope(&self, headers: &HeaderMap, what: &str) -> ApiResult<Scope> {
        let who = self.principal(headers, what)?;
        match who.scope(self.guard.public()) {
            Scope::Nothing => Err(denied(
                if who == Principal::Anonymous {
                    Denied::Unauthenticated
                } else {
                    Denied::Forbidden
                },
                what,
            )),
            scope => Ok(scope),
        }
    }

    /// The job, if the principal may act on it; another account's job is a missing one.
    fn own_job(&self, headers: &HeaderMap, id: &JobId, what: &str) -> ApiResult<JobInfo> {
        let who = self.principal(headers, what)?;
        let public = self.guard.public();
        let job = self
            .service
            .job_seen_by(id, &|account| who.may(Action::ManageJobs(account), public));
        match job {
            Some(j) => Ok(j),
            _ if matches!(who, Principal::Anonymous) => Err(denied(Denied::Unauthenticated, what)),
            _ if matches!(
                who,
                Principal::Node(_) | Principal::Finance | Principal::Metrics
            ) =>
            {
                Err(denied(Denied::Forbidden, what))
            }
            _ => Err(Error::UnknownJob(id.clone()).into()),
        }
    }
}

/// The API over a service, with `guard` deciding who may do what.
pub fn router_with(service: Arc<Service>, guard: Guard, budget: BodyBudget) -> Router {
    let api = Arc::new(Api { service, guard });
    Router::new()
        .route("/api/v1/jobs", post(submit).get(history))
        .route("/api/v1/jobs/{id}", get(job).delete(cancel))
        .route("/api/v1/jobs/{id}/checkpoint", post(checkpoint))
        .route("/api/v1/queue", get(queue))
        .route("/api/v1/share", get(share))
        .route("/api/v1/priority", get(priority))
        .route("/api/v1/reservations", get(reservations).post(reserve))
        .route(
            "/api/v1/reservations/{name}",
            axum::routing::delete(unreserve),
        )
        .route(
            gpuledger_model::allocation_feed::ALLOCATIONS_PATH,
            get(allocations),
        )
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/nodes/{node}/drain", post(drain))
        .route("/api/v1/nodes/{node}/resume", post(resume))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_BODY_BYTES as usize,
        ))
        // Outermost first: the caller is checked from the headers, then the body takes its
        // share of the budget, and only then is it read.
        .layer(axum::middleware::from_fn_with_state(
            budget,
            gpuledger_service::hold_body_budget,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&api),
            check_before_body,
        ))
        .with_state(api)
}

/// A request with a body (a submission, a reservation, a checkpoint) from a caller the token
/// file does not know is answered 401 at once, before a byte of its body is read; what the
/// caller may do with it is checked once the body says which account it is for.
async fn check_before_body(
    State(s): State<Arc<Api>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let has_body = request.headers().contains_key(header::CONTENT_LENGTH)
        || request.headers().contains_key(header::TRANSFER_ENCODING);
    if has_body && s.guard.is_on() {
        match s.principal(request.headers(), "send a request with a body") {
            Ok(Principal::Anonymous) => {
                return denied(Denied::Unauthenticated, "send a request with a body")
                    .into_response()
            }
            Ok(_) => {}
            Err(refused) => return refused.into_response(),
        }
    }
    next.run(request).await
}

async fn submit(State(s): State<Arc<Api>>, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let request: SubmitRequest = parse_body(&body)?;
    s.check(
        &headers,
        Action::ManageJobs(request.account.as_str()),
        "submit into this account",
    )?;
    let id = s.change(move |s| s.submit(request)).await?;
    Ok((StatusCode::CREATED, Json(json!({"job_id": id}))).into_response())
}

async fn job(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let id = job_id(&id)?;
    let scope = s.read_scope(&headers, "read a job")?;
    match s.job_seen_by(&id, &|account| scope.covers(account)) {
        Some(info) => Ok(Json(info).into_response()),
        None => Err(Error::UnknownJob(id).into()),
    }
}

/// `DELETE /api/v1/jobs/{id}?now=true`: SIGKILL at once instead of after the grace.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelParams {
    #[serde(default)]
    now: bool,
}

async fn cancel(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<CancelParams>,
) -> ApiResult<Response> {
    let id = job_id(&id)?;
    s.own_job(&headers, &id, "cancel a job")?;
    let info = s
        .change(move |s| {
            if params.now {
                s.cancel_now(&id)
            } else {
                s.cancel(&id)
            }
        })
        .await?;
    Ok(Json(info).into_response())
}

async fn checkpoint(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let id = job_id(&id)?;
    s.own_job(&headers, &id, "report a job's checkpoint")?;
    s.change(move |s| s.checkpointed(&id)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /api/v1/jobs?account=a,b&state=completed,failed&since=T&limit=N`: jobs of every state
/// the caller may see (as `sacct`); `since` is RFC 3339 or Unix seconds; `limit` 1,000 by
/// default, at most 10,000 (the newest).
#[derive(Debug, Default)]
struct HistoryParams {
    account: Option<String>,
    state: Option<String>,
    since: Option<String>,
    limit: Option<String>,
}

fn bad(field: &str, message: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        field: Some(field.to_owned()),
        message,
    }
}

impl HistoryParams {
    fn filter(&self) -> ApiResult<crate::HistoryFilter> {
        let list = |v: &Option<String>| -> Vec<String> {
            v.as_deref()
                .map(|s| {
                    s.split(',')
                        .map(str::trim)
                        .filter(|x| !x.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut states = Vec::new();
        for name in list(&self.state) {
            let state = JobState::ALL
                .into_iter()
                .find(|s| s.as_str() == name)
                .ok_or_else(|| {
                    bad(
                        "state",
                        format!(
                            "`{name}` is no job state; one of {}",
                            JobState::ALL.map(JobState::as_str).join(", ")
                        ),
                    )
                })?;
            states.push(state);
        }
        let since_s = match &self.since {
            None => None,
            Some(t) => {
                Some(gpuledger_model::time::parse_instant_s(t).map_err(|e| bad("since", e))?)
            }
        };
        let limit = match &self.limit {
            None => 1_000,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=crate::HistoryFilter::MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    bad(
                        "limit",
                        format!(
                            "`{l}`: a whole number from 1 to {}",
                            crate::HistoryFilter::MAX_LIMIT
                        ),
                    )
                })?,
        };
        Ok(crate::HistoryFilter {
            accounts: list(&self.account),
            states,
            since_s,
            limit,
        })
    }
}

async fn history(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    QueryParams(mut query): QueryParams<std::collections::BTreeMap<String, String>>,
) -> ApiResult<Response> {
    let scope = s.read_scope(&headers, "read the jobs")?;
    let params = HistoryParams {
        account: query.remove("account"),
        state: query.remove("state"),
        since: query.remove("since"),
        limit: query.remove("limit"),
    };
    if let Some(unknown) = query.keys().next() {
        return Err(bad(
            unknown,
            "unknown parameter; use account, state, since or limit".into(),
        ));
    }
    let filter = params.filter()?;
    let jobs = s.history_seen_by(&|account| scope.covers(account), &filter);
    Ok(Json(QueueReply { jobs }).into_response())
}

/// `GET /api/v1/queue`: the jobs the caller may see, as `squeue` lists them.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueReply {
    pub jobs: Vec<JobInfo>,
}

/// `GET /api/v1/share`: fair share per account the caller may see, as `sshare`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ShareReply {
    pub accounts: Vec<crate::ShareRow>,
}

async fn queue(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    let scope = s.read_scope(&headers, "read the queue")?;
    let jobs = s.queue_seen_by(&|account| scope.covers(account));
    Ok(Json(QueueReply { jobs }).into_response())
}

/// `GET /api/v1/priority`: the waiting jobs the caller may see with their priorities, as
/// `sprio`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PriorityReply {
    pub jobs: Vec<crate::PriorityRow>,
}

async fn priority(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    let scope = s.read_scope(&headers, "read the priorities")?;
    let jobs = s.priorities_seen_by(&|account| scope.covers(account));
    Ok(Json(PriorityReply { jobs }).into_response())
}

async fn share(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    let scope = s.read_scope(&headers, "read the fair share")?;
    let rows: Vec<crate::ShareRow> = s
        .share()
        .into_iter()
        .filter(|r| scope.covers(&r.account))
        .collect();
    Ok(Json(ShareReply { accounts: rows }).into_response())
}

async fn allocations(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    let who = s.principal(&headers, "read the allocation feed")?;
    let rows: Vec<crate::AllocationRow> = match &who {
        Principal::Node(me) => s
            .allocations()
            .into_iter()
            .filter(|r| &r.node == me)
            .collect(),
        p if p.may(Action::Operate, s.guard.public()) => s.allocations(),
        Principal::Anonymous => {
            return Err(denied(Denied::Unauthenticated, "read the allocation feed"))
        }
        _ => return Err(denied(Denied::Forbidden, "read the allocation feed")),
    };
    Ok(Json(gpuledger_model::allocation_feed::AllocationFeed { gpus: rows }).into_response())
}

/// `GET /api/v1/nodes`: every node, as `sinfo` shows it.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodesReply {
    pub nodes: Vec<crate::nodes::NodeRow>,
}

/// `POST /api/v1/nodes/{node}/drain`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub reason: String,
}

async fn nodes(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    s.read_scope(&headers, "read the nodes")?;
    let operator = s
        .principal(&headers, "read the nodes")?
        .may(Action::Operate, s.guard.public());
    let mut rows = s.nodes();
    if !operator {
        // A reason may name another account's job.
        for row in &mut rows {
            row.reason = row.reason.take().map(|_| "out of service".to_owned());
            row.by = None;
        }
    }
    Ok(Json(NodesReply { nodes: rows }).into_response())
}

async fn drain(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(node): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    s.check(&headers, Action::Operate, "drain a node")?;
    let request: DrainRequest = parse_body(&body)?;
    s.change(move |s| s.drain(&node, &request.reason, "operator"))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn resume(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(node): Path<String>,
) -> ApiResult<Response> {
    s.check(&headers, Action::Operate, "resume a node")?;
    let resumed = node.clone();
    let was_drained = s.change(move |s| s.resume(&resumed)).await?;
    Ok(Json(json!({ "node": node, "was_drained": was_drained })).into_response())
}

/// Readiness, open to all (a load balancer or kubelet asks): 200 once the first cycle ran,
/// 503 before.
async fn readyz(State(s): State<Arc<Api>>) -> Response {
    if s.cycles_run() == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the first scheduling cycle has not run\n",
        )
            .into_response();
    }
    "ready\n".into_response()
}

async fn metrics(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    s.check(&headers, Action::Metrics, "read /metrics")?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics() + &gpuledger_auth::tls::certificate_metrics(),
    )
        .into_response())
}

async fn reservations(State(s): State<Arc<Api>>, headers: HeaderMap) -> ApiResult<Response> {
    let scope = s.read_scope(&headers, "read the reservations")?;
    let rows: Vec<ReservationEntry> = s
        .reservations()
        .into_iter()
        .filter(|r| r.accounts.iter().any(|a| scope.covers(a.as_str())))
        .collect();
    Ok(Json(json!({ "reservations": rows })).into_response())
}

async fn reserve(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    s.check(&headers, Action::Operate, "make a reservation")?;
    let entry: ReservationEntry = parse_body(&body)?;
    let placed = s.change(move |s| s.reserve(entry)).await?;
    Ok((StatusCode::CREATED, Json(placed)).into_response())
}

async fn unreserve(
    State(s): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    s.check(&headers, Action::Operate, "remove a reservation")?;
    let removed = name.clone();
    if s.change(move |s| s.unreserve(&removed)).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            field: Some("name".into()),
            message: format!("reservation `{name}` does not exist"),
        })
    }
}
