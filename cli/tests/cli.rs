//! The binary as an operator meets it: a bad config file gets a message naming the file, the
//! line and the field, and a non-zero exit; a good one is summarised.

use std::path::{Path, PathBuf};
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
fn an_error_is_one_line_and_exit_status_1_even_with_backtraces_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.toml");
    std::fs::write(&path, "version = 1\n[cluster]\nname = 7\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(["check-config", path.to_str().unwrap()])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("cluster.toml"), "{stderr}");
    // A bad command line is clap's: status 2.
    assert_eq!(gpuledger(&["no-such-command"]).status.code(), Some(2));
}

/// `gpuledger ARGS`, which must exit within 20 s (a service that took them would run on).
fn refused_at_once(args: &[&str]) -> std::process::Output {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} was taken: the service runs");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

#[test]
fn job_limits_that_would_kill_every_job_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for (flag, value, says) in [
        (
            "--job-memory-per-gpu",
            "64",
            "`64` is 64B per GPU; at least 16MiB",
        ),
        ("--job-memory-per-gpu", "64XB", "not a valid size"),
        ("--job-cpus-per-gpu", "0.001", "at least 0.01 CPU per GPU"),
        ("--job-cpus-per-gpu", "1e3", "is not a number of CPUs"),
        ("--job-tasks-max", "3", "3 is not in 16.."),
        ("--job-tmp", "tmpfs", "invalid value 'tmpfs'"),
        ("--job-cpu-bind", "threads", "invalid value 'threads'"),
    ] {
        let out = refused_at_once(&["scheduler", "serve", "--data-dir", data, flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag) && stderr.contains(says), "{stderr}");
    }
    // Limits with no cgroup to hold them, cores without a count of them: it does not start.
    for (flags, says) in [
        (
            &["--cgroup", "off", "--job-memory-per-gpu", "1GiB"][..],
            "--cgroup: off, and limits per job",
        ),
        (
            &["--job-cpu-bind", "cores"][..],
            "--job-cpu-bind: cores: how many each job gets comes from --job-cpus-per-gpu",
        ),
    ] {
        let mut args = vec![
            "scheduler",
            "serve",
            "--data-dir",
            data,
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(flags);
        let out = refused_at_once(&args);
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn logs_are_json_lines_when_asked_and_never_coloured_when_not_on_a_terminal() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    for format in ["json", "text"] {
        let data = dir.path().join(format);
        let mut aggregator = gpuledger_testkit::spawn_binary(
            env!("CARGO_BIN_EXE_gpuledger"),
            &[
                "--log-format",
                format,
                "aggregator",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
            ],
            std::process::Stdio::piped(),
        );
        let mut line = String::new();
        std::io::BufReader::new(aggregator.child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // Without --tokens the aggregator warns that authentication is off.
        assert!(
            !line.contains('\u{1b}'),
            "{format}: colour codes in {line:?}"
        );
        if format == "json" {
            let event: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(event["level"], "WARN", "{line}");
            assert!(
                event["fields"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("authentication is off"),
                "{line}"
            );
        } else {
            assert!(
                line.contains(" WARN ") && line.contains("authentication is off"),
                "{line}"
            );
        }
        gpuledger_testkit::terminate(aggregator);
    }
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

/// Runs `gpuledger simulate` on a Philly trace of `rows` (its header added) with the VC sizes
/// `vcs` (`vc,node num` rows), on one node with exact limits, under `policy` and `more`
/// arguments; the files go in `dir` (`trace.csv`, `vc.csv`). The run must succeed: its output
/// folder.
fn simulate_philly(dir: &Path, rows: &str, vcs: &str, policy: &str, more: &[&str]) -> PathBuf {
    let (trace, vc_file, out) = (dir.join("trace.csv"), dir.join("vc.csv"), dir.join("out"));
    std::fs::write(
        &trace,
        format!("timestamp,duration,num_gpus,gpu_time,cluster\n{rows}"),
    )
    .unwrap();
    std::fs::write(&vc_file, format!("vc,node num\n{vcs}")).unwrap();
    let mut args = vec![
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--vc-nodes",
        vc_file.to_str().unwrap(),
        "--nodes",
        "1",
        "--policy",
        policy,
        "--limit-estimate",
        "exact",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    let run = gpuledger(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

#[test]
fn simulate_replays_a_philly_trace_and_writes_jobs_csv() {
    let dir = tempfile::tempdir().unwrap();
    let out = simulate_philly(
        dir.path(),
        "2017-09-04 10:00:00,100.0,8,800.0,aaa\n\
         2017-09-04 10:00:01,99.5,8,796.0,bbb\n\
         2017-09-04 10:00:02,50.0,16,800.0,aaa\n",
        "aaa,3\nbbb,1\n",
        "fifo",
        &[],
    );
    let vcs = dir.path().join("vc.csv");
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    // One node: the second job waits for the first (99 s), the third is larger than the
    // cluster and is refused at submission.
    assert_eq!(
        jobs,
        "job_id,account,gpus,submit,start,end,wait_s,jct_s,outcome,backfilled,preemptions,lost_gpu_s,gpu_share,own_backlog_s\n\
         p000001,vc-aaa,8,0,0,100,0,100,completed,false,0,0,,0\n\
         p000002,vc-bbb,8,1,100,200,99,199,completed,false,0,0,,0\n\
         p000003,vc-aaa,16,2,,,,,refused,false,0,0,,\n"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| 3 | 1 | 50 |"), "{report}");
    // vc-bbb had nothing of its own ahead: all of its 99 s wait was for vc-aaa's job.
    assert!(
        report.contains("the longest 99 s (p000002, vc-bbb)"),
        "{report}"
    );
    for svg in ["utilization.svg", "wait-by-account.svg"] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        assert!(report.contains(&format!("]({svg})")));
    }
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

/// An Alibaba pod list (`openb_pod_list.csv` in `dir`): its header, then `pods`.
fn pod_list(dir: &Path, pods: &str) -> PathBuf {
    let path = dir.join("openb_pod_list.csv");
    let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
                  creation_time,deletion_time,scheduled_time\n";
    std::fs::write(&path, format!("{header}{pods}")).unwrap();
    path
}

#[test]
fn simulate_replays_alibabas_gpu_sharing_pods_packing_shares_onto_one_gpu() {
    let dir = tempfile::tempdir().unwrap();
    // One 8-GPU node: a 7-GPU pod, four quarters of a GPU (the eighth GPU), a CPU-only pod
    // (left out), then a half that finds no GPU with room until the 7-GPU pod ends.
    let trace = pod_list(
        dir.path(),
        "seven,1000,1024,7,1000,,LS,Succeeded,1000,1100,1000\n\
         q1,1000,1024,1,250,,BE,Succeeded,1000,1200,1000\n\
         q2,1000,1024,1,250,,BE,Succeeded,1000,1200,1000\n\
         q3,1000,1024,1,250,,BE,Succeeded,1000,1200,1000\n\
         q4,1000,1024,1,250,,BE,Succeeded,1000,1200,1000\n\
         cpu,1000,1024,0,0,,BE,Succeeded,1000,1200,1000\n\
         half,1000,1024,1,500,,LS,Succeeded,1001,1101,1001\n",
    );
    let out = dir.path().join("out");
    let run = gpuledger(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--policy",
        "fifo",
        "--limit-estimate",
        "exact",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("6 GPU pods; left out 1 CPU-only and 0 never run"),
        "{stderr}"
    );
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let rows: Vec<&str> = jobs.lines().collect();
    assert_eq!(
        rows[1..],
        [
            "q1,qos-be,1,0,0,200,0,200,completed,false,0,0,250m,0",
            "q2,qos-be,1,0,0,200,0,200,completed,false,0,0,250m,50",
            "q3,qos-be,1,0,0,200,0,200,completed,false,0,0,250m,100",
            "q4,qos-be,1,0,0,200,0,200,completed,false,0,0,250m,150",
            "seven,qos-ls,7,0,0,100,0,100,completed,false,0,0,,0",
            "half,qos-ls,1,1,100,200,99,199,completed,false,0,0,500m,99",
        ]
    );
    // Own backlogs count parts of GPUs as their fraction: qos-be is owed the 1 GPU it asks for,
    // so each quarter-GPU job has the 50 GPU-s of each earlier one ahead of it (though all four
    // share one GPU at once); "half" has 99 s of "seven" left at qos-ls's 7 GPUs.
    // Busy GPU-seconds count parts: 7 x 100 + 4 x 0.25 x 200 + 0.5 x 100 = 950 of 8 x 200.
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("59.4%"), "{report}");
}

#[test]
fn simulate_on_alibabas_node_list_holds_each_pod_to_its_gpu_types() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("openb_node_list_gpu_node.csv");
    // A 2-GPU T4 node, a 2-GPU V100 32 GB node, a CPU node and a node of one GPU of a type
    // Alibaba does not disclose.
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\n\
         n1,64000,262144,2,T4\n\
         n2,96000,786432,2,V100M32\n\
         n3,96000,786432,0,\n\
         n4,96000,786432,1,G2\n",
    )
    .unwrap();
    // Half a V100 and a pod of two V100s at once: the two-V100 pod waits although a T4 is
    // free; a pod of any type takes that T4; one asking only for A10s is refused; one asking
    // for the undisclosed type runs on its node, and a second waits for it.
    let trace = pod_list(
        dir.path(),
        "t4pod,1,1,1,1000,T4,LS,Succeeded,1000,1100,1000\n\
         vpod,1,1,2,1000,V100M16|V100M32,LS,Succeeded,1000,1100,1000\n\
         v2,1,1,1,500,V100M32,BE,Succeeded,1000,1100,1000\n\
         any,1,1,1,1000,,BE,Succeeded,1001,1101,1001\n\
         a10,1,1,1,1000,A10,BE,Succeeded,1001,1101,1001\n\
         g2pod,1,1,1,1000,G2,LS,Succeeded,1000,1100,1000\n\
         g2next,1,1,1,1000,G2|A10,LS,Succeeded,1002,1102,1002\n",
    );
    let out = dir.path().join("out");
    let run = gpuledger(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--node-list",
        nodes.to_str().unwrap(),
        "--policy",
        "fifo+backfill",
        "--limit-estimate",
        "exact",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("on 3 nodes (5 GPUs)"), "{stdout}");
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let rows: Vec<&str> = jobs.lines().skip(1).collect();
    assert_eq!(
        rows,
        [
            "g2pod,qos-ls,1,0,0,100,0,100,completed,true,0,0,,0",
            "t4pod,qos-ls,1,0,0,100,0,100,completed,true,0,0,,29",
            "v2,qos-be,1,0,0,100,0,100,completed,false,0,0,500m,0",
            "vpod,qos-ls,2,0,100,200,100,200,completed,false,0,0,,57",
            "a10,qos-be,1,1,,,,,refused,false,0,0,,",
            "any,qos-be,1,1,1,101,0,100,completed,true,0,0,,33",
            "g2next,qos-ls,1,2,100,200,98,198,completed,false,0,0,,116",
        ]
    );
    // t4pod's own backlog: g2pod's 100 GPU-s at qos-ls's share of the 5 GPUs (4 over the
    // first second, 3.5 once "any" asks too; the refused a10 asks for nothing): 29 s.

    // A name that cannot be a GPU type is refused with its file, line and field.
    std::fs::write(&nodes, "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,2,G 9\n").unwrap();
    let run = gpuledger(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--node-list",
        nodes.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("openb_node_list_gpu_node.csv:2: `model`: `G 9` is not a GPU type"),
        "{stderr}"
    );
}

#[test]
fn simulate_reports_each_accounts_fair_share_week_by_week_under_a_configs_settings() {
    let dir = tempfile::tempdir().unwrap();
    // The config's weights replace the VC sizes for the accounts it names: aaa 3, bbb 1.
    let config = dir.path().join("settings.toml");
    let settings = gpuledger_sim::seed::SEED_CLUSTER_TOML.to_owned()
        + "\n[[accounts]]\nid = \"vc-aaa\"\nname = \"a\"\nweight = 3\n";
    std::fs::write(&config, settings).unwrap();
    // Two whole-node jobs of two days each on one node: aaa's runs first, bbb's after it.
    let out = simulate_philly(
        dir.path(),
        "2017-09-04 10:00:00,172800.0,8,1382400.0,aaa\n\
         2017-09-04 10:00:01,172800.0,8,1382400.0,bbb\n",
        "aaa,1\nbbb,1\n",
        "fifo+backfill",
        &["--config", config.to_str().unwrap()],
    );
    // While both wait or run the node is split 6:2; then bbb alone has all 8. aaa held 8 GPUs
    // for its 48 h against a fair 288 GPU-hours; bbb 384 against 480: 0.8 of its share.
    let weeks = std::fs::read_to_string(out.join("weeks.csv")).unwrap();
    assert_eq!(
        weeks,
        "account,week,fair_gpu_hours,received_gpu_hours,ratio\n\
         vc-aaa,0,288.00,384.00,1.333\n\
         vc-bbb,0,480.00,384.00,0.800\n"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| vc-aaa | 75.0% | 1 | 0 | 0 | 100% | 0 (1.33) | 0 |"),
        "{report}"
    );
    assert!(
        report.contains("| vc-bbb | 25.0% | 1 | 0 | 0 | 100% | 0 (0.80) | 0 |"),
        "{report}"
    );
    assert!(
        report.contains(
            "Jobs waiting more than 1 day: 1; 3 days: 0; 7 days: 0; the longest wait 2.0 days."
        ),
        "{report}"
    );
    assert!(
        report.contains("No account-week fell short of 0.8 of its fair share."),
        "{report}"
    );
}

#[test]
fn simulate_sets_long_waits_against_what_other_tenants_could_have_given_up() {
    let dir = tempfile::tempdir().unwrap();
    // One node; bbb (weight 3) holds it for 10 days, then aaa's four 1-day whole-node jobs run
    // one after another: they wait 10 to 13 days.
    let out = simulate_philly(
        dir.path(),
        "2017-09-04 10:00:00,864000.0,8,6912000.0,bbb\n\
         2017-09-04 10:00:01,86400.0,8,691200.0,aaa\n\
         2017-09-04 10:00:01,86400.0,8,691200.0,aaa\n\
         2017-09-04 10:00:01,86400.0,8,691200.0,aaa\n\
         2017-09-04 10:00:01,86400.0,8,691200.0,aaa\n",
        "aaa,1\nbbb,3\n",
        "fifo+backfill",
        &[],
    );
    // While bbb asks, aaa's share is 2 GPUs: the third and fourth jobs have 8 and 12 days of
    // aaa's own work ahead. Were bbb held to 0.8 of its 6, aaa would get 3.2: the fourth job
    // still waits 7.5 days for the 24 GPU-days before it; held to half (aaa at 5), 4.8 days.
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains(
            "Jobs waiting more than 7 days: 4, of which 2 had more than 7 days of their \
             account's own backlog ahead; 1 even with every other account at 0.8 of its share, \
             0 at half."
        ),
        "{report}"
    );
    assert!(
        report.contains("| vc-aaa | 4 | 2 | 1 / 0 | 13.0 | 10.0 |"),
        "{report}"
    );
    // aaa's first week was out of reach: bbb took the node a second before aaa asked, and
    // aaa's 2 GPUs of fair share for the week (0.8 of them: 269 GPU-hours) could only have
    // come back by preemption. In week 1 aaa had 0.84 of its share.
    assert!(
        report.contains(
            "The weeks below 0.8 of their fair shares were short of it by 269 GPU-hours in all, \
             269 of them (100%) out of reach without preemption (week 0); below half, 168 \
             GPU-hours short, 168 out of reach."
        ),
        "{report}"
    );
}

#[test]
fn simulate_runs_its_own_job_format_with_preemption_and_a_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        "version = 1\n[cluster]\nname = \"two\"\n[[node_pools]]\nname = \"p\"\nprefix = \"n\"\n\
         count = 2\ngpus_per_node = 8\ngpu_model = \"h100-sxm\"\n\
         [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
         [[partitions]]\nname = \"urgent\"\npriority_tier = 50\n\
         [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
         gpu_hour = { h100-sxm = \"1\" }\n\
         [[accounts]]\nid = \"a\"\nname = \"A\"\nweight = 1\n\
         [[accounts]]\nid = \"b\"\nname = \"B\"\nweight = 1\n",
    )
    .unwrap();
    // a fills both nodes for 4 h, checkpointing every 30 min; b's urgent job arrives after an
    // hour and preempts one of them, which ignores SIGTERM and is killed after the 5-minute
    // grace; b also holds node n002 from hour 10 to 12 by reservation.
    let jobs = dir.path().join("jobs.csv");
    std::fs::write(
        &jobs,
        "job_id,submit,account,gpus,run_time_s,checkpoint_every_s,partition,gpu_share\n\
         a1,2026-06-01T00:00:00Z,a,8,14400,1800,,\n\
         a2,2026-06-01T00:00:00Z,a,8,14400,1800,,\n\
         b1,2026-06-01T01:00:00Z,b,8,3600,,urgent,\n\
         b2,2026-06-01T10:00:00Z,b,8,3600,,,\n\
         a3,2026-06-01T09:00:00Z,a,16,7200,,,\n\
         s1,2026-06-01T15:00:00Z,a,1,3600,,,500m\n\
         s2,2026-06-01T15:00:00Z,b,1,3600,,,250m\n\
         s3,2026-06-01T15:00:00Z,b,1,1800,,,3g\n",
    )
    .unwrap();
    let reservations = dir.path().join("res.toml");
    std::fs::write(
        &reservations,
        "[[reservations]]\nname = \"b-window\"\nstart = \"2026-06-01T10:00:00Z\"\n\
         end = \"2026-06-01T12:00:00Z\"\naccounts = [\"b\"]\nnode_names = [\"n002\"]\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = gpuledger(&[
        "simulate",
        "--jobs",
        jobs.to_str().unwrap(),
        "--config",
        cluster.to_str().unwrap(),
        "--reservations",
        reservations.to_str().unwrap(),
        "--policy",
        "fifo+backfill",
        "--out",
        out.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--month",
        "2026-06",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The simulated month went through the aggregator's ingest path into Parquet and was
    // billed: every GPU-second the scheduler allocated (a preempted job's two runs included,
    // the parts of GPUs for their parts) is on an invoice.
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    let stored = stdout
        .lines()
        .find(|l| l.starts_with("stored 2026-06:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let numbers: Vec<i64> = stored
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (allocated, billed) = (numbers[numbers.len() - 2], numbers[numbers.len() - 1]);
    assert!(allocated > 0);
    assert_eq!(allocated, billed, "{stored}");
    for account in ["a", "b"] {
        assert!(dir
            .path()
            .join(format!("data/invoices/2026-06/{account}/r1.json"))
            .exists());
    }
    let csv = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let row = |id: &str| -> Vec<String> {
        csv.lines()
            .find(|l| l.starts_with(&format!("{id},")))
            .unwrap_or_else(|| panic!("{id} in {csv}"))
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    // b1 waits out the grace (300 s) and runs; the victim is preempted once and loses the
    // 5 minutes of 8 GPUs since its checkpoint at 1 h.
    assert_eq!(row("b1")[6], "300", "b1 waited {csv}");
    let victims: Vec<Vec<String>> = ["a1", "a2"].iter().map(|id| row(id)).collect();
    let preempted: Vec<&Vec<String>> = victims.iter().filter(|r| r[10] == "1").collect();
    assert_eq!(preempted.len(), 1, "{csv}");
    assert_eq!(preempted[0][11], (8 * 300).to_string(), "{csv}");
    // b2 runs inside its reservation on n002 at once; a3 needs both nodes for 2 h from 9:00,
    // which would run into the window, so it waits until the window ends at 12:00.
    assert_eq!(row("b2")[6], "0", "{csv}");
    assert_eq!(row("a3")[6], (3 * 3600).to_string(), "{csv}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("Preemptions: 1"), "{report}");
    // The parts of GPUs ran at once (they fit one GPU and a MIG one) and say their part.
    for (id, share) in [("s1", "500m"), ("s2", "250m"), ("s3", "3g")] {
        assert_eq!(row(id)[6], "0", "{csv}");
        assert_eq!(row(id)[12], share, "{csv}");
    }

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "submit,account,gpus,run_time_s\n0,a,eight,10\n").unwrap();
    let run = gpuledger(&[
        "simulate",
        "--jobs",
        bad.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr)
        .contains("bad.csv:2: `gpus`: `eight` is not a whole number"));
}

#[test]
fn without_tokens_the_services_refuse_an_address_other_hosts_can_reach() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    for args in [
        vec!["aggregator", "--listen", "0.0.0.0:0", "--data-dir", data],
        vec![
            "scheduler",
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            data,
        ],
    ] {
        let out = gpuledger(&args);
        assert!(!out.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("refusing to listen on 0.0.0.0:0 without authentication")
                && stderr.contains("--tokens"),
            "{stderr}"
        );
    }
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_itself() {
    let out = gpuledger(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    for word in ["_gpuledger", "scheduler", "check-config", "--exporters"] {
        assert!(script.contains(word), "the bash script lacks {word}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpuledger.bash");
    std::fs::write(&file, &script).unwrap();
    let syntax = Command::new("bash")
        .args(["-n", file.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(syntax.success(), "bash reads the script");
    for shell in ["zsh", "fish"] {
        let out = gpuledger(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let man = dir.path().join("man1");
    let out = gpuledger(&["man", "--out", man.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(man.join("gpuledger-scheduler-submit.1")).unwrap();
    assert!(page.starts_with(".ie") || page.contains(".TH"), "{page}");
    assert!(page.contains("gpuledger\\-scheduler\\-submit"), "{page}");
    assert!(page.contains("account"), "its options: {page}");
    for name in ["gpuledger.1", "gpuledger-up.1", "gpuledger-slurm-steer.1"] {
        assert!(man.join(name).exists(), "{name}");
    }
    assert!(!man.join("gpuledger-help.1").exists());
}

#[test]
fn check_config_passes_every_shipped_example_and_tells_their_kinds_apart() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let out = gpuledger(&["check-config", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        let name = path.file_name().unwrap().to_str().unwrap();
        let kind = match name {
            "seed-cluster.toml" => "cluster `seed`",
            "seed-prices.toml" => "price book",
            "seed-demo.toml" => "demo spec",
            "exporter.toml" => "exporter config for node gpu001",
            other => panic!("a new example, {other}: say what check-config must call it"),
        };
        assert!(said.contains(kind), "{name}: {said}");
        checked += 1;
    }
    assert_eq!(checked, 4);
    // An exporter config with a bad value names the file and the option.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("exporter.toml");
    std::fs::write(&bad, "node = \"gpu001\"\nsource = \"quantum\"\n").unwrap();
    let out = gpuledger(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exporter.toml") && err.contains("quantum"),
        "{err}"
    );
    let neither = dir.path().join("what.toml");
    std::fs::write(&neither, "x = 1\n").unwrap();
    let out = gpuledger(&["check-config", neither.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kind"));
}
