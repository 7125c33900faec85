//! Each job in a cgroup of its own, so that every process it starts stays countable and
//! killable: `setsid`, a double fork or a daemonizing tool leave the job's process group, never
//! its cgroup. A stop signal goes to every process of the cgroup, SIGKILL reaches them all at
//! once, and a job is finished only once its cgroup is empty (then removed).
//!
//! Two ways to track a job, as Slurm's `cgroup/v2` and `cgroup/v1` plugins:
//! - cgroup v2 ([`v2`]): one cgroup per job; SIGKILL is `cgroup.kill`, emptiness is
//!   `cgroup.events`.
//! - cgroup v1 ([`v1`]), where no writable v2 hierarchy is mounted: a cgroup per job in the
//!   `freezer` and `pids` controllers; SIGKILL freezes the job, kills every process and thaws it,
//!   so that nothing forks away in between.
//!
//! A job cannot open the device files of the GPUs it was not given (`CUDA_VISIBLE_DEVICES` only
//! hides them): under v2 a BPF device filter attached to its cgroup ([`bpf`]) denies them, under
//! v1 (or where the kernel refuses the filter) its cgroup in the v1 `devices` controller
//! ([`devices`]), where that is mounted.
//!
//! Memory and CPU may be held to each job's part of the host ([`limits`]): in v2 where the
//! hierarchy has the controllers, else in the v1 `memory` and `cpu` controllers.
//!
//! The job cgroups of one executor live under `<the service's own cgroup>/gpuledger-<key>/`, the
//! key derived from the executor's job directory, so that two schedulers on one host (or two
//! in one test process) never share one, and a restarted scheduler finds its jobs again. Under
//! systemd the service needs `Delegate=yes` for its cgroup to be writable (deploy/systemd).

mod bpf;
mod devices;
mod limits;
mod v1;
mod v2;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

use gpuledger_model::JobId;

pub use devices::{gpu_devices, GpuDevice};
pub use limits::{parse_memory_per_gpu, CpuCount, JobLimits, Limits, OutOfMemory, MIN_TASKS};

/// Which cgroup hierarchy tracks jobs (`--cgroup`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// v2 where a writable v2 hierarchy is mounted, else v1 `freezer` and `pids`, else none
    /// (process groups only, with a warning).
    #[default]
    Auto,
    /// cgroup v2 only; the scheduler refuses to start without it.
    V2,
    /// cgroup v1 `freezer` and `pids` only; the scheduler refuses to start without them.
    V1,
    /// No cgroups: jobs are tracked by process group, and one that leaves it (`setsid`) escapes
    /// its stop.
    Off,
}

/// How jobs are tracked: one of the two hierarchies.
#[derive(Debug, Clone)]
enum Tracker {
    V2(v2::Hierarchy),
    V1(v1::Hierarchy),
}

/// How a job is kept from the device files of the GPUs it was not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceFilter {
    /// A BPF program attached to the job's cgroup v2.
    Bpf,
    /// The job's cgroup in the v1 `devices` controller, under this parent.
    V1(PathBuf),
}

impl DeviceFilter {
    /// What it is, for the log.
    pub fn name(&self) -> &'static str {
        match self {
            DeviceFilter::Bpf => "cgroup v2 BPF",
            DeviceFilter::V1(_) => "cgroup v1 devices",
        }
    }
}

/// Where an executor's job cgroups live.
#[derive(Debug, Clone)]
pub struct JobCgroups {
    tracker: Tracker,
    /// How GPUs' device files are denied, or why they cannot be.
    devices: Result<DeviceFilter, String>,
    /// Where the GPU device files are (`/dev`).
    device_dir: PathBuf,
    /// Where jobs' memory, CPU and tasks are limited.
    enforcement: limits::Enforcement,
}

impl JobCgroups {
    /// The job cgroups of the executor whose job directory is `jobs_root`, under this process's
    /// own cgroups, created if needed; `None` for [`CgroupMode::Off`]. An error when the mode
    /// asked for has no writable hierarchy here (`Auto`: neither has), or when `limits` asks
    /// for a limit no controller here can hold.
    pub fn for_executor(
        jobs_root: &Path,
        mode: CgroupMode,
        device_dir: &Path,
        limits: &JobLimits,
    ) -> io::Result<Option<Self>> {
        let name = format!("gpuledger-{:016x}", fnv1a(jobs_root));
        let tracker = match mode {
            CgroupMode::Off => return Ok(None),
            CgroupMode::V2 => Tracker::V2(v2::Hierarchy::create(&name)?),
            CgroupMode::V1 => Tracker::V1(v1::Hierarchy::create(&name)?),
            CgroupMode::Auto => match v2::Hierarchy::create(&name) {
                Ok(v2) => Tracker::V2(v2),
                Err(v2_error) => match v1::Hierarchy::create(&name) {
                    Ok(v1) => Tracker::V1(v1),
                    Err(v1_error) => {
                        return Err(io::Error::new(
                            v2_error.kind(),
                            format!("cgroup v2: {v2_error}; cgroup v1: {v1_error}"),
                        ))
                    }
                },
            },
        };
        let bpf = match &tracker {
            Tracker::V2(h) => bpf::probe(h.parent()).map_err(|e| format!("cgroup v2 BPF: {e}")),
            Tracker::V1(_) => Err("jobs are tracked in cgroup v1".to_owned()),
        };
        let devices = bpf.map(|()| DeviceFilter::Bpf).or_else(|bpf_error| {
            controller_cgroup("devices", &name)
                .map(DeviceFilter::V1)
                .map_err(|v1_error| format!("{bpf_error}; {v1_error}"))
        });
        let v2_parent = match &tracker {
            Tracker::V2(h) => Some(h.parent()),
            Tracker::V1(_) => None,
        };
        let enforcement = limits::Enforcement::set_up(limits, v2_parent, &name)?;
        Ok(Some(JobCgroups {
            tracker,
            devices,
            device_dir: device_dir.to_owned(),
            enforcement,
        }))
    }

