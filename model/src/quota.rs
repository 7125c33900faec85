//! Quotas in the six dimensions of the design (and Slurm's association limits): concurrent
//! running jobs, GPU-hours per day and per week, largest job, longest run, storage, priority;
//! and the jobs an account may have queued or running at once.

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, DurationSpec};

/// Limits on an account or a project. `None` means unlimited (inherited from the parent for a
/// project).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Jobs running at once (Slurm `GrpJobs`).
    pub max_running_jobs: Option<u32>,
    /// GPUs held at once by all running jobs together (Slurm `GrpTRES=gres/gpu=N`).
    pub max_gpus: Option<u32>,
    /// GPU-hours a calendar day (UTC).
    pub gpu_hours_per_day: Option<u64>,
    /// GPU-hours a rolling week (Slurm `GrpTRESMins=gres/gpu`, in hours).
    pub gpu_hours_per_week: Option<u64>,
    /// Largest job, in GPUs (Slurm `MaxTRESPerJob=gres/gpu`).
    pub max_gpus_per_job: Option<u32>,
    /// Longest run time of one job (Slurm `MaxWall`).
    pub max_run_time: Option<DurationSpec>,
    /// Checkpoints and data kept on shared storage.
    pub storage: Option<ByteSize>,
    /// Base priority 1-100 (higher runs first among equals).
    pub priority: Option<u8>,
    /// Jobs pending or running at once (Slurm `GrpSubmitJobs`): a submission past it is
    /// refused until some end. Unset: the scheduler's `max_submit_jobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_jobs: Option<u32>,
}

/// One dimension of a quota, to name a limit in errors and pending reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaDimension {
    MaxRunningJobs,
    MaxGpus,
    GpuHoursPerDay,
    GpuHoursPerWeek,
    MaxGpusPerJob,
    MaxRunTime,
    Storage,
    Priority,
    MaxSubmitJobs,
}

impl QuotaDimension {
    pub fn field(self) -> &'static str {
        match self {
            QuotaDimension::MaxRunningJobs => "max_running_jobs",
            QuotaDimension::MaxGpus => "max_gpus",
            QuotaDimension::GpuHoursPerDay => "gpu_hours_per_day",
            QuotaDimension::GpuHoursPerWeek => "gpu_hours_per_week",
            QuotaDimension::MaxGpusPerJob => "max_gpus_per_job",
            QuotaDimension::MaxRunTime => "max_run_time",
            QuotaDimension::Storage => "storage",
            QuotaDimension::Priority => "priority",
            QuotaDimension::MaxSubmitJobs => "max_submit_jobs",
        }
    }
}

fn tighter<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn exceeds<T: Ord>(child: &Option<T>, parent: &Option<T>) -> bool {
    matches!((child, parent), (Some(c), Some(p)) if c > p)
}

impl Quota {
    /// The limits that hold for a project: the tighter of its own and its account's in every
    /// dimension; a project's priority, when set, replaces the account's.
    pub fn effective_for_project(account: &Quota, project: &Quota) -> Quota {
        Quota {
            max_running_jobs: tighter(account.max_running_jobs, project.max_running_jobs),
            max_gpus: tighter(account.max_gpus, project.max_gpus),
            gpu_hours_per_day: tighter(account.gpu_hours_per_day, project.gpu_hours_per_day),
            gpu_hours_per_week: tighter(account.gpu_hours_per_week, project.gpu_hours_per_week),
            max_gpus_per_job: tighter(account.max_gpus_per_job, project.max_gpus_per_job),
            max_run_time: tighter(account.max_run_time, project.max_run_time),
            storage: tighter(account.storage, project.storage),
            priority: project.priority.or(account.priority),
            max_submit_jobs: tighter(account.max_submit_jobs, project.max_submit_jobs),
        }
    }

    /// The dimensions in which `self` (a project) asks for more than `parent` (its account)
    /// allows. A project never exceeds its account.
    pub fn exceeded_dimensions(&self, parent: &Quota) -> Vec<QuotaDimension> {
        let mut out = Vec::new();
        if exceeds(&self.max_running_jobs, &parent.max_running_jobs) {
            out.push(QuotaDimension::MaxRunningJobs);
        }
        if exceeds(&self.max_gpus, &parent.max_gpus) {
            out.push(QuotaDimension::MaxGpus);
        }
        if exceeds(&self.gpu_hours_per_day, &parent.gpu_hours_per_day) {
            out.push(QuotaDimension::GpuHoursPerDay);
        }
        if exceeds(&self.gpu_hours_per_week, &parent.gpu_hours_per_week) {
            out.push(QuotaDimension::GpuHoursPerWeek);
        }
        if exceeds(&self.max_gpus_per_job, &parent.max_gpus_per_job) {
            out.push(QuotaDimension::MaxGpusPerJob);
        }
        if exceeds(&self.max_run_time, &parent.max_run_time) {
            out.push(QuotaDimension::MaxRunTime);
        }
        if exceeds(&self.storage, &parent.storage) {
            out.push(QuotaDimension::Storage);
        }
        if exceeds(&self.max_submit_jobs, &parent.max_submit_jobs) {
            out.push(QuotaDimension::MaxSubmitJobs);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_limits_are_the_tighter_of_both() {
        let account = Quota {
            max_gpus_per_job: Some(256),
            max_running_jobs: Some(10),
            max_gpus: Some(32),
            priority: Some(40),
            ..Quota::default()
        };
        let project = Quota {
            max_gpus_per_job: Some(64),
            gpu_hours_per_day: Some(500),
            max_gpus: Some(16),
            ..Quota::default()
        };
        let eff = Quota::effective_for_project(&account, &project);
        assert_eq!(eff.max_gpus_per_job, Some(64));
        assert_eq!(eff.max_running_jobs, Some(10));
        assert_eq!(eff.max_gpus, Some(16));
        assert_eq!(eff.gpu_hours_per_day, Some(500));
        assert_eq!(eff.priority, Some(40));
        assert!(project.exceeded_dimensions(&account).is_empty());
        let greedy = Quota {
            max_gpus_per_job: Some(512),
            max_gpus: Some(64),
            ..Quota::default()
        };
        assert_eq!(
            greedy.exceeded_dimensions(&account),
            vec![QuotaDimension::MaxGpus, QuotaDimension::MaxGpusPerJob]
        );
    }
}
