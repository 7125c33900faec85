//! A job's own `/tmp` and `/dev/shm`, as Slurm's `job_container/tmpfs`: on a node shared by
//! tenants, `/tmp` is where tools leave caches and sockets under predictable names (compiler and
//! kernel caches, `torch` extensions, IPC sockets): one tenant's job could read another's files
//! there, plant a link where the other will write, or fill it for everyone. Each job runs in a
//! mount namespace of its own where `/tmp` is its directory's `tmp` (also its `TMPDIR`) and
//! `/dev/shm` a fresh tmpfs (charged to the job's memory cgroup, gone with its last process);
//! the rest of the file system is the host's.
//!
//! The namespace is made in the job's wrapper process between `fork` and `exec`, while it is
//! still root, which then becomes the job's user. This is the one place outside the BPF loader
//! that needs `unsafe`: `pre_exec`'s closure must only make system calls, no allocation, and
//! every string it uses is made before the fork.
//!
//! A job whose directory is below `/tmp` would lose the paths to it (its `HOME`, `TMPDIR`) under
//! its own `/tmp`: with the jobs' directories there, jobs share the host's `/tmp` (said at start).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{setgid, setgroups, setuid, Gid, Uid};

use crate::job_files::JobUser;

/// Whether jobs get a `/tmp` and `/dev/shm` of their own (`--job-tmp`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobTmp {
    /// Their own where this host allows it (the scheduler runs as root, the kernel lets it
    /// make a mount namespace, the jobs' directories are not below `/tmp`), else the host's,
    /// with a warning.
    #[default]
    Auto,
    /// Their own; the scheduler refuses to start where it cannot give them.
    Private,
    /// The host's `/tmp` and `/dev/shm`, shared with every other job and process.
    Shared,
}

/// What an executor's jobs get, decided once at start: `Ok(())` their own `/tmp`, or why not.
pub type Decision = Result<(), String>;

/// Decides for the executor whose job directories are under `jobs_root`: an error when
/// `Private` was asked for and cannot be given.
pub fn decide(mode: JobTmp, jobs_root: &Path) -> io::Result<Decision> {
    let why_not = match mode {
        JobTmp::Shared => return Ok(Err("--job-tmp shared".to_owned())),
        JobTmp::Auto | JobTmp::Private => why_not_private(jobs_root),
    };
    match why_not {
        Some(why) if mode == JobTmp::Private => Err(io::Error::other(format!(
            "--job-tmp private: jobs cannot get a /tmp of their own: {why}"
        ))),
        Some(why) => Ok(Err(why)),
        None => Ok(Ok(())),
    }
}

fn why_not_private(jobs_root: &Path) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the scheduler is not root (a mount namespace needs it)".to_owned());
    }
    let root = std::path::absolute(jobs_root).unwrap_or_else(|_| jobs_root.to_owned());
    let resolved = std::fs::canonicalize(&root).unwrap_or(root);
    for hidden in ["/tmp", "/dev/shm"] {
        if resolved.starts_with(hidden) {
            return Some(format!(
                "the jobs' directories ({}) are below {hidden}, which a job's own would hide; give --jobs-dir elsewhere",
                resolved.display()
            ));
        }
    }
    probe()
        .err()
        .map(|e| format!("this host refuses a mount namespace: {e}"))
}

/// Starts `true` in a mount namespace of its own, as a job would be.
fn probe() -> io::Result<()> {
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", "exit 0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure makes system calls only (see `private_mounts`).
    unsafe { command.pre_exec(|| private_mounts(None, false)) };
    let status = command.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("a trial process {status}")))
    }
}

/// Makes `command` start in a mount namespace of its own, its `/tmp` the directory `tmp`, its
/// `/dev/shm` a new tmpfs, then become `user` (root's supplementary groups dropped), where
/// std's own `uid` and `gid` would come too late (after them, nothing may be mounted).
pub fn confine(command: &mut Command, tmp: &Path, user: Option<JobUser>) -> io::Result<()> {
    let tmp = CString::new(tmp.as_os_str().as_bytes())?;
    let shm = Path::new("/dev/shm").is_dir();
    // SAFETY: between fork and exec the closure makes system calls only: `unshare`, `mount`,
    // `setgroups`, `setgid`, `setuid`, with strings made before the fork, and allocates nothing
    // (an error is an errno).
    unsafe {
        command.pre_exec(move || {
            private_mounts(Some(&tmp), shm)?;
            if let Some(user) = user {
                become_user(user)?;
            }
            Ok(())
        })
    };
    Ok(())
}

/// A mount namespace whose mounts do not reach the host's; `/tmp` bound to `tmp` and a new
/// tmpfs on `/dev/shm` where asked.
fn private_mounts(tmp: Option<&CStr>, shm: bool) -> io::Result<()> {
    const NONE: Option<&CStr> = None;
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        NONE,
        c"/",
        NONE,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        NONE,
    )?;
    if let Some(tmp) = tmp {
        mount(Some(tmp), c"/tmp", NONE, MsFlags::MS_BIND, NONE)?;
    }
    if shm {
        mount(
            Some(c"tmpfs"),
            c"/dev/shm",
            Some(c"tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(c"mode=1777"),
        )?;
    }
    Ok(())
}

fn become_user(user: JobUser) -> io::Result<()> {
    setgroups(&[])?;
    setgid(Gid::from_raw(user.gid))?;
    setuid(Uid::from_raw(user.uid))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_below_tmp_or_asked_to_share_get_the_hosts_and_private_then_refuses() {
        let under_tmp = tempfile::tempdir_in("/tmp").unwrap();
        let why = decide(JobTmp::Auto, under_tmp.path()).unwrap().unwrap_err();
        assert!(why.contains("are below /tmp"), "{why}");
        let refused = decide(JobTmp::Private, under_tmp.path()).unwrap_err();
        assert!(
            refused.to_string().starts_with("--job-tmp private: "),
            "{refused}"
        );
        let elsewhere = tempfile::tempdir_in("/var/tmp").unwrap();
        assert_eq!(
            decide(JobTmp::Shared, elsewhere.path()).unwrap(),
            Err("--job-tmp shared".to_owned())
        );
        assert_eq!(
            decide(JobTmp::Auto, elsewhere.path()).unwrap(),
            Ok(()),
            "this host (root, mount namespaces allowed) gives jobs their own"
        );
    }
}
