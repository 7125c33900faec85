//! Helpers the process tests share: start the binary and read the address it prints, stop it
//! with SIGTERM, read one number back with SQL.

#![allow(dead_code)]

pub mod browser;
pub mod ingest;
pub mod slurm;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use gpuledger_aggregator::query::Query;

/// A running `gpuledger` service and the URL it announced. Killed when dropped, so a failing
/// test leaves no service behind.
pub struct Process {
    pub child: Child,
    pub url: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `gpuledger ARGS` and waits for its "listening on http(s)://..." line.
pub fn spawn(args: &[&str], stderr: Stdio) -> Process {
    spawn_binary(env!("CARGO_BIN_EXE_gpuledger"), args, stderr)
}

/// Starts `BINARY ARGS` and waits for its "listening on http://..." line.
pub fn spawn_binary(binary: &str, args: &[&str], stderr: Stdio) -> Process {
    let mut child = Command::new(binary)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("reads");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Process { child, url }
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

/// A real tmpfs of `size` (e.g. `1m`), mounted for a test and unmounted when dropped; the test
/// command runs as root, which mounting needs.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (the test command runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
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
    if out.status.success() {
        said.trim().to_owned()
    } else {
        format!("(exit {}) {said}", out.status)
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

/// SIGTERM, then a clean exit.
pub fn terminate(mut p: Process) {
    let pid = p.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = p.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
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
