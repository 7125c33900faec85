//! The aggregator's HTTP API. [`router`] builds it over a [`Service`]; errors become responses
//! in one place ([`ApiError`]): a refused batch is a 4xx whose JSON body names each bad row and
//! field, and nothing else is touched.
//!
//! | route | what |
//! |---|---|
//! | `POST /api/v1/ingest` | Arrow IPC stream of samples; headers `x-gpuledger-node`, `x-gpuledger-seq`, optional `x-gpuledger-low-seq` |
//! | `POST /api/v1/events` | job lifecycle events as JSON `{source, seq, events: [...]}` |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /api/v1/usage?at=&half_life=` | decayed GPU-hours per account and project (fair-share feed) |
//! | `GET /api/v1/accounts/{account}/summary?from=&to=` | the account's indicators |
//! | `GET /api/v1/jobs/{id}` | a job's events, usage, utilization and MFU |
//! | `POST /api/v1/query` | `{sql}`: read-only SQL over the tables |
//! | `GET /api/v1/status?window=&from=&to=` | what the status page shows, as JSON |
//! | `GET /` | the status page; `POST /login` and `POST /logout` set and clear its cookie |
//! | `GET /invoices?account=` | the invoices the reader may see (a tenant its own), as a page |
//! | `GET /invoices/{month}/{account}?revision=&format=html\|csv\|json` | one invoice |
//! | `GET /api/v1/invoices?account=&month=` | the same list as JSON |
//! | `GET /api/v1/allocations` | which job holds each GPU, by the job events' allocations (a node: its own) |
//! | `GET /healthz` | liveness; 503 once a write failed |
//! | `GET /readyz` | readiness: 503 until the first flush after recovery has finished |
//!
//! With a token file ([`gpuledger_auth::Guard`]) every route but `/healthz` and `/readyz` wants a bearer token
//! (the status page also takes the cookie its sign-in form sets) and checks its role: a node
//! pushes only as itself, a tenant reads only its own account (another account, or another
//! account's job, is answered exactly as one that does not exist), SQL and events are for
//! operators. No token: 401; a token whose role may not: 403.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::JobEvent;
use gpuledger_model::time::{Clock, UnixMillis};
use gpuledger_model::units::DurationSpec;
use gpuledger_model::{AccountId, JobId};

use gpuledger_auth::{Action, Denied, Guard, Principal, Scope};

use crate::api_error::ApiError;
use crate::events::{parse_event_rows, EventBatch, EVENTS_PATH};
use crate::ingest::{IngestOutcome, Ingestor, SamplePush};
use crate::metrics::Metrics;
use crate::query::{fill_job_figures, AccountIndicators, Query};
use crate::validate::RowError;
use crate::wal::decode_ipc;

use gpuledger_model::usage::{decay_factor, AccountUsage, UsageFeed, USAGE_PATH};
use gpuledger_model::wire::{
    check_epoch, EPOCH_HEADER, INGEST_PATH, LOW_SEQ_HEADER, NODE_HEADER, SENT_AT_HEADER, SEQ_HEADER,
};
/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// What the routes share.
pub struct Service {
    pub ingestor: Arc<Ingestor>,
    pub query: Query,
    /// Callers' SQL, in a session of its own with bounded memory and time.
    pub sql: crate::sql_api::SqlApi,
    pub metrics: Metrics,
    pub config: ClusterConfig,
    pub clock: Arc<dyn Clock>,
    /// Who may do what; [`Guard::off`] lets everything through.
    pub guard: Guard,
    /// The request bytes the service holds at once.
    pub body_budget: gpuledger_service::BodyBudget,
    /// The status page's sign-ins.
    pub sessions: gpuledger_auth::Sessions,
    /// Set once the first flush after start has finished (recovery comes before listening).
    pub ready: std::sync::atomic::AtomicBool,
    /// Where `gpuledger invoice` writes each month's invoices, read by `/invoices`.
    pub invoices_root: std::path::PathBuf,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("ingestor", &self.ingestor)
            .finish()
    }
}

/// The API's routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route(INGEST_PATH, post(ingest))
        .route(EVENTS_PATH, post(events))
        .route(USAGE_PATH, get(usage))
        .route("/api/v1/accounts/{account}/summary", get(account_summary))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/query", post(query))
        .route("/api/v1/status", get(status_json))
        .route("/", get(status_page))
        .route("/invoices", get(invoices_page))
        .route("/invoices/{month}/{account}", get(invoice_file))
        .route("/api/v1/invoices", get(invoices_json))
        .route(
            gpuledger_model::allocation_feed::ALLOCATIONS_PATH,
            get(allocations),
        )
        .route(
            "/login",
            post(login).layer(DefaultBodyLimit::max(MAX_LOGIN_BYTES as usize)),
        )
        .route("/logout", post(logout))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Outermost first: the caller is checked from the headers, then the body takes its
        // share of the service's budget, and only then is it read.
        .layer(axum::middleware::from_fn_with_state(
            service.body_budget.clone(),
            gpuledger_service::hold_body_budget,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            check_before_body,
        ))
        .with_state(service)
}

