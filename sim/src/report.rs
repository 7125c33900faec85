//! A trace replay's report (`gpuledger simulate`): the jobs through the scheduler in virtual
//! time, then queueing, completion times, utilization and each tenant's share against its fair
//! share, as `jobs.csv`, `report.md` and SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use chrono::NaiveDate;
use rust_decimal::Decimal;

use gpuledger_model::config::{
    ClusterSection, FairShareConfig, NodePool, Partition, PriceBookConfig, SchedulerConfig,
};
use gpuledger_model::tenant::Account;
use gpuledger_model::{AccountId, ClusterConfig, Currency, DurationSpec, GpuModel, GpuType, Quota};
use gpuledger_scheduler::{SimJob, SimResult};

use crate::backlog::{Ahead, OwnBacklog, Service, Work};
use crate::fairness::reach::WeekShortfall;
use crate::fairness::{
    summarize, sweep, AccountWeek, Stretches, WeeklyFair, WeeklySummary, MIN_FAIR_GPU_S,
};
use crate::{Error, Result};

/// The fair-share weight of each account of a Philly trace: its VC's nodes (1 where the VC has
/// no row: no guaranteed share).
pub fn philly_weights(
    jobs: &[SimJob],
    vc_nodes: &BTreeMap<String, u32>,
) -> BTreeMap<AccountId, u32> {
    let mut weights = BTreeMap::new();
    for job in jobs {
        let vc = job.spec.account.as_str().trim_start_matches("vc-");
        let w = vc_nodes.get(vc).copied().unwrap_or(1).max(1);
        weights.insert(job.spec.account.clone(), w);
    }
    weights
}

/// Every account of a trace with the same weight (a trace that names no tenant sizes).
pub fn equal_weights(jobs: &[SimJob]) -> BTreeMap<AccountId, u32> {
    jobs.iter().map(|j| (j.spec.account.clone(), 1)).collect()
}

/// A cluster of `nodes` x 8 GPUs with one partition and an account per tenant of the trace,
/// weighted by `weights`. Fair share counts usage against one day of the whole cluster
/// (`usage_factor_gpu_hours`).
pub fn trace_cluster(nodes: u32, weights: &BTreeMap<AccountId, u32>) -> Result<ClusterConfig> {
    trace_cluster_of(&[(GpuModel::A100.into(), 8, nodes)], weights)
}

/// The model configured for a pool of a GPU type gpuledger has no model for (Alibaba's
/// undisclosed `G2`): a config's pools need one for prices and MFU, which a replay never
/// computes, so it is read nowhere; jobs tell such pools apart by their type alone.
const STAND_IN_FOR_UNRATED_TYPES: GpuModel = GpuModel::A100;

/// A trace's cluster of the pools `(GPU type, GPUs a node, nodes)` (a trace's own node list),
/// each named after its type and GPUs a node (`t4-x2`, nodes `t4-x2-001`, ...); a single pool
/// is `gpu`, nodes `node001`, ... as [`trace_cluster`] names them. A type that is not a
/// model's key is the pool's `gpu_type`.
pub fn trace_cluster_of(
    pools: &[(GpuType, u32, u32)],
    weights: &BTreeMap<AccountId, u32>,
) -> Result<ClusterConfig> {
    let total_gpus: u64 = pools
        .iter()
        .map(|(_, gpus, nodes)| u64::from(*gpus) * u64::from(*nodes))
        .sum();
    let accounts = weights
        .iter()
        .map(|(id, weight)| Account {
            run_as: None,
            id: id.clone(),
            name: format!("trace account {id}"),
            weight: *weight,
            quota: Quota::default(),
            projects: Vec::new(),
        })
        .collect::<Vec<_>>();
    let config = ClusterConfig {
        version: gpuledger_model::config::CONFIG_VERSION,
        cluster: ClusterSection {
            name: "trace".into(),
        },
        node_pools: pools
            .iter()
            .map(|(gpu_type, gpus, count)| NodePool {
                name: if pools.len() == 1 {
                    "gpu".into()
                } else {
                    format!("{gpu_type}-x{gpus}")
                },
                prefix: if pools.len() == 1 {
                    "node".into()
                } else {
                    format!("{gpu_type}-x{gpus}-")
                },
                count: *count,
                gpus_per_node: *gpus,
                gpu_model: gpu_type.model().unwrap_or(STAND_IN_FOR_UNRATED_TYPES),
                gpu_type: gpu_type.model().is_none().then(|| gpu_type.clone()),
                dedicated_to: None,
            })
            .collect(),
        partitions: vec![Partition {
            name: "default".into(),
            priority_tier: 1,
            max_time: None,
            default: true,
            grace_time: None,
            max_grace: None,
            allowed_accounts: None,
        }],
        fair_share: FairShareConfig {
            half_life: DurationSpec::from_secs(7 * 86_400),
            usage_factor_gpu_hours: total_gpus * 24,
            formula: Default::default(),
        },
        scheduler: SchedulerConfig::default(),
        prices: PriceBookConfig {
            version: "trace".into(),
            effective_from: NaiveDate::from_ymd_opt(2017, 1, 1).unwrap_or_default(),
            currency: Currency::Usd,
            gpu_hour: pools
                .iter()
                .map(|p| {
                    (
                        p.0.model().unwrap_or(STAND_IN_FOR_UNRATED_TYPES),
                        Decimal::ONE,
                    )
                })
                .collect(),
        },
        accounts,
        telemetry: Default::default(),
    };
    let errors = config.validate();
    if !errors.is_empty() {
        return Err(Error::Invalid(format!(
            "trace cluster is invalid: {errors:?}"
        )));
    }
    Ok(config)
}

