//! gpuledger beside a real Slurm (Debian's slurm-wlm and munge; see `common::slurm`): a
//! `slurmctld` and a `slurmd` with 8 GPUs as GRES run jobs of two accounts (two complete, one
//! fails, one is cancelled while it runs, one while it waits). gpuledger's prolog labels the
//! GPUs for the exporter; `gpuledger slurm follow` reads squeue, scontrol and the jobcomp log
//! and posts the jobs' events to a real aggregator. Then the month's invoice, billed by
//! allocation, charges each account exactly its jobs' GPUs x elapsed seconds as Slurm reports
//! them, and the aggregator's queue waits and success rates are Slurm's. Reading the same jobs
//! again from scratch changes nothing.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::slurm::Slurm;
use common::{scrape, spawn, terminate, wait_for, Process};

const CONFIG: &str = r#"version = 1
[cluster]
name = "gpuledgertest"
[[node_pools]]
name = "p"
prefix = "node"
count = 1
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10.00" }
[[accounts]]
id = "teama"
name = "Team A"
weight = 1
[[accounts]]
id = "teamb"
name = "Team B"
weight = 1
"#;

/// What Slurm's completion log says of a job: (account, state, submit, start, end) in Unix
/// seconds, read here with plain string handling, not gpuledger's parser: each field's last
/// mention, since a job's name (printed before them) may mention one too.
fn slurm_reports(jobcomp: &str) -> BTreeMap<String, (String, String, i64, i64, i64)> {
    let time = |v: &str| -> i64 {
        let naive = chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S").unwrap();
        chrono::TimeZone::from_local_datetime(&chrono::Local, &naive)
            .earliest()
            .unwrap()
            .timestamp()
    };
    let mut out = BTreeMap::new();
    for line in jobcomp.lines() {
        let field = |k: &str| {
            line.split_whitespace()
                .rev()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or("")
                .to_owned()
        };
        out.insert(
            field("JobId"),
            (
                field("Account"),
                field("JobState"),
                time(&field("SubmitTime")),
                time(&field("StartTime")),
                time(&field("EndTime")),
            ),
        );
    }
    out
}

fn follower(slurm: &Slurm, aggregator: &str, state: &std::path::Path, once: bool) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    cmd.args([
        "slurm",
        "follow",
        "--aggregator",
        aggregator,
        "--squeue",
        "--jobcomp",
        slurm.jobcomp.to_str().unwrap(),
        "--state-file",
        state.to_str().unwrap(),
        "--interval",
        "500ms",
    ])
    .env("SLURM_CONF", &slurm.conf)
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if once {
        cmd.arg("--once");
    }
    // A Process, so that a failing test does not leave the follower running.
    Process {
        child: cmd.spawn().unwrap(),
        url: String::new(),
    }
}

