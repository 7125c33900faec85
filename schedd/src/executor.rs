//! Running jobs as real processes. [`Executor`] is the seam: the service tells it to launch,
//! signal and kill, and asks which jobs have exited; [`LocalExecutor`] runs each job as a shell
//! command in its own process group on this host, with `CUDA_VISIBLE_DEVICES` set to its GPUs.
//!
//! Each job runs under a small `sh` wrapper that waits for the command and writes its exit
//! status to `<job dir>/exit`. Signals go to the whole process group: the checkpoint signals
//! (TERM, INT, USR1, USR2) and the resize signal (HUP) reach the command while the wrapper only
//! notes them and keeps waiting; SIGKILL ends both. So the status
//! survives a restart of the service: an adopted job is finished when its `exit` file appears,
//! or when its process group is gone without one (killed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use gpuledger_model::{GpuShare, JobId};

use crate::cgroup::{CgroupMode, JobCgroups, JobLimits, JobUsage};
use crate::cores::{self, CoreBook};
pub use crate::job_files::JobUser;
use crate::job_files::{self, Writing};
use crate::job_tmp::{self, JobTmp};

/// What a job needs to start.
#[derive(Clone, Debug)]
pub struct Launch {
    pub job_id: JobId,
    pub command: String,
    /// GPU indices on this host, for `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    /// The whole allocation, `node:gpus;...`, for multi-node launchers.
    pub allocation: String,
    pub account: String,
    pub project: Option<String>,
    /// The job's own variables (checked at submission).
    pub env: std::collections::BTreeMap<String, String>,
    /// The Unix user and group it runs as; the service's own when `None`.
    pub user: Option<JobUser>,
    /// Its part of its one GPU, where it holds a part.
    pub gpu_share: Option<GpuShare>,
}

/// The variable that caps an MPS client's share of the GPU's SMs, in percent.
pub const MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// What a job holding a part of a GPU is told: the part (`GPULEDGER_GPU_SHARE`), and for a
/// time share its SM cap under MPS, the thousandths rounded up to a whole percent (a MIG
/// instance is its own device: nothing to cap).
fn share_env(share: Option<GpuShare>) -> Vec<(&'static str, String)> {
    let Some(share) = share else {
        return Vec::new();
    };
    let mut env = vec![("GPULEDGER_GPU_SHARE", share.to_string())];
    if let GpuShare::Milli(milli) = share {
        env.push((
            MPS_THREAD_PERCENTAGE,
            milli.div_ceil(10).clamp(1, 100).to_string(),
        ));
    }
    env
}

/// `PATH` for a job that sets none.
const JOB_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How a job's process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// The command's own exit code.
    Code(i32),
    /// Killed by a signal before the wrapper could record anything (SIGKILL).
    Killed,
    /// The kernel's OOM killer ended `kills` of its processes at its memory limit
    /// (`limit_bytes`, where known); `code` is what the wrapper recorded, if it lived.
    OutOfMemory {
        code: Option<i32>,
        kills: u64,
        limit_bytes: Option<u64>,
    },
}

/// The seam between the service and whatever runs jobs.
pub trait Executor: Send + std::fmt::Debug {
    /// Starts the job; returns its process id.
    fn launch(&mut self, job: &Launch) -> std::io::Result<u32>;
    /// Watches a job started before a restart.
    fn adopt(&mut self, job_id: &JobId, pid: u32);
    /// Sends a signal to the job's processes.
    fn signal(&mut self, job_id: &JobId, signal: Signal) -> std::io::Result<()>;
    /// Jobs that have exited since the last call.
    fn reap(&mut self) -> Vec<(JobId, ExitStatus)>;
    /// Jobs with processes that SIGKILL has not ended within the executor's timeout (stuck in
    /// the kernel, in a driver call), each reported once with how many are left.
    fn unkillable(&mut self) -> Vec<(JobId, usize)> {
        Vec::new()
    }
    /// Ends the processes of a job the service holds as not running: those of a launch whose
    /// start a crash kept from being saved. How many there were.
    fn end_leftovers(&mut self, _job_id: &JobId) -> usize {
        0
    }
    /// What the run of `job_id` that [`Executor::reap`] last reported used (CPU time, peak
    /// memory), where it was counted; asked once, after `reap`.
    fn take_usage(&mut self, _job_id: &JobId) -> Option<JobUsage> {
        None
    }
    /// Tells a running elastic job its new allocation: the `allocation` file of its launch
    /// (`GPULEDGER_ALLOCATION_FILE`) is rewritten, then it gets SIGHUP.
    fn resized(&mut self, job_id: &JobId, _allocation: &str) -> std::io::Result<()> {
        self.signal(job_id, Signal::SIGHUP)
    }
}

#[derive(Debug)]
struct Watched {
    pid: u32,
    child: Option<Child>,
    /// When SIGKILL was first sent (or found needed): the unkillable timeout counts from it.
    killed_at: Option<Instant>,
    reported_unkillable: bool,
}

impl Watched {
    fn new(pid: u32, child: Option<Child>) -> Self {
        Watched {
            pid,
            child,
            killed_at: None,
            reported_unkillable: false,
        }
    }
}

/// How a [`LocalExecutor`] contains jobs.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    pub cgroups: CgroupMode,
    /// Where the GPU device files are.
    pub device_dir: PathBuf,
    /// How long a job's processes may outlive SIGKILL before the job is reported unkillable
    /// (Slurm's `UnkillableStepTimeout`).
    pub unkillable_after: Duration,
    /// Memory and CPU each job may use per GPU it holds; needs cgroups.
    pub limits: JobLimits,
    /// Where the NVIDIA driver's `proc/driver/nvidia/gpus` and the PCI bus's `sys/bus/pci` are
    /// (`/`): which cores are local to which GPU, for jobs bound to cores.
    pub topology_root: PathBuf,
    /// Whether jobs get a `/tmp` and `/dev/shm` of their own.
    pub tmp: JobTmp,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        ExecutorOptions {
            cgroups: CgroupMode::Auto,
            device_dir: PathBuf::from("/dev"),
            unkillable_after: Duration::from_secs(60),
            limits: JobLimits::default(),
            topology_root: PathBuf::from("/"),
            tmp: JobTmp::Auto,
        }
    }
}

/// Runs jobs as local processes under `root/<job id>/` (stdout, stderr, exit status), each in a
/// cgroup of its own where the host allows ([`JobCgroups`]).
#[derive(Debug)]
pub struct LocalExecutor {
    root: PathBuf,
    jobs: HashMap<JobId, Watched>,
    cgroups: Option<JobCgroups>,
    unkillable_after: Duration,
    limits: JobLimits,
    /// Whether each job gets its own `/tmp` and `/dev/shm`, or why not.
    private_tmp: job_tmp::Decision,
    /// What each run `reap` reported used, until the service takes it.
    usage: HashMap<JobId, JobUsage>,
    /// The cores running jobs are bound to (`--job-cpu-bind cores`).
    cores: CoreBook,
    /// The cores local to each GPU, by index (none known without the driver).
    gpu_cores: HashMap<u32, Vec<u32>>,
}

