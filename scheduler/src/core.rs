//! The scheduling cycle: admission at submission, ordering of the queue (FIFO or fair share,
//! within priority tiers), node-granular placement and EASY backfill. Pure and synchronous:
//! time is an argument, so the simulator and a live service run the same code.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::tenant::TenantTree;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, Allocation, JobId, ProjectId};

use crate::cluster::{Cluster, Placement};
use crate::fairshare::{FairShareParams, UsageLedger};

/// How the queue is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Tier, then submission order.
    Fifo,
    /// Tier, then the account's fair-share priority, then submission order.
    FairShare,
}

/// Policy and backfill switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerOptions {
    pub policy: Policy,
    /// EASY backfill: later jobs may start when they do not delay the head job's reserved
    /// start.
    pub backfill: bool,
}

impl SchedulerOptions {
    /// Parses `fifo`, `fairshare`, `fifo+backfill`, `fairshare+backfill`.
    pub fn parse(name: &str) -> Option<Self> {
        let (policy, backfill) = match name.split_once('+') {
            Some((p, "backfill")) => (p, true),
            Some(_) => return None,
            None => (name, false),
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
        if self.backfill {
            format!("{p}+backfill")
        } else {
            p.to_owned()
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
    pub gpus: u32,
    pub time_limit_s: u64,
    pub submit_s: UnixSeconds,
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
    #[error("job id `{0}` is already known")]
    DuplicateId(JobId),
}

/// Why a job is still pending, with Slurm's reason codes.
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
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PendingReason::None => "None",
            PendingReason::Resources => "Resources",
            PendingReason::Priority => "Priority",
            PendingReason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
        })
    }
}

/// A pending job and what holds it.
#[derive(Clone, Debug)]
pub struct PendingJob {
    pub spec: JobSpec,
    pub tier: u32,
    /// The account's fair-share priority at the last cycle (0 under FIFO).
    pub priority: f64,
    pub reason: PendingReason,
}

/// A running job.
#[derive(Clone, Debug)]
pub struct RunningJob {
    pub spec: JobSpec,
    pub tier: u32,
    pub start_s: UnixSeconds,
    pub placement: Placement,
    accrued_until: UnixSeconds,
}

impl RunningJob {
    /// When its time limit runs out.
    pub fn limit_end_s(&self) -> UnixSeconds {
        self.start_s + self.spec.time_limit_s as i64
    }
}

/// A job the cycle started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub job_id: JobId,
    pub allocation: Allocation,
    pub backfilled: bool,
}

#[derive(Clone, Debug)]
struct PartitionInfo {
    tier: u32,
    max_time_s: Option<u64>,
}

