//! What the scheduler takes and gives: options, job specs, refusals and pending reasons, the
//! pending and running jobs, and what a cycle decided.

use super::*;

/// How the queue is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Tier, then submission order.
    Fifo,
    /// Tier, then the multifactor priority (fair share, age, size, quota priority).
    FairShare,
}

/// Which backfill runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backfill {
    /// Strict priority order: the first job that cannot start holds everyone behind it.
    Off,
    /// The first job that cannot start gets a planned start; later jobs may start when they do
    /// not delay it.
    Easy,
    /// Every job up to `backfill_depth` gets a planned start, and none may be delayed.
    Conservative,
}

/// Policy and backfill switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerOptions {
    pub policy: Policy,
    pub backfill: Backfill,
}

impl SchedulerOptions {
    /// Parses `fifo` or `fairshare`, optionally followed by `+backfill` (EASY), `+easy` or
    /// `+conservative`.
    pub fn parse(name: &str) -> Option<Self> {
        let (policy, backfill) = match name.split_once('+') {
            Some((p, "backfill" | "easy")) => (p, Backfill::Easy),
            Some((p, "conservative")) => (p, Backfill::Conservative),
            Some(_) => return None,
            None => (name, Backfill::Off),
        };
        let policy = match policy {
            "fifo" => Policy::Fifo,
            "fairshare" => Policy::FairShare,
            _ => return None,
        };
        Some(SchedulerOptions { policy, backfill })
    }

    pub fn name(&self) -> String {
        let p = match self.policy {
            Policy::Fifo => "fifo",
            Policy::FairShare => "fairshare",
        };
        match self.backfill {
            Backfill::Off => p.to_owned(),
            Backfill::Easy => format!("{p}+backfill"),
            Backfill::Conservative => format!("{p}+conservative"),
        }
    }
}

/// A job as submitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub id: JobId,
    pub account: AccountId,
    pub project: Option<ProjectId>,
    /// `None`: the default partition.
    pub partition: Option<String>,
    /// GPUs asked for; the most an elastic job grows to.
    pub gpus: u32,
    /// An elastic job's smallest size: it starts with at least this many, grows toward `gpus`
    /// and shrinks back instead of dying when preempted.
    pub min_gpus: Option<u32>,
    pub time_limit_s: u64,
    pub submit_s: UnixSeconds,
    /// Time between SIGTERM and SIGKILL on preemption; the partition's when `None`.
    pub grace_s: Option<u64>,
    /// How often the job checkpoints by itself, to estimate the work a preemption loses when
    /// it reports no checkpoints.
    pub checkpoint_every_s: Option<u64>,
    /// GPUs per node, node count and GPU models it asks for.
    pub shape: Shape,
}

impl JobSpec {
    pub fn new(
        id: JobId,
        account: AccountId,
        gpus: u32,
        time_limit_s: u64,
        submit_s: UnixSeconds,
    ) -> Self {
        JobSpec {
            id,
            account,
            project: None,
            partition: None,
            gpus,
            min_gpus: None,
            time_limit_s,
            submit_s,
            grace_s: None,
            checkpoint_every_s: None,
            shape: Shape::default(),
        }
    }

    /// The fewest GPUs the job runs on.
    pub fn min_size(&self) -> u32 {
        self.min_gpus.unwrap_or(self.gpus).min(self.gpus)
    }

    pub fn is_elastic(&self) -> bool {
        self.min_size() < self.gpus
    }

    /// `gpus` of this job in share units ([`gpuledger_model::SHARE_UNITS_PER_GPU`] to a
    /// GPU): its part where it asks for a part of one GPU.
    pub fn share_units_of(&self, gpus: u32) -> u64 {
        match self.shape.gpu_share {
            Some(share) => u64::from(share.units()),
            None => u64::from(gpus) * u64::from(SHARE_UNITS_PER_GPU),
        }
    }

