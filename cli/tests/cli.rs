//! The binary as an operator meets it: a bad config file gets a message naming the file, the
//! line and the field, and a non-zero exit; a good one is summarised.

use std::process::Command;

fn gpuledger(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .expect("runs")
}

#[test]
fn check_config_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.toml");
    let seed = include_str!("../../examples/seed-cluster.toml");
    let bad = seed.replacen("priority_tier = 20", "priority_tier = 0", 1);
    std::fs::write(&path, &bad).unwrap();
    let out = gpuledger(&["check-config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = bad
        .lines()
        .position(|l| l.contains("priority_tier = 0"))
        .unwrap()
        + 1;
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "line {line}: `partitions[1].priority_tier`: 0 is out of range; use 1 to 100"
        )),
        "{stderr}"
    );
}

#[test]
fn check_config_summarises_a_good_file() {
    let out = gpuledger(&[
        "check-config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-cluster.toml"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("64 nodes, 512 GPUs, 3 partitions, 10 accounts"),
        "{stdout}"
    );
}

#[test]
fn invoice_refuses_a_malformed_month() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpuledger(&[
        "invoice",
        "--month",
        "2026-13",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--month") && stderr.contains("`2026-13` is not a month; write YYYY-MM"),
        "{stderr}"
    );
}

#[test]
fn a_short_demo_writes_parquet_and_invoices_that_invoice_reproduces() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let out = gpuledger(&["demo", "--days", "1", "--data-dir", data]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("(equal)"),
        "allocated and billed GPU-seconds agree: {stdout}"
    );
    let month = dir.path().join("data/invoices/2026-06");
    let read = |p: &str| std::fs::read(month.join(p)).unwrap();
    let (team_a, focus) = (read("team-a/r1.csv"), read("focus-2026-06.csv"));
    // `invoice` re-prices the stored month: unchanged data, the same bytes and no new revision.
    let out = gpuledger(&["invoice", "--month", "2026-06", "--data-dir", data]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(team_a, read("team-a/r1.csv"));
    assert_eq!(focus, read("focus-2026-06.csv"));
    assert!(!month.join("team-a/r2.csv").exists());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| team-d |"),
        "the comparison covers every account: {stdout}"
    );

    // Storage that arrives late: team-d (billed compute and storage) gets revision 2 with a
    // correction line; nobody else's invoice changes.
    let tenants = dir.path().join("tenants");
    std::fs::create_dir_all(tenants.join("team-d/ckpt")).unwrap();
    std::fs::write(tenants.join("team-d/ckpt/model.bin"), vec![7u8; 2_000_000]).unwrap();
    std::fs::create_dir_all(tenants.join("not-a-team")).unwrap();
    let scan = gpuledger(&[
        "storage-scan",
        "--root",
        tenants.to_str().unwrap(),
        "--data-dir",
        data,
        "--at",
        "2026-06-01T00:00:00Z",
    ]);
    let scan_out = String::from_utf8_lossy(&scan.stdout);
    assert!(
        scan.status.success(),
        "{}",
        String::from_utf8_lossy(&scan.stderr)
    );
    assert!(
        scan_out.contains("skipped (not accounts): not-a-team"),
        "{scan_out}"
    );
    let out = gpuledger(&["invoice", "--month", "2026-06", "--data-dir", data]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r2 = String::from_utf8_lossy(&read("team-d/r2.csv")).into_owned();
    // 2 MB for one day (max_hold) = 0.000002 TB-days.
    assert!(
        r2.lines()
            .any(|l| l.contains(",2,true,ckpt,storage,") && l.contains(",0.000002,TB-day,")),
        "{r2}"
    );
    assert!(!month.join("team-a/r2.csv").exists());
    assert_eq!(team_a, read("team-a/r1.csv"));
    let report = gpuledger(&[
        "report",
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-02",
        "--data-dir",
        data,
    ]);
    assert!(report.status.success());
    let report = String::from_utf8_lossy(&report.stdout);
    assert!(report.contains("team-a"), "{report}");
    assert!(report.contains("cluster utilization "), "{report}");
}

#[test]
fn simulate_replays_a_philly_trace_and_writes_jobs_csv() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let vcs = dir.path().join("vc.csv");
    std::fs::write(
        &trace,
        "timestamp,duration,num_gpus,gpu_time,cluster\n\
         2017-09-04 10:00:00,100.0,8,800.0,aaa\n\
         2017-09-04 10:00:01,99.5,8,796.0,bbb\n\
         2017-09-04 10:00:02,50.0,16,800.0,aaa\n",
    )
    .unwrap();
    std::fs::write(&vcs, "vc,node num\naaa,3\nbbb,1\n").unwrap();
    let out = dir.path().join("out");
    let run = gpuledger(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--vc-nodes",
        vcs.to_str().unwrap(),
        "--nodes",
        "1",
        "--policy",
        "fifo",
        "--limit-estimate",
        "exact",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    // One node: the second job waits for the first (99 s), the third is larger than the
    // cluster and is refused at submission.
    assert_eq!(
        jobs,
        "job_id,account,gpus,submit,start,end,wait_s,jct_s,outcome,backfilled\n\
         p000001,vc-aaa,8,0,0,100,0,100,completed,false\n\
         p000002,vc-bbb,8,1,100,200,99,199,completed,false\n\
         p000003,vc-aaa,16,2,,,,,refused,false\n"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| 3 | 1 | 50 |"), "{report}");
    assert!(report.contains("| vc-aaa | 75.0% |"), "{report}");

    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,abc,8,1,aaa\n",
    )
    .unwrap();
    let run = gpuledger(&[
        "simulate",
        "--trace",
        bad.to_str().unwrap(),
        "--vc-nodes",
        vcs.to_str().unwrap(),
        "--nodes",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr)
        .contains("bad.csv:2: `duration`: `abc` is not a number of seconds"));
}
