//! The live scheduler over its HTTP API, with real processes: a job sees its GPUs, an urgent
//! job preempts it (SIGTERM, checkpoint, requeue), both finish, the state survives a restart
//! that adopts a running process, and bad requests get a clear 4xx.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use gpuledger_model::time::{Clock, ManualClock};
use gpuledger_model::{ClusterConfig, JobId};
use gpuledger_schedd::aggregator::PostError;
use gpuledger_schedd::executor::{ExecutorOptions, LocalExecutor};
use gpuledger_schedd::state::JobState;
use gpuledger_schedd::{http, Service, ServiceConfig};
use gpuledger_scheduler::SchedulerOptions;

const T0_MS: i64 = 1_780_272_000_000;

fn cluster() -> ClusterConfig {
    ClusterConfig::from_toml_str(CLUSTER, "one.toml").unwrap()
}

/// The test cluster with `from` replaced by `to` (which must be there).
fn cluster_with(from: &str, to: &str) -> ClusterConfig {
    assert!(CLUSTER.contains(from), "{from} is not in the test cluster");
    ClusterConfig::from_toml_str(&CLUSTER.replace(from, to), "one.toml").unwrap()
}

const CLUSTER: &str = "version = 1\n[cluster]\nname = \"one\"\n[[node_pools]]\nname = \"p\"\nprefix = \"gpu\"\n\
         count = 1\ngpus_per_node = 8\ngpu_model = \"h100-sxm\"\n\
         [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
         [[partitions]]\nname = \"urgent\"\npriority_tier = 50\nallowed_accounts = [\"team-b\"]\n\
         [scheduler]\nmin_run_time = \"1m\"\n\
         [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
         gpu_hour = { h100-sxm = \"1\" }\n\
         [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nquota = { max_gpus_per_job = 8 }\n\
         run_as = { user = \"root\" }\n\
         [[accounts]]\nid = \"team-b\"\nname = \"B\"\nweight = 1\nrun_as = { user = \"nobody\" }\n";

/// The service over `dir` (which team-b's jobs, run as `nobody`, may pass through).
fn open(dir: &std::path::Path, clock: Arc<ManualClock>) -> Arc<Service> {
    Arc::new(open_with(dir, cluster(), clock).unwrap())
}

fn open_with(
    dir: &std::path::Path,
    cluster: ClusterConfig,
    clock: Arc<ManualClock>,
) -> gpuledger_schedd::Result<Service> {
    open_on(dir, cluster, clock, ExecutorOptions::default())
}

fn open_on(
    dir: &std::path::Path,
    cluster: ClusterConfig,
    clock: Arc<ManualClock>,
    executor: ExecutorOptions,
) -> gpuledger_schedd::Result<Service> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = ServiceConfig {
        options: SchedulerOptions::parse("fairshare+backfill").unwrap(),
        dir: dir.join("scheduler"),
        billing_reservations: Some(dir.join("reservations.toml")),
        aggregator: None,
        aggregator_token: None,
        usage_every: Duration::from_secs(60),
        storage_scans: None,
        tls: Default::default(),
    };
    let executor = LocalExecutor::with_options(dir.join("scheduler/jobs"), executor).unwrap();
    Service::open(cluster, config, Box::new(executor), clock)
}

#[test]
fn a_scheduler_running_as_root_refuses_an_account_without_a_user_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let unmapped = CLUSTER.replace("run_as = { user = \"nobody\" }\n", "");
    let missing_user = CLUSTER.replace("user = \"nobody\"", "user = \"no-such-user-gl\"");
    for (toml, says) in [
        (unmapped, "set accounts[1].run_as = { user = \"...\" }"),
        (
            missing_user,
            "accounts[1].run_as: user `no-such-user-gl` does not exist",
        ),
    ] {
        let cluster = ClusterConfig::from_toml_str(&toml, "one.toml").unwrap();
        let s = open_with(dir.path(), cluster, Arc::new(ManualClock::new(T0_MS))).unwrap();
        let request = serde_json::from_value(
            json!({"command": "id -u", "account": "team-b", "gpus": 1, "time_limit": "1h"}),
        )
        .unwrap();
        let refused = s.submit(request).unwrap_err().to_string();
        assert!(refused.contains(says), "{refused}");
    }
}