    /// GPUs asked for, a share of a GPU as its fraction.
    pub fn gpu_equivalent(&self) -> f64 {
        match self.shape.gpu_share {
            Some(share) => share.fraction(),
            None => f64::from(self.gpus),
        }
    }
}

/// Why a job is refused at submission: it could never run as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("account `{0}` does not exist")]
    UnknownAccount(AccountId),
    #[error("project `{project}` does not exist in account `{account}`")]
    UnknownProject {
        account: AccountId,
        project: ProjectId,
    },
    #[error("partition `{0}` does not exist")]
    UnknownPartition(String),
    #[error(
        "account `{account}` may not submit to partition `{partition}` (its allowed_accounts)"
    )]
    PartitionNotAllowed {
        partition: String,
        account: AccountId,
    },
    #[error(
        "grace {asked_s} s exceeds the {limit_s} s partition `{partition}` allows (max_grace)"
    )]
    GraceTooLong {
        asked_s: u64,
        limit_s: u64,
        partition: String,
    },
    #[error("a job needs at least 1 GPU")]
    NoGpus,
    #[error("min_gpus {min} must be between 1 and gpus {max}")]
    ElasticRange { min: u32, max: u32 },
    #[error(
        "job asks for {asked} GPUs; its quota allows at most {limit} per job (max_gpus_per_job)"
    )]
    TooManyGpus { asked: u32, limit: u32 },
    #[error(
        "job needs at least {asked} GPUs at once; its quota allows {limit} held at once (max_gpus)"
    )]
    MoreThanMaxGpus { asked: u32, limit: u32 },
    #[error("job asks for {asked} GPUs; the nodes its account may use have {capacity}")]
    LargerThanCluster { asked: u32, capacity: u32 },
    #[error("job of {gpus} GPUs asks for {shape}: no set of the nodes its account may use has that shape, even empty")]
    ShapeNeverFits {
        gpus: u32,
        shape: String,
        /// The one field of the shape the job set, `None` when it set several.
        field: Option<&'static str>,
    },
    #[error("an elastic job (min_gpus) cannot fix GPUs per node or a node count")]
    ElasticShape,
    #[error("a share of a GPU ({share}) is a part of one GPU: ask for 1 GPU, not elastic, with no GPUs per node or node count")]
    ShareOfOneGpu { share: gpuledger_model::GpuShare },
    #[error("time limit {asked_s} s exceeds the {limit_s} s allowed ({what})")]
    TimeLimit {
        asked_s: u64,
        limit_s: u64,
        what: &'static str,
    },
    #[error("job needs {asked} GPU-hours; its quota allows {limit} ({what})")]
    GpuHours {
        asked: u64,
        limit: u64,
        what: &'static str,
    },
    #[error("job id `{0}` is already known")]
    DuplicateId(JobId),
    #[error("{field} must be at least 1 when given")]
    ZeroInShape { field: &'static str },
}

impl Refusal {
    /// The submission's field the refusal is about (as the scheduler's API and a job file
    /// name it), where one field is; `None` where several together are (a shape of GPUs per
    /// node, a node count and GPU types that never fits).
    pub fn field(&self) -> Option<&'static str> {
        Some(match self {
            Refusal::UnknownAccount(_) => "account",
            Refusal::UnknownProject { .. } => "project",
            Refusal::UnknownPartition(_) | Refusal::PartitionNotAllowed { .. } => "partition",
            Refusal::GraceTooLong { .. } => "grace",
            Refusal::NoGpus
            | Refusal::TooManyGpus { .. }
            | Refusal::MoreThanMaxGpus { .. }
            | Refusal::LargerThanCluster { .. } => "gpus",
            Refusal::ElasticRange { .. } | Refusal::ElasticShape => "min_gpus",
            Refusal::ShareOfOneGpu { .. } => "gpu_share",
            Refusal::TimeLimit { .. } | Refusal::GpuHours { .. } => "time_limit",
            Refusal::DuplicateId(_) => "job_id",
            Refusal::ZeroInShape { field } => field,
            Refusal::ShapeNeverFits { field, .. } => return *field,
        })
    }
}