#[test]
fn a_real_slurm_cluster_is_billed_its_jobs_gpus_times_elapsed() {
    let slurm = Slurm::start("teama teama\nteamb teamb\n");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let data = dir.path().join("agg");
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--flush-interval",
            "1s",
        ],
        Stdio::inherit(),
    );
    let exporter: Process = spawn(
        &[
            "exporter",
            "--node",
            &slurm.node,
            "--gpus",
            "8",
            "--sample-interval",
            "1s",
            "--push-interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--aggregator-url",
            &aggregator.url,
            "--job-mapping-dir",
            slurm.job_mapping.to_str().unwrap(),
            "--spool-dir",
            dir.path().join("spool").to_str().unwrap(),
        ],
        Stdio::inherit(),
    );
    let state = dir.path().join("follow.json");
    let follow = follower(&slurm, &aggregator.url, &state, false);

    let gpus: BTreeMap<String, u32> = [
        (slurm.sbatch("teama", "gpu:h100:3", 2, "sleep 5"), 3),
        (slurm.sbatch("teamb", "gpu:2", 1, "sleep 3; exit 3"), 2),
        (slurm.sbatch("teamb", "gpu:8", 2, "sleep 120"), 8),
        // Named to pass for teamb's job where a reader takes the first `Account=` it sees.
        (
            slurm.sbatch_with(
                "teama",
                "gpu:1",
                1,
                "sleep 2",
                &["--job-name=x Account=teamb UserId=bob(1001)"],
            ),
            1,
        ),
    ]
    .into_iter()
    .collect();
    let ids: Vec<String> = gpus.keys().cloned().collect();
    let (a1, b2) = (ids[0].clone(), ids[2].clone());
    // The prolog labelled job A1's three GPUs; the exporter shows them.
    slurm.wait_state(&a1, &["RUNNING"]);
    wait_for("the exporter to label A1's GPUs", 30, || {
        scrape(&exporter.url)
            .matches(&format!("hpc_job=\"{a1}\",account=\"teama\""))
            .count()
            >= 3 * 3
    });
    // B2 takes every GPU once A1 and B1 are done; a job queued behind it is cancelled while it
    // waits, then B2 while it runs.
    slurm.wait_state(&b2, &["RUNNING"]);
    let c = slurm.sbatch("teamb", "gpu:8", 1, "sleep 5");
    slurm.wait_state(&c, &["PENDING"]);
    std::thread::sleep(Duration::from_millis(1500));
    slurm.command("scancel", &[&c]);
    std::thread::sleep(Duration::from_millis(2500));
    slurm.command("scancel", &[&b2]);
    for id in ids.iter().chain([&c]) {
        slurm.wait_state(id, &["COMPLETED", "FAILED", "CANCELLED"]);
    }
    wait_for("Slurm to log every job's completion", 30, || {
        std::fs::read_to_string(&slurm.jobcomp)
            .unwrap_or_default()
            .lines()
            .count()
            == 5
    });
    wait_for("the follower to deliver every end", 30, || {
        let page = scrape(&aggregator.url);
        page.contains("gpuledger_jobs_finished_total{account=\"teama\",outcome=\"completed\"} 2")
            && page
                .contains("gpuledger_jobs_finished_total{account=\"teamb\",outcome=\"failed\"} 1")
            && page.contains(
                "gpuledger_jobs_finished_total{account=\"teamb\",outcome=\"cancelled\"} 2",
            )
    });
    // The follower stops cleanly on SIGTERM.
    terminate(follow);
    terminate(exporter);
    // The aggregator took every batch of both: the Slurm node is one the config defines.
    assert!(!dir.path().join("follow.json.refused").exists());
    let rejected = dir.path().join("spool/rejected");
    assert!(
        std::fs::read_dir(&rejected).map_or(true, |mut d| d.next().is_none()),
        "the exporter's batches were refused: {}",
        rejected.display()
    );

    // What Slurm reports, and what gpuledger must bill from it.
    let reports = slurm_reports(&std::fs::read_to_string(&slurm.jobcomp).unwrap());
    assert_eq!(reports[&c].1, "CANCELLED");
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for (id, g) in &gpus {
        let (_, _, _, start, end) = reports[id];
        expected.insert(id.clone(), i64::from(*g) * (end - start));
    }
    assert!(
        expected[&b2] >= 8 * 2,
        "B2 ran before it was cancelled: {expected:?}"
    );

    // Bill every month the jobs touched, by allocation.
    let mut months: Vec<String> = reports
        .values()
        .flat_map(|r| [r.3, r.4])
        .map(|t| {
            chrono::DateTime::from_timestamp(t, 0)
                .unwrap()
                .format("%Y-%m")
                .to_string()
        })
        .collect();
    months.sort();
    months.dedup();
    std::thread::sleep(Duration::from_millis(1500));
    let billed = |data: &std::path::Path| -> BTreeMap<String, i64> {
        let mut per_job = BTreeMap::new();
        for month in &months {
            let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
                .args([
                    "invoice",
                    "--month",
                    month,
                    "--usage",
                    "allocation",
                    "--data-dir",
                    data.to_str().unwrap(),
                    "--config",
                    config.to_str().unwrap(),
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "invoice: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for account in ["teama", "teamb"] {
                let dir = data.join(format!("invoices/{month}/{account}"));
                let mut revisions: Vec<_> = std::fs::read_dir(&dir)
                    .map(|d| {
                        d.filter_map(|e| e.ok())
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|x| x == "json"))
                            .collect()
                    })
                    .unwrap_or_default();
                revisions.sort();
                let Some(latest) = revisions.last() else {
                    continue;
                };
                let inv: Value =
                    serde_json::from_str(&std::fs::read_to_string(latest).unwrap()).unwrap();
                for line in inv["lines"].as_array().unwrap() {
                    for part in line["jobs"].as_array().unwrap() {
                        *per_job
                            .entry(part["job_id"].as_str().unwrap().to_owned())
                            .or_default() += part["gpu_seconds"].as_i64().unwrap();
                    }
                }
            }
        }
        per_job
    };
    let first = billed(&data);
    assert_eq!(
        first, expected,
        "each job billed its GPUs x Slurm's elapsed seconds"
    );

    // Queue waits and success as Slurm reports them.
    let (from, to) = (
        reports.values().map(|r| r.2).min().unwrap() - 60,
        reports.values().map(|r| r.4).max().unwrap() + 60,
    );
    for account in ["teama", "teamb"] {
        let mine: Vec<&(String, String, i64, i64, i64)> =
            reports.values().filter(|r| r.0 == account).collect();
        // A job cancelled while it waited never started: Slurm logs its start as its end.
        let waits: Vec<i64> = mine
            .iter()
            .filter(|r| !(r.1 == "CANCELLED" && r.3 == r.4))
            .map(|r| r.3 - r.2)
            .collect();
        let completed = mine.iter().filter(|r| r.1 == "COMPLETED").count() as f64;
        let mut r = ureq::get(format!(
            "{}/api/v1/accounts/{account}/summary?from={}&to={}",
            aggregator.url,
            from * 1000,
            to * 1000
        ))
        .call()
        .unwrap();
        let s: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(
            s["jobs"].as_u64(),
            Some(mine.len() as u64),
            "{account}: {s}"
        );
        assert_eq!(
            s["success_rate"].as_f64(),
            Some(completed / mine.len() as f64),
            "{account}: {s}"
        );
        let max_wait = s["max_queue_wait_s"].as_f64().unwrap_or(-1.0);
        let slurm_max = waits.iter().copied().max().unwrap_or(0) as f64;
        assert_eq!(
            max_wait, slurm_max,
            "{account}: the longest wait, start - submit as Slurm reports: {s}"
        );
    }

    // The same jobs read again by a follower that remembers nothing: the bill does not move.
    let status = follower(
        &slurm,
        &aggregator.url,
        &dir.path().join("fresh.json"),
        true,
    )
    .child
    .wait()
    .unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        billed(&data),
        first,
        "reading the jobs twice bills them once"
    );
    terminate(aggregator);
}