/// The largest sign-in form the status page takes.
const MAX_LOGIN_BYTES: u64 = 4096;

/// Checks the caller of a route that takes a body from the request's headers alone, before a
/// byte of the body is read: an anonymous or refused push, event batch or query is answered
/// at once and never holds any of the service's memory.
async fn check_before_body(
    State(s): State<Arc<Service>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers();
    let checked = match (request.method(), request.uri().path()) {
        (&axum::http::Method::POST, INGEST_PATH) => header_text(headers, NODE_HEADER)
            .and_then(|node| {
                authorize(
                    &s,
                    headers,
                    Action::Ingest { node },
                    "push samples as this node",
                )
            })
            .map(drop),
        (&axum::http::Method::POST, EVENTS_PATH) => {
            authorize(&s, headers, Action::PostEvents, "post job events").map(drop)
        }
        (&axum::http::Method::POST, "/api/v1/query") => {
            authorize(&s, headers, Action::Sql, "run SQL").map(drop)
        }
        (&axum::http::Method::POST, "/login") => {
            let declared = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            match declared {
                Some(n) if n > MAX_LOGIN_BYTES => Err(ApiError::bad(
                    "body",
                    format!("a sign-in form is at most {MAX_LOGIN_BYTES} bytes"),
                )),
                // Without a length the route's own limit stops it at that size.
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    };
    match checked {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            if request.uri().path() == INGEST_PATH {
                s.metrics.count_refused_ingest(&refused);
            }
            refused.into_response()
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The bearer token of a request; a malformed `Authorization` header is a 401.
fn bearer_token(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    gpuledger_service::bearer_token(headers)
        .map_err(|_| ApiError::Unauthenticated("`Authorization` must be `Bearer <token>`".into()))
}

/// The session id the status page's sign-in set in a cookie.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    use gpuledger_auth::sessions::SESSION_COOKIE;
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

fn denied(d: Denied, what: &str) -> ApiError {
    let (_, message) = gpuledger_service::denied_message(d, what);
    match d {
        Denied::Unauthenticated => ApiError::Unauthenticated(message),
        Denied::Forbidden => ApiError::Forbidden(message),
    }
}

/// The principal behind the request, if it may do `action`.
fn authorize(
    s: &Service,
    headers: &HeaderMap,
    action: Action<'_>,
    what: &str,
) -> ApiResult<Principal> {
    s.guard
        .check(bearer_token(headers)?, action)
        .map_err(|d| denied(d, what))
}

/// The principal behind the request, whatever it may do.
fn principal(s: &Service, headers: &HeaderMap, what: &str) -> ApiResult<Principal> {
    s.guard
        .principal(bearer_token(headers)?)
        .map_err(|d| denied(d, what))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> ApiResult<&'a str> {
    headers
        .get(name)
        .ok_or_else(|| ApiError::bad(name, "missing header"))?
        .to_str()
        .map_err(|_| ApiError::bad(name, "not ASCII text"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("worker: {e}")))?
}

/// The answer to a pushed batch or event batch: `accepted` with the rows stored (and, for
/// samples, the rows not stored as sent, by reason), or `duplicate`.
#[derive(Debug, Serialize)]
struct IngestReply {
    status: &'static str,
    rows: usize,
    #[serde(skip_serializing_if = "is_zero")]
    duplicate_rows: usize,
    #[serde(skip_serializing_if = "is_zero")]
    trimmed_rows: usize,
    #[serde(skip_serializing_if = "is_zero")]
    rebooked_rows: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl From<IngestOutcome> for IngestReply {
    fn from(o: IngestOutcome) -> Self {
        match o {
            IngestOutcome::Accepted(a) => IngestReply {
                status: "accepted",
                rows: a.rows,
                duplicate_rows: a.duplicate_rows,
                trimmed_rows: a.trimmed_rows,
                rebooked_rows: a.rebooked_rows,
            },
            IngestOutcome::Duplicate => IngestReply {
                status: "duplicate",
                rows: 0,
                duplicate_rows: 0,
                trimmed_rows: 0,
                rebooked_rows: 0,
            },
        }
    }
}

async fn ingest(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<IngestReply>> {
    let result = ingest_batch(&s, &headers, body).await;
    match &result {
        Ok((_, reply)) if reply.status == "duplicate" => s.metrics.count_duplicate(),
        other => s.metrics.count_ingest(other),
    }
    result.map(|(_, reply)| Json(reply))
}

async fn ingest_batch(
    s: &Arc<Service>,
    headers: &HeaderMap,
    body: Bytes,
) -> ApiResult<(usize, IngestReply)> {
    let node = header_text(headers, NODE_HEADER)?.to_owned();
    authorize(
        s,
        headers,
        Action::Ingest { node: &node },
        "push samples as this node",
    )?;
    if s.ingestor.config().inventory.node(&node).is_none() {
        return Err(ApiError::invalid(vec![RowError {
                row: None,
                field: NODE_HEADER.to_owned(),
                message: format!(
                    "`{node}` is not a node of this cluster's config (or not one of this aggregator's --node); nothing was stored"
                ),
            }]));
    }
    let epoch = match headers.get(EPOCH_HEADER) {
        None => None,
        Some(_) => {
            let epoch = header_text(headers, EPOCH_HEADER)?;
            check_epoch(epoch).map_err(|m| ApiError::bad(EPOCH_HEADER, m))?;
            Some(epoch.to_owned())
        }
    };
    let seq: u64 = header_text(headers, SEQ_HEADER)?
        .parse()
        .map_err(|_| ApiError::bad(SEQ_HEADER, "not an unsigned integer"))?;
    let low: Option<u64> = match headers.get(LOW_SEQ_HEADER) {
        None => None,
        Some(_) => Some(
            header_text(headers, LOW_SEQ_HEADER)?
                .parse()
                .map_err(|_| ApiError::bad(LOW_SEQ_HEADER, "not an unsigned integer"))?,
        ),
    };
    if low.is_some_and(|l| l > seq) {
        return Err(ApiError::bad(
            LOW_SEQ_HEADER,
            format!("must not be above the batch's own sequence number {seq}"),
        ));
    }
    let skew = match headers.get(SENT_AT_HEADER) {
        None => None,
        Some(_) => {
            let sent_at: i64 = header_text(headers, SENT_AT_HEADER)?
                .parse()
                .map_err(|_| ApiError::bad(SENT_AT_HEADER, "not Unix milliseconds"))?;
            Some(crate::clock_skew::assess(sent_at, s.clock.now_ms()))
        }
    };
    if let Some(skew) = skew {
        s.metrics.observe_clock(&node, skew);
    }
    if let Some(crate::clock_skew::Skew::Refused { offset_s }) = skew {
        return Err(ApiError::invalid(vec![RowError {
                row: None,
                field: SENT_AT_HEADER.to_owned(),
                message: format!(
                    "{}, more than {} s: fix its time sync (NTP, chrony); the batch is refused, nothing was stored",
                    crate::clock_skew::describe(offset_s),
                    crate::clock_skew::REFUSE_ABOVE_MS / 1000
                ),
            }]));
    }
    let bytes = body.len();
    let service = Arc::clone(s);
    blocking(move || {
        let mut batch = decode_ipc(&body)
            .map_err(|e| ApiError::bad("body", format!("not an Arrow IPC stream: {e}")))?;
        let mut batch_is_body = true;
        if let Some(crate::clock_skew::Skew::Corrected { offset_s }) = skew {
            // Onto the aggregator's time line before anything checks or stores it.
            batch = crate::clock_skew::shift_times(&batch, -offset_s * 1000)
                .map_err(|e| ApiError::bad("body", format!("moving the sample times: {e}")))?;
            batch_is_body = false;
        }
        let ingested = service.ingestor.ingest_push(SamplePush {
            node: &node,
            epoch: epoch.as_deref(),
            seq,
            low,
            batch: &batch,
            body: Some(&body),
            batch_is_body,
        })?;
        match (&ingested.outcome, &ingested.stored) {
            (IngestOutcome::Accepted(accepted), Some(stored)) => {
                service.metrics.count_usage(stored);
                service.metrics.count_set_aside(&node, accepted);
            }
            (IngestOutcome::Duplicate, _) if ingested.duplicate_rows > 0 => {
                service.metrics.count_set_aside(
                    &node,
                    &crate::ingest::Accepted {
                        duplicate_rows: ingested.duplicate_rows,
                        ..Default::default()
                    },
                );
            }
            _ => {}
        }
        match ingested.refused {
            None => Ok((bytes, ingested.outcome.into())),
            Some(refusal) => {
                let refused_rows = refusal.bad_row_count(batch.num_rows());
                service.metrics.count_refused_rows(&node, refused_rows);
                Err(crate::ingest::rows_refused(refusal, batch.num_rows()).into())
            }
        }
    })
    .await
}

async fn events(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<IngestReply>> {
    authorize(&s, &headers, Action::PostEvents, "post job events")?;
    let request: EventBatch = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad("body", format!("not an events request: {e}")))?;
    gpuledger_model::event_json::check_source(&request.source).map_err(|why| {
        s.metrics.count_refused_events();
        ApiError::bad("source", format!("`source` {why}"))
    })?;
    let rows = parse_event_rows(&request.events);
    let parsed = rows.events.clone();
    let service = Arc::clone(&s);
    let outcome = blocking(move || {
        let ingested = service
            .ingestor
            .ingest_event_rows(&request.source, request.seq, rows)
            .inspect_err(|e| {
                if matches!(e, crate::Error::Invalid(_)) {
                    service.metrics.count_refused_events();
                }
            })?;
        if matches!(ingested.outcome, IngestOutcome::Accepted { .. }) {
            let stored: Vec<JobEvent> = (parsed.into_iter().enumerate())
                .filter(|(row, _)| !ingested.refused_row(*row))
                .filter_map(|(_, e)| e)
                .collect();
            service.metrics.observe_events(&stored);
        }
        if ingested.refused.is_some() {
            service.metrics.count_refused_events();
        }
        Ok(ingested.into_result()?)
    })
    .await?;
    Ok(Json(outcome.into()))
}

async fn metrics(State(s): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&s, &headers, Action::Metrics, "read /metrics") {
        return e.into_response();
    }
    if let Some(wal) = s.ingestor.wal() {
        s.metrics.set_wal_bytes(wal.size_bytes());
    }
    s.metrics
        .set_pending_rows(s.ingestor.store().pending_rows());
    s.metrics.set_quarantined(s.query.quarantined().len());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render() + &gpuledger_auth::tls::certificate_metrics(),
    )
        .into_response()
}

async fn healthz(State(s): State<Arc<Service>>) -> ApiResult<&'static str> {
    if s.ingestor.has_failed() {
        return Err(ApiError::Unavailable(
            "a write failed; restart to recover from the log".into(),
        ));
    }
    Ok("ok\n")
}

/// Readiness, open to all (a load balancer or kubelet asks): 200 once the write-ahead log is
/// recovered and the first flush has finished, so that queries see what was acknowledged
/// before the restart; 503 before, and after a write failed.
async fn readyz(State(s): State<Arc<Service>>) -> ApiResult<&'static str> {
    healthz(State(Arc::clone(&s))).await?;
    if !s.ready.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ApiError::Unavailable(
            "starting: recovered, the first flush has not finished".into(),
        ));
    }
    Ok("ready\n")
}