/// Why a job is still pending, with Slurm's reason codes where Slurm has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PendingReason {
    /// Not yet considered.
    None,
    /// Waiting for GPUs to free up (it is next in line).
    Resources,
    /// Jobs of higher priority go first.
    Priority,
    /// Its account or project runs as many jobs as its quota allows.
    AssocMaxJobsLimit,
    /// Its account's or project's running jobs hold as many GPUs as `max_gpus` allows (Slurm's
    /// `GrpTRES=gres/gpu`).
    AssocGrpGres,
    /// Starting it would pass its account's or project's GPU-hours for today.
    AssocGrpGpuHoursDay,
    /// Starting it would pass its account's or project's GPU-hours for the last seven days.
    AssocGrpGpuHoursWeek,
    /// Its account or project keeps more data than its storage quota (from the last storage
    /// scan) until it cleans up.
    AssocGrpStorage,
    /// The GPUs it could use are reserved for others during its run.
    ReqNodeNotAvail,
}

impl PendingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PendingReason::None => "None",
            PendingReason::Resources => "Resources",
            PendingReason::Priority => "Priority",
            PendingReason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
            PendingReason::AssocGrpGres => "AssocGrpGRES",
            PendingReason::AssocGrpGpuHoursDay => "AssocGrpGPUHoursPerDay",
            PendingReason::AssocGrpGpuHoursWeek => "AssocGrpGPUHoursPerWeek",
            PendingReason::AssocGrpStorage => "AssocGrpStorageLimit",
            PendingReason::ReqNodeNotAvail => "ReqNodeNotAvail",
        }
    }

    /// The reason a job waits under a quota dimension, where it is one a pending job can wait
    /// out (Slurm's `AssocGrp*` names).
    pub fn of_quota(dimension: gpuledger_model::quota::QuotaDimension) -> Option<PendingReason> {
        use gpuledger_model::quota::QuotaDimension as D;
        match dimension {
            D::MaxRunningJobs => Some(PendingReason::AssocMaxJobsLimit),
            D::MaxGpus => Some(PendingReason::AssocGrpGres),
            D::GpuHoursPerDay => Some(PendingReason::AssocGrpGpuHoursDay),
            D::GpuHoursPerWeek => Some(PendingReason::AssocGrpGpuHoursWeek),
            D::Storage => Some(PendingReason::AssocGrpStorage),
            // Refused at submission, never waited out.
            D::MaxGpusPerJob | D::MaxRunTime | D::Priority | D::MaxSubmitJobs => None,
        }
    }

    /// True when the job waits for GPUs (rather than for its quota).
    pub fn waits_for_gpus(self) -> bool {
        matches!(
            self,
            PendingReason::Resources | PendingReason::Priority | PendingReason::ReqNodeNotAvail
        )
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pending job and what holds it.
#[derive(Clone, Debug)]
pub struct PendingJob {
    pub spec: JobSpec,
    pub tier: u32,
    pub reason: PendingReason,
    /// The planned start, when backfill planned one (as `squeue --start`).
    pub estimated_start_s: Option<UnixSeconds>,
    /// Times it was preempted and requeued.
    pub preemptions: u32,
    /// It has already preempted jobs during this wait; it does not preempt again before it
    /// starts, so no two jobs can preempt each other's victims in a loop.
    pub has_preempted: bool,
    /// Since when it has waited for GPUs without its own quota holding it: its submission or
    /// requeue, or the first cycle after a quota held it; `None` while a quota holds it. The
    /// relief counts this wait (`[scheduler] relief_after`), as Slurm counts age only while a
    /// job is eligible: waiting out its account's limits earns a job nothing. A restart
    /// reads it back ([`Scheduler::submit_with_history`]).
    pub gpu_wait_from: Option<UnixSeconds>,
    pub(crate) limits: JobLimits,
}

/// What a job's quotas and partition say, worked out once when it enters the queue: a cycle
/// looks at every pending job, and most have no limits worth a lookup.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct JobLimits {
    /// Index of its account in the scheduler's account list.
    pub(crate) account: usize,
    /// Index of its project in its account's list (`quota_scopes::NO_PROJECT` for none).
    pub(crate) project: u32,
    /// Its shape's number (`DEFAULT_SHAPE` for the default; see `Scheduler::shape_ids`).
    pub(crate) shape: u32,
    /// Index of its partition in the config's list (`u32::MAX` for none known).
    pub(crate) partition: u32,
    pub(crate) running_limited: bool,
    pub(crate) gpus_limited: bool,
    pub(crate) gpu_hours_limited: bool,
    pub(crate) storage_limited: bool,
    /// The quota's priority (1-100) as a fraction.
    pub(crate) quota_priority: f64,
}

