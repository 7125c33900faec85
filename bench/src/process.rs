//! The services under measurement as child processes of the running binary: started, found by
//! the address they announce, stopped with SIGTERM; their CPU time and memory from `/proc`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

/// A started service and the URL it announced.
#[derive(Debug)]
pub struct Service {
    pub child: Child,
    pub url: String,
}

pub fn spawn_self(args: &[&str]) -> anyhow::Result<Service> {
    spawn(&std::env::current_exe()?, args)
}

pub fn spawn(binary: &Path, args: &[&str]) -> anyhow::Result<Service> {
    let mut child = Command::new(binary)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .with_context(|| format!("no address in {line:?}"))?
        .to_owned();
    Ok(Service { child, url })
}

/// Peak and current resident memory of a process, in bytes (Linux `/proc`).
pub fn memory_of(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    Some((kib("VmHWM:")?, kib("VmRSS:")?))
}

/// User + system CPU seconds of a process (Linux `/proc`).
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

pub fn stop(mut service: Service) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-TERM", &service.child.id().to_string()])
        .status()?;
    if !status.success() {
        bail!("could not signal pid {}", service.child.id());
    }
    service.child.wait()?;
    Ok(())
}
