//! Each job in a cgroup of its own (cgroup v2), so that every process it starts stays countable
//! and killable: `setsid`, a double fork or a daemonizing tool leave the job's process group,
//! never its cgroup. A stop signal goes to every process of the cgroup, SIGKILL is
//! `cgroup.kill`, and a job is finished only once its cgroup is empty (then removed).
//!
//! The job cgroups of one executor live under `<the service's own cgroup>/gpuledger-<key>/`, the
//! key derived from the executor's job directory, so that two schedulers on one host (or two
//! in one test process) never share one, and a restarted scheduler finds its jobs again. Under
//! systemd the service needs `Delegate=yes` for its cgroup to be writable (deploy/systemd).
//! Without a writable cgroup v2 hierarchy the executor falls back to process groups, and says so.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use gpuledger_model::JobId;

/// Where an executor's job cgroups live.
#[derive(Debug, Clone)]
pub struct JobCgroups {
    parent: PathBuf,
}

impl JobCgroups {
    /// The job cgroups of the executor whose job directory is `jobs_root`: under this
    /// process's own cgroup of the cgroup v2 hierarchy, created if needed. An error when this
    /// host has none, or it is not writable here.
    pub fn for_executor(jobs_root: &Path) -> io::Result<Self> {
        let mount = cgroup2_mount()?;
        let own = own_cgroup()?;
        let parent = mount
            .join(own.trim_start_matches('/'))
            .join(format!("gpuledger-{:016x}", fnv1a(jobs_root)));
        fs::create_dir_all(&parent)?;
        Ok(JobCgroups { parent })
    }

    /// The job's cgroup directory.
    pub fn path(&self, job: &JobId) -> PathBuf {
        self.parent.join(job.as_str())
    }

    /// Creates the job's cgroup and moves process `pid` (the job's wrapper, before it starts
    /// the command) into it. The service moves it: a job's own user may not.
    pub fn enter(&self, job: &JobId, pid: u32) -> io::Result<()> {
        let dir = self.path(job);
        fs::create_dir_all(&dir)?;
        fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .and_then(|mut f| f.write_all(pid.to_string().as_bytes()))
    }

    /// The processes in the job's cgroup now.
    pub fn processes(&self, job: &JobId) -> Vec<i32> {
        fs::read_to_string(self.path(job).join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Sends `signal` to every process of the job's cgroup; SIGKILL is the cgroup's own kill,
    /// which reaches processes forked while it runs too.
    pub fn signal(&self, job: &JobId, signal: Signal) -> io::Result<()> {
        if signal == Signal::SIGKILL {
            let killed = fs::OpenOptions::new()
                .write(true)
                .open(self.path(job).join("cgroup.kill"))
                .and_then(|mut f| f.write_all(b"1"));
            match killed {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound && !self.path(job).exists() => {
                    return Ok(())
                }
                // A kernel before 5.14 has no cgroup.kill: one by one, below.
                Err(_) => {}
            }
        }
        for pid in self.processes(job) {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Ok(())
    }

    /// Whether no process is left in the job's cgroup (or it is gone).
    pub fn is_empty(&self, job: &JobId) -> bool {
        match fs::read_to_string(self.path(job).join("cgroup.events")) {
            Ok(events) => events.lines().any(|l| l.trim() == "populated 0"),
            Err(_) => !self.path(job).exists(),
        }
    }

    /// Removes the job's (empty) cgroup.
    pub fn remove(&self, job: &JobId) {
        let _ = fs::remove_dir(self.path(job));
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> io::Result<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (mount, fs_type) = line.split_once(" - ")?;
            fs_type
                .starts_with("cgroup2 ")
                .then(|| mount.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup v2 hierarchy is mounted"))
}

/// This process's cgroup in the v2 hierarchy (the `0::` line of `/proc/self/cgroup`).
fn own_cgroup() -> io::Result<String> {
    let cgroups = fs::read_to_string("/proc/self/cgroup")?;
    cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "this process is in no cgroup v2"))
}

/// FNV-1a of a path: a short, stable key for the executor's cgroup.
fn fnv1a(path: &Path) -> u64 {
    path.as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
            (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}