/// A point in time: RFC 3339, a date (midnight UTC) or Unix milliseconds.
pub fn parse_time(field: &str, text: &str) -> ApiResult<UnixMillis> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(gpuledger_model::time::day_start_ms(d));
    }
    Err(ApiError::bad(
        field,
        format!("`{text}` is not RFC 3339, YYYY-MM-DD or Unix milliseconds"),
    ))
}

/// A route's query parameters; a bad one is a 400 naming it, in the JSON every error has.
struct QueryParams<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        gpuledger_service::parse_query(parts.uri.query())
            .map(QueryParams)
            .map_err(|bad| ApiError::bad(&bad.field, bad.message))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageParams {
    at: Option<String>,
    half_life: Option<String>,
}

async fn usage(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<UsageParams>,
) -> ApiResult<Json<UsageFeed>> {
    let who = principal(&s, &headers, "read the usage feed")?;
    let scope = if who.may(Action::ReadAll, s.guard.public()) {
        Scope::All
    } else if let Principal::Tenant(a) = &who {
        Scope::Account(a.clone())
    } else {
        return Err(denied(
            if who == Principal::Anonymous {
                Denied::Unauthenticated
            } else {
                Denied::Forbidden
            },
            "read the usage feed",
        ));
    };
    let at_ms = match &p.at {
        Some(t) => parse_time("at", t)?,
        None => s.clock.now_ms(),
    };
    let half_life = match &p.half_life {
        Some(h) => h
            .parse::<DurationSpec>()
            .map_err(|e| ApiError::bad("half_life", e.to_string()))?,
        None => s.config.fair_share.half_life,
    };
    if half_life.as_secs() == 0 {
        return Err(ApiError::bad("half_life", "must be longer than 0 s"));
    }
    let mut rows = s.query.hourly_usage(at_ms).await?;
    rows.retain(|r| scope.covers(&r.account));
    Ok(Json(UsageFeed {
        at_ms,
        half_life_s: half_life.as_secs(),
        accounts: decayed_usage(&rows, at_ms, half_life.as_secs()),
    }))
}

