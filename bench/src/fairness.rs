//! `gpuledger bench fairness`: a policy against a baseline on variants of a trace at several
//! offered loads (issue 22's goals, judged on held-out traces "at several loads"). Each
//! variant ([`gpuledger_sim::variants`]) is replayed on the cluster that gives it each load,
//! under the policy and under the baseline (fifo+backfill), and the figures the goals name are
//! set side by side: jobs waiting more than 7 days, the longest wait, account-weeks under 0.5
//! and 0.8 of their fair share, the mean wait as a share of the baseline's, and utilization
//! over the submission window against the baseline's, with where it went: GPUs held for
//! planned starts, work redone after preemptions, GPUs free on nodes too full for every
//! waiting job. The sum over every run is the line to compare changes by; one trace at one
//! load is not.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context};
use gpuledger_model::{ClusterConfig, DurationSpec};
use gpuledger_scheduler::trace::LimitEstimate;
use gpuledger_scheduler::{SchedulerOptions, SimJob};
use gpuledger_sim::replay::{trace_replay, Text, TraceFiles};
use gpuledger_sim::report::{apply_settings, headline, trace_cluster, write_outputs, Headline};
use gpuledger_sim::variants::{nodes_for_load, vary, Variant};

/// Nodes of the replayed cluster have this many GPUs ([`trace_cluster`]).
const GPUS_PER_NODE: u32 = 8;

/// What `gpuledger bench fairness` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct FairnessArgs {
    /// A trace `gpuledger simulate --trace` reads (Philly's jobs, or Alibaba's pods on nodes
    /// of 8 GPUs).
    #[arg(long)]
    pub trace: PathBuf,
    /// A Philly trace's VC sizes (its fair-share weights).
    #[arg(long)]
    pub vc_nodes: Option<PathBuf>,
    /// Offered loads: the trace's GPU-seconds over the capacity between its first and last
    /// submission; each gives the cluster its node count.
    #[arg(long, value_delimiter = ',', default_value = "0.73,0.79,0.86")]
    pub loads: Vec<f64>,
    /// Variants of the trace: `as-is`, `shift:SEED` (each tenant's submissions moved by its own
    /// offset within 3 days either way), `drop:SEED` (a tenth of the jobs left out).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "shift:1,shift:2,shift:3,drop:1,drop:2,drop:3"
    )]
    pub variants: Vec<Variant>,
    /// Cluster config whose `[fair_share]`, `[scheduler]` and weights the policy runs under
    /// (as `simulate --config`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long, default_value = "fairshare+backfill")]
    pub policy: String,
    /// What the policy is measured against, on the trace's own cluster settings.
    #[arg(long, default_value = "fifo+backfill")]
    pub against: String,
    /// Time limits from true run times: exact, hour or double.
    #[arg(long, default_value = "hour")]
    pub limit_estimate: String,
    /// Every job checkpoints this often by itself (`"1h"`): what a preemption loses is the
    /// work since its last checkpoint. Absent: as the trace says (Philly's jobs never do, and
    /// a preempted one redoes all its run).
    #[arg(long)]
    pub checkpoint_every: Option<DurationSpec>,
    /// Every job saves a checkpoint within this long of its preemption signal (`"2m"`), losing
    /// nothing when its grace is longer. Absent: as the trace says.
    #[arg(long)]
    pub checkpoint_save: Option<DurationSpec>,
    /// Replays run at once (the machine's cores when absent).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write each replay's `report.md`, `jobs.csv`, `runs.csv` and `weeks.csv` (as
    /// `simulate` writes them) under this directory, in `VARIANT-LOAD-POLICY/` (the baseline's
    /// with `-baseline` added where it is the policy itself).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One variant at one load: the cluster and the jobs.
struct Case {
    variant: Variant,
    load: f64,
    nodes: u32,
    jobs: Vec<SimJob>,
    base: ClusterConfig,
}