/// A trace's cluster under another config's settings: its `[fair_share]` formula, half-life and
/// factor, its `[scheduler]` knobs, and the weights of the accounts both name.
pub fn apply_settings(trace: &mut ClusterConfig, settings: &ClusterConfig) {
    trace.fair_share = settings.fair_share.clone();
    trace.scheduler = settings.scheduler.clone();
    for account in &mut trace.accounts {
        if let Some(from) = settings.accounts.iter().find(|a| a.id == account.id) {
            account.weight = from.weight;
        }
    }
}

pub use gpuledger_model::stats::percentile;

/// Queueing and completion figures of a set of job records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaitStats {
    pub jobs: usize,
    pub started: usize,
    pub mean_wait_s: f64,
    pub p50_wait_s: i64,
    pub p99_wait_s: i64,
    pub mean_jct_s: f64,
    pub gpu_seconds: i64,
}

pub fn wait_stats<'a>(
    records: impl Iterator<Item = &'a gpuledger_scheduler::JobRecord>,
    horizon_s: i64,
) -> WaitStats {
    let mut waits = Vec::new();
    let mut jcts = Vec::new();
    let mut stats = WaitStats::default();
    for r in records {
        stats.jobs += 1;
        stats.gpu_seconds += r.gpu_seconds_until(horizon_s);
        if let Some(w) = r.queue_wait_s() {
            waits.push(w);
        }
        if let Some(end) = r.end_s {
            jcts.push(end - r.spec.submit_s);
        }
    }
    waits.sort_unstable();
    stats.started = waits.len();
    let mean = |v: &[i64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<i64>() as f64 / v.len() as f64
        }
    };
    stats.mean_wait_s = mean(&waits);
    stats.p50_wait_s = percentile(&waits, 50.0).unwrap_or(0);
    stats.p99_wait_s = percentile(&waits, 99.0).unwrap_or(0);
    stats.mean_jct_s = mean(&jcts);
    stats
}

/// The figures a replay is judged by (issue 22's goals): how long jobs waited, how busy the
/// cluster was, and how many account-weeks fell short of their fair share.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headline {
    pub mean_wait_s: f64,
    /// Jobs (refused ones left out) that waited more than 1, 3 and 7 days for their first
    /// start, to the horizon where they never started.
    pub over_1d: usize,
    pub over_3d: usize,
    pub over_7d: usize,
    /// Of those, the jobs that would still wait over 7 days were their account served from the
    /// run's start at its share plus a fifth of every other account's, its jobs in submission
    /// order ([`crate::backlog::shortest_waits`]): their account's jobs could not all have
    /// started within 7 days unless some other tenant was held below 0.8 of its share at some
    /// moment.
    pub over_7d_with_others_at_0_8: usize,
    pub longest_wait_s: i64,
    /// Busy share of the cluster from the first submission to the horizon.
    pub utilization: f64,
    /// Busy share from the first to the last submission, where every policy has work offered.
    pub window_utilization: f64,
    /// Share of the cluster free but held by backfill plans for later starts over the same
    /// window: what planned starts cost the cluster (a job that ends before one may still use
    /// its GPUs, none did).
    pub window_planned_idle: f64,
    /// Work preemptions threw away (GPU-seconds since each victim's last checkpoint, redone
    /// when it ran again) as a share of the cluster over the same window: busy GPUs that
    /// utilization counts but that did no lasting work.
    pub window_work_redone: f64,
    /// GPU-seconds free while some job waited, over the window's: on nodes where the smallest
    /// waiting job would fit, and on nodes too full for every waiting job ([`crate::idle`]).
    pub window_idle_fits: f64,
    pub window_idle_too_full: f64,
    /// Account-weeks with a fair share of at least [`MIN_FAIR_GPU_S`], and of those the ones
    /// that received under 0.5 and under 0.8 of it.
    pub account_weeks: usize,
    pub weeks_below_half: usize,
    pub weeks_below_0_8: usize,
    /// GPU-seconds the counted account-weeks fell short of half (0.8) of their fair shares, and
    /// of those the part no schedule that preempts nothing could have delivered
    /// ([`crate::fairness::reach`]).
    pub short_of_half_gpu_s: f64,
    pub short_of_half_out_of_reach_gpu_s: f64,
    pub short_of_0_8_gpu_s: f64,
    pub short_of_0_8_out_of_reach_gpu_s: f64,
    /// The weeks with some of 0.8 of the fair shares out of reach.
    pub weeks_0_8_out_of_reach: Vec<usize>,
}

