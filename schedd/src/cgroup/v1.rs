//! Jobs tracked in cgroup v1, where no writable v2 hierarchy is mounted: a cgroup per job in the
//! `freezer` controller (which holds the process list and stops a job whole) and in `pids`
//! (which counts them, for a limit a site may set), and in `cpuacct` where it is mounted (the CPU
//! time the job's processes used, as v2's `cpu.stat` gives). v1 has no `cgroup.kill`: SIGKILL
//! freezes the job, kills every process of it and thaws it, so that no process forks away in
//! between.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use gpuledger_model::JobId;

/// The executor's cgroups in the v1 `freezer`, `pids` and (where mounted) `cpuacct`
/// controllers.
#[derive(Debug, Clone)]
pub(super) struct Hierarchy {
    freezer: PathBuf,
    pids: PathBuf,
    cpuacct: Option<PathBuf>,
}

/// How long a freeze may take before the processes are killed anyway (a process in the
/// kernel, in uninterruptible sleep, is frozen only when it comes back).
const FREEZE_WAIT: Duration = Duration::from_secs(2);

impl Hierarchy {
    pub(super) fn create(name: &str) -> io::Result<Self> {
        Ok(Hierarchy {
            freezer: super::controller_cgroup("freezer", name)?,
            pids: super::controller_cgroup("pids", name)?,
            cpuacct: super::controller_cgroup("cpuacct", name).ok(),
        })
    }

    pub(super) fn path(&self, job: &JobId) -> PathBuf {
        self.freezer.join(job.as_str())
    }

    pub(super) fn enter(&self, job: &JobId, pid: u32) -> io::Result<()> {
        for parent in self.cpuacct.iter().chain([&self.pids, &self.freezer]) {
            let dir = parent.join(job.as_str());
            fs::create_dir_all(&dir)?;
            super::move_into(&dir, pid)?;
        }
        Ok(())
    }

    pub(super) fn signal(&self, job: &JobId, signal: Signal) -> io::Result<()> {
        let dir = self.path(job);
        if !dir.exists() {
            return Ok(());
        }
        let frozen = signal == Signal::SIGKILL && self.freeze(&dir);
        let sent = signal_each(&super::read_procs(&dir.join("cgroup.procs")), signal);
        if frozen {
            // Killed while frozen, they die as they thaw.
            let _ = fs::write(dir.join("freezer.state"), "THAWED");
        }
        sent
    }

    /// Freezes the job's cgroup and waits (a while) until it is; whether it was asked to.
    fn freeze(&self, dir: &std::path::Path) -> bool {
        let state = dir.join("freezer.state");
        if fs::write(&state, "FROZEN").is_err() {
            return false;
        }
        let until = Instant::now() + FREEZE_WAIT;
        while Instant::now() < until {
            if fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FROZEN") {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// The executor's own cgroups in the `freezer`, `pids` and `cpuacct` controllers.
    pub(super) fn parents(&self) -> Vec<PathBuf> {
        let mut parents = vec![self.freezer.clone(), self.pids.clone()];
        parents.extend(self.cpuacct.clone());
        parents
    }

    /// The CPU time the job's processes used, in microseconds, where `cpuacct` counts it
    /// (`cpuacct.usage`, nanoseconds).
    pub(super) fn cpu_time_us(&self, job: &JobId) -> Option<u64> {
        let file = self
            .cpuacct
            .as_ref()?
            .join(job.as_str())
            .join("cpuacct.usage");
        let nanoseconds: u64 = fs::read_to_string(file).ok()?.trim().parse().ok()?;
        Some(nanoseconds / 1000)
    }
}

fn signal_each(pids: &[i32], signal: Signal) -> io::Result<()> {
    for &pid in pids {
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    }
    Ok(())
}