/// The policy's and the baseline's figures on one case.
struct Row {
    variant: Variant,
    load: f64,
    nodes: u32,
    policy: Headline,
    against: Headline,
}

/// Runs the replays and returns the table.
pub fn run(args: &FairnessArgs) -> anyhow::Result<String> {
    let started = Instant::now();
    let rows = measure(args)?;
    Ok(table(args, &rows, started.elapsed().as_secs_f64()))
}

/// Each case's figures under the policy and the baseline, in variant then load order.
fn measure(args: &FairnessArgs) -> anyhow::Result<Vec<Row>> {
    if let Some(load) = args.loads.iter().find(|l| !(**l > 0.0 && **l <= 2.0)) {
        bail!("--loads: {load} is not an offered load in (0, 2]");
    }
    let parse_policy = |name: &str, flag: &str| {
        SchedulerOptions::parse(name).with_context(|| {
            format!("{flag} `{name}`: use fifo or fairshare, optionally with +backfill or +conservative")
        })
    };
    let policy = parse_policy(&args.policy, "--policy")?;
    let against = parse_policy(&args.against, "--against")?;
    let estimate = LimitEstimate::parse(&args.limit_estimate).with_context(|| {
        format!(
            "--limit-estimate `{}`: use exact, hour or double",
            args.limit_estimate
        )
    })?;
    let settings = args
        .config
        .as_deref()
        .map(|p| gpuledger_sim::seed::load_cluster(Some(p)))
        .transpose()?;
    let cases = cases(args, estimate)?;
    let started = Instant::now();
    let runs: Vec<(usize, bool)> = (0..cases.len())
        .flat_map(|i| [(i, true), (i, false)])
        .collect();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, runs.len().max(1));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<anyhow::Result<Headline>>>> =
        Mutex::new(runs.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(i, is_policy)) = runs.get(k) else {
                    break;
                };
                let case = &cases[i];
                let mut config = case.base.clone();
                if let (true, Some(settings)) = (is_policy, &settings) {
                    apply_settings(&mut config, settings);
                }
                let options = if is_policy { policy } else { against };
                let result = gpuledger_scheduler::simulate(
                    &config,
                    options,
                    case.jobs.clone(),
                    None,
                    &mut |_, _| {},
                );
                let figures = headline(&config, &result);
                let written = match &args.out {
                    Some(out) => {
                        // The baseline apart from the policy where both have one name.
                        let role = if is_policy || policy != against {
                            ""
                        } else {
                            "-baseline"
                        };
                        let dir = out.join(format!(
                            "{}-{}-{}{role}",
                            case.variant.to_string().replace(':', ""),
                            case.load,
                            options.name()
                        ));
                        write_outputs(&dir, &config, &result)
                            .with_context(|| format!("writing {}", dir.display()))
                            .map(|_| ())
                    }
                    None => Ok(()),
                };
                eprintln!(
                    "{} at {} ({} nodes), {}: done at {:.0} s",
                    case.variant,
                    case.load,
                    case.nodes,
                    options.name(),
                    started.elapsed().as_secs_f64()
                );
                if let Ok(mut done) = done.lock() {
                    done[k] = Some(written.map(|()| figures));
                }
            });
        }
    });
    let mut done = done
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a replay panicked"))?;
    cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let mut take = |k: usize| done[k].take().context("a replay did not finish")?;
            Ok(Row {
                variant: case.variant,
                load: case.load,
                nodes: case.nodes,
                policy: take(2 * i)?,
                against: take(2 * i + 1)?,
            })
        })
        .collect()
}

