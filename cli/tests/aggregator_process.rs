//! The aggregator as a real process over real HTTP on loopback: `kill -9` while nodes push,
//! restart, nodes re-send every batch they sent: every acknowledged batch comes back as a
//! duplicate, and after a clean shutdown (SIGTERM) the stored samples are exactly the ones
//! sent, none twice. Slow clients are cut off without stalling it.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::query::Query;

use common::ingest::{agent, push};
use common::{assert_stored_once, scalar, spawn, terminate, Process};

const NODES: usize = 4;
const BATCHES: u64 = 40;
const ROWS: usize = 64;

fn start(data_dir: &std::path::Path) -> Process {
    let dir = data_dir.to_str().unwrap();
    spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--flush-interval",
            "1h",
            "--data-dir",
            dir,
        ],
        Stdio::inherit(),
    )
}

fn batch(node: &str, seq: u64, t0_ms: i64) -> Vec<u8> {
    common::ingest::batch(node, seq, t0_ms, ROWS)
}

#[test]
fn kill_9_during_ingest_loses_nothing_acknowledged_and_stores_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - 3_600_000;
    let mut aggregator = start(dir.path());
    let acked = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..NODES)
        .map(|n| {
            let (url, acked) = (aggregator.url.clone(), Arc::clone(&acked));
            std::thread::spawn(move || {
                let node = format!("gpu{:03}", n + 1);
                let agent = agent();
                let mut acknowledged = Vec::new();
                for seq in 0..BATCHES {
                    match push(&agent, &url, &node, seq, &batch(&node, seq, t0_ms)) {
                        Some(_) => {
                            acknowledged.push(seq);
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        None => break,
                    }
                }
                acknowledged
            })
        })
        .collect();
    while acked.load(Ordering::SeqCst) < (NODES as u64 * BATCHES / 2) as usize {
        std::thread::sleep(Duration::from_millis(2));
    }
    aggregator.child.kill().expect("SIGKILL");
    aggregator.child.wait().unwrap();
    let acknowledged: Vec<Vec<u64>> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    let total_acked: usize = acknowledged.iter().map(Vec::len).sum();
    assert!(
        total_acked < NODES * BATCHES as usize,
        "the kill came before the end"
    );

    let aggregator = start(dir.path());
    let agent = agent();
    for (n, acked) in acknowledged.iter().enumerate() {
        let node = format!("gpu{:03}", n + 1);
        for seq in 0..BATCHES {
            let status = push(
                &agent,
                &aggregator.url,
                &node,
                seq,
                &batch(&node, seq, t0_ms),
            )
            .expect("the restarted aggregator answers");
            if acked.contains(&seq) {
                assert_eq!(
                    status, "duplicate",
                    "{node} batch {seq} was acknowledged before the kill"
                );
            }
        }
    }
    terminate(aggregator);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let query = Query::open(&Layout::new(dir.path())).await.unwrap();
        let sent = (NODES * BATCHES as usize * ROWS) as i64;
        assert_stored_once(&query, sent).await;
    });
}

#[test]
fn two_aggregators_share_one_data_directory_and_reports_read_both() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - 3_600_000;
    let start_writer = |id: &str, nodes: &str| {
        spawn(
            &[
                "aggregator",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data,
                "--writer-id",
                id,
                "--node",
                nodes,
            ],
            Stdio::inherit(),
        )
    };
    let a = start_writer("agg-a", "gpu001,gpu002");
    let b = start_writer("agg-b", "gpu003,gpu004");
    let agent = agent();
    for n in 0..4 {
        let node = format!("gpu{:03}", n + 1);
        let (own, other) = if n < 2 { (&a, &b) } else { (&b, &a) };
        for seq in 0..3 {
            let body = batch(&node, seq, t0_ms);
            assert_eq!(
                push(&agent, &own.url, &node, seq, &body).as_deref(),
                Some("accepted")
            );
        }
        // The other aggregator does not own this node: refused, nothing stored there.
        let refused = agent
            .post(format!("{}/api/v1/ingest", other.url))
            .header(gpuledger_model::wire::NODE_HEADER, &node)
            .header(gpuledger_model::wire::SEQ_HEADER, "99")
            .send(&batch(&node, 99, t0_ms)[..])
            .unwrap();
        assert_eq!(refused.status().as_u16(), 422);
    }
    terminate(a);
    // A restart of one writer recovers its own log and leaves the other's files alone.
    let a = start_writer("agg-a", "gpu001,gpu002");
    terminate(a);
    terminate(b);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let query = Query::open(&Layout::new(dir.path())).await.unwrap();
        assert_eq!(
            scalar(&query, "SELECT COUNT(*) FROM samples").await,
            (4 * 3 * ROWS) as i64
        );
        assert_eq!(
            scalar(&query, "SELECT COUNT(DISTINCT node) FROM samples").await,
            4
        );
    });
    for writer in ["agg-a", "agg-b"] {
        assert!(dir
            .path()
            .join("wal")
            .join(writer)
            .join("checkpoint.json")
            .exists());
    }
}