/// Waits for the command and records its status; see the module docs.
///
/// A `wait` that a noted signal interrupts returns 128 + the signal, like a command killed by
/// it; the shell may meanwhile reap the command and keep its status for the next `wait`. So
/// past 128 the wrapper waits again once the command is gone: that gives the command's own
/// status, or 127 when the first `wait` already had it.
///
/// It starts the command only once the service says `go` on its standard input, after moving it
/// into the job's cgroup: the command and everything it starts are born there.
const WRAPPER: &str = r#"read -r go || exit 125
exec </dev/null
trap ':' TERM HUP INT USR1 USR2
sh -c "$1" & child=$!
while :; do
  wait "$child"; status=$?
  [ "$status" -le 128 ] && break
  kill -0 "$child" 2>/dev/null && continue
  wait "$child"; again=$?
  [ "$again" -ne 127 ] && status=$again
  break
done
printf '%s\n' "$status" > "$2.tmp" && mv "$2.tmp" "$2"
exit "$status"
"#;

impl Drop for LocalExecutor {
    /// Its own cgroups go with it where no job is left in them.
    fn drop(&mut self) {
        if let Some(cgroups) = &self.cgroups {
            cgroups.release();
        }
    }
}

impl LocalExecutor {
    /// An executor with the default options: cgroups where the host has them, else process
    /// groups with a warning.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_options(root, ExecutorOptions::default())
            .expect("`auto` falls back to process groups rather than fail")
    }

    /// An executor containing jobs as `options` say; an error when the cgroup hierarchy asked
    /// for (`v1`, `v2`) is not there or not writable, or when limits are asked for that no
    /// cgroup controller here can hold.
    pub fn with_options(
        root: impl Into<PathBuf>,
        options: ExecutorOptions,
    ) -> std::io::Result<Self> {
        let root = root.into();
        let key = std::path::absolute(&root).unwrap_or_else(|_| root.clone());
        let limited = !options.limits.is_empty();
        if options.limits.bind_cores && options.limits.cpus_per_gpu.is_none() {
            return Err(std::io::Error::other(
                "--job-cpu-bind: cores: how many each job gets comes from --job-cpus-per-gpu, which is not given",
            ));
        }
        if limited && options.cgroups == CgroupMode::Off {
            return Err(std::io::Error::other(
                "--cgroup: off, and limits per job (--job-memory-per-gpu, --job-cpus-per-gpu, --job-tasks-max) need job cgroups",
            ));
        }
        let cgroups = match JobCgroups::for_executor(
            &key,
            options.cgroups,
            &options.device_dir,
            &options.limits,
        ) {
            Ok(cgroups) => cgroups,
            Err(error) if options.cgroups == CgroupMode::Auto && !limited => {
                tracing::warn!(%error, "no job cgroups (neither a writable cgroup v2 hierarchy nor v1 freezer and pids): jobs are tracked by process group only, and a job that leaves its group (setsid) escapes its stop");
                None
            }
            Err(error) => {
                return Err(std::io::Error::new(
                    error.kind(),
                    format!("job cgroups ({:?}): {error}", options.cgroups),
                ))
            }
        };
        let private_tmp = job_tmp::decide(options.tmp, &key)?;
        match &private_tmp {
            Ok(()) => tracing::info!("each job gets a /tmp and /dev/shm of its own"),
            Err(why) if nix::unistd::geteuid().is_root() => {
                tracing::warn!(%why, "jobs share this host's /tmp and /dev/shm: one tenant's job can read or replace what another's leaves there");
            }
            Err(why) => tracing::info!(%why, "jobs share this host's /tmp and /dev/shm"),
        }
        match &cgroups {
            Some(c) => {
                let [memory, cpu, tasks, cores] = c.limit_places();
                tracing::info!(
                    cgroup = c.version(),
                    gpu_device_filter = c.device_filter().map_or("none", |f| f.name()),
                    memory_limit = memory.unwrap_or("none"),
                    cpu_limit = cpu.unwrap_or("none"),
                    tasks_limit = tasks.unwrap_or("none"),
                    cpu_bind = cores.unwrap_or("none"),
                    "each job runs in a cgroup of its own"
                );
                if let Err(why) = c.device_filter() {
                    if !crate::cgroup::gpu_devices(&options.device_dir).is_empty() {
                        tracing::warn!(%why, "no device filter: a job can open the device files of GPUs it was not given (CUDA_VISIBLE_DEVICES only hides them)");
                    }
                }
            }
            None if options.cgroups == CgroupMode::Off => {
                tracing::warn!("job cgroups off (--cgroup off): a job that leaves its process group (setsid) escapes its stop");
            }
            None => {}
        }
        Ok(LocalExecutor {
            root,
            jobs: HashMap::new(),
            cgroups,
            unkillable_after: options.unkillable_after,
            limits: options.limits,
            private_tmp,
            usage: HashMap::new(),
            cores: CoreBook::new(cores::online_cores()),
            gpu_cores: cores::gpu_local_cores(&options.topology_root),
        })
    }

    /// Whether each job runs in a cgroup of its own.
    pub fn has_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    /// The job cgroups, where there are.
    pub fn cgroups(&self) -> Option<&JobCgroups> {
        self.cgroups.as_ref()
    }

    /// The directory holding a job's output and exit status.
    pub fn job_dir(&self, job_id: &JobId) -> PathBuf {
        self.root.join(job_id.as_str())
    }
}

/// A launch its user could not start: where the reason is a directory above the job's that the
/// user may not pass (a data directory under `/root`, or in a 0700 temporary directory), says
/// which; the bare `EACCES` named nothing.
fn explain_spawn_error(error: std::io::Error, dir: &Path, user: Option<JobUser>) -> std::io::Error {
    let Some(user) = user.filter(|_| error.kind() == std::io::ErrorKind::PermissionDenied) else {
        return error;
    };
    match first_closed_to(dir, user) {
        Some(closed) => std::io::Error::new(
            error.kind(),
            format!(
                "the job's user (uid {}, gid {}) may not pass {} to reach its directory: let it through (`chmod o+x`), or give the scheduler a --jobs-dir it can reach ({error})",
                user.uid,
                user.gid,
                closed.display()
            ),
        ),
        None => error,
    }
}

/// The first directory above `dir` whose mode bits deny `user` passage (search), if any.
fn first_closed_to(dir: &Path, user: JobUser) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    dir.ancestors().skip(1).find_map(|above| {
        let meta = std::fs::metadata(above).ok()?;
        let search = if meta.uid() == user.uid {
            0o100
        } else if meta.gid() == user.gid {
            0o010
        } else {
            0o001
        };
        (meta.mode() & search == 0).then(|| above.to_owned())
    })
}

/// The exit status the job's wrapper left in its directory.
fn read_exit(job_dir: &Path) -> Option<i32> {
    job_files::read_small(job_dir, "exit")?.trim().parse().ok()
}

fn group_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .is_some_and(|p| killpg(Pid::from_raw(p), None).is_ok())
}

/// True while the wrapper process runs: it exists and is not a zombie waiting for a parent
/// that is no longer this process (a job adopted after a restart).
fn wrapper_running(pid: u32) -> bool {
    let exists = i32::try_from(pid)
        .ok()
        .is_some_and(|p| nix::sys::signal::kill(Pid::from_raw(p), None).is_ok());
    if !exists {
        return false;
    }
    // Linux: the third field of /proc/<pid>/stat is the state; `Z` is a zombie.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z"),
        Err(_) => true,
    }
}

