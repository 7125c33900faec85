//! A seeded workload generator: each team submits jobs as a Poisson process (busier by day)
//! with its own mix of sizes and run times, plus fixed jobs such as a two-week pre-training run.
//! The same seed gives the same jobs on every machine.

use chrono::{DateTime, Timelike, Utc};
use serde::Deserialize;

use gpuledger_model::job::Outcome;
use gpuledger_model::rng::SplitMix64;
use gpuledger_model::{AccountId, DurationSpec, JobId, ProjectId};

use crate::core::JobSpec;
use crate::sim::SimJob;

/// The workload section of a demo or simulation file.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub seed: u64,
    pub start: DateTime<Utc>,
    pub days: u32,
    #[serde(default)]
    pub teams: Vec<TeamWorkload>,
    #[serde(default)]
    pub fixed_jobs: Vec<FixedJob>,
}

/// How one team submits.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamWorkload {
    pub account: AccountId,
    #[serde(default)]
    pub project: Option<ProjectId>,
    #[serde(default)]
    pub partition: Option<String>,
    pub jobs_per_day: f64,
    /// `[gpus, weight]` pairs.
    pub gpus: Vec<(u32, f64)>,
    /// Run times are log-uniform between these.
    pub run_time_min: DurationSpec,
    pub run_time_max: DurationSpec,
    /// Share of jobs that fail part-way.
    #[serde(default)]
    pub failure_rate: f64,
    /// How often the team's jobs checkpoint (what a preemption loses at most).
    #[serde(default)]
    pub checkpoint_every: Option<DurationSpec>,
}

/// A job submitted at a fixed time.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedJob {
    pub account: AccountId,
    #[serde(default)]
    pub project: Option<ProjectId>,
    #[serde(default)]
    pub partition: Option<String>,
    pub gpus: u32,
    /// When it is submitted, after the workload's start.
    pub submit_after: DurationSpec,
    pub run_time: DurationSpec,
    /// Defaults to the run time rounded up to the next hour.
    #[serde(default)]
    pub time_limit: Option<DurationSpec>,
    /// How often it checkpoints (what a preemption loses at most).
    #[serde(default)]
    pub checkpoint_every: Option<DurationSpec>,
    /// An elastic job's smallest size; it asks for `gpus` at most.
    #[serde(default)]
    pub min_gpus: Option<u32>,
}

/// A time limit as users ask for it: the run time rounded up to the next whole hour.
pub fn round_up_to_hour(run_time_s: u64) -> u64 {
    run_time_s.div_ceil(3600).max(1) * 3600
}

/// Busier by day: arrival rate multiplier by UTC hour (mean 1 over a day).
fn diurnal(hour: u32) -> f64 {
    if (8..20).contains(&hour) {
        1.5
    } else {
        0.5
    }
}

/// The most jobs a day one team may submit in a generated workload.
pub const MAX_JOBS_PER_DAY: f64 = 100_000.0;