/// A running job being preempted: signalled, and killed at `kill_s` unless it exits first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preempting {
    pub by: JobId,
    pub signal_s: UnixSeconds,
    pub kill_s: UnixSeconds,
}

/// A running job.
#[derive(Clone, Debug)]
pub struct RunningJob {
    pub spec: JobSpec,
    pub tier: u32,
    pub start_s: UnixSeconds,
    pub placement: Placement,
    pub last_checkpoint_s: Option<UnixSeconds>,
    pub preempting: Option<Preempting>,
    pub preemptions: u32,
    pub backfilled: bool,
    pub(crate) accrued_until: UnixSeconds,
    /// Its account's slot in the usage ledger.
    pub(crate) usage_slot: usize,
}

impl RunningJob {
    /// When its time limit runs out.
    pub fn limit_end_s(&self) -> UnixSeconds {
        self.start_s + self.spec.time_limit_s as i64
    }

    /// When its GPUs are expected back: at its kill deadline when it is being preempted, at
    /// its time limit otherwise (or now, when that is past).
    pub(crate) fn release_s(&self, now: UnixSeconds) -> UnixSeconds {
        match &self.preempting {
            Some(p) => p.kill_s,
            None => self.limit_end_s().max(now),
        }
    }

    /// Its place in the scheduler's release book: `release_s` before any time is applied.
    pub(crate) fn release_key(&self) -> UnixSeconds {
        match &self.preempting {
            Some(p) => p.kill_s,
            None => self.limit_end_s(),
        }
    }

    /// Seconds of work a preemption now would lose: since the last reported checkpoint, or the
    /// last periodic one, or the start.
    pub fn work_at_risk_s(&self, now: UnixSeconds) -> i64 {
        let periodic = self.spec.checkpoint_every_s.filter(|e| *e > 0).map(|e| {
            let e = e as i64;
            self.start_s + (now - self.start_s).max(0) / e * e
        });
        let last = self
            .last_checkpoint_s
            .max(periodic)
            .unwrap_or(self.start_s)
            .max(self.start_s);
        (now - last).max(0)
    }
}

/// A job the cycle started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub job_id: JobId,
    pub allocation: Allocation,
    pub gpus: u32,
    pub backfilled: bool,
}

/// A job the cycle chose to preempt: send SIGTERM now, SIGKILL at `kill_s`, and call
/// [`Scheduler::requeue`] when it has exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub job_id: JobId,
    pub by: JobId,
    pub kill_s: UnixSeconds,
}

/// An elastic job whose GPUs changed (grown into free nodes, or shrunk for a preemptor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    pub job_id: JobId,
    pub allocation: Allocation,
    pub gpus: u32,
}

/// What one cycle decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    pub started: Vec<Started>,
    pub preempted: Vec<Preemption>,
    pub resized: Vec<Resized>,
}
