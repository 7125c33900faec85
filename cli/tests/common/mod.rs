//! Helpers the process tests share: start the binary and read the address it prints, stop it
//! with SIGTERM, read one number back with SQL.

#![allow(dead_code)]

pub mod browser;
pub mod ingest;
pub mod slurm;

use std::process::{Command, Stdio};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use gpuledger_aggregator::query::Query;

// Each test file takes what it needs of these.
#[allow(unused_imports)]
pub use gpuledger_testkit::{spawn_binary, spawn_command, terminate, Process, Tmpfs};

/// Starts `gpuledger ARGS` and waits for its "listening on http(s)://..." line.
pub fn spawn(args: &[&str], stderr: Stdio) -> Process {
    spawn_binary(env!("CARGO_BIN_EXE_gpuledger"), args, stderr)
}

/// `gpuledger aggregator` on a free loopback port over `dir/data`, with `config` and the token
/// file `tokens`, flushing every second.
#[allow(dead_code)]
pub fn spawn_aggregator_with_tokens(
    dir: &std::path::Path,
    config: &std::path::Path,
    tokens: &std::path::Path,
) -> Process {
    spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--flush-interval",
            "1s",
            "--tokens",
            tokens.to_str().unwrap(),
        ],
        Stdio::inherit(),
    )
}

/// `gpuledger exporter` for `node` with `gpus` synthetic GPUs, sampling and pushing every
/// second to `aggregator` with the node token in `token_file`, labelling from `mapping`,
/// spooling under `dir/spool`.
#[allow(dead_code)]
pub fn spawn_mapped_exporter(
    node: &str,
    gpus: u16,
    aggregator: &str,
    token_file: &std::path::Path,
    mapping: &std::path::Path,
    dir: &std::path::Path,
) -> Process {
    let gpus = gpus.to_string();
    let spool = dir.join("spool");
    spawn(
        &[
            "exporter",
            "--node",
            node,
            "--gpus",
            &gpus,
            "--sample-interval",
            "1s",
            "--push-interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--aggregator-url",
            aggregator,
            "--aggregator-token-file",
            token_file.to_str().unwrap(),
            "--job-mapping-dir",
            mapping.to_str().unwrap(),
            "--spool-dir",
            spool.to_str().unwrap(),
        ],
        Stdio::inherit(),
    )
}

/// The seed cluster's config with no allocation source (`[telemetry] allocations = "none"`),
/// written into `dir`: for tests whose exporters label jobs from a mapping directory that no
/// job event describes, billed as labelled.
pub fn seed_config_labelled(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("seed-labelled.toml");
    let text = gpuledger_sim::seed::SEED_CLUSTER_TOML.replacen(
        "allocations = \"events\"",
        "allocations = \"none\"",
        1,
    );
    assert_ne!(text, gpuledger_sim::seed::SEED_CLUSTER_TOML);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `gpuledger ARGS` to its end; its standard output, trimmed. Fails the test with its
/// standard error when it does not succeed.
pub fn gpuledger_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpuledger {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Adds a token of `role` named `name` to the token file `file` (`who`: `--account A` or
/// `--node N` where the role needs one); the token.
pub fn add_token(file: &str, role: &str, name: &str, who: &[&str]) -> String {
    let args = [
        "token", "add", "--file", file, "--role", role, "--name", name,
    ];
    let args: Vec<&str> = args.iter().chain(who).copied().collect();
    gpuledger_ok(&args)
}

/// Polls `done` every 100 ms until it holds; fails the test after `secs` seconds.
pub fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !done() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's Prometheus with `config` (YAML) in `dir`, on a free loopback port, once it says it
/// is ready; killed when dropped. Its URL is the process's.
pub fn start_prometheus(dir: &std::path::Path, config: &str) -> Process {
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("prometheus not found: ./scripts/test.sh installs Debian's `prometheus` package");
    let url = format!("http://127.0.0.1:{port}");
    wait_for("Prometheus to be ready", 60, || {
        ureq::get(format!("{url}/-/ready")).call().is_ok()
    });
    Process { child, url }
}

/// What `promtool check metrics` (Debian's `prometheus` package) says of a `/metrics` page:
/// empty when it found nothing to complain about.
pub fn promtool_check_metrics(page: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool not found: ./scripts/test.sh installs Debian's `prometheus` package");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // dcgm-exporter's own names break two of the lint's rules: its `modelName` label is
    // camelCase and its counter DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION has no `_total`. A drop-in
    // keeps both, as every tool that reads dcgm-exporter selects on them; no other series may
    // break the naming rules.
    let complaints: Vec<&str> = said
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            !(l.starts_with("DCGM_FI_")
                && (l.ends_with("label names should be written in 'snake_case' not 'camelCase'")
                    || l == &"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter metrics should have \"_total\" suffix"))
        })
        .collect();
    if complaints.is_empty() {
        String::new()
    } else {
        format!("(exit {}) {}", out.status, complaints.join("\n"))
    }
}

/// The `/metrics` page of a service.
pub fn scrape(url: &str) -> String {
    ureq::get(format!("{url}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// `sent` samples stored, none twice, and the rollups holding exactly their GPU-seconds
/// (`sent` of them: one-second samples).
pub async fn assert_stored_once(query: &Query, sent: i64) {
    assert_eq!(scalar(query, "SELECT COUNT(*) FROM samples").await, sent);
    assert_eq!(
        scalar(
            query,
            "SELECT COUNT(*) FROM (SELECT node, gpu_index, time FROM samples \
             GROUP BY node, gpu_index, time HAVING COUNT(*) > 1)"
        )
        .await,
        0,
        "no sample stored twice"
    );
    assert_eq!(
        scalar(query, "SELECT SUM(gpu_seconds) FROM rollups_hourly").await,
        sent,
        "rollups hold exactly the samples' GPU-seconds (1 s each)"
    );
}

/// The first value of the first row of `sql`, as an integer.
pub async fn scalar(query: &Query, sql: &str) -> i64 {
    let batches = query.sql(sql).await.unwrap();
    let b = batches.iter().find(|b| b.num_rows() > 0).unwrap();
    let col = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Int64).unwrap();
    col.as_primitive::<Int64Type>().value(0)
}
