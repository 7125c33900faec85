//! The aggregator's write-ahead log on a disk that fills up (a real 1 MiB tmpfs, mounted for
//! the test): batches that cannot be logged are refused with an error, never acknowledged;
//! once space returns batches are acknowledged again; after `kill -9` and a restart every
//! acknowledged batch is stored, once, and nothing else.

mod common;

use std::process::Stdio;

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::objects::Objects;
use gpuledger_aggregator::query::Query;

use common::ingest::{agent, batch, try_push};
use common::{scalar, spawn, terminate, Process, Tmpfs};

const ROWS: usize = 400;

fn start(tables_url: &str, state: &std::path::Path) -> Process {
    spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--flush-interval",
            "1h",
            "--data-dir",
            tables_url,
            "--state-dir",
            state.to_str().unwrap(),
        ],
        Stdio::inherit(),
    )
}

#[test]
fn a_full_log_disk_refuses_batches_and_a_kill_9_loses_no_acknowledged_one() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    std::fs::create_dir_all(&tables).unwrap();
    let url = format!("file://{}", tables.display());
    let disk = Tmpfs::mount("1m");
    let state = disk.path().join("state");
    // Most of the log's disk is held by something else until the middle of the run.
    let filler = disk.path().join("filler");
    std::fs::write(&filler, vec![0u8; 800 << 10]).unwrap();

    let now_ms = chrono::Utc::now().timestamp_millis();
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - 3_600_000;
    let agent = agent();
    let mut aggregator = start(&url, &state);
    let mut acknowledged = Vec::new();
    let mut refused = Vec::new();
    for seq in 0..60u64 {
        if seq == 30 {
            std::fs::remove_file(&filler).unwrap();
        }
        let body = batch("gpu001", seq, t0_ms, ROWS);
        match try_push(&agent, &aggregator.url, "gpu001", seq, &body) {
            Some((200, text)) if text.contains("accepted") => acknowledged.push(seq),
            Some((status, text)) => {
                assert!(
                    status >= 500,
                    "a full disk is the server's trouble: {status} {text}"
                );
                refused.push(seq);
            }
            None => panic!("batch {seq}: no answer"),
        }
    }
    assert!(
        refused.iter().any(|&s| s < 30),
        "the log's disk filled before it was freed: refused {refused:?}"
    );
    assert!(
        acknowledged.iter().any(|&s| s > refused[0]),
        "batches were acknowledged again once space returned: {acknowledged:?}"
    );

    aggregator.child.kill().expect("SIGKILL");
    aggregator.child.wait().unwrap();
    let aggregator = start(&url, &state);
    for &seq in &acknowledged {
        let body = batch("gpu001", seq, t0_ms, ROWS);
        let (status, text) = try_push(&agent, &aggregator.url, "gpu001", seq, &body).unwrap();
        assert_eq!(status, 200, "{text}");
        assert!(
            text.contains("duplicate"),
            "batch {seq} was acknowledged before the kill: {text}"
        );
    }
    terminate(aggregator);

    let reader = dir.path().join("reader");
    let layout = Layout::with_tables(Objects::remote(&url, &reader).unwrap(), &reader);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let query = Query::open(&layout).await.unwrap();
        let stored = acknowledged.len() as i64 * ROWS as i64;
        assert_eq!(
            scalar(&query, "SELECT COUNT(*) FROM samples").await,
            stored,
            "every acknowledged batch stored, no refused one"
        );
        assert_eq!(
            scalar(&query, "SELECT COUNT(DISTINCT time) FROM samples").await,
            stored / 8,
            "none twice"
        );
    });
}
