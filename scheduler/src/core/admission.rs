//! Admission and quotas: a job that could never run is refused at submission with the reason;
//! a pending job over a running-job, GPU-hour or storage quota is held with Slurm's reason.

use super::*;

impl Scheduler {
    pub(super) fn admit(&self, spec: &JobSpec) -> Result<u32, Refusal> {
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
        if partition
            .allowed_accounts
            .as_ref()
            .is_some_and(|allowed| !allowed.contains(&spec.account))
        {
            return Err(Refusal::PartitionNotAllowed {
                partition: partition_name.to_owned(),
                account: spec.account.clone(),
            });
        }
        if let Some(grace_s) = spec.grace_s.filter(|g| *g > partition.max_grace_s) {
            return Err(Refusal::GraceTooLong {
                asked_s: grace_s,
                limit_s: partition.max_grace_s,
                partition: partition_name.to_owned(),
            });
        }
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
        if let Some(limit) = quota.max_gpus {
            if spec.min_size() > limit {
                return Err(Refusal::MoreThanMaxGpus {
                    asked: spec.min_size(),
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
        if spec.shape.gpus_per_node == Some(0) {
            return Err(Refusal::ZeroInShape {
                field: "gpus_per_node",
            });
        }
        if spec.shape.max_nodes == Some(0) {
            return Err(Refusal::ZeroInShape { field: "nodes" });
        }
        if spec.is_elastic() && spec.shape.fixes_layout() {
            return Err(Refusal::ElasticShape);
        }
        if let Some(share) = spec.shape.gpu_share {
            if spec.gpus != 1 || spec.is_elastic() || spec.shape.fixes_layout() {
                return Err(Refusal::ShareOfOneGpu { share });
            }
        }
        if spec.shape != Default::default()
            && self
                .cluster
                .empty_like()
                .find(
                    spec.min_size(),
                    &spec.account,
                    &NodeFilter::none(),
                    &spec.shape,
                )
                .is_none()
        {
            return Err(Refusal::ShapeNeverFits {
                gpus: spec.min_size(),
                shape: describe_shape(&spec.shape),
                field: shape_field(&spec.shape),
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

    pub(super) fn limits_for(&self, spec: &JobSpec) -> JobLimits {
        let account = self.tenants.account(&spec.account);
        let quota = self
            .tenants
            .effective_quota(&spec.account, spec.project.as_ref())
            .unwrap_or_default();
        let project = match &spec.project {
            None => NO_PROJECT,
            Some(p) => account
                .and_then(|a| a.projects.iter().position(|q| &q.id == p))
                .map_or(UNKNOWN_PROJECT, |i| i as u32),
        };
        let partition = spec.partition.as_deref().unwrap_or(&self.default_partition);
        let scope = self.scope_limits(&spec.account, spec.project.as_ref());
        JobLimits {
            account: self.account_index.get(&spec.account).copied().unwrap_or(0),
            project,
            shape: DEFAULT_SHAPE,
            partition: self.partitions.get(partition).map_or(u32::MAX, |p| p.index),
            running_limited: scope.running,
            gpus_limited: scope.gpus,
            gpu_hours_limited: scope.gpu_hours,
            storage_limited: scope.storage,
            quota_priority: quota.priority.map_or(0.5, |p| f64::from(p) / 100.0),
        }
    }

    /// [`Scheduler::limits_for`] a job entering the queue, with its shape numbered.
    pub(super) fn waiting_limits(&mut self, spec: &JobSpec) -> JobLimits {
        let mut limits = self.limits_for(spec);
        if spec.shape != Shape::default() {
            let next = u32::try_from(self.shape_ids.len() + 1).unwrap_or(u32::MAX);
            limits.shape = *self.shape_ids.entry(spec.shape.clone()).or_insert(next);
        }
        limits
    }

    /// Which quotas an account's (or a project's) jobs must be checked against before they
    /// start.
    pub(super) fn scope_limits(
        &self,
        account: &AccountId,
        project: Option<&ProjectId>,
    ) -> ScopeLimits {
        let of_account = self.tenants.account(account);
        let quota = self
            .tenants
            .effective_quota(account, project)
            .unwrap_or_default();
        let project_quota = project.and_then(|p| {
            of_account
                .and_then(|a| a.projects.iter().find(|q| &q.id == p))
                .map(|q| &q.quota)
        });
        ScopeLimits {
            running: quota.max_running_jobs.is_some()
                || of_account.is_some_and(|a| a.quota.max_running_jobs.is_some()),
            gpus: quota.max_gpus.is_some(),
            gpu_hours: of_account.is_some_and(|a| has_gpu_hour_quota(&a.quota))
                || project_quota.is_some_and(has_gpu_hour_quota),
            storage: of_account.is_some_and(|a| a.quota.storage.is_some())
                || project_quota.is_some_and(|q| q.storage.is_some()),
        }
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

    pub(super) fn over_storage_quota(
        &self,
        account_id: &AccountId,
        project: Option<&ProjectId>,
    ) -> bool {
        let Some(account) = self.tenants.account(account_id) else {
            return false;
        };
        let used = |project: Option<&ProjectId>| {
            self.storage_used
                .get(&(account_id.clone(), project.cloned()))
                .copied()
                .unwrap_or(0)
        };
        if account.quota.storage.is_some_and(|q| used(None) > q.0) {
            return true;
        }
        project.is_some_and(|p| {
            account
                .projects
                .iter()
                .find(|q| &q.id == p)
                .and_then(|q| q.quota.storage)
                .is_some_and(|q| used(Some(p)) > q.0)
        })
    }

    /// The GPU-hour quotas a job of the account (or project) is held to: the account's, then
    /// the project's, each with the usage window it is counted in.
    pub(super) fn gpu_hour_scopes(
        &self,
        account_id: &AccountId,
        project: Option<&ProjectId>,
    ) -> Vec<(WindowKey, Quota)> {
        let Some(account) = self.tenants.account(account_id) else {
            return Vec::new();
        };
        let project_quota = project
            .and_then(|p| account.projects.iter().find(|q| &q.id == p))
            .map(|p| ((account_id.clone(), Some(p.id.clone())), p.quota.clone()));
        std::iter::once(((account_id.clone(), None), account.quota.clone()))
            .chain(project_quota)
            .filter(|(_, quota)| has_gpu_hour_quota(quota))
            .collect()
    }

    /// What the running jobs of an account (project `None`) or a project may still use, up to
    /// their time limits, by UTC day.
    pub(super) fn committed(&self, key: &WindowKey) -> DaySpread {
        let mut committed = DaySpread::default();
        for r in self
            .running
            .values()
            .filter(|r| r.spec.account == key.0 && (key.1.is_none() || r.spec.project == key.1))
        {
            committed.add(r.placement.share_units(), r.accrued_until, r.limit_end_s());
        }
        committed
    }

    /// What the running jobs of an account (project `None`) or a project hold now, in share
    /// units.
    pub(super) fn held(&self, key: &WindowKey) -> u64 {
        self.gpus_held.get(key).copied().unwrap_or(0)
    }

    /// Adds (or, negative, removes) share units a job of `spec` holds to its account and
    /// project.
    pub(super) fn count_held(&mut self, spec: &JobSpec, units: i64) {
        let keys = std::iter::once((spec.account.clone(), None)).chain(
            spec.project
                .clone()
                .map(|p| (spec.account.clone(), Some(p))),
        );
        for key in keys {
            let n = self.gpus_held.entry(key).or_default();
            *n = (*n as i64 + units).max(0) as u64;
        }
    }

    /// How much more a job of the account (or project) may hold under `max_gpus` (the
    /// account's and the project's, the tighter), in share units; `None` when neither sets one.
    pub(super) fn gpu_room(
        &self,
        account_id: &AccountId,
        project: Option<&ProjectId>,
    ) -> Option<u64> {
        let account = self.tenants.account(account_id)?;
        let room = |limit: Option<u32>, key: WindowKey| {
            limit.map(|l| {
                (u64::from(l) * u64::from(SHARE_UNITS_PER_GPU)).saturating_sub(self.held(&key))
            })
        };
        let of_account = room(account.quota.max_gpus, (account_id.clone(), None));
        let of_project = project.and_then(|p| {
            let quota = &account.projects.iter().find(|q| &q.id == p)?.quota;
            room(quota.max_gpus, (account_id.clone(), Some(p.clone())))
        });
        match (of_account, of_project) {
            (Some(a), Some(p)) => Some(a.min(p)),
            (a, p) => a.or(p),
        }
    }

    /// Whether an account (or project) runs as many jobs as its `max_running_jobs` allows,
    /// claims of preemptors counted, but not `own`'s (the job asking).
    pub(super) fn at_job_limit(
        &self,
        account: &AccountId,
        project: Option<&ProjectId>,
        own: Option<&JobId>,
    ) -> bool {
        let Some(quota) = self.tenants.effective_quota(account, project) else {
            return true;
        };
        let Some(limit) = quota.max_running_jobs else {
            return false;
        };
        let claimed = |project: Option<&ProjectId>| -> u32 {
            self.claims
                .iter()
                .filter(|(id, c)| {
                    Some(*id) != own
                        && &c.account == account
                        && (project.is_none() || c.project.as_ref() == project)
                })
                .count() as u32
        };
        let account_running =
            self.running_per_account.get(account).copied().unwrap_or(0) + claimed(None);
        let account_limit = self
            .tenants
            .account(account)
            .and_then(|a| a.quota.max_running_jobs)
            .unwrap_or(u32::MAX);
        let project_running = project
            .and_then(|p| self.running_per_project.get(&(account.clone(), p.clone())))
            .copied()
            .map(|n| n + claimed(project))
            .unwrap_or(account_running);
        account_running >= account_limit || project_running >= limit
    }
}

pub(super) fn has_gpu_hour_quota(q: &Quota) -> bool {
    q.gpu_hours_per_day.is_some() || q.gpu_hours_per_week.is_some()
}

/// A job whose GPU-hours alone pass its quota's window could never start.
pub(super) fn check_gpu_hours_ever_fit(spec: &JobSpec, quota: &Quota) -> Result<(), Refusal> {
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

/// The one field of `shape` a submission set, if it set only one.
fn shape_field(shape: &Shape) -> Option<&'static str> {
    let set = [
        (shape.gpus_per_node.is_some(), "gpus_per_node"),
        (shape.max_nodes.is_some(), "nodes"),
        (!shape.gpu_types.is_empty(), "gpu_types"),
        (shape.gpu_share.is_some(), "gpu_share"),
    ];
    let mut named = set.iter().filter(|(on, _)| *on).map(|(_, field)| *field);
    match (named.next(), named.next()) {
        (Some(field), None) => Some(field),
        _ => None,
    }
}

/// A shape as a person reads it: `2 GPUs per node, at most 4 nodes, h100-sxm`.
fn describe_shape(shape: &Shape) -> String {
    let mut parts = Vec::new();
    if let Some(g) = shape.gpus_per_node {
        parts.push(format!("{g} GPUs per node"));
    }
    if let Some(n) = shape.max_nodes {
        parts.push(format!("at most {n} nodes"));
    }
    if !shape.gpu_types.is_empty() {
        let types: Vec<String> = shape.gpu_types.iter().map(ToString::to_string).collect();
        parts.push(types.join(" or "));
    }
    if let Some(share) = shape.gpu_share {
        parts.push(format!("a {share} share of a GPU"));
    }
    parts.join(", ")
}
