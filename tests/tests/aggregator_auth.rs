//! Authentication and tenant isolation on every route of the aggregator, through its router:
//! no token is a 401, a role that may not is a 403, a node pushes only as itself, and tenant
//! alpha can read, list, change or infer nothing of tenant beta: beta's account and jobs are
//! answered exactly as ones that do not exist, the usage feed and the status hold alpha alone,
//! SQL is closed to tenants.

mod common;

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::TimeZone;
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_auth::{Guard, Public, Role, TokenFile};
use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};
use serde_json::{json, Value};

use common::{api_with, ipc, Api, T0};

struct Tokens {
    operator: String,
    finance: String,
    alpha: String,
    beta: String,
    node1: String,
}

fn tokens(public: &[Public]) -> (Guard, Tokens) {
    let now = chrono::Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
    let mut file = TokenFile::default();
    let mut issue = |role, name: &str, account: Option<&str>, node: Option<&str>| {
        file.issue(
            role,
            name,
            account.map(|a| a.parse().unwrap()),
            node.map(str::to_owned),
            now,
        )
        .unwrap()
    };
    let t = Tokens {
        operator: issue(Role::Operator, "ops", None, None),
        finance: issue(Role::Finance, "finance", None, None),
        alpha: issue(Role::Tenant, "alpha", Some("alpha"), None),
        beta: issue(Role::Tenant, "beta", Some("beta"), None),
        node1: issue(Role::Node, "node001", None, Some("node001")),
    };
    (Guard::new(&file, public.iter().copied()), t)
}

/// Beta's job 2000 on node002's GPUs 0-3 for an hour at 10 s.
fn beta_ipc() -> Vec<u8> {
    let mut b = SampleBatchBuilder::with_capacity(360 * 4);
    for step in 0..360 {
        for gpu in 0..4u16 {
            b.push(&SampleRow {
                time_ms: T0 + step * 10_000,
                interval_s: 10,
                node: "node002".into(),
                gpu_index: gpu,
                gpu_uuid: format!("GPU-node002-{gpu:04}"),
                gpu_model: "h100-sxm".into(),
                mig_instance: None,
                job_id: Some("2000".into()),
                account: Some("beta".into()),
                project: Some("sweep".into()),
                gpu_util_pct: Some(60.0),
                sm_active: Some(0.5),
                tensor_active: Some(0.4),
                dram_active: Some(0.2),
                sm_clock_mhz: Some(1830),
                mem_used_bytes: Some(40 << 30),
                mem_total_bytes: Some(80 << 30),
                power_w: Some(500.0),
                energy_j: Some(5000.0),
                xid: None,
            });
        }
    }
    encode_ipc(&b.finish().unwrap()).unwrap()
}

async fn with_data(public: &[Public]) -> (Api, Tokens) {
    let (guard, t) = tokens(public);
    let api = api_with(guard).await;
    let op = Some(t.operator.as_str());
    let (s, r) = api
        .ingest_as(Some(&t.node1), "node001", 0, ipc(0..2880, "node001"))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (s, r) = api.ingest_as(op, "node002", 0, beta_ipc()).await;
    assert_eq!(s, StatusCode::OK, "an operator may push for any node: {r}");
    let events = json!({"source": "sched", "seq": 0, "events": [
        {"time_ms": T0 - 60_000, "job_id": "1000", "account": "alpha", "project": "train", "kind": "submitted", "gpus": 2},
        {"time_ms": T0, "job_id": "1000", "account": "alpha", "project": "train", "kind": "started", "gpus": 2},
        {"time_ms": T0 - 120_000, "job_id": "2000", "account": "beta", "project": "sweep", "kind": "submitted", "gpus": 4},
        {"time_ms": T0, "job_id": "2000", "account": "beta", "project": "sweep", "kind": "started", "gpus": 4},
        {"time_ms": T0 + 60_000, "job_id": "2001", "account": "beta", "kind": "submitted", "gpus": 8},
    ]});
    let (s, r) = api.post_json_as(op, "/api/v1/events", events).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let ingestor = std::sync::Arc::clone(&api.service.ingestor);
    tokio::task::spawn_blocking(move || ingestor.flush().unwrap())
        .await
        .unwrap();
    (api, t)
}

