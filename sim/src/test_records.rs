//! Job records and replay results written by hand, for the reports' unit tests.

use gpuledger_model::{AccountId, Allocation, JobId};
use gpuledger_scheduler::{JobRecord, JobSpec, Refusal, Run, SchedulerOptions, SimResult};

/// A job of `account` submitted at `submit` that held `gpus` over each of `runs` (none: it never
/// started); each run after the first counts as a preemption.
pub fn record(id: &str, account: &str, gpus: u32, submit: i64, runs: &[(i64, i64)]) -> JobRecord {
    JobRecord {
        spec: JobSpec::new(
            JobId::new(id).unwrap(),
            AccountId::new(account).unwrap(),
            gpus,
            3600,
            submit,
        ),
        start_s: runs.first().map(|r| r.0),
        end_s: runs.last().map(|r| r.1),
        runs: runs
            .iter()
            .map(|(s, e)| Run {
                start_s: *s,
                end_s: Some(*e),
                allocation: Allocation(Vec::new()),
                gpus,
            })
            .collect(),
        outcome: None,
        backfilled: false,
        preemptions: (runs.len() as u32).saturating_sub(1),
        lost_gpu_s: 0,
    }
}

/// A fair-share replay of `records` on `total_gpus` from 0 to `horizon_s`.
pub fn replay(
    records: Vec<JobRecord>,
    refused: Vec<(JobSpec, Refusal)>,
    total_gpus: u32,
    horizon_s: i64,
) -> SimResult {
    SimResult {
        options: SchedulerOptions::parse("fairshare+backfill").unwrap(),
        records,
        refused,
        events: Vec::new(),
        busy_gpus: Vec::new(),
        planned_idle_gpus: Vec::new(),
        total_gpus,
        start_s: 0,
        horizon_s,
    }
}
