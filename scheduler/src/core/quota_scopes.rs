//! A cycle's quota checks by scope. Every waiting job of an account (or of one of its
//! projects) is held or let go by the same running jobs, claims and usage, so a cycle works
//! those out once per scope and keeps them until something starts or is preempted. A deep
//! queue under quotas then costs a lookup per job, where it cost a walk over the running jobs
//! and a read of each job's record (31 ms a cycle against 0.12 ms without quotas, 10,000
//! waiting on 512 nodes, docs/benchmarks.md).

use rustc_hash::FxHashMap;

use super::*;

/// `JobLimits::project` of a job without a project.
pub(super) const NO_PROJECT: u32 = u32::MAX;
/// `JobLimits::project` of a job naming a project its account does not list (refused at
/// submission; checked from its record should one ever wait).
pub(super) const UNKNOWN_PROJECT: u32 = u32::MAX - 1;

/// Which quotas the jobs of an account (or one of its projects) are checked against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ScopeLimits {
    pub(super) running: bool,
    pub(super) gpus: bool,
    pub(super) gpu_hours: bool,
    pub(super) storage: bool,
}

/// What a cycle worked out of each scope it met: by account index, each of its scopes met
/// with its project index.
#[derive(Debug, Default)]
pub(super) struct QuotaScopes {
    accounts: Vec<Vec<(u32, Scope)>>,
}

#[derive(Debug)]
pub(super) struct Scope {
    limits: ScopeLimits,
    at_job_limit: bool,
    gpu_room: Option<u64>,
    over_storage: bool,
    /// Each GPU-hour quota the scope's jobs are held to.
    gpu_hours: Vec<GpuHourWindow>,
    /// The GPU-hour quota's hold by a job's share units and time limit.
    held: FxHashMap<(u64, u64), PendingReason>,
    /// The largest and longest jobs found to pass it, none within another: a job no larger
    /// and no longer than one of them needs no more on any day, so it passes too.
    passed: Vec<(u64, u64)>,
}

/// A GPU-hour quota and, by UTC day, what its window used plus what the running jobs there
/// may still use: looked up once a day per scope rather than once a day per waiting job.
#[derive(Debug)]
struct GpuHourWindow {
    key: WindowKey,
    quota: Quota,
    committed: DaySpread,
    /// Days from `first_day` on, as far as a job asked so far.
    first_day: i64,
    taken: Vec<i64>,
}

impl GpuHourWindow {
    /// Works out the days up to `last` not worked out yet.
    fn cover(&mut self, windows: &UsageWindows, last: i64) {
        let mut day = self.first_day.saturating_add(self.taken.len() as i64);
        while day <= last {
            let used = windows.day(&self.key, day);
            self.taken.push(used.saturating_add(self.committed.on(day)));
            day += 1;
        }
    }

    /// What `quota_hold`'s check would add up on `day` before the job's own need.
    fn taken_on(&self, day: i64) -> i64 {
        usize::try_from(day - self.first_day)
            .ok()
            .and_then(|i| self.taken.get(i))
            .copied()
            .unwrap_or(0)
    }
}

impl QuotaScopes {
    /// Jobs were preempted: every scope is worked out again when next asked.
    pub(super) fn forget(&mut self) {
        self.accounts.iter_mut().for_each(Vec::clear);
    }

    /// A job of account `account` (an index) started: its scopes are worked out again (what
    /// it runs, holds and may still use changed; no other account's did).
    pub(super) fn forget_account(&mut self, account: usize) {
        if let Some(scopes) = self.accounts.get_mut(account) {
            scopes.clear();
        }
    }
}

impl Scope {
    /// The quota that keeps a job of `units` share units and a time limit of `limit_s` from
    /// starting now, if any: the running-job limit, then `max_gpus`, storage, GPU-hours.
    fn hold(
        &mut self,
        windows: &UsageWindows,
        units: u64,
        limit_s: u64,
        now: UnixSeconds,
    ) -> Option<PendingReason> {
        if self.limits.running && self.at_job_limit {
            return Some(PendingReason::AssocMaxJobsLimit);
        }
        if self.limits.gpus && self.gpu_room.is_some_and(|room| room < units) {
            return Some(PendingReason::AssocGrpGres);
        }
        if self.limits.storage && self.over_storage {
            return Some(PendingReason::AssocGrpStorage);
        }
        if !self.limits.gpu_hours {
            return None;
        }
        let class = (units, limit_s);
        if let Some(reason) = self.held.get(&class) {
            return Some(*reason);
        }
        let within = |(u, l): &(u64, u64)| class.0 <= *u && class.1 <= *l;
        if self.passed.iter().any(within) {
            return None;
        }
        let mut need = DaySpread::default();
        need.add(units, now, now.saturating_add(limit_s as i64));
        // The checks read from six days before the job's first day to six after its last.
        let last = need.span().map_or(day_of(now), |(_, last)| last) + 6;
        let none_committed = DaySpread::default();
        let verdict = self.gpu_hours.iter_mut().find_map(|window| {
            window.cover(windows, last);
            let taken = |day: i64| window.taken_on(day);
            gpu_hours_verdict(&window.quota, taken, &none_committed, &need)
                .and_then(PendingReason::of_quota)
        });
        match verdict {
            Some(reason) => {
                self.held.insert(class, reason);
            }
            None => {
                self.passed.retain(|(u, l)| *u > class.0 || *l > class.1);
                self.passed.push(class);
            }
        }
        verdict
    }
}

