//! Memory and CPU held to a job's part of the host, as Slurm's `ConstrainRAMSpace` and
//! `ConstrainCores` with `DefMemPerGPU` and `DefCpuPerGPU`, and its tasks (processes and
//! threads) counted, as systemd's `TasksMax=`: without them one tenant's job can take every
//! byte, core or process id of a node that runs other tenants' jobs, and the node's own
//! services with them (a fork bomb leaves the scheduler unable to start anything).
//!
//! A job gets the configured amount per GPU it holds (a part of a GPU gets that part). Memory
//! is a hard limit without swap beyond it: past it the kernel's OOM killer ends processes of
//! that job only (under v2 all of them, `memory.oom.group`), and the job ends as failed, out
//! of memory. CPU is a bandwidth quota (CFS): the job's processes together get that many CPUs'
//! time in every period, however many threads they run. Tasks are a count per job, not per
//! GPU: past it `fork` and `clone` fail in that job.
//!
//! Where: the cgroup v2 `memory` and `cpu` controllers when the hierarchy that tracks jobs has
//! them, else the v1 `memory` and `cpu` controllers (a hybrid host binds them to v1, as this
//! project's CI machine does). Under v2 a cgroup that holds processes cannot hand controllers to
//! its children, unless it is the root: the service moves itself into a leaf
//! (`gpuledger-service`) of its own cgroup first, as systemd's delegation expects of a service
//! with `Delegate=yes`.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use gpuledger_model::units::ByteSize;
use gpuledger_model::{GpuShare, JobId, SHARE_UNITS_PER_GPU};

/// The leaf of its own cgroup the service moves into to hand controllers to its jobs (v2).
pub(super) const SERVICE_LEAF: &str = "gpuledger-service";

/// The CFS period, in microseconds: quotas are this many microseconds per CPU.
const CPU_PERIOD_US: u64 = 100_000;

/// A number of CPUs, to a thousandth (`4`, `2.5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuCount {
    milli: u64,
}

/// At most this many CPUs per GPU: more is a typo.
const MAX_CPUS: u64 = 4096;
/// At least a hundredth of a CPU per GPU: the kernel takes no quota under a millisecond a
/// period, and a job with less could not start its shell in time.
const MIN_CPU_MILLI: u64 = 10;
/// At least this much memory per GPU: a size without its unit (`64` for `64GiB`) would kill
/// every job as it starts.
pub const MIN_MEMORY_PER_GPU: u64 = 16 << 20;
/// At least this many tasks per job: its wrapper, its shell and a command.
pub const MIN_TASKS: u32 = 16;

impl FromStr for CpuCount {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let wrong = || format!("`{text}` is not a number of CPUs; write one like `8` or `2.5`");
        let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
        let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 3 {
            return Err(wrong());
        }
        let whole: u64 = whole.parse().map_err(|_| wrong())?;
        let fraction: u64 = format!("{fraction:0<3}").parse().map_err(|_| wrong())?;
        if whole > MAX_CPUS {
            return Err(format!("`{text}`: at most {MAX_CPUS} CPUs"));
        }
        let milli = whole * 1000 + fraction;
        if milli < MIN_CPU_MILLI {
            return Err(format!(
                "`{text}`: at least 0.01 CPU per GPU (a job needs some CPU time)"
            ));
        }
        Ok(CpuCount { milli })
    }
}

impl fmt::Display for CpuCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, milli) = (self.milli / 1000, self.milli % 1000);
        if milli == 0 {
            write!(f, "{whole}")
        } else {
            write!(f, "{}", format!("{whole}.{milli:03}").trim_end_matches('0'))
        }
    }
}

/// `--job-memory-per-gpu`: a size of at least [`MIN_MEMORY_PER_GPU`].
pub fn parse_memory_per_gpu(text: &str) -> Result<ByteSize, String> {
    let size: ByteSize = text.parse().map_err(|e| format!("{e}"))?;
    if size.0 < MIN_MEMORY_PER_GPU {
        return Err(format!(
            "`{text}` is {size} per GPU; at least {} (write the unit: `64GiB`)",
            ByteSize(MIN_MEMORY_PER_GPU)
        ));
    }
    Ok(size)
}

