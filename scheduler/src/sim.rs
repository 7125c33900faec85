//! A discrete-event simulator in virtual time. It replays a list of jobs (a trace or a generated
//! workload) through the same [`Scheduler`] a live service uses, and records what happened to
//! every job (each run, preemptions, work lost), the job events an aggregator would receive,
//! and busy GPUs over time.
//!
//! Work is modelled in GPU-seconds: a job needs `run_time_s x gpus` of it and makes progress at
//! one GPU-second per GPU per second, so an elastic job below its maximum runs longer. A
//! preempted job keeps the work of its last checkpoint: the one it writes on SIGTERM when it
//! can (`checkpoint_save_s` within the grace), else its last periodic one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{Allocation, JobId, SHARE_UNITS_PER_GPU};

use crate::core::{Cycle, JobSpec, Refusal, Scheduler, SchedulerOptions};
use crate::reservation::{ReservationError, ReservationRequest};

/// A job to simulate: what is submitted, and how it will really behave.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    pub spec: JobSpec,
    /// How long it would run at its full size if nothing stopped it.
    pub run_time_s: u64,
    /// How it ends if it ends by itself (completed or failed).
    pub outcome: Outcome,
    /// Seconds it takes to write a checkpoint when it gets SIGTERM; `None` when it ignores the
    /// signal and keeps only its periodic checkpoints.
    pub checkpoint_save_s: Option<u64>,
}

/// One stretch of a job on fixed GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub start_s: UnixSeconds,
    /// `None` while still running at the horizon.
    pub end_s: Option<UnixSeconds>,
    pub allocation: Allocation,
    pub gpus: u32,
}

impl Run {
    /// What the run holds in share units ([`SHARE_UNITS_PER_GPU`] to a GPU).
    pub fn share_units(&self) -> u64 {
        if self.allocation.0.is_empty() {
            u64::from(self.gpus) * u64::from(SHARE_UNITS_PER_GPU)
        } else {
            self.allocation.share_units()
        }
    }

    /// GPUs held, a share of a GPU as its fraction.
    pub fn gpu_equivalent(&self) -> f64 {
        self.share_units() as f64 / f64::from(SHARE_UNITS_PER_GPU)
    }
}

/// What happened to one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub spec: JobSpec,
    /// The first start.
    pub start_s: Option<UnixSeconds>,
    /// The final end; `None` while still pending or running at the horizon.
    pub end_s: Option<UnixSeconds>,
    /// Every stretch on fixed GPUs: a preemption or a resize starts a new one.
    pub runs: Vec<Run>,
    pub outcome: Option<Outcome>,
    pub backfilled: bool,
    pub preemptions: u32,
    /// GPU-seconds of work redone after preemptions.
    pub lost_gpu_s: i64,
}

impl JobRecord {
    pub fn queue_wait_s(&self) -> Option<i64> {
        self.start_s.map(|s| s - self.spec.submit_s)
    }

    /// GPU-seconds held up to `horizon_s`.
    /// A share of a GPU counts as its fraction (rounded down once, over all the runs).
    pub fn gpu_seconds_until(&self, horizon_s: UnixSeconds) -> i64 {
        let unit_s: u64 = self
            .runs
            .iter()
            .map(|r| {
                let end = r.end_s.unwrap_or(horizon_s).min(horizon_s);
                r.share_units() * (end - r.start_s).max(0) as u64
            })
            .sum();
        (unit_s / u64::from(SHARE_UNITS_PER_GPU)) as i64
    }
}

/// Everything a simulation produced.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub options: SchedulerOptions,
    pub records: Vec<JobRecord>,
    pub refused: Vec<(JobSpec, Refusal)>,
    pub events: Vec<JobEvent>,
    /// (time, busy GPUs) at every change; a GPU held in shares counts the parts held.
    pub busy_gpus: Vec<(UnixSeconds, f64)>,
    /// (time, free GPUs that backfill plans hold for later starts) at every change: what a
    /// waiting job's planned start costs the cluster meanwhile (see
    /// [`Scheduler::planned_idle_gpus`]).
    pub planned_idle_gpus: Vec<(UnixSeconds, f64)>,
    pub total_gpus: u32,
    pub start_s: UnixSeconds,
    pub horizon_s: UnixSeconds,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wake {
    /// Done, failed or out of time, unless `generation` is stale.
    End { generation: u64 },
    /// A preempted job's process exits.
    Exit,
    /// Nothing ends, but a planned start or a reservation boundary comes due: run a cycle.
    Tick,
}