fn post_events(url: &str, source: &str, events: serde_json::Value) {
    let body = serde_json::json!({"source": source, "seq": 0, "events": events});
    let status = agent()
        .post(format!("{url}/api/v1/events"))
        .header("content-type", "application/json")
        .send(body.to_string().as_bytes())
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200);
}

#[test]
fn the_jobs_waiting_and_running_come_back_after_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let t = chrono::Utc::now().timestamp_millis() - 600_000;
    let mut aggregator = start(dir.path());
    let ev = |dt: i64, job: &str, kind: &str, extra: serde_json::Value| {
        let mut e = serde_json::json!({"time_ms": t + dt, "job_id": job, "account": "team-a", "project": "pretrain", "kind": kind});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    };
    let done = serde_json::json!([
        ev(0, "3", "submitted", serde_json::json!({"gpus": 8})),
        ev(1_000, "3", "started", serde_json::json!({"gpus": 8})),
        ev(
            9_000,
            "3",
            "finished",
            serde_json::json!({"outcome": "completed"})
        ),
    ]);
    post_events(
        &aggregator.url,
        "sched",
        serde_json::json!([
            ev(0, "1", "submitted", serde_json::json!({"gpus": 4})),
            ev(2_000, "1", "started", serde_json::json!({"gpus": 4})),
            ev(3_000, "2", "submitted", serde_json::json!({"gpus": 16})),
        ]),
    );
    post_events(&aggregator.url, "sched2", done.clone());
    // Acknowledged events are in the log: a kill loses none of them.
    aggregator.child.kill().expect("SIGKILL");
    aggregator.child.wait().unwrap();
    let aggregator = start(dir.path());
    let page = common::scrape(&aggregator.url);
    assert!(
        page.contains(
            "gpuledger_job_gpus{account=\"team-a\",hpc_job=\"1\",project=\"pretrain\"} 4"
        ),
        "{page}"
    );
    assert!(
        page.contains("gpuledger_jobs_pending{account=\"team-a\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("gpuledger_jobs_running{account=\"team-a\"} 1"),
        "{page}"
    );
    assert!(
        !page.contains("hpc_job=\"3\""),
        "an ended job has no series: {page}"
    );
    // Job 3's events read again by another source: it stays ended.
    post_events(&aggregator.url, "sched3", done);
    let page = common::scrape(&aggregator.url);
    assert!(
        !page.contains("hpc_job=\"3\"")
            && page.contains("gpuledger_jobs_running{account=\"team-a\"} 1"),
        "{page}"
    );
    terminate(aggregator);
}

/// Reads until the aggregator closes the connection; what it sent. Fails if it keeps the
/// connection open ten seconds without a word.
fn read_until_closed(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the aggregator kept the connection open: {e}"),
        }
    }
}