/// [`Headline`] of a replay on `config`.
pub fn headline(config: &ClusterConfig, result: &SimResult) -> Headline {
    let weights = account_weights(config);
    let figures = FairFigures::of(result, &weights, false);
    let all = wait_stats(result.records.iter(), result.horizon_s);
    headline_with(
        config,
        result,
        &all,
        &figures.weeks,
        &summarize(&figures.weeks),
        &figures.over_at_0_8,
    )
}

/// What a replay's report reads off the fair split through the run, from one sweep of it.
struct FairFigures {
    /// Every account-week ([`crate::fairness::weekly_shares`]).
    weeks: Vec<AccountWeek>,
    /// Per record, whether it would still wait over a week were every other account held to
    /// 0.8 of its share ([`crate::backlog::shortest_waits`]).
    over_at_0_8: Vec<bool>,
    /// Per record, its own backlog ([`crate::backlog::own_backlogs`]) and the same as
    /// `over_at_0_8` at half; empty unless asked for.
    own: Vec<Option<OwnBacklog>>,
    over_at_half: Vec<bool>,
}

impl FairFigures {
    fn of(result: &SimResult, weights: &BTreeMap<String, u32>, with_backlogs: bool) -> Self {
        let work = Work::of(result, weights);
        let mut weekly = WeeklyFair::new(result, weights);
        let mut at_0_8 = Service::new(result, &work, 0.8, Ahead::FromStart);
        let mut backlogs = with_backlogs.then(|| {
            (
                Service::new(result, &work, 1.0, Ahead::AfterRunHeld),
                Service::new(result, &work, 0.5, Ahead::FromStart),
            )
        });
        let mut readers: Vec<&mut dyn Stretches> = vec![&mut weekly, &mut at_0_8];
        if let Some((own, at_half)) = backlogs.as_mut() {
            readers.push(own);
            readers.push(at_half);
        }
        sweep(result, weights, &mut readers);
        drop(readers);
        let (own, over_at_half) = match backlogs {
            Some((own, at_half)) => (own.finish(), over_a_week(result, &at_half.finish())),
            None => (Vec::new(), Vec::new()),
        };
        FairFigures {
            weeks: weekly.finish(),
            over_at_0_8: over_a_week(result, &at_0_8.finish()),
            own,
            over_at_half,
        }
    }
}

/// [`Headline`] from the replay's wait figures, weekly summary and own backlogs with every
/// other account at 0.8 ([`FairFigures`]), worked out once.
fn headline_with(
    config: &ClusterConfig,
    result: &SimResult,
    all: &WaitStats,
    weeks: &[AccountWeek],
    weekly: &BTreeMap<String, WeeklySummary>,
    over_at_0_8: &[bool],
) -> Headline {
    let weights = account_weights(config);
    let mut short_of = crate::fairness::reach::shortfalls_at(result, &weights, weeks, &[0.5, 0.8]);
    let at_0_8 = short_of.pop().unwrap_or_default();
    let half = short_of.pop().unwrap_or_default();
    let total = |weeks: &[WeekShortfall], f: fn(&WeekShortfall) -> f64| {
        weeks.iter().map(f).fold(0.0, |sum, x| sum + x)
    };
    let refused = crate::fairness::refused(result);
    let waits: Vec<i64> = result
        .records
        .iter()
        .filter(|r| !refused.contains(r.spec.id.as_str()))
        .map(|r| waited_s(r, result.horizon_s))
        .collect();
    let over = |days: i64| waits.iter().filter(|w| **w > days * 86_400).count();
    let last_submit = result
        .records
        .iter()
        .map(|r| r.spec.submit_s)
        .max()
        .unwrap_or(result.start_s);
    let idle = crate::idle::idle_while_waiting(config, result, result.start_s, last_submit);
    let of_capacity = |gpu_s: f64| share_of_window(result, last_submit, gpu_s);
    Headline {
        mean_wait_s: all.mean_wait_s,
        over_1d: over(1),
        over_3d: over(3),
        over_7d: over(7),
        over_7d_with_others_at_0_8: result
            .records
            .iter()
            .zip(over_at_0_8)
            .filter(|(r, long)| {
                **long
                    && !refused.contains(r.spec.id.as_str())
                    && waited_s(r, result.horizon_s) > crate::fairness::WEEK_S
            })
            .count(),
        longest_wait_s: waits.iter().copied().max().unwrap_or(0),
        utilization: result.utilization(),
        window_utilization: result.utilization_between(result.start_s, last_submit),
        window_planned_idle: result.planned_idle_between(result.start_s, last_submit),
        window_work_redone: redone_share(result, last_submit),
        window_idle_fits: of_capacity(idle.fits_gpu_s),
        window_idle_too_full: of_capacity(idle.too_full_gpu_s),
        account_weeks: weekly.values().map(|s| s.weeks).sum(),
        weeks_below_half: weekly.values().map(|s| s.below_half).sum(),
        weeks_below_0_8: weekly.values().map(|s| s.below_0_8).sum(),
        short_of_half_gpu_s: total(&half, |w| w.short_gpu_s),
        short_of_half_out_of_reach_gpu_s: total(&half, |w| w.out_of_reach_gpu_s),
        short_of_0_8_gpu_s: total(&at_0_8, |w| w.short_gpu_s),
        short_of_0_8_out_of_reach_gpu_s: total(&at_0_8, |w| w.out_of_reach_gpu_s),
        weeks_0_8_out_of_reach: at_0_8
            .iter()
            .filter(|w| w.out_of_reach_gpu_s >= 1.0)
            .map(|w| w.week)
            .collect(),
    }
}