/// What each job may use per GPU it holds (`--job-memory-per-gpu`, `--job-cpus-per-gpu`), and
/// how many tasks it may run at once (`--job-tasks-max`); nothing is limited where `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobLimits {
    pub memory_per_gpu: Option<ByteSize>,
    pub cpus_per_gpu: Option<CpuCount>,
    pub tasks_max: Option<u32>,
    /// Bind each job to whole cores of its own, as many as its CPUs (`--job-cpu-bind cores`).
    pub bind_cores: bool,
}

/// One job's limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    /// Microseconds of CPU time per [`CPU_PERIOD_US`].
    pub cpu_quota_us: Option<u64>,
    pub tasks_max: Option<u32>,
    /// The cores it is bound to, as a cpu list (`0-3,8`); the executor chooses them.
    pub cores: Option<String>,
}

impl JobLimits {
    pub fn is_empty(&self) -> bool {
        self.memory_per_gpu.is_none()
            && self.cpus_per_gpu.is_none()
            && self.tasks_max.is_none()
            && !self.bind_cores
    }

    /// The CPUs of a job holding `gpus` GPUs, or `share` of one, rounded up to whole ones (at
    /// least one), where CPUs are limited: what its thread pools should be sized to.
    pub fn whole_cpus_for_job(&self, gpus: usize, share: Option<GpuShare>) -> Option<usize> {
        let quota = self.for_job(gpus, share).cpu_quota_us?;
        Some(quota.div_ceil(CPU_PERIOD_US).max(1) as usize)
    }

    /// Whole cores for a job when jobs are bound to cores: its CPUs rounded up.
    pub fn cores_for_job(&self, gpus: usize, share: Option<GpuShare>) -> Option<usize> {
        self.whole_cpus_for_job(gpus, share)
            .filter(|_| self.bind_cores)
    }

    /// The limits of a job holding `gpus` GPUs, or `share` of one.
    pub fn for_job(&self, gpus: usize, share: Option<GpuShare>) -> Limits {
        let units = match share {
            Some(share) => u128::from(share.units()),
            None => gpus.max(1) as u128 * u128::from(SHARE_UNITS_PER_GPU),
        };
        let part = |per_gpu: u64| {
            let amount = u128::from(per_gpu) * units / u128::from(SHARE_UNITS_PER_GPU);
            u64::try_from(amount).unwrap_or(u64::MAX).max(1)
        };
        Limits {
            memory_bytes: self.memory_per_gpu.map(|m| part(m.0)),
            // A part of a GPU gets its part, never under the kernel's least quota (1 ms).
            cpu_quota_us: self
                .cpus_per_gpu
                .map(|c| part(c.milli * CPU_PERIOD_US / 1000).max(1000)),
            tasks_max: self.tasks_max,
            cores: None,
        }
    }
}

/// Where one resource is limited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// In the job's own cgroup v2 (the controller enabled on the executor's cgroup).
    V2,
    /// In the job's cgroup of this v1 controller, under this parent.
    V1(PathBuf),
}

/// Where a job's memory, CPU and tasks are limited: `None` for what is not limited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Enforcement {
    pub(super) memory: Option<Place>,
    pub(super) cpu: Option<Place>,
    pub(super) tasks: Option<Place>,
    pub(super) cpuset: Option<Place>,
}