/// Every variant at every load, the trace read once.
fn cases(args: &FairnessArgs, estimate: LimitEstimate) -> anyhow::Result<Vec<Case>> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let text = read(&args.trace)?;
    let origin = args.trace.display().to_string();
    let vc = args
        .vc_nodes
        .as_ref()
        .map(|p| Ok::<_, anyhow::Error>((read(p)?, p.display().to_string())))
        .transpose()?;
    let replay = trace_replay(TraceFiles {
        trace: Text {
            text: &text,
            origin: &origin,
        },
        vc_nodes: vc.as_ref().map(|(text, origin)| Text { text, origin }),
        node_list: None,
        nodes: Some(1),
        estimate,
    })?;
    let weights = replay
        .config
        .accounts
        .iter()
        .map(|a| (a.id.clone(), a.weight))
        .collect();
    let mut jobs = replay.jobs;
    for job in &mut jobs {
        if let Some(every) = args.checkpoint_every {
            job.spec.checkpoint_every_s = Some(every.as_secs());
        }
        if let Some(save) = args.checkpoint_save {
            job.checkpoint_save_s = Some(save.as_secs());
        }
    }
    let mut cases = Vec::new();
    for &variant in &args.variants {
        let jobs = vary(&jobs, variant);
        for &load in &args.loads {
            let nodes = nodes_for_load(&jobs, GPUS_PER_NODE, load);
            cases.push(Case {
                variant,
                load,
                nodes,
                jobs: jobs.clone(),
                base: trace_cluster(nodes, &weights)?,
            });
        }
    }
    Ok(cases)
}

/// Account-weeks at 0.8 of their fair share or more, as a percentage.
fn weeks_at_0_8(h: &Headline) -> f64 {
    if h.account_weeks == 0 {
        return 100.0;
    }
    (h.account_weeks - h.weeks_below_0_8) as f64 * 100.0 / h.account_weeks as f64
}

/// The part of the weeks' shortfall against 0.8 of the fair shares that was out of reach
/// without preemption ([`Headline::short_of_0_8_out_of_reach_gpu_s`]), as a percentage; 0 where
/// nothing fell short.
fn out_of_reach(short_gpu_s: f64, out_of_reach_gpu_s: f64) -> f64 {
    if short_gpu_s > 0.0 {
        out_of_reach_gpu_s * 100.0 / short_gpu_s
    } else {
        0.0
    }
}

/// The policy's figures, or the baseline's.
fn side(row: &Row, policy: bool) -> &Headline {
    if policy {
        &row.policy
    } else {
        &row.against
    }
}

fn share_out_of_reach(h: &Headline) -> f64 {
    out_of_reach(h.short_of_0_8_gpu_s, h.short_of_0_8_out_of_reach_gpu_s)
}

/// The mean wait as a share of the baseline's (1 where the baseline waited nothing).
fn mean_wait_ratio(row: &Row) -> f64 {
    if row.against.mean_wait_s > 0.0 {
        row.policy.mean_wait_s / row.against.mean_wait_s
    } else if row.policy.mean_wait_s > 0.0 {
        f64::INFINITY
    } else {
        1.0
    }
}

/// Window utilization against the baseline's, in percentage points.
fn window_gap(row: &Row) -> f64 {
    (row.policy.window_utilization - row.against.window_utilization) * 100.0
}

const DAY_S: f64 = 86_400.0;

/// The goal issue 22 sets for the mean wait against fifo+backfill's.
const MEAN_WAIT_GOAL: f64 = 0.25;

/// What the jobs were told of checkpoints, for the table's title.
fn checkpoints(args: &FairnessArgs) -> String {
    let mut said = String::new();
    if let Some(every) = args.checkpoint_every {
        let _ = write!(said, ", every job checkpointing every {every}");
    }
    if let Some(save) = args.checkpoint_save {
        let _ = write!(said, ", saving within {save} of its signal");
    }
    said
}