/// GPU-seconds of work lost to preemptions over the cluster's GPU-seconds from the first to
/// the last submission.
fn redone_share(result: &SimResult, last_submit: i64) -> f64 {
    let lost: i64 = result.records.iter().map(|r| r.lost_gpu_s).sum();
    share_of_window(result, last_submit, lost as f64)
}

/// `gpu_s` over the cluster's GPU-seconds from the first to the last submission (0 for an
/// empty window).
fn share_of_window(result: &SimResult, last_submit: i64, gpu_s: f64) -> f64 {
    let capacity = f64::from(result.total_gpus) * (last_submit - result.start_s) as f64;
    if capacity > 0.0 {
        gpu_s / capacity
    } else {
        0.0
    }
}

/// Every stretch a job ran on fixed GPUs, one row each (a preempted, requeued or resized job
/// has several; `jobs.csv` has its first start and last end only): what holds each GPU when,
/// for per-node questions a job's row cannot answer. Times in seconds since the first
/// submission; `end` empty while running at the horizon; `allocation` as `node:gpus;...`.
fn runs_csv(result: &SimResult) -> String {
    let t0 = result.start_s;
    let mut csv = String::from("job_id,account,run,start,end,gpus,allocation\n");
    for r in &result.records {
        for (k, run) in r.runs.iter().enumerate() {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},\"{}\"",
                r.spec.id,
                r.spec.account,
                k + 1,
                run.start_s - t0,
                run.end_s.map(|e| (e - t0).to_string()).unwrap_or_default(),
                run.gpus,
                run.allocation
            );
        }
    }
    csv
}