impl Enforcement {
    /// Sets up what `limits` asks for, under the executor's cgroup `name` (its v2 directory
    /// `v2_parent` where jobs are tracked in v2): in v2 where the hierarchy has the controller,
    /// else in v1. An error naming what is missing when a limit asked for cannot be held.
    pub(super) fn set_up(
        limits: &JobLimits,
        v2_parent: Option<&Path>,
        name: &str,
    ) -> io::Result<Self> {
        let place = |wanted: bool, controller: &str, flag: &str| -> io::Result<Option<Place>> {
            if !wanted {
                return Ok(None);
            }
            let v2_error = match v2_parent {
                Some(parent) => match enable_v2(parent, controller) {
                    Ok(()) => return Ok(Some(Place::V2)),
                    Err(e) => format!("cgroup v2: {e}; "),
                },
                None => String::new(),
            };
            match super::controller_cgroup(controller, name) {
                Ok(parent) => Ok(Some(Place::V1(parent))),
                Err(v1_error) => Err(io::Error::new(
                    v1_error.kind(),
                    format!(
                        "{flag}: no `{controller}` controller to hold it: {v2_error}cgroup v1: {v1_error}"
                    ),
                )),
            }
        };
        Ok(Enforcement {
            memory: place(
                limits.memory_per_gpu.is_some(),
                "memory",
                "--job-memory-per-gpu",
            )?,
            cpu: place(limits.cpus_per_gpu.is_some(), "cpu", "--job-cpus-per-gpu")?,
            tasks: place(limits.tasks_max.is_some(), "pids", "--job-tasks-max")?,
            cpuset: match place(limits.bind_cores, "cpuset", "--job-cpu-bind")? {
                Some(Place::V1(parent)) => {
                    inherit_cpuset(&parent)?;
                    Some(Place::V1(parent))
                }
                other => other,
            },
        })
    }

    /// Limits the job whose v2 cgroup is `v2_dir` (already created, where tracked in v2):
    /// writes the limits, then moves `pid` into its v1 cgroups.
    pub(super) fn apply(
        &self,
        job: &JobId,
        v2_dir: Option<&Path>,
        limits: Limits,
        pid: u32,
    ) -> io::Result<()> {
        if let (Some(place), Some(bytes)) = (&self.memory, limits.memory_bytes) {
            let dir = job_dir(place, job, v2_dir)?;
            match place {
                Place::V2 => {
                    fs::write(dir.join("memory.max"), bytes.to_string())?;
                    write_if_present(&dir.join("memory.swap.max"), "0")?;
                    write_if_present(&dir.join("memory.oom.group"), "1")?;
                }
                Place::V1(_) => {
                    fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                    // Memory and swap together, where swap is accounted: no swap beyond it.
                    write_if_present(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string())?;
                    super::move_into(&dir, pid)?;
                }
            }
        }
        if let (Some(place), Some(quota)) = (&self.cpu, limits.cpu_quota_us) {
            let dir = job_dir(place, job, v2_dir)?;
            match place {
                Place::V2 => fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?,
                Place::V1(_) => {
                    fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                    fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                    super::move_into(&dir, pid)?;
                }
            }
        }
        if let (Some(place), Some(tasks)) = (&self.tasks, limits.tasks_max) {
            let dir = job_dir(place, job, v2_dir)?;
            fs::write(dir.join("pids.max"), tasks.to_string())?;
            if let Place::V1(_) = place {
                super::move_into(&dir, pid)?;
            }
        }
        if let (Some(place), Some(cores)) = (&self.cpuset, &limits.cores) {
            if let Place::V1(parent) = place {
                // Made again where it went missing (an executor over the same jobs went away):
                // empty until it inherits.
                fs::create_dir_all(parent)?;
                inherit_cpuset(parent)?;
            }
            let dir = job_dir(place, job, v2_dir)?;
            if let Place::V1(parent) = place {
                // A v1 cpuset takes no task before it has memory nodes.
                fs::write(
                    dir.join("cpuset.mems"),
                    fs::read_to_string(parent.join("cpuset.mems"))?.trim(),
                )?;
            }
            fs::write(dir.join("cpuset.cpus"), cores)?;
            if let Place::V1(_) = place {
                super::move_into(&dir, pid)?;
            }
        }
        Ok(())
    }