/// The scheduler's whole state.
#[derive(Clone, Debug)]
pub struct Scheduler {
    options: SchedulerOptions,
    tenants: TenantTree,
    partitions: HashMap<String, PartitionInfo>,
    default_partition: String,
    cluster: Cluster,
    ledger: UsageLedger,
    pending: Vec<PendingJob>,
    running: BTreeMap<JobId, RunningJob>,
    running_per_account: HashMap<AccountId, u32>,
    running_per_project: HashMap<(AccountId, ProjectId), u32>,
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
                    },
                )
            })
            .collect();
        let params = FairShareParams {
            half_life_s: config.fair_share.half_life.as_secs() as f64,
            factor_gpu_hours: config.fair_share.usage_factor_gpu_hours as f64,
        };
        Scheduler {
            options,
            tenants: config.tenants(),
            partitions,
            default_partition: config
                .default_partition()
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            cluster: Cluster::new(config.nodes()),
            ledger: UsageLedger::new(params),
            pending: Vec::new(),
            running: BTreeMap::new(),
            running_per_account: HashMap::new(),
            running_per_project: HashMap::new(),
        }
    }

    pub fn options(&self) -> SchedulerOptions {
        self.options
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

    /// Admits a job to the queue, or refuses it if it could never run as asked.
    pub fn submit(&mut self, spec: JobSpec) -> Result<(), Refusal> {
        let tier = self.admit(&spec)?;
        self.pending.push(PendingJob {
            spec,
            tier,
            priority: 0.0,
            reason: PendingReason::None,
        });
        Ok(())
    }

    fn admit(&self, spec: &JobSpec) -> Result<u32, Refusal> {
        if self.running.contains_key(&spec.id) || self.pending.iter().any(|p| p.spec.id == spec.id)
        {
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
        if let Some(limit) = quota.max_gpus_per_job {
            if spec.gpus > limit {
                return Err(Refusal::TooManyGpus {
                    asked: spec.gpus,
                    limit,
                });
            }
        }
        let capacity = self.cluster.capacity_for(&spec.account);
        if spec.gpus > capacity {
            return Err(Refusal::LargerThanCluster {
                asked: spec.gpus,
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
        Ok(partition.tier)
    }

    /// Removes a pending job (cancelled before it started).
    pub fn cancel_pending(&mut self, id: &JobId) -> Option<JobSpec> {
        let pos = self.pending.iter().position(|p| &p.spec.id == id)?;
        Some(self.pending.remove(pos).spec)
    }

    /// Charges running jobs' GPU-seconds up to `now` to their accounts' decayed usage. The
    /// simulator calls this; a live service replaces usage with the aggregator's feed instead.
    pub fn accrue_usage(&mut self, now: UnixSeconds) {
        for job in self.running.values_mut() {
            let secs = now - job.accrued_until;
            if secs > 0 {
                let gpu_seconds = f64::from(job.placement.gpu_count()) * secs as f64;
                self.ledger.record(&job.spec.account, gpu_seconds, now);
                job.accrued_until = now;
            }
        }
    }

    /// A running job ended (finished, failed, killed at its limit, cancelled).
    pub fn finish(&mut self, id: &JobId, now: UnixSeconds) -> Option<RunningJob> {
        let job = self.running.remove(id)?;
        let secs = now - job.accrued_until;
        if secs > 0 {
            let gpu_seconds = f64::from(job.placement.gpu_count()) * secs as f64;
            self.ledger.record(&job.spec.account, gpu_seconds, now);
        }
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

    /// One scheduling cycle at `now`: starts what can start, in priority order, and sets the
    /// reason of every job left pending.
    pub fn schedule(&mut self, now: UnixSeconds) -> Vec<Started> {
        self.order_pending(now);
        let mut started = Vec::new();
        let mut keep = Vec::with_capacity(self.pending.len());
        let mut reservation: Option<Reservation> = None;
        let mut blocked = false;
        let mut free_now = self.cluster.free_gpus();
        let mut failed_at: HashMap<AccountId, u32> = HashMap::new();
        let pending = std::mem::take(&mut self.pending);
        for mut job in pending {
            if blocked {
                job.reason = PendingReason::Priority;
                keep.push(job);
                continue;
            }
            if self.at_job_limit(&job.spec) {
                job.reason = PendingReason::AssocMaxJobsLimit;
                keep.push(job);
                continue;
            }
            // Placement only gets harder within a cycle (jobs start, none end), and a larger
            // job never fits where a smaller one of the same account did not.
            let hopeless = job.spec.gpus > free_now
                || failed_at
                    .get(&job.spec.account)
                    .is_some_and(|g| job.spec.gpus >= *g);
            let found = if hopeless {
                None
            } else {
                self.cluster.find(job.spec.gpus, &job.spec.account)
            };
            let Some(placement) = found else {
                let floor = failed_at
                    .entry(job.spec.account.clone())
                    .or_insert(u32::MAX);
                *floor = (*floor).min(job.spec.gpus);
                if reservation.is_none() {
                    job.reason = PendingReason::Resources;
                    if self.options.backfill {
                        reservation = self.reserve_for(&job.spec);
                    }
                    blocked = reservation.is_none();
                } else {
                    job.reason = PendingReason::Priority;
                }
                keep.push(job);
                continue;
            };
            let backfilled = reservation.is_some();
            if let Some(res) = reservation.as_mut() {
                if !res.admits(&placement, now, job.spec.time_limit_s) {
                    job.reason = PendingReason::Priority;
                    keep.push(job);
                    continue;
                }
            }
            free_now -= placement.gpu_count();
            started.push(self.start(job, placement, now, backfilled));
        }
        self.pending = keep;
        started
    }

    fn start(
        &mut self,
        job: PendingJob,
        placement: Placement,
        now: UnixSeconds,
        backfilled: bool,
    ) -> Started {
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
            backfilled,
        };
        self.running.insert(
            job.spec.id.clone(),
            RunningJob {
                spec: job.spec,
                tier: job.tier,
                start_s: now,
                placement,
                accrued_until: now,
            },
        );
        started
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
        let account_running = self
            .running_per_account
            .get(&spec.account)
            .copied()
            .unwrap_or(0);
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
            .unwrap_or(account_running);
        account_running >= account_limit || project_running >= limit
    }

    /// The earliest time the head job could start if running jobs end at their limits, and the
    /// cluster as it would be then.
    fn reserve_for(&self, head: &JobSpec) -> Option<Reservation> {
        let mut by_end: Vec<&RunningJob> = self.running.values().collect();
        by_end.sort_by_key(|j| (j.limit_end_s(), j.spec.id.clone()));
        let mut future = self.cluster.clone();
        for job in by_end {
            future.release(&job.placement);
            if future.find(head.gpus, &head.account).is_some() {
                return Some(Reservation {
                    start_s: job.limit_end_s(),
                    cluster_at_start: future,
                    head_gpus: head.gpus,
                    head_account: head.account.clone(),
                });
            }
        }
        None
    }

    fn order_pending(&mut self, now: UnixSeconds) {
        let policy = self.options.policy;
        let priorities: HashMap<AccountId, f64> = match policy {
            Policy::Fifo => HashMap::new(),
            Policy::FairShare => self
                .tenants
                .accounts()
                .map(|a| {
                    (
                        a.id.clone(),
                        self.ledger.priority(&a.id, f64::from(a.weight), now),
                    )
                })
                .collect(),
        };
        // Each job's fair-share priority is looked up once per cycle, not at every comparison;
        // the queue is mostly in order already, which the stable sort exploits.
        for job in &mut self.pending {
            job.priority = priorities.get(&job.spec.account).copied().unwrap_or(0.0);
        }
        self.pending.sort_by(|a, b| {
            b.tier
                .cmp(&a.tier)
                .then_with(|| b.priority.total_cmp(&a.priority))
                .then_with(|| a.spec.submit_s.cmp(&b.spec.submit_s))
                .then_with(|| a.spec.id.cmp(&b.spec.id))
        });
    }

    /// Checks the scheduler's invariants; tests call it after every step.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut rebuilt = Cluster::new(
            (0..self.cluster.node_count())
                .map(|i| self.cluster.node_spec(i).clone())
                .collect(),
        );
        for job in self.running.values() {
            if !rebuilt.is_free(&job.placement) {
                return Err(format!(
                    "job {} holds a GPU that another job holds",
                    job.spec.id
                ));
            }
            if job.placement.gpu_count() != job.spec.gpus {
                return Err(format!(
                    "job {} holds {} GPUs, asked {}",
                    job.spec.id,
                    job.placement.gpu_count(),
                    job.spec.gpus
                ));
            }
            rebuilt.take(&job.placement);
        }
        if rebuilt.free_gpus() != self.cluster.free_gpus() {
            return Err(format!(
                "free GPUs {} do not match running jobs (expected {})",
                self.cluster.free_gpus(),
                rebuilt.free_gpus()
            ));
        }
        for (account, n) in &self.running_per_account {
            let limit = self
                .tenants
                .account(account)
                .and_then(|a| a.quota.max_running_jobs);
            if limit.is_some_and(|l| *n > l) {
                return Err(format!("account {account} runs {n} jobs, over its quota"));
            }
        }
        Ok(())
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
    }
}

/// The head job's reserved start (EASY backfill) and the cluster as it will be then.
#[derive(Debug)]
struct Reservation {
    start_s: UnixSeconds,
    cluster_at_start: Cluster,
    head_gpus: u32,
    head_account: AccountId,
}

impl Reservation {
    /// A later job may start now if it ends before the reserved start, or if the head job still
    /// fits at its reserved start with this job's GPUs held.
    fn admits(&mut self, placement: &Placement, now: UnixSeconds, time_limit_s: u64) -> bool {
        if now + time_limit_s as i64 <= self.start_s {
            return true;
        }
        if !self.cluster_at_start.is_free(placement) {
            return false;
        }
        self.cluster_at_start.take(placement);
        if self
            .cluster_at_start
            .find(self.head_gpus, &self.head_account)
            .is_none()
        {
            self.cluster_at_start.release(placement);
            return false;
        }
        true
    }
}