/// Writes `jobs.csv` (times in seconds since the trace's first submission), `runs.csv` and
/// `report.md`.
pub fn write_outputs(out: &Path, config: &ClusterConfig, result: &SimResult) -> Result<String> {
    std::fs::create_dir_all(out).map_err(Error::io(format!("creating {}", out.display())))?;
    let t0 = result.start_s;
    let refused = crate::fairness::refused(result);
    let FairFigures {
        weeks,
        over_at_0_8,
        own: backlogs,
        over_at_half,
    } = FairFigures::of(result, &account_weights(config), true);
    let mut csv = String::from(
        "job_id,account,gpus,submit,start,end,wait_s,jct_s,outcome,backfilled,preemptions,lost_gpu_s,gpu_share,own_backlog_s\n",
    );
    for (r, backlog) in result.records.iter().zip(&backlogs) {
        let opt = |x: Option<i64>| x.map(|v| (v - t0).to_string()).unwrap_or_default();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.spec.id,
            r.spec.account,
            r.spec.gpus,
            r.spec.submit_s - t0,
            opt(r.start_s),
            opt(r.end_s),
            r.queue_wait_s().map(|w| w.to_string()).unwrap_or_default(),
            r.end_s
                .map(|e| (e - r.spec.submit_s).to_string())
                .unwrap_or_default(),
            r.outcome
                .map(|o| o.as_str())
                .unwrap_or(if refused.contains(r.spec.id.as_str()) {
                    "refused"
                } else {
                    ""
                }),
            r.backfilled,
            r.preemptions,
            r.lost_gpu_s,
            r.spec
                .shape
                .gpu_share
                .map(|s| s.to_string())
                .unwrap_or_default(),
            match backlog {
                Some(OwnBacklog::Served(s)) => s.to_string(),
                Some(OwnBacklog::BeyondHorizon) | None => String::new(),
            }
        );
    }
    let jobs_path = out.join("jobs.csv");
    std::fs::write(&jobs_path, csv)
        .map_err(Error::io(format!("writing {}", jobs_path.display())))?;
    let runs_path = out.join("runs.csv");
    std::fs::write(&runs_path, runs_csv(result))
        .map_err(Error::io(format!("writing {}", runs_path.display())))?;

    let all = wait_stats(result.records.iter(), result.horizon_s);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Simulation: {} on {} nodes ({} GPUs)\n",
        result.options.name(),
        config.nodes().len(),
        config.total_gpus()
    );
    let _ = writeln!(
        md,
        "| jobs | refused | mean wait s | p50 wait s | p99 wait s | mean JCT s | utilization |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let _ = writeln!(
        md,
        "| {} | {} | {:.0} | {} | {} | {:.0} | {:.1}% |\n",
        all.jobs,
        result.refused.len(),
        all.mean_wait_s,
        all.p50_wait_s,
        all.p99_wait_s,
        all.mean_jct_s,
        result.utilization() * 100.0
    );
    let summary = summarize(&weeks);
    let head = headline_with(config, result, &all, &weeks, &summary, &over_at_0_8);
    let _ = writeln!(
        md,
        "Jobs waiting more than 1 day: {}; 3 days: {}; 7 days: {}; the longest wait {:.1} days. \
         Utilization over the submission window (first to last submission): {:.1}%; free but \
         held for planned starts (backfill's reservations for waiting jobs): {:.2}%; free while \
         jobs waited, on nodes where the smallest waiting job would fit: {:.2}%, on nodes too \
         full for every waiting job: {:.2}%.\n",
        head.over_1d,
        head.over_3d,
        head.over_7d,
        head.longest_wait_s as f64 / 86_400.0,
        head.window_utilization * 100.0,
        head.window_planned_idle * 100.0,
        head.window_idle_fits * 100.0,
        head.window_idle_too_full * 100.0
    );
    let total_weight: u64 = config.accounts.iter().map(|a| u64::from(a.weight)).sum();
    let _ = writeln!(
        md,
        "| account | weight share | GPU-hours | received share | share while jobs wait | jobs | mean wait s | p99 wait s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let contended = contended_intervals(&result.records);
    let contended_total: i64 = result
        .records
        .iter()
        .map(|r| gpu_seconds_within(r, &contended))
        .sum();
    let mut by_account: BTreeMap<&str, Vec<&gpuledger_scheduler::JobRecord>> = BTreeMap::new();
    for r in &result.records {
        by_account
            .entry(r.spec.account.as_str())
            .or_default()
            .push(r);
    }
    for account in &config.accounts {
        let records = by_account
            .get(account.id.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let s = wait_stats(records.iter().copied(), result.horizon_s);
        let in_contention: i64 = records
            .iter()
            .map(|r| gpu_seconds_within(r, &contended))
            .sum();
        let share = |part: i64, whole: i64| {
            if whole > 0 {
                part as f64 * 100.0 / whole as f64
            } else {
                0.0
            }
        };
        let _ = writeln!(
            md,
            "| {} | {:.1}% | {:.0} | {:.1}% | {:.1}% | {} | {:.0} | {} |",
            account.id,
            f64::from(account.weight) * 100.0 / total_weight as f64,
            s.gpu_seconds as f64 / 3600.0,
            share(s.gpu_seconds, all.gpu_seconds),
            share(in_contention, contended_total),
            s.jobs,
            s.mean_wait_s,
            s.p99_wait_s
        );
    }
    weekly_section(out, config, &weeks, &summary, &head, &mut md)?;
    backlog_section(
        config,
        result,
        &refused,
        &backlogs,
        [&over_at_0_8, &over_at_half],
        &mut md,
    );
    let preemptions: u32 = result.records.iter().map(|r| r.preemptions).sum();
    let lost: i64 = result.records.iter().map(|r| r.lost_gpu_s).sum();
    let _ = writeln!(
        md,
        "\nPreemptions: {preemptions} ({:.0} GPU-hours of work redone).\n",
        lost as f64 / 3600.0
    );
    write_charts(out, config, result, &by_account)?;
    let _ = writeln!(
        md,
        "![GPUs in use over time](utilization.svg)\n\n![Queue wait by account](wait-by-account.svg)"
    );
    let report_path = out.join("report.md");
    std::fs::write(&report_path, &md)
        .map_err(Error::io(format!("writing {}", report_path.display())))?;
    Ok(md)
}

/// How long a job waited for its first start (to the horizon when it never started; a job
/// refused at submission never waited, and callers leave it out).
fn waited_s(r: &gpuledger_scheduler::JobRecord, horizon_s: i64) -> i64 {
    r.start_s.unwrap_or(horizon_s) - r.spec.submit_s
}

/// `weeks.csv` and the report's week-by-week fair share: per account, the weeks it had demand,
/// those below 0.5 and 0.8 of its fair share, its worst week.
fn weekly_section(
    out: &Path,
    config: &ClusterConfig,
    weeks: &[AccountWeek],
    summary: &BTreeMap<String, WeeklySummary>,
    head: &Headline,
    md: &mut String,
) -> Result<()> {
    let mut csv = String::from("account,week,fair_gpu_hours,received_gpu_hours,ratio\n");
    for w in weeks
        .iter()
        .filter(|w| w.fair_gpu_s > 0.0 || w.received_gpu_s > 0.0)
    {
        let _ = writeln!(
            csv,
            "{},{},{:.2},{:.2},{}",
            w.account,
            w.week,
            w.fair_gpu_s / 3600.0,
            w.received_gpu_s / 3600.0,
            w.ratio().map(|r| format!("{r:.3}")).unwrap_or_default(),
        );
    }
    let path = out.join("weeks.csv");
    std::fs::write(&path, csv).map_err(Error::io(format!("writing {}", path.display())))?;
    let total_weight: u64 = config.accounts.iter().map(|a| u64::from(a.weight)).sum();
    let _ = writeln!(
        md,
        "## Fair share week by week\n\n\
         Each moment the cluster is split by weight among the accounts with running or waiting \
         work, none given more than it asks for; a week's fair share is that split summed over \
         the week (weeks from the first submission), against the GPU-hours the account held. \
         Weeks with a fair share under {:.0} GPU-hours are counted apart (`weeks.csv` has every \
         one).\n",
        MIN_FAIR_GPU_S / 3600.0
    );
    let _ = writeln!(
        md,
        "| account | weight share | weeks with demand | below 0.5 | below 0.8 | at least 0.8 | worst week (ratio) | small weeks |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for account in &config.accounts {
        let s = summary
            .get(account.id.as_str())
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {:.1}% | {} | {} | {} | {} | {} | {} |",
            account.id,
            f64::from(account.weight) * 100.0 / total_weight.max(1) as f64,
            s.weeks,
            s.below_half,
            s.below_0_8,
            percent_of(s.weeks - s.below_0_8, s.weeks),
            s.worst
                .map(|(week, r)| format!("{week} ({r:.2})"))
                .unwrap_or_else(|| "-".into()),
            s.small_weeks
        );
    }
    let _ = writeln!(
        md,
        "\nAll accounts: {} account-weeks with demand, {} below 0.5 of the fair share, {} below 0.8 ({} at least 0.8).\n",
        head.account_weeks,
        head.weeks_below_half,
        head.weeks_below_0_8,
        percent_of(head.account_weeks - head.weeks_below_0_8, head.account_weeks)
    );
    if head.short_of_0_8_gpu_s <= 0.0 {
        let _ = writeln!(md, "No account-week fell short of 0.8 of its fair share.\n");
        return Ok(());
    }
    let weeks_named = |weeks: &[usize]| match weeks {
        [] => "in no week".to_string(),
        [one] => format!("week {one}"),
        _ => {
            let named: Vec<String> = weeks.iter().map(|w| w.to_string()).collect();
            format!("weeks {}", named.join(", "))
        }
    };
    let _ = writeln!(
        md,
        "The weeks below 0.8 of their fair shares were short of it by {:.0} GPU-hours in all, \
         {:.0} of them ({}) out of reach without preemption ({}); below half, {:.0} \
         GPU-hours short, {:.0} out of reach. A job started while no other waited took GPUs \
         nobody else asked for, and without preemption it keeps them until it ends; with what \
         was left (each account up to what it asked at each moment, any GPU to any job) not \
         every account could have had its 0.8 (half): that part no later choice of starts, \
         and no GPU left idle less, could have given. The rest is not shown reachable: the \
         bound ignores node boundaries and counts a job started while other work waited as \
         movable, though without preemption it too holds its GPUs to its end.\n",
        head.short_of_0_8_gpu_s / 3600.0,
        head.short_of_0_8_out_of_reach_gpu_s / 3600.0,
        percent_of_f(
            head.short_of_0_8_out_of_reach_gpu_s,
            head.short_of_0_8_gpu_s
        ),
        weeks_named(&head.weeks_0_8_out_of_reach),
        head.short_of_half_gpu_s / 3600.0,
        head.short_of_half_out_of_reach_gpu_s / 3600.0,
    );
    Ok(())
}

