//! `gpuledger slurm steer` against a real Slurm (`slurmctld` and `slurmd`, see `common::slurm`)
//! under `PriorityType=priority/multifactor`, with a real aggregator holding measured usage:
//!
//! - two accounts with equal Slurm shares queue behind a job that holds every GPU; by
//!   Slurm's own order the older job (of the account that used far more GPU-seconds by
//!   gpuledger's telemetry) starts first; with `steer` running the lighter account's job does;
//! - an account past its GPU-hours for the day has its new job held with the reason in its
//!   comment, kept held across a restart without a second action, and released with its comment
//!   put back when the window rolls (a pass `--at` the next UTC day); a job its user held is
//!   never touched;
//! - with `below_share_first` (the default), an account holding less than its share of the
//!   config's GPUs now goes first, though it used more and its job is younger.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::ingest::{agent, batch_of};
use common::slurm::Slurm;
use common::{add_token, spawn, terminate, wait_for, Process};

/// Ranked by usage alone (`below_share_first = false`): the test's blocker is team B's, so
/// team B holds the node while its next job waits, and ranking accounts below their share now
/// first would put team A first; the test's last part turns it back on to see that it does.
const CONFIG: &str = r#"version = 1
[cluster]
name = "gpuledgertest"
[[node_pools]]
name = "p"
prefix = "gpu"
count = 1
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[telemetry]
allocations = "none"
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
[[accounts]]
id = "teamc"
name = "Team C"
weight = 1
quota = { gpu_hours_per_day = 1 }
[scheduler]
below_share_first = false
"#;

/// Multifactor priority with no term of its own that could tell the two accounts apart (no
/// slurmdbd, so no Slurm fair share): the site factor is what steering moves.
const MULTIFACTOR: &str = "PriorityType=priority/multifactor\nPriorityWeightAge=1000\n\
    PriorityMaxAge=7-0\nPriorityWeightFairshare=0\nPriorityWeightJobSize=0\n";

/// Each job Slurm knows: (account, state, reason, comment, start time), read from
/// `squeue --json` with plain JSON handling, not gpuledger's parser.
fn jobs(
    slurm: &Slurm,
) -> std::collections::BTreeMap<String, (String, String, String, String, i64)> {
    let doc: Value = serde_json::from_str(&slurm.command("squeue", &["--json"])).unwrap();
    let number = |v: &Value| match v {
        Value::Object(o) => o["number"].as_i64().unwrap_or(0),
        v => v.as_i64().unwrap_or(0),
    };
    doc["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let state = match &j["job_state"] {
                Value::Array(a) => a[0].as_str().unwrap().to_owned(),
                s => s.as_str().unwrap().to_owned(),
            };
            (
                number(&j["job_id"]).to_string(),
                (
                    j["account"].as_str().unwrap().to_owned(),
                    state,
                    j["state_reason"].as_str().unwrap().to_owned(),
                    j["comment"].as_str().unwrap_or("").to_owned(),
                    number(&j["start_time"]),
                ),
            )
        })
        .collect()
}

/// The site factor of each pending job, as `sprio` shows it.
fn site_factors(slurm: &Slurm) -> std::collections::BTreeMap<String, i64> {
    slurm
        .command("sprio", &["--noheader", "--format=%i %S"])
        .lines()
        .filter_map(|l| {
            let mut c = l.split_whitespace();
            Some((c.next()?.to_owned(), c.next()?.parse().ok()?))
        })
        .collect()
}

/// Which of two jobs queued behind `blocker` started first, once both have started.
fn first_to_start(slurm: &Slurm, blocker: &str, a: &str, b: &str) -> String {
    slurm.wait_state(blocker, &["COMPLETED"]);
    for id in [a, b] {
        slurm.wait_state(id, &["RUNNING", "COMPLETED"]);
    }
    let all = jobs(slurm);
    let (start_a, start_b) = (all[a].4, all[b].4);
    assert_ne!(
        start_a, start_b,
        "each job takes all 8 GPUs: one after the other"
    );
    if start_a < start_b {
        a.to_owned()
    } else {
        b.to_owned()
    }
}

fn steer_command(
    slurm: &Slurm,
    aggregator: &str,
    token: &std::path::Path,
    config: Option<&std::path::Path>,
    state: &std::path::Path,
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    cmd.args([
        "slurm",
        "steer",
        "--aggregator",
        aggregator,
        "--aggregator-token-file",
        token.to_str().unwrap(),
        "--state-file",
        state.to_str().unwrap(),
        "--interval",
        "300ms",
    ]);
    if let Some(config) = config {
        cmd.args(["--config", config.to_str().unwrap()]);
    }
    cmd.args(extra).env("SLURM_CONF", &slurm.conf);
    cmd
}

