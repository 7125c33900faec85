//! The data directory as an object store, with real processes: two aggregators, each owning
//! two nodes, write their tables to one `s3://` prefix of a real S3 server on loopback (moto's
//! `moto_server`, which speaks the S3 REST protocol) and to one `file://` URL (object_store's
//! local backend: the same code path). One of them is killed with SIGKILL while nodes push and
//! restarted; every batch is then re-sent. What is in the store afterwards is exactly what was
//! sent, once, and `gpuledger report` over the URL reads both writers' files. A flush the
//! store refuses makes the aggregator exit (status 75) rather than carry on without those rows;
//! its restart stores them.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::objects::Objects;
use gpuledger_aggregator::query::Query;

use common::ingest::{agent, batch};
use common::{
    assert_stored_once, free_port, scalar, seed_config_labelled, spawn, terminate, wait_for,
    Process,
};

const BATCHES: u64 = 12;
const ROWS: usize = 600;

/// moto's S3 server on a free loopback port, killed when dropped.
struct S3Server {
    child: Child,
    endpoint: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_s3() -> S3Server {
    let port = free_port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 not found: ./scripts/test.sh needs it for moto's S3 server");
    let endpoint = format!("http://127.0.0.1:{port}");
    wait_for("the S3 server to answer", 60, || {
        ureq::get(format!("{endpoint}/")).call().is_ok()
    });
    S3Server { child, endpoint }
}

/// Pushes batch `seq` of `node`; the reply's status, `None` when the aggregator did not answer.
fn push(agent: &ureq::Agent, url: &str, node: &str, seq: u64, t0_ms: i64) -> Option<String> {
    common::ingest::push(agent, url, node, seq, &batch(node, seq, t0_ms, ROWS))
}

/// Runs `gpuledger ARGS` to completion; its standard output, once it succeeded.
fn gpuledger(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn start_writer(data_dir: &str, state: &std::path::Path, id: &str, nodes: &str) -> Process {
    spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--flush-interval",
            "1h",
            "--data-dir",
            data_dir,
            "--state-dir",
            state.to_str().unwrap(),
            "--writer-id",
            id,
            "--node",
            nodes,
        ],
        Stdio::inherit(),
    )
}

/// An hour before `now_ms` on the second, or earlier where the batches' 15 minutes from then
/// would cross midnight UTC: the report below reads one day and the invoice one month (CI
/// failed on a run at 00:58 UTC, the report holding the 1.8 GPU-hours before midnight).
fn start_within_one_day(now_ms: i64) -> i64 {
    const DAY_MS: i64 = 86_400_000;
    let span_ms = BATCHES as i64 * (ROWS / 8) as i64 * 1000;
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - 3_600_000;
    let midnight = (t0_ms + span_ms - 1).div_euclid(DAY_MS) * DAY_MS;
    if t0_ms < midnight {
        midnight - span_ms
    } else {
        t0_ms
    }
}

#[test]
fn the_batches_never_cross_midnight() {
    let day = |ms: i64| ms.div_euclid(86_400_000);
    let span_ms = BATCHES as i64 * (ROWS / 8) as i64 * 1000;
    // 2026-12-04 00:58:00 UTC, the CI run that failed, and times around midnight.
    let midnight = 1_796_342_400_000;
    for now_ms in [
        midnight + 58 * 60_000,
        midnight + 3_600_000,
        midnight + 3_600_000 + span_ms - 1,
        midnight + 3_600_000 + span_ms,
        midnight + 12 * 3_600_000 + 123,
    ] {
        let t0 = start_within_one_day(now_ms);
        assert_eq!(day(t0), day(t0 + span_ms - 1), "now {now_ms}");
        assert!(t0 <= now_ms - 3_600_000 && t0 > now_ms - 3_600_000 - span_ms - 1000);
        assert_eq!(t0.rem_euclid(1000), 0);
    }
}