/// The accounts' fair-share weights, by account id.
fn account_weights(config: &ClusterConfig) -> BTreeMap<String, u32> {
    config
        .accounts
        .iter()
        .map(|a| (a.id.to_string(), a.weight))
        .collect()
}

/// The report's long waits set against each job's own backlog ([`crate::backlog`]): how many
/// waited over a week because their account had more than a week of its own work ahead at its
/// fair share, how many still would with every other account giving up a fifth or half of its
/// share ([`crate::backlog::shortest_waits`]), and how long any job waited beyond its own backlog.
fn backlog_section(
    config: &ClusterConfig,
    result: &SimResult,
    refused: &std::collections::HashSet<&str>,
    backlogs: &[Option<OwnBacklog>],
    [over_at_0_8, over_at_half]: [&[bool]; 2],
    md: &mut String,
) {
    use crate::fairness::WEEK_S as WEEK;
    let horizon = result.horizon_s;
    let beyond = |r: &gpuledger_scheduler::JobRecord, b: &Option<OwnBacklog>| -> i64 {
        match b {
            Some(OwnBacklog::Served(s)) => (waited_s(r, horizon) - s).max(0),
            Some(OwnBacklog::BeyondHorizon) => 0,
            None => waited_s(r, horizon),
        }
    };
    let own_week = |r: &gpuledger_scheduler::JobRecord, b: &Option<OwnBacklog>| {
        b.is_some_and(|b| b.longer_than(WEEK, r.spec.submit_s, horizon))
    };
    let jobs: Vec<_> = result
        .records
        .iter()
        .zip(backlogs)
        .enumerate()
        .filter(|(_, (r, _))| !refused.contains(r.spec.id.as_str()))
        .map(|(i, (r, b))| (r, b, over_at_0_8[i], over_at_half[i]))
        .collect();
    let long: Vec<_> = jobs
        .iter()
        .filter(|(r, ..)| waited_s(r, horizon) > WEEK)
        .collect();
    let beyond_over = |days: i64| {
        jobs.iter()
            .filter(|(r, b, ..)| beyond(r, b) > days * 86_400)
            .count()
    };
    let longest_beyond = jobs
        .iter()
        .map(|(r, b, ..)| (beyond(r, b), r.spec.id.as_str(), r.spec.account.as_str()))
        .max_by_key(|x| x.0);
    let _ = writeln!(
        md,
        "## Long waits and each account's own backlog\n\n\
         A job's own backlog (`own_backlog_s` in `jobs.csv`; empty when not served by the end) is \
         how long its account's fair share, as split above, took from its submission to deliver \
         the work the account had submitted before it and not yet done: a wait that long only \
         more than the account's share could have shortened. The rest of a wait is the wait \
         beyond the own backlog. Served instead from the run's start at its share plus a fifth \
         (half) of every other account's, its jobs in submission order, a job that still waits \
         over 7 days shows that, for this run's demand and work, its account's jobs could not \
         all have started within 7 days unless some other tenant was held below 0.8 (0.5) of \
         its share at some moment.\n"
    );
    let _ = writeln!(
        md,
        "Jobs waiting more than 7 days: {}, of which {} had more than 7 days of their account's \
         own backlog ahead; {} even with every other account at 0.8 of its share, {} at half. \
         Jobs waiting beyond their own backlog by more than 1 day: {}; 3 days: {}; 7 days: {}; \
         the longest {}.\n",
        long.len(),
        long.iter().filter(|(r, b, ..)| own_week(r, b)).count(),
        long.iter().filter(|(.., at_0_8, _)| *at_0_8).count(),
        long.iter().filter(|(.., at_half)| *at_half).count(),
        beyond_over(1),
        beyond_over(3),
        beyond_over(7),
        longest_beyond
            .filter(|x| x.0 > 0)
            .map(|(s, id, account)| format!("{} ({id}, {account})", span(s)))
            .unwrap_or_else(|| "0 s".into())
    );
    if long.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "| account | jobs waiting over 7 days | with over 7 days of own backlog | the same, others at 0.8 / 0.5 of their share | longest wait, days | longest beyond own backlog, days |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for account in &config.accounts {
        let long_of_mine: Vec<_> = long
            .iter()
            .filter(|(r, ..)| r.spec.account == account.id)
            .collect();
        if long_of_mine.is_empty() {
            continue;
        }
        let mine = || jobs.iter().filter(|(r, ..)| r.spec.account == account.id);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} / {} | {:.1} | {:.1} |",
            account.id,
            long_of_mine.len(),
            long_of_mine
                .iter()
                .filter(|(r, b, ..)| own_week(r, b))
                .count(),
            long_of_mine
                .iter()
                .filter(|(.., at_0_8, _)| *at_0_8)
                .count(),
            long_of_mine.iter().filter(|(.., at_half)| *at_half).count(),
            mine()
                .map(|(r, ..)| waited_s(r, horizon))
                .max()
                .unwrap_or(0) as f64
                / 86_400.0,
            mine().map(|(r, b, ..)| beyond(r, b)).max().unwrap_or(0) as f64 / 86_400.0,
        );
    }
    let _ = writeln!(md);
}