#[test]
fn measured_usage_reorders_slurms_queue_and_gpu_hour_quotas_hold_and_release_jobs() {
    // Usage is dated minutes back and the scenario takes a minute or two: keep both inside
    // one UTC day (a run begun at 23:59 saw the day's usage drop to nothing at midnight, and
    // the hold it waited for never came).
    let since_midnight = chrono::Utc::now().timestamp().rem_euclid(86_400);
    let into_the_day = 900;
    let before_midnight = 86_400 - 300;
    let wait = if since_midnight < into_the_day {
        into_the_day - since_midnight
    } else if since_midnight > before_midnight {
        86_400 - since_midnight + into_the_day
    } else {
        0
    };
    std::thread::sleep(Duration::from_secs(wait as u64));
    let slurm = Slurm::start_with("", MULTIFACTOR);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = add_token(tokens_arg, "operator", "steer", &[]);
    let node = add_token(tokens_arg, "node", "gpu001", &["--node", "gpu001"]);
    let token_file = dir.path().join("operator.token");
    std::fs::write(&token_file, &operator).unwrap();
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("agg").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--tokens",
            tokens_arg,
            "--flush-interval",
            "1s",
        ],
        Stdio::inherit(),
    );

    // Measured usage: team A 8 GPUs for 100 s, team C 8 GPUs for 400 s (3,200 GPU-seconds of
    // its 3,600 a day), team B nothing.
    let now_ms = chrono::Utc::now().timestamp_millis();
    let http = agent();
    for (seq, account, t0_ms, seconds) in [
        (1, "teama", now_ms - 520_000, 100),
        (2, "teamc", now_ms - 410_000, 400),
    ] {
        // Batch `seq` starts `seq` batches' length after the time it is given.
        let first_ms = t0_ms - seq as i64 * seconds as i64 * 1000;
        let body = batch_of("gpu001", seq, first_ms, seconds * 8, account);
        let mut r = http
            .post(format!("{}/api/v1/ingest", aggregator.url))
            .header(gpuledger_model::wire::NODE_HEADER, "gpu001")
            .header(gpuledger_model::wire::SEQ_HEADER, seq.to_string())
            .header("authorization", format!("Bearer {node}"))
            .send(&body[..])
            .unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        assert_eq!(r.status().as_u16(), 200, "{text}");
    }
    let feed = || -> Value {
        let mut r = http
            .get(format!("{}/api/v1/usage", aggregator.url))
            .header("authorization", format!("Bearer {operator}"))
            .call()
            .unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    wait_for(
        "the usage feed to count both accounts' GPU-seconds",
        30,
        || {
            let f = feed();
            f["accounts"]["teama"]["window"]["day_gpu_s"] == 800
                && f["accounts"]["teamc"]["window"]["day_gpu_s"] == 3200
        },
    );

    // Without steering: Slurm's own order, the older job first.
    let blocker = slurm.sbatch("teamb", "gpu:8", 1, "sleep 4");
    slurm.wait_state(&blocker, &["RUNNING"]);
    let a1 = slurm.sbatch("teama", "gpu:8", 1, "sleep 2");
    std::thread::sleep(Duration::from_millis(1100));
    let b1 = slurm.sbatch("teamb", "gpu:8", 1, "sleep 2");
    assert_eq!(
        first_to_start(&slurm, &blocker, &a1, &b1),
        a1,
        "without steering, Slurm's order holds"
    );

    // With steering: team B used nothing, team A 800 GPU-seconds: B's job goes first.
    let state = dir.path().join("steer.json");
    // A Process, so that a failing test does not leave steer running.
    let steer = Process {
        child: steer_command(
            &slurm,
            &aggregator.url,
            &token_file,
            Some(&config),
            &state,
            &[],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap(),
        url: String::new(),
    };
    slurm.wait_state(&b1, &["COMPLETED"]);
    let blocker = slurm.sbatch("teamb", "gpu:8", 1, "sleep 6");
    slurm.wait_state(&blocker, &["RUNNING"]);
    let a2 = slurm.sbatch("teama", "gpu:8", 1, "sleep 2");
    std::thread::sleep(Duration::from_millis(1100));
    let b2 = slurm.sbatch("teamb", "gpu:8", 1, "sleep 2");
    wait_for("steer to set both jobs' site factors", 30, || {
        let f = site_factors(&slurm);
        f.get(&b2).copied().unwrap_or(0) > f.get(&a2).copied().unwrap_or(0)
            && f.get(&a2).copied().unwrap_or(0) > 0
    });
    let f = site_factors(&slurm);
    assert_eq!(
        f[&b2], 10_000,
        "team B ranks first of three under Fair Tree: {f:?}"
    );
    assert_eq!(f[&a2], 6_667, "team A second of three: {f:?}");
    assert_eq!(
        first_to_start(&slurm, &blocker, &a2, &b2),
        b2,
        "with steering, the lighter account's job starts first"
    );

    // Team C's new job would pass its day's GPU-hours: held, the reason in its comment. A job
    // its user holds is not steer's to touch.
    slurm.wait_state(&a2, &["COMPLETED"]);
    let blocker = slurm.sbatch("teamb", "gpu:8", 1, "sleep 30");
    slurm.wait_state(&blocker, &["RUNNING"]);
    let c1 = slurm.sbatch_with("teamc", "gpu:8", 1, "sleep 1", &["--comment=nightly eval"]);
    let c2 = slurm.sbatch_with("teamc", "gpu:8", 1, "sleep 1", &["--hold", "--comment=ops"]);
    wait_for("steer to hold team C's job", 30, || {
        let j = jobs(&slurm);
        j[&c1].2 == "JobHeldAdmin" && j[&c1].3 == "gpuledger: AssocGrpGPUHoursPerDay"
    });
    // Steer stops cleanly on SIGTERM.
    terminate(steer);
    let saved = std::fs::read_to_string(&state).unwrap();
    assert!(saved.contains(&format!("\"{c1}\"")), "{saved}");

    // A restart changes nothing that is already so.
    let out = steer_command(
        &slurm,
        &aggregator.url,
        &token_file,
        Some(&config),
        &state,
        &["--once", "--dry-run"],
    )
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains(&format!("job {c1}")),
        "nothing to do for {c1}: {said}"
    );
    let status = steer_command(
        &slurm,
        &aggregator.url,
        &token_file,
        Some(&config),
        &state,
        &["--once"],
    )
    .status()
    .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        saved,
        "no second hold"
    );

    // The next UTC day: a dry run says it would release, a pass does, comment put back.
    let tomorrow = (chrono::Utc::now().timestamp().div_euclid(86_400) + 1) * 86_400 + 30;
    let at = tomorrow.to_string();
    let out = steer_command(
        &slurm,
        &aggregator.url,
        &token_file,
        Some(&config),
        &state,
        &["--dry-run", "--at", &at],
    )
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("job {c1}: release")), "{said}");
    assert_eq!(
        jobs(&slurm)[&c1].2,
        "JobHeldAdmin",
        "a dry run changes nothing"
    );
    let status = steer_command(
        &slurm,
        &aggregator.url,
        &token_file,
        Some(&config),
        &state,
        &["--once", "--at", &at],
    )
    .status()
    .unwrap();
    assert!(status.success());
    let j = jobs(&slurm);
    assert_ne!(j[&c1].2, "JobHeldAdmin", "released: {:?}", j[&c1]);
    assert_eq!(j[&c1].3, "nightly eval", "its own comment is back");
    assert_eq!(j[&c2].2, "JobHeldUser", "the user's hold stands");
    assert_eq!(j[&c2].3, "ops");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved["holds"], serde_json::json!({}), "{saved}");
    slurm.command("scancel", &[&blocker]);
    slurm.wait_state(&c1, &["COMPLETED"]);

    // With the default `below_share_first`: team B holds the node (more than its half of the 8
    // GPUs), team A nothing. Team B's job is older and its account used less, so Slurm's order
    // and usage alone both put it first; team A's goes first because it is below its share now.
    // Without a config the same holds of the GPUs `sinfo` shows (the node's 8).
    let config = dir.path().join("cluster-below-share.toml");
    std::fs::write(&config, CONFIG.replace("below_share_first = false\n", "")).unwrap();
    let blocker = slurm.sbatch("teamb", "gpu:8", 1, "sleep 10");
    slurm.wait_state(&blocker, &["RUNNING"]);
    let b3 = slurm.sbatch("teamb", "gpu:8", 1, "sleep 2");
    std::thread::sleep(Duration::from_millis(1100));
    let a3 = slurm.sbatch("teama", "gpu:8", 1, "sleep 2");
    for (n, config) in [(0, Some(&config)), (1, None)] {
        if n > 0 {
            // Back to Slurm's own order, for the next pass to set again.
            for job in [&a3, &b3] {
                slurm.command(
                    "scontrol",
                    &["update", &format!("JobId={job}"), "SiteFactor=0"],
                );
            }
            assert_eq!(site_factors(&slurm)[&a3], 0);
        }
        let out = steer_command(
            &slurm,
            &aggregator.url,
            &token_file,
            config.map(|c| c.as_path()),
            &dir.path().join(format!("steer-below-share-{n}.json")),
            &["--once"],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = site_factors(&slurm);
        assert!(
            f[&a3] > f[&b3],
            "team A below its share ranks first ({}): {f:?}",
            if config.is_some() { "config" } else { "sinfo" }
        );
    }
    assert_eq!(
        first_to_start(&slurm, &blocker, &a3, &b3),
        a3,
        "the account holding nothing starts first, whatever its past use"
    );
    terminate(aggregator);
}

#[test]
fn a_steer_without_a_usable_feed_or_with_bad_options_refuses_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
            .args(["slurm", "steer", "--config", config.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--aggregator", "http://127.0.0.1:1", "--at", "1"]);
    assert!(err.contains("--at fixes the time"), "{err}");
    let err = run(&[
        "--aggregator",
        "http://127.0.0.1:1",
        "--no-fair-share",
        "--no-quotas",
    ]);
    assert!(err.contains("nothing to do"), "{err}");
    std::fs::write(
        &config,
        CONFIG.replace("weight = 1\n", "weight = 1\nbogus = 2\n"),
    )
    .unwrap();
    let err = run(&["--aggregator", "http://127.0.0.1:1", "--once"]);
    assert!(
        err.contains("cluster.toml") && err.contains("bogus"),
        "{err}"
    );
}
