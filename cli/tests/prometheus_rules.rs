//! The Prometheus rules in `dashboards/prometheus/` with a real `promtool` (Debian's
//! `prometheus` package, which `./scripts/test.sh` installs when missing): the rules parse, their
//! unit tests pass (each alert fires when it should and not before), and the `/metrics` pages of
//! the scheduler and of real exporter and aggregator processes pass `promtool check metrics`
//! without a complaint.

mod common;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use gpuledger_model::time::ManualClock;
use gpuledger_schedd::executor::LocalExecutor;
use gpuledger_schedd::state::SubmitRequest;
use gpuledger_schedd::{Service, ServiceConfig};
use gpuledger_scheduler::SchedulerOptions;

const RULES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../dashboards/prometheus");

fn promtool(args: &[&str]) -> Output {
    Command::new("promtool")
        .args(args)
        .current_dir(RULES_DIR)
        .output()
        .expect("promtool not found: ./scripts/test.sh installs Debian's `prometheus` package")
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rules_parse_and_their_unit_tests_pass() {
    assert_ok(
        &promtool(&["check", "rules", "gpuledger-rules.yml"]),
        "check rules",
    );
    assert_ok(
        &promtool(&["test", "rules", "gpuledger-rules.test.yml"]),
        "test rules",
    );
}

#[test]
fn the_scheduler_metrics_pass_promtool_check_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = gpuledger_sim::seed::load_cluster(None).unwrap();
    for account in &mut cluster.accounts {
        account.run_as = Some(gpuledger_model::tenant::RunAs {
            user: "root".into(),
            group: None,
        });
    }
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
    let clock = Arc::new(ManualClock::new(1_780_272_000_000));
    let service = Service::open(cluster, config, executor, clock).unwrap();
    // One job pending for a reason, so every family has a sample.
    let request: SubmitRequest = serde_json::from_value(serde_json::json!({
        "command": "true", "account": "team-e", "gpus": 512, "time_limit": "1h"
    }))
    .unwrap();
    service.submit(request.clone()).unwrap();
    service.submit(request).unwrap();
    service.tick().unwrap();
    let text = service.metrics();
    assert!(
        text.contains(
            "gpuledger_scheduler_pending_jobs{account=\"team-e\",reason=\"Resources\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("gpuledger_scheduler_gpus{state=\"allocated\"} 512"),
        "{text}"
    );
    let complaints = common::promtool_check_metrics(&text);
    assert!(
        complaints.is_empty(),
        "promtool complains:\n{complaints}\n{text}"
    );
    // Cancel the running job so no process outlives the test.
    for job in service.queue() {
        let _ = service.cancel(&job.id);
    }
}

#[test]
fn exporter_and_aggregator_pages_pass_promtool_check_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let aggregator = common::spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("agg").to_str().unwrap(),
        ],
        Stdio::null(),
    );
    let exporter = common::spawn(
        &[
            "exporter",
            "--node",
            "gpu001",
            "--gpus",
            "4",
            "--sample-interval",
            "1s",
            "--push-interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--aggregator-url",
            &aggregator.url,
            "--spool-dir",
            dir.path().join("spool").to_str().unwrap(),
        ],
        Stdio::null(),
    );
    // Wait until the exporter has pushed, so the aggregator's ingest families have samples.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !common::scrape(&aggregator.url)
        .contains("gpuledger_ingest_batches_total{outcome=\"accepted\"}")
    {
        assert!(
            std::time::Instant::now() < until,
            "no batch reached the aggregator"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (name, url) in [("exporter", &exporter.url), ("aggregator", &aggregator.url)] {
        let complaints = common::promtool_check_metrics(&common::scrape(url));
        assert!(
            complaints.is_empty(),
            "{name}: promtool complains:\n{complaints}"
        );
    }
    common::terminate(exporter);
    common::terminate(aggregator);
}
