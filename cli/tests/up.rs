//! `gpuledger up` as an operator meets it: one command starts the aggregator, the scheduler,
//! three synthetic exporters, a workload and a real Prometheus under one state directory, with
//! tokens on; it prints the operator's token once and every URL; the status page opens with
//! that token, Prometheus sees every target up, the workload's jobs run; SIGTERM stops every
//! process; a second start continues with the same tokens and data.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::ingest::agent;
use common::wait_for;

/// What `gpuledger up` printed before it said Ctrl-C stops it.
struct Started {
    child: Child,
    text: String,
}

impl Started {
    /// The URL on the line that starts with `label`.
    fn url(&self, label: &str) -> String {
        let line = self
            .text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in\n{}", self.text));
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL on `{line}`"));
        url.to_owned()
    }

    fn base(&self, label: &str) -> String {
        let url = self.url(label);
        let rest = url.trim_start_matches("http://");
        format!("http://{}", rest.split('/').next().unwrap())
    }
}

/// A test that fails midway still stops the stack (its processes would outlive the test).
impl Drop for Started {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let pid = self.child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let until = Instant::now() + Duration::from_secs(30);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn up(state: &std::path::Path) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "up",
            "--state-dir",
            state.to_str().unwrap(),
            "--exporters",
            "3",
            "--port-base",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let until = Instant::now() + Duration::from_secs(120);
    let mut text = String::new();
    loop {
        let line = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("gpuledger up did not finish starting:\n{text}"));
        text.push_str(&line);
        text.push('\n');
        if line.contains("Ctrl-C stops everything") {
            break;
        }
    }
    Started { child, text }
}

fn stop(mut started: Started) {
    // (Drop would stop it too; this checks how it ends.)
    let pid = started.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = started.child.try_wait().unwrap() {
            assert!(
                status.success(),
                "gpuledger up exits 0 on SIGTERM: {status}"
            );
            return;
        }
        assert!(Instant::now() < until, "gpuledger up did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get(url: &str, token: &str) -> (u16, String) {
    let mut r = agent()
        .get(url)
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap();
    (
        r.status().as_u16(),
        r.body_mut().read_to_string().unwrap_or_default(),
    )
}

fn listening(base: &str) -> bool {
    let addr = base.trim_start_matches("http://");
    std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(500)).is_ok()
}

#[test]
fn one_command_starts_a_live_stack_that_stops_on_sigterm_and_continues_when_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("stack");
    // Closed to others, as `/root` is: the stack's jobs run as `nobody`, who may not pass it.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let first = up(&state);
    let jobs_dir = first
        .text
        .lines()
        .find_map(|l| l.trim().strip_prefix("jobs' directories"))
        .and_then(|rest| rest.split_whitespace().next())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("no jobs' directories in\n{}", first.text));
    assert!(
        first.text.contains(&format!(
            "(the accounts' users cannot pass {})",
            std::fs::canonicalize(dir.path()).unwrap().display()
        )),
        "{}",
        first.text
    );
    let _jobs_elsewhere = gpuledger_testkit::KillJobsUnder::new(&jobs_dir);
    let _remove_jobs_dir = RemoveOnDrop(jobs_dir.clone());
    let token = first
        .text
        .lines()
        .find_map(|l| l.split_once("operator token").map(|(_, rest)| rest))
        .and_then(|rest| rest.split_whitespace().last())
        .unwrap_or_else(|| panic!("no operator token in\n{}", first.text))
        .to_owned();
    let status = first.url("status page");
    let (code, page) = get(&status, &token);
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("<title>gpuledger · seed</title>"),
        "the status page of the stack's cluster, signed in: {page}"
    );
    let (code, _) = get(&status, "gpl_not_a_token");
    assert_eq!(code, 401, "tokens are on");

    // Each service says it is ready, to anyone (a kubelet or a load balancer has no token).
    for label in ["status page", "scheduler ", "exporter gpu002"] {
        let readyz = format!("{}/readyz", first.base(label));
        wait_for(&format!("{readyz} to answer 200"), 30, || {
            agent()
                .get(&readyz)
                .call()
                .is_ok_and(|r| r.status().as_u16() == 200)
        });
    }

    // Prometheus scrapes every service, with the metrics token the stack gave it.
    let prometheus = first.base("Prometheus");
    wait_for("Prometheus to see its 5 targets up", 90, || {
        let Ok(mut r) = agent().get(format!("{prometheus}/api/v1/targets")).call() else {
            return false;
        };
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        let targets = v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        targets.len() == 5 && targets.iter().all(|t| t["health"] == "up")
    });
    let rules = agent()
        .get(format!("{prometheus}/api/v1/rules"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        rules.contains("gpuledger"),
        "the shipped rules are loaded: {rules}"
    );

    // The workload's jobs run on the stack's GPUs, and the exporters label them.
    let scheduler = first.base("scheduler ");
    let mut running = Value::Null;
    wait_for("a workload job to run", 90, || {
        let (code, body) = get(&format!("{scheduler}/api/v1/queue"), &token);
        let queue: Value = serde_json::from_str(&body).unwrap_or_default();
        let first_running = queue["jobs"].as_array().and_then(|jobs| {
            jobs.iter()
                .find(|j| j["state"] == "running" && j["pid"].is_u64())
                .cloned()
        });
        running = first_running.unwrap_or_default();
        code == 200 && !running.is_null()
    });
    // It runs in its directory under the jobs' directory the stack chose.
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", running["pid"])).unwrap();
    assert_eq!(
        cwd,
        jobs_dir.join(running["id"].as_str().unwrap()),
        "{running}"
    );
    let prometheus_token = std::fs::read_to_string(state.join("secrets/prometheus")).unwrap();
    wait_for("an exporter to label a GPU with a job", 60, || {
        ["exporter gpu001", "exporter gpu002", "exporter gpu003"]
            .iter()
            .any(|e| {
                get(&first.url(e), prometheus_token.trim())
                    .1
                    .contains("hpc_job=\"")
            })
    });

    let bases: Vec<String> = ["status page", "scheduler ", "exporter gpu001", "Prometheus"]
        .iter()
        .map(|l| first.base(l))
        .collect();
    stop(first);
    for b in &bases {
        assert!(!listening(b), "{b} still listens after the stack stopped");
    }

    // Started again: the same tokens and data, no new operator token.
    let second = up(&state);
    assert!(second.text.contains("started again"), "{}", second.text);
    assert!(!second.text.contains("operator token"), "{}", second.text);
    let (code, page) = get(&second.url("status page"), &token);
    assert_eq!(
        code, 200,
        "the first start's token still opens the page: {page}"
    );
    let (code, body) = get(
        &format!("{}/api/v1/queue", second.base("scheduler ")),
        &token,
    );
    assert_eq!(code, 200);
    assert!(
        body.contains("\"account\""),
        "the jobs of the first start are there: {body}"
    );
    // A second stack on the same directory is refused while this one runs.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "up",
            "--state-dir",
            state.to_str().unwrap(),
            "--port-base",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another gpuledger up"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop(second);
}

/// Removes a directory outside the test's own when the test ends, however it ends.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