/// Two writers into `data_dir`; `agg-a` is killed half-way and restarted, every batch is
/// re-sent; then the tables are read back through the URL, in the test and by `report`.
fn two_writers_and_a_kill_9(data_dir: &str, state: &std::path::Path) {
    let t0_ms = start_within_one_day(chrono::Utc::now().timestamp_millis());
    let nodes = ["gpu001", "gpu002", "gpu003", "gpu004"];
    let mut a = start_writer(data_dir, &state.join("a"), "agg-a", "gpu001,gpu002");
    let b = start_writer(data_dir, &state.join("b"), "agg-b", "gpu003,gpu004");
    let agent = agent();
    let owner = |n: usize, a: &Process| if n < 2 { a.url.clone() } else { b.url.clone() };
    for seq in 0..BATCHES / 2 {
        for (n, node) in nodes.iter().enumerate() {
            assert_eq!(
                push(&agent, &owner(n, &a), node, seq, t0_ms).as_deref(),
                Some("accepted")
            );
        }
    }
    // agg-a dies with half its batches acknowledged and none of them flushed to the store.
    a.child.kill().expect("SIGKILL");
    a.child.wait().unwrap();
    let a = start_writer(data_dir, &state.join("a"), "agg-a", "gpu001,gpu002");
    for seq in 0..BATCHES {
        for (n, node) in nodes.iter().enumerate() {
            let status = push(&agent, &owner(n, &a), node, seq, t0_ms).expect("answers");
            let expected = if seq < BATCHES / 2 {
                "duplicate"
            } else {
                "accepted"
            };
            assert_eq!(status, expected, "{node} batch {seq}");
        }
    }
    terminate(a);
    terminate(b);

    let tables = Objects::remote(data_dir, state.join("reader")).unwrap();
    let listed = tables.list("samples").unwrap();
    for writer in ["part-agg-a-", "part-agg-b-"] {
        assert!(
            listed.iter().any(|e| e.key.contains(writer)),
            "{writer} files in {listed:?}"
        );
    }
    assert!(
        listed.iter().all(|e| !e.key.ends_with(".tmp")),
        "nothing staged is in the store: {listed:?}"
    );
    let sent = (nodes.len() as u64 * BATCHES) as i64 * ROWS as i64;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let layout = Layout::with_tables(tables.clone(), state.join("reader"));
        let query = Query::open(&layout).await.unwrap();
        assert_stored_once(&query, sent).await;
    });

    let day = chrono::DateTime::from_timestamp_millis(t0_ms)
        .unwrap()
        .date_naive();
    let text = gpuledger(&[
        "report",
        "--data-dir",
        data_dir,
        "--from",
        &day.to_string(),
        "--to",
        &day.succ_opt().unwrap().to_string(),
    ]);
    assert!(text.contains(data_dir), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("team-a"))
        .unwrap_or_else(|| panic!("no team-a row in {text}"));
    // 28,800 GPU-seconds: 8.0 GPU-hours in the report's column (6.0 had agg-a lost its
    // acknowledged half, 10.0 had it stored it twice).
    assert_eq!(sent, 28_800);
    let hours = format!(" {:.1} ", sent as f64 / 3600.0);
    assert!(row.contains(&hours), "{hours} GPU-hours in {row:?}");

    // The month's invoices from the tables in the store, written under the state directory.
    let month = day.format("%Y-%m").to_string();
    let billing = state.join("billing");
    // The batches name jobs that no job event describes: billed as labelled.
    let config = seed_config_labelled(state);
    let text = gpuledger(&[
        "invoice",
        "--month",
        &month,
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data_dir,
        "--state-dir",
        billing.to_str().unwrap(),
    ]);
    let row = text
        .lines()
        .find(|l| l.contains("team-a"))
        .unwrap_or_else(|| panic!("no team-a invoice in {text}"));
    assert!(row.contains(&hours), "{hours} GPU-hours in {row:?}");
    assert!(
        billing
            .join("invoices")
            .join(&month)
            .join("team-a")
            .is_dir(),
        "{text}"
    );
}

