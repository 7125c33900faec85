//! The harness scheduler tests share: a scheduler, job builders, and a check of every
//! invariant after every step.
#![allow(dead_code)]

use gpuledger_model::{AccountId, ClusterConfig, JobId};
use gpuledger_scheduler::{
    Backfill, Cycle, JobSpec, PendingJob, PendingReason, Scheduler, SchedulerOptions, Started,
};

pub const H: i64 = 3600;

/// Under a strict order, after a cycle: the jobs ahead of the first one waiting for GPUs are
/// held by their quotas, and every job behind it waits for it (`Priority`, no planned start),
/// however the queue changed since the last cycle.
pub fn check_strict_reasons<'a>(pending: impl IntoIterator<Item = &'a PendingJob>) {
    let mut behind_blocked = false;
    for job in pending {
        if behind_blocked {
            assert_eq!(
                (job.reason, job.estimated_start_s),
                (PendingReason::Priority, None),
                "job {} waits behind a blocked job",
                job.spec.id
            );
        } else {
            behind_blocked = job.reason.waits_for_gpus();
            assert_ne!(
                job.reason,
                PendingReason::None,
                "job {} was not looked at",
                job.spec.id
            );
        }
    }
}

pub struct Harness {
    pub sched: Scheduler,
    next: u32,
}

impl Harness {
    pub fn with_config(config: &ClusterConfig, policy: &str) -> Self {
        Harness {
            sched: Scheduler::new(
                config,
                SchedulerOptions::parse(policy).expect("known policy"),
            ),
            next: 1,
        }
    }

    pub fn spec(&mut self, account: &str, gpus: u32, limit_h: u64, t: i64) -> JobSpec {
        self.spec_s(account, gpus, limit_h * 3600, t)
    }

    pub fn spec_s(&mut self, account: &str, gpus: u32, limit_s: u64, t: i64) -> JobSpec {
        let id = JobId::new(self.next.to_string()).unwrap();
        self.next += 1;
        JobSpec::new(id, AccountId::new(account).unwrap(), gpus, limit_s, t)
    }

    pub fn submit(&mut self, account: &str, gpus: u32, limit_h: u64, t: i64) -> JobId {
        let spec = self.spec(account, gpus, limit_h, t);
        self.submit_spec(spec)
    }

    pub fn submit_spec(&mut self, spec: JobSpec) -> JobId {
        let id = spec.id.clone();
        self.sched.submit(spec).expect("admitted");
        id
    }

    pub fn urgent(&mut self, account: &str, gpus: u32, limit_h: u64, t: i64) -> JobId {
        let mut spec = self.spec(account, gpus, limit_h, t);
        spec.partition = Some("urgent".into());
        self.submit_spec(spec)
    }

    pub fn step(&mut self, t: i64) -> Vec<Started> {
        self.cycle(t).started
    }

    pub fn cycle(&mut self, t: i64) -> Cycle {
        let cycle = self.sched.schedule(t);
        self.sched.check_invariants().expect("invariants hold");
        if self.sched.options().backfill == Backfill::Off {
            check_strict_reasons(self.sched.pending());
        }
        cycle
    }

    pub fn finish(&mut self, id: &JobId, t: i64) {
        assert!(self.sched.finish(id, t).is_some(), "{id} was running");
        self.sched.check_invariants().expect("invariants hold");
    }

    /// Ends every running job whose time limit has come by `t` (it runs to its limit).
    pub fn finish_ended(&mut self, t: i64) {
        let ended: Vec<JobId> = self
            .sched
            .running()
            .filter(|r| r.limit_end_s() <= t)
            .map(|r| r.spec.id.clone())
            .collect();
        for id in ended {
            self.finish(&id, t);
        }
    }

    /// How many jobs of `account` wait.
    pub fn queued(&self, account: &str) -> usize {
        self.sched
            .pending()
            .filter(|p| p.spec.account.as_str() == account)
            .count()
    }

    pub fn requeue(&mut self, id: &JobId, t: i64) {
        assert!(self.sched.requeue(id, t), "{id} was running");
        self.sched.check_invariants().expect("invariants hold");
    }

    pub fn pending_job(&self, id: &JobId) -> Option<&PendingJob> {
        self.sched.pending().find(|p| &p.spec.id == id)
    }

    pub fn reason(&self, id: &JobId) -> Option<PendingReason> {
        self.pending_job(id).map(|p| p.reason)
    }

    pub fn is_running(&self, id: &JobId) -> bool {
        self.sched.running_job(id).is_some()
    }

    pub fn gpus_of(&self, id: &JobId) -> u32 {
        self.sched
            .running_job(id)
            .map(|r| r.placement.gpu_count())
            .unwrap_or(0)
    }
}
