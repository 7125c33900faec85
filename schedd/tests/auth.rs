//! The scheduler's API with tokens, route by route: no token is a 401, a role that may not is a
//! 403; tenant team-a submits, reads, cancels and checkpoints its own jobs only and cannot tell
//! team-b's jobs from jobs that do not exist; queue, share and reservations show it its own
//! rows; a node reads its own GPUs of the allocation feed; reservations are for operators.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::TimeZone;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use gpuledger_auth::{Guard, Role, TokenFile};
use gpuledger_model::time::ManualClock;
use gpuledger_model::ClusterConfig;
use gpuledger_schedd::executor::LocalExecutor;
use gpuledger_schedd::{http, Service, ServiceConfig};
use gpuledger_scheduler::SchedulerOptions;

const T0_MS: i64 = 1_780_272_000_000;

fn cluster() -> ClusterConfig {
    ClusterConfig::from_toml_str(
        "version = 1\n[cluster]\nname = \"two\"\n[[node_pools]]\nname = \"p\"\nprefix = \"gpu\"\n\
         count = 2\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
         [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
         [[partitions]]\nname = \"urgent\"\npriority_tier = 50\n\
         [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
         gpu_hour = { h100-sxm = \"1\" }\n\
         [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nrun_as = { user = \"root\" }\n\
         [[accounts]]\nid = \"team-b\"\nname = \"B\"\nweight = 1\nrun_as = { user = \"root\" }\n",
        "two.toml",
    )
    .unwrap()
}

struct Fixture {
    service: Arc<Service>,
    clock: Arc<ManualClock>,
    app: axum::Router,
    operator: String,
    a: String,
    b: String,
    finance: String,
    node1: String,
    _jobs: gpuledger_testkit::KillJobsUnder,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let config = ServiceConfig {
        options: SchedulerOptions::parse("fairshare+backfill").unwrap(),
        dir: dir.path().join("scheduler"),
        billing_reservations: None,
        aggregator: None,
        aggregator_token: None,
        usage_every: Duration::from_secs(60),
        storage_scans: None,
        tls: Default::default(),
    };
    let executor = Box::new(LocalExecutor::new(dir.path().join("scheduler/jobs")));
    let clock = Arc::new(ManualClock::new(T0_MS));
    let service = Arc::new(Service::open(cluster(), config, executor, clock.clone()).unwrap());
    let now = chrono::Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
    let mut file = TokenFile::default();
    let mut issue = |role, account: Option<&str>, node: Option<&str>| {
        file.issue(
            role,
            "t",
            account.map(|a| a.parse().unwrap()),
            node.map(str::to_owned),
            now,
        )
        .unwrap()
    };
    let (operator, a, b, finance, node1) = (
        issue(Role::Operator, None, None),
        issue(Role::Tenant, Some("team-a"), None),
        issue(Role::Tenant, Some("team-b"), None),
        issue(Role::Finance, None, None),
        issue(Role::Node, None, Some("gpu001")),
    );
    let app = http::router_with(
        Arc::clone(&service),
        Guard::new(&file, []),
        gpuledger_service::BodyBudget::new(
            gpuledger_model::units::ByteSize(1 << 20),
            http::MAX_BODY_BYTES,
        ),
    );
    Fixture {
        service,
        clock,
        app,
        operator,
        a,
        b,
        finance,
        node1,
        _jobs: gpuledger_testkit::KillJobsUnder::new(dir.path()),
        _dir: dir,
    }
}

async fn call(
    f: &Fixture,
    token: Option<&str>,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = f.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn job(account: &str, gpus: u32) -> Value {
    json!({"command": "trap 'exit 0' TERM; while :; do sleep 0.1; done", "account": account, "gpus": gpus, "time_limit": "1h"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_its_token_and_tenants_stay_apart() {
    let f = fixture();
    let (op, a, b) = (
        Some(f.operator.as_str()),
        Some(f.a.as_str()),
        Some(f.b.as_str()),
    );
    // Submitting: into one's own account only; without a token not at all.
    assert_eq!(
        call(&f, None, "POST", "/api/v1/jobs", Some(job("team-a", 4)))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&f, a, "POST", "/api/v1/jobs", Some(job("team-b", 4)))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(
            &f,
            Some(&f.node1),
            "POST",
            "/api/v1/jobs",
            Some(job("team-a", 4))
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    let (s, ja) = call(&f, a, "POST", "/api/v1/jobs", Some(job("team-a", 4))).await;
    assert_eq!(s, StatusCode::CREATED, "{ja}");
    let (s, jb) = call(&f, b, "POST", "/api/v1/jobs", Some(job("team-b", 4))).await;
    assert_eq!(s, StatusCode::CREATED, "{jb}");
    let (ja, jb) = (
        ja["job_id"].as_str().unwrap().to_owned(),
        jb["job_id"].as_str().unwrap().to_owned(),
    );
    let service = Arc::clone(&f.service);
    tokio::task::spawn_blocking(move || service.tick().unwrap())
        .await
        .unwrap();

    // team-b's job looks to team-a exactly like a job that does not exist.
    for (method, path) in [("GET", ""), ("DELETE", ""), ("POST", "/checkpoint")] {
        let (s_b, body_b) = call(&f, a, method, &format!("/api/v1/jobs/{jb}{path}"), None).await;
        let (s_n, body_n) = call(&f, a, method, &format!("/api/v1/jobs/999{path}"), None).await;
        assert_eq!(
            (s_b, s_n),
            (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND),
            "{method} {path}"
        );
        assert_eq!(
            body_b["error"]["message"]
                .as_str()
                .unwrap()
                .replace(&jb, "ID"),
            body_n["error"]["message"]
                .as_str()
                .unwrap()
                .replace("999", "ID"),
            "{method} {path}"
        );
    }
    assert_eq!(
        call(&f, a, "GET", &format!("/api/v1/jobs/{ja}"), None)
            .await
            .0,
        StatusCode::OK
    );
    // Lists hold one's own rows, even when another account's are asked for by name.
    for uri in [
        "/api/v1/queue",
        "/api/v1/jobs",
        "/api/v1/jobs?account=team-a,team-b",
    ] {
        let (_, q) = call(&f, a, "GET", uri, None).await;
        let ids: Vec<&str> = q["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [ja.as_str()], "{uri}");
    }
    let (_, q) = call(&f, Some(&f.finance), "GET", "/api/v1/queue", None).await;
    assert_eq!(
        q["jobs"].as_array().unwrap().len(),
        2,
        "finance reads every account"
    );
    let (_, share) = call(&f, a, "GET", "/api/v1/share", None).await;
    let accounts: Vec<&str> = share["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["account"].as_str().unwrap())
        .collect();
    assert_eq!(accounts, ["team-a"]);
    // Priorities (as sprio): one's own waiting jobs only; every account's to finance.
    let mut waiting = Vec::new();
    for (token, account) in [(a, "team-a"), (b, "team-b")] {
        let (s, body) = call(&f, token, "POST", "/api/v1/jobs", Some(job(account, 8))).await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        waiting.push(body["job_id"].as_str().unwrap().to_owned());
    }
    let service = Arc::clone(&f.service);
    tokio::task::spawn_blocking(move || service.tick().unwrap())
        .await
        .unwrap();
    let priority_ids = |v: &Value| -> Vec<String> {
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (s, mine) = call(&f, a, "GET", "/api/v1/priority", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(priority_ids(&mine), [waiting[0].clone()], "{mine}");
    assert_eq!(mine["jobs"][0]["account"], "team-a");
    let (_, every) = call(&f, Some(&f.finance), "GET", "/api/v1/priority", None).await;
    let mut seen = priority_ids(&every);
    seen.sort();
    let mut expected = waiting.clone();
    expected.sort();
    assert_eq!(seen, expected, "{every}");
    assert_eq!(
        call(&f, None, "GET", "/api/v1/priority", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&f, Some(&f.node1), "GET", "/api/v1/priority", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    for id in &waiting {
        let (s, _) = call(&f, op, "DELETE", &format!("/api/v1/jobs/{id}"), None).await;
        assert_eq!(s, StatusCode::OK);
    }
    // Reservations: operators make them; a tenant sees those it may use.
    let reservation = json!({"name": "b-only", "start": "2026-06-02T00:00:00Z", "end": "2026-06-03T00:00:00Z", "accounts": ["team-b"], "nodes": 1});
    assert_eq!(
        call(
            &f,
            a,
            "POST",
            "/api/v1/reservations",
            Some(reservation.clone())
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&f, op, "POST", "/api/v1/reservations", Some(reservation))
            .await
            .0,
        StatusCode::CREATED
    );
    let (_, r) = call(&f, a, "GET", "/api/v1/reservations", None).await;
    assert!(r["reservations"].as_array().unwrap().is_empty(), "{r}");
    let (_, r) = call(&f, b, "GET", "/api/v1/reservations", None).await;
    assert_eq!(r["reservations"].as_array().unwrap().len(), 1);
    assert_eq!(
        call(&f, b, "DELETE", "/api/v1/reservations/b-only", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // The allocation feed: a node sees its own GPUs, a tenant nothing.
    let (s, all) = call(&f, op, "GET", "/api/v1/allocations", None).await;
    assert_eq!(s, StatusCode::OK);
    let nodes = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> = v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["node"].as_str().unwrap().to_owned())
            .collect();
        n.dedup();
        n
    };
    assert_eq!(nodes(&all), ["gpu001", "gpu002"]);
    let (_, mine) = call(&f, Some(&f.node1), "GET", "/api/v1/allocations", None).await;
    assert_eq!(nodes(&mine), ["gpu001"]);
    assert_eq!(
        call(&f, a, "GET", "/api/v1/allocations", None).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&f, None, "GET", "/api/v1/allocations", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    // /metrics for operators; /healthz for anyone.
    assert_eq!(
        call(&f, a, "GET", "/metrics", None).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&f, op, "GET", "/metrics", None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&f, None, "GET", "/healthz", None).await.0,
        StatusCode::OK
    );
    // Cancelling one's own job works; the operator cancels anyone's.
    assert_eq!(
        call(&f, a, "DELETE", &format!("/api/v1/jobs/{ja}"), None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        call(&f, op, "DELETE", &format!("/api/v1/jobs/{jb}"), None)
            .await
            .0,
        StatusCode::OK
    );
    let service = Arc::clone(&f.service);
    tokio::task::spawn_blocking(move || {
        for _ in 0..50 {
            service.tick().unwrap();
            if service.queue().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
}

/// Ticks the scheduler a second at a time until `done`, for up to 20 s.
fn tick_until(f: &Fixture, mut done: impl FnMut(&Service) -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !done(&f.service) {
        assert!(std::time::Instant::now() < until, "timed out");
        f.clock.advance_ms(1000);
        f.service.tick().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state_of(s: &Service, id: &str) -> gpuledger_schedd::state::JobState {
    s.job(&id.parse().unwrap()).unwrap().state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_learns_nothing_of_another_tenants_jobs() {
    let f = fixture();
    let (op, a, b) = (
        Some(f.operator.as_str()),
        Some(f.a.as_str()),
        Some(f.b.as_str()),
    );
    // Ids are numbered per account: team-b's submissions do not move team-a's numbers.
    for n in 1..=3 {
        let (_, body) = call(&f, b, "POST", "/api/v1/jobs", Some(job("team-b", 1))).await;
        assert_eq!(body["job_id"], format!("team-b.{n}"));
    }
    let (_, body) = call(&f, b, "DELETE", "/api/v1/jobs/team-b.1", None).await;
    assert_eq!(body["state"], "cancelled", "{body}");
    for n in 2..=3 {
        call(&f, b, "DELETE", &format!("/api/v1/jobs/team-b.{n}"), None).await;
    }
    // team-a's job takes all 8 GPUs and ignores SIGTERM for its grace.
    let stubborn = json!({"command": "trap '' TERM; while :; do sleep 0.1; done", "account": "team-a", "gpus": 8, "time_limit": "10h", "grace": "10m"});
    let (_, body) = call(&f, a, "POST", "/api/v1/jobs", Some(stubborn)).await;
    assert_eq!(body["job_id"], "team-a.1");
    tick_until(&f, |s| {
        state_of(s, "team-a.1") == gpuledger_schedd::state::JobState::Running
    });
    // An hour on, team-b's urgent job preempts it.
    f.clock.advance_ms(3_600_000);
    let urgent = json!({"command": "true", "account": "team-b", "partition": "urgent", "gpus": 4, "time_limit": "1h"});
    let (_, body) = call(&f, b, "POST", "/api/v1/jobs", Some(urgent)).await;
    assert_eq!(body["job_id"], "team-b.4");
    tick_until(&f, |s| {
        state_of(s, "team-a.1") == gpuledger_schedd::state::JobState::Preempting
    });
    // team-a is told only that a higher tier preempts it; the operator sees which job.
    let (_, mine) = call(&f, a, "GET", "/api/v1/jobs/team-a.1", None).await;
    assert_eq!(mine["preempted_by"], "a higher tier", "{mine}");
    let (_, queue) = call(&f, a, "GET", "/api/v1/queue", None).await;
    assert_eq!(queue["jobs"][0]["preempted_by"], "a higher tier", "{queue}");
    assert!(!queue.to_string().contains("team-b"), "{queue}");
    let (_, seen) = call(&f, op, "GET", "/api/v1/jobs/team-a.1", None).await;
    assert_eq!(seen["preempted_by"], "team-b.4", "{seen}");
    // team-b's job and a job that does not exist: the same answer, after the same steps.
    let (other, missing) = ("/api/v1/jobs/team-b.4", "/api/v1/jobs/team-b.9");
    let (s_other, body_other) = call(&f, a, "GET", other, None).await;
    let (s_missing, body_missing) = call(&f, a, "GET", missing, None).await;
    assert_eq!(
        (s_other, s_missing),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(
        body_other.to_string().replace("team-b.4", "ID"),
        body_missing.to_string().replace("team-b.9", "ID")
    );
    // Timed, interleaved, many times: the medians are within noise of each other.
    let (mut t_other, mut t_missing) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        for (uri, times) in [(other, &mut t_other), (missing, &mut t_missing)] {
            let started = std::time::Instant::now();
            let (status, _) = call(&f, a, "GET", uri, None).await;
            times.push(started.elapsed());
            assert_eq!(status, StatusCode::NOT_FOUND);
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (m_other, m_missing) = (median(&mut t_other), median(&mut t_missing));
    let (low, high) = (m_other.min(m_missing), m_other.max(m_missing));
    assert!(
        high <= low.mul_f64(1.25) + Duration::from_micros(50),
        "another tenant's job: median {m_other:?}; a missing one: {m_missing:?}"
    );
    // Nothing left running behind the test.
    call(&f, op, "DELETE", "/api/v1/jobs/team-a.1?now=true", None).await;
    tick_until(&f, |s| state_of(s, "team-a.1").is_done());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_operator_drains_or_resumes_a_node_and_only_an_operator_reads_why() {
    let f = fixture();
    let (op, a) = (Some(f.operator.as_str()), Some(f.a.as_str()));
    let drain = "/api/v1/nodes/gpu001/drain";
    let reason = json!({"reason": "job team-b.7 would not die"});
    for (token, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (a, StatusCode::FORBIDDEN),
        (Some(f.finance.as_str()), StatusCode::FORBIDDEN),
        (Some(f.node1.as_str()), StatusCode::FORBIDDEN),
    ] {
        let (got, body) = call(&f, token, "POST", drain, Some(reason.clone())).await;
        assert_eq!(got, status, "{body}");
        let (got, body) = call(&f, token, "POST", "/api/v1/nodes/gpu001/resume", None).await;
        assert_eq!(got, status, "{body}");
    }
    assert_eq!(f.service.nodes()[0].state, "idle");
    let (got, body) = call(&f, op, "POST", drain, Some(reason)).await;
    assert_eq!(got, StatusCode::NO_CONTENT, "{body}");
    // A tenant sees that the node is out of service, not why (the reason may name another
    // account's job); the operator sees why.
    let (_, body) = call(&f, a, "GET", "/api/v1/nodes", None).await;
    assert_eq!(body["nodes"][0]["state"], "drained", "{body}");
    assert_eq!(body["nodes"][0]["gpu_type"], "h100-sxm", "{body}");
    assert_eq!(body["nodes"][0]["reason"], "out of service", "{body}");
    assert_eq!(body["nodes"][0]["by"], Value::Null, "{body}");
    let (_, body) = call(&f, op, "GET", "/api/v1/nodes", None).await;
    assert_eq!(
        body["nodes"][0]["reason"], "job team-b.7 would not die",
        "{body}"
    );
    let (got, _) = call(&f, None, "GET", "/api/v1/nodes", None).await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
}