/// The error text with the one name that differs replaced.
fn error_of(body: &Value, name: &str) -> String {
    body["error"].as_str().unwrap_or("").replace(name, "NAME")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_the_token_and_its_role() {
    let (api, t) = with_data(&[]).await;
    let (op, fin, alpha, node) = (
        Some(t.operator.as_str()),
        Some(t.finance.as_str()),
        Some(t.alpha.as_str()),
        Some(t.node1.as_str()),
    );
    let reads = [
        "/api/v1/usage",
        "/api/v1/accounts/alpha/summary",
        "/api/v1/jobs/1000",
        "/api/v1/status",
        "/metrics",
    ];
    for uri in reads {
        let (s, body, _) = api.get_as(None, uri).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} without a token: {body}");
        let (s, _, _) = api.get_as(Some("gpl_0123456789ab_00"), uri).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} with a forged token");
        let (s, _, _) = api.get_as(op, uri).await;
        assert_eq!(s, StatusCode::OK, "{uri} as the operator");
        let (s, _, _) = api.get_as(node, uri).await;
        assert_eq!(
            s,
            StatusCode::FORBIDDEN,
            "{uri}: a node token reads nothing"
        );
    }
    let (s, _, _) = api
        .call(
            Request::get("/metrics")
                .header("authorization", format!("Basic {}", t.operator))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "only bearer tokens");
    assert_eq!(api.get_as(None, "/healthz").await.0, StatusCode::OK);
    // Readiness, open to a probe: not before the first flush after recovery.
    let (s, _, body) = api.get_as(None, "/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("first flush"), "{body}");
    api.service
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(api.get_as(None, "/readyz").await.0, StatusCode::OK);

    // Pushing: a node as itself only; tenants and finance not at all; nothing stored.
    let before = api.stored().await;
    for (token, node_name, expected) in [
        (None, "node001", StatusCode::UNAUTHORIZED),
        (alpha, "node001", StatusCode::FORBIDDEN),
        (fin, "node001", StatusCode::FORBIDDEN),
        (node, "node002", StatusCode::FORBIDDEN),
    ] {
        let (s, r) = api
            .ingest_as(token, node_name, 7, ipc(0..8, node_name))
            .await;
        assert_eq!(s, expected, "{node_name}: {r}");
    }
    assert_eq!(api.stored().await, before, "refused pushes stored nothing");
    let (_, _, metrics) = api.get_as(op, "/metrics").await;
    assert!(
        metrics.contains("gpuledger_ingest_refused_batches_total{reason=\"unauthorized\"} 4"),
        "{metrics}"
    );

    // Events and SQL: operators only.
    let event = json!({"source": "x", "events": [{"time_ms": T0, "job_id": "3", "account": "alpha", "kind": "submitted"}]});
    for token in [alpha, fin, node] {
        assert_eq!(
            api.post_json_as(token, "/api/v1/events", event.clone())
                .await
                .0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            api.post_json_as(token, "/api/v1/query", json!({"sql": "SELECT 1"}))
                .await
                .0,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(
        api.post_json_as(None, "/api/v1/query", json!({"sql": "SELECT 1"}))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    // Finance reads every account's usage, but not /metrics.
    assert_eq!(
        api.get_as(fin, "/api/v1/accounts/beta/summary").await.0,
        StatusCode::OK
    );
    assert_eq!(api.get_as(fin, "/metrics").await.0, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_learns_nothing_of_another_tenant() {
    let (api, t) = with_data(&[]).await;
    let alpha = Some(t.alpha.as_str());

    // Beta's account and job look exactly like ones that do not exist.
    let (s_b, body_b, _) = api.get_as(alpha, "/api/v1/accounts/beta/summary").await;
    let (s_n, body_n, _) = api.get_as(alpha, "/api/v1/accounts/nobody/summary").await;
    assert_eq!((s_b, s_n), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
    assert_eq!(error_of(&body_b, "beta"), error_of(&body_n, "nobody"));
    let (s_b, body_b, _) = api.get_as(alpha, "/api/v1/jobs/2000").await;
    let (s_n, body_n, _) = api.get_as(alpha, "/api/v1/jobs/9999").await;
    assert_eq!((s_b, s_n), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
    assert_eq!(error_of(&body_b, "2000"), error_of(&body_n, "9999"));
    // Its own are there.
    let (s, own, _) = api.get_as(alpha, "/api/v1/jobs/1000").await;
    assert_eq!(
        (s, own["account"].as_str()),
        (StatusCode::OK, Some("alpha"))
    );
    let (s, own, _) = api
        .get_as(
            alpha,
            "/api/v1/accounts/alpha/summary?from=2026-06-01&to=2026-06-02",
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(own["gpu_seconds"].as_i64().unwrap() > 0);
    // Beta, asked with its own token, is there: the 404 above was about alpha's token.
    let (s, b, _) = api
        .get_as(
            Some(&t.beta),
            "/api/v1/accounts/beta/summary?from=2026-06-01&to=2026-06-02",
        )
        .await;
    assert_eq!(
        (s, b["gpu_seconds"].as_i64()),
        (StatusCode::OK, Some(360 * 4 * 10))
    );

    // The usage feed and the status hold alpha alone; nothing in them names beta.
    let (_, usage, text) = api.get_as(alpha, "/api/v1/usage").await;
    let accounts: Vec<&String> = usage["accounts"].as_object().unwrap().keys().collect();
    assert_eq!(accounts, vec!["alpha"], "{usage}");
    assert!(!text.contains("beta") && !text.contains("sweep"), "{text}");
    let (_, all, _) = api.get_as(Some(&t.operator), "/api/v1/usage").await;
    assert_eq!(all["accounts"].as_object().unwrap().len(), 2, "{all}");
    for uri in [
        "/api/v1/status?from=2026-06-01&to=2026-06-02",
        "/?from=2026-06-01&to=2026-06-02",
    ] {
        let (s, _, text) = api.get_as(alpha, uri).await;
        assert_eq!(s, StatusCode::OK, "{uri}: {text}");
        assert!(text.contains("alpha"), "{uri}: {text}");
        for other in ["beta", "sweep", "node002", "gamma"] {
            assert!(
                !text.contains(other),
                "{uri} shows `{other}` to alpha:\n{text}"
            );
        }
    }
    let (_, status, _) = api
        .get_as(alpha, "/api/v1/status?from=2026-06-01&to=2026-06-02")
        .await;
    let jobs: Vec<&str> = status["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(jobs, vec!["1000"], "alpha's queue holds its own job only");
    assert!(
        status["cluster"].is_null(),
        "no cluster-wide figures for a tenant"
    );
    // The operator's status holds both, and the queue: beta's 2001 waits.
    let (_, status, _) = api
        .get_as(
            Some(&t.operator),
            "/api/v1/status?from=2026-06-01&to=2026-06-02",
        )
        .await;
    let queue: BTreeMap<String, String> = status["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["job_id"].as_str().unwrap().to_owned(),
                q["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        queue,
        BTreeMap::from([
            ("1000".into(), "running".into()),
            ("2000".into(), "running".into()),
            ("2001".into(), "pending".into())
        ])
    );
    assert!(
        status["cluster"]["utilization"].as_f64().is_some(),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_signs_in_with_a_cookie_and_public_routes_are_the_operators_choice() {
    let (api, t) = with_data(&[Public::Metrics]).await;
    assert_eq!(
        api.get_as(None, "/metrics").await.0,
        StatusCode::OK,
        "opened to Prometheus"
    );
    assert_eq!(
        api.get_as(None, "/api/v1/usage").await.0,
        StatusCode::UNAUTHORIZED
    );
    let (s, _, page) = api.get_as(None, "/").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(page.contains("name=\"token\""), "the sign-in form: {page}");

    let login = |token: &str| {
        Request::post("/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={token}")))
            .unwrap()
    };
    let response = tower::ServiceExt::oneshot(api.app.clone(), login(&t.alpha))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Max-Age=43200")
            && !cookie.contains("Secure"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    // The cookie holds a session id, never the token.
    assert!(
        !cookie.contains(&t.alpha) && !cookie.contains("gpl_"),
        "{cookie}"
    );
    assert_eq!(pair.len(), "gpuledger_session=".len() + 64, "{pair}");
    let with_cookie = |method: &str, uri: &str, cookie: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("cookie", cookie)
            .body(Body::empty())
            .unwrap()
    };
    let (s, _, page) = api.call(with_cookie("GET", "/", &pair)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("data-scope=\"alpha\"") && !page.contains("beta"),
        "{page}"
    );
    // The cookie opens the page, not the API.
    let (s, _, _) = api.call(with_cookie("GET", "/api/v1/usage", &pair)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Signing out ends the session on the server: the old cookie opens nothing after.
    let response =
        tower::ServiceExt::oneshot(api.app.clone(), with_cookie("POST", "/logout", &pair))
            .await
            .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    let (s, _, _) = api.call(with_cookie("GET", "/", &pair)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "a signed-out session");
    // A forged session id is nobody.
    let forged = format!("gpuledger_session={}", "ab".repeat(32));
    let (s, _, _) = api.call(with_cookie("GET", "/", &forged)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let response = tower::ServiceExt::oneshot(api.app.clone(), login("gpl_0123456789ab_00"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers().get("set-cookie").is_none());
    let response = tower::ServiceExt::oneshot(api.app.clone(), login(&t.node1))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::FORBIDDEN,
        "a node token has no status page"
    );
}

/// The allocation feed from the job events: a node reads its own GPUs only (an exporter
/// resolving dcgm-exporter's job ids), an operator every node's, a tenant none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocation_feed_shows_a_node_its_own_gpus() {
    let (api, t) = with_data(&[]).await;
    let op = Some(t.operator.as_str());
    let events = json!({"source": "slurm", "seq": 0, "events": [
        {"time_ms": T0, "job_id": "3000", "account": "alpha", "project": "train", "kind": "started", "gpus": 3, "allocation": "node001:0-1;node002:7"},
        {"time_ms": T0, "job_id": "3001", "account": "beta", "kind": "started", "gpus": 2, "allocation": "node002:4-5"},
        {"time_ms": T0, "job_id": "3002", "account": "beta", "kind": "started", "gpus": 1, "allocation": "node001:3"},
        {"time_ms": T0 + 1000, "job_id": "3002", "account": "beta", "kind": "finished", "outcome": "completed"},
    ]});
    let (s, r) = api.post_json_as(op, "/api/v1/events", events).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let rows = |body: &Value| -> Vec<(String, u64, String, String)> {
        body["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["node"].as_str().unwrap().to_owned(),
                    r["gpu"].as_u64().unwrap(),
                    r["job_id"].as_str().unwrap().to_owned(),
                    r["account"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let (s, body, _) = api.get_as(Some(&t.node1), "/api/v1/allocations").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let own = |gpu, job: &str, account: &str| {
        (
            "node001".to_owned(),
            gpu,
            job.to_owned(),
            account.to_owned(),
        )
    };
    assert_eq!(
        rows(&body),
        [own(0, "3000", "alpha"), own(1, "3000", "alpha")],
        "its own GPUs, of running jobs only"
    );
    assert_eq!(body["gpus"][0]["project"], "train");
    let (s, body, _) = api.get_as(op, "/api/v1/allocations").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(rows(&body).len(), 5, "every node's: {body}");
    for (token, expected) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(t.alpha.as_str()), StatusCode::FORBIDDEN),
        (Some(t.finance.as_str()), StatusCode::FORBIDDEN),
    ] {
        assert_eq!(api.get_as(token, "/api/v1/allocations").await.0, expected);
    }
}
