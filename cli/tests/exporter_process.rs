//! Exporter and aggregator as real processes on loopback: the aggregator is down while the
//! exporter samples, the exporter is killed with `kill -9` while it holds spooled batches and
//! restarted, then the aggregator comes up: every batch arrives exactly once, in sequence, and
//! nothing is stored twice.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::query::Query;

use common::{scrape, terminate, Process};

fn spawn(args: &[&str]) -> Process {
    common::spawn(args, Stdio::null())
}

fn metric(url: &str, name: &str) -> f64 {
    let text = scrape(url);
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn scalar_of(query: &Query, rt: &tokio::runtime::Runtime, sql: &str) -> i64 {
    rt.block_on(common::scalar(query, sql))
}

#[test]
fn batches_spooled_across_an_outage_and_a_kill_9_arrive_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, data, mapping) = (
        dir.path().join("spool"),
        dir.path().join("data"),
        dir.path().join("jobs"),
    );
    std::fs::create_dir_all(&mapping).unwrap();
    for gpu in 0..4 {
        std::fs::write(mapping.join(gpu.to_string()), "7 team-a research\n").unwrap();
    }
    let port = common::free_port();
    let aggregator_url = format!("http://127.0.0.1:{port}");
    let exporter_args = [
        "exporter",
        "--node",
        "node001",
        "--gpus",
        "8",
        "--sample-interval",
        "1s",
        "--push-interval",
        "1s",
        "--listen",
        "127.0.0.1:0",
        "--aggregator-url",
        &aggregator_url,
        "--spool-dir",
        spool.to_str().unwrap(),
        "--job-mapping-dir",
        mapping.to_str().unwrap(),
    ];

    // The aggregator is down: batches pile up in the spool.
    let mut exporter = spawn(&exporter_args);
    wait_for("spooled batches", || {
        metric(&exporter.url, "gpuledger_exporter_spool_batches") >= 3.0
    });
    assert!(metric(&exporter.url, "gpuledger_exporter_pushes_failed_total") >= 1.0);
    let page = scrape(&exporter.url);
    assert!(page.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"node001\",hpc_job=\"7\",account=\"team-a\",project=\"research\"}"), "{page}");
    assert!(
        page.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"5\",Hostname=\"node001\",hpc_job=\"\"}"),
        "idle GPUs are labelled idle, not dropped"
    );
    exporter.child.kill().unwrap();
    exporter.child.wait().unwrap();

    // Restarted, the exporter keeps its spool and its sequence; then the aggregator comes up.
    let exporter = spawn(&exporter_args);
    let aggregator = spawn(&[
        "aggregator",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    wait_for("the spool to drain", || {
        metric(&exporter.url, "gpuledger_exporter_pushes_total") >= 4.0
            && metric(&exporter.url, "gpuledger_exporter_spool_batches") == 0.0
    });
    terminate(exporter);
    let next_seq: u64 = std::fs::read_to_string(spool.join("next-seq"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let left = std::fs::read_dir(&spool)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".arrows")
        })
        .count();
    assert_eq!(left, 0, "everything was pushed before the exporter stopped");
    terminate(aggregator);

    // The aggregator stored sequence numbers 0..next_seq, each once.
    let checkpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("wal/agg0/checkpoint.json")).unwrap())
            .unwrap();
    assert_eq!(
        checkpoint["samples"]["node001"]["contiguous"].as_u64(),
        Some(next_seq - 1),
        "{checkpoint}"
    );
    assert!(
        checkpoint["samples"]["node001"].get("above").is_none(),
        "no gaps: {checkpoint}"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let query = rt.block_on(Query::open(&Layout::new(&data))).unwrap();
    let rows = scalar_of(&query, &rt, "SELECT COUNT(*) FROM samples");
    let instants = scalar_of(&query, &rt, "SELECT COUNT(DISTINCT time) FROM samples");
    assert!(rows > 0);
    assert_eq!(
        rows,
        8 * instants,
        "every instant has its eight GPUs, none twice"
    );
    assert_eq!(
        scalar_of(
            &query,
            &rt,
            "SELECT COUNT(*) FROM samples WHERE account = 'team-a' AND job_id = '7'"
        ),
        rows / 2,
        "GPUs 0-3 labelled with their job, 4-7 idle"
    );
}

#[test]
fn the_exporter_alone_samples_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("exporter.toml");
    let spool = dir.path().join("spool");
    std::fs::write(
        &config,
        format!(
            "node = \"gpu042\"\ngpus = 2\nlisten = \"127.0.0.1:0\"\nspool_dir = \"{}\"\n",
            spool.display()
        ),
    )
    .unwrap();
    let exporter = common::spawn_binary(
        env!("CARGO_BIN_EXE_gpuledger-exporter"),
        &["--config", config.to_str().unwrap()],
        Stdio::null(),
    );
    wait_for("a collection", || {
        metric(&exporter.url, "gpuledger_exporter_samples_total") >= 2.0
    });
    let page = scrape(&exporter.url);
    assert!(
        page.contains("gpuledger_gpu_up{gpu=\"1\",Hostname=\"gpu042\"} 1"),
        "{page}"
    );
    terminate(exporter);
    assert!(
        spool.join("next-seq").exists(),
        "the last samples were spooled at shutdown"
    );
}