fn table(args: &FairnessArgs, rows: &[Row], seconds: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} against {} on {} ({} variants x {} loads, limits `{}`{}), in {seconds:.0} s; \
         the baseline's figure in brackets\n",
        args.policy,
        args.against,
        args.trace.display(),
        args.variants.len(),
        args.loads.len(),
        args.limit_estimate,
        checkpoints(args),
    );
    let _ = writeln!(
        out,
        "| variant | load | nodes | jobs > 7 d [of them over 7 d with every other account at 0.8] | longest wait, days | weeks < 0.5 | weeks >= 0.8 | shortfall at 0.8 out of reach without preemption, % | mean wait / baseline's | window utilization, points | held for plans, % | work redone, % | idle beside wider jobs, % |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let (p, a) = (&row.policy, &row.against);
        let _ = writeln!(
            out,
            "| {} | {:.2} | {} | {} [{}] ({} [{}]) | {:.1} ({:.1}) | {} ({}) | {:.1}% ({:.1}%) | {:.0} ({:.0}) | {:.2} | {:+.2} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.2} ({:.2}) |",
            row.variant,
            row.load,
            row.nodes,
            p.over_7d,
            p.over_7d_with_others_at_0_8,
            a.over_7d,
            a.over_7d_with_others_at_0_8,
            p.longest_wait_s as f64 / DAY_S,
            a.longest_wait_s as f64 / DAY_S,
            p.weeks_below_half,
            a.weeks_below_half,
            weeks_at_0_8(p),
            weeks_at_0_8(a),
            share_out_of_reach(p),
            share_out_of_reach(a),
            mean_wait_ratio(row),
            window_gap(row),
            p.window_planned_idle * 100.0,
            a.window_planned_idle * 100.0,
            p.window_work_redone * 100.0,
            a.window_work_redone * 100.0,
            p.window_idle_too_full * 100.0,
            a.window_idle_too_full * 100.0,
        );
    }
    let n = rows.len().max(1) as f64;
    let sum = |f: &dyn Fn(&Headline) -> usize, policy: bool| -> usize {
        rows.iter().map(|r| f(side(r, policy))).sum()
    };
    let mean_longest = |policy: bool| {
        rows.iter()
            .map(|r| side(r, policy))
            .map(|h| h.longest_wait_s as f64 / DAY_S)
            .sum::<f64>()
            / n
    };
    let pooled = |policy: bool| {
        let weeks = sum(&|h| h.account_weeks, policy);
        let low = sum(&|h| h.weeks_below_0_8, policy);
        weeks_at_0_8(&Headline {
            account_weeks: weeks,
            weeks_below_0_8: low,
            ..Headline::default()
        })
    };
    let pooled_out_of_reach = |policy: bool| {
        out_of_reach(
            rows.iter()
                .map(|r| side(r, policy).short_of_0_8_gpu_s)
                .sum(),
            rows.iter()
                .map(|r| side(r, policy).short_of_0_8_out_of_reach_gpu_s)
                .sum(),
        )
    };
    let ratios: Vec<f64> = rows.iter().map(mean_wait_ratio).collect();
    let over_goal = ratios.iter().filter(|r| **r > MEAN_WAIT_GOAL).count();
    let _ = writeln!(
        out,
        "| **all {}** | | | **{}** [{}] ({} [{}]) | **{:.1}** ({:.1}) mean | **{}** ({}) | **{:.1}%** ({:.1}%) | **{:.0}** ({:.0}) | **{:.2}** mean, {over_goal} over {MEAN_WAIT_GOAL} | **{:+.2}** mean | **{:.2}** ({:.2}) mean | **{:.2}** ({:.2}) mean | **{:.2}** ({:.2}) mean |",
        rows.len(),
        sum(&|h| h.over_7d, true),
        sum(&|h| h.over_7d_with_others_at_0_8, true),
        sum(&|h| h.over_7d, false),
        sum(&|h| h.over_7d_with_others_at_0_8, false),
        mean_longest(true),
        mean_longest(false),
        sum(&|h| h.weeks_below_half, true),
        sum(&|h| h.weeks_below_half, false),
        pooled(true),
        pooled(false),
        pooled_out_of_reach(true),
        pooled_out_of_reach(false),
        ratios.iter().sum::<f64>() / n,
        rows.iter().map(window_gap).sum::<f64>() / n,
        rows.iter().map(|r| r.policy.window_planned_idle).sum::<f64>() * 100.0 / n,
        rows.iter().map(|r| r.against.window_planned_idle).sum::<f64>() * 100.0 / n,
        rows.iter().map(|r| r.policy.window_work_redone).sum::<f64>() * 100.0 / n,
        rows.iter().map(|r| r.against.window_work_redone).sum::<f64>() * 100.0 / n,
        rows.iter().map(|r| r.policy.window_idle_too_full).sum::<f64>() * 100.0 / n,
        rows.iter().map(|r| r.against.window_idle_too_full).sum::<f64>() * 100.0 / n,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Philly trace of three VCs over ten days, `b` submitting a burst of whole-node jobs
    /// on day 2: enough contention that the policies part ways.
    fn write_trace(dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let mut trace = String::from("timestamp,duration,num_gpus,gpu_time,cluster\n");
        for i in 0..400u32 {
            let (vc, gpus, minutes) = match i % 4 {
                0 | 1 => ("a", 1 + i % 4, 90 + i % 50),
                2 if (100..160).contains(&i) => ("b", 8, 600),
                2 => ("b", 2, 60),
                _ => ("c", 4, 240),
            };
            let at = chrono::DateTime::from_timestamp(1_504_224_000 + i64::from(i) * 2_160, 0)
                .unwrap()
                .format("%Y-%m-%d %H:%M:%S");
            let seconds = minutes * 180;
            trace.push_str(&format!(
                "{at},{seconds}.0,{gpus},{}.0,{vc}\n",
                seconds * gpus
            ));
        }
        let (t, v) = (dir.join("trace.csv"), dir.join("vc.csv"));
        std::fs::write(&t, trace).unwrap();
        std::fs::write(&v, "vc,node num\na,4\nb,2\nc,2\n").unwrap();
        (t, v)
    }

    fn args(trace: PathBuf, vc: PathBuf) -> FairnessArgs {
        FairnessArgs {
            trace,
            vc_nodes: Some(vc),
            loads: vec![0.7, 0.95],
            variants: vec![Variant::AsIs, Variant::Shift { seed: 1 }],
            config: None,
            policy: "fairshare+backfill".into(),
            against: "fifo+backfill".into(),
            limit_estimate: "hour".into(),
            checkpoint_every: None,
            checkpoint_save: None,
            threads: Some(2),
            out: None,
        }
    }

    #[test]
    fn each_variant_runs_at_each_load_under_the_policy_and_the_baseline() {
        let dir = tempfile::tempdir().unwrap();
        let (trace, vc) = write_trace(dir.path());
        let given = FairnessArgs {
            out: Some(dir.path().join("runs")),
            ..args(trace, vc)
        };
        let rows = measure(&given).unwrap();
        let report = std::fs::read_to_string(
            dir.path()
                .join("runs/shift1-0.95-fairshare+backfill/report.md"),
        )
        .unwrap();
        let said = format!("7 days: {};", rows[3].policy.over_7d);
        assert!(report.contains(&said), "{said} not in {report}");
        let said = format!(
            "{} even with every other account at 0.8",
            rows[3].policy.over_7d_with_others_at_0_8
        );
        assert!(report.contains(&said), "{said} not in {report}");
        let cases: Vec<(String, f64)> = rows
            .iter()
            .map(|r| (r.variant.to_string(), r.load))
            .collect();
        assert_eq!(
            cases,
            [
                ("as-is".into(), 0.7),
                ("as-is".into(), 0.95),
                ("shift:1".into(), 0.7),
                ("shift:1".into(), 0.95)
            ]
        );
        for pair in rows.chunks(2) {
            assert!(pair[1].nodes < pair[0].nodes, "more load, fewer nodes");
        }
        assert!(
            rows.iter().any(|r| r.policy != r.against),
            "fair share and FIFO gave the same figures everywhere"
        );
        // The same policy on both sides gives the same figures: each run is paired with its
        // own case.
        let same = measure(&FairnessArgs {
            policy: "fifo+backfill".into(),
            out: Some(dir.path().join("same")),
            ..given.clone()
        })
        .unwrap();
        for run in [
            "as-is-0.7-fifo+backfill",
            "as-is-0.7-fifo+backfill-baseline",
        ] {
            assert!(
                dir.path().join("same").join(run).join("report.md").exists(),
                "{run}"
            );
        }
        for (row, fifo) in same.iter().zip(&rows) {
            assert_eq!(row.policy, row.against);
            assert_eq!(row.against, fifo.against);
        }
        for row in &rows {
            for side in [&row.policy, &row.against] {
                assert!(side.over_7d_with_others_at_0_8 <= side.over_7d, "{side:?}");
                assert!(
                    side.short_of_0_8_out_of_reach_gpu_s <= side.short_of_0_8_gpu_s + 1.0,
                    "{side:?}"
                );
            }
        }
        let printed = table(&given, &rows, 1.0);
        assert!(printed.contains("| shift:1 | 0.95 |"), "{printed}");
        let total: usize = rows.iter().map(|r| r.policy.over_7d).sum();
        let forced: usize = rows
            .iter()
            .map(|r| r.policy.over_7d_with_others_at_0_8)
            .sum();
        assert!(
            printed.contains(&format!("| **all 4** | | | **{total}** [{forced}] (")),
            "{printed}"
        );
    }

    #[test]
    fn a_load_outside_what_a_cluster_can_be_offered_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (trace, vc) = write_trace(dir.path());
        for load in [0.0, -1.0, 3.0, f64::NAN] {
            let e = run(&FairnessArgs {
                loads: vec![load],
                ..args(trace.clone(), vc.clone())
            })
            .unwrap_err();
            assert!(e.to_string().contains("--loads"), "{e}");
        }
    }

    /// Under fair-share preemption that may take any job, jobs that never checkpoint redo
    /// whole runs; told to checkpoint every 10 minutes they redo at most that much of each,
    /// and the table says so.
    #[test]
    fn work_redone_by_preemptions_shrinks_when_every_job_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let (trace, vc) = write_trace(dir.path());
        let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-cluster.toml");
        let mut config = std::fs::read_to_string(seed).unwrap();
        config.push_str(
            "\n[scheduler]\nfair_share_preemption = true\nfair_share_preemption_max_loss = \"30d\"\n",
        );
        let config_path = dir.path().join("preempting.toml");
        std::fs::write(&config_path, config).unwrap();
        let never = FairnessArgs {
            config: Some(config_path),
            ..args(trace, vc)
        };
        let checkpointing = FairnessArgs {
            checkpoint_every: Some("10m".parse().unwrap()),
            ..never.clone()
        };
        let redone =
            |rows: &[Row]| -> f64 { rows.iter().map(|r| r.policy.window_work_redone).sum() };
        let (lost, lost_checkpointing) =
            (measure(&never).unwrap(), measure(&checkpointing).unwrap());
        assert!(
            redone(&lost) > 0.0,
            "fair-share preemption preempted nothing"
        );
        assert!(
            redone(&lost_checkpointing) < redone(&lost) / 2.0,
            "{} against {}",
            redone(&lost_checkpointing),
            redone(&lost)
        );
        for row in &lost {
            assert_eq!(row.against.window_work_redone, 0.0, "FIFO preempts nothing");
        }
        let printed = table(&checkpointing, &lost_checkpointing, 1.0);
        assert!(
            printed.contains("every job checkpointing every 10m"),
            "{printed}"
        );
        assert!(
            printed.contains("| work redone, % | idle beside wider jobs, % |"),
            "{printed}"
        );
    }
}