    /// `v2` or `v1`: the hierarchy that tracks jobs.
    pub fn version(&self) -> &'static str {
        match self.tracker {
            Tracker::V2(_) => "v2",
            Tracker::V1(_) => "v1",
        }
    }

    /// How GPUs a job was not given are denied to it, or why they are not.
    pub fn device_filter(&self) -> Result<&DeviceFilter, &str> {
        self.devices.as_ref().map_err(String::as_str)
    }

    /// Where memory, CPU, task limits and core binding are held (`v2`, `v1`), each `None`
    /// when not asked for.
    pub fn limit_places(&self) -> [Option<&'static str>; 4] {
        let name = |place: &Option<limits::Place>| {
            place.as_ref().map(|p| match p {
                limits::Place::V2 => "v2",
                limits::Place::V1(_) => "v1",
            })
        };
        [
            name(&self.enforcement.memory),
            name(&self.enforcement.cpu),
            name(&self.enforcement.tasks),
            name(&self.enforcement.cpuset),
        ]
    }

    /// The job's cgroup directory in the hierarchy that tracks it.
    pub fn path(&self, job: &JobId) -> PathBuf {
        match &self.tracker {
            Tracker::V2(h) => h.path(job),
            Tracker::V1(h) => h.path(job),
        }
    }

    /// Creates the job's cgroups and moves process `pid` (the job's wrapper, before it starts
    /// the command) into them; the device files of this host's GPUs other than `gpus` are
    /// denied first, and its memory, CPU and tasks limited to `limits`. The service moves it:
    /// a job's own user may not.
    pub fn enter(&self, job: &JobId, pid: u32, gpus: &[u32], limits: Limits) -> io::Result<()> {
        let denied = match &self.devices {
            Ok(_) => devices::others(&gpu_devices(&self.device_dir), gpus),
            Err(_) => Vec::new(),
        };
        if let Ok(DeviceFilter::V1(parent)) = &self.devices {
            devices::confine(&parent.join(job.as_str()), &denied, pid)?;
        }
        match &self.tracker {
            Tracker::V2(h) => {
                // Made again, its controllers handed down again, where it went missing.
                self.enforcement.ready_v2_parent(h.parent())?;
                let dir = h.create_job(job)?;
                if self.devices == Ok(DeviceFilter::Bpf) && !denied.is_empty() {
                    bpf::deny(&dir, &denied)?;
                }
                self.enforcement.apply(job, Some(&dir), limits, pid)?;
                move_into(&dir, pid)
            }
            Tracker::V1(h) => {
                self.enforcement.apply(job, None, limits, pid)?;
                h.enter(job, pid)
            }
        }
    }

    /// What the job's processes used, all of them together: CPU time where its cgroup counts
    /// it (every v2 cgroup does; in v1, `cpuacct` where mounted), peak memory where its memory
    /// is limited. Read before its cgroups are removed.
    pub fn usage(&self, job: &JobId) -> JobUsage {
        let cpu_time_us = match &self.tracker {
            Tracker::V2(h) => read_field(&h.path(job).join("cpu.stat"), "usage_usec"),
            Tracker::V1(h) => h.cpu_time_us(job),
        };
        JobUsage {
            cpu_time_us,
            peak_memory_bytes: self.enforcement.peak_memory(job, &self.path(job)),
        }
    }

    /// The cores the job's cpuset binds it to, where jobs are bound (a job adopted after a
    /// restart).
    pub fn bound_cores(&self, job: &JobId) -> Option<String> {
        self.enforcement.bound_cores(job, &self.path(job))
    }

    /// Whether the kernel's OOM killer ended processes of the job at its memory limit; read
    /// before the job's cgroups are removed.
    pub fn out_of_memory(&self, job: &JobId) -> Option<OutOfMemory> {
        self.enforcement.out_of_memory(job, &self.path(job))
    }

    /// The processes in the job's cgroup now.
    pub fn processes(&self, job: &JobId) -> Vec<i32> {
        read_procs(&self.path(job).join("cgroup.procs"))
    }

    /// Sends `signal` to every process of the job's cgroup; SIGKILL reaches processes forked
    /// while it runs too.
    pub fn signal(&self, job: &JobId, signal: Signal) -> io::Result<()> {
        match &self.tracker {
            Tracker::V2(h) => h.signal(job, signal),
            Tracker::V1(h) => h.signal(job, signal),
        }
    }

    /// Whether no process is left in the job's cgroup (or it is gone).
    pub fn is_empty(&self, job: &JobId) -> bool {
        match &self.tracker {
            Tracker::V2(h) => h.is_empty(job),
            Tracker::V1(_) => !self.path(job).exists() || self.processes(job).is_empty(),
        }
    }

    /// Removes the job's (empty) cgroups. The executor's own stay while it lives: one made
    /// again for the next job would lack the controllers handed down to its jobs.
    pub fn remove(&self, job: &JobId) {
        for parent in self.parents() {
            let _ = fs::remove_dir(parent.join(job.as_str()));
        }
    }

    /// Removes the executor's own cgroups where no job is left in them (an executor going
    /// away); those still holding a job stay for the next executor over the same jobs to adopt.
    pub fn release(&self) {
        for parent in self.parents() {
            let _ = fs::remove_dir(parent);
        }
    }

    /// The executor's own cgroups, in every hierarchy it uses: its jobs' cgroups are children
    /// of each.
    fn parents(&self) -> Vec<PathBuf> {
        let mut parents = match &self.tracker {
            Tracker::V2(h) => vec![h.parent().to_owned()],
            Tracker::V1(h) => h.parents(),
        };
        if let Ok(DeviceFilter::V1(parent)) = &self.devices {
            parents.push(parent.clone());
        }
        parents.extend(self.enforcement.v1_parents());
        parents
    }
}

