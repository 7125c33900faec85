//! `gpuledger bench launch`: jobs started and ended by the scheduler's local executor as the
//! service starts them (a wrapper process per job, its cgroups, the device filter), under each
//! way of containing them: a cgroup alone, with memory, CPU and task limits, with a `/tmp` of
//! its own, with both. Each round launches `--jobs` jobs of `true` one after another, then
//! reaps them all; the variants take turns round by round, so that they share the machine's
//! state. Reports launches per second, the launch call's latency, and the time from the first
//! launch until the last job is reaped.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpuledger_model::stats::percentile;
use gpuledger_model::JobId;
use gpuledger_schedd::cgroup::JobLimits;
use gpuledger_schedd::executor::{Executor, ExecutorOptions, Launch, LocalExecutor};
use gpuledger_schedd::job_tmp::JobTmp;

/// What `bench launch` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Jobs each variant launches per round.
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// Rounds; the variants alternate within each.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where the jobs' directories go (not below /tmp, which a job's own /tmp would hide).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
}

struct Variant {
    name: &'static str,
    limits: JobLimits,
    tmp: JobTmp,
}

fn variants() -> anyhow::Result<Vec<Variant>> {
    let limits = JobLimits {
        memory_per_gpu: Some("1GiB".parse()?),
        cpus_per_gpu: Some("1".parse().map_err(anyhow::Error::msg)?),
        tasks_max: Some(256),
        bind_cores: false,
    };
    Ok(vec![
        Variant {
            name: "cgroup",
            limits: JobLimits::default(),
            tmp: JobTmp::Shared,
        },
        Variant {
            name: "cgroup + limits",
            limits,
            tmp: JobTmp::Shared,
        },
        Variant {
            name: "cgroup + own /tmp",
            limits: JobLimits::default(),
            tmp: JobTmp::Private,
        },
        Variant {
            name: "cgroup + limits + own /tmp",
            limits,
            tmp: JobTmp::Private,
        },
    ])
}

/// One variant's figures over every round.
#[derive(Default)]
struct Figures {
    launch_us: Vec<i64>,
    round_s: Vec<f64>,
}

/// Runs the measurement; the report as Markdown.
pub fn run(args: &LaunchArgs) -> anyhow::Result<String> {
    if args.jobs == 0 || args.rounds == 0 {
        bail!("--jobs and --rounds must be at least 1");
    }
    let variants = variants()?;
    let mut figures: Vec<Figures> = variants.iter().map(|_| Figures::default()).collect();
    for round in 0..args.rounds {
        for (variant, figures) in variants.iter().zip(&mut figures) {
            let dir = tempfile::tempdir_in(&args.dir)
                .with_context(|| format!("a directory in {}", args.dir.display()))?;
            let options = ExecutorOptions {
                limits: variant.limits,
                tmp: variant.tmp,
                ..ExecutorOptions::default()
            };
            let mut executor = LocalExecutor::with_options(dir.path().join("jobs"), options)
                .with_context(|| variant.name)?;
            if !executor.has_cgroups() {
                bail!("no job cgroups here: run as root on a host with cgroups");
            }
            let started = Instant::now();
            for k in 0..args.jobs {
                let launch = Launch {
                    job_id: JobId::new(format!("r{round}-{k}"))?,
                    command: "true".into(),
                    gpus: vec![0],
                    allocation: "gpu001:0".into(),
                    account: "team-a".into(),
                    project: None,
                    env: Default::default(),
                    user: None,
                    gpu_share: None,
                };
                let at = Instant::now();
                executor.launch(&launch).with_context(|| variant.name)?;
                figures.launch_us.push(at.elapsed().as_micros() as i64);
            }
            let mut reaped = 0;
            let until = Instant::now() + Duration::from_secs(120);
            while reaped < args.jobs {
                reaped += executor.reap().len();
                if Instant::now() > until {
                    bail!(
                        "{}: {reaped} of {} jobs ended in 120 s",
                        variant.name,
                        args.jobs
                    );
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            figures.round_s.push(started.elapsed().as_secs_f64());
        }
    }
    let mut out = format!(
        "`bench launch`: {} jobs of `true` per round, {} rounds, the variants alternating\n\n\
         | variant | launches/s | launch p50 | launch p99 | first launch to last reaped (mean of rounds) |\n\
         |---|---|---|---|---|\n",
        args.jobs, args.rounds
    );
    for (variant, figures) in variants.iter().zip(&mut figures) {
        let total_us: i64 = figures.launch_us.iter().sum();
        let per_second = figures.launch_us.len() as f64 / (total_us as f64 / 1e6);
        figures.launch_us.sort_unstable();
        let ms = |p: f64| percentile(&figures.launch_us, p).unwrap_or(0) as f64 / 1e3;
        let round = figures.round_s.iter().sum::<f64>() / figures.round_s.len() as f64;
        let _ = writeln!(
            out,
            "| {} | {per_second:.0} | {:.2} ms | {:.2} ms | {round:.2} s |",
            variant.name,
            ms(50.0),
            ms(99.0),
        );
    }
    Ok(out)
}