#[test]
fn two_aggregators_write_one_s3_prefix_survive_a_kill_9_and_report_reads_both() {
    let server = start_s3();
    // The aggregator and the reader take their S3 settings from the AWS variables.
    std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_REGION", "us-east-1");
    let created = agent()
        .put(format!("{}/ledger", server.endpoint))
        .send_empty()
        .unwrap();
    assert_eq!(created.status().as_u16(), 200);
    let dir = tempfile::tempdir().unwrap();
    two_writers_and_a_kill_9("s3://ledger/cluster-1", dir.path());
    // The objects are in the bucket under the prefix, as any S3 client sees them.
    let list = |prefix: &str| {
        let mut listing = agent()
            .get(format!(
                "{}/ledger?list-type=2&prefix=cluster-1/{prefix}",
                server.endpoint
            ))
            .call()
            .unwrap();
        listing.body_mut().read_to_string().unwrap()
    };
    let xml = list("rollups/hourly/");
    assert!(xml.contains("<Key>cluster-1/rollups/hourly/date="), "{xml}");

    // Retention drops a partition with one bulk request (S3's DeleteObjects): its keys go,
    // the prefix's others stay.
    let objects = Objects::remote("s3://ledger/cluster-1", dir.path().join("staging")).unwrap();
    for i in 0..3 {
        objects
            .put(
                &format!("scratch/date=2026-06-01/part-{i}.parquet"),
                vec![i; 16],
            )
            .unwrap();
    }
    objects.delete_dir("scratch/date=2026-06-01").unwrap();
    assert!(!list("scratch/").contains("<Key>"), "{}", list("scratch/"));
    assert!(list("rollups/hourly/").contains("<Key>cluster-1/rollups/hourly/date="));
}

/// A tables directory under `dir` and its `file://` URL.
fn file_url(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let tables = dir.join("tables");
    std::fs::create_dir_all(&tables).unwrap();
    let url = format!("file://{}", tables.display());
    (tables, url)
}

#[test]
fn two_aggregators_write_one_file_url_survive_a_kill_9_and_report_reads_both() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, url) = file_url(dir.path());
    two_writers_and_a_kill_9(&url, &dir.path().join("state"));
    // The write-ahead logs stayed on the state directories, not among the tables.
    assert!(dir
        .path()
        .join("state/a/wal/agg-a/checkpoint.json")
        .exists());
    assert!(!tables.join("wal").exists());
}

#[test]
fn a_flush_the_store_refuses_exits_and_the_restart_stores_every_acknowledged_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, url) = file_url(dir.path());
    let state = dir.path().join("state");
    let start = || {
        spawn(
            &[
                "aggregator",
                "--listen",
                "127.0.0.1:0",
                "--flush-interval",
                "1s",
                "--data-dir",
                &url,
                "--state-dir",
                state.to_str().unwrap(),
            ],
            Stdio::inherit(),
        )
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - 3_600_000;
    let agent = agent();
    let mut aggregator = start();
    assert_eq!(
        push(&agent, &aggregator.url, "gpu001", 0, t0_ms).as_deref(),
        Some("accepted")
    );
    let rollups = tables.join("rollups");
    // The flush that wrote batch 0 must have finished before its directory is taken away:
    // a flush seen to finish after a rollup file appeared is that one or a later one.
    let flushes = |url: &str| -> f64 {
        common::scrape(url)
            .lines()
            .find_map(|l| l.strip_prefix("gpuledger_flushes_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    wait_for("a rollup file", 30, || {
        walk_files(&rollups)
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "parquet"))
    });
    let seen = flushes(&aggregator.url);
    wait_for("that flush to finish", 30, || {
        flushes(&aggregator.url) > seen
    });
    // The store now refuses every rollup file: `rollups` is a file where its directory was.
    let away = tables.join("rollups.away");
    std::fs::rename(&rollups, &away).unwrap();
    std::fs::write(&rollups, b"in the way").unwrap();
    assert_eq!(
        push(&agent, &aggregator.url, "gpu001", 1, t0_ms).as_deref(),
        Some("accepted")
    );
    let status = loop {
        if let Some(status) = aggregator.child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(75), "exits after the failed flush");
    std::fs::remove_file(&rollups).unwrap();
    std::fs::rename(&away, &rollups).unwrap();
    let aggregator = start();
    assert_eq!(
        push(&agent, &aggregator.url, "gpu001", 1, t0_ms).as_deref(),
        Some("duplicate"),
        "batch 1 was acknowledged before the failure"
    );
    terminate(aggregator);
    let layout = Layout::with_tables(
        Objects::remote(&url, dir.path().join("r")).unwrap(),
        dir.path().join("r"),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let query = Query::open(&layout).await.unwrap();
        let sent = 2 * ROWS as i64;
        assert_eq!(scalar(&query, "SELECT COUNT(*) FROM samples").await, sent);
        assert_eq!(
            scalar(&query, "SELECT COUNT(DISTINCT time) FROM samples").await,
            sent / 8,
            "none twice"
        );
        assert_eq!(
            scalar(&query, "SELECT SUM(gpu_seconds) FROM rollups_hourly").await,
            sent
        );
    });
}

/// Every file under `dir` (none when it does not exist).
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}
