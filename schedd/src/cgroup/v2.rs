//! Jobs tracked in the cgroup v2 hierarchy: one cgroup per job, `cgroup.kill` for SIGKILL,
//! `cgroup.events` for emptiness. No controller is enabled below the service's cgroup, so the
//! service may stay in it while its jobs' cgroups sit under it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use gpuledger_model::JobId;

/// The executor's cgroup in the v2 hierarchy.
#[derive(Debug, Clone)]
pub(super) struct Hierarchy {
    parent: PathBuf,
}

impl Hierarchy {
    pub(super) fn create(name: &str) -> io::Result<Self> {
        Ok(Hierarchy {
            parent: super::own_child(None, name)?,
        })
    }

    pub(super) fn path(&self, job: &JobId) -> PathBuf {
        self.parent.join(job.as_str())
    }

    pub(super) fn parent(&self) -> &Path {
        &self.parent
    }

    /// The job's cgroup, new: one left by an earlier launch of the job (emptied by
    /// `end_leftovers`) is removed first, so that no device filter of that launch stays on it.
    pub(super) fn create_job(&self, job: &JobId) -> io::Result<PathBuf> {
        let dir = self.path(job);
        let _ = fs::remove_dir(&dir);
        fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    pub(super) fn signal(&self, job: &JobId, signal: Signal) -> io::Result<()> {
        let dir = self.path(job);
        if signal == Signal::SIGKILL {
            match fs::write(dir.join("cgroup.kill"), b"1") {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => return Ok(()),
                // A kernel before 5.14 has no cgroup.kill: one by one, below.
                Err(_) => {}
            }
        }
        for pid in super::read_procs(&dir.join("cgroup.procs")) {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Ok(())
    }

    pub(super) fn is_empty(&self, job: &JobId) -> bool {
        let dir = self.path(job);
        match super::read_field(&dir.join("cgroup.events"), "populated") {
            Some(populated) => populated == 0,
            None => !dir.exists(),
        }
    }
}
