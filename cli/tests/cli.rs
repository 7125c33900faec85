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
    assert!(String::from_utf8_lossy(&out.stderr).contains("--month `2026-13` is not YYYY-MM"));
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
    let team_a =
        std::fs::read_to_string(dir.path().join("data/invoices/2026-06/team-a.csv")).unwrap();
    // `invoice` re-prices the stored month and must write the same bytes.
    let out = gpuledger(&["invoice", "--month", "2026-06", "--data-dir", data]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again =
        std::fs::read_to_string(dir.path().join("data/invoices/2026-06/team-a.csv")).unwrap();
    assert_eq!(team_a, again);
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
    assert!(String::from_utf8_lossy(&report.stdout).contains("team-a"));
}