#[test]
fn slow_clients_cannot_stall_the_aggregator_and_nothing_half_sent_is_stored() {
    use std::io::Write;
    use std::net::TcpStream;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--max-connections",
            "3",
            "--header-timeout",
            "1s",
            "--request-timeout",
            "2s",
        ],
        Stdio::inherit(),
    );
    let addr = aggregator.url.trim_start_matches("http://").to_owned();
    // Two clients dribble their headers, a third sends a batch's headers and a tenth of it.
    let mut dribblers: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let body = batch("gpu001", 0, now_ms - now_ms.rem_euclid(1000) - 3_600_000);
    let mut half_sender = TcpStream::connect(&addr).unwrap();
    write!(
        half_sender,
        "POST /api/v1/ingest HTTP/1.1\r\nhost: x\r\nx-gpuledger-node: gpu001\r\n\
         x-gpuledger-seq: 0\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    half_sender.write_all(&body[..body.len() / 10]).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    // At the limit a fourth client is still served: the oldest dribbler, between requests,
    // gives its place up; the half-sent batch, in a request, keeps its own.
    let mut fourth = TcpStream::connect(&addr).unwrap();
    fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let served = read_until_closed(&mut fourth);
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");

    for d in &mut dribblers {
        assert_eq!(read_until_closed(d), "", "closed without an answer");
    }
    let timed_out = read_until_closed(&mut half_sender);
    assert!(timed_out.starts_with("HTTP/1.1 408"), "{timed_out}");
    assert!(timed_out.contains("within 2s"), "{timed_out}");

    // The service is whole: the same batch sent properly is accepted, not a duplicate.
    let agent = agent();
    assert_eq!(
        push(&agent, &aggregator.url, "gpu001", 0, &body).as_deref(),
        Some("accepted")
    );
    terminate(aggregator);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let query = Query::open(&Layout::new(dir.path())).await.unwrap();
        assert_eq!(
            scalar(&query, "SELECT COUNT(*) FROM samples").await,
            ROWS as i64
        );
    });
}

/// `slurm follow` against an aggregator whose config lacks an account one of its jobs names:
/// the aggregator refuses that job's events for good (422, naming the rows and field) and
/// stores the other job's; the follower sets the refused events aside beside its state file
/// with the answer and goes on (before, it retried that batch for ever and held back every
/// later one; then, the whole batch was refused with its one bad job).
#[test]
fn a_batch_the_aggregator_refuses_for_good_is_set_aside_and_the_follower_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let aggregator = start(&dir.path().join("agg"));
    let jobcomp = dir.path().join("jobcomp.log");
    let line = |id: u32, account: &str| {
        format!(
            "JobId={id} UserId=alice(1000) GroupId=alice(1000) Name=wrap JobState=COMPLETED \
             Partition=train TimeLimit=60 StartTime=2026-12-01T08:00:05 \
             EndTime=2026-12-01T08:01:05 NodeList=gpu001 NodeCnt=1 ProcCnt=2 WorkDir=/ \
             ReservationName= Tres=cpu=2,node=1,gres/gpu=2 Account={account} QOS=normal WcKey= \
             Cluster=test SubmitTime=2026-12-01T08:00:00 EligibleTime=2026-12-01T08:00:00 \
             DerivedExitCode=0:0 ExitCode=0:0\n"
        )
    };
    std::fs::write(&jobcomp, line(12, "team-a") + &line(13, "nosuch")).unwrap();
    let state = dir.path().join("follow.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "slurm",
            "follow",
            "--aggregator",
            &aggregator.url,
            "--jobcomp",
            jobcomp.to_str().unwrap(),
            "--state-file",
            state.to_str().unwrap(),
            "--once",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("set aside"), "{stderr}");
    let aside = dir.path().join("follow.json.refused/0.json");
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&aside).unwrap()).unwrap();
    assert_eq!(kept["status"], 422, "{kept}");
    let errors = kept["answer"]["errors"].as_array().unwrap();
    assert!(
        errors.iter().all(|e| e["field"] == "account") && !errors.is_empty(),
        "{kept}"
    );
    // What is left to post is job 13's events alone, without the stored batch's number.
    let jobs: std::collections::BTreeSet<&str> = kept["batch"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(jobs.into_iter().collect::<Vec<_>>(), ["13"], "{kept}");
    assert!(kept["batch"]["seq"].is_null(), "{kept}");
    assert_eq!(kept["sent_seq"], 0, "{kept}");
    let stored = kept["answer"]["stored_rows"].as_u64().unwrap();
    assert!(stored > 0, "{kept}");
    // Job 12's events were stored (its end counted as the aggregator takes it in), 13's not.
    let metrics = agent()
        .get(format!("{}/metrics", aggregator.url))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let finished: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("gpuledger_jobs_finished_total{") && !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        finished,
        ["gpuledger_jobs_finished_total{account=\"team-a\",outcome=\"completed\"} 1"],
        "{metrics}"
    );
    let follow_state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(
        follow_state["outbox"],
        serde_json::json!([]),
        "{follow_state}"
    );
    terminate(aggregator);
}
