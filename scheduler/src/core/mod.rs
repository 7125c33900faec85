//! The scheduling cycle: admission with quota checks, ordering of the queue (FIFO, or Slurm's
//! multifactor priority with fair share, within priority tiers), node-granular placement,
//! advance reservations, EASY and conservative backfill, preemption with a checkpoint grace,
//! and elastic jobs. Pure and synchronous: time is an argument, so the simulator and a live
//! service run the same code.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use gpuledger_model::config::{
    ClusterConfig, FairShareFormula, SchedulerConfig, DEFAULT_MAX_GRACE_S,
};
use gpuledger_model::quota::Quota;
use gpuledger_model::tenant::TenantTree;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, Allocation, JobId, ProjectId, SHARE_UNITS_PER_GPU};

use crate::cluster::{Cluster, NodeFilter, Placement, Shape};
use crate::fairshare::{account_factors, FairShareParams, UsageLedger};
use crate::plan::{Plan, Search, Window};
use crate::releases::ReleaseBook;
use crate::reservation::{AdvanceReservation, ReservationError, ReservationRequest, Reservations};
use crate::windows::{day_of, gpu_hours_verdict, DaySpread, UsageWindows, WindowKey, DAY_S};

mod admission;
mod kept;
mod ordering;
mod preemption;
mod queue;
mod quota_scopes;
mod types;

use admission::has_gpu_hour_quota;
use kept::{Freed, Keeping, KeptPlans, KeptStart};
pub use ordering::PriorityParts;
use preemption::{RunningTiers, Victims};
use queue::{Hot, JobRef, Queue};
use quota_scopes::{QuotaScopes, ScopeLimits, NO_PROJECT, UNKNOWN_PROJECT};
pub use types::*;

/// `JobLimits::shape` of a job that asks for no particular shape.
const DEFAULT_SHAPE: u32 = 0;

#[derive(Clone, Debug)]
struct PartitionInfo {
    /// Its place in the config's list (a waiting job keeps it, see `JobLimits`).
    index: u32,
    tier: u32,
    max_time_s: Option<u64>,
    grace_s: Option<u64>,
    max_grace_s: u64,
    /// The accounts that may submit here; every account when `None`.
    allowed_accounts: Option<Vec<AccountId>>,
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
    /// Each shape a job asked for other than the default, numbered from 1 as first seen: a
    /// waiting job keeps its shape's number beside its order, so a cycle can tell that a job
    /// cannot fit where one of the same shape, no smaller and no longer, just failed.
    shape_ids: HashMap<Shape, u32>,
    /// The most GPUs each account's jobs could ever get.
    capacity: HashMap<AccountId, u32>,
    formula: FairShareFormula,
    partitions: HashMap<String, PartitionInfo>,
    default_partition: String,
    cluster: Cluster,
    ledger: UsageLedger,
    windows: UsageWindows,
    /// Bytes kept per account (project `None`) and project, from storage scans.
    storage_used: HashMap<WindowKey, u64>,
    reservations: Reservations,
    pending: Queue,
    pending_ids: HashSet<JobId>,
    running: BTreeMap<JobId, RunningJob>,
    /// The running jobs' tiers, for whether preemption could help (kept with `running`).
    tiers: RunningTiers,
    /// When each running job gives its GPUs back (kept with `running`).
    releases: ReleaseBook,
    running_per_account: HashMap<AccountId, u32>,
    running_per_project: HashMap<(AccountId, ProjectId), u32>,
    /// What running jobs hold per account (project `None`) and project, for `max_gpus`, in
    /// share units (a part of a GPU counts as its part).
    gpus_held: HashMap<WindowKey, u64>,
    /// Preemptors waiting for their victims to exit.
    claims: HashMap<JobId, Claim>,
    /// Nodes out of service (an operator's drain, processes that would not die): no job
    /// starts, is planned or grows on them; jobs already there run on.
    drained: BTreeSet<usize>,
    last_cycle_s: UnixSeconds,
    /// The last cycle's planned starts, for the next to keep (see `kept`).
    kept: Option<KeptPlans>,
    /// Buffers for the next cycle's plans (see `KeptPlans::cleared`).
    kept_spare: KeptPlans,
    /// The GPUs the last cycle's plans hold for later starts, by node (see
    /// [`Scheduler::planned_idle_gpus`]).
    planned: Vec<(usize, u64)>,
    /// Something changed that no kept plan survives (a node drained or back, a reservation).
    plans_spoiled: bool,
    /// Running jobs ended before the last cycle's plans counted on them: from the first such
    /// end to the latest time they were counted on (see `Freed`).
    ended_early: Option<Freed>,
    /// The release book's bookings when the last cycle began (see `Keeping::kept_placement`).
    bookings_at_last_cycle: u64,
    /// Whether plans are kept between cycles at all (a test compares with and without).
    keep_plans: bool,
    /// Whether the walk marks waiting jobs in stretches (`Queue::wait_quietly`) and skips the
    /// plan searches known to fail (a test compares with and without).
    quiet_stretches: bool,
}

/// A preemptor waiting for its victims: it counts as running against its quota meanwhile, so
/// that its own account's jobs do not take the slot its victims paid for.
#[derive(Clone, Debug)]
struct Claim {
    account: AccountId,
    project: Option<ProjectId>,
    victims: Vec<JobId>,
}

/// Whether a job of `hot`'s shape, no smaller and no longer than one of `failures` (its
/// account's, this cycle), would fail too: placement only gets harder within a cycle.
fn failed_before(failures: &[(u32, u32, u64)], hot: &Hot) -> bool {
    failures
        .iter()
        .any(|(shape, g, l)| *shape == hot.shape && hot.min >= *g && hot.time_limit_s >= *l)
}