/// What a job's processes used (see [`JobCgroups::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobUsage {
    pub cpu_time_us: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
}

/// The number after `key ` on its line of a cgroup's flat-keyed file (`cpu.stat`,
/// `memory.events`).
fn read_field(file: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(file).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The process ids in a `cgroup.procs` file; none when it cannot be read.
fn read_procs(file: &Path) -> Vec<i32> {
    fs::read_to_string(file)
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Writes a process id into a cgroup's `cgroup.procs`.
fn move_into(dir: &Path, pid: u32) -> io::Result<()> {
    fs::write(dir.join("cgroup.procs"), pid.to_string())
}

/// One mount of a cgroup filesystem, from `/proc/self/mountinfo`.
#[derive(Debug)]
struct Mount {
    /// The part of the hierarchy mounted there (`/` unless a container's view).
    root: String,
    point: PathBuf,
}

/// The mount of the v2 hierarchy (`fs_type` `cgroup2`), or of the v1 hierarchy holding
/// `controller` (`fs_type` `cgroup`, the controller among its options).
fn find_mount(controller: Option<&str>) -> io::Result<Mount> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let mut fs = fs.split_whitespace();
            let (fs_type, _source, options) = (fs.next()?, fs.next()?, fs.next().unwrap_or(""));
            let wanted = match controller {
                None => fs_type == "cgroup2",
                Some(c) => fs_type == "cgroup" && options.split(',').any(|o| o == c),
            };
            let mut fields = mount.split_whitespace();
            let root = fields.nth(3)?.to_owned();
            let point = PathBuf::from(fields.next()?);
            wanted.then_some(Mount { root, point })
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                match controller {
                    None => "no cgroup v2 hierarchy is mounted".to_owned(),
                    Some(c) => format!("no cgroup v1 `{c}` controller is mounted"),
                },
            )
        })
}

/// This process's cgroup in the v2 hierarchy (the `0::` line of `/proc/self/cgroup`), or in
/// the v1 hierarchy holding `controller`.
fn own_cgroup(controller: Option<&str>) -> io::Result<String> {
    let cgroups = fs::read_to_string("/proc/self/cgroup")?;
    cgroups
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let wanted = match controller {
                None => controllers.is_empty(),
                Some(c) => controllers.split(',').any(|x| x == c),
            };
            // Where the service moved into a leaf to hand controllers to its jobs, its own
            // cgroup is the one above.
            let path = match controller {
                None => path
                    .strip_suffix(&format!("/{}", limits::SERVICE_LEAF))
                    .unwrap_or(path),
                Some(_) => path,
            };
            wanted.then(|| path.to_owned())
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "this process is in no such cgroup"))
}

/// `name` under this process's own cgroup of a hierarchy (v2 when `controller` is `None`),
/// created; an error when the hierarchy is missing or not writable here.
fn own_child(controller: Option<&str>, name: &str) -> io::Result<PathBuf> {
    let mount = find_mount(controller)?;
    let own = own_cgroup(controller)?;
    // Inside a container the mount may show only a subtree: the path is relative to it.
    let relative = own
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(&own);
    let dir = mount
        .point
        .join(relative.trim_start_matches('/'))
        .join(name);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `name` under this process's cgroup of the v1 `controller`, created.
fn controller_cgroup(controller: &str, name: &str) -> io::Result<PathBuf> {
    own_child(Some(controller), name)
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