impl WorkloadSpec {
    /// Values the generator cannot use as meant, as (field below `workload`, why): rates and
    /// weights that are not finite and non-negative, no size with weight, run times out of
    /// order, a share of failures outside 0-1, jobs of no GPUs or starting after the end.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, team) in self.teams.iter().enumerate() {
            let at = |f: &str| format!("teams[{i}].{f}");
            let rate = team.jobs_per_day;
            if !(rate.is_finite() && (0.0..=MAX_JOBS_PER_DAY).contains(&rate)) {
                out.push((
                    at("jobs_per_day"),
                    format!("{rate} is out of range; use 0 to {MAX_JOBS_PER_DAY}"),
                ));
            }
            let before = out.len();
            for (j, (gpus, weight)) in team.gpus.iter().enumerate() {
                if *gpus == 0 {
                    out.push((
                        at(&format!("gpus[{j}]")),
                        "a job needs at least 1 GPU".into(),
                    ));
                }
                if !(weight.is_finite() && *weight >= 0.0) {
                    out.push((
                        at(&format!("gpus[{j}]")),
                        format!("weight {weight} is not a non-negative number"),
                    ));
                }
            }
            let sizes_ok = out.len() == before;
            if sizes_ok && team.gpus.iter().map(|(_, w)| *w).sum::<f64>() <= 0.0 {
                out.push((at("gpus"), "no size has a weight above 0".into()));
            }
            if team.run_time_min.as_secs() == 0 {
                out.push((at("run_time_min"), "must be longer than 0s".into()));
            }
            if team.run_time_min > team.run_time_max {
                out.push((
                    at("run_time_max"),
                    format!(
                        "{} is shorter than run_time_min {}",
                        team.run_time_max, team.run_time_min
                    ),
                ));
            }
            if !(team.failure_rate.is_finite() && (0.0..=1.0).contains(&team.failure_rate)) {
                out.push((
                    at("failure_rate"),
                    format!("{} is out of range; use 0 to 1", team.failure_rate),
                ));
            }
        }
        let span = u64::from(self.days) * 86_400;
        for (i, job) in self.fixed_jobs.iter().enumerate() {
            let at = |f: &str| format!("fixed_jobs[{i}].{f}");
            if job.gpus == 0 {
                out.push((at("gpus"), "a job needs at least 1 GPU".into()));
            }
            if job.run_time.as_secs() == 0 {
                out.push((at("run_time"), "must be longer than 0s".into()));
            }
            if job.submit_after.as_secs() >= span {
                out.push((
                    at("submit_after"),
                    format!(
                        "{} is past the workload's {} days",
                        job.submit_after, self.days
                    ),
                ));
            }
        }
        out
    }

    pub fn start_s(&self) -> i64 {
        self.start.timestamp()
    }

    pub fn end_s(&self) -> i64 {
        self.start_s() + i64::from(self.days) * 86_400
    }

    /// All jobs, sorted by submission, with ids `1000001`, `1000002`, ...
    pub fn generate(&self) -> Vec<SimJob> {
        let mut rng = SplitMix64::new(self.seed);
        let mut drafts: Vec<(i64, SimJob)> = Vec::new();
        for fixed in &self.fixed_jobs {
            let run = fixed.run_time.as_secs();
            let submit = self.start_s() + fixed.submit_after.as_secs() as i64;
            let mut spec = draft_spec(
                &fixed.account,
                &fixed.project,
                &fixed.partition,
                fixed.gpus,
                fixed
                    .time_limit
                    .map(|d| d.as_secs())
                    .unwrap_or_else(|| round_up_to_hour(run)),
                submit,
            );
            spec.checkpoint_every_s = fixed.checkpoint_every.map(|d| d.as_secs());
            spec.min_gpus = fixed.min_gpus;
            drafts.push((
                submit,
                SimJob {
                    spec,
                    run_time_s: run,
                    outcome: Outcome::Completed,
                    checkpoint_save_s: None,
                },
            ));
        }
        for team in &self.teams {
            self.generate_team(team, &mut rng, &mut drafts);
        }
        drafts.sort_by_key(|(t, _)| *t);
        drafts
            .into_iter()
            .enumerate()
            .map(|(k, (_, mut job))| {
                job.spec.id = JobId::new(format!("{}", 1_000_001 + k)).unwrap_or(job.spec.id);
                job
            })
            .collect()
    }

    fn generate_team(
        &self,
        team: &TeamWorkload,
        rng: &mut SplitMix64,
        out: &mut Vec<(i64, SimJob)>,
    ) {
        if team.jobs_per_day <= 0.0 || team.gpus.is_empty() {
            return;
        }
        // Thinning: draw at the peak rate, keep each arrival with probability rate(t)/peak.
        let peak_rate_per_s = team.jobs_per_day * 1.5 / 86_400.0;
        let weights: Vec<f64> = team.gpus.iter().map(|(_, w)| *w).collect();
        let mut t = self.start_s() as f64;
        let end = self.end_s() as f64;
        loop {
            t += rng.exponential(1.0 / peak_rate_per_s);
            if t >= end {
                break;
            }
            let hour = DateTime::<Utc>::from_timestamp(t as i64, 0)
                .map(|d| d.hour())
                .unwrap_or(0);
            if rng.next_f64() * 1.5 > diurnal(hour) {
                continue;
            }
            let gpus = team.gpus[rng.weighted_index(&weights)].0;
            let planned = rng
                .log_uniform(
                    team.run_time_min.as_secs() as f64,
                    team.run_time_max.as_secs() as f64,
                )
                .round()
                .max(60.0) as u64;
            let fails = rng.next_f64() < team.failure_rate;
            let run_time_s = if fails {
                ((planned as f64) * rng.next_f64()).max(30.0) as u64
            } else {
                planned
            };
            let submit = t as i64;
            out.push((
                submit,
                SimJob {
                    spec: JobSpec {
                        checkpoint_every_s: team.checkpoint_every.map(|d| d.as_secs()),
                        ..draft_spec(
                            &team.account,
                            &team.project,
                            &team.partition,
                            gpus,
                            round_up_to_hour(planned),
                            submit,
                        )
                    },
                    run_time_s,
                    outcome: if fails {
                        Outcome::Failed
                    } else {
                        Outcome::Completed
                    },
                    checkpoint_save_s: None,
                },
            ));
        }
    }
}

fn draft_spec(
    account: &AccountId,
    project: &Option<ProjectId>,
    partition: &Option<String>,
    gpus: u32,
    time_limit_s: u64,
    submit_s: i64,
) -> JobSpec {
    JobSpec {
        id: JobId::new("draft").unwrap_or_else(|_| unreachable!()),
        account: account.clone(),
        project: project.clone(),
        partition: partition.clone(),
        gpus,
        time_limit_s,
        submit_s,
        min_gpus: None,
        grace_s: None,
        checkpoint_every_s: None,
        shape: Default::default(),
    }
}
