//! `gpuledger bench schedule`: the time of one scheduling cycle with a deep queue on a full
//! cluster. The cluster is filled with running jobs, the queue with jobs that cannot all fit;
//! then at each cycle one running job ends (so the scheduler has GPUs to hand out and a plan
//! to remake) and the cycle is timed, and what it opened of the waiting jobs' records counted
//! (`Scheduler::records_opened`: the part of a cycle's cost that grows with the queue when it
//! should not, counted the same on any machine).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::Context;
use gpuledger_model::rng::SplitMix64;
use gpuledger_model::{AccountId, ClusterConfig, GpuModel, JobId};
use gpuledger_scheduler::{JobSpec, Scheduler, SchedulerOptions};

use gpuledger_model::stats::percentile;

const ACCOUNTS: usize = 10;

/// What `gpuledger bench schedule` measures.
#[derive(clap::Args, Debug, Clone)]
pub struct ScheduleArgs {
    #[arg(long, default_value_t = 512)]
    pub nodes: u32,
    #[arg(long, default_value_t = 10_000)]
    pub pending: usize,
    #[arg(long, default_value_t = 200)]
    pub cycles: usize,
    /// Comma-separated policies.
    #[arg(long, default_value = "fifo,fairshare+backfill,fairshare+conservative")]
    pub policies: String,
    /// The config's `[scheduler] plan_each_account` (each account's first waiting job
    /// gets a planned start under fair share with backfill), to see what it costs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub plan_each_account: bool,
    /// Every account gets a running-jobs and a weekly GPU-hours quota too large to bind:
    /// what checking quotas costs a cycle (the schedule is the same as without).
    #[arg(long)]
    pub quotas: bool,
    /// Every third job asks for the cluster's GPU type (Slurm's `--gres=gpu:TYPE:N`): what a
    /// queue of jobs with shapes costs a cycle (the bench cluster has that one type only).
    #[arg(long)]
    pub shaped: bool,
    /// Jobs that reach their time limit end at the next cycle, as where limits are enforced
    /// (Slurm, `gpuledger scheduler serve`, `simulate`), besides the one running job ended
    /// early each cycle. Without it (the measure the goals were set on) they run on past their
    /// limits and the plans count their GPUs as coming back at every cycle's now, so that over
    /// the bench's hours more and more of the cluster is past its limit.
    #[arg(long)]
    pub end_at_limit: bool,
}

/// Quotas no account of the bench reaches.
const LOOSE_QUOTA: &str =
    "quota = { max_running_jobs = 1000000, gpu_hours_per_week = 1000000000 }\n";

fn cluster(nodes: u32, plan_each_account: bool, quotas: bool) -> anyhow::Result<ClusterConfig> {
    let mut src = format!(
        "version = 1\n[cluster]\nname = \"bench\"\n[[node_pools]]\nname = \"p\"\nprefix = \"n\"\n\
         count = {nodes}\ngpus_per_node = 8\ngpu_model = \"h100-sxm\"\n\
         [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
         [[partitions]]\nname = \"urgent\"\npriority_tier = 50\n\
         [scheduler]\nplan_each_account = {plan_each_account}\n\
         [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
         gpu_hour = {{ h100-sxm = \"1\" }}\n"
    );
    for a in 0..ACCOUNTS {
        let _ = write!(
            src,
            "[[accounts]]\nid = \"acct-{a}\"\nname = \"Account {a}\"\nweight = {}\n{}",
            a + 1,
            if quotas { LOOSE_QUOTA } else { "" }
        );
    }
    ClusterConfig::from_toml_str(&src, "bench").context("bench cluster")
}

fn job(rng: &mut SplitMix64, n: u64, t: i64, shaped: bool) -> anyhow::Result<JobSpec> {
    const SIZES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
    const WEIGHTS: [f64; 7] = [0.3, 0.15, 0.15, 0.2, 0.1, 0.06, 0.04];
    let gpus = SIZES[rng.weighted_index(&WEIGHTS)];
    let limit = rng.range_u64(1, 48) * 3600;
    let account = AccountId::new(format!("acct-{}", rng.range_u64(0, ACCOUNTS as u64 - 1)))?;
    let mut spec = JobSpec::new(JobId::new(n.to_string())?, account, gpus, limit, t);
    if shaped && n.is_multiple_of(3) {
        spec.shape.gpu_types = vec![GpuModel::H100Sxm.into()];
    }
    Ok(spec)
}

/// Runs the measurement and returns a Markdown table row per policy.
pub fn run(args: &ScheduleArgs) -> anyhow::Result<String> {
    let ScheduleArgs {
        nodes,
        pending,
        cycles,
        ..
    } = *args;
    let config = cluster(nodes, args.plan_each_account, args.quotas)?;
    let mut out = String::from(
        "| nodes | pending | policy | cycles | p50 ms | p99 ms | max ms | started per cycle | records opened per cycle |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for name in args.policies.split(',') {
        let Measured {
            times,
            started,
            opened,
            ..
        } = measure(&config, name, args)?;
        let ms = |us: Option<i64>| us.unwrap_or(0) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "| {nodes} | {pending} | {name} | {cycles} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} |",
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 99.0)),
            ms(times.last().copied()),
            started as f64 / cycles.max(1) as f64,
            opened as f64 / cycles.max(1) as f64
        );
    }
    Ok(out)
}