impl LocalExecutor {
    /// Moves a just-spawned wrapper into the job's cgroup (where there are cgroups), then tells
    /// it to start the command.
    fn start(&mut self, job: &Launch, child: &mut Child) -> std::io::Result<()> {
        use std::io::Write;
        if let Some(cgroups) = &self.cgroups {
            let mut limits = self.limits.for_job(job.gpus.len(), job.gpu_share);
            if let Some(count) = self.limits.cores_for_job(job.gpus.len(), job.gpu_share) {
                let local: Vec<u32> = job
                    .gpus
                    .iter()
                    .filter_map(|g| self.gpu_cores.get(g))
                    .flatten()
                    .copied()
                    .collect();
                let (chosen, shared) = self.cores.take(&job.job_id, count, &local);
                if shared {
                    tracing::warn!(job = %job.job_id, cores = %cores::cpu_list(&chosen), "not enough free cores: the job shares cores with another (more CPUs per GPU than this host has)");
                }
                limits.cores = Some(cores::cpu_list(&chosen));
            }
            cgroups.enter(&job.job_id, child.id(), &job.gpus, limits)?;
        }
        let mut go = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the wrapper's standard input"))?;
        go.write_all(b"go\n")
    }
}

impl Executor for LocalExecutor {
    fn launch(&mut self, job: &Launch) -> std::io::Result<u32> {
        use std::os::unix::process::CommandExt;
        let dir = self.job_dir(&job.job_id);
        // The directory is the service's to make (the one above is root's), but what is in it
        // is the job's: a requeued job's earlier run may have swapped any of it for a link.
        std::fs::create_dir_all(&dir)?;
        // Its output and allocation are the job's own business.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        if let Some(user) = job.user {
            // Its directory is its user's; the directory above only lets it through.
            std::fs::set_permissions(
                &self.root,
                std::os::unix::fs::PermissionsExt::from_mode(0o711),
            )?;
            std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))?;
        }
        let owner = job.user;
        job_files::make_dir(&dir, "tmp", owner)?;
        let tmp = dir.join("tmp");
        let _ = std::fs::remove_file(dir.join("exit"));
        job_files::write(&dir, "allocation", &format!("{}\n", job.allocation), owner)?;
        // Appended, as Slurm's `--open-mode=append`: a requeued job's runs follow each other.
        let stdout = job_files::open(&dir, "stdout", Writing::Append, owner)?;
        let stderr = job_files::open(&dir, "stderr", Writing::Append, owner)?;
        let visible: Vec<String> = job.gpus.iter().map(u32::to_string).collect();
        let cpus = self
            .limits
            .whole_cpus_for_job(job.gpus.len(), job.gpu_share);
        // A clean environment: never the service's (its credentials directory, tokens, proxy
        // settings); a default PATH, HOME and TMPDIR in the job's directory, the job's own
        // variables, then gpuledger's, which a job cannot override.
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("gpuledger-job")
            .arg(&job.command)
            .arg(dir.join("exit"))
            .current_dir(&dir)
            .env_clear()
            .env("PATH", JOB_PATH)
            .env("HOME", &dir)
            .env("TMPDIR", &tmp)
            // Thread pools sized to its CPUs, unless it says otherwise (Python's
            // `os.cpu_count()` and many pools count the whole node).
            .envs(cpus.iter().map(|n| ("OMP_NUM_THREADS", n.to_string())))
            .envs(&job.env)
            .envs(cpus.iter().map(|n| ("GPULEDGER_CPUS", n.to_string())))
            .env("CUDA_VISIBLE_DEVICES", visible.join(","))
            .env("GPULEDGER_JOB_ID", job.job_id.as_str())
            .env("GPULEDGER_ACCOUNT", &job.account)
            .env("GPULEDGER_PROJECT", job.project.as_deref().unwrap_or(""))
            .env("GPULEDGER_ALLOCATION", &job.allocation)
            .env("GPULEDGER_ALLOCATION_FILE", dir.join("allocation"))
            .envs(share_env(job.gpu_share))
            .stdin(Stdio::piped())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        match (&self.private_tmp, job.user) {
            // It becomes its user once its own /tmp is mounted.
            (Ok(()), user) => job_tmp::confine(&mut command, &tmp, user)?,
            // std drops root's supplementary groups when it changes the user.
            (Err(_), Some(user)) => {
                command.uid(user.uid).gid(user.gid);
            }
            (Err(_), None) => {}
        }
        if let (Ok(()), Some(user)) = (&self.private_tmp, job.user) {
            // Started as root (to mount its /tmp), it would get into its directory where its
            // user cannot pass the way there, and its HOME and exit status would not.
            if first_closed_to(&dir, user).is_some() {
                let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
                return Err(explain_spawn_error(denied, &dir, Some(user)));
            }
        }
        let mut child = command
            .spawn()
            .map_err(|e| explain_spawn_error(e, &dir, job.user))?;
        if let Err(error) = self.start(job, &mut child) {
            let _ = child.kill();
            let _ = child.wait();
            self.cores.release(&job.job_id);
            return Err(error);
        }
        let pid = child.id();
        // Where a crash keeps the start from being saved, the restart finds the job by this.
        job_files::write(&dir, "pid", &format!("{pid}\n"), None)?;
        self.jobs
            .insert(job.job_id.clone(), Watched::new(pid, Some(child)));
        Ok(pid)
    }

    fn resized(&mut self, job_id: &JobId, allocation: &str) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.job_dir(job_id);
        // Made anew if the job swapped it: its user is its directory's (which it cannot change).
        let meta = std::fs::metadata(&dir)?;
        let owner = JobUser {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        job_files::write(&dir, "allocation", &format!("{allocation}\n"), Some(owner))?;
        self.signal(job_id, Signal::SIGHUP)
    }

    fn adopt(&mut self, job_id: &JobId, pid: u32) {
        let bound = self.cgroups.as_ref().and_then(|c| c.bound_cores(job_id));
        if let Some(held) = bound.as_deref().and_then(cores::parse_cpu_list) {
            self.cores.adopt(job_id, held);
        }
        self.jobs.insert(job_id.clone(), Watched::new(pid, None));
    }

    fn signal(&mut self, job_id: &JobId, signal: Signal) -> std::io::Result<()> {
        let Some(w) = self.jobs.get_mut(job_id) else {
            return Ok(());
        };
        if signal == Signal::SIGKILL {
            w.killed_at.get_or_insert_with(Instant::now);
        }
        if let Some(cgroups) = &self.cgroups {
            // Every process of the job, also those that left its process group.
            return cgroups.signal(job_id, signal);
        }
        let pid = i32::try_from(w.pid).map_err(std::io::Error::other)?;
        match killpg(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(std::io::Error::from(e)),
        }
    }

    fn reap(&mut self) -> Vec<(JobId, ExitStatus)> {
        let mut done = Vec::new();
        let mut out_of_memory = HashMap::new();
        for (id, w) in self.jobs.iter_mut() {
            let wrapper_gone = match w.child.as_mut() {
                Some(child) => matches!(child.try_wait(), Ok(Some(_))),
                None => !wrapper_running(w.pid),
            };
            if !wrapper_gone {
                continue;
            }
            if let Some(cgroups) = &self.cgroups {
                // Done only once nothing of it is left: what outlived the wrapper (a killed
                // wrapper's command, a process that left the group) is killed first.
                if !cgroups.is_empty(id) {
                    w.killed_at.get_or_insert_with(Instant::now);
                    let _ = cgroups.signal(id, Signal::SIGKILL);
                    continue;
                }
                if let Some(oom) = cgroups.out_of_memory(id) {
                    out_of_memory.insert(id.clone(), oom);
                }
                self.usage.insert(id.clone(), cgroups.usage(id));
                cgroups.remove(id);
            } else if group_alive(w.pid) {
                // The wrapper is gone; the group may still hold the command (it outlived a
                // killed wrapper), which is then finished off.
                if let Ok(p) = i32::try_from(w.pid) {
                    let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            done.push(id.clone());
        }
        let mut out = Vec::with_capacity(done.len());
        for id in done {
            self.jobs.remove(&id);
            self.cores.release(&id);
            job_files::discard_tmp(&self.job_dir(&id));
            let code = read_exit(&self.job_dir(&id));
            let status = match (out_of_memory.remove(&id), code) {
                (Some(oom), code) => ExitStatus::OutOfMemory {
                    code,
                    kills: oom.kills,
                    limit_bytes: oom.limit_bytes,
                },
                (None, Some(code)) => ExitStatus::Code(code),
                (None, None) => ExitStatus::Killed,
            };
            out.push((id, status));
        }
        out
    }

    fn take_usage(&mut self, job_id: &JobId) -> Option<JobUsage> {
        self.usage.remove(job_id)
    }

    fn end_leftovers(&mut self, job_id: &JobId) -> usize {
        if self.jobs.contains_key(job_id) {
            return 0;
        }
        self.cores.release(job_id);
        match &self.cgroups {
            Some(cgroups) => {
                let left = cgroups.processes(job_id).len();
                if left > 0 {
                    let _ = cgroups.signal(job_id, Signal::SIGKILL);
                    let until = Instant::now() + Duration::from_secs(5);
                    while !cgroups.is_empty(job_id) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                cgroups.remove(job_id);
                left
            }
            None => {
                // The wrapper's process group, if the pid it left is still this job's (its
                // environment names it: a pid used again by another process does not).
                let Some(pid) = job_files::read_small(&self.job_dir(job_id), "pid")
                    .and_then(|t| t.trim().parse::<u32>().ok())
                else {
                    return 0;
                };
                let own = format!("GPULEDGER_JOB_ID={job_id}");
                let is_job = std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == own.as_bytes()));
                let Ok(group) = i32::try_from(pid).map(Pid::from_raw) else {
                    return 0;
                };
                if !is_job || killpg(group, Signal::SIGKILL).is_err() {
                    return 0;
                }
                let until = Instant::now() + Duration::from_secs(5);
                while group_alive(pid) && wrapper_running(pid) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                1
            }
        }
    }

    fn unkillable(&mut self) -> Vec<(JobId, usize)> {
        let mut stuck = Vec::new();
        for (id, w) in self.jobs.iter_mut() {
            let overdue = w
                .killed_at
                .is_some_and(|at| at.elapsed() >= self.unkillable_after);
            if !overdue || w.reported_unkillable {
                continue;
            }
            let left = match &self.cgroups {
                Some(cgroups) => cgroups.processes(id).len(),
                None => usize::from(group_alive(w.pid)),
            };
            if left > 0 {
                w.reported_unkillable = true;
                stuck.push((id.clone(), left));
            }
        }
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_exit(ex: &mut LocalExecutor, within: Duration) -> Vec<(JobId, ExitStatus)> {
        let until = Instant::now() + within;
        loop {
            let got = ex.reap();
            if !got.is_empty() || Instant::now() > until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn launch(id: &str, command: &str) -> Launch {
        Launch {
            job_id: JobId::new(id).unwrap(),
            command: command.into(),
            gpus: vec![2, 3],
            allocation: "n001:2-3".into(),
            account: "a".into(),
            project: None,
            env: [("RUN_NAME".to_owned(), "llama 7b".to_owned())].into(),
            user: None,
            gpu_share: None,
        }
    }

    #[test]
    fn a_job_holding_a_part_of_a_gpu_is_told_its_part_and_capped_under_mps() {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        let echo = "echo $CUDA_VISIBLE_DEVICES $GPULEDGER_GPU_SHARE ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none}";
        for (id, share) in [("time", "255m"), ("mig", "3g")] {
            let mut job = launch(id, echo);
            job.gpus = vec![3];
            job.allocation = format!("n001:3@{share}");
            job.gpu_share = Some(share.parse().unwrap());
            ex.launch(&job).unwrap();
        }
        let mut done = Vec::new();
        for _ in 0..10 {
            if done.len() == 2 {
                break;
            }
            done.extend(wait_exit(&mut ex, Duration::from_secs(2)));
        }
        assert_eq!(done.len(), 2, "{done:?}");
        let out = |id: &str| std::fs::read_to_string(dir.path().join(id).join("stdout")).unwrap();
        assert_eq!(out("time"), "3 255m 26\n");
        assert_eq!(out("mig"), "3 3g none\n");
    }

    #[test]
    fn a_job_sees_a_clean_environment_and_a_private_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        ex.launch(&launch(
            "env",
            "env | cut -d= -f1 | sort | tr '\\n' ' '; echo; echo \"$RUN_NAME\"",
        ))
        .unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(
            done,
            vec![(JobId::new("env").unwrap(), ExitStatus::Code(0))]
        );
        let out = std::fs::read_to_string(dir.path().join("env/stdout")).unwrap();
        let mut lines = out.lines();
        // Whatever the test process has (CARGO_*, RUST_*, a credentials directory under
        // systemd), the job sees only these (and the shell's own PWD, SHLVL, OLDPWD).
        let names: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let allowed = [
            "CUDA_VISIBLE_DEVICES",
            "GPULEDGER_ACCOUNT",
            "GPULEDGER_ALLOCATION",
            "GPULEDGER_ALLOCATION_FILE",
            "GPULEDGER_JOB_ID",
            "GPULEDGER_PROJECT",
            "HOME",
            "OLDPWD",
            "PATH",
            "PWD",
            "RUN_NAME",
            "SHLVL",
            "TMPDIR",
        ];
        for name in &names {
            assert!(allowed.contains(name), "the job saw {name}: {names:?}");
        }
        assert!(
            names.contains(&"RUN_NAME") && names.contains(&"HOME"),
            "{names:?}"
        );
        assert_eq!(lines.next(), Some("llama 7b"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_job_sees_its_gpus_and_its_exit_code_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        ex.launch(&launch(
            "1",
            "echo $CUDA_VISIBLE_DEVICES $GPULEDGER_ALLOCATION; exit 3",
        ))
        .unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(done, vec![(JobId::new("1").unwrap(), ExitStatus::Code(3))]);
        let out = std::fs::read_to_string(dir.path().join("1/stdout")).unwrap();
        assert_eq!(out, "2,3 n001:2-3\n");
    }

    #[test]
    fn sigterm_reaches_the_job_and_sigkill_ends_one_that_ignores_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        // Checkpoints on SIGTERM and exits 0.
        ex.launch(&launch(
            "polite",
            "trap 'echo saved; exit 0' TERM; while :; do sleep 0.05; done",
        ))
        .unwrap();
        // Ignores SIGTERM.
        ex.launch(&launch(
            "stubborn",
            "trap '' TERM; while :; do sleep 0.05; done",
        ))
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for id in ["polite", "stubborn"] {
            ex.signal(&JobId::new(id).unwrap(), Signal::SIGTERM)
                .unwrap();
        }
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(
            done,
            vec![(JobId::new("polite").unwrap(), ExitStatus::Code(0))]
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("polite/stdout")).unwrap(),
            "saved\n"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert!(ex.reap().is_empty(), "the stubborn job is still running");
        ex.signal(&JobId::new("stubborn").unwrap(), Signal::SIGKILL)
            .unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(
            done,
            vec![(JobId::new("stubborn").unwrap(), ExitStatus::Killed)]
        );
    }

    /// Whether process `pid` still runs (a zombie waiting for whoever adopted it does not).
    fn alive(pid: i32) -> bool {
        wrapper_running(pid as u32)
    }

    /// The pid a job wrote to `file` in its directory (waiting for it up to 10 s).
    fn pid_in(dir: &Path, file: &str) -> i32 {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                return pid;
            }
            assert!(Instant::now() < until, "no {file} written");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An executor whose jobs are tracked by the cgroup hierarchy `mode` names. The test suite
    /// runs as root on a host with cgroup v2 and the v1 controllers (CI does): both are its
    /// subject.
    fn executor_on(dir: &Path, mode: CgroupMode) -> LocalExecutor {
        let options = ExecutorOptions {
            cgroups: mode,
            ..ExecutorOptions::default()
        };
        let ex = LocalExecutor::with_options(dir, options).unwrap();
        assert!(ex.has_cgroups());
        ex
    }

    #[test]
    fn nothing_a_job_started_outlives_it_not_even_a_process_that_left_its_group_v2() {
        nothing_a_job_started_outlives_it(CgroupMode::V2);
    }

    #[test]
    fn nothing_a_job_started_outlives_it_not_even_a_process_that_left_its_group_v1() {
        nothing_a_job_started_outlives_it(CgroupMode::V1);
    }

    fn nothing_a_job_started_outlives_it(mode: CgroupMode) {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = executor_on(dir.path(), mode);
        // Exits at once, leaving a daemon behind (setsid and a double fork).
        ex.launch(&launch(
            "leaver",
            "(setsid sh -c 'echo $$ > daemon; exec sleep 1000' &) ; sleep 0.3; exit 0",
        ))
        .unwrap();
        // Ignores SIGTERM, and so does a daemon of its own.
        ex.launch(&launch(
            "stubborn",
            "setsid sh -c 'trap \"\" TERM; echo $$ > daemon; while :; do sleep 0.05; done' & \
             trap '' TERM; while :; do sleep 0.05; done",
        ))
        .unwrap();
        let leaver_daemon = pid_in(&dir.path().join("leaver"), "daemon");
        let stubborn_daemon = pid_in(&dir.path().join("stubborn"), "daemon");
        // The leaver is done only once its daemon is gone too.
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        let done = if done.is_empty() {
            wait_exit(&mut ex, Duration::from_secs(10))
        } else {
            done
        };
        assert_eq!(
            done,
            vec![(JobId::new("leaver").unwrap(), ExitStatus::Code(0))]
        );
        assert!(!alive(leaver_daemon), "the leaver's daemon outlived it");
        assert!(!ex
            .cgroups
            .as_ref()
            .unwrap()
            .path(&JobId::new("leaver").unwrap())
            .exists());
        // SIGTERM reaches the stubborn job's daemon too (it ignores it); SIGKILL ends both.
        let stubborn = JobId::new("stubborn").unwrap();
        ex.signal(&stubborn, Signal::SIGTERM).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(ex.reap().is_empty() && alive(stubborn_daemon));
        ex.signal(&stubborn, Signal::SIGKILL).unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(done, vec![(stubborn.clone(), ExitStatus::Killed)]);
        assert!(
            !alive(stubborn_daemon),
            "the stubborn job's daemon outlived SIGKILL"
        );
        // Nothing of its jobs is left in the hierarchy; the executor's own cgroup stays while
        // it lives (its jobs' controllers are handed down in it) and goes with it.
        let job_cgroup = ex.cgroups.as_ref().unwrap().path(&stubborn);
        let executor_cgroup = job_cgroup.parent().unwrap().to_owned();
        assert!(!job_cgroup.exists());
        assert!(executor_cgroup.exists());
        drop(ex);
        assert!(!executor_cgroup.exists());
    }

    #[test]
    fn an_executor_that_never_ran_a_job_leaves_no_cgroup_behind() {
        for mode in [CgroupMode::V2, CgroupMode::V1] {
            let dir = tempfile::tempdir().unwrap();
            let ex = executor_on(dir.path(), mode);
            let job_cgroup = ex.cgroups().unwrap().path(&JobId::new("none").unwrap());
            let executor_cgroup = job_cgroup.parent().unwrap().to_owned();
            assert!(executor_cgroup.exists(), "{mode:?}");
            drop(ex);
            assert!(!executor_cgroup.exists(), "{mode:?}");
        }
    }

    #[test]
    fn a_job_cannot_open_the_device_files_of_gpus_it_was_not_given() {
        // Real character devices of the NVIDIA driver's major number (195) and the GPUs' minor
        // numbers; without the driver, opening one that is allowed fails with ENXIO, one the
        // job's cgroup denies with EPERM, whatever the file's mode. `alias0` is GPU 0 by another
        // name (as `/dev/char/195:0` is): the filter goes by number, not by path.
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        let mknod = |name: &str, minor: u64| {
            nix::sys::stat::mknod(
                &dev.join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(195, minor),
            )
            .unwrap()
        };
        for minor in 0..4u64 {
            mknod(&format!("nvidia{minor}"), minor);
        }
        mknod("alias0", 0);
        let found = crate::cgroup::gpu_devices(&dev);
        assert_eq!(
            found.iter().map(|d| d.index).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        // The default soft limit of older systemd: a dozen programs.
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
        setrlimit(Resource::RLIMIT_MEMLOCK, 64 << 10, hard).unwrap();
        for (mode, filter) in [
            (CgroupMode::V2, "cgroup v2 BPF"),
            (CgroupMode::V1, "cgroup v1 devices"),
        ] {
            let jobs = dir.path().join(format!("{mode:?}"));
            let options = ExecutorOptions {
                cgroups: mode,
                device_dir: dev.clone(),
                ..ExecutorOptions::default()
            };
            let mut ex = LocalExecutor::with_options(&jobs, options).unwrap();
            assert_eq!(
                ex.cgroups().unwrap().device_filter().map(|f| f.name()),
                Ok(filter),
                "this host has cgroup v2 with BPF and the v1 devices controller"
            );
            if mode == CgroupMode::V2 {
                // Lifted for the filters' programs, as kernels before 5.11 count them there: to
                // the hard limit at least (this test process may not raise that).
                let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
                assert!(soft == hard && soft > 64 << 10, "{soft} {hard}");
            }
            // Given GPUs 2 and 3 (launch's default).
            let mut job = launch(
                "dev",
                "for f in nvidia0 nvidia1 nvidia2 nvidia3 alias0; do cat \"$DEV/$f\" 2>&1 >/dev/null | sed 's/.*: //'; done; cat /dev/null && echo other devices open",
            );
            job.env.insert("DEV".into(), dev.display().to_string());
            ex.launch(&job).unwrap();
            let done = wait_exit(&mut ex, Duration::from_secs(10));
            assert_eq!(
                done,
                vec![(JobId::new("dev").unwrap(), ExitStatus::Code(0))]
            );
            let out = std::fs::read_to_string(jobs.join("dev/stdout")).unwrap();
            assert_eq!(
                out,
                "Operation not permitted\nOperation not permitted\nNo such device or address\nNo such device or address\nOperation not permitted\nother devices open\n",
                "{mode:?}"
            );
            // Outside a job the same files open as the driver allows (the denial is the job's).
            let outside = std::fs::File::open(dev.join("nvidia0")).unwrap_err();
            assert_eq!(outside.raw_os_error(), Some(nix::libc::ENXIO), "{mode:?}");
        }
    }

    #[test]
    fn a_process_that_outlives_sigkill_is_reported_once_and_the_job_ends_when_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let options = ExecutorOptions {
            cgroups: CgroupMode::V2,
            unkillable_after: Duration::from_millis(500),
            ..ExecutorOptions::default()
        };
        let mut ex = LocalExecutor::with_options(dir.path(), options).unwrap();
        ex.launch(&launch("stuck", "sleep 1000 & echo $! > sleeper; wait"))
            .unwrap();
        let sleeper = pid_in(&dir.path().join("stuck"), "sleeper");
        // A process stuck in the kernel does not die of SIGKILL until it comes back: one frozen
        // by the v1 freezer (in a cgroup of the test's own) stands in for it.
        let freezer = PathBuf::from("/sys/fs/cgroup/freezer")
            .join(format!("gpuledger-test-{}", std::process::id()));
        std::fs::create_dir_all(&freezer).unwrap();
        std::fs::write(freezer.join("cgroup.procs"), sleeper.to_string()).unwrap();
        std::fs::write(freezer.join("freezer.state"), "FROZEN").unwrap();
        let job = JobId::new("stuck").unwrap();
        ex.signal(&job, Signal::SIGKILL).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(ex.reap().is_empty(), "done while a process of it is left");
        assert!(ex.unkillable().is_empty(), "reported before the timeout");
        std::thread::sleep(Duration::from_millis(500));
        assert!(ex.reap().is_empty());
        assert_eq!(ex.unkillable(), vec![(job.clone(), 1)]);
        assert!(ex.unkillable().is_empty(), "reported once");
        // Back from the kernel, it dies of the SIGKILL it was sent; the job is done.
        std::fs::write(freezer.join("freezer.state"), "THAWED").unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(done, vec![(job, ExitStatus::Killed)]);
        assert!(!alive(sleeper));
        std::fs::remove_dir(&freezer).unwrap();
    }

    #[test]
    fn a_job_whose_user_cannot_reach_its_directory_is_told_which_directory_stops_it() {
        use std::os::unix::fs::PermissionsExt;
        // Below /tmp, jobs share its /tmp and are started as their user; elsewhere they get
        // their own and are started as root, which reaches the directory their user cannot.
        for (under, tmp) in [("/tmp", JobTmp::Shared), ("/var/tmp", JobTmp::Private)] {
            let dir = tempfile::tempdir_in(under).unwrap();
            let closed = dir.path().join("closed");
            std::fs::create_dir(&closed).unwrap();
            std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
            let options = ExecutorOptions {
                tmp,
                ..ExecutorOptions::default()
            };
            let mut ex = LocalExecutor::with_options(closed.join("jobs"), options).unwrap();
            let mut job = launch("far", "true");
            job.user = Some(JobUser {
                uid: 65534,
                gid: 65534,
            });
            let error = ex.launch(&job).unwrap_err().to_string();
            assert!(
                error.contains(&format!("may not pass {} ", closed.display()))
                    && error.contains("--jobs-dir"),
                "{tmp:?}: {error}"
            );
        }
    }

    #[test]
    fn links_a_job_leaves_in_its_directory_never_make_the_service_write_or_chown_elsewhere() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // The job runs as `nobody` and owns its directory; before it is launched again (a
        // requeue after preemption) or resized, it swaps every file the service (root) writes
        // or gives it for a link to root's files: its output would be appended to root's file
        // (a cron entry, authorized_keys), root's file truncated, or chowned to the tenant.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let victims = dir.path().join("root-only");
        std::fs::create_dir(&victims).unwrap();
        std::fs::set_permissions(&victims, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (file, folder) = (victims.join("file"), victims.join("folder"));
        std::fs::write(&file, "root's\n").unwrap();
        std::fs::create_dir(&folder).unwrap();
        let nobody = JobUser {
            uid: 65534,
            gid: 65534,
        };
        let mut ex = LocalExecutor::new(dir.path().join("jobs"));
        let mut job = launch(
            "requeued",
            "rm -f stdout stderr allocation pid && rmdir tmp && \
             for f in stdout allocation pid; do ln -s \"$VICTIMS/file\" $f; done && \
             ln -s \"$VICTIMS/folder\" tmp && mkfifo stderr && echo swapped >&2",
        );
        job.user = Some(nobody);
        job.env
            .insert("VICTIMS".into(), victims.display().to_string());
        ex.launch(&job).unwrap();
        assert_eq!(wait_exit(&mut ex, Duration::from_secs(10)).len(), 1);
        let job_dir = ex.job_dir(&job.job_id);
        assert!(
            std::fs::symlink_metadata(job_dir.join("stdout"))
                .unwrap()
                .file_type()
                .is_symlink(),
            "the job swapped its files"
        );
        // Launched again, then resized.
        job.command =
            "trap '' HUP; echo again; stat -c '%u %F' tmp; sleep 0.3; cat \"$GPULEDGER_ALLOCATION_FILE\"".into();
        ex.launch(&job).unwrap();
        // Once its command is up (a resize comes minutes into a run).
        std::thread::sleep(Duration::from_millis(150));
        ex.resized(&job.job_id, "n001:0-3").unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(done, vec![(job.job_id.clone(), ExitStatus::Code(0))]);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "root's\n");
        for victim in [&file, &folder] {
            let meta = std::fs::metadata(victim).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (0, 0), "{}", victim.display());
        }
        // The job's own files are new plain files of its own (its tmp was, while it ran).
        for name in ["stdout", "stderr", "allocation"] {
            let meta = std::fs::symlink_metadata(job_dir.join(name)).unwrap();
            assert!(!meta.file_type().is_symlink(), "{name}");
            assert_eq!(meta.uid(), 65534, "{name}");
        }
        assert!(std::fs::read_to_string(job_dir.join("stdout"))
            .unwrap()
            .starts_with("again\n65534 directory\n"));
        assert_eq!(
            std::fs::read_to_string(job_dir.join("allocation")).unwrap(),
            "n001:0-3\n"
        );
    }

    #[test]
    fn the_status_is_the_commands_own_even_when_the_signal_interrupts_the_wrappers_wait() {
        // The old wrapper recorded 143 for 2 of 40 of these (its `wait`, interrupted by the
        // TERM it notes, returned 128 + 15 while the shell reaped the command).
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        let ids: Vec<String> = (0..24).map(|k| format!("j{k}")).collect();
        for id in &ids {
            ex.launch(&launch(
                id,
                "trap 'exit 0' TERM; while :; do sleep 0.01; done",
            ))
            .unwrap();
        }
        ex.launch(&launch("plain", "while :; do sleep 0.01; done"))
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for id in ids.iter().map(String::as_str).chain(["plain"]) {
            ex.signal(&JobId::new(id).unwrap(), Signal::SIGTERM)
                .unwrap();
        }
        let mut done = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        while done.len() < ids.len() + 1 && Instant::now() < until {
            done.extend(wait_exit(&mut ex, Duration::from_secs(1)));
        }
        done.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected: Vec<(JobId, ExitStatus)> = ids
            .iter()
            .map(|id| (JobId::new(id).unwrap(), ExitStatus::Code(0)))
            .collect();
        // A command that does not trap TERM dies of it: 128 + 15, as a shell reports.
        expected.push((JobId::new("plain").unwrap(), ExitStatus::Code(143)));
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(done, expected);
    }

    /// The job's cgroup of a v1 controller, as `/proc/<pid>/cgroup` printed by the job names
    /// it (`4:memory:/a/b`), under that controller's mount on this host.
    fn v1_cgroup_in(printed: &str, controller: &str) -> PathBuf {
        let path = printed
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })
            .unwrap_or_else(|| panic!("no {controller} line in {printed:?}"));
        PathBuf::from(format!("/sys/fs/cgroup/{controller}{path}"))
    }

    #[test]
    fn a_job_is_held_to_its_memory_and_cpu_per_gpu_and_ends_out_of_memory_past_it() {
        for mode in [CgroupMode::V2, CgroupMode::V1] {
            let dir = tempfile::tempdir().unwrap();
            let options = ExecutorOptions {
                cgroups: mode,
                limits: JobLimits {
                    memory_per_gpu: Some(gpuledger_model::ByteSize(32 << 20)),
                    cpus_per_gpu: Some("0.1".parse().unwrap()),
                    tasks_max: Some(20),
                    bind_cores: false,
                },
                ..ExecutorOptions::default()
            };
            let mut ex = LocalExecutor::with_options(dir.path(), options).unwrap();
            assert_eq!(
                ex.cgroups().unwrap().limit_places(),
                [Some("v1"), Some("v1"), Some("v1"), None],
                "this host binds memory, cpu and pids to cgroup v1 ({mode:?})"
            );
            // Two GPUs each (launch's default): 64 MiB and a fifth of a CPU.
            let hog = "cat /proc/self/cgroup; head -c 200000000 /dev/zero | tail -c 200000000 >/dev/null; echo after";
            let small = "head -c 8000000 /dev/zero | tail -c 8000000 >/dev/null";
            let spin = "timeout 1 sh -c 'while :; do :; done'; times";
            // A fork bomb, slowed down: each child it got noted, then all waited for.
            let forks = "for i in $(seq 60); do sleep 3 & echo $! >> children; done";
            let jobs = [
                ("forks", forks),
                ("hog", hog),
                ("small", small),
                ("spin", spin),
            ];
            for (id, command) in jobs {
                ex.launch(&launch(id, command)).unwrap();
            }
            let mut done = Vec::new();
            let until = Instant::now() + Duration::from_secs(20);
            while done.len() < 4 && Instant::now() < until {
                done.extend(wait_exit(&mut ex, Duration::from_secs(1)));
            }
            done.sort_by(|a, b| a.0.cmp(&b.0));
            let id = |s: &str| JobId::new(s).unwrap();
            assert_eq!(done[0].0, id("forks"));
            assert_eq!(
                done[1..],
                vec![
                    (
                        id("hog"),
                        ExitStatus::OutOfMemory {
                            // Under v1 the kernel kills the biggest process, not the job whole.
                            code: Some(0),
                            kills: 1,
                            limit_bytes: Some(64 << 20),
                        }
                    ),
                    (id("small"), ExitStatus::Code(0)),
                    (id("spin"), ExitStatus::Code(0)),
                ],
                "{mode:?}"
            );
            // What each used: the hog's memory up to its limit; the spinner's CPU time (v2's
            // cpu.stat, v1's cpuacct, both mounted here).
            let hog = ex.take_usage(&id("hog")).unwrap();
            let peak = hog.peak_memory_bytes.unwrap();
            assert!(
                ((32 << 20)..=(64 << 20)).contains(&peak),
                "{mode:?}: {peak}"
            );
            assert_eq!(ex.take_usage(&id("hog")), None, "taken once");
            let spun = ex.take_usage(&id("spin")).unwrap().cpu_time_us;
            let us = spun.unwrap_or_else(|| panic!("{mode:?}: no CPU time"));
            assert!(
                (100_000..=400_000).contains(&us),
                "{mode:?}: {us} µs in a second at 0.2 CPU"
            );
            let out =
                |id: &str| std::fs::read_to_string(dir.path().join(id).join("stdout")).unwrap();
            let hog_out = out("hog");
            assert!(hog_out.ends_with("after\n"), "{hog_out}");
            for controller in ["memory", "cpu"] {
                let cgroup = v1_cgroup_in(&hog_out, controller);
                assert!(
                    cgroup.ends_with("hog") && !cgroup.exists(),
                    "the job's {controller} cgroup {cgroup:?} is removed with it"
                );
            }
            // `times`: the shell's, then its children's user and system time. A busy second
            // at a fifth of a CPU: at most 0.2 s and a period's slack.
            let spin_out = out("spin");
            let seconds = |t: &str| -> f64 {
                let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
                m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
            };
            let children: f64 = spin_out
                .lines()
                .nth(1)
                .unwrap()
                .split_whitespace()
                .map(seconds)
                .sum();
            assert!(
                children < 0.5,
                "{mode:?}: {children} s of CPU in a second: {spin_out}"
            );
            // 20 tasks: the wrapper and the job's shell, 18 children at most (the `$(seq)`
            // subshell was one before them); the 19th fork failed and the shell gave up.
            let children = std::fs::read_to_string(dir.path().join("forks/children")).unwrap();
            let forked = children.lines().count();
            assert!((10..=18).contains(&forked), "{mode:?}: {forked} children");
            let err = std::fs::read_to_string(dir.path().join("forks/stderr")).unwrap();
            assert!(err.contains("Cannot fork"), "{err}");
        }
    }

    #[test]
    fn limits_without_a_cgroup_to_hold_them_refuse_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let options = ExecutorOptions {
            cgroups: CgroupMode::Off,
            limits: JobLimits {
                memory_per_gpu: Some(gpuledger_model::ByteSize(1 << 30)),
                ..JobLimits::default()
            },
            ..ExecutorOptions::default()
        };
        let error = LocalExecutor::with_options(dir.path(), options).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("--cgroup: off, and limits per job"),
            "{error}"
        );
    }

    #[test]
    fn a_job_has_a_tmp_and_dev_shm_of_its_own() {
        // Not below /tmp, which the jobs' own would hide.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let options = ExecutorOptions {
            tmp: JobTmp::Private,
            ..ExecutorOptions::default()
        };
        let mut ex = LocalExecutor::with_options(dir.path(), options).unwrap();
        let mark = format!("gpuledger-tmp-test-{}", std::process::id());
        let mounts = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| l.contains(" /tmp ") || l.contains(" /dev/shm "))
                .count()
        };
        let host_mounts = mounts();
        std::fs::write(format!("/tmp/{mark}-host"), "the host's").unwrap();
        let mut writer = launch(
            "writer",
            &format!("id -u; echo mine > /tmp/{mark} && echo shm > /dev/shm/{mark} && ls -A /tmp /dev/shm && cat \"$TMPDIR/{mark}\""),
        );
        writer.user = Some(JobUser {
            uid: 65534,
            gid: 65534,
        });
        ex.launch(&writer).unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(
            done,
            vec![(JobId::new("writer").unwrap(), ExitStatus::Code(0))]
        );
        ex.launch(&launch("reader", "ls -A /tmp /dev/shm; cat /tmp/*"))
            .unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        let _ = std::fs::remove_file(format!("/tmp/{mark}-host"));
        assert_eq!(
            done,
            vec![(JobId::new("reader").unwrap(), ExitStatus::Code(1))]
        );
        let out = |id: &str| std::fs::read_to_string(dir.path().join(id).join("stdout")).unwrap();
        // Its user, and only its own files in either.
        assert_eq!(
            out("writer"),
            format!("65534\n/dev/shm:\n{mark}\n\n/tmp:\n{mark}\nmine\n")
        );
        assert_eq!(
            out("reader"),
            "/dev/shm:\n\n/tmp:\n",
            "nothing of the other job's"
        );
        // Its /tmp was its TMPDIR, thrown away as it ended; nothing reached the host's, and no
        // mount stayed.
        wait_until_tmp_discarded(&dir.path().join("writer"));
        assert!(!Path::new("/tmp").join(&mark).exists());
        assert!(!Path::new("/dev/shm").join(&mark).exists());
        assert_eq!(mounts(), host_mounts);
    }

    /// Waits (a while) until the job's `tmp` and whatever was set aside of it are gone.
    fn wait_until_tmp_discarded(job_dir: &Path) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let left: Vec<String> = std::fs::read_dir(job_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("tmp") || name.starts_with(".tmp"))
                .collect();
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < until, "left in {job_dir:?}: {left:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_runs_tmp_is_thrown_away_when_it_ends_and_its_output_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = LocalExecutor::new(dir.path());
        let job_dir = dir.path().join("scratch");
        // What an earlier removal, cut short by a restart, left is removed too.
        std::fs::create_dir_all(job_dir.join(".tmp-discarded-1/deep")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "keep").unwrap();
        let command = format!(
            "mkdir -p $TMPDIR/a/b && head -c 100000 /dev/zero > $TMPDIR/a/b/big && ln -s {} $TMPDIR/link && echo done",
            outside.display()
        );
        ex.launch(&launch("scratch", &command)).unwrap();
        let done = wait_exit(&mut ex, Duration::from_secs(10));
        assert_eq!(
            done,
            vec![(JobId::new("scratch").unwrap(), ExitStatus::Code(0))]
        );
        wait_until_tmp_discarded(&job_dir);
        assert_eq!(
            std::fs::read_to_string(job_dir.join("stdout")).unwrap(),
            "done\n"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "keep",
            "a link in it is removed, not followed"
        );
    }

    #[test]
    fn jobs_bound_to_cores_get_cores_of_their_own_and_an_adopted_job_keeps_its() {
        let dir = tempfile::tempdir().unwrap();
        let online = cores::online_cores();
        assert!(online.len() >= 2, "this host has two cores: {online:?}");
        // The driver and the PCI bus say GPUs 2 and 3 (launch's default) are on the second
        // core; no GPU is on the first.
        let topology = tempfile::tempdir().unwrap();
        let (first, second) = (online[0], online[1]);
        for (minor, address) in [(2, "0000:9a:00.0"), (3, "0000:ab:00.0")] {
            cores::describe_gpu(topology.path(), minor, address, &second.to_string());
        }
        let options = || ExecutorOptions {
            cgroups: CgroupMode::V2,
            limits: JobLimits {
                // Two GPUs each (launch's default): one core.
                cpus_per_gpu: Some("0.5".parse().unwrap()),
                bind_cores: true,
                ..JobLimits::default()
            },
            topology_root: topology.path().to_owned(),
            ..ExecutorOptions::default()
        };
        let mut ex = LocalExecutor::with_options(dir.path(), options()).unwrap();
        assert_eq!(ex.cgroups().unwrap().limit_places()[3], Some("v1"));
        let allowed = "grep Cpus_allowed_list /proc/self/status | cut -f2; nproc; sleep 1";
        for id in ["a", "b"] {
            ex.launch(&launch(id, allowed)).unwrap();
        }
        // Restarted: a new executor adopts `b` and finds the core its cgroup holds.
        let b_pid = pid_in(&dir.path().join("b"), "pid") as u32;
        let mut again = LocalExecutor::with_options(dir.path(), options()).unwrap();
        again.adopt(&JobId::new("b").unwrap(), b_pid);
        again.launch(&launch("c", allowed)).unwrap();
        let out = |id: &str| std::fs::read_to_string(dir.path().join(id).join("stdout"));
        let until = Instant::now() + Duration::from_secs(10);
        while ["a", "b", "c"]
            .iter()
            .any(|id| !out(id).is_ok_and(|t| t.lines().count() == 2))
        {
            assert!(Instant::now() < until, "the jobs printed nothing");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (a, b, c) = (out("a").unwrap(), out("b").unwrap(), out("c").unwrap());
        assert_eq!(
            a,
            format!("{second}\n1\n"),
            "its GPUs' core, and nproc says one"
        );
        assert_eq!(
            b,
            format!("{first}\n1\n"),
            "the GPUs' core is a's: a free one"
        );
        assert_eq!(
            c,
            format!("{second}\n1\n"),
            "b's core is held (adopted): c gets the GPUs' core, free in this executor's book"
        );
        // Both executors watch `b`: each reports it.
        let (mut by_first, mut by_again) = (0, 0);
        let until = Instant::now() + Duration::from_secs(10);
        while by_first < 2 || by_again < 2 {
            assert!(Instant::now() < until, "the jobs did not end");
            by_first += ex.reap().len();
            by_again += again.reap().len();
            std::thread::sleep(Duration::from_millis(20));
        }
        // All ended, their cgroups (and the executor's, emptied) removed: the next job's are
        // made again, and it is still bound.
        again
            .launch(&launch(
                "d",
                "grep Cpus_allowed_list /proc/self/status | cut -f2",
            ))
            .unwrap();
        assert_eq!(
            wait_exit(&mut again, Duration::from_secs(10)),
            vec![(JobId::new("d").unwrap(), ExitStatus::Code(0))]
        );
        assert_eq!(out("d").unwrap(), format!("{second}\n"));
    }

    #[test]
    fn core_binding_needs_cpus_per_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let options = ExecutorOptions {
            limits: JobLimits {
                bind_cores: true,
                ..JobLimits::default()
            },
            ..ExecutorOptions::default()
        };
        let error = LocalExecutor::with_options(dir.path(), options).unwrap_err();
        assert!(error.to_string().starts_with("--job-cpu-bind: "), "{error}");
    }

    #[test]
    fn a_job_with_limited_cpus_is_told_how_many_and_its_thread_pools_sized_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let options = ExecutorOptions {
            limits: JobLimits {
                cpus_per_gpu: Some("1.5".parse().unwrap()),
                ..JobLimits::default()
            },
            ..ExecutorOptions::default()
        };
        let mut ex = LocalExecutor::with_options(dir.path(), options).unwrap();
        let echo = "echo $GPULEDGER_CPUS $OMP_NUM_THREADS";
        ex.launch(&launch("sized", echo)).unwrap();
        let mut own = launch("own", echo);
        own.env.insert("OMP_NUM_THREADS".into(), "7".into());
        ex.launch(&own).unwrap();
        let mut done = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while done.len() < 2 && Instant::now() < until {
            done.extend(wait_exit(&mut ex, Duration::from_secs(1)));
        }
        let out = |id: &str| std::fs::read_to_string(dir.path().join(id).join("stdout")).unwrap();
        // Two GPUs (launch's default) at 1.5 CPUs each.
        assert_eq!(out("sized"), "3 3\n");
        assert_eq!(out("own"), "3 7\n", "its own OMP_NUM_THREADS stands");
    }
}