/// The simulator's view of a job that has started at least once.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// GPU-seconds of work still to do.
    left_gpu_s: i64,
    gpus: u32,
    /// When `left_gpu_s` was last brought up to date.
    since: UnixSeconds,
    run_start: UnixSeconds,
    /// Work done in this run up to `since`.
    done_in_run: i64,
    generation: u64,
}

struct Sim<'a> {
    jobs: &'a [SimJob],
    sched: Scheduler,
    index: HashMap<JobId, usize>,
    records: Vec<JobRecord>,
    progress: Vec<Progress>,
    events: Vec<JobEvent>,
    wakes: BinaryHeap<Reverse<(UnixSeconds, usize, Wake)>>,
    ticks: std::collections::BTreeSet<UnixSeconds>,
}

/// Runs `jobs` (in any order) until every job has ended, or until `horizon_s` when given.
/// `progress` is called with (jobs submitted so far, all jobs).
pub fn simulate(
    config: &ClusterConfig,
    options: SchedulerOptions,
    jobs: Vec<SimJob>,
    horizon_s: Option<UnixSeconds>,
    progress: &mut dyn FnMut(usize, usize),
) -> SimResult {
    let sched = Scheduler::new(config, options);
    run(sched, options, jobs, horizon_s, progress)
}

/// [`simulate`] with advance reservations in force from the start.
pub fn simulate_with_reservations(
    config: &ClusterConfig,
    options: SchedulerOptions,
    jobs: Vec<SimJob>,
    reservations: Vec<ReservationRequest>,
    horizon_s: Option<UnixSeconds>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult, ReservationError> {
    let mut sched = Scheduler::new(config, options);
    for r in reservations {
        sched.add_reservation(r)?;
    }
    Ok(run(sched, options, jobs, horizon_s, progress))
}

fn run(
    sched: Scheduler,
    options: SchedulerOptions,
    mut jobs: Vec<SimJob>,
    horizon_s: Option<UnixSeconds>,
    progress: &mut dyn FnMut(usize, usize),
) -> SimResult {
    jobs.sort_by(|a, b| (a.spec.submit_s, &a.spec.id).cmp(&(b.spec.submit_s, &b.spec.id)));
    let total_gpus = sched.cluster().total_gpus();
    let start_s = jobs.first().map(|j| j.spec.submit_s).unwrap_or(0);
    let mut sim = Sim {
        jobs: &jobs,
        sched,
        index: HashMap::with_capacity(jobs.len()),
        records: Vec::with_capacity(jobs.len()),
        progress: vec![Progress::default(); jobs.len()],
        events: Vec::with_capacity(jobs.len() * 3),
        wakes: BinaryHeap::new(),
        ticks: Default::default(),
    };
    let mut refused = Vec::new();
    let mut busy = vec![(start_s, 0.0)];
    let mut planned_idle = vec![(start_s, 0.0)];
    let mut next_submit = 0;
    let end_of_time = horizon_s.unwrap_or(UnixSeconds::MAX);

    loop {
        let t_submit = jobs.get(next_submit).map(|j| j.spec.submit_s);
        let t_wake = sim.wakes.peek().map(|Reverse((t, _, _))| *t);
        let now = match (t_submit, t_wake) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        if now > end_of_time {
            break;
        }
        while let Some(Reverse((t, _, _))) = sim.wakes.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, i, wake))) = sim.wakes.pop() else {
                break;
            };
            sim.wake(i, wake, now);
        }
        while next_submit < jobs.len() && jobs[next_submit].spec.submit_s == now {
            let job = &jobs[next_submit];
            sim.index.insert(job.spec.id.clone(), sim.records.len());
            sim.records.push(JobRecord {
                spec: job.spec.clone(),
                start_s: None,
                end_s: None,
                runs: Vec::new(),
                outcome: None,
                backfilled: false,
                preemptions: 0,
                lost_gpu_s: 0,
            });
            match sim.sched.submit(job.spec.clone()) {
                Ok(()) => {
                    let mut ev = event(&job.spec, now, JobEventKind::Submitted);
                    ev.gpus = Some(job.spec.gpus);
                    ev.partition = job.spec.partition.clone();
                    ev.time_limit_s = Some(job.spec.time_limit_s);
                    sim.events.push(ev);
                }
                Err(reason) => refused.push((job.spec.clone(), reason)),
            }
            next_submit += 1;
            if next_submit % 1024 == 0 {
                progress(next_submit, jobs.len());
            }
        }
        sim.sched.accrue_usage(now);
        let cycle = sim.sched.schedule(now);
        sim.apply(cycle, now);
        sim.plan_tick(now);
        let busy_now =
            sim.sched.cluster().held_share_units() as f64 / f64::from(SHARE_UNITS_PER_GPU);
        if busy.last().map(|(_, b)| *b) != Some(busy_now) {
            busy.push((now, busy_now));
        }
        let planned_now = f64::from(sim.sched.planned_idle_gpus().map(|(_, n)| n).sum::<u32>());
        if planned_idle.last().map(|(_, p)| *p) != Some(planned_now) {
            planned_idle.push((now, planned_now));
        }
    }
    progress(jobs.len(), jobs.len());
    let last = sim
        .records
        .iter()
        .filter_map(|r| r.end_s)
        .max()
        .unwrap_or(start_s);
    SimResult {
        options,
        records: sim.records,
        refused,
        events: sim.events,
        busy_gpus: busy,
        planned_idle_gpus: planned_idle,
        total_gpus,
        start_s,
        horizon_s: horizon_s.unwrap_or(last),
    }
}

