//! A discrete-event simulator in virtual time. It replays a list of jobs (a trace or a generated
//! workload) through the same [`Scheduler`] a live service uses, and records what happened to
//! every job, the job events an aggregator would receive, and busy GPUs over time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{Allocation, JobId};

use crate::core::{JobSpec, Refusal, Scheduler, SchedulerOptions};

/// A job to simulate: what is submitted, and how it will really behave.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    pub spec: JobSpec,
    /// How long it would run if nothing stopped it.
    pub run_time_s: u64,
    /// How it ends if it ends by itself (completed or failed).
    pub outcome: Outcome,
}

/// What happened to one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub spec: JobSpec,
    pub start_s: Option<UnixSeconds>,
    /// `None` while still running at the horizon.
    pub end_s: Option<UnixSeconds>,
    pub allocation: Option<Allocation>,
    pub outcome: Option<Outcome>,
    pub backfilled: bool,
}

impl JobRecord {
    pub fn queue_wait_s(&self) -> Option<i64> {
        self.start_s.map(|s| s - self.spec.submit_s)
    }

    /// GPU-seconds held up to `horizon_s`.
    pub fn gpu_seconds_until(&self, horizon_s: UnixSeconds) -> i64 {
        match self.start_s {
            Some(start) => {
                let end = self.end_s.unwrap_or(horizon_s).min(horizon_s);
                i64::from(self.spec.gpus) * (end - start).max(0)
            }
            None => 0,
        }
    }
}

/// Everything a simulation produced.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub options: SchedulerOptions,
    pub records: Vec<JobRecord>,
    pub refused: Vec<(JobSpec, Refusal)>,
    pub events: Vec<JobEvent>,
    /// (time, busy GPUs) at every change.
    pub busy_gpus: Vec<(UnixSeconds, u32)>,
    pub total_gpus: u32,
    pub start_s: UnixSeconds,
    pub horizon_s: UnixSeconds,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    ByItself,
    TimeLimit,
}

/// Runs `jobs` (in any order) until every job has ended, or until `horizon_s` when given.
/// `progress` is called with (jobs submitted so far, all jobs).
pub fn simulate(
    config: &ClusterConfig,
    options: SchedulerOptions,
    mut jobs: Vec<SimJob>,
    horizon_s: Option<UnixSeconds>,
    progress: &mut dyn FnMut(usize, usize),
) -> SimResult {
    jobs.sort_by(|a, b| (a.spec.submit_s, &a.spec.id).cmp(&(b.spec.submit_s, &b.spec.id)));
    let mut sched = Scheduler::new(config, options);
    let total_gpus = sched.cluster().total_gpus();
    let start_s = jobs.first().map(|j| j.spec.submit_s).unwrap_or(0);
    let mut index: HashMap<JobId, usize> = HashMap::with_capacity(jobs.len());
    let mut records: Vec<JobRecord> = Vec::with_capacity(jobs.len());
    let mut refused = Vec::new();
    let mut events = Vec::with_capacity(jobs.len() * 3);
    let mut busy = vec![(start_s, 0u32)];
    let mut finishes: BinaryHeap<Reverse<(UnixSeconds, JobId, Ending)>> = BinaryHeap::new();
    let mut next_submit = 0;
    let end_of_time = horizon_s.unwrap_or(UnixSeconds::MAX);

    loop {
        let t_submit = jobs.get(next_submit).map(|j| j.spec.submit_s);
        let t_finish = finishes.peek().map(|Reverse((t, _, _))| *t);
        let now = match (t_submit, t_finish) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        if now > end_of_time {
            break;
        }
        while let Some(Reverse((t, _, _))) = finishes.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, id, ending))) = finishes.pop() else {
                break;
            };
            let i = index[&id];
            let job = &jobs[i];
            sched.finish(&id, now);
            let outcome = match ending {
                Ending::ByItself => job.outcome,
                Ending::TimeLimit => Outcome::Timeout,
            };
            records[i].end_s = Some(now);
            records[i].outcome = Some(outcome);
            let mut ev = event(&job.spec, now, JobEventKind::Finished);
            ev.outcome = Some(outcome);
            ev.exit_code = Some(match outcome {
                Outcome::Completed => 0,
                Outcome::Timeout => 143,
                _ => 1,
            });
            events.push(ev);
        }
        while next_submit < jobs.len() && jobs[next_submit].spec.submit_s == now {
            let job = &jobs[next_submit];
            index.insert(job.spec.id.clone(), records.len());
            records.push(JobRecord {
                spec: job.spec.clone(),
                start_s: None,
                end_s: None,
                allocation: None,
                outcome: None,
                backfilled: false,
            });
            match sched.submit(job.spec.clone()) {
                Ok(()) => {
                    let mut ev = event(&job.spec, now, JobEventKind::Submitted);
                    ev.gpus = Some(job.spec.gpus);
                    ev.partition = job.spec.partition.clone();
                    ev.time_limit_s = Some(job.spec.time_limit_s);
                    events.push(ev);
                }
                Err(reason) => refused.push((job.spec.clone(), reason)),
            }
            next_submit += 1;
            if next_submit % 1024 == 0 {
                progress(next_submit, jobs.len());
            }
        }
        sched.accrue_usage(now);
        for started in sched.schedule(now) {
            let i = index[&started.job_id];
            let job = &jobs[i];
            let (run, ending) = if job.run_time_s > job.spec.time_limit_s {
                (job.spec.time_limit_s, Ending::TimeLimit)
            } else {
                (job.run_time_s, Ending::ByItself)
            };
            finishes.push(Reverse((now + run as i64, started.job_id.clone(), ending)));
            let mut ev = event(&job.spec, now, JobEventKind::Started);
            ev.gpus = Some(job.spec.gpus);
            ev.allocation = Some(started.allocation.clone());
            events.push(ev);
            let rec = &mut records[i];
            rec.start_s = Some(now);
            rec.allocation = Some(started.allocation);
            rec.backfilled = started.backfilled;
        }
        let busy_now = total_gpus - sched.cluster().free_gpus();
        if busy.last().map(|(_, b)| *b) != Some(busy_now) {
            busy.push((now, busy_now));
        }
    }
    progress(jobs.len(), jobs.len());
    let last = records
        .iter()
        .filter_map(|r| r.end_s)
        .max()
        .unwrap_or(start_s);
    SimResult {
        options,
        records,
        refused,
        events,
        busy_gpus: busy,
        total_gpus,
        start_s,
        horizon_s: horizon_s.unwrap_or(last),
    }
}

fn event(spec: &JobSpec, now: UnixSeconds, kind: JobEventKind) -> JobEvent {
    JobEvent::new(
        now * 1000,
        spec.id.clone(),
        spec.account.clone(),
        spec.project.clone(),
        kind,
    )
}

impl SimResult {
    /// Mean busy fraction of all GPUs between the first submission and the horizon.
    pub fn utilization(&self) -> f64 {
        let span = (self.horizon_s - self.start_s) as f64;
        if span <= 0.0 || self.total_gpus == 0 {
            return 0.0;
        }
        let mut busy_gpu_s = 0.0;
        for (k, (t, b)) in self.busy_gpus.iter().enumerate() {
            let next = self
                .busy_gpus
                .get(k + 1)
                .map(|(t, _)| *t)
                .unwrap_or(self.horizon_s)
                .min(self.horizon_s);
            busy_gpu_s += f64::from(*b) * (next - t).max(0) as f64;
        }
        busy_gpu_s / (span * f64::from(self.total_gpus))
    }
}