    /// The cores the job's cpuset holds (a job adopted after a restart).
    pub(super) fn bound_cores(&self, job: &JobId, v2_dir: &Path) -> Option<String> {
        let file = match self.cpuset.as_ref()? {
            Place::V2 => v2_dir.join("cpuset.cpus"),
            Place::V1(parent) => parent.join(job.as_str()).join("cpuset.cpus"),
        };
        let cores = fs::read_to_string(file).ok()?;
        Some(cores.trim().to_owned()).filter(|c| !c.is_empty())
    }

    /// How often the kernel's OOM killer ended a process of the job at its memory limit, and
    /// that limit; `None` where memory is not limited or nothing was killed.
    pub(super) fn out_of_memory(&self, job: &JobId, v2_dir: &Path) -> Option<OutOfMemory> {
        let (events, limit) = match self.memory.as_ref()? {
            Place::V2 => (v2_dir.join("memory.events"), v2_dir.join("memory.max")),
            Place::V1(parent) => {
                let dir = parent.join(job.as_str());
                (
                    dir.join("memory.oom_control"),
                    dir.join("memory.limit_in_bytes"),
                )
            }
        };
        let kills = super::read_field(&events, "oom_kill")?;
        (kills > 0).then(|| OutOfMemory {
            kills,
            limit_bytes: fs::read_to_string(limit)
                .ok()
                .and_then(|t| t.trim().parse().ok()),
        })
    }

    /// The job's peak memory (`memory.peak`, kernel 5.19 and later, or v1's
    /// `memory.max_usage_in_bytes`); `None` where memory is not limited.
    pub(super) fn peak_memory(&self, job: &JobId, v2_dir: &Path) -> Option<u64> {
        let file = match self.memory.as_ref()? {
            Place::V2 => v2_dir.join("memory.peak"),
            Place::V1(parent) => parent.join(job.as_str()).join("memory.max_usage_in_bytes"),
        };
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// The job's v1 cgroups of these controllers (to remove them).
    /// The executor's own cgroups in the v1 controllers that hold limits.
    pub(super) fn v1_parents(&self) -> Vec<PathBuf> {
        [&self.memory, &self.cpu, &self.tasks, &self.cpuset]
            .into_iter()
            .filter_map(|place| match place {
                Some(Place::V1(parent)) => Some(parent.clone()),
                _ => None,
            })
            .collect()
    }

    /// The executor's v2 cgroup `parent`, made again if it went missing, with the controllers
    /// that hold its jobs' limits in v2 handed down to them: a v2 cgroup made anew has none
    /// enabled for its children, and a job's `memory.max` would not be there to write.
    pub(super) fn ready_v2_parent(&self, parent: &Path) -> io::Result<()> {
        let controllers: Vec<&str> = [
            (&self.memory, "memory"),
            (&self.cpu, "cpu"),
            (&self.tasks, "pids"),
            (&self.cpuset, "cpuset"),
        ]
        .into_iter()
        .filter(|(place, _)| matches!(place, Some(Place::V2)))
        .map(|(_, controller)| controller)
        .collect();
        hand_down(parent, &controllers)
    }
}

/// A job the kernel's OOM killer hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Processes killed.
    pub kills: u64,
    /// Its memory limit, in bytes, where it could be read.
    pub limit_bytes: Option<u64>,
}

/// The job's directory in this place, created afresh for a v1 controller (a cgroup an earlier
/// launch left keeps no old limits).
fn job_dir(place: &Place, job: &JobId, v2_dir: Option<&Path>) -> io::Result<PathBuf> {
    match place {
        Place::V2 => v2_dir
            .map(Path::to_owned)
            .ok_or_else(|| io::Error::other("the job has no cgroup v2")),
        Place::V1(parent) => {
            let dir = parent.join(job.as_str());
            let _ = fs::remove_dir(&dir);
            fs::create_dir_all(&dir)?;
            Ok(dir)
        }
    }
}