impl Sim<'_> {
    /// Makes sure a cycle runs when the next planned start, wait threshold or reservation
    /// boundary comes, even if no job ends then (a live service runs cycles on a timer
    /// instead).
    fn plan_tick(&mut self, now: UnixSeconds) {
        let planned = self.sched.next_due(now);
        let boundary = self
            .sched
            .reservations()
            .boundaries()
            .into_iter()
            .filter(|t| *t > now)
            .min();
        for t in [planned, boundary].into_iter().flatten() {
            if self.ticks.insert(t) {
                self.wakes.push(Reverse((t, 0, Wake::Tick)));
            }
        }
    }

    fn wake(&mut self, i: usize, wake: Wake, now: UnixSeconds) {
        let job = &self.jobs[i];
        match wake {
            Wake::End { generation } => {
                if generation != self.progress[i].generation
                    || self.sched.running_job(&job.spec.id).is_none()
                {
                    return;
                }
                self.catch_up(i, now);
                self.sched.finish(&job.spec.id, now);
                let outcome = if self.progress[i].left_gpu_s <= 0 {
                    job.outcome
                } else {
                    Outcome::Timeout
                };
                self.close_run(i, now);
                let rec = &mut self.records[i];
                rec.end_s = Some(now);
                rec.outcome = Some(outcome);
                let mut ev = event(&job.spec, now, JobEventKind::Finished);
                ev.outcome = Some(outcome);
                ev.exit_code = Some(match outcome {
                    Outcome::Completed => 0,
                    Outcome::Timeout => 143,
                    _ => 1,
                });
                self.events.push(ev);
            }
            Wake::Tick => {
                self.ticks.remove(&now);
            }
            Wake::Exit => {
                let Some(running) = self.sched.running_job(&job.spec.id) else {
                    return;
                };
                let signal_s = running
                    .preempting
                    .as_ref()
                    .map(|p| p.signal_s)
                    .unwrap_or(now);
                let periodic = running.spec.checkpoint_every_s;
                self.catch_up(i, now);
                let p = &mut self.progress[i];
                // What survives: everything when it saved on SIGTERM in time, else the work up
                // to its last periodic checkpoint (work is taken as even over the run).
                let saved_on_signal = job
                    .checkpoint_save_s
                    .is_some_and(|s| signal_s + s as i64 <= now);
                let ran = (now - p.run_start).max(1);
                let kept = if saved_on_signal {
                    p.done_in_run
                } else {
                    let ckpt = periodic
                        .filter(|e| *e > 0)
                        .map(|e| (now - p.run_start) / e as i64 * e as i64)
                        .unwrap_or(0);
                    p.done_in_run * ckpt / ran
                };
                let lost = p.done_in_run - kept;
                p.left_gpu_s += lost;
                p.generation += 1;
                self.sched.requeue(&job.spec.id, now);
                self.close_run(i, now);
                let rec = &mut self.records[i];
                rec.preemptions += 1;
                rec.lost_gpu_s += lost;
                self.events
                    .push(event(&job.spec, now, JobEventKind::Preempted));
            }
        }
    }

    /// Brings a running job's work up to `now`.
    fn catch_up(&mut self, i: usize, now: UnixSeconds) {
        let p = &mut self.progress[i];
        let done = i64::from(p.gpus) * (now - p.since).max(0);
        p.left_gpu_s -= done;
        p.done_in_run += done;
        p.since = now;
    }

    /// Schedules the end of a running job: done, or out of time at its limit.
    fn plan_end(&mut self, i: usize) {
        let limit_end = self.progress[i].run_start + self.jobs[i].spec.time_limit_s as i64;
        let p = &mut self.progress[i];
        p.generation += 1;
        let done_at =
            p.since + (p.left_gpu_s.max(0) + i64::from(p.gpus) - 1) / i64::from(p.gpus.max(1));
        self.wakes.push(Reverse((
            done_at.min(limit_end),
            i,
            Wake::End {
                generation: p.generation,
            },
        )));
    }

    fn close_run(&mut self, i: usize, now: UnixSeconds) {
        if let Some(run) = self.records[i].runs.last_mut() {
            if run.end_s.is_none() {
                run.end_s = Some(now);
            }
        }
    }

    fn apply(&mut self, cycle: Cycle, now: UnixSeconds) {
        for resized in cycle.resized {
            let i = self.index[&resized.job_id];
            self.catch_up(i, now);
            self.close_run(i, now);
            self.records[i].runs.push(Run {
                start_s: now,
                end_s: None,
                allocation: resized.allocation.clone(),
                gpus: resized.gpus,
            });
            self.progress[i].gpus = resized.gpus;
            self.plan_end(i);
            let mut ev = event(&self.jobs[i].spec, now, JobEventKind::Resumed);
            ev.gpus = Some(resized.gpus);
            ev.allocation = Some(resized.allocation);
            self.events.push(ev);
        }
        for preemption in cycle.preempted {
            let i = self.index[&preemption.job_id];
            let exit_s = match self.jobs[i].checkpoint_save_s {
                Some(save) => (now + save as i64).min(preemption.kill_s),
                None => preemption.kill_s,
            };
            // It may still finish by itself before it exits: its end stays planned.
            self.wakes.push(Reverse((exit_s, i, Wake::Exit)));
        }
        for started in cycle.started {
            let i = self.index[&started.job_id];
            let job = &self.jobs[i];
            let first = self.records[i].start_s.is_none();
            let p = &mut self.progress[i];
            if first {
                p.left_gpu_s = job.run_time_s as i64 * i64::from(job.spec.gpus);
            }
            p.gpus = started.gpus;
            p.since = now;
            p.run_start = now;
            p.done_in_run = 0;
            self.plan_end(i);
            let kind = if first {
                JobEventKind::Started
            } else {
                JobEventKind::Resumed
            };
            let mut ev = event(&job.spec, now, kind);
            ev.gpus = Some(started.gpus);
            ev.allocation = Some(started.allocation.clone());
            self.events.push(ev);
            let rec = &mut self.records[i];
            if first {
                rec.start_s = Some(now);
                rec.backfilled = started.backfilled;
            }
            rec.runs.push(Run {
                start_s: now,
                end_s: None,
                allocation: started.allocation,
                gpus: started.gpus,
            });
        }
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
        self.utilization_between(self.start_s, self.horizon_s)
    }

    /// Busy GPU-seconds over all GPU-seconds in `[from, to)`.
    pub fn utilization_between(&self, from: UnixSeconds, to: UnixSeconds) -> f64 {
        self.share_of_capacity(&self.busy_gpus, from, to)
    }

    /// GPU-seconds free but held by backfill plans for later starts, over all GPU-seconds in
    /// `[from, to)`.
    pub fn planned_idle_between(&self, from: UnixSeconds, to: UnixSeconds) -> f64 {
        self.share_of_capacity(&self.planned_idle_gpus, from, to)
    }

    /// A step series of GPUs (each value holds until the next change, the last one until the
    /// horizon) over all GPU-seconds in `[from, to)`.
    fn share_of_capacity(
        &self,
        series: &[(UnixSeconds, f64)],
        from: UnixSeconds,
        to: UnixSeconds,
    ) -> f64 {
        let span = (to - from) as f64;
        if span <= 0.0 || self.total_gpus == 0 {
            return 0.0;
        }
        let mut gpu_s = 0.0;
        for (k, (t, v)) in series.iter().enumerate() {
            let next = series
                .get(k + 1)
                .map(|(t, _)| *t)
                .unwrap_or(self.horizon_s)
                .min(to);
            gpu_s += *v * (next - (*t).max(from)).max(0) as f64;
        }
        gpu_s / (span * f64::from(self.total_gpus))
    }
}