/// Decays each hour's GPU-seconds from the middle of the hour (its end, when `at` falls inside
/// it, counted as elapsed 0) to `at_ms`, in GPU-hours; and adds them, undecayed, to the quota
/// windows of `at_ms`.
fn decayed_usage(
    rows: &[crate::query::HourlyUsage],
    at_ms: UnixMillis,
    half_life_s: u64,
) -> BTreeMap<String, AccountUsage> {
    let mut out: BTreeMap<String, AccountUsage> = BTreeMap::new();
    for r in rows {
        let mid_ms = (r.hour_ms + 1_800_000).min(at_ms);
        let elapsed_s = (at_ms - mid_ms) as f64 / 1000.0;
        let hours = r.gpu_seconds as f64 / 3600.0 * decay_factor(elapsed_s, half_life_s as f64);
        let account = out.entry(r.account.clone()).or_default();
        account.decayed_gpu_hours += hours;
        account.window.add_hour(r.hour_ms, at_ms, r.gpu_seconds);
        if let Some(project) = &r.project {
            *account.projects.entry(project.clone()).or_default() += hours;
            account
                .project_windows
                .entry(project.clone())
                .or_default()
                .add_hour(r.hour_ms, at_ms, r.gpu_seconds);
        }
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowParams {
    from: Option<String>,
    to: Option<String>,
}

#[derive(Debug, Serialize)]
struct AccountSummary {
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    #[serde(flatten)]
    indicators: AccountIndicators,
    gpu_hours: f64,
    /// The account's quota in GPU-hours per day and per week, and the window's use against
    /// them (GPU-hours used per day or week of the window).
    quota_gpu_hours_per_day: Option<u64>,
    quota_gpu_hours_per_week: Option<u64>,
    daily_quota_utilization: Option<f64>,
    weekly_quota_utilization: Option<f64>,
}

async fn account_summary(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    Path(account): Path<String>,
    QueryParams(p): QueryParams<WindowParams>,
) -> ApiResult<Json<AccountSummary>> {
    let who = principal(&s, &headers, "read an account")?;
    let id: AccountId = account
        .parse()
        .map_err(|e: gpuledger_model::ids::IdError| ApiError::bad("account", e.to_string()))?;
    let no_account = || ApiError::NotFound(format!("no account `{id}`"));
    if !who.may(Action::ReadAccount(id.as_str()), s.guard.public()) {
        // A tenant learns nothing of another account: not even that it exists.
        return Err(match who {
            Principal::Tenant(_) => no_account(),
            Principal::Anonymous => denied(Denied::Unauthenticated, "read an account"),
            _ => denied(Denied::Forbidden, "read an account"),
        });
    }
    let Some(config) = s.config.accounts.iter().find(|a| a.id == id) else {
        return Err(no_account());
    };
    let to_ms = match &p.to {
        Some(t) => parse_time("to", t)?,
        None => s.clock.now_ms(),
    };
    let from_ms = match &p.from {
        Some(t) => parse_time("from", t)?,
        None => to_ms - 30 * 86_400_000,
    };
    if from_ms >= to_ms {
        return Err(ApiError::bad("from", "must be before `to`"));
    }
    let indicators = s
        .query
        .account_indicators(from_ms, to_ms)
        .await?
        .into_iter()
        .find(|i| i.account == id.as_str());
    let mut indicators = indicators.unwrap_or_else(|| AccountIndicators {
        account: id.to_string(),
        ..Default::default()
    });
    if indicators.jobs == 0 {
        fill_job_figures(&mut indicators, &[]);
    }
    let gpu_hours = indicators.gpu_seconds as f64 / 3600.0;
    let days = (to_ms - from_ms) as f64 / 86_400_000.0;
    let per = |quota: Option<u64>, period_days: f64| {
        quota
            .filter(|q| *q > 0)
            .map(|q| gpu_hours / (days / period_days) / q as f64)
    };
    Ok(Json(AccountSummary {
        from_ms,
        to_ms,
        gpu_hours,
        quota_gpu_hours_per_day: config.quota.gpu_hours_per_day,
        quota_gpu_hours_per_week: config.quota.gpu_hours_per_week,
        daily_quota_utilization: per(config.quota.gpu_hours_per_day, 1.0),
        weekly_quota_utilization: per(config.quota.gpu_hours_per_week, 7.0),
        indicators,
    }))
}

async fn job(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<crate::query::JobDetail>> {
    let who = principal(&s, &headers, "read a job")?;
    let scope = who.scope(s.guard.public());
    if matches!(scope, Scope::Nothing) || who == Principal::Anonymous {
        return Err(denied(
            if who == Principal::Anonymous {
                Denied::Unauthenticated
            } else {
                Denied::Forbidden
            },
            "read a job",
        ));
    }
    let id: JobId = id
        .parse()
        .map_err(|e: gpuledger_model::ids::IdError| ApiError::bad("id", e.to_string()))?;
    // Another tenant's job is answered as a job that does not exist, after the same query.
    match s.query.job_detail(id.as_str()).await? {
        Some(detail) if detail.account.as_deref().is_some_and(|a| scope.covers(a)) => {
            Ok(Json(detail))
        }
        _ => Err(ApiError::NotFound(format!(
            "no job `{id}` in the stored data"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    sql: String,
}

async fn query(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    authorize(&s, &headers, Action::Sql, "run SQL")?;
    let request: SqlRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad("body", format!("expected {{\"sql\": \"...\"}}: {e}")))?;
    let batches = s.sql.run(&s.query, &request.sql).await?;
    let mut rows = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    for b in &batches {
        if columns.is_empty() {
            columns = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
        }
        rows.extend(crate::query::batch_to_json_rows(b)?);
    }
    Ok(Json(json!({"columns": columns, "rows": rows})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusParams {
    window: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

fn status_window(s: &Service, p: &StatusParams) -> ApiResult<crate::status::Window> {
    let now = s.clock.now_ms();
    if p.from.is_some() || p.to.is_some() {
        let to_ms = match &p.to {
            Some(t) => parse_time("to", t)?,
            None => now,
        };
        let from_ms = match &p.from {
            Some(t) => parse_time("from", t)?,
            None => crate::status::month_start_ms(to_ms),
        };
        if from_ms >= to_ms {
            return Err(ApiError::bad("from", "must be before `to`"));
        }
        return Ok(crate::status::Window {
            from_ms,
            to_ms,
            name: "custom".into(),
        });
    }
    let name = p.window.as_deref().unwrap_or("mtd");
    crate::status::Window::named(name, now)
        .ok_or_else(|| ApiError::bad("window", format!("`{name}`: use mtd, 24h, 7d or 30d")))
}

async fn status_view(
    s: &Service,
    who: &Principal,
    p: &StatusParams,
) -> ApiResult<crate::status::StatusView> {
    let window = status_window(s, p)?;
    let scope = who.scope(s.guard.public());
    let live = s.metrics.live_jobs();
    Ok(crate::status::build(&s.query, &s.config, &live, &scope, window, s.clock.now_ms()).await?)
}

async fn status_json(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<StatusParams>,
) -> ApiResult<Json<crate::status::StatusView>> {
    let who = authorize(&s, &headers, Action::ViewStatus, "read the status")?;
    Ok(Json(status_view(&s, &who, &p).await?))
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn status_page(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<StatusParams>,
) -> Response {
    let token = match page_token(&s, &headers) {
        Ok(t) => t,
        Err(page) => return *page,
    };
    let token = token.as_deref();
    let who = match s.guard.check(token, Action::ViewStatus) {
        Ok(who) => who,
        Err(Denied::Unauthenticated) => {
            let note = token.map(|_| "That token is not valid here; sign in again.");
            return html(StatusCode::UNAUTHORIZED, crate::status::login_page(note));
        }
        Err(Denied::Forbidden) => {
            return html(
                StatusCode::FORBIDDEN,
                crate::status::login_page(Some("This token's role has no status page.")),
            )
        }
    };
    match status_view(&s, &who, &p).await {
        Ok(view) => {
            let signed_in =
                (s.guard.is_on() && who != Principal::Anonymous).then(|| who.describe());
            let nav = crate::status::Nav {
                signed_in: signed_in.as_deref(),
                invoices: may_read_invoices(&s, &who),
            };
            html(StatusCode::OK, crate::status::render(&view, nav))
        }
        Err(e) => e.into_response(),
    }
}

/// The token of a page request: its bearer token, else the sign-in cookie's.
fn page_token(s: &Service, headers: &HeaderMap) -> Result<Option<String>, Box<Response>> {
    match bearer_token(headers) {
        Ok(Some(t)) => Ok(Some(t.to_owned())),
        Ok(None) => {
            Ok(session_cookie(headers).and_then(|id| s.sessions.token(id, s.clock.now_ms())))
        }
        Err(e) => Err(Box::new(e.into_response())),
    }
}

/// Whether `who` may read any account's invoices (a tenant: its own).
fn may_read_invoices(s: &Service, who: &Principal) -> bool {
    let account = match who {
        Principal::Tenant(a) => a.as_str(),
        _ => "",
    };
    who.may(Action::ReadInvoices(account), s.guard.public())
}

/// The principal behind a page request that reads invoices, or the page to answer instead:
/// the sign-in page when no valid token came, 403 when its role reads no invoices.
fn invoice_reader(s: &Service, headers: &HeaderMap) -> Result<Principal, Box<Response>> {
    let token = page_token(s, headers)?;
    let who = match s.guard.principal(token.as_deref()) {
        Ok(Principal::Anonymous) | Err(Denied::Unauthenticated) => {
            let note = token.map(|_| "That token is not valid here; sign in again.");
            return Err(Box::new(html(
                StatusCode::UNAUTHORIZED,
                crate::status::login_page(note),
            )));
        }
        Ok(who) => who,
        Err(Denied::Forbidden) => {
            return Err(Box::new(
                denied(Denied::Forbidden, "read invoices").into_response(),
            ))
        }
    };
    if may_read_invoices(s, &who) {
        Ok(who)
    } else {
        Err(Box::new(
            denied(Denied::Forbidden, "read invoices").into_response(),
        ))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InvoicesParams {
    account: Option<String>,
    month: Option<String>,
}

/// The invoices `who` may read, filtered as asked.
async fn invoice_list(
    s: &Arc<Service>,
    who: &Principal,
    p: &InvoicesParams,
) -> ApiResult<Vec<crate::status::InvoiceSummary>> {
    if let Some(a) = &p.account {
        AccountId::new(a).map_err(|e| ApiError::bad("account", e.to_string()))?;
    }
    if let Some(m) = &p.month {
        gpuledger_billing::Period::month(m).map_err(|e| ApiError::bad("month", e.to_string()))?;
    }
    let root = s.invoices_root.clone();
    let public = s.guard.public().clone();
    let who = who.clone();
    let wanted = p.account.clone();
    let month = p.month.clone();
    let files = blocking(move || {
        gpuledger_billing::invoices::invoices_on_file(&root, |a| {
            who.may(Action::ReadInvoices(a), &public) && wanted.as_deref().is_none_or(|w| w == a)
        })
        .map_err(|e| ApiError::Internal(e.to_string()))
    })
    .await?;
    Ok(files
        .iter()
        .filter(|f| month.as_deref().is_none_or(|m| m == f.latest.period))
        .map(crate::status::InvoiceSummary::from)
        .collect())
}

async fn invoices_page(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<InvoicesParams>,
) -> Response {
    let who = match invoice_reader(&s, &headers) {
        Ok(who) => who,
        Err(page) => return *page,
    };
    match invoice_list(&s, &who, &p).await {
        Ok(list) => {
            let signed_in = (s.guard.is_on()).then(|| who.describe());
            let nav = crate::status::Nav {
                signed_in: signed_in.as_deref(),
                invoices: false,
            };
            html(
                StatusCode::OK,
                crate::status::invoices_page(
                    &s.config.cluster.name,
                    &list,
                    p.account.as_deref(),
                    nav,
                ),
            )
        }
        Err(e) => e.into_response(),
    }
}

async fn invoices_json(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<InvoicesParams>,
) -> ApiResult<Json<Vec<crate::status::InvoiceSummary>>> {
    let who = principal(&s, &headers, "read invoices")?;
    if !may_read_invoices(&s, &who) {
        return Err(denied(
            if who == Principal::Anonymous {
                Denied::Unauthenticated
            } else {
                Denied::Forbidden
            },
            "read invoices",
        ));
    }
    Ok(Json(invoice_list(&s, &who, &p).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InvoiceParams {
    revision: Option<u32>,
    format: Option<String>,
}

/// One invoice as HTML, CSV or JSON. Another tenant's invoice is answered as one that does not
/// exist.
async fn invoice_file(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    Path((month, account)): Path<(String, String)>,
    QueryParams(p): QueryParams<InvoiceParams>,
) -> Response {
    let who = match invoice_reader(&s, &headers) {
        Ok(who) => who,
        Err(page) => return *page,
    };
    let format = p.format.as_deref().unwrap_or("html");
    if !matches!(format, "html" | "csv" | "json") {
        return ApiError::bad("format", format!("`{format}`: html, csv or json")).into_response();
    }
    let not_found = || ApiError::NotFound(format!("no invoice of `{account}` for `{month}`"));
    if !who.may(Action::ReadInvoices(&account), s.guard.public()) {
        return not_found().into_response();
    }
    let root = s.invoices_root.clone();
    let (m, a, revision) = (month.clone(), account.clone(), p.revision);
    let found = blocking(move || {
        gpuledger_billing::invoices::invoice_on_file(&root, &m, &a, revision).map_err(|e| match e {
            gpuledger_billing::Error::BadPeriod(_) => ApiError::bad("month", e.to_string()),
            gpuledger_billing::Error::Input(msg) => ApiError::bad("account", msg),
            other => ApiError::Internal(other.to_string()),
        })
    })
    .await;
    let inv = match found {
        Ok(Some(inv)) => inv,
        Ok(None) => return not_found().into_response(),
        Err(e) => return e.into_response(),
    };
    use gpuledger_billing::render::{invoice_csv, invoice_html, invoice_json};
    let (content_type, body) = match format {
        "csv" => ("text/csv; charset=utf-8", invoice_csv(&inv)),
        "json" => ("application/json", invoice_json(&inv)),
        _ => ("text/html; charset=utf-8", invoice_html(&inv)),
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The allocation feed from the running jobs' start events: a node's token reads its own
/// node's GPUs (an exporter resolving the jobs of dcgm-exporter's mapping files), an operator
/// every node's.
async fn allocations(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
) -> ApiResult<Json<gpuledger_model::allocation_feed::AllocationFeed>> {
    let who = principal(&s, &headers, "read the allocation feed")?;
    let gpus = match &who {
        Principal::Node(me) => s.metrics.allocations(Some(me)),
        p if p.may(Action::Operate, s.guard.public()) => s.metrics.allocations(None),
        Principal::Anonymous => {
            return Err(denied(Denied::Unauthenticated, "read the allocation feed"))
        }
        _ => return Err(denied(Denied::Forbidden, "read the allocation feed")),
    };
    Ok(Json(gpuledger_model::allocation_feed::AllocationFeed {
        gpus,
    }))
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(s): State<Arc<Service>>, axum::Form(form): axum::Form<LoginForm>) -> Response {
    let token = form.token.trim();
    match s.guard.check(Some(token), Action::ViewStatus) {
        Ok(_) => match s.sessions.open(token, s.clock.now_ms()) {
            Ok(id) => (
                StatusCode::SEE_OTHER,
                [
                    (header::LOCATION, "/".to_owned()),
                    (header::SET_COOKIE, s.sessions.set_cookie(&id)),
                ],
            )
                .into_response(),
            Err(e) => ApiError::Internal(e.to_string()).into_response(),
        },
        Err(Denied::Unauthenticated) => html(
            StatusCode::UNAUTHORIZED,
            crate::status::login_page(Some("That token is not valid here.")),
        ),
        Err(Denied::Forbidden) => html(
            StatusCode::FORBIDDEN,
            crate::status::login_page(Some("This token's role has no status page.")),
        ),
    }
}

async fn logout(State(s): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        s.sessions.close(id);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_owned()),
            (header::SET_COOKIE, s.sessions.clear_cookie()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_three_forms() {
        assert_eq!(parse_time("at", "0").unwrap(), 0);
        assert_eq!(parse_time("at", "1970-01-02").unwrap(), 86_400_000);
        assert_eq!(parse_time("at", "1970-01-01T00:00:01Z").unwrap(), 1000);
        assert!(matches!(
            parse_time("at", "yesterday"),
            Err(ApiError::BadRequest { .. })
        ));
    }

    #[test]
    fn usage_halves_after_one_half_life() {
        let rows = [crate::query::HourlyUsage {
            account: "a".into(),
            project: Some("p".into()),
            hour_ms: 0,
            gpu_seconds: 7200,
        }];
        let at = 1_800_000 + 3_600_000;
        let u = decayed_usage(&rows, at, 3600);
        assert!((u["a"].decayed_gpu_hours - 1.0).abs() < 1e-12);
        assert!((u["a"].projects["p"] - 1.0).abs() < 1e-12);
        assert_eq!(u["a"].window.day_gpu_s, 7200, "undecayed, the same UTC day");
        assert_eq!(u["a"].project_windows["p"].week_gpu_s, 7200);
        let next_day = decayed_usage(&rows, 86_400_000, 3600);
        assert_eq!(next_day["a"].window.day_gpu_s, 0);
        assert_eq!(next_day["a"].window.week_gpu_s, 7200);
    }
}