/// Records that a job like `hot` failed (to start now, or to get a planned start) in its
/// account's `failures`, kept minimal: a failure of its shape no smaller and no longer than
/// this one says nothing more.
fn note_failure(failures: &mut Vec<(u32, u32, u64)>, hot: &Hot) {
    let (min, limit) = (hot.min, hot.time_limit_s);
    failures.retain(|(shape, g, l)| *shape != hot.shape || *g < min || *l < limit);
    failures.push((hot.shape, min, limit));
}

/// Counts `units` planned or started for `account` against its room below its fair share.
fn take_room(room: &mut [i64], account: usize, units: u64) {
    if let Some(r) = room.get_mut(account) {
        *r -= units as i64;
    }
}

/// Keeps an account's room below its share, when smaller than `units`, for a job of that
/// size: none of it is left to the account's later jobs this cycle.
fn keep_room_for(room: &mut [i64], account: usize, units: u64) {
    if let Some(r) = room.get_mut(account) {
        if *r < units as i64 {
            *r = (*r).min(0);
        }
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
            .zip(0u32..)
            .map(|(p, index)| {
                (
                    p.name.clone(),
                    PartitionInfo {
                        index,
                        tier: p.priority_tier,
                        max_time_s: p.max_time.map(|d| d.as_secs()),
                        grace_s: p.grace_time.map(|d| d.as_secs()),
                        max_grace_s: p.max_grace_s(),
                        allowed_accounts: p.allowed_accounts.clone(),
                    },
                )
            })
            .collect();
        let params = FairShareParams {
            half_life_s: config.fair_share.half_life.as_secs() as f64,
            factor_gpu_hours: config.fair_share.usage_factor_gpu_hours as f64,
        };
        let tenants = config.tenants();
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
            pending: Queue::default(),
            pending_ids: HashSet::new(),
            shape_ids: HashMap::new(),
            running: BTreeMap::new(),
            tiers: RunningTiers::default(),
            releases: ReleaseBook::default(),
            running_per_account: HashMap::new(),
            running_per_project: HashMap::new(),
            gpus_held: HashMap::new(),
            claims: HashMap::new(),
            drained: BTreeSet::new(),
            last_cycle_s: 0,
            kept: None,
            kept_spare: KeptPlans::default(),
            planned: Vec::new(),
            plans_spoiled: false,
            ended_early: None,
            bookings_at_last_cycle: 0,
            keep_plans: true,
            quiet_stretches: true,
        }
    }

    /// Takes the node named `node` out of service (`drained`) or puts it back; false when
    /// there is no such node.
    pub fn set_drained(&mut self, node: &str, drained: bool) -> bool {
        let Some(index) = self.cluster.node_index(node) else {
            return false;
        };
        if drained {
            self.drained.insert(index);
        } else {
            self.drained.remove(&index);
        }
        self.plans_spoiled = true;
        true
    }

    /// Whether planned starts are kept from one cycle to the next (on by default; the
    /// outcome is the same either way, only the work differs: see `kept`).
    pub fn set_keep_plans(&mut self, keep: bool) {
        self.keep_plans = keep;
        self.kept = None;
    }

    /// Whether the walk takes its shortcuts: it marks the jobs it does nothing else with in
    /// stretches, and does not search again for a planned start it knows cannot be found (on
    /// by default; the outcome is the same either way, only the work differs).
    pub fn set_quiet_stretches(&mut self, on: bool) {
        self.quiet_stretches = on;
    }

    /// Whether the node at `index` is out of service.
    pub fn is_drained(&self, index: usize) -> bool {
        self.drained.contains(&index)
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

    /// Free GPUs the last cycle's backfill plans hold for waiting jobs' later starts, by node
    /// (ascending, nodes with none left out): free now, yet only a job that ends before the
    /// planned start may use them. What Slurm's `sinfo` shows as `planned`.
    pub fn planned_idle_gpus(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.planned
            .iter()
            .map(|(node, mask)| (*node, (mask & self.cluster.free_mask(*node)).count_ones()))
            .filter(|(_, n)| *n > 0)
    }

    /// The waiting jobs in the order of the last cycle.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = &PendingJob> {
        self.pending.iter()
    }

    /// Hands `each` the waiting jobs whose reason, planned start or wait for GPUs changed, or
    /// that began to wait, since the last call (in queue order), so that a copy of the queue
    /// kept elsewhere follows it by what changed: a cycle over a deep queue changes a few.
    pub fn take_pending_changes(&mut self, each: impl FnMut(&PendingJob)) {
        self.pending.take_changed(each);
    }

    /// Jobs of `account`, or of its `project`, waiting or running (being preempted too): what
    /// a `max_submit_jobs` limit counts. Kept as jobs come and go, not counted per ask.
    pub fn active_jobs(&self, account: &AccountId, project: Option<&ProjectId>) -> usize {
        let Some(&index) = self.account_index.get(account) else {
            return 0;
        };
        match project {
            None => {
                let running = self.running_per_account.get(account).copied().unwrap_or(0);
                (self.pending.waiting_jobs(index, None) + running) as usize
            }
            Some(p) => {
                let position = self
                    .tenants
                    .account(account)
                    .and_then(|a| a.projects.iter().position(|q| &q.id == p));
                let Some(position) = position else {
                    return 0;
                };
                let running = self
                    .running_per_project
                    .get(&(account.clone(), p.clone()))
                    .copied()
                    .unwrap_or(0);
                (self.pending.waiting_jobs(index, Some(position as u32)) + running) as usize
            }
        }
    }

    /// How many times the cycles so far read or wrote a waiting job's own record, beyond
    /// what the queue keeps of every job at hand: a cycle's cost on a deep queue, where each
    /// record read is a cache miss, counted rather than timed. A cycle should open the
    /// records of the jobs it starts, tries or plans, not one per waiting job.
    pub fn records_opened(&self) -> u64 {
        self.pending.opened()
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

    /// Replaces an account's decayed usage with the usage feed's figure (a live service).
    /// The ledger itself is not handed out: running jobs hold slots in it.
    pub fn set_usage(&mut self, account: &AccountId, gpu_hours: f64, now: UnixSeconds) {
        self.ledger.set(account, gpu_hours, now);
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
        let submitted = spec.submit_s;
        self.submit_with_history(spec, 0, Some(submitted))
    }

    /// Admits a job that was already preempted `preemptions` times and has waited for GPUs
    /// since `gpu_wait_from` (`None`: its quota held it; see [`PendingJob::gpu_wait_from`]):
    /// a restart reading its queue back.
    pub fn submit_with_history(
        &mut self,
        spec: JobSpec,
        preemptions: u32,
        gpu_wait_from: Option<UnixSeconds>,
    ) -> Result<(), Refusal> {
        let tier = self.admit(&spec)?;
        let limits = self.waiting_limits(&spec);
        self.pending_ids.insert(spec.id.clone());
        let job = PendingJob {
            spec,
            tier,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions,
            has_preempted: false,
            gpu_wait_from,
            limits,
        };
        self.pending.push(job);
        Ok(())
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
        let limits = self.waiting_limits(&spec);
        let pending = PendingJob {
            spec,
            tier,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions,
            has_preempted: false,
            gpu_wait_from: None,
            limits,
        };
        self.start(&pending, placement, start_s, false);
        if let Some(job) = self.running.get_mut(&pending.spec.id) {
            job.last_checkpoint_s = last_checkpoint_s;
            job.preempting = preempting;
            self.releases
                .set(&job.spec.id, job.release_key(), &job.placement);
        }
        Ok(())
    }

    /// Removes a pending job (cancelled before it started).
    pub fn cancel_pending(&mut self, id: &JobId) -> Option<JobSpec> {
        let job = self.pending.remove(id)?;
        self.claims.remove(id);
        self.pending_ids.remove(id);
        Some(job.spec)
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
        self.plans_spoiled = true;
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
        self.plans_spoiled = true;
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
        self.tiers.remove(&job);
        self.releases.remove(id);
        // Its GPUs come free before the last plans counted on them: the runs that overlap
        // `[now, then)` are searched again.
        let counted_on = job.release_s(self.last_cycle_s);
        if counted_on > now {
            let freed = self.ended_early.get_or_insert(Freed {
                from: now,
                until: counted_on,
            });
            freed.from = freed.from.min(now);
            freed.until = freed.until.max(counted_on);
        }
        accrue(&mut self.ledger, &mut self.windows, &mut job, now);
        self.cluster.release(&job.placement);
        self.count_held(&job.spec, -(job.placement.share_units() as i64));
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
        let limits = self.waiting_limits(&job.spec);
        self.pending_ids.insert(job.spec.id.clone());
        let job = PendingJob {
            spec: job.spec,
            tier: job.tier,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions: job.preemptions + 1,
            has_preempted: false,
            gpu_wait_from: Some(now),
            limits,
        };
        self.pending.push(job);
        true
    }

    /// One scheduling cycle at `now`: starts what can start in priority order, preempts for
    /// higher tiers, plans starts for backfill, grows elastic jobs into GPUs nobody waits for,
    /// and sets the reason of every job left pending.
    pub fn schedule(&mut self, now: UnixSeconds) -> Cycle {
        let spoiled = std::mem::take(&mut self.plans_spoiled);
        let last_plans = self.kept.take().filter(|_| self.keep_plans && !spoiled);
        let spare = std::mem::take(&mut self.kept_spare);
        let ended_early = self.ended_early.take();
        let mut keeping = Keeping::new(last_plans, spare, now, ended_early);
        // The last cycle's plans ask about the jobs started since they were made, no further.
        self.releases
            .forget_bookings_before(self.bookings_at_last_cycle);
        self.bookings_at_last_cycle = self.releases.bookings();
        self.last_cycle_s = now;
        self.pending.begin_cycle(now);
        let depth = match self.options.backfill {
            Backfill::Off => 0,
            Backfill::Easy => 1,
            Backfill::Conservative => self.knobs.backfill_depth.max(1) as usize,
        };
        // Each account's distance below its fair share (held), worked out once: the order,
        // the plans up to the share and fair-share preemption all read it.
        let fair = self.options.policy == Policy::FairShare;
        let reclaim = fair && self.knobs.fair_share_preemption;
        let plan_to_share = fair && depth > 0 && self.knobs.plan_to_share;
        let split = (reclaim || plan_to_share || (fair && self.ranks_below_share_first()))
            .then(|| self.fair_shares());
        self.order_pending(now, split.as_deref());
        let gaps: Option<Vec<i64>> = split
            .as_ref()
            .map(|s| s.iter().map(|(share, held)| share - held).collect());
        let shares: Vec<i64> = split
            .filter(|_| reclaim)
            .map(|s| s.into_iter().map(|(share, _)| share).collect())
            .unwrap_or_default();
        let mut cycle = Cycle::default();
        let mut blocked = false;
        // Within a cycle placement only gets harder (jobs start, plans are added), so a job of
        // an account is hopeless where one of its shape no larger and no longer already failed
        // (a part of a GPU may fit where a whole GPU did not, and a job held to a GPU type or
        // layout says nothing of one that is not).
        let mut failures: Vec<Vec<(u32, u32, u64)>> =
            vec![Vec::new(); self.account_ids.len().max(1)];
        let mut account_planned = vec![false; self.account_ids.len().max(1)];
        let mut partitions_planned = vec![false; self.partitions.len()];
        let mut plan_floors: Vec<Vec<(u32, u64, UnixSeconds)>> =
            vec![Vec::new(); self.account_ids.len().max(1)];
        // Plans too only get harder, until a planned hold is dropped or victims release early
        // (when the floors are forgotten, and these with them): a job of an account finds no
        // planned start where one of its shape no larger and no longer found none. On a
        // wholly drained cluster (maintenance) no plan is ever found, the depth is never
        // reached, and without this every waiting job was searched at every cycle.
        let mut plan_failures: Vec<Vec<(u32, u32, u64)>> =
            vec![Vec::new(); self.account_ids.len().max(1)];
        // Whether any is recorded: below the depth, stretches are looked for only then.
        let mut plan_failed = false;
        // What is left of each account's distance below its share once plans count too.
        let mut share_gap = gaps
            .filter(|_| reclaim || plan_to_share)
            .unwrap_or_default();
        let mut share_room = if plan_to_share {
            share_gap.clone()
        } else {
            Vec::new()
        };
        let reclaim_after = self.knobs.fair_share_preemption_after.as_secs() as i64;
        // The relief's planned starts: a job it lifts gets one in its place in the queue while
        // those given this cycle hold less than `relief_plan_units` (at least one job). Only
        // the account's first waiting job would get one otherwise: the others rank above the
        // accounts over the floor but small jobs backfill every GPU a wide one waits for.
        let relief_after = (fair && depth > 0).then(|| self.relief_after_s()).flatten();
        let mut relief_room = self.relief_plan_units();
        let mut pending = std::mem::take(&mut self.pending);
        let mut plan: Option<Plan> = None;
        let mut planned = 0usize;
        // Quota checks by account and project, worked out again after each start.
        let mut quota_scopes = QuotaScopes::default();
        // A preemptor goes first: its victims' GPUs are freed for it, and a job ahead of it
        // in the queue planning onto them would make it preempt again, in a loop.
        if !self.claims.is_empty() {
            pending.move_claimed_to_front();
        }
        // The positions of the jobs the starvation bound planned, ascending.
        let starving = if depth > 0 {
            self.plan_starving(
                &mut pending,
                now,
                &mut plan,
                &mut keeping,
                &mut quota_scopes,
            )
        } else {
            Vec::new()
        };
        planned += starving.len();
        // Jobs are updated in place and the started ones dropped at the end: the queue can
        // hold many thousands of jobs and a cycle runs at every event.
        let mut started = Vec::new();
        let mut waiting_from = None;
        // Jobs marked waiting in one stretch (see `Queue::wait_quietly`), up to here.
        let mut quiet_until = 0;
        'jobs: for i in 0..pending.len() {
            if blocked {
                // Strict order: everything behind the first job that cannot start waits.
                pending.wait_behind(i);
                waiting_from = Some(i);
                break;
            }
            if i < quiet_until {
                continue;
            }
            // Once the plans the depth allows are made, most jobs of a deep queue are only
            // marked waiting: what the walk below would do with such a job (it is of a shape
            // that failed already, no quota or claim asks for a look, nothing asks for a plan
            // for it or its plan is known to fail, and no reservation for another reason) is
            // done for a stretch of them at once. No stretch crosses a job the starvation
            // bound planned. (An account's first plan is not asked for: a failure of the
            // account this cycle came after it.)
            if self.quiet_stretches
                && depth > 0
                && (planned >= depth || plan_failed)
                && self.reservations.is_empty()
            {
                let until = starving.iter().copied().find(|p| *p >= i);
                let reason = if planned == 0 {
                    PendingReason::Resources
                } else {
                    PendingReason::Priority
                };
                quiet_until = pending.wait_quietly(i, until.unwrap_or(usize::MAX), reason, |hot| {
                    let (account, partition) = (hot.account, hot.partition as usize);
                    !hot.limited()
                        && !hot.claimed()
                        && failed_before(&failures[account], hot)
                        && (planned >= depth || failed_before(&plan_failures[account], hot))
                        && (fair || partitions_planned.get(partition).is_none_or(|p| *p))
                        && share_room.get(account).is_none_or(|r| *r <= 0)
                        && !(relief_room > 0 && hot.relieved(now, relief_after))
                });
                if i < quiet_until {
                    continue;
                }
            }
            // What every job needs is read from the queue's own copy: most jobs of a deep
            // queue are hopeless and their boxes are not touched.
            let Some((&hot, job)) = pending.at(i) else {
                break;
            };
            let pre_planned = starving.binary_search(&i).is_ok();
            let claimed = hot.claimed();
            let quota = if hot.limited() {
                self.quota_hold_in(&hot, job, &mut quota_scopes, now)
            } else {
                None
            };
            let draining = quota.is_none() && claimed && self.claim_draining(&job.spec.id);
            if quota.is_none() && claimed && !draining {
                // Its victims are gone: it goes first this cycle (sorted above), and if it
                // still cannot start the claim lapses rather than hold a quota slot for ever.
                self.claims.remove(&job.spec.id);
                pending.set_claimed(i, false);
                quota_scopes.forget_account(hot.account);
            }
            if !pre_planned {
                pending.set_estimated_start(i, None);
            }
            if let Some(reason) = quota {
                pending.set_reason(i, reason);
                continue;
            }
            let (min, limit, units, account) = (hot.min, hot.time_limit_s, hot.units, hot.account);
            let hopeless = failed_before(&failures[account], &hot);
            // Whether it holds a claim once it tried to preempt (the queue keeps it).
            let mut claims_now = None;
            // A job past max_wait is tried whatever failed before it: its GPUs are held for it.
            if (!hopeless || pre_planned) && !draining {
                let Some(job) = pending.job_mut(i) else {
                    break;
                };
                if let Some(p) = self.place_now(&job.spec, now, plan.as_ref(), pre_planned) {
                    let backfilled = plan.as_ref().is_some_and(Plan::has_holds);
                    take_room(&mut share_room, account, p.share_units());
                    take_room(&mut share_gap, account, p.share_units());
                    let start = self.start(job, p, now, backfilled);
                    self.note_start(start, now, &mut plan, &mut cycle, &mut keeping);
                    quota_scopes.forget_account(account);
                    started.push(i);
                    if pre_planned {
                        // Its planned hold is gone: later starts may come earlier again.
                        plan_floors.iter_mut().for_each(Vec::clear);
                        plan_failures.iter_mut().for_each(Vec::clear);
                        plan_failed = false;
                    }
                    continue;
                }
                // Preemption: for a higher tier, then for the account's fair share. Within its
                // share once started (Kueue's LessThanOrEqualToFinalShare) it does not take its
                // account over, so its victims' accounts never preempt back.
                let for_share = reclaim
                    && now - hot.submit_s >= reclaim_after
                    && share_gap.get(account).is_some_and(|g| *g >= units as i64);
                for over_share in [false, true] {
                    let allowed = if over_share {
                        for_share
                    } else {
                        self.knobs.preemption && self.tiers.may_help(hot.tier)
                    };
                    if !allowed || job.has_preempted {
                        continue;
                    }
                    // Victims release early: later starts may come earlier again.
                    plan_floors.iter_mut().for_each(Vec::clear);
                    plan_failures.iter_mut().for_each(Vec::clear);
                    plan_failed = false;
                    let victims = if over_share {
                        Victims::OverShare(&mut share_gap)
                    } else {
                        Victims::LowerTiers
                    };
                    let before = (self.cluster.stamp(), cycle.preempted.len());
                    let preempted = self.preempt_for(job, now, victims, &mut cycle, &mut plan);
                    // Its victims' accounts (and, if it starts, its own) hold less now.
                    quota_scopes.forget();
                    if before != (self.cluster.stamp(), cycle.preempted.len()) {
                        // GPUs freed or to be freed earlier than planned.
                        keeping.spoil();
                    }
                    if let Some(p) = preempted {
                        take_room(&mut share_room, account, p.share_units());
                        take_room(&mut share_gap, account, p.share_units());
                        let start = self.start(job, p, now, false);
                        self.note_start(start, now, &mut plan, &mut cycle, &mut keeping);
                        started.push(i);
                        continue 'jobs;
                    }
                    job.has_preempted = self.claims.contains_key(&job.spec.id);
                    claims_now = Some(job.has_preempted);
                    if job.has_preempted && over_share {
                        // Its claim now counts for its account.
                        take_room(&mut share_room, account, units);
                        take_room(&mut share_gap, account, units);
                    }
                }
                // Its account's room below its share, too small for it yet, is kept for it:
                // the account's later jobs do not preempt into it, or a job wider than the
                // room waits until all the account's later work is done. Not for a job wider
                // than the whole share, which no room would ever fit.
                if reclaim
                    && !job.has_preempted
                    && now - hot.submit_s >= reclaim_after
                    && shares.get(account).is_some_and(|s| *s >= units as i64)
                {
                    keep_room_for(&mut share_gap, account, units);
                }
            }
            if let Some(claimed) = claims_now {
                pending.set_claimed(i, claimed);
                pending.set_has_preempted(i, claimed);
            }
            if !hopeless {
                note_failure(&mut failures[account], &hot);
            }
            let Some((_, job)) = pending.at(i) else {
                break;
            };
            let reason = self.blocked_reason(job, planned == 0);
            let claimed = pending.at(i).is_some_and(|(h, _)| h.claimed());
            // Under fair share each account's first waiting job gets a planned start too,
            // whatever its place in the queue (the starvation bound's other half; see
            // `plan_starving`). Under FIFO each partition's does: EASY's reservation for the
            // queue's head, per partition, as a blocked job of another partition is not held
            // up by this one.
            let partition = hot.partition as usize;
            let first_of_partition =
                !fair && depth > 0 && partitions_planned.get(partition).is_some_and(|p| !p);
            let first_of_account =
                fair && depth > 0 && self.knobs.plan_each_account && !account_planned[account];
            let first_of_its_kind = first_of_partition || first_of_account;
            let below_share = share_room.get(account).is_some_and(|r| *r > 0);
            let relief_plan = !(first_of_its_kind || below_share)
                && relief_room > 0
                && hot.relieved(now, relief_after);
            let must_plan = claimed || first_of_its_kind || below_share || relief_plan;
            if first_of_partition && (pre_planned || planned < depth || must_plan) {
                partitions_planned[partition] = true;
            }
            pending.set_reason(i, reason);
            if pre_planned {
                account_planned[account] = true;
                take_room(&mut share_room, account, units);
            } else if planned < depth || must_plan {
                take_room(&mut share_room, account, units);
                let plan = plan.get_or_insert_with(|| self.build_plan(now));
                // Plans only add holds within a cycle: a job of the account no smaller, no
                // shorter and of the default shape starts no earlier than one planned before.
                let floors = &mut plan_floors[account];
                let not_before = floors
                    .iter()
                    .filter(|(g, l, _)| hot.shape == DEFAULT_SHAPE && min >= *g && limit >= *l)
                    .map(|(_, _, t)| *t)
                    .max()
                    .unwrap_or(UnixSeconds::MIN);
                let Some((_, job)) = pending.at(i) else {
                    break;
                };
                let plan_fails =
                    self.quiet_stretches && failed_before(&plan_failures[account], &hot);
                let found = if plan_fails {
                    None
                } else {
                    self.plan_job(plan, &job.spec, now, not_before, &mut keeping)
                };
                if found.is_none() && !plan_fails {
                    note_failure(&mut plan_failures[account], &hot);
                    plan_failed = true;
                }
                if let Some((t, p)) = found {
                    let end = t.saturating_add(limit as i64);
                    plan.hold(job.spec.id.clone(), t, end, p, &self.cluster);
                    pending.set_estimated_start(i, Some(t));
                    planned += 1;
                    if relief_plan {
                        relief_room = relief_room.saturating_sub(units);
                    }
                    if hot.shape == DEFAULT_SHAPE {
                        floors.push((min, limit, t));
                    }
                }
                account_planned[account] = true;
            }
            if depth == 0 {
                blocked = true;
            }
        }
        self.planned = plan.as_ref().map(Plan::planned_gpus).unwrap_or_default();
        pending.end_cycle(&started, waiting_from);
        self.pending = pending;
        let (next, spare) = keeping.into_next();
        self.kept = next.filter(|_| self.keep_plans);
        self.kept_spare = spare;
        if !self.pending.hot().any(|p| p.reason().waits_for_gpus()) {
            self.grow_elastic(now, &mut cycle);
        }
        cycle
    }

    /// The next time after `now` at which a cycle would decide differently though no job
    /// arrived or ended: a planned start, a waiting job reaching `max_wait` (when the bound
    /// is on) or `fair_share_preemption_after` (when that is on), or the midnight that ends a
    /// day a job is held for its GPU-hours. The simulator runs a cycle then; a live service
    /// runs them on a timer. Without anything that could fall due the queue is not walked.
    pub fn next_due(&self, now: UnixSeconds) -> Option<UnixSeconds> {
        // Only backfill plans starts and acts on max_wait (a preemptor may plan under FIFO).
        let plans = self.options.backfill != Backfill::Off || !self.claims.is_empty();
        let max_wait = (self.options.backfill != Backfill::Off && self.knobs.max_wait_plans > 0)
            .then(|| self.knobs.max_wait.as_secs());
        let reclaim = (self.knobs.fair_share_preemption
            && self.options.policy == Policy::FairShare)
            .then(|| self.knobs.fair_share_preemption_after.as_secs());
        let day_quotas = self.windows.is_tracking();
        if !plans && reclaim.is_none() && !day_quotas {
            return None;
        }
        let midnight = (day_of(now) + 1).saturating_mul(DAY_S);
        self.pending
            .hot()
            .flat_map(|p| {
                let after = |wait: Option<u64>| wait.map(|w| p.submit_s.saturating_add(w as i64));
                let day_held = matches!(
                    p.reason(),
                    PendingReason::AssocGrpGpuHoursDay | PendingReason::AssocGrpGpuHoursWeek
                );
                [
                    p.estimated_start_s(),
                    after(max_wait),
                    after(reclaim).filter(|_| !p.has_preempted()),
                    day_held.then_some(midnight),
                ]
            })
            .flatten()
            .filter(|t| *t > now)
            .min()
    }

    /// A job started in this cycle: the plan learns of it, and the cycle reports it.
    fn note_start(
        &self,
        started: Started,
        now: UnixSeconds,
        plan: &mut Option<Plan>,
        cycle: &mut Cycle,
        keeping: &mut Keeping,
    ) {
        let running = &self.running[&started.job_id];
        keeping.started(
            &started.job_id,
            now,
            running.release_s(now),
            &running.placement,
        );
        if let Some(plan) = plan.as_mut() {
            let dropped = plan.forget(&started.job_id);
            if let Some(h) = dropped.filter(|h| h.start != now || h.placement != running.placement)
            {
                // Its planned GPUs come free before the plan's end: the plans searched with
                // them held may start earlier now.
                keeping.freed(h.start, h.end);
            }
            plan.started(
                started.job_id.clone(),
                running.limit_end_s().max(now),
                running.placement.clone(),
            );
        }
        cycle.started.push(started);
    }

    /// The starvation bound: the jobs that have waited `max_wait`, oldest first (at most
    /// `max_wait_plans` of them), get planned starts before anyone else is placed or planned,
    /// so that no job of higher priority may take the GPUs they will start on. They start when
    /// the queue reaches them and their GPUs are free (their own plan does not stand in their
    /// way). Returns the positions of the jobs planned, ascending.
    fn plan_starving(
        &self,
        pending: &mut Queue,
        now: UnixSeconds,
        plan: &mut Option<Plan>,
        keeping: &mut Keeping,
        quota_scopes: &mut QuotaScopes,
    ) -> Vec<usize> {
        let mut planned = Vec::new();
        let wanted = self.knobs.max_wait_plans as usize;
        if wanted == 0 {
            return planned;
        }
        let since = now.saturating_sub(self.knobs.max_wait.as_secs() as i64);
        let mut oldest: Vec<(UnixSeconds, usize)> = pending
            .hot()
            .enumerate()
            .filter(|(_, j)| j.submit_s <= since)
            .map(|(i, j)| (j.submit_s, i))
            .collect();
        if oldest.len() > wanted {
            oldest.select_nth_unstable(wanted - 1);
            oldest.truncate(wanted);
        }
        oldest.sort_unstable();
        for (_, i) in oldest {
            let Some((&hot, job)) = pending.at(i) else {
                continue;
            };
            if hot.limited() && self.quota_hold_in(&hot, job, quota_scopes, now).is_some() {
                continue;
            }
            let plan = plan.get_or_insert_with(|| self.build_plan(now));
            if let Some((t, p)) = self.plan_job(plan, &job.spec, now, UnixSeconds::MIN, keeping) {
                let end = t.saturating_add(job.spec.time_limit_s as i64);
                plan.hold(job.spec.id.clone(), t, end, p, &self.cluster);
                planned.push(i);
                pending.set_estimated_start(i, Some(t));
            }
        }
        planned.sort_unstable();
        planned
    }

    /// The reason of a job that could not start: the reservation when one is what keeps it
    /// off GPUs it could otherwise use; otherwise `Resources` for the first in line.
    fn blocked_reason(&self, job: JobRef<'_>, first: bool) -> PendingReason {
        if !self.reservations.is_empty() {
            let spec = &job.spec;
            let unreserved = sizes(spec, self.cluster.gpus_per_node_max())
                .into_iter()
                .any(|g| {
                    self.cluster
                        .find(g, &spec.account, &NodeFilter::none(), &spec.shape)
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
        let mut filter = if self.reservations.is_empty() {
            NodeFilter::none()
        } else {
            self.reservations
                .filter(&self.cluster, &spec.account, start, end)
        };
        self.block_drained(&mut filter);
        filter
    }

    fn block_drained(&self, filter: &mut NodeFilter) {
        for &node in &self.drained {
            filter.block(node, self.cluster.node_count());
        }
    }

    /// Where the job could start now without delaying any planned start: its largest size
    /// that fits. `own_plan`: whether it may hold a plan in `plan` (it was planned first,
    /// past `max_wait`), which its window leaves out.
    fn place_now(
        &self,
        spec: &JobSpec,
        now: UnixSeconds,
        plan: Option<&Plan>,
        own_plan: bool,
    ) -> Option<Placement> {
        // Plans only take GPUs away: too few free now is too few in any window (and the
        // window, a copy with the plans held, is the costly part on a long queue).
        if !self.cluster.may_fit(spec.min_size(), &spec.shape) {
            return None;
        }
        let limit = spec.time_limit_s;
        // Nor where the plans within its run leave too few free, counted without the window
        // (on a full cluster nearly every try ends here). A job's own plan is not held for
        // it. (A part of a GPU fits beside others where no whole GPU is free, but only where
        // a running job or a plan holds parts, and then the plan counts nothing.)
        let whole_free = plan
            .filter(|_| !own_plan)
            .and_then(|p| p.free_now_for(&self.cluster, limit));
        if whole_free.is_some_and(|free| free < spec.min_size()) {
            return None;
        }
        let filter = self.filter_for(spec, now, now.saturating_add(limit as i64));
        let mut candidates = sizes(spec, self.cluster.gpus_per_node_max());
        if let Some(room) = self.gpu_room(&spec.account, spec.project.as_ref()) {
            candidates.retain(|g| spec.share_units_of(*g) <= room);
        }
        let place = |window: &Cluster| {
            if !self.reservations.is_empty() {
                let end = now.saturating_add(limit as i64);
                if let Some(mut reserved) =
                    self.reservations
                        .usable_reserved(&self.cluster, &spec.account, now, end)
                {
                    self.block_drained(&mut reserved);
                    if let Some(p) = candidates
                        .iter()
                        .find_map(|g| window.find(*g, &spec.account, &reserved, &spec.shape))
                    {
                        return Some(p);
                    }
                }
            }
            candidates
                .iter()
                .find_map(|g| window.find(*g, &spec.account, &filter, &spec.shape))
        };
        match plan {
            Some(p) => p.with_window_now(&self.cluster, limit, own_plan.then_some(&spec.id), place),
            None => place(&self.cluster),
        }
    }

    fn build_plan(&self, now: UnixSeconds) -> Plan {
        Plan::from_book(now, &self.releases, self.reservations.boundaries())
    }

    /// A planned start for `spec`: the last cycle's where it still stands (see `kept`), else
    /// the earliest a search finds. The plan is recorded for the next cycle.
    fn plan_job(
        &self,
        plan: &Plan,
        spec: &JobSpec,
        now: UnixSeconds,
        not_before: UnixSeconds,
        keeping: &mut Keeping,
    ) -> Option<(UnixSeconds, Placement)> {
        let (min, limit) = (spec.min_size(), spec.time_limit_s);
        let find = |window: Window<'_>, t: UnixSeconds| {
            let filter = self.filter_for(spec, t, t.saturating_add(limit as i64));
            window.find(min, &spec.account, &filter, &spec.shape)
        };
        let search = |times| plan.earliest(&self.cluster, min, &spec.shape, limit, times, find);
        let kept = keeping.kept_start(&spec.id, min, limit, now, not_before);
        let planned = match kept {
            // Only the times what was freed since may have opened are tried before the kept
            // start (every other one fails as it did), in one search that goes on from it.
            Some(KeptStart {
                start,
                recheck: Some((from, until)),
                touched: true,
                ..
            }) => search(Search::from(from).skipping((until, start))),
            // The run from the kept start finds what it found: where the times freed may have
            // opened fail, the kept start stands, looked up at once (or taken as it was) where
            // it is still a time searches try (the job it waited for may have ended early).
            Some(kept) => {
                let earlier = kept
                    .recheck
                    .and_then(|(from, until)| search(Search::from(from).before(until)));
                let t = kept.start;
                let placed = || {
                    let unchanged = (!plan.has_shares())
                        .then(|| keeping.kept_placement(&kept, &self.releases))
                        .flatten()
                        .cloned();
                    unchanged
                        .or_else(|| plan.place_at(&self.cluster, min, &spec.shape, limit, t, find))
                };
                earlier.or_else(|| {
                    let at_t = plan.tries(&self.cluster, &spec.shape, t).then(placed);
                    match at_t.flatten() {
                        Some(p) => Some((t, p)),
                        None => search(Search::from(t)),
                    }
                })
            }
            None => search(Search::from(not_before)),
        }?;
        let (t, p) = &planned;
        keeping.made(
            &spec.id,
            (*t, t.saturating_add(limit as i64)),
            (min, limit),
            p,
            (self.releases.bookings(), kept.as_ref()),
        );
        Some(planned)
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
        self.count_held(&job.spec, placement.share_units() as i64);
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
        let running = RunningJob {
            spec: job.spec.clone(),
            tier: job.tier,
            start_s: now,
            placement,
            last_checkpoint_s: None,
            preempting: None,
            preemptions: job.preemptions,
            backfilled,
            accrued_until: now,
            usage_slot: self.ledger.slot(&job.spec.account),
        };
        self.releases
            .set(&job.spec.id, running.release_key(), &running.placement);
        self.tiers.add(&running);
        self.running.insert(job.spec.id.clone(), running);
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
            let mut more = r.spec.gpus - r.placement.gpu_count();
            if let Some(room) = self.gpu_room(&r.spec.account, r.spec.project.as_ref()) {
                more = more
                    .min(u32::try_from(room / u64::from(SHARE_UNITS_PER_GPU)).unwrap_or(u32::MAX));
                if more == 0 {
                    continue;
                }
            }
            let Some(extra) = self.cluster.find_growth(
                &r.placement,
                more,
                &r.spec.account,
                &filter,
                &r.spec.shape,
            ) else {
                continue;
            };
            self.cluster.take(&extra);
            let spec = r.spec.clone();
            self.count_held(&spec, extra.share_units() as i64);
            let Some(r) = self.running.get_mut(&id) else {
                continue;
            };
            accrue(&mut self.ledger, &mut self.windows, r, now);
            self.tiers.remove(r);
            r.placement.extend(&extra);
            self.tiers.add(r);
            self.releases.set(&id, r.release_key(), &r.placement);
            cycle.resized.push(Resized {
                job_id: id,
                allocation: self.cluster.to_allocation(&r.placement),
                gpus: r.placement.gpu_count(),
            });
        }
    }

    /// Checks the scheduler's invariants; tests call it after every step: no GPU held twice,
    /// every job within its size, quotas of running jobs and GPU-hours kept, reservations
    /// honoured.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pending.check(|id| self.claims.contains_key(id))?;
        let mut rebuilt = self.cluster.empty_like();
        if self.releases.len() != self.running.len() {
            return Err(format!(
                "{} releases booked for {} running jobs",
                self.releases.len(),
                self.running.len()
            ));
        }
        let mut tiers = RunningTiers::default();
        for job in self.running.values() {
            tiers.add(job);
        }
        if tiers != self.tiers {
            return Err(format!(
                "running tiers kept as {:?}, the running jobs have {tiers:?}",
                self.tiers
            ));
        }
        for job in self.running.values() {
            let booked = self.releases.of(&job.spec.id);
            if booked.map(|r| (r.at, r.placement())) != Some((job.release_key(), &job.placement)) {
                return Err(format!(
                    "job {} is booked to give back {:?}, not {:?} at {}",
                    job.spec.id,
                    booked,
                    job.placement,
                    job.release_key()
                ));
            }
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
            if let Some(broken) = self.cluster.breaks_shape(&job.placement, &job.spec.shape) {
                return Err(format!(
                    "job {} is placed against its shape: {broken}",
                    job.spec.id
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
        if !self.cluster.counts_agree() {
            return Err("the cluster's free counts do not match its free GPUs".into());
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
            let held: u64 = self
                .running
                .values()
                .filter(|j| j.spec.account == account.id)
                .map(|j| j.placement.share_units())
                .sum();
            let counted = self.held(&(account.id.clone(), None));
            if counted != held {
                return Err(format!(
                    "account {} counted {counted} share units held, holds {held}",
                    account.id
                ));
            }
            if account
                .quota
                .max_gpus
                .is_some_and(|l| held > u64::from(l) * u64::from(SHARE_UNITS_PER_GPU))
            {
                return Err(format!(
                    "account {} holds {held} share units, over its max_gpus",
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
                let held: u64 = self
                    .running
                    .values()
                    .filter(|j| {
                        j.spec.account == account.id && j.spec.project.as_ref() == Some(&project.id)
                    })
                    .map(|j| j.placement.share_units())
                    .sum();
                if project
                    .quota
                    .max_gpus
                    .is_some_and(|l| held > u64::from(l) * u64::from(SHARE_UNITS_PER_GPU))
                {
                    return Err(format!(
                        "project {}/{} holds {held} share units, over its max_gpus",
                        account.id, project.id
                    ));
                }
                if project.quota.max_running_jobs.is_some_and(|l| running > l) {
                    return Err(format!(
                        "project {}/{} runs {running} jobs, over its quota",
                        account.id, project.id
                    ));
                }
                self.check_active_jobs(&account.id, Some(&project.id))?;
            }
            self.check_active_jobs(&account.id, None)?;
        }
        Ok(())
    }

    /// [`Scheduler::active_jobs`] against the jobs counted one by one.
    fn check_active_jobs(
        &self,
        account: &AccountId,
        project: Option<&ProjectId>,
    ) -> Result<(), String> {
        let counts = |spec: &JobSpec| {
            &spec.account == account && (project.is_none() || spec.project.as_ref() == project)
        };
        let counted = self.pending.iter().filter(|j| counts(&j.spec)).count()
            + self.running.values().filter(|j| counts(&j.spec)).count();
        let kept = self.active_jobs(account, project);
        if counted != kept {
            return Err(format!(
                "account {account} project {project:?}: {counted} jobs waiting or running, \
                 {kept} kept"
            ));
        }
        Ok(())
    }
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
    ledger.record_in(
        job.usage_slot,
        job.placement.gpu_equivalent() * secs as f64,
        now,
    );
    // This runs for every running job at every simulated event: the placement is walked
    // again only where some account has a GPU-hour quota.
    if windows.is_tracking() {
        windows.record(
            &job.spec.account,
            job.spec.project.as_ref(),
            job.placement.share_units(),
            job.accrued_until,
            now,
        );
    }
    job.accrued_until = now;
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
    }
}