/// Per record, whether its wait for its account's service (the
/// [`crate::backlog::shortest_waits`] with every other account held to some fraction of its
/// share) is over a week.
fn over_a_week(result: &SimResult, waits: &[Option<OwnBacklog>]) -> Vec<bool> {
    waits
        .iter()
        .zip(&result.records)
        .map(|(b, r)| {
            b.is_some_and(|b| {
                b.longer_than(crate::fairness::WEEK_S, r.spec.submit_s, result.horizon_s)
            })
        })
        .collect()
}

/// A wait in words: seconds under an hour, hours under a day, days beyond.
fn span(seconds: i64) -> String {
    match seconds {
        s if s < 3_600 => format!("{s} s"),
        s if s < 86_400 => format!("{:.1} hours", s as f64 / 3_600.0),
        s => format!("{:.1} days", s as f64 / 86_400.0),
    }
}

/// `part` of `whole` as a whole percentage, `-` of nothing.
fn percent_of_f(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0}%", part * 100.0 / whole)
    } else {
        "-".into()
    }
}

fn percent_of(part: usize, whole: usize) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Busy share of the cluster, averaged per hour, as `(days since start, share)`.
pub fn hourly_utilization(result: &SimResult) -> Vec<(f64, f64)> {
    let (start, end) = (result.start_s, result.horizon_s.max(result.start_s + 1));
    let total = f64::from(result.total_gpus.max(1));
    let mut out = Vec::new();
    let mut k = 0;
    let mut hour = start;
    while hour < end {
        let next = (hour + 3600).min(end);
        let mut busy_s = 0.0;
        while k + 1 < result.busy_gpus.len() && result.busy_gpus[k + 1].0 <= hour {
            k += 1;
        }
        let mut j = k;
        while j < result.busy_gpus.len() && result.busy_gpus[j].0 < next {
            let from = result.busy_gpus[j].0.max(hour);
            let to = result
                .busy_gpus
                .get(j + 1)
                .map(|b| b.0)
                .unwrap_or(end)
                .min(next);
            busy_s += result.busy_gpus[j].1 * (to - from).max(0) as f64;
            j += 1;
        }
        out.push((
            (hour - start) as f64 / 86_400.0,
            busy_s / (total * (next - hour) as f64),
        ));
        hour = next;
    }
    out
}