/// A new v1 cpuset has no cores and no memory nodes: the executor's takes its parent's, so
/// that its jobs' cpusets may take theirs from it.
fn inherit_cpuset(dir: &Path) -> io::Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| io::Error::other("the executor's cpuset has no parent"))?;
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if fs::read_to_string(dir.join(file))?.trim().is_empty() {
            fs::write(
                dir.join(file),
                fs::read_to_string(parent.join(file))?.trim(),
            )?;
        }
    }
    Ok(())
}

fn write_if_present(file: &Path, value: &str) -> io::Result<()> {
    match fs::write(file, value) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// `dir`, made if missing, with `controllers` enabled for its children (already enabled ones
/// stay).
fn hand_down(dir: &Path, controllers: &[&str]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    if controllers.is_empty() {
        return Ok(());
    }
    let enable: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
    fs::write(dir.join("cgroup.subtree_control"), enable.join(" "))
}

/// Hands `controller` down to the job cgroups under `parent` (the executor's v2 cgroup): the
/// service's own cgroup must enable it for its children, which it may only do holding no
/// process itself (unless it is the root), so the service moves into a leaf first.
fn enable_v2(parent: &Path, controller: &str) -> io::Result<()> {
    let own = parent
        .parent()
        .ok_or_else(|| io::Error::other("the executor's cgroup has no parent"))?;
    let available = fs::read_to_string(own.join("cgroup.controllers"))?;
    if !available.split_whitespace().any(|c| c == controller) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} does not offer it (bound to a v1 hierarchy, or not delegated)",
                own.display()
            ),
        ));
    }
    let enable =
        |dir: &Path| fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
    match enable(own) {
        Ok(()) => {}
        // EBUSY: the service's cgroup holds processes (the service's own, at least).
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
            let leaf = own.join(SERVICE_LEAF);
            fs::create_dir_all(&leaf)?;
            super::move_into(&leaf, std::process::id())?;
            enable(own).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{} holds processes other than this service's, so it cannot hand \
                         controllers to its children: {e}",
                        own.display()
                    ),
                )
            })?;
        }
        Err(e) => return Err(e),
    }
    hand_down(parent, &[controller])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_counts_are_read_to_a_thousandth_and_written_back() {
        for (text, milli, back) in [
            ("8", 8000, "8"),
            ("2.5", 2500, "2.5"),
            ("0.125", 125, "0.125"),
        ] {
            let cpus: CpuCount = text.parse().unwrap();
            assert_eq!(cpus.milli, milli);
            assert_eq!(cpus.to_string(), back);
        }
        for wrong in [
            "", "0", "0.000", "0.009", "-1", "1.2345", "1e3", "4097", ".5", "two",
        ] {
            assert!(wrong.parse::<CpuCount>().is_err(), "{wrong:?} was taken");
        }
    }

    #[test]
    fn a_job_gets_its_gpus_part_and_a_share_its_fraction() {
        let limits = JobLimits {
            memory_per_gpu: Some(ByteSize(8 << 30)),
            cpus_per_gpu: Some("2.5".parse().unwrap()),
            tasks_max: Some(512),
            bind_cores: true,
        };
        let two = limits.for_job(2, None);
        assert_eq!(two.tasks_max, Some(512), "tasks are per job, not per GPU");
        assert_eq!(
            limits.cores_for_job(2, None),
            Some(5),
            "2.5 CPUs a GPU: 5 cores"
        );
        assert_eq!(
            limits.cores_for_job(1, Some(GpuShare::Milli(250))),
            Some(1),
            "0.625: 1"
        );
        assert_eq!(JobLimits::default().cores_for_job(2, None), None);
        assert_eq!(two.memory_bytes, Some(16 << 30));
        assert_eq!(two.cpu_quota_us, Some(500_000));
        let quarter = limits.for_job(1, Some(GpuShare::Milli(250)));
        assert_eq!(quarter.memory_bytes, Some(2 << 30));
        assert_eq!(quarter.cpu_quota_us, Some(62_500));
        let slice = limits.for_job(1, Some(GpuShare::Mig(1)));
        assert_eq!(slice.memory_bytes, Some((8u64 << 30) / 7));
        assert_eq!(JobLimits::default().for_job(4, None), Limits::default());
        let least = JobLimits {
            cpus_per_gpu: Some("0.01".parse().unwrap()),
            ..JobLimits::default()
        };
        assert_eq!(
            least.for_job(1, Some(GpuShare::Mig(1))).cpu_quota_us,
            Some(1000),
            "never under the kernel's least quota"
        );
        assert_eq!(parse_memory_per_gpu("64GiB").unwrap(), ByteSize(64 << 30));
        for typo in ["64", "1MiB", "0"] {
            let refused = parse_memory_per_gpu(typo).unwrap_err();
            assert!(refused.contains("at least 16MiB"), "{refused}");
        }
    }

    #[test]
    fn limits_are_written_in_each_hierarchys_own_files() {
        let root = tempfile::tempdir().unwrap();
        let job = JobId::new("7").unwrap();
        let v2_dir = root.path().join("v2job");
        fs::create_dir_all(&v2_dir).unwrap();
        for file in ["memory.swap.max", "memory.oom.group", "cgroup.procs"] {
            fs::write(v2_dir.join(file), "").unwrap();
        }
        let limits = Limits {
            memory_bytes: Some(1 << 30),
            cpu_quota_us: Some(250_000),
            tasks_max: Some(100),
            cores: Some("2-3".into()),
        };
        let v2 = Enforcement {
            memory: Some(Place::V2),
            cpu: Some(Place::V2),
            tasks: Some(Place::V2),
            cpuset: Some(Place::V2),
        };
        v2.apply(&job, Some(&v2_dir), limits, 42).unwrap();
        // The executor's cgroup hands each of those controllers down to its jobs.
        let parent = root.path().join("executor");
        v2.ready_v2_parent(&parent).unwrap();
        assert_eq!(
            fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(),
            "+memory +cpu +pids +cpuset"
        );
        Enforcement::default().ready_v2_parent(&parent).unwrap();
        let read = |f: PathBuf| fs::read_to_string(f).unwrap();
        assert_eq!(read(v2_dir.join("memory.max")), "1073741824");
        assert_eq!(read(v2_dir.join("memory.swap.max")), "0");
        assert_eq!(read(v2_dir.join("memory.oom.group")), "1");
        assert_eq!(read(v2_dir.join("cpu.max")), "250000 100000");
        assert_eq!(read(v2_dir.join("pids.max")), "100");
        assert_eq!(read(v2_dir.join("cpuset.cpus")), "2-3");
        assert_eq!(v2.bound_cores(&job, &v2_dir).as_deref(), Some("2-3"));
        assert_eq!(
            read(v2_dir.join("cgroup.procs")),
            "",
            "v2: the tracker moves it"
        );

        fs::write(
            v2_dir.join("memory.events"),
            "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(
            v2.out_of_memory(&job, &v2_dir),
            Some(OutOfMemory {
                kills: 2,
                limit_bytes: Some(1 << 30)
            })
        );
        fs::write(v2_dir.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        assert_eq!(v2.out_of_memory(&job, &v2_dir), None);
        assert_eq!(Enforcement::default().out_of_memory(&job, &v2_dir), None);
    }

    /// A v2 cgroup made anew hands no controller to its children: the executor's, made again
    /// after it went missing, gets its jobs' controllers handed down again. The real kernel,
    /// with `hugetlb` (what this host's v2 hierarchy offers).
    #[test]
    fn an_executors_cgroup_made_again_hands_its_jobs_controllers_down_again() {
        let root = super::super::find_mount(None).unwrap().point;
        fs::write(root.join("cgroup.subtree_control"), "+hugetlb").unwrap();
        let parent = root.join(format!("gpuledger-test-again-{}", std::process::id()));
        let job = parent.join("job");
        let has_hugetlb = |dir: &Path| {
            fs::read_dir(dir).unwrap().any(|f| {
                f.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("hugetlb.")
            })
        };
        hand_down(&parent, &["hugetlb"]).unwrap();
        fs::create_dir(&job).unwrap();
        let first = has_hugetlb(&job);
        fs::remove_dir(&job).unwrap();
        fs::remove_dir(&parent).unwrap();
        // Made again as a job's cgroup alone would make it: nothing handed down.
        fs::create_dir_all(&job).unwrap();
        let bare = has_hugetlb(&job);
        fs::remove_dir(&job).unwrap();
        fs::remove_dir(&parent).unwrap();
        hand_down(&parent, &["hugetlb"]).unwrap();
        hand_down(&parent, &["hugetlb"]).unwrap();
        fs::create_dir(&job).unwrap();
        let again = has_hugetlb(&job);
        fs::remove_dir(&job).unwrap();
        fs::remove_dir(&parent).unwrap();
        assert!(first, "hugetlb handed down to the job");
        assert!(!bare, "a parent made anew hands nothing down");
        assert!(again, "handed down again, twice over");
    }

    /// A service in a cgroup v2 of its own (not the root) that holds it: enabling a controller
    /// for its jobs fails (`EBUSY`) until it moves into its leaf, and afterwards its own cgroup
    /// is still the one above the leaf. The real kernel's rule, in a child process (the test
    /// process must stay where it is), with `hugetlb`, the controller this host's v2 hierarchy
    /// offers (`memory` and `cpu` are bound to v1 here).
    #[test]
    fn a_service_in_a_cgroup_it_holds_moves_into_a_leaf_to_hand_controllers_to_its_jobs() {
        const CHILD: &str = "GPULEDGER_TEST_SERVICE_CGROUP";
        if let Ok(own) = std::env::var(CHILD) {
            super::super::move_into(Path::new(&own), std::process::id()).unwrap();
            let parent = super::super::own_child(None, "gpuledger-jobs").unwrap();
            enable_v2(&parent, "hugetlb").unwrap();
            let cgroup = fs::read_to_string("/proc/self/cgroup").unwrap();
            assert!(cgroup.contains(&format!("/{SERVICE_LEAF}\n")), "{cgroup}");
            assert_eq!(
                super::super::own_child(None, "gpuledger-jobs").unwrap(),
                parent
            );
            return;
        }
        let mount = super::super::find_mount(None).unwrap();
        assert_eq!(
            super::super::own_cgroup(None).unwrap(),
            "/",
            "the test runs in the v2 root"
        );
        let root = mount.point;
        let offered = fs::read_to_string(root.join("cgroup.controllers")).unwrap();
        assert!(
            offered.contains("hugetlb"),
            "this host's v2 root offers hugetlb: {offered}"
        );
        // The root may hold processes and hand controllers down.
        fs::write(root.join("cgroup.subtree_control"), "+hugetlb").unwrap();
        let own = root.join(format!("gpuledger-test-service-{}", std::process::id()));
        fs::create_dir_all(&own).unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cgroup::limits::tests::a_service_in_a_cgroup_it_holds_moves_into_a_leaf_to_hand_controllers_to_its_jobs",
                "--test-threads=1",
            ])
            .env(CHILD, &own)
            .output()
            .unwrap();
        let enabled = |dir: &Path| fs::read_to_string(dir.join("cgroup.subtree_control")).ok();
        let (own_enabled, jobs_enabled) = (enabled(&own), enabled(&own.join("gpuledger-jobs")));
        let leaf_made = own.join(SERVICE_LEAF).is_dir();
        for dir in ["gpuledger-jobs", SERVICE_LEAF, ""] {
            let _ = fs::remove_dir(own.join(dir));
        }
        assert!(
            child.status.success(),
            "the child: {}",
            String::from_utf8_lossy(&child.stdout)
        );
        assert!(leaf_made);
        assert_eq!(own_enabled.as_deref().map(str::trim), Some("hugetlb"));
        assert_eq!(jobs_enabled.as_deref().map(str::trim), Some("hugetlb"));
    }
}
