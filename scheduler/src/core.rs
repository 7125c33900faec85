//! The scheduling cycle: admission with quota checks, ordering of the queue (FIFO, or Slurm's
//! multifactor priority with fair share, within priority tiers), node-granular placement,
//! advance reservations, EASY and conservative backfill, preemption with a checkpoint grace,
//! and elastic jobs. Pure and synchronous: time is an argument, so the simulator and a live
//! service run the same code.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use gpuledger_model::config::{ClusterConfig, FairShareFormula, SchedulerConfig};
use gpuledger_model::quota::Quota;
use gpuledger_model::tenant::TenantTree;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, Allocation, JobId, ProjectId};

use crate::cluster::{Cluster, NodeFilter, Placement};
use crate::fairshare::{slurm_classic_factor, FairShareParams, UsageLedger};
use crate::plan::Plan;
use crate::reservation::{AdvanceReservation, ReservationError, ReservationRequest, Reservations};
use crate::windows::{day_of, UsageWindows, WindowKey, DAY_S};

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
        }
    }

    /// The fewest GPUs the job runs on.
    pub fn min_size(&self) -> u32 {
        self.min_gpus.unwrap_or(self.gpus).min(self.gpus)
    }

    pub fn is_elastic(&self) -> bool {
        self.min_size() < self.gpus
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
    #[error("a job needs at least 1 GPU")]
    NoGpus,
    #[error("min_gpus {min} must be between 1 and gpus {max}")]
    ElasticRange { min: u32, max: u32 },
    #[error(
        "job asks for {asked} GPUs; its quota allows at most {limit} per job (max_gpus_per_job)"
    )]
    TooManyGpus { asked: u32, limit: u32 },
    #[error("job asks for {asked} GPUs; the nodes its account may use have {capacity}")]
    LargerThanCluster { asked: u32, capacity: u32 },
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
            PendingReason::AssocGrpGpuHoursDay => "AssocGrpGPUHoursPerDay",
            PendingReason::AssocGrpGpuHoursWeek => "AssocGrpGPUHoursPerWeek",
            PendingReason::AssocGrpStorage => "AssocGrpStorageLimit",
            PendingReason::ReqNodeNotAvail => "ReqNodeNotAvail",
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
    /// The job's priority at the last cycle (0 under FIFO).
    pub priority: f64,
    pub reason: PendingReason,
    /// The planned start, when backfill planned one (as `squeue --start`).
    pub estimated_start_s: Option<UnixSeconds>,
    /// Times it was preempted and requeued.
    pub preemptions: u32,
    /// It has already preempted jobs during this wait; it does not preempt again before it
    /// starts, so no two jobs can preempt each other's victims in a loop.
    pub has_preempted: bool,
    limits: JobLimits,
}

/// What a job's quotas say, worked out once when it enters the queue: a cycle looks at every
/// pending job, and most have no limits worth a lookup.
#[derive(Clone, Copy, Debug, Default)]
struct JobLimits {
    /// Index of its account in the scheduler's account list.
    account: usize,
    running_limited: bool,
    gpu_hours_limited: bool,
    storage_limited: bool,
    /// The quota's priority (1-100) as a fraction.
    quota_priority: f64,
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
    accrued_until: UnixSeconds,
}

impl RunningJob {
    /// When its time limit runs out.
    pub fn limit_end_s(&self) -> UnixSeconds {
        self.start_s + self.spec.time_limit_s as i64
    }