impl Scheduler {
    /// [`Scheduler::quota_hold`] for the waiting job `hot` describes, from its scope in
    /// `scopes` (worked out on first use). The job's record (`job`) is read only when it holds
    /// a claim (claims count for every job but the claimant's own) or names a project the
    /// config does not list.
    pub(super) fn quota_hold_in(
        &self,
        hot: &Hot,
        job: JobRef<'_>,
        scopes: &mut QuotaScopes,
        now: UnixSeconds,
    ) -> Option<PendingReason> {
        // A claimant's own claim does not count against it, everyone else's does.
        if hot.claimed() || hot.project == UNKNOWN_PROJECT {
            return self.quota_hold(&job, now);
        }
        let verdict = self
            .kept_scope(scopes, hot.account, hot.project, now)
            .and_then(|scope| scope.hold(&self.windows, hot.units, hot.time_limit_s, now));
        // Every test run (debug builds) checks the kept scope's answer against a fresh one's.
        #[cfg(debug_assertions)]
        assert_eq!(
            verdict,
            self.quota_hold(job.uncounted(), now),
            "quota verdict of job {} from its scope",
            job.uncounted().spec.id
        );
        verdict
    }

    /// The scope of account `account` (an index) and project `project` (an index in its list,
    /// or [`NO_PROJECT`]) as `scopes` keeps it, worked out now if it does not.
    fn kept_scope<'s>(
        &self,
        scopes: &'s mut QuotaScopes,
        account: usize,
        project: u32,
        now: UnixSeconds,
    ) -> Option<&'s mut Scope> {
        if scopes.accounts.len() <= account {
            scopes.accounts.resize_with(account + 1, Vec::new);
        }
        let of_account = &mut scopes.accounts[account];
        let at = match of_account.iter().position(|(p, _)| *p == project) {
            Some(at) => at,
            None => {
                let account_id = self.account_ids.get(account)?;
                let project_id = match project {
                    NO_PROJECT => None,
                    i => Some(
                        &self
                            .tenants
                            .account(account_id)?
                            .projects
                            .get(i as usize)?
                            .id,
                    ),
                };
                of_account.push((project, self.scope(account_id, project_id, None, now)));
                of_account.len() - 1
            }
        };
        Some(&mut of_account[at].1)
    }

    /// What every job of an account (or project) is checked against now: claims count but
    /// `own`'s (the job asking, if it holds one).
    pub(super) fn scope(
        &self,
        account_id: &AccountId,
        project_id: Option<&ProjectId>,
        own: Option<&JobId>,
        now: UnixSeconds,
    ) -> Scope {
        let limits = self.scope_limits(account_id, project_id);
        let gpu_hours = if limits.gpu_hours {
            self.gpu_hour_scopes(account_id, project_id)
                .into_iter()
                .map(|(key, quota)| GpuHourWindow {
                    committed: self.committed(&key),
                    key,
                    quota,
                    first_day: day_of(now) - 6,
                    taken: Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Scope {
            limits,
            at_job_limit: limits.running && self.at_job_limit(account_id, project_id, own),
            gpu_room: self.gpu_room(account_id, project_id),
            over_storage: limits.storage && self.over_storage_quota(account_id, project_id),
            gpu_hours,
            held: FxHashMap::default(),
            passed: Vec::new(),
        }
    }

    /// The quota that keeps a job from starting now, if any. A cycle asks
    /// [`Scheduler::quota_hold_in`], which gives the same answer from the scope it keeps.
    pub(super) fn quota_hold(&self, job: &PendingJob, now: UnixSeconds) -> Option<PendingReason> {
        let spec = &job.spec;
        self.scope(&spec.account, spec.project.as_ref(), Some(&spec.id), now)
            .hold(
                &self.windows,
                spec.share_units_of(spec.min_size()),
                spec.time_limit_s,
                now,
            )
    }
}