/// One policy's cycles: each one's time in µs (sorted), the jobs they started and the
/// records they opened.
struct Measured {
    times: Vec<i64>,
    started: usize,
    opened: u64,
    /// The scheduler and the clock as the last cycle left them (for tests).
    #[cfg(test)]
    sched: Scheduler,
    #[cfg(test)]
    t: i64,
}

fn measure(config: &ClusterConfig, name: &str, args: &ScheduleArgs) -> anyhow::Result<Measured> {
    let options =
        SchedulerOptions::parse(name).with_context(|| format!("unknown policy `{name}`"))?;
    let mut sched = Scheduler::new(config, options);
    let mut rng = SplitMix64::new(7);
    let mut n = 0u64;
    let mut t = 1_780_272_000i64;
    // Fill the cluster: submit until a cycle starts nothing more.
    loop {
        for _ in 0..256 {
            n += 1;
            sched.submit(job(&mut rng, n, t, args.shaped)?)?;
        }
        let started = sched.schedule(t).started.len();
        if started == 0 || sched.cluster().free_gpus() == 0 {
            break;
        }
    }
    while sched.pending().len() < args.pending {
        n += 1;
        sched.submit(job(&mut rng, n, t, args.shaped)?)?;
    }
    let mut times = Vec::with_capacity(args.cycles);
    let (mut started, mut opened) = (0usize, 0u64);
    for _ in 0..args.cycles {
        t += 60;
        if args.end_at_limit {
            let due: Vec<JobId> = sched
                .running()
                .filter(|r| r.limit_end_s() <= t)
                .map(|r| r.spec.id.clone())
                .collect();
            for id in &due {
                sched.finish(id, t);
            }
        }
        let running: Vec<JobId> = sched.running().map(|r| r.spec.id.clone()).collect();
        if !running.is_empty() {
            let victim = &running[rng.range_u64(0, running.len() as u64 - 1) as usize];
            sched.finish(victim, t);
        }
        while sched.pending().len() < args.pending {
            n += 1;
            sched.submit(job(&mut rng, n, t, args.shaped)?)?;
        }
        let records = sched.records_opened();
        let begun = Instant::now();
        let cycle = sched.schedule(t);
        times.push(begun.elapsed().as_micros() as i64);
        opened += sched.records_opened() - records;
        started += cycle.started.len();
    }
    times.sort_unstable();
    Ok(Measured {
        times,
        started,
        opened,
        #[cfg(test)]
        sched,
        #[cfg(test)]
        t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_that_reach_their_limits_end_only_where_asked() {
        // Four hours of cycles on a cluster of about a hundred running jobs, one ended each
        // minute: some with limits of an hour or two outlive them unless ended there.
        let args = |end_at_limit| ScheduleArgs {
            nodes: 64,
            pending: 200,
            cycles: 240,
            policies: String::new(),
            plan_each_account: true,
            quotas: false,
            shaped: false,
            end_at_limit,
        };
        let config = cluster(64, true, false).unwrap();
        let past_limit =
            |m: &Measured| m.sched.running().filter(|r| r.limit_end_s() <= m.t).count();
        let left = measure(&config, "fairshare+backfill", &args(false)).unwrap();
        assert!(past_limit(&left) > 0);
        let ended = measure(&config, "fairshare+backfill", &args(true)).unwrap();
        assert_eq!(past_limit(&ended), 0);
    }
}