    /// When its GPUs are expected back: at its kill deadline when it is being preempted, at
    /// its time limit otherwise.
    fn release_s(&self, now: UnixSeconds) -> UnixSeconds {
        match &self.preempting {
            Some(p) => p.kill_s,
            None => self.limit_end_s().max(now),
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

#[derive(Clone, Debug)]
struct PartitionInfo {
    tier: u32,
    max_time_s: Option<u64>,
    grace_s: Option<u64>,
}

/// The scheduler's whole state.
#[derive(Clone, Debug)]
pub struct Scheduler {
    options: SchedulerOptions,
    knobs: SchedulerConfig,
    tenants: TenantTree,
    /// Accounts in a fixed order, so per-cycle figures are vectors, not maps.
    account_ids: Vec<AccountId>,
    account_index: HashMap<AccountId, usize>,
    /// The most GPUs each account's jobs could ever get.
    capacity: HashMap<AccountId, u32>,
    max_weight: f64,
    formula: FairShareFormula,
    partitions: HashMap<String, PartitionInfo>,
    default_partition: String,
    cluster: Cluster,
    ledger: UsageLedger,
    windows: UsageWindows,
    /// Bytes kept per account (project `None`) and project, from storage scans.
    storage_used: HashMap<WindowKey, u64>,
    reservations: Reservations,
    pending: Vec<PendingJob>,
    pending_ids: HashSet<JobId>,
    running: BTreeMap<JobId, RunningJob>,
    running_per_account: HashMap<AccountId, u32>,
    running_per_project: HashMap<(AccountId, ProjectId), u32>,
    /// Preemptors waiting for their victims to exit.
    claims: HashMap<JobId, Claim>,
    last_cycle_s: UnixSeconds,
}

/// A preemptor waiting for its victims: it counts as running against its quota meanwhile, so
/// that its own account's jobs do not take the slot its victims paid for.
#[derive(Clone, Debug)]
struct Claim {
    account: AccountId,
    project: Option<ProjectId>,
    victims: Vec<JobId>,
}

/// Whether preemption could free anything for a job of a given tier: only when a lower tier
/// runs, or an elastic job of no higher tier is above its minimum. Checked before the search,
/// which looks at every running job.
#[derive(Clone, Copy, Debug, Default)]
struct PreemptionGate {
    lowest_tier: Option<u32>,
    lowest_shrinkable_tier: Option<u32>,
}

impl PreemptionGate {
    fn of<'a>(running: impl Iterator<Item = &'a RunningJob>) -> Self {
        let mut gate = PreemptionGate::default();
        for job in running {
            gate.add(job);
        }
        gate
    }

    fn add(&mut self, job: &RunningJob) {
        self.lowest_tier = Some(self.lowest_tier.map_or(job.tier, |t| t.min(job.tier)));
        if job.spec.is_elastic() && job.placement.gpu_count() > job.spec.min_size() {
            self.lowest_shrinkable_tier = Some(
                self.lowest_shrinkable_tier
                    .map_or(job.tier, |t| t.min(job.tier)),
            );
        }
    }

    fn may_help(&self, tier: u32) -> bool {
        self.lowest_tier.is_some_and(|t| t < tier)
            || self.lowest_shrinkable_tier.is_some_and(|t| t <= tier)
    }
}

/// Candidate sizes of a job, largest first: its size, or for an elastic job every size from
/// its maximum down to its minimum (whole nodes above one node).
fn sizes(spec: &JobSpec, gpus_per_node: u32) -> Vec<u32> {
    let (min, max) = (spec.min_size(), spec.gpus);
    if min == max {
        return vec![max];
    }
    let step = if max > gpus_per_node {
        gpus_per_node.max(1)
    } else {
        1
    };
    let mut out = vec![max];
    let mut s = if step > 1 {
        (max - 1) / step * step
    } else {
        max - 1
    };
    while s > min {
        out.push(s);
        s -= step;
    }
    out.push(min);
    out
}

impl Scheduler {
    pub fn new(config: &ClusterConfig, options: SchedulerOptions) -> Self {
        let partitions = config
            .partitions
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    PartitionInfo {
                        tier: p.priority_tier,
                        max_time_s: p.max_time.map(|d| d.as_secs()),
                        grace_s: p.grace_time.map(|d| d.as_secs()),
                    },
                )
            })
            .collect();
        let params = FairShareParams {
            half_life_s: config.fair_share.half_life.as_secs() as f64,
            factor_gpu_hours: config.fair_share.usage_factor_gpu_hours as f64,
        };
        let tenants = config.tenants();
        let max_weight = tenants
            .accounts()
            .map(|a| f64::from(a.weight))
            .fold(1.0, f64::max);
        let account_ids: Vec<AccountId> = tenants.accounts().map(|a| a.id.clone()).collect();
        let account_index = account_ids
            .iter()
            .enumerate()
            .map(|(i, a)| (a.clone(), i))
            .collect();
        let cluster = Cluster::new(config.nodes());
        let capacity = account_ids
            .iter()
            .map(|a| (a.clone(), cluster.capacity_for(a)))
            .collect();
        Scheduler {
            options,
            knobs: config.scheduler.clone(),
            tenants,
            account_ids,
            account_index,
            capacity,
            max_weight,
            formula: config.fair_share.formula,
            partitions,
            default_partition: config
                .default_partition()
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            cluster,
            ledger: UsageLedger::new(params),
            windows: UsageWindows::tracking(
                config
                    .accounts
                    .iter()
                    .filter(|a| {
                        has_gpu_hour_quota(&a.quota)
                            || a.projects.iter().any(|p| has_gpu_hour_quota(&p.quota))
                    })
                    .map(|a| a.id.clone()),
            ),
            storage_used: HashMap::new(),
            reservations: Reservations::default(),
            pending: Vec::new(),
            pending_ids: HashSet::new(),
            running: BTreeMap::new(),
            running_per_account: HashMap::new(),
            running_per_project: HashMap::new(),
            claims: HashMap::new(),
            last_cycle_s: 0,
        }
    }

    pub fn options(&self) -> SchedulerOptions {
        self.options
    }

    pub fn knobs(&self) -> &SchedulerConfig {
        &self.knobs
    }

    pub fn tenants(&self) -> &TenantTree {
        &self.tenants
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn pending(&self) -> &[PendingJob] {
        &self.pending
    }

    pub fn running(&self) -> impl Iterator<Item = &RunningJob> {
        self.running.values()
    }

    pub fn running_job(&self, id: &JobId) -> Option<&RunningJob> {
        self.running.get(id)
    }

    pub fn ledger(&self) -> &UsageLedger {
        &self.ledger
    }

    pub fn ledger_mut(&mut self) -> &mut UsageLedger {
        &mut self.ledger
    }

    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// The tier of a partition (the default one for `None`).
    pub fn tier_of(&self, partition: Option<&str>) -> Option<u32> {
        self.partitions
            .get(partition.unwrap_or(&self.default_partition))
            .map(|p| p.tier)
    }

    /// Admits a job to the queue, or refuses it if it could never run as asked.
    pub fn submit(&mut self, spec: JobSpec) -> Result<(), Refusal> {
        self.submit_with_history(spec, 0)
    }

    /// Admits a job that was already preempted `preemptions` times (a restart reading its
    /// queue back).
    pub fn submit_with_history(&mut self, spec: JobSpec, preemptions: u32) -> Result<(), Refusal> {
        let tier = self.admit(&spec)?;
        let limits = self.limits_for(&spec);
        self.pending_ids.insert(spec.id.clone());
        self.pending.push(PendingJob {
            spec,
            tier,
            priority: 0.0,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions,
            has_preempted: false,
            limits: JobLimits::default(),
        });
        if let Some(job) = self.pending.last_mut() {
            job.limits = limits;
        }
        Ok(())
    }

    fn admit(&self, spec: &JobSpec) -> Result<u32, Refusal> {
        if self.running.contains_key(&spec.id) || self.pending_ids.contains(&spec.id) {
            return Err(Refusal::DuplicateId(spec.id.clone()));
        }
        let quota = self
            .tenants
            .effective_quota(&spec.account, spec.project.as_ref())
            .ok_or_else(|| match &spec.project {
                Some(p) if self.tenants.account(&spec.account).is_some() => {
                    Refusal::UnknownProject {
                        account: spec.account.clone(),
                        project: p.clone(),
                    }
                }
                _ => Refusal::UnknownAccount(spec.account.clone()),
            })?;
        let partition_name = spec.partition.as_deref().unwrap_or(&self.default_partition);
        let partition = self
            .partitions
            .get(partition_name)
            .ok_or_else(|| Refusal::UnknownPartition(partition_name.to_owned()))?;
        if spec.gpus == 0 {
            return Err(Refusal::NoGpus);
        }
        if let Some(min) = spec.min_gpus {
            if min == 0 || min > spec.gpus {
                return Err(Refusal::ElasticRange {
                    min,
                    max: spec.gpus,
                });
            }
        }
        if let Some(limit) = quota.max_gpus_per_job {
            if spec.gpus > limit {
                return Err(Refusal::TooManyGpus {
                    asked: spec.gpus,
                    limit,
                });
            }
        }
        let capacity = self
            .capacity
            .get(&spec.account)
            .copied()
            .unwrap_or_default();
        if spec.min_size() > capacity {
            return Err(Refusal::LargerThanCluster {
                asked: spec.min_size(),
                capacity,
            });
        }
        if let Some(limit) = quota.max_run_time {
            if spec.time_limit_s > limit.as_secs() {
                return Err(Refusal::TimeLimit {
                    asked_s: spec.time_limit_s,
                    limit_s: limit.as_secs(),
                    what: "quota max_run_time",
                });
            }
        }
        if let Some(limit_s) = partition.max_time_s {
            if spec.time_limit_s > limit_s {
                return Err(Refusal::TimeLimit {
                    asked_s: spec.time_limit_s,
                    limit_s,
                    what: "partition max_time",
                });
            }
        }
        check_gpu_hours_ever_fit(spec, &quota)?;
        Ok(partition.tier)
    }

    /// Puts back a job that was running before a restart, on the GPUs it held. Refused when
    /// the job is unknown to the config or its GPUs are taken.
    pub fn restore_running(
        &mut self,
        spec: JobSpec,
        start_s: UnixSeconds,
        allocation: &Allocation,
        preemptions: u32,
        last_checkpoint_s: Option<UnixSeconds>,
        preempting: Option<Preempting>,
    ) -> Result<(), Refusal> {
        let tier = self.admit(&spec)?;
        let placement = self
            .cluster
            .from_allocation(allocation)
            .filter(|p| self.cluster.is_free(p) && p.gpu_count() >= spec.min_size())
            .ok_or_else(|| Refusal::DuplicateId(spec.id.clone()))?;
        let limits = self.limits_for(&spec);
        let pending = PendingJob {
            spec,
            tier,
            priority: 0.0,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions,
            has_preempted: false,
            limits,
        };
        self.start(&pending, placement, start_s, false);
        if let Some(job) = self.running.get_mut(&pending.spec.id) {
            job.last_checkpoint_s = last_checkpoint_s;
            job.preempting = preempting;
        }
        Ok(())
    }

    /// Removes a pending job (cancelled before it started).
    pub fn cancel_pending(&mut self, id: &JobId) -> Option<JobSpec> {
        let pos = self.pending.iter().position(|p| &p.spec.id == id)?;
        self.claims.remove(id);
        self.pending_ids.remove(id);
        Some(self.pending.remove(pos).spec)
    }

    /// Records a checkpoint a running job reported: preempting it now loses less.
    pub fn checkpointed(&mut self, id: &JobId, at: UnixSeconds) -> bool {
        match self.running.get_mut(id) {
            Some(job) => {
                job.last_checkpoint_s = Some(at);
                true
            }
            None => false,
        }
    }

    /// Adds an advance reservation, choosing its nodes when it asks for a count.
    pub fn add_reservation(
        &mut self,
        req: ReservationRequest,
    ) -> Result<AdvanceReservation, ReservationError> {
        let running = &self.running;
        let tenants = &self.tenants;
        self.reservations
            .add(
                req,
                &self.cluster,
                |a| tenants.account(a).is_some(),
                |node| {
                    running
                        .values()
                        .filter(|j| j.placement.0.iter().any(|s| s.node == node))
                        .map(|j| (j.limit_end_s(), j.spec.id.to_string()))
                        .max()
                },
            )
            .cloned()
    }

    pub fn remove_reservation(&mut self, name: &str) -> Option<AdvanceReservation> {
        self.reservations.remove(name)
    }

    /// Charges running jobs' GPU-seconds up to `now` to their accounts' decayed usage and to
    /// the daily quota windows. The simulator calls this; a live service replaces the decayed
    /// usage with the aggregator's feed.
    pub fn accrue_usage(&mut self, now: UnixSeconds) {
        for job in self.running.values_mut() {
            accrue(&mut self.ledger, &mut self.windows, job, now);
        }
        self.windows.prune(day_of(now));
    }

    /// A running job ended for good (finished, failed, killed at its limit, cancelled).
    pub fn finish(&mut self, id: &JobId, now: UnixSeconds) -> Option<RunningJob> {
        let mut job = self.running.remove(id)?;
        accrue(&mut self.ledger, &mut self.windows, &mut job, now);
        self.cluster.release(&job.placement);
        decrement(&mut self.running_per_account, &job.spec.account);
        if let Some(p) = &job.spec.project {
            decrement(
                &mut self.running_per_project,
                &(job.spec.account.clone(), p.clone()),
            );
        }
        Some(job)
    }

    /// A preempted job has exited: its GPUs are free and it waits in the queue again.
    pub fn requeue(&mut self, id: &JobId, now: UnixSeconds) -> bool {
        let Some(job) = self.finish(id, now) else {
            return false;
        };
        let limits = self.limits_for(&job.spec);
        self.pending_ids.insert(job.spec.id.clone());
        self.pending.push(PendingJob {
            spec: job.spec,
            tier: job.tier,
            priority: 0.0,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions: job.preemptions + 1,
            has_preempted: false,
            limits,
        });
        true
    }

    /// One scheduling cycle at `now`: starts what can start in priority order, preempts for
    /// higher tiers, plans starts for backfill, grows elastic jobs into GPUs nobody waits for,
    /// and sets the reason of every job left pending.
    pub fn schedule(&mut self, now: UnixSeconds) -> Cycle {
        self.last_cycle_s = now;
        self.order_pending(now);
        let depth = match self.options.backfill {
            Backfill::Off => 0,
            Backfill::Easy => 1,
            Backfill::Conservative => self.knobs.backfill_depth.max(1) as usize,
        };
        let mut cycle = Cycle::default();
        let mut plan: Option<Plan> = None;
        let mut planned = 0usize;
        let mut blocked = false;
        // Within a cycle placement only gets harder (jobs start, plans are added), so a job of
        // an account is hopeless where one no larger and no longer already failed.
        let mut failures: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.account_ids.len().max(1)];
        let mut pending = std::mem::take(&mut self.pending);
        // A preemptor goes first: its victims' GPUs are freed for it, and a job ahead of it
        // in the queue planning onto them would make it preempt again, in a loop.
        if !self.claims.is_empty() {
            pending.sort_by_key(|j| !self.claims.contains_key(&j.spec.id));
        }
        let mut gate = PreemptionGate::of(self.running.values());
        // Jobs are updated in place and the started ones dropped at the end: the queue can
        // hold many thousands of jobs and a cycle runs at every event.
        let mut started_any = false;
        let mut is_started = vec![false; pending.len()];
        for (i, job) in pending.iter_mut().enumerate() {
            if blocked {
                // Strict order: everything behind the first job that cannot start waits.
                for rest in pending[i..].iter_mut() {
                    rest.reason = PendingReason::Priority;
                    rest.estimated_start_s = None;
                }
                break;
            }
            job.estimated_start_s = None;
            if let Some(reason) = self.quota_hold(job, now) {
                job.reason = reason;
                continue;
            }
            let (min, limit) = (job.spec.min_size(), job.spec.time_limit_s);
            let hopeless = failures[job.limits.account]
                .iter()
                .any(|(g, l)| min >= *g && limit >= *l);
            let draining = self.claim_draining(&job.spec.id);
            if !draining {
                // Its victims are gone: it goes first this cycle (sorted above), and if it
                // still cannot start the claim lapses rather than hold a quota slot for ever.
                self.claims.remove(&job.spec.id);
            }
            if !hopeless && !draining {
                if let Some(p) = self.place_now(&job.spec, now, plan.as_ref()) {
                    let backfilled = plan.as_ref().is_some_and(Plan::has_holds);
                    let started = self.start(job, p, now, backfilled);
                    self.note_start(started, now, &mut plan, &mut gate, &mut cycle);
                    is_started[i] = true;
                    started_any = true;
                    continue;
                }
                if self.knobs.preemption && !job.has_preempted && gate.may_help(job.tier) {
                    let window = match plan.as_ref() {
                        Some(p) => p.window_now(&self.cluster, limit).into_owned(),
                        None => self.cluster.clone(),
                    };
                    if let Some(p) = self.preempt_for(job, now, window, &mut cycle, &mut plan) {
                        let started = self.start(job, p, now, false);
                        self.note_start(started, now, &mut plan, &mut gate, &mut cycle);
                        is_started[i] = true;
                        started_any = true;
                        continue;
                    }
                    job.has_preempted = self.claims.contains_key(&job.spec.id);
                }
            }
            let entry = &mut failures[job.limits.account];
            if !entry.iter().any(|(g, l)| min >= *g && limit >= *l) {
                entry.push((min, limit));
            }
            job.reason = self.blocked_reason(&job.spec, planned == 0);
            let must_plan = self.claims.contains_key(&job.spec.id);
            if planned < depth || must_plan {
                let plan = plan.get_or_insert_with(|| self.build_plan(now));
                if let Some((t, p)) = self.plan_earliest(plan, &job.spec) {
                    job.estimated_start_s = Some(t);
                    plan.hold(t, t.saturating_add(limit as i64), p, &self.cluster);
                    planned += 1;
                }
            }
            if depth == 0 {
                blocked = true;
            }
        }
        if started_any {
            let mut k = 0;
            pending.retain(|_| {
                k += 1;
                !is_started[k - 1]
            });
        }
        self.pending = pending;
        if !self.pending.iter().any(|p| p.reason.waits_for_gpus()) {
            self.grow_elastic(now, &mut cycle);
        }
        cycle
    }

    /// A job started in this cycle: the plan and the preemption gate learn of it, and the
    /// cycle reports it.
    fn note_start(
        &self,
        started: Started,
        now: UnixSeconds,
        plan: &mut Option<Plan>,
        gate: &mut PreemptionGate,
        cycle: &mut Cycle,
    ) {
        let running = &self.running[&started.job_id];
        gate.add(running);
        if let Some(plan) = plan.as_mut() {
            plan.started(
                started.job_id.clone(),
                running.limit_end_s().max(now),
                running.placement.clone(),
            );
        }
        cycle.started.push(started);
    }

    /// The reason of a job that could not start: the reservation when one is what keeps it
    /// off GPUs it could otherwise use; otherwise `Resources` for the first in line.
    fn blocked_reason(&self, spec: &JobSpec, first: bool) -> PendingReason {
        if !self.reservations.is_empty() {
            let unreserved = sizes(spec, self.cluster.gpus_per_node_max())
                .into_iter()
                .any(|g| {
                    self.cluster
                        .find(g, &spec.account, &NodeFilter::none())
                        .is_some()
                });
            if unreserved {
                return PendingReason::ReqNodeNotAvail;
            }
        }
        if first {
            PendingReason::Resources
        } else {
            PendingReason::Priority
        }
    }

    fn filter_for(&self, spec: &JobSpec, start: UnixSeconds, end: UnixSeconds) -> NodeFilter {
        if self.reservations.is_empty() {
            NodeFilter::none()
        } else {
            self.reservations
                .filter(&self.cluster, &spec.account, start, end)
        }
    }

    /// Where the job could start now without delaying any planned start: its largest size
    /// that fits.
    fn place_now(
        &self,
        spec: &JobSpec,
        now: UnixSeconds,
        plan: Option<&Plan>,
    ) -> Option<Placement> {
        let limit = spec.time_limit_s;
        let filter = self.filter_for(spec, now, now.saturating_add(limit as i64));
        let window = match plan {
            Some(p) => p.window_now(&self.cluster, limit),
            None => Cow::Borrowed(&self.cluster),
        };
        let candidates = sizes(spec, self.cluster.gpus_per_node_max());
        if !self.reservations.is_empty() {
            let end = now.saturating_add(limit as i64);
            if let Some(reserved) =
                self.reservations
                    .usable_reserved(&self.cluster, &spec.account, now, end)
            {
                if let Some(p) = candidates
                    .iter()
                    .find_map(|g| window.find(*g, &spec.account, &reserved))
                {
                    return Some(p);
                }
            }
        }
        candidates
            .into_iter()
            .find_map(|g| window.find(g, &spec.account, &filter))
    }

    fn build_plan(&self, now: UnixSeconds) -> Plan {
        Plan::new(
            now,
            self.running
                .values()
                .map(|j| (j.release_s(now), j.spec.id.clone(), j.placement.clone()))
                .collect(),
            self.reservations.boundaries(),
        )
    }

    fn plan_earliest(&self, plan: &Plan, spec: &JobSpec) -> Option<(UnixSeconds, Placement)> {
        let (min, limit) = (spec.min_size(), spec.time_limit_s);
        plan.earliest(&self.cluster, min, limit, |cluster, t| {
            let filter = self.filter_for(spec, t, t.saturating_add(limit as i64));
            cluster.find(min, &spec.account, &filter)
        })
    }

    /// True while a preemptor waits for victims that have not exited yet.
    fn claim_draining(&self, id: &JobId) -> bool {
        let Some(claim) = self.claims.get(id) else {
            return false;
        };
        let still_exiting = claim.victims.iter().any(|v| {
            self.running
                .get(v)
                .and_then(|r| r.preempting.as_ref())
                .is_some_and(|p| &p.by == id)
        });
        still_exiting
    }

    fn grace_s(&self, job: &RunningJob) -> u64 {
        job.spec
            .grace_s
            .or_else(|| {
                self.partitions
                    .get(
                        job.spec
                            .partition
                            .as_deref()
                            .unwrap_or(&self.default_partition),
                    )
                    .and_then(|p| p.grace_s)
            })
            .unwrap_or(self.knobs.default_grace.as_secs())
    }

    /// Frees GPUs for `job` from lower tiers when it cannot start otherwise. Elastic jobs above
    /// their minimum shrink first (they lose nothing, and a job of the same tier may take back
    /// what an elastic job borrowed); then whole jobs of a lower tier that have run at least
    /// `min_run_time`, those that would lose the least work first; then the set is pruned so no
    /// more is freed than needed. Returns a placement when the job can start now (only shrinks
    /// were needed); otherwise the victims are signalled and the job waits for them.
    fn preempt_for(
        &mut self,
        job: &PendingJob,
        now: UnixSeconds,
        mut trial: Cluster,
        cycle: &mut Cycle,
        plan: &mut Option<Plan>,
    ) -> Option<Placement> {
        struct Candidate {
            id: JobId,
            frees: Placement,
            shrink_to: Option<u32>,
            cost: i64,
            tier: u32,
            start_s: UnixSeconds,
        }
        let min_run = self.knobs.min_run_time.as_secs() as i64;
        let mut candidates: Vec<Candidate> = self
            .running
            .values()
            .filter(|r| r.preempting.is_none())
            .filter_map(|r| {
                let count = r.placement.gpu_count();
                if r.spec.is_elastic() && count > r.spec.min_size() && r.tier <= job.tier {
                    let mut kept = r.placement.clone();
                    let frees = kept.shrink_to(r.spec.min_size());
                    return Some(Candidate {
                        id: r.spec.id.clone(),
                        frees,
                        shrink_to: Some(r.spec.min_size()),
                        cost: 0,
                        tier: r.tier,
                        start_s: r.start_s,
                    });
                }
                (r.tier < job.tier && now - r.start_s >= min_run).then(|| Candidate {
                    id: r.spec.id.clone(),
                    frees: r.placement.clone(),
                    shrink_to: None,
                    cost: i64::from(count) * r.work_at_risk_s(now),
                    tier: r.tier,
                    start_s: r.start_s,
                })
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_by(|a, b| {
            (a.cost, a.tier, std::cmp::Reverse(a.start_s), &a.id).cmp(&(
                b.cost,
                b.tier,
                std::cmp::Reverse(b.start_s),
                &b.id,
            ))
        });
        let (min, limit) = (job.spec.min_size(), job.spec.time_limit_s);
        let filter = self.filter_for(&job.spec, now, now.saturating_add(limit as i64));
        let fits = |c: &Cluster| c.find(min, &job.spec.account, &filter).is_some();
        let mut chosen: Vec<Candidate> = Vec::new();
        for c in candidates {
            release_into(&mut trial, &c.frees);
            chosen.push(c);
            if fits(&trial) {
                break;
            }
        }
        if !fits(&trial) {
            return None;
        }
        // Prune: give back, most costly first, every victim the job can do without.
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            trial.hold(&chosen[i].frees);
            if fits(&trial) {
                chosen.remove(i);
            } else {
                release_into(&mut trial, &chosen[i].frees);
            }
        }
        // Shrink elastic jobs no further than needed: the largest size that still lets the job
        // fit.
        for c in chosen.iter_mut() {
            let (Some(min_keep), Some(r)) = (c.shrink_to, self.running.get(&c.id)) else {
                continue;
            };
            trial.hold(&c.frees);
            let count = r.placement.gpu_count();
            let step = if count > self.cluster.gpus_per_node_max() {
                self.cluster.gpus_per_node_max().max(1)
            } else {
                1
            };
            let mut keep = count.saturating_sub(step).max(min_keep);
            loop {
                let mut kept = r.placement.clone();
                let frees = kept.shrink_to(keep);
                release_into(&mut trial, &frees);
                if fits(&trial) || keep == min_keep {
                    c.frees = frees;
                    c.shrink_to = Some(keep);
                    break;
                }
                trial.hold(&frees);
                keep = keep.saturating_sub(step).max(min_keep);
            }
        }
        let mut victims = Vec::new();
        for c in chosen {
            let grace = self
                .running
                .get(&c.id)
                .map(|r| self.grace_s(r))
                .unwrap_or(0);
            let Some(r) = self.running.get_mut(&c.id) else {
                continue;
            };
            match c.shrink_to {
                Some(keep) => {
                    let freed = r.placement.shrink_to(keep);
                    accrue(&mut self.ledger, &mut self.windows, r, now);
                    self.cluster.release(&freed);
                    cycle.resized.push(Resized {
                        job_id: c.id.clone(),
                        allocation: self.cluster.to_allocation(&r.placement),
                        gpus: r.placement.gpu_count(),
                    });
                    if let Some(plan) = plan.as_mut() {
                        plan.released_at(&c.id, r.release_s(now), r.placement.clone());
                    }
                }
                None => {
                    let kill_s = now + grace as i64;
                    r.preempting = Some(Preempting {
                        by: job.spec.id.clone(),
                        signal_s: now,
                        kill_s,
                    });
                    cycle.preempted.push(Preemption {
                        job_id: c.id.clone(),
                        by: job.spec.id.clone(),
                        kill_s,
                    });
                    if let Some(plan) = plan.as_mut() {
                        plan.released_at(&c.id, kill_s, r.placement.clone());
                    }
                    victims.push(c.id);
                }
            }
        }
        if victims.is_empty() {
            return self.place_now(&job.spec, now, plan.as_ref());
        }
        self.claims.insert(
            job.spec.id.clone(),
            Claim {
                account: job.spec.account.clone(),
                project: job.spec.project.clone(),
                victims,
            },
        );
        None
    }

    fn start(
        &mut self,
        job: &PendingJob,
        placement: Placement,
        now: UnixSeconds,
        backfilled: bool,
    ) -> Started {
        self.claims.remove(&job.spec.id);
        self.pending_ids.remove(&job.spec.id);
        self.cluster.take(&placement);
        let allocation = self.cluster.to_allocation(&placement);
        *self
            .running_per_account
            .entry(job.spec.account.clone())
            .or_default() += 1;
        if let Some(p) = &job.spec.project {
            *self
                .running_per_project
                .entry((job.spec.account.clone(), p.clone()))
                .or_default() += 1;
        }
        let started = Started {
            job_id: job.spec.id.clone(),
            allocation,
            gpus: placement.gpu_count(),
            backfilled,
        };
        self.running.insert(
            job.spec.id.clone(),
            RunningJob {
                spec: job.spec.clone(),
                tier: job.tier,
                start_s: now,
                placement,
                last_checkpoint_s: None,
                preempting: None,
                preemptions: job.preemptions,
                backfilled,
                accrued_until: now,
            },
        );
        started
    }

    /// Elastic jobs below their maximum take free GPUs nobody waits for.
    fn grow_elastic(&mut self, now: UnixSeconds, cycle: &mut Cycle) {
        let growable: Vec<JobId> = self
            .running
            .values()
            .filter(|r| {
                r.spec.is_elastic()
                    && r.preempting.is_none()
                    && r.placement.gpu_count() < r.spec.gpus
            })
            .map(|r| r.spec.id.clone())
            .collect();
        for id in growable {
            if self.cluster.free_gpus() == 0 {
                break;
            }
            let Some(r) = self.running.get(&id) else {
                continue;
            };
            let filter = self.filter_for(&r.spec, r.start_s, r.limit_end_s());
            let more = r.spec.gpus - r.placement.gpu_count();
            let Some(extra) =
                self.cluster
                    .find_growth(&r.placement, more, &r.spec.account, &filter)
            else {
                continue;
            };
            self.cluster.take(&extra);
            let Some(r) = self.running.get_mut(&id) else {
                continue;
            };
            accrue(&mut self.ledger, &mut self.windows, r, now);
            r.placement.extend(&extra);
            cycle.resized.push(Resized {
                job_id: id,
                allocation: self.cluster.to_allocation(&r.placement),
                gpus: r.placement.gpu_count(),
            });
        }
    }

    fn limits_for(&self, spec: &JobSpec) -> JobLimits {
        let account = self.tenants.account(&spec.account);
        let quota = self
            .tenants
            .effective_quota(&spec.account, spec.project.as_ref())
            .unwrap_or_default();
        let project_quota = spec.project.as_ref().and_then(|p| {
            account
                .and_then(|a| a.projects.iter().find(|q| &q.id == p))
                .map(|q| &q.quota)
        });
        JobLimits {
            account: self.account_index.get(&spec.account).copied().unwrap_or(0),
            running_limited: quota.max_running_jobs.is_some()
                || account.is_some_and(|a| a.quota.max_running_jobs.is_some()),
            gpu_hours_limited: account.is_some_and(|a| has_gpu_hour_quota(&a.quota))
                || project_quota.is_some_and(has_gpu_hour_quota),
            storage_limited: account.is_some_and(|a| a.quota.storage.is_some())
                || project_quota.is_some_and(|q| q.storage.is_some()),
            quota_priority: quota.priority.map_or(0.5, |p| f64::from(p) / 100.0),
        }
    }

    /// The quota that keeps a job from starting now, if any.
    fn quota_hold(&self, job: &PendingJob, now: UnixSeconds) -> Option<PendingReason> {
        let spec = &job.spec;
        if job.limits.running_limited && self.at_job_limit(spec) {
            return Some(PendingReason::AssocMaxJobsLimit);
        }
        if job.limits.storage_limited && self.over_storage_quota(spec) {
            return Some(PendingReason::AssocGrpStorage);
        }
        if !job.limits.gpu_hours_limited {
            return None;
        }
        let account = self.tenants.account(&spec.account)?;
        let project_quota = spec
            .project
            .as_ref()
            .and_then(|p| account.projects.iter().find(|q| &q.id == p))
            .map(|p| &p.quota);
        let scopes = std::iter::once(((spec.account.clone(), None), &account.quota))
            .chain(project_quota.map(|q| ((spec.account.clone(), spec.project.clone()), q)));
        for (key, quota) in scopes {
            if let Some(reason) = self.gpu_hours_hold(spec, &key, quota, now) {
                return Some(reason);
            }
        }
        None
    }

    /// Bytes an account (project `None`) or a project keeps, as the last storage scan found.
    pub fn set_storage_used(
        &mut self,
        account: &AccountId,
        project: Option<&ProjectId>,
        bytes: u64,
    ) {
        self.storage_used
            .insert((account.clone(), project.cloned()), bytes);
    }

    fn over_storage_quota(&self, spec: &JobSpec) -> bool {
        let Some(account) = self.tenants.account(&spec.account) else {
            return false;
        };
        let used = |project: Option<&ProjectId>| {
            self.storage_used
                .get(&(spec.account.clone(), project.cloned()))
                .copied()
                .unwrap_or(0)
        };
        if account.quota.storage.is_some_and(|q| used(None) > q.0) {
            return true;
        }
        spec.project.as_ref().is_some_and(|p| {
            account
                .projects
                .iter()
                .find(|q| &q.id == p)
                .and_then(|q| q.quota.storage)
                .is_some_and(|q| used(Some(p)) > q.0)
        })
    }

    fn gpu_hours_hold(
        &self,
        spec: &JobSpec,
        key: &WindowKey,
        quota: &Quota,
        now: UnixSeconds,
    ) -> Option<PendingReason> {
        if quota.gpu_hours_per_day.is_none() && quota.gpu_hours_per_week.is_none() {
            return None;
        }
        let today = day_of(now);
        let day_end = (today + 1) * DAY_S;
        let gpus = i64::from(spec.min_size());
        let limit_end = now.saturating_add(spec.time_limit_s as i64);
        // Running jobs count for what they may still use: up to their time limits.
        let committed = |until: UnixSeconds| -> i64 {
            self.running
                .values()
                .filter(|r| r.spec.account == key.0 && (key.1.is_none() || r.spec.project == key.1))
                .map(|r| {
                    i64::from(r.placement.gpu_count())
                        * (r.limit_end_s().min(until) - r.accrued_until).max(0)
                })
                .sum()
        };
        if let Some(limit) = quota.gpu_hours_per_day {
            let used = self.windows.day(key, today) + committed(day_end);
            let need = gpus * (limit_end.min(day_end) - now);
            if used + need > limit as i64 * 3600 {
                return Some(PendingReason::AssocGrpGpuHoursDay);
            }
        }
        if let Some(limit) = quota.gpu_hours_per_week {
            // The seven UTC days ending today: what was used, what running jobs may still use
            // today, and this job's today. Later days are checked as later jobs start.
            let used = self.windows.week(key, today) + committed(day_end);
            let need = gpus * (limit_end.min(day_end) - now);
            if used + need > limit as i64 * 3600 {
                return Some(PendingReason::AssocGrpGpuHoursWeek);
            }
        }
        None
    }

    fn at_job_limit(&self, spec: &JobSpec) -> bool {
        let Some(quota) = self
            .tenants
            .effective_quota(&spec.account, spec.project.as_ref())
        else {
            return true;
        };
        let Some(limit) = quota.max_running_jobs else {
            return false;
        };
        let claimed = |project: Option<&ProjectId>| -> u32 {
            self.claims
                .iter()
                .filter(|(id, c)| {
                    *id != &spec.id
                        && c.account == spec.account
                        && (project.is_none() || c.project.as_ref() == project)
                })
                .count() as u32
        };
        let account_running = self
            .running_per_account
            .get(&spec.account)
            .copied()
            .unwrap_or(0)
            + claimed(None);
        let account_limit = self
            .tenants
            .account(&spec.account)
            .and_then(|a| a.quota.max_running_jobs)
            .unwrap_or(u32::MAX);
        let project_running = spec
            .project
            .as_ref()
            .and_then(|p| {
                self.running_per_project
                    .get(&(spec.account.clone(), p.clone()))
            })
            .copied()
            .map(|n| n + claimed(spec.project.as_ref()))
            .unwrap_or(account_running);
        account_running >= account_limit || project_running >= limit
    }

    /// Each account's fair-share factor in [0, 1], in `account_ids` order: the design's
    /// `weight / (1 + usage / factor)` over the largest weight, or Slurm's classic
    /// `2^(-usage share / normalised share)`.
    pub fn fair_share_factors(&self, now: UnixSeconds) -> Vec<f64> {
        let weights: Vec<f64> = self
            .account_ids
            .iter()
            .map(|id| f64::from(self.tenants.account(id).map_or(0, |a| a.weight)))
            .collect();
        match self.formula {
            FairShareFormula::Weighted => self
                .account_ids
                .iter()
                .zip(&weights)
                .map(|(id, w)| self.ledger.priority(id, *w, now) / self.max_weight)
                .collect(),
            FairShareFormula::SlurmClassic => {
                let usage: Vec<f64> = self
                    .account_ids
                    .iter()
                    .map(|id| self.ledger.gpu_hours(id, now))
                    .collect();
                let total_usage: f64 = usage.iter().sum();
                let total_weight: f64 = weights.iter().sum();
                usage
                    .iter()
                    .zip(&weights)
                    .map(|(u, w)| {
                        let usage_share = if total_usage > 0.0 {
                            u / total_usage
                        } else {
                            0.0
                        };
                        slurm_classic_factor(usage_share, w / total_weight.max(1.0))
                    })
                    .collect()
            }
        }
    }

    /// The fair-share factor of one account now, in [0, 1].
    pub fn fair_share_of(&self, account: &AccountId, now: UnixSeconds) -> f64 {
        self.account_index
            .get(account)
            .and_then(|i| self.fair_share_factors(now).get(*i).copied())
            .unwrap_or(0.0)
    }

    /// The priority a job of this shape would have now under fair share.
    pub fn priority_of(&self, spec: &JobSpec, now: UnixSeconds) -> f64 {
        let fair_share = self.fair_share_of(&spec.account, now);
        self.job_priority(spec, fair_share, self.limits_for(spec).quota_priority, now)
    }

    /// Slurm's multifactor priority: fair share (the account's `weight / (1 + usage /
    /// factor)` over the largest weight), age (up to `max_age`), size (share of the cluster)
    /// and the quota's priority (1-100, as a fraction), each in [0, 1] times its weight.
    fn job_priority(
        &self,
        spec: &JobSpec,
        fair_share: f64,
        quota_priority: f64,
        now: UnixSeconds,
    ) -> f64 {
        let k = &self.knobs;
        let age =
            ((now - spec.submit_s).max(0) as f64 / k.max_age.as_secs().max(1) as f64).min(1.0);
        let size = f64::from(spec.min_size()) / f64::from(self.cluster.total_gpus().max(1));
        f64::from(k.weight_fair_share) * fair_share
            + f64::from(k.weight_age) * age
            + f64::from(k.weight_job_size) * size
            + f64::from(k.weight_quota_priority) * quota_priority
    }

    fn order_pending(&mut self, now: UnixSeconds) {
        if self.options.policy == Policy::FairShare {
            let fair_share = self.fair_share_factors(now);
            let scores: Vec<f64> = self
                .pending
                .iter()
                .map(|j| {
                    let fs = fair_share.get(j.limits.account).copied().unwrap_or(0.0);
                    self.job_priority(&j.spec, fs, j.limits.quota_priority, now)
                })
                .collect();
            for (job, score) in self.pending.iter_mut().zip(scores) {
                job.priority = score;
            }
        }
        let order = |a: &PendingJob, b: &PendingJob| {
            b.tier
                .cmp(&a.tier)
                .then_with(|| b.priority.total_cmp(&a.priority))
                .then_with(|| a.spec.submit_s.cmp(&b.spec.submit_s))
                .then_with(|| id_order(&a.spec.id, &b.spec.id))
        };
        // The queue is mostly in order already (always, under FIFO without arrivals of a higher
        // tier): checking is cheaper than moving thousands of jobs.
        if !self.pending.is_sorted_by(|a, b| order(a, b).is_le()) {
            self.pending.sort_by(order);
        }
    }

    /// Checks the scheduler's invariants; tests call it after every step: no GPU held twice,
    /// every job within its size, quotas of running jobs and GPU-hours kept, reservations
    /// honoured.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut rebuilt = self.cluster.empty_like();
        for job in self.running.values() {
            if !rebuilt.is_free(&job.placement) {
                return Err(format!(
                    "job {} holds a GPU that another job holds",
                    job.spec.id
                ));
            }
            let n = job.placement.gpu_count();
            if n < job.spec.min_size() || n > job.spec.gpus {
                return Err(format!(
                    "job {} holds {n} GPUs, asked {}..={}",
                    job.spec.id,
                    job.spec.min_size(),
                    job.spec.gpus
                ));
            }
            rebuilt.take(&job.placement);
            for r in self.reservations.iter() {
                let on_reserved = job.placement.0.iter().any(|s| r.nodes.contains(&s.node));
                if on_reserved && !r.admits(&job.spec.account, job.start_s, job.limit_end_s()) {
                    return Err(format!(
                        "job {} of {} runs on nodes of reservation {} in its window",
                        job.spec.id, job.spec.account, r.name
                    ));
                }
            }
        }
        if rebuilt.free_gpus() != self.cluster.free_gpus() || !rebuilt.same_free(&self.cluster) {
            return Err(format!(
                "free GPUs {} do not match running jobs (expected {})",
                self.cluster.free_gpus(),
                rebuilt.free_gpus()
            ));
        }
        for account in self.tenants.accounts() {
            let n = self
                .running_per_account
                .get(&account.id)
                .copied()
                .unwrap_or(0);
            let actual = self
                .running
                .values()
                .filter(|j| j.spec.account == account.id)
                .count() as u32;
            if n != actual {
                return Err(format!(
                    "account {} counted {n} running jobs, has {actual}",
                    account.id
                ));
            }
            if account.quota.max_running_jobs.is_some_and(|l| n > l) {
                return Err(format!(
                    "account {} runs {n} jobs, over its quota",
                    account.id
                ));
            }
            let today = day_of(self.last_cycle_s);
            let key = (account.id.clone(), None);
            if let Some(limit) = account.quota.gpu_hours_per_day {
                let used = self.windows.day(&key, today);
                if used > limit as i64 * 3600 {
                    return Err(format!(
                        "account {} used {used} GPU-seconds today, over its {limit} GPU-hours",
                        account.id
                    ));
                }
            }
            for project in &account.projects {
                let running = self
                    .running
                    .values()
                    .filter(|j| {
                        j.spec.account == account.id && j.spec.project.as_ref() == Some(&project.id)
                    })
                    .count() as u32;
                if project.quota.max_running_jobs.is_some_and(|l| running > l) {
                    return Err(format!(
                        "project {}/{} runs {running} jobs, over its quota",
                        account.id, project.id
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Job ids in submission order: numeric ids (Slurm's) by value, so `10` comes after `9`.
fn id_order(a: &JobId, b: &JobId) -> std::cmp::Ordering {
    (a.as_str().len(), a).cmp(&(b.as_str().len(), b))
}

/// Frees GPUs in a trial copy, where some may already be free.
fn release_into(trial: &mut Cluster, placement: &Placement) {
    trial.hold(placement);
    trial.release(placement);
}

fn has_gpu_hour_quota(q: &Quota) -> bool {
    q.gpu_hours_per_day.is_some() || q.gpu_hours_per_week.is_some()
}

/// A job whose GPU-hours alone pass its quota's window could never start.
fn check_gpu_hours_ever_fit(spec: &JobSpec, quota: &Quota) -> Result<(), Refusal> {
    let gpus = u64::from(spec.min_size());
    if let Some(limit) = quota.gpu_hours_per_day {
        // At most one whole day of a run falls in one UTC day.
        let asked = gpus * spec.time_limit_s.min(DAY_S as u64);
        if asked > limit * 3600 {
            return Err(Refusal::GpuHours {
                asked: asked.div_ceil(3600),
                limit,
                what: "quota gpu_hours_per_day",
            });
        }
    }
    if let Some(limit) = quota.gpu_hours_per_week {
        // At most seven days of a run fall in one rolling week.
        let asked = gpus * spec.time_limit_s.min(7 * DAY_S as u64);
        if asked > limit * 3600 {
            return Err(Refusal::GpuHours {
                asked: asked.div_ceil(3600),
                limit,
                what: "quota gpu_hours_per_week",
            });
        }
    }
    Ok(())
}

fn accrue(
    ledger: &mut UsageLedger,
    windows: &mut UsageWindows,
    job: &mut RunningJob,
    now: UnixSeconds,
) {
    let secs = now - job.accrued_until;
    if secs <= 0 {
        return;
    }
    let gpus = job.placement.gpu_count();
    ledger.record(&job.spec.account, f64::from(gpus) * secs as f64, now);
    windows.record(
        &job.spec.account,
        job.spec.project.as_ref(),
        gpus,
        job.accrued_until,
        now,
    );
    job.accrued_until = now;
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
    }
}