fn write_charts(
    out: &Path,
    config: &ClusterConfig,
    result: &SimResult,
    by_account: &BTreeMap<&str, Vec<&gpuledger_scheduler::JobRecord>>,
) -> Result<()> {
    let util = gpuledger_charts::line_chart(
        &format!(
            "GPUs in use, hourly mean ({}, {} GPUs)",
            result.options.name(),
            result.total_gpus
        ),
        "share of GPUs",
        "days since the first submission",
        &hourly_utilization(result),
        1.0,
    );
    let waits: Vec<(String, f64, f64)> = config
        .accounts
        .iter()
        .map(|a| {
            let records = by_account
                .get(a.id.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let s = wait_stats(records.iter().copied(), result.horizon_s);
            (
                a.id.as_str().trim_start_matches("vc-").to_owned(),
                s.mean_wait_s / 3600.0,
                s.p99_wait_s as f64 / 3600.0,
            )
        })
        .collect();
    let wait = gpuledger_charts::paired_bars(
        "Queue wait by account (hours)",
        "hours",
        ("mean", "p99"),
        &waits,
    );
    for (name, svg) in [("utilization.svg", util), ("wait-by-account.svg", wait)] {
        let path = out.join(name);
        std::fs::write(&path, svg.into_string())
            .map_err(Error::io(format!("writing {}", path.display())))?;
    }
    Ok(())
}

/// The times when at least one job was waiting (before its first start, or between runs after a
/// preemption), merged: when the cluster is contended, the shares it hands out are what fair
/// share decides.
pub fn contended_intervals(records: &[gpuledger_scheduler::JobRecord]) -> Vec<(i64, i64)> {
    let mut waits: Vec<(i64, i64)> = Vec::new();
    for r in records {
        let mut from = r.spec.submit_s;
        for run in &r.runs {
            if run.start_s > from {
                waits.push((from, run.start_s));
            }
            from = run.end_s.unwrap_or(i64::MAX);
        }
    }
    waits.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (a, b) in waits {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// GPU-seconds a job held inside `intervals` (sorted, disjoint).
pub fn gpu_seconds_within(
    record: &gpuledger_scheduler::JobRecord,
    intervals: &[(i64, i64)],
) -> i64 {
    let mut unit_s: i64 = 0;
    for run in &record.runs {
        let (start, end) = (run.start_s, run.end_s.unwrap_or(i64::MAX));
        let first = intervals.partition_point(|iv| iv.1 <= start);
        let units = run.share_units() as i64;
        for iv in &intervals[first..] {
            if iv.0 >= end {
                break;
            }
            unit_s += units * (end.min(iv.1) - start.max(iv.0)).max(0);
        }
    }
    unit_s / i64::from(gpuledger_model::SHARE_UNITS_PER_GPU)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_records::{record, replay};

    #[test]
    fn contention_is_when_some_job_waits_and_shares_are_counted_inside_it() {
        let records = vec![
            record("1", "a", 8, 0, &[(0, 100)]),
            record("2", "a", 4, 10, &[(100, 200)]),
            // Preempted at 160, back at 170.
            record("3", "a", 2, 150, &[(150, 160), (170, 200)]),
        ];
        let contended = contended_intervals(&records);
        assert_eq!(contended, vec![(10, 100), (160, 170)]);
        let within: Vec<i64> = records
            .iter()
            .map(|r| gpu_seconds_within(r, &contended))
            .collect();
        assert_eq!(within, vec![8 * 90, 4 * 10, 0]);
    }

    #[test]
    fn work_redone_is_what_preemptions_lost_over_the_window_capacity() {
        let mut preempted = record("1", "a", 4, 0, &[(0, 500), (600, 1_200)]);
        // It had checkpointed at 300: 200 s of its 4 GPUs were lost at 500.
        preempted.lost_gpu_s = 4 * 200;
        let records = vec![preempted, record("2", "b", 2, 1_000, &[(1_000, 2_000)])];
        let result = replay(records, Vec::new(), 8, 2_000);
        // The window runs from the first submission (0) to the last (1,000): 8,000 GPU-s.
        assert_eq!(redone_share(&result, 1_000), 800.0 / 8_000.0);
        let clean = replay(
            vec![record("1", "a", 4, 0, &[(0, 500)])],
            Vec::new(),
            8,
            500,
        );
        assert_eq!(
            redone_share(&clean, 0),
            0.0,
            "an empty window divides by nothing"
        );
        assert_eq!(redone_share(&clean, 500), 0.0);
    }

    #[test]
    fn runs_csv_has_a_row_for_every_stretch_a_job_ran() {
        let mut preempted = record("1", "a", 4, 100, &[(100, 500), (600, 1_200)]);
        preempted.runs[0].allocation = "n1:0-3".parse().unwrap();
        preempted.runs[1].allocation = "n1:0-1;n2:0,5".parse().unwrap();
        let mut running = record("2", "b", 2, 1_000, &[(1_000, 2_000)]);
        running.runs[0].end_s = None;
        let mut result = replay(vec![preempted, running], Vec::new(), 8, 2_000);
        result.start_s = 100;
        assert_eq!(
            runs_csv(&result),
            "job_id,account,run,start,end,gpus,allocation\n\
             1,a,1,0,400,4,\"n1:0-3\"\n\
             1,a,2,500,1100,4,\"n1:0-1;n2:0,5\"\n\
             2,b,1,900,,2,\"\"\n"
        );
    }
}