async fn call(
    s: &Arc<Service>,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(match body {
            Some(b) => Body::from(b.to_string()),
            None => Body::empty(),
        })
        .unwrap();
    let resp = http::router(Arc::clone(s)).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

async fn submit(s: &Arc<Service>, body: Value) -> (StatusCode, Value) {
    call(s, "POST", "/api/v1/jobs", Some(body)).await
}

/// Ticks (advancing the clock a second each time) until `done` holds, for up to 20 s.
fn tick_until(s: &Service, clock: &ManualClock, mut done: impl FnMut(&Service) -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !done(s) {
        assert!(Instant::now() < until, "timed out");
        clock.advance_ms(1000);
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state(s: &Service, id: &JobId) -> JobState {
    s.job(id).unwrap().state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_get_preempted_with_grace_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));

    // Bad requests: a missing field is a 400 naming it; a job that can never run is a 422.
    let (status, body) = call(
        &s,
        "POST",
        "/api/v1/jobs",
        Some(json!({"command": "true", "account": "team-a", "time_limit": "1h"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "gpus", "{body}");
    let (status, body) = call(
        &s,
        "POST",
        "/api/v1/jobs",
        Some(json!({"command": "true", "account": "team-a", "gpus": 16, "time_limit": "1h"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_gpus_per_job"),
        "{body}"
    );

    // A long training job that checkpoints on SIGTERM.
    let train = "trap 'echo checkpoint; exit 0' TERM; echo gpus=$CUDA_VISIBLE_DEVICES; while :; do sleep 0.05; done";
    let (status, body) = call(&s, "POST", "/api/v1/jobs", Some(json!({"command": train, "account": "team-a", "gpus": 6, "time_limit": "10h", "grace": "30s"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let stdout = dir.path().join(format!("scheduler/jobs/{a}/stdout"));
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&stdout)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&stdout).unwrap(),
        "gpus=0,1,2,3,4,5\n"
    );
    let mapping =
        std::fs::read_to_string(dir.path().join("scheduler/job-mapping/gpu001/5")).unwrap();
    assert_eq!(
        mapping,
        format!("{a} team-a\n"),
        "the exporters' job mapping"
    );
    // Exporters read the mapping at every sample: while A runs, its files stay the same files
    // (never removed and written again) as other jobs start and end beside it.
    // A second name for A's file, outside the mapping: the same file has two links for as
    // long as nobody removes or replaces it.
    use std::os::unix::fs::MetadataExt;
    let a_file = dir.path().join("scheduler/job-mapping/gpu001/5");
    std::fs::hard_link(&a_file, dir.path().join("a-mapping")).unwrap();
    let links = |path: &std::path::Path| std::fs::metadata(path).unwrap().nlink();
    assert_eq!(links(&a_file), 2);
    let (_, body) = call(
        &s,
        "POST",
        "/api/v1/jobs",
        Some(json!({"command": "sleep 30", "account": "team-a", "gpus": 1, "time_limit": "1h"})),
    )
    .await;
    let small = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &small) == JobState::Running);
    let held = s.job(&small).unwrap().allocation.unwrap();
    let (node, gpu) = held.split_once(':').unwrap();
    let small_file = dir
        .path()
        .join(format!("scheduler/job-mapping/{node}/{gpu}"));
    assert_eq!(
        std::fs::read_to_string(&small_file).unwrap(),
        format!("{small} team-a\n")
    );
    call(
        &s,
        "DELETE",
        &format!("/api/v1/jobs/{small}?now=true"),
        None,
    )
    .await;
    tick_until(&s, &clock, |s| state(s, &small) == JobState::Cancelled);
    assert!(!small_file.exists(), "an ended job's GPU is no one's");
    assert_eq!(
        links(&a_file),
        2,
        "A's mapping file was replaced or removed"
    );
    assert_eq!(
        std::fs::read_to_string(&a_file).unwrap(),
        format!("{a} team-a\n")
    );

    // Ten minutes on, B's urgent 4 GPUs do not fit beside A: A is signalled, checkpoints,
    // exits and waits again; B runs.
    clock.advance_ms(600_000);
    let (_, body) = call(&s, "POST", "/api/v1/jobs", Some(json!({"command": "echo urgent=$CUDA_VISIBLE_DEVICES", "account": "team-b", "partition": "urgent", "gpus": 4, "time_limit": "1h"}))).await;
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);
    let a_info = s.job(&a).unwrap();
    assert_eq!(a_info.preemptions, 1);
    assert!(a_info.state == JobState::Pending || a_info.state == JobState::Running);
    assert!(
        std::fs::read_to_string(&stdout)
            .unwrap()
            .starts_with("gpus=0,1,2,3,4,5\ncheckpoint\n"),
        "A wrote its checkpoint on SIGTERM"
    );
    let b_out =
        std::fs::read_to_string(dir.path().join(format!("scheduler/jobs/{b}/stdout"))).unwrap();
    assert_eq!(b_out, "urgent=0,1,2,3\n");
    // A starts again once B is done.
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let (_, q) = call(&s, "GET", "/api/v1/queue", None).await;
    assert_eq!(q["jobs"][0]["id"], a.as_str(), "{q}");
    let (_, share) = call(&s, "GET", "/api/v1/share", None).await;
    assert_eq!(share["accounts"][0]["running_gpus"], 6, "{share}");
    let metrics = s.metrics();
    for line in [
        "gpuledger_scheduler_jobs{state=\"running\"} 1",
        "gpuledger_scheduler_gpus{state=\"allocated\"} 6",
        "gpuledger_scheduler_gpus{state=\"idle\"} 2",
        "gpuledger_scheduler_preemptions_total 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // Restart: the service comes back from its state file and adopts the running process.
    let pid = s.job(&a).unwrap().pid.unwrap();
    drop(s);
    let s = open(dir.path(), Arc::clone(&clock));
    assert_eq!(state(&s, &a), JobState::Running);
    assert_eq!(s.job(&a).unwrap().pid, Some(pid));
    let (_, alloc) = call(&s, "GET", "/api/v1/allocations", None).await;
    assert_eq!(alloc["gpus"].as_array().unwrap().len(), 6, "{alloc}");
    // Cancel: SIGTERM, it checkpoints and exits; cancelled.
    let (status, _) = call(&s, "DELETE", &format!("/api/v1/jobs/{a}"), None).await;
    assert_eq!(status, StatusCode::OK);
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Cancelled);
    assert_eq!(s.job(&a).unwrap().exit_code, Some(0));

    // A reservation is placed on named nodes and written for billing.
    let (status, body) = call(&s, "POST", "/api/v1/reservations", Some(json!({"name": "maint", "start": "2026-06-03T00:00:00Z", "end": "2026-06-04T00:00:00Z", "accounts": ["team-b"], "nodes": 1}))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["node_names"][0], "gpu001");
    let billing = std::fs::read_to_string(dir.path().join("reservations.toml")).unwrap();
    assert!(
        billing.contains("account = \"team-b\"") && billing.contains("gpus = 8"),
        "{billing}"
    );
    let (status, _) = call(&s, "POST", "/api/v1/reservations", Some(json!({"name": "again", "start": "2026-06-03T12:00:00Z", "end": "2026-06-05T00:00:00Z", "accounts": ["team-a"], "nodes": 1}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// Fair-share preemption with real processes: team-a holds the whole node with two 4-GPU jobs
/// that never reported a checkpoint and have run two hours; team-b's 4-GPU job, within its
/// half of the node, waits past `fair_share_preemption_after` and takes nothing (either of
/// team-a's jobs would lose more than `fair_share_preemption_max_loss`, an hour). Once one of
/// them reports a checkpoint through the API, that one is signalled and exits, and team-b's
/// job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_share_preemption_spares_a_job_that_would_lose_more_than_max_loss() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let cluster = cluster_with(
        "[scheduler]\nmin_run_time = \"1m\"\n",
        "[scheduler]\nmin_run_time = \"1m\"\nfair_share_preemption = true\n\
         fair_share_preemption_after = \"1m\"\n",
    );
    let s = Arc::new(open_with(dir.path(), cluster, Arc::clone(&clock)).unwrap());
    let train = "trap 'echo checkpoint; exit 0' TERM; while :; do sleep 0.05; done";
    let mut a = Vec::new();
    for _ in 0..2 {
        let job = json!({"command": train, "account": "team-a", "gpus": 4, "time_limit": "10h", "grace": "30s"});
        let (status, body) = submit(&s, job).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        a.push(JobId::new(body["job_id"].as_str().unwrap()).unwrap());
    }
    tick_until(&s, &clock, |s| {
        a.iter().all(|id| state(s, id) == JobState::Running)
    });
    clock.advance_ms(2 * 3_600_000);
    let job = json!({"command": "echo share=$CUDA_VISIBLE_DEVICES", "account": "team-b", "gpus": 4, "time_limit": "1h"});
    let (status, body) = submit(&s, job).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    for _ in 0..5 {
        clock.advance_ms(60_000);
        s.tick().unwrap();
    }
    for id in &a {
        assert_eq!(state(&s, id), JobState::Running, "{id} was taken");
        assert_eq!(s.job(id).unwrap().preemptions, 0);
    }
    assert_eq!(state(&s, &b), JobState::Pending);

    let saved = &a[1];
    let uri = format!("/api/v1/jobs/{saved}/checkpoint");
    let (status, body) = call(&s, "POST", &uri, Some(json!({}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);
    assert_eq!(s.job(saved).unwrap().preemptions, 1);
    assert_eq!(state(&s, &a[0]), JobState::Running);
    assert_eq!(s.job(&a[0]).unwrap().preemptions, 0);
    let out = |id: &JobId| {
        std::fs::read_to_string(dir.path().join(format!("scheduler/jobs/{id}/stdout"))).unwrap()
    };
    assert!(
        out(saved).starts_with("checkpoint\n"),
        "it saved on its signal"
    );
    assert!(out(&b).starts_with("share="), "{}", out(&b));
}

#[test]
fn the_newest_storage_scan_gives_account_totals_and_projects() {
    let text = "time,account,project,bytes,files\n\
                100,team-a,pretrain,5,1\n100,team-a,,7,1\n\
                200,team-a,pretrain,11,1\n200,team-a,eval,2,1\n200,team-b,,3,1\n";
    use gpuledger_model::storage_scan::{latest_scan, parse_scans};
    let lines = parse_scans(text, "scans.csv").unwrap();
    let mut rows: Vec<(String, Option<String>, u64)> = latest_scan(&lines)
        .into_iter()
        .map(|(a, p, b)| (a.to_string(), p.map(|p| p.to_string()), b))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        vec![
            ("team-a".into(), None, 13),
            ("team-a".into(), Some("eval".into()), 2),
            ("team-a".into(), Some("pretrain".into()), 11),
            ("team-b".into(), None, 3),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elastic_job_is_told_of_its_new_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    // Re-reads its allocation on SIGHUP, as an elastic launcher would.
    let elastic = "trap 'cat \"$GPULEDGER_ALLOCATION_FILE\"' HUP; cat \"$GPULEDGER_ALLOCATION_FILE\"; while :; do sleep 0.05; done";
    let (status, body) = call(&s, "POST", "/api/v1/jobs", Some(json!({"command": elastic, "account": "team-a", "gpus": 8, "min_gpus": 2, "time_limit": "10h"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let e = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &e) == JobState::Running);
    assert_eq!(s.job(&e).unwrap().allocation.as_deref(), Some("gpu001:0-7"));
    let stdout = dir.path().join(format!("scheduler/jobs/{e}/stdout"));
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&stdout)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < until, "the elastic job did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A job of the same tier takes back 4 GPUs: the elastic job shrinks and is told.
    let (_, body) = call(
        &s,
        "POST",
        "/api/v1/jobs",
        Some(json!({"command": "sleep 5", "account": "team-b", "gpus": 4, "time_limit": "1h"})),
    )
    .await;
    let other = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &other) == JobState::Running);
    assert_eq!(s.job(&e).unwrap().allocation.as_deref(), Some("gpu001:0-3"));
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&stdout).unwrap_or_default() != "gpu001:0-7\ngpu001:0-3\n" {
        assert!(
            Instant::now() < until,
            "{:?}",
            std::fs::read_to_string(&stdout)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..5 {
        clock.advance_ms(1000);
        s.tick().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        state(&s, &e),
        JobState::Running,
        "SIGHUP does not end the job"
    );
    s.cancel(&e).unwrap();
    s.cancel(&other).unwrap();
    tick_until(&s, &clock, |s| {
        state(s, &e).is_done() && state(s, &other).is_done()
    });
    assert_eq!(state(&s, &e), JobState::Cancelled);
}

/// A usage feed and an events sink held in memory, in place of the aggregator (shared with
/// the test through [`Shared`]).
#[derive(Debug, Default)]
struct FakeAggregator {
    feed: std::sync::Mutex<gpuledger_model::usage::UsageFeed>,
    posted: std::sync::Mutex<Vec<(u64, Vec<gpuledger_model::job::JobEvent>)>>,
    down: std::sync::atomic::AtomicBool,
    /// Stores what is posted but the answer never arrives (a timeout after the write).
    answers_lost: std::sync::atomic::AtomicBool,
    /// Refuses the next batch for good with this answer.
    refuse: std::sync::Mutex<Option<String>>,
}

#[derive(Debug)]
struct Shared(Arc<FakeAggregator>);

impl gpuledger_schedd::aggregator::AggregatorLink for Shared {
    fn usage(&self) -> Result<gpuledger_model::usage::UsageFeed, String> {
        if self.0.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("connection refused".into());
        }
        Ok(self.0.feed.lock().unwrap().clone())
    }
    fn post_events(
        &self,
        seq: u64,
        events: &[gpuledger_model::job::JobEvent],
    ) -> Result<(), PostError> {
        if self.0.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PostError::NotDelivered("connection refused".into()));
        }
        self.0.posted.lock().unwrap().push((seq, events.to_vec()));
        if self
            .0
            .answers_lost
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(PostError::NotDelivered(
                "timed out reading the answer".into(),
            ));
        }
        if let Some(answer) = self.0.refuse.lock().unwrap().take() {
            return Err(PostError::Refused {
                status: 422,
                answer,
            });
        }
        Ok(())
    }
}

/// The aggregator keeps the first copy of each batch number and drops later ones whole: a
/// batch whose answer was lost is sent again exactly as it was, also after a restart, and the
/// events that came meanwhile go in the next number, so none is dropped as a duplicate. A batch
/// refused for good does not hold back the ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_answer_was_lost_is_sent_again_unchanged_and_one_refused_for_good_is_set_aside(
) {
    use gpuledger_model::job::JobEventKind;
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let fake = Arc::new(FakeAggregator::default());
    fake.answers_lost
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let with_fake = |s: Service| Arc::new(s.with_aggregator(Box::new(Shared(Arc::clone(&fake)))));
    let s = with_fake(open_with(dir.path(), cluster(), Arc::clone(&clock)).unwrap());
    let job = json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h"});
    assert_eq!(submit(&s, job.clone()).await.0, StatusCode::CREATED);
    s.tick().unwrap();
    assert_eq!(submit(&s, job.clone()).await.0, StatusCode::CREATED);
    s.tick().unwrap();
    drop(s);
    let s = with_fake(open_with(dir.path(), cluster(), Arc::clone(&clock)).unwrap());
    s.tick().unwrap();
    fake.answers_lost
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tick_until(&s, &clock, |_| {
        fake.posted.lock().unwrap().iter().any(|(seq, _)| *seq == 1)
    });
    let posted = fake.posted.lock().unwrap().clone();
    let numbers: Vec<u64> = posted.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(numbers[..5], [0, 0, 0, 0, 1], "{posted:?}");
    assert!(
        posted[..4].iter().all(|(_, events)| events == &posted[0].1),
        "batch 0 sent again unchanged: {posted:?}"
    );
    // What the aggregator stored: the first copy of each number.
    let mut stored = BTreeMap::new();
    for (seq, events) in &posted {
        stored.entry(*seq).or_insert_with(|| events.clone());
    }
    let submitted: Vec<String> = stored
        .values()
        .flatten()
        .filter(|e| e.kind == JobEventKind::Submitted)
        .map(|e| e.job_id.to_string())
        .collect();
    assert_eq!(submitted, ["team-a.1", "team-a.2"], "{posted:?}");

    // A batch the aggregator refuses for good (its config lacks what the events name) is set
    // aside beside the state, and the events after it go out under the next number.
    let refused_seq = posted.last().unwrap().0 + 1;
    *fake.refuse.lock().unwrap() = Some(r#"{"errors": [{"row": 0, "field": "account"}]}"#.into());
    assert_eq!(submit(&s, job.clone()).await.0, StatusCode::CREATED);
    // Until the job's end goes out after its start was refused.
    tick_until(&s, &clock, |_| {
        fake.posted
            .lock()
            .unwrap()
            .iter()
            .any(|(seq, _)| *seq > refused_seq)
    });
    let aside = dir
        .path()
        .join(format!("scheduler/refused-events/{refused_seq}.json"));
    let text = std::fs::read_to_string(&aside).unwrap();
    let kept: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(kept["status"], 422, "{kept}");
    assert_eq!(kept["answer"]["errors"][0]["field"], "account", "{kept}");
    assert_eq!(kept["batch"]["seq"], refused_seq, "{kept}");
    assert_eq!(kept["batch"]["events"][0]["job_id"], "team-a.3", "{kept}");
    let posted = fake.posted.lock().unwrap().clone();
    let after: Vec<u64> = posted
        .iter()
        .map(|(seq, _)| *seq)
        .filter(|seq| *seq >= refused_seq)
        .collect();
    assert_eq!(after[..2], [refused_seq, refused_seq + 1], "{posted:?}");
    assert!(
        s.metrics()
            .contains("gpuledger_scheduler_event_batches_refused_total 1"),
        "{}",
        s.metrics()
    );
    // Cycles with nothing left to send: the last acknowledgement is on disk too (debug builds
    // compare what a restart would read with the state after every cycle).
    for _ in 0..3 {
        clock.advance_ms(1000);
        s.tick().unwrap();
    }
    drop(s);
    let s = with_fake(open_with(dir.path(), cluster(), Arc::clone(&clock)).unwrap());
    let sent_before = fake.posted.lock().unwrap().len();
    s.tick().unwrap();
    assert_eq!(
        fake.posted.lock().unwrap().len(),
        sent_before,
        "every batch was acknowledged before the restart: none is sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_share_follows_the_usage_feed_and_events_go_out_once_it_is_back() {
    use gpuledger_model::usage::AccountUsage;
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let fake = Arc::new(FakeAggregator::default());
    fake.feed.lock().unwrap().accounts.insert(
        "team-a".into(),
        AccountUsage {
            decayed_gpu_hours: 500.0,
            ..AccountUsage::default()
        },
    );
    fake.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let s = Arc::try_unwrap(open(dir.path(), Arc::clone(&clock))).unwrap();
    let s = Arc::new(s.with_aggregator(Box::new(Shared(Arc::clone(&fake)))));
    let (status, body) = call(
        &s,
        "POST",
        "/api/v1/jobs",
        Some(json!({"command": "sleep 0.2", "account": "team-b", "gpus": 1, "time_limit": "1h"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    s.tick().unwrap();
    // The feed is away: no figures yet, and the submission's events wait in the outbox.
    let share = |s: &Service, a: &str| s.share().into_iter().find(|r| r.account == a).unwrap();
    assert_eq!(share(&s, "team-a").decayed_gpu_hours, 0.0);
    assert!(fake.posted.lock().unwrap().is_empty());

    fake.down.store(false, std::sync::atomic::Ordering::SeqCst);
    clock.advance_ms(61_000);
    s.tick().unwrap();
    let (a, b) = (share(&s, "team-a"), share(&s, "team-b"));
    assert!((a.decayed_gpu_hours - 500.0).abs() < 1e-6, "{a:?}");
    assert!(
        a.fair_share < b.fair_share,
        "the heavy user ranks lower: {a:?} {b:?}"
    );
    let posted = fake.posted.lock().unwrap().clone();
    let kinds: Vec<_> = posted
        .iter()
        .flat_map(|(_, e)| e.iter().map(|e| e.kind))
        .collect();
    assert!(
        kinds.contains(&gpuledger_model::job::JobEventKind::Submitted),
        "{posted:?}"
    );
    let seqs: Vec<u64> = posted.iter().map(|(seq, _)| *seq).collect();
    let mut sorted = seqs.clone();
    sorted.dedup();
    assert_eq!(seqs, sorted, "each batch once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_is_bounded_and_a_later_stop_never_puts_sigkill_off() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    // A partition the account may not use, and a grace past the partition's max_grace.
    let (status, body) = submit(&s, json!({"command": "true", "account": "team-a", "partition": "urgent", "gpus": 1, "time_limit": "1h"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body.to_string()
            .contains("may not submit to partition `urgent`"),
        "{body}"
    );
    let (status, body) = submit(&s, json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h", "grace": "1d"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("max_grace"), "{body}");
    // A job's own variables may not be gpuledger's, nor malformed.
    for (name, says) in [
        ("GPULEDGER_JOB_ID", "gpuledger sets this one itself"),
        ("CUDA_VISIBLE_DEVICES", "gpuledger sets this one itself"),
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "gpuledger sets this one itself",
        ),
        ("1X", "a name is letters"),
        ("A=B", "a name is letters"),
    ] {
        let (status, body) = submit(&s, json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h", "env": {name: "x"}})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["field"], format!("env.{name}"), "{body}");
        assert!(body.to_string().contains(says), "{body}");
    }

    // A job that ignores SIGTERM, with the longest grace allowed and a 5-minute limit.
    let stubborn = "trap '' TERM; while :; do sleep 0.05; done";
    let (_, body) = submit(&s, json!({"command": stubborn, "account": "team-a", "gpus": 8, "time_limit": "5m", "grace": "10m"})).await;
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let start_s = s.job(&a).unwrap().start_s.unwrap();
    // Two minutes on, team-b's urgent job preempts it: SIGKILL ten minutes after SIGTERM.
    clock.advance_ms(120_000);
    let (_, body) = submit(&s, json!({"command": "true", "account": "team-b", "partition": "urgent", "gpus": 4, "time_limit": "1h"})).await;
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Preempting);
    let info = s.job(&a).unwrap();
    assert_eq!(info.kill_s.unwrap() - info.signal_s.unwrap(), 600);
    // Its time limit comes first and brings SIGKILL forward to 30 s after it.
    let limit_end = start_s + 5 * 60;
    clock.advance_ms((limit_end - clock.now_ms() / 1000 - 1) * 1000);
    tick_until(&s, &clock, |s| {
        s.job(&a).unwrap().stopping == Some(JobState::Timeout)
    });
    let kill_before = s.job(&a).unwrap().kill_s.unwrap();
    assert!(
        kill_before <= limit_end + 31,
        "kill at {kill_before}, limit {limit_end}"
    );
    // An operator's cancel does not put it off again.
    let (status, body) = call(&s, "DELETE", &format!("/api/v1/jobs/{a}"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kill_s"].as_i64().unwrap(), kill_before, "{body}");
    tick_until(&s, &clock, |s| {
        matches!(
            state(s, &a),
            JobState::Timeout | JobState::Cancelled | JobState::Failed
        )
    });
    let ended = s.job(&a).unwrap();
    assert_eq!(
        ended.state,
        JobState::Timeout,
        "the first reason it was stopped for"
    );
    assert_eq!(ended.exit_code, Some(137));
    assert!(ended.end_s.unwrap() <= kill_before + 3, "{ended:?}");
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);

    // `cancel --now`: SIGKILL at once, whatever the grace.
    let (_, body) = submit(&s, json!({"command": stubborn, "account": "team-a", "gpus": 2, "time_limit": "1h", "grace": "10m"})).await;
    let c = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &c) == JobState::Running);
    let (status, body) = call(&s, "DELETE", &format!("/api/v1/jobs/{c}?now=true"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let asked_s = clock.now_ms() / 1000;
    tick_until(&s, &clock, |s| state(s, &c) == JobState::Cancelled);
    let ended = s.job(&c).unwrap();
    assert_eq!(ended.exit_code, Some(137));
    assert!(ended.end_s.unwrap() <= asked_s + 2, "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_as_its_accounts_user_and_reaches_nothing_of_the_service_or_other_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    // team-a's job (run as root, on purpose here) runs on; team-b's jobs run as `nobody`.
    let (_, body) = submit(&s, json!({"command": "echo $$ > pid; while :; do sleep 0.05; done", "account": "team-a", "gpus": 1, "time_limit": "1h"})).await;
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let a_dir = dir.path().join(format!("scheduler/jobs/{a}"));
    let until = Instant::now() + Duration::from_secs(10);
    let victim = loop {
        if let Some(pid) = std::fs::read_to_string(a_dir.join("pid"))
            .ok()
            .filter(|t| t.ends_with('\n'))
        {
            break pid.trim().to_owned();
        }
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(20));
    };
    // The token file as `gpuledger token` writes it, beside the data.
    let mut tokens = gpuledger_auth::TokenFile::default();
    tokens
        .issue(
            gpuledger_auth::Role::Operator,
            "ops",
            None,
            None,
            chrono::Utc::now(),
        )
        .unwrap();
    tokens.save(&dir.path().join("tokens.toml")).unwrap();
    let snoop = "id -u; \
        cat ../../../tokens.toml >/dev/null 2>&1 && echo READ-TOKENS; \
        cat ../../state.json >/dev/null 2>&1 && echo READ-STATE; \
        cat ../../journal.jsonl >/dev/null 2>&1 && echo READ-JOURNAL; \
        ls ../team-a.1 >/dev/null 2>&1 && echo READ-OTHER-JOB; \
        kill -9 \"$VICTIM\" 2>/dev/null && echo KILLED-OTHER-JOB; \
        touch ../../planted 2>/dev/null && echo WROTE-STATE-DIR; \
        echo done";
    let (status, body) = submit(&s, json!({"command": snoop, "account": "team-b", "gpus": 1, "time_limit": "1h", "env": {"VICTIM": victim}})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);
    let out =
        std::fs::read_to_string(dir.path().join(format!("scheduler/jobs/{b}/stdout"))).unwrap();
    assert_eq!(out, "65534\ndone\n", "what team-b's job reached");
    assert_eq!(
        state(&s, &a),
        JobState::Running,
        "team-a's job is untouched"
    );
    assert!(!dir.path().join("scheduler/planted").exists());
    use std::os::unix::fs::MetadataExt;
    let b_dir = std::fs::metadata(dir.path().join(format!("scheduler/jobs/{b}"))).unwrap();
    assert_eq!((b_dir.uid(), b_dir.mode() & 0o777), (65534, 0o700));
    for file in ["state.json", "journal.jsonl"] {
        let meta = std::fs::metadata(dir.path().join("scheduler").join(file)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "{file}");
    }
    let (_, body) = call(&s, "DELETE", &format!("/api/v1/jobs/{a}?now=true"), None).await;
    assert_eq!(body["state"], "running", "{body}");
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_processes_outlive_sigkill_keeps_its_gpus_and_its_node_is_drained() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let executor = ExecutorOptions {
        unkillable_after: Duration::from_secs(1),
        ..ExecutorOptions::default()
    };
    let s = Arc::new(open_on(dir.path(), cluster(), Arc::clone(&clock), executor).unwrap());
    let (_, body) = submit(&s, json!({"command": "sleep 1000 & echo $! > sleeper; wait", "account": "team-a", "gpus": 8, "time_limit": "1h"})).await;
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let a_dir = dir.path().join(format!("scheduler/jobs/{a}"));
    let until = Instant::now() + Duration::from_secs(10);
    let sleeper = loop {
        if let Some(pid) = std::fs::read_to_string(a_dir.join("sleeper"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(20));
    };
    // The process is stuck in the kernel (frozen by the v1 freezer, in the test's own cgroup):
    // SIGKILL reaches it only when it comes back.
    let freezer = std::path::PathBuf::from("/sys/fs/cgroup/freezer")
        .join(format!("gpuledger-service-test-{}", std::process::id()));
    std::fs::create_dir_all(&freezer).unwrap();
    std::fs::write(freezer.join("cgroup.procs"), sleeper.to_string()).unwrap();
    std::fs::write(freezer.join("freezer.state"), "FROZEN").unwrap();
    let (status, body) = call(&s, "DELETE", &format!("/api/v1/jobs/{a}?now=true"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = submit(
        &s,
        json!({"command": "true", "account": "team-b", "gpus": 1, "time_limit": "1h"}),
    )
    .await;
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| s.nodes()[0].state == "draining");
    let node = s.nodes()[0].clone();
    assert_eq!(node.by.as_deref(), Some("gpuledger"));
    assert_eq!(
        node.reason.as_deref(),
        Some(format!("job {a}: processes outlived SIGKILL (1 left)").as_str())
    );
    // The job keeps its GPUs, in the allocation feed too, until its process is gone.
    assert_eq!(state(&s, &a), JobState::Running);
    assert!(s.job(&a).unwrap().unkillable_s.is_some());
    assert_eq!(s.allocations().len(), 8);
    let metrics = s.metrics();
    assert!(
        metrics.contains("gpuledger_scheduler_unkillable_jobs 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "gpuledger_scheduler_node_drained{{node=\"{}\",by_scheduler=\"true\"}} 1",
            node.node
        )),
        "{metrics}"
    );
    // Back from the kernel it dies: the job ends cancelled, killed; the node stays drained
    // and takes no job until an operator resumes it.
    std::fs::write(freezer.join("freezer.state"), "THAWED").unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Cancelled);
    // The job's shell dies of the cancel's SIGTERM (143) or, had it not yet, of the SIGKILL
    // after the grace (137): which one is a race this test does not set up; killed it is.
    let exit = s.job(&a).unwrap().exit_code;
    assert!(matches!(exit, Some(137 | 143)), "{exit:?}");
    std::fs::remove_dir(&freezer).unwrap();
    for _ in 0..3 {
        clock.advance_ms(1000);
        s.tick().unwrap();
    }
    assert_eq!(state(&s, &b), JobState::Pending);
    assert_eq!(s.nodes()[0].state, "drained");
    assert!(s
        .metrics()
        .contains("gpuledger_scheduler_gpus{state=\"drained\"} 8"));
    // It stays drained across a restart.
    drop(s);
    let s = open(dir.path(), Arc::clone(&clock));
    s.tick().unwrap();
    assert_eq!(state(&s, &b), JobState::Pending);
    let (status, body) = call(&s, "GET", "/api/v1/nodes", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["nodes"][0]["state"], "drained", "{body}");
    let path = format!("/api/v1/nodes/{}/resume", node.node);
    let (status, body) = call(&s, "POST", &path, None).await;
    assert_eq!(
        (status, &body["was_drained"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_memory_limit_ends_failed_out_of_memory_and_the_others_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let executor = ExecutorOptions {
        limits: gpuledger_schedd::cgroup::JobLimits {
            memory_per_gpu: Some("48MiB".parse().unwrap()),
            ..Default::default()
        },
        ..ExecutorOptions::default()
    };
    let fake = Arc::new(FakeAggregator::default());
    let s = open_on(dir.path(), cluster(), Arc::clone(&clock), executor).unwrap();
    let s = Arc::new(s.with_aggregator(Box::new(Shared(Arc::clone(&fake)))));
    // 200 MB held at once by one process, then a line: the job's shell outlives the kill.
    let hog = "head -c 200000000 /dev/zero | tail -c 200000000 >/dev/null; echo after";
    let mut ids = Vec::new();
    for (account, command) in [
        ("team-a", hog),
        (
            "team-b",
            "head -c 20000000 /dev/zero | tail -c 20000000 >/dev/null",
        ),
    ] {
        let (status, body) = submit(
            &s,
            json!({"command": command, "account": account, "gpus": 1, "time_limit": "1h"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(JobId::new(body["job_id"].as_str().unwrap()).unwrap());
    }
    tick_until(&s, &clock, |s| ids.iter().all(|id| state(s, id).is_done()));
    let (_, hog) = call(&s, "GET", &format!("/api/v1/jobs/{}", ids[0]), None).await;
    assert_eq!(hog["state"], "failed", "{hog}");
    assert_eq!(
        hog["reason"],
        "out of memory: the kernel killed 1 process of the job at its memory limit of 48MiB (--job-memory-per-gpu times its GPUs)",
        "{hog}"
    );
    assert_eq!(
        state(&s, &ids[1]),
        JobState::Completed,
        "20 MB fit in 48 MiB"
    );
    // Its peak memory, at the limit, for its owner to size the next run by.
    let peak = hog["peak_memory_bytes"].as_u64().unwrap();
    assert!(((40 << 20)..=(48 << 20)).contains(&peak), "{hog}");
    assert!(hog["cpu_time_ms"].as_u64().is_some(), "{hog}");
    let metrics = s.metrics();
    assert!(
        metrics.contains("gpuledger_scheduler_jobs_out_of_memory_total 1\n"),
        "{metrics}"
    );
    // The aggregator is told how each ended: out of memory, as Slurm's OUT_OF_MEMORY.
    use gpuledger_model::job::{JobEventKind, Outcome};
    let outcome = |id: &JobId| {
        let posted = fake.posted.lock().unwrap().clone();
        posted
            .iter()
            .flat_map(|(_, events)| events.iter())
            .find(|e| &e.job_id == id && e.kind == JobEventKind::Finished)
            .and_then(|e| e.outcome)
    };
    tick_until(&s, &clock, |_| outcome(&ids[1]).is_some());
    assert_eq!(outcome(&ids[0]), Some(Outcome::OutOfMemory));
    assert_eq!(outcome(&ids[1]), Some(Outcome::Completed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_gpus_held_for_a_waiting_jobs_planned_start_show_as_planned() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    let job = |gpus: u32, command: &str| json!({"command": command, "account": "team-a", "gpus": gpus, "time_limit": "1h"});
    let (_, body) = submit(&s, job(6, "sleep 600")).await;
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Running);
    let gpus = |s: &Service, state: &str| {
        let metrics = s.metrics();
        let prefix = format!("gpuledger_scheduler_gpus{{state=\"{state}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&prefix));
        line.and_then(|l| l[prefix.len()..].parse::<u32>().ok())
    };
    assert_eq!((gpus(&s, "idle"), gpus(&s, "planned")), (Some(2), Some(0)));
    // The whole node when A's hour is up: its two free GPUs are kept for B meanwhile.
    let (_, body) = submit(&s, job(8, "true")).await;
    let b = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| s.nodes()[0].planned_gpus == 2);
    assert_eq!(state(&s, &b), JobState::Pending);
    assert_eq!(
        (gpus(&s, "allocated"), gpus(&s, "idle"), gpus(&s, "planned")),
        (Some(6), Some(0), Some(2))
    );
    let (status, body) = call(&s, "GET", "/api/v1/nodes", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["nodes"][0]["state"],
            &body["nodes"][0]["planned_gpus"]
        ),
        (&json!("mixed"), &json!(2)),
        "{body}"
    );
    // A ends: B starts and nothing is held.
    let (status, _) = call(&s, "DELETE", &format!("/api/v1/jobs/{a}?now=true"), None).await;
    assert_eq!(status, StatusCode::OK);
    tick_until(&s, &clock, |s| state(s, &b) == JobState::Completed);
    assert_eq!((gpus(&s, "idle"), gpus(&s, "planned")), (Some(8), Some(0)));
    assert_eq!(s.nodes()[0].state, "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drains_a_node_with_a_reason_and_bad_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    let node = s.nodes()[0].node.clone();
    let drain = |node: &str| format!("/api/v1/nodes/{node}/drain");
    for (path, body, status, field) in [
        (
            drain("gpu999"),
            json!({"reason": "x"}),
            StatusCode::NOT_FOUND,
            "node",
        ),
        (
            drain(&node),
            json!({"reason": " "}),
            StatusCode::BAD_REQUEST,
            "reason",
        ),
        (
            drain(&node),
            json!({"reason": "a\u{1b}[31m"}),
            StatusCode::BAD_REQUEST,
            "reason",
        ),
        (
            drain(&node),
            json!({"reason": "x".repeat(257)}),
            StatusCode::BAD_REQUEST,
            "reason",
        ),
        (
            drain(&node),
            json!({"reason": "x", "by": "me"}),
            StatusCode::BAD_REQUEST,
            "by",
        ),
    ] {
        let (got, reply) = call(&s, "POST", &path, Some(body)).await;
        assert_eq!(got, status, "{path}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{reply}");
    }
    assert_eq!(s.nodes()[0].state, "idle");
    let (status, body) = call(
        &s,
        "POST",
        &drain(&node),
        Some(json!({"reason": "GPU 3 XID 79"})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, body) = submit(
        &s,
        json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h"}),
    )
    .await;
    let a = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
    for _ in 0..3 {
        clock.advance_ms(1000);
        s.tick().unwrap();
    }
    assert_eq!(state(&s, &a), JobState::Pending);
    let row = s.nodes()[0].clone();
    assert_eq!(
        (row.state.as_str(), row.reason.as_deref(), row.by.as_deref()),
        ("drained", Some("GPU 3 XID 79"), Some("operator"))
    );
    let path = format!("/api/v1/nodes/{node}/resume");
    let (_, body) = call(&s, "POST", &path, None).await;
    assert_eq!(body["was_drained"], true, "{body}");
    tick_until(&s, &clock, |s| state(s, &a) == JobState::Completed);
    let (_, body) = call(&s, "POST", &path, None).await;
    assert_eq!(body["was_drained"], false, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projects_own_user_runs_its_jobs_and_the_accounts_runs_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let with_projects = CLUSTER.replace(
        "run_as = { user = \"nobody\" }\n",
        "run_as = { user = \"nobody\" }\nprojects = [{ id = \"vision\", run_as = { user = \"daemon\" } }, { id = \"nlp\" }, { id = \"ghost\", run_as = { user = \"no-such-user-gl\" } }]\n",
    );
    let cluster = ClusterConfig::from_toml_str(&with_projects, "one.toml").unwrap();
    let s = Arc::new(open_with(dir.path(), cluster, Arc::clone(&clock)).unwrap());
    let mut ids = Vec::new();
    for project in ["vision", "nlp"] {
        let (status, body) = submit(&s, json!({"command": "id -u", "account": "team-b", "project": project, "gpus": 1, "time_limit": "1h"})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(JobId::new(body["job_id"].as_str().unwrap()).unwrap());
    }
    tick_until(&s, &clock, |s| {
        ids.iter().all(|id| state(s, id) == JobState::Completed)
    });
    let uid_of = |id: &JobId| {
        std::fs::read_to_string(dir.path().join(format!("scheduler/jobs/{id}/stdout"))).unwrap()
    };
    assert_eq!(uid_of(&ids[0]), "1\n", "vision runs as daemon");
    assert_eq!(
        uid_of(&ids[1]),
        "65534\n",
        "nlp runs as its account's nobody"
    );
    let (status, body) = submit(&s, json!({"command": "id -u", "account": "team-b", "project": "ghost", "gpus": 1, "time_limit": "1h"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.to_string()
            .contains("accounts[1].projects[2].run_as: user `no-such-user-gl` does not exist"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_asks_for_gpus_per_node_a_node_count_and_a_gpu_model() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    let job = |extra: Value| {
        let mut body = json!({"command": "sleep 30", "account": "team-a", "time_limit": "1h"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    // The one node has 8 H100: no H200, and never two nodes.
    for (extra, says) in [
        (json!({"gpus": 2, "gpu_models": ["h200"]}), "h200"),
        (json!({"gpus": 2, "gpu_types": ["b300"]}), "b300"),
        (json!({"gpus": 4, "gpus_per_node": 2}), "2 GPUs per node"),
        (json!({"gpus": 4, "min_gpus": 2, "nodes": 1}), "elastic"),
    ] {
        let (status, reply) = submit(&s, job(extra.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{extra}: {reply}");
        assert!(
            reply["error"]["message"].as_str().unwrap().contains(says),
            "{reply}"
        );
    }
    // Not a type at all: refused as a malformed request.
    let (status, reply) = submit(&s, job(json!({"gpus": 2, "gpu_types": ["b 300"]}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    // As asked: 2 GPUs on one node, of an H100.
    let (status, reply) = submit(
        &s,
        job(json!({"gpus": 2, "gpus_per_node": 2, "nodes": 1, "gpu_types": ["h100"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let id = JobId::new(reply["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &id) == JobState::Running);
    let rows = s.allocations();
    assert_eq!(rows.iter().filter(|r| r.job_id == id.as_str()).count(), 2);
}

/// Reservations billing would charge wrongly are refused naming the field: a node or an
/// account named twice (the node's unused GPU-hours charged twice), a count and names
/// together (the count was dropped), a window already over or started before now (charged for
/// hours nothing was held), a name that is no identifier. On nodes of two GPU models, billing
/// gets one entry per model, each with its own GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_that_would_bill_wrongly_are_refused_and_each_model_is_billed_as_itself() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let two_models = CLUSTER
        .replacen(
            "[[partitions]]",
            "[[node_pools]]\nname = \"q\"\nprefix = \"big\"\ncount = 1\ngpus_per_node = 4\n\
             gpu_model = \"h200\"\n[[partitions]]",
            1,
        )
        .replace("h100-sxm = \"1\"", "h100-sxm = \"1\", h200 = \"2\"");
    let two_models_toml = two_models;
    let two_models = ClusterConfig::from_toml_str(&two_models_toml, "two.toml").unwrap();
    let s = Arc::new(open_with(dir.path(), two_models, Arc::clone(&clock)).unwrap());
    let reservation = |extra: Value| {
        let mut body = json!({"name": "r", "start": "2026-06-02T00:00:00Z", "end": "2026-06-03T00:00:00Z", "accounts": ["team-a"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let bad = StatusCode::BAD_REQUEST;
    let never = StatusCode::UNPROCESSABLE_ENTITY;
    for (extra, status, field, says) in [
        (
            json!({"node_names": ["gpu001", "gpu001"]}),
            never,
            "node_names",
            "`gpu001` is named twice",
        ),
        (
            json!({"accounts": ["team-a", "team-a"], "nodes": 1}),
            never,
            "accounts",
            "`team-a` is named twice",
        ),
        (
            json!({"nodes": 1, "node_names": ["big001"]}),
            never,
            "nodes",
            "not both",
        ),
        (
            json!({"name": "<b>r</b>", "nodes": 1}),
            never,
            "name",
            "letters, digits",
        ),
        (
            json!({"name": "r".repeat(65), "nodes": 1}),
            never,
            "name",
            "1 to 64",
        ),
        (
            json!({"name": "r".repeat(100_000), "nodes": 1}),
            never,
            "name",
            "rrr...",
        ),
        (
            json!({"start": "2026-05-01T00:00:00Z", "end": "2026-05-02T00:00:00Z", "node_names": ["big001"]}),
            bad,
            "end",
            "not after now",
        ),
        (
            json!({"start": "2026-05-31T00:00:00Z", "node_names": ["big001"]}),
            bad,
            "start",
            "in the past",
        ),
        (
            json!({"node_names": ["gpu009"]}),
            never,
            "node_names",
            "does not exist",
        ),
        (json!({"nodes": 3}), never, "nodes", "3 nodes asked"),
    ] {
        let (got, reply) = call(
            &s,
            "POST",
            "/api/v1/reservations",
            Some(reservation(extra.clone())),
        )
        .await;
        assert_eq!(got, status, "{extra}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{extra}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{extra}: {message}");
        assert!(
            message.len() < 200,
            "a refusal does not repeat the request: {message}"
        );
    }
    assert!(s.reservations().is_empty());
    // Both nodes, an H100 node of 8 and an H200 node of 4: two entries for billing.
    let (got, reply) = call(
        &s,
        "POST",
        "/api/v1/reservations",
        Some(reservation(json!({"node_names": ["big001", "gpu001"]}))),
    )
    .await;
    assert_eq!(got, StatusCode::CREATED, "{reply}");
    let text = std::fs::read_to_string(dir.path().join("reservations.toml")).unwrap();
    let billed =
        gpuledger_model::billed_reservations::BilledReservations::from_toml_str(&text, "r")
            .unwrap()
            .reservations;
    let entries: Vec<(String, u32, Vec<String>)> = billed
        .iter()
        .map(|r| {
            (
                r.gpu_model.to_string(),
                r.gpus,
                r.nodes.iter().map(|n| n.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("h100-sxm".to_owned(), 8, vec!["gpu001".to_owned()]),
            ("h200".to_owned(), 4, vec!["big001".to_owned()]),
        ],
        "{text}"
    );
    assert!(billed
        .iter()
        .all(|r| r.id == "r" && r.account.as_str() == "team-a"));
    // A stored reservation that a rule now refuses stops a restart, naming it and the file.
    s.tick().unwrap();
    drop(s);
    let path = dir.path().join("scheduler/state.json");
    let mut stored: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    stored["reservations"][0]["name"] = json!("r r");
    std::fs::write(&path, stored.to_string()).unwrap();
    let two_models = ClusterConfig::from_toml_str(&two_models_toml, "two.toml").unwrap();
    let err = open_with(dir.path(), two_models, clock)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("state.json") && err.contains("reservation `r r`"),
        "{err}"
    );
}

/// Submissions that could never run as asked (a command `sh -c` cannot take, a zero limit,
/// a shape of zero nodes) were queued and then failed at launch with nothing but a log line,
/// or waited for ever. Each is refused naming its field, and none takes a job number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_that_could_never_run_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    let job = |extra: Value| {
        let mut body =
            json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let too_long = format!("echo {}", "x".repeat(200_000));
    let bad = StatusCode::BAD_REQUEST;
    let never = StatusCode::UNPROCESSABLE_ENTITY;
    for (extra, status, field, says) in [
        (json!({"command": "echo a\u{0}b"}), bad, "command", "NUL"),
        (
            json!({"command": "  \n"}),
            bad,
            "command",
            "must not be empty",
        ),
        (
            json!({"command": too_long}),
            bad,
            "command",
            "at most 65536",
        ),
        (
            json!({"time_limit": "0s"}),
            bad,
            "time_limit",
            "at least 1s",
        ),
        (
            json!({"checkpoint_every": "0s"}),
            bad,
            "checkpoint_every",
            "at least 1s",
        ),
        (json!({"gpus": 8, "nodes": 0}), never, "nodes", "at least 1"),
        (
            json!({"gpus": 8, "gpus_per_node": 0}),
            never,
            "gpus_per_node",
            "at least 1",
        ),
        (json!({"gpus": 0}), never, "gpus", "at least 1 GPU"),
        (json!({"gpus": 9}), never, "gpus", "at most 8"),
        (
            json!({"gpus": 2, "min_gpus": 3}),
            never,
            "min_gpus",
            "between 1 and gpus 2",
        ),
        (json!({"gpu_types": ["h200"]}), never, "gpu_types", "h200"),
        (
            json!({"gpus": 4, "gpus_per_node": 2}),
            never,
            "gpus_per_node",
            "2 GPUs per node",
        ),
        (
            json!({"partition": "urgent"}),
            never,
            "partition",
            "may not submit",
        ),
        (
            json!({"project": "nope"}),
            never,
            "project",
            "does not exist",
        ),
        (
            json!({"account": "team-z"}),
            never,
            "account",
            "`team-z` does not exist",
        ),
        (
            json!({"time_limit": "1h", "grace": "1d"}),
            never,
            "grace",
            "max_grace",
        ),
    ] {
        let (got, reply) = submit(&s, job(extra.clone())).await;
        let shown = &extra.to_string()[..extra.to_string().len().min(80)];
        assert_eq!(got, status, "{shown}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{shown}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{shown}: {message}");
    }
    // A shape of several fields that never fits names none of them alone.
    let (got, reply) = submit(
        &s,
        job(json!({"gpus": 4, "gpus_per_node": 2, "gpu_types": ["h200"]})),
    )
    .await;
    assert_eq!(got, never, "{reply}");
    assert!(reply["error"]["field"].is_null(), "{reply}");
    assert!(s.queue().is_empty());
    // Nothing refused was kept: the next job is the account's first, and it runs.
    let (got, reply) = submit(&s, job(json!({}))).await;
    assert_eq!(got, StatusCode::CREATED, "{reply}");
    assert_eq!(reply["job_id"], "team-a.1");
    // A bad query parameter is answered in the same JSON, naming it.
    for (uri, field) in [
        ("/api/v1/jobs/team-a.1?now=maybe", "now"),
        ("/api/v1/jobs/team-a.1?soon=true", "soon"),
    ] {
        let (got, reply) = call(&s, "DELETE", uri, None).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{uri}: {reply}");
        assert_eq!(reply["error"]["field"], field, "{uri}: {reply}");
    }
    assert_eq!(
        state(&s, &JobId::new("team-a.1").unwrap()),
        JobState::Pending
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_asking_for_parts_of_a_gpu_share_one_gpu_and_keep_it_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let s = open(dir.path(), Arc::clone(&clock));
    let job = |gpus: u32, share: &str| {
        json!({"command": "sleep 30", "account": "team-a", "time_limit": "1h",
               "gpus": gpus, "gpu_share": share})
    };
    // Not a share gpuledger knows: a 400 naming the field; a share of two GPUs: a 422.
    let (status, reply) = submit(&s, job(1, "1200m")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(reply["error"]["field"], "gpu_share", "{reply}");
    let (status, reply) = submit(&s, job(2, "250m")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("part of one GPU"),
        "{reply}"
    );
    let mut ids = Vec::new();
    for share in ["500m", "500m", "3g"] {
        let (status, reply) = submit(&s, job(1, share)).await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        ids.push(JobId::new(reply["job_id"].as_str().unwrap()).unwrap());
    }
    tick_until(&s, &clock, |s| {
        ids.iter().all(|id| state(s, id) == JobState::Running)
    });
    let gpus_of = |s: &Service| -> Vec<(u32, Option<String>)> {
        let mut rows: Vec<(u32, Option<String>)> = s
            .allocations()
            .iter()
            .map(|r| (r.gpu, r.share.map(|x| x.to_string())))
            .collect();
        rows.sort();
        rows
    };
    let rows = gpus_of(&s);
    // The two halves on one GPU, the MIG slice on another (a GPU is time-sliced or cut into
    // MIG instances, not both).
    assert_eq!(rows.len(), 3, "{rows:?}");
    let halves: Vec<u32> = rows
        .iter()
        .filter(|r| r.1.as_deref() == Some("500m"))
        .map(|r| r.0)
        .collect();
    assert_eq!(halves.len(), 2);
    assert_eq!(halves[0], halves[1], "{rows:?}");
    assert!(rows
        .iter()
        .any(|r| r.1.as_deref() == Some("3g") && r.0 != halves[0]));
    // The state file keeps each part; a restart reads them back onto the same GPUs.
    drop(s);
    let s = open(dir.path(), Arc::clone(&clock));
    s.tick().unwrap();
    assert_eq!(gpus_of(&s), rows);
    assert!(ids.iter().all(|id| state(&s, id) == JobState::Running));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn how_long_a_job_waited_for_gpus_survives_a_restart_and_a_quota_hold_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = cluster_with(
        "quota = { max_gpus_per_job = 8 }",
        "quota = { max_gpus_per_job = 8, max_running_jobs = 1 }",
    );
    let s = Arc::new(open_with(dir.path(), config.clone(), Arc::clone(&clock)).unwrap());
    let job = |account: &str, gpus: u32| json!({"command": "sleep 600", "account": account, "gpus": gpus, "time_limit": "10h"});
    let id = |reply: Value| JobId::new(reply["job_id"].as_str().unwrap()).unwrap();
    let other = id(submit(&s, job("team-b", 1)).await.1);
    let first = id(submit(&s, job("team-a", 1)).await.1);
    tick_until(&s, &clock, |s| {
        state(s, &other) == JobState::Running && state(s, &first) == JobState::Running
    });
    // team-a's node-wide job waits for its quota (one running job) first: that is no wait
    // for GPUs.
    let wide = id(submit(&s, job("team-a", 8)).await.1);
    clock.advance_ms(60_000);
    s.tick().unwrap();
    let wide_now = |s: &Service| {
        let w = s.job(&wide).unwrap();
        (w.reason.clone().unwrap_or_default(), w.gpu_wait_from_s)
    };
    assert_eq!(wide_now(&s), ("AssocMaxJobsLimit".to_owned(), None));
    // team-a's first job ends: now it waits for team-b's GPU, from that cycle on.
    let (status, _) = call(&s, "DELETE", &format!("/api/v1/jobs/{first}"), None).await;
    assert_eq!(status, StatusCode::OK);
    tick_until(&s, &clock, |s| state(s, &first) == JobState::Cancelled);
    clock.advance_ms(60_000);
    s.tick().unwrap();
    let (reason, since) = wide_now(&s);
    assert_eq!(reason, "Resources");
    let since = since.expect("waits for GPUs");
    assert!(
        since > s.job(&wide).unwrap().submit_s + 60,
        "counted from the quota's release, not the submission"
    );
    // A restart reads it back (the reason comes again with the first cycle); the next cycles
    // keep it.
    drop(s);
    clock.advance_ms(60_000);
    let s = Arc::new(open_with(dir.path(), config, Arc::clone(&clock)).unwrap());
    assert_eq!(wide_now(&s).1, Some(since));
    clock.advance_ms(60_000);
    s.tick().unwrap();
    assert_eq!(wide_now(&s), ("Resources".to_owned(), Some(since)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_are_forgotten_after_the_job_history_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = cluster_with(
        "[scheduler]\nmin_run_time = \"1m\"\n",
        "[scheduler]\nmin_run_time = \"1m\"\njob_history = \"2h\"\n",
    );
    let s = Arc::new(open_with(dir.path(), config.clone(), Arc::clone(&clock)).unwrap());
    let body = json!({"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h"});
    let (_, reply) = submit(&s, body.clone()).await;
    let old = JobId::new(reply["job_id"].as_str().unwrap()).unwrap();
    tick_until(&s, &clock, |s| state(s, &old) == JobState::Completed);
    // An hour later it is still there; past two hours it is gone, from the disk too (the
    // cycle's journal record says so).
    clock.advance_ms(3_600_000);
    s.tick().unwrap();
    assert!(s.job(&old).is_some());
    clock.advance_ms(3_700_000);
    s.tick().unwrap();
    assert!(s.job(&old).is_none(), "ended more than 2 h ago");
    let journal = std::fs::read_to_string(dir.path().join("scheduler/journal.jsonl")).unwrap();
    assert!(
        journal.contains(&format!("\"forgotten\":[\"{old}\"]")),
        "{journal}"
    );
    // A restart reads the pruned state; the next job gets a new id.
    drop(s);
    let s = Arc::new(open_with(dir.path(), config, Arc::clone(&clock)).unwrap());
    assert!(s.job(&old).is_none());
    let (_, reply) = submit(&s, body).await;
    let new = reply["job_id"].as_str().unwrap();
    assert_ne!(new, old.as_str(), "ids are never given again");
    // A history shorter than an hour is refused by the config check.
    let bad = CLUSTER.replace(
        "[scheduler]\nmin_run_time = \"1m\"\n",
        "[scheduler]\nmin_run_time = \"1m\"\njob_history = \"10m\"\n",
    );
    let err = ClusterConfig::from_toml_str(&bad, "bad.toml").unwrap_err();
    assert!(err.to_string().contains("scheduler.job_history"), "{err}");
}

/// Whether process `pid` is gone (or a zombie nobody waits for).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("Z")
    })
}

/// The scheduler dies after a cycle launched a job and before the cycle saved it: the state it
/// comes back to says the job waits. The launch's processes are ended as it starts (by its
/// cgroup, or without cgroups by the process group its pid file names), so the job runs once,
/// not twice side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_a_crash_kept_from_the_state_is_ended_before_the_job_starts_again() {
    use gpuledger_schedd::cgroup::CgroupMode;
    for mode in [CgroupMode::Auto, CgroupMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
        let clock = Arc::new(ManualClock::new(T0_MS));
        let options = || ExecutorOptions {
            cgroups: mode,
            ..ExecutorOptions::default()
        };
        let reopen =
            || Arc::new(open_on(dir.path(), cluster(), Arc::clone(&clock), options()).unwrap());
        let s = reopen();
        let (status, body) = submit(
            &s,
            json!({"command": "sleep 600", "account": "team-a", "gpus": 1, "time_limit": "1h"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = JobId::new(body["job_id"].as_str().unwrap()).unwrap();
        // What the disk holds before the cycle that launches it: the job waiting (in the
        // journal).
        let sched_dir = dir.path().join("scheduler");
        assert!(!sched_dir.join("state.json").exists());
        let journal = std::fs::read(sched_dir.join("journal.jsonl")).unwrap();
        s.tick().unwrap();
        assert_eq!(state(&s, &id), JobState::Running);
        let first = s.job(&id).unwrap().pid.unwrap();
        drop(s);
        // The crash: that cycle's save never happened.
        std::fs::remove_file(sched_dir.join("state.json")).unwrap();
        std::fs::write(sched_dir.join("journal.jsonl"), journal).unwrap();

        let s = reopen();
        assert_eq!(state(&s, &id), JobState::Pending);
        assert!(
            gone(first),
            "{mode:?}: the unrecorded launch {first} still runs"
        );
        s.tick().unwrap();
        assert_eq!(state(&s, &id), JobState::Running);
        let second = s.job(&id).unwrap().pid.unwrap();
        assert_ne!(second, first);
        assert!(!gone(second));
        s.cancel_now(&id).unwrap();
        tick_until(&s, &clock, |s| state(s, &id) == JobState::Cancelled);
    }
}

/// One tenant's loop cannot fill the scheduler: past `max_submit_jobs` jobs pending or running
/// (the scheduler's default, an account's quota, a project's) a submission is refused with a
/// 429 naming the account or project, takes no job number, and is taken again once one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_past_max_submit_jobs_are_refused_until_some_end() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let toml = CLUSTER
        .replace(
            "min_run_time = \"1m\"\n",
            "min_run_time = \"1m\"\nmax_submit_jobs = 3\n",
        )
        .replace(
            "quota = { max_gpus_per_job = 8 }\nrun_as = { user = \"root\" }\n",
            "quota = { max_gpus_per_job = 8, max_submit_jobs = 4 }\nrun_as = { user = \"root\" }\n\
             projects = [{ id = \"p1\", quota = { max_submit_jobs = 2 } }]\n",
        );
    let cluster = ClusterConfig::from_toml_str(&toml, "one.toml").unwrap();
    let s = Arc::new(open_with(dir.path(), cluster, Arc::clone(&clock)).unwrap());
    let job = |account: &str, project: Option<&str>| {
        let mut j =
            json!({"command": "sleep 600", "account": account, "gpus": 8, "time_limit": "1h"});
        if let Some(p) = project {
            j["project"] = json!(p);
        }
        j
    };
    let refused = |(status, body): (StatusCode, Value), field: &str, says: &str| {
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    };
    for n in 1..=3 {
        let (status, body) = submit(&s, job("team-b", None)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["job_id"], format!("team-b.{n}"));
        // The first runs (the node's 8 GPUs); the rest wait: both count.
        s.tick().unwrap();
    }
    refused(
        submit(&s, job("team-b", None)).await,
        "account",
        "account `team-b` has 3 jobs pending or running; at most 3",
    );
    // team-a's quota allows 4, its project p1 2 of them.
    for project in [Some("p1"), Some("p1"), None, None] {
        assert_eq!(
            submit(&s, job("team-a", project)).await.0,
            StatusCode::CREATED
        );
    }
    refused(
        submit(&s, job("team-a", Some("p1"))).await,
        "account",
        "account `team-a` has 4 jobs pending or running; at most 4",
    );
    let (status, _) = call(&s, "DELETE", "/api/v1/jobs/team-a.4", None).await;
    assert_eq!(status, StatusCode::OK);
    refused(
        submit(&s, job("team-a", Some("p1"))).await,
        "project",
        "project `p1` has 2 jobs pending or running; at most 2",
    );
    assert_eq!(submit(&s, job("team-a", None)).await.0, StatusCode::CREATED);
    // One of team-b's ends: the next is taken, under the next number (the refusals took none).
    let (status, _) = call(&s, "DELETE", "/api/v1/jobs/team-b.3", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = submit(&s, job("team-b", None)).await;
    assert_eq!(
        (status, &body["job_id"]),
        (StatusCode::CREATED, &json!("team-b.4"))
    );
    for id in ["team-b.1", "team-b.2", "team-b.4"] {
        call(&s, "DELETE", &format!("/api/v1/jobs/{id}?now=true"), None).await;
    }
}

/// A cycle writes what it changed to the journal, not the whole state: a crash right after a
/// cycle that launched a job comes back to the job running (its process adopted, not started
/// again) though `state.json` never held it; once the journal holds half of `state.json` (a
/// megabyte at least), a cycle writes `state.json` again and empties the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_writes_its_changes_to_the_journal_and_the_state_file_only_now_and_then() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let clock = Arc::new(ManualClock::new(T0_MS));
    let sched_dir = dir.path().join("scheduler");
    let s = open(dir.path(), Arc::clone(&clock));
    s.tick().unwrap();
    let body = json!({"command": "sleep 600", "account": "team-a", "gpus": 1, "time_limit": "1h"});
    let (status, reply) = submit(&s, body).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let id = JobId::new(reply["job_id"].as_str().unwrap()).unwrap();
    clock.advance_ms(1000);
    s.tick().unwrap();
    assert_eq!(state(&s, &id), JobState::Running);
    let pid = s.job(&id).unwrap().pid.unwrap();
    let saved = std::fs::read_to_string(sched_dir.join("state.json")).unwrap();
    assert!(
        !saved.contains(id.as_str()),
        "the state file was written again: {saved}"
    );
    let journal = std::fs::read_to_string(sched_dir.join("journal.jsonl")).unwrap();
    assert_eq!(
        journal.lines().count(),
        2,
        "the submission and the cycle: {journal}"
    );
    // The crash: nothing more is written.
    drop(s);
    let s = open(dir.path(), Arc::clone(&clock));
    let info = s.job(&id).unwrap();
    assert_eq!(
        (info.state, info.pid),
        (JobState::Running, Some(pid)),
        "adopted"
    );
    assert!(!gone(pid));

    // Submissions of 64 KiB commands until the journal passes a megabyte: the next cycle
    // begins the state file beside the service, and once it is written it holds them all and
    // the journal starts again (the records meanwhile in the next file, which replaces it).
    let long = format!("true # {}", "x".repeat(60 * 1024));
    let journal_bytes = || {
        std::fs::metadata(sched_dir.join("journal.jsonl"))
            .unwrap()
            .len()
    };
    let mut ids = Vec::new();
    while journal_bytes() < 1 << 20 {
        let body = json!({"command": long, "account": "team-b", "gpus": 8, "time_limit": "1h"});
        let (status, reply) = submit(&s, body).await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        ids.push(reply["job_id"].as_str().unwrap().to_owned());
    }
    clock.advance_ms(1000);
    s.tick().unwrap();
    s.finish_state_file();
    assert_eq!(journal_bytes(), 0);
    assert!(!sched_dir.join("journal.next.jsonl").exists());
    let saved = std::fs::read_to_string(sched_dir.join("state.json")).unwrap();
    assert!(ids.iter().all(|id| saved.contains(id.as_str())));
    s.cancel_now(&id).unwrap();
    tick_until(&s, &clock, |s| state(s, &id) == JobState::Cancelled);
}
