//! `gpuledger`: one binary, a subcommand per service and tool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rust_decimal::Decimal;

use gpuledger::table;
use gpuledger_aggregator::query::{AccountIndicators, Query};
use gpuledger_aggregator::serve::DEFAULT_DATA_DIR;
use gpuledger_scheduler::SchedulerOptions;
use gpuledger_sim::demo::{self as pipeline, Progress, RunOutput};
use gpuledger_sim::seed::{load_cluster, load_demo, load_price_book};

#[derive(Parser, Debug)]
#[command(
    name = "gpuledger",
    version,
    args_override_self = true,
    about = "GPU cluster telemetry, fair-share scheduling and chargeback"
)]
struct Cli {
    /// How log lines are written to standard error: text (coloured only on a terminal) or json.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "GPULEDGER_LOG_FORMAT"
    )]
    log_format: gpuledger_service::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the seed scenario end to end over a simulated month: workload, scheduler, per-GPU
    /// telemetry through the aggregator into Parquet, billing, and a summary per account.
    Demo(DemoArgs),
    /// A live stack on this host under one state directory: aggregator, scheduler, synthetic
    /// exporters, a small workload and Prometheus (when installed), tokens on; prints every
    /// URL; Ctrl-C stops it all; starting again continues with the same data.
    Up(gpuledger_stack::UpOptions),
    /// Price a month of stored usage under the price book: per account an invoice revision
    /// (CSV, JSON, HTML), one FOCUS 1.2 CSV for finance, and the billing models compared.
    Invoice(gpuledger::invoice_cmd::InvoiceArgs),
    /// Walk the per-tenant directories and record bytes per account and project, billed in
    /// TB-days under the compute_and_storage model.
    StorageScan(gpuledger::invoice_cmd::StorageScanArgs),
    /// Print the indicators per account (jobs, GPU-hours, MFU, utilization, queue wait,
    /// success rate) over a window of stored data.
    Report(ReportArgs),
    /// Replay a job trace (the Philly format) through the scheduler in virtual time; write
    /// jobs.csv and report.md to --out.
    Simulate(SimulateArgs),
    /// Run the per-node exporter: read GPUs (synthetic or NVML), label them with their jobs,
    /// serve /metrics in dcgm-exporter's names, and push batches to the aggregator through a
    /// durable spool.
    Exporter(gpuledger_exporter::daemon::ExporterOptions),
    /// Measure: ingest throughput over loopback, /metrics render time, the exporter's CPU
    /// and memory (figures for docs/benchmarks.md).
    #[command(subcommand)]
    Bench(gpuledger_bench::BenchCommand),
    /// Run the aggregator service: HTTP ingest with a write-ahead log, Parquet store,
    /// indicators, the fair-share usage feed and /metrics.
    Aggregator(gpuledger_aggregator::serve::ServeOptions),
    /// The live scheduler: `serve` runs it; `submit`, `cancel`, `queue`, `share`, `priority`,
    /// `reserve` and `unreserve` talk to it.
    #[command(subcommand)]
    Scheduler(gpuledger::scheduler_cmd::SchedulerCommand),
    /// The Grafana dashboards: `export` writes them with their provisioning files, `check` runs
    /// every panel's queries against a Prometheus, `preview` draws what they return as HTML.
    #[command(subcommand)]
    Dashboards(gpuledger::dashboards_cmd::DashboardsCommand),
    /// Beside Slurm: `follow` posts its jobs' events (from squeue and scontrol, the
    /// jobcomp log or sacct) to the aggregator; `steer` sets pending jobs' fair-share factors
    /// from measured usage and holds jobs over GPU-hour quotas.
    #[command(subcommand)]
    Slurm(gpuledger::slurm_cmd::SlurmCommand),
    /// Bring in what an existing cluster defines: `slurm-assoc` reads `sacctmgr dump`.
    #[command(subcommand)]
    Import(gpuledger::adopt_cmd::ImportCommand),
    /// Write what another system needs: `kubernetes` writes Namespaces, ResourceQuotas and
    /// Kueue queues for the tenant tree.
    #[command(subcommand)]
    Export(gpuledger::adopt_cmd::ExportCommand),
    /// Manage the bearer tokens the services accept: `add` (shown once), `list`, `revoke`.
    #[command(subcommand)]
    Token(gpuledger::token_cmd::TokenCommand),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell); e.g.
    /// `gpuledger completions bash > /etc/bash_completion.d/gpuledger`.
    Completions { shell: clap_complete::Shell },
    /// Print the cluster config's reference (docs/configuration.md): every table and key with
    /// its type, default and meaning, generated from the config types.
    ConfigReference,
    /// Write a man page per command (gpuledger.1, gpuledger-scheduler-submit.1, ...) into a
    /// directory; e.g. `--out /usr/local/share/man/man1`.
    Man {
        #[arg(long)]
        out: PathBuf,
    },
    /// Check a configuration file and print what it defines: a cluster config, a price book,
    /// a demo spec or an exporter config (told apart by their keys, or by --kind).
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        kind: ConfigKind,
    },
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// Where outputs go; the demo replaces earlier demo outputs there.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "GPULEDGER_DATA_DIR")]
    data_dir: PathBuf,
    /// Cluster config (default: the embedded seed cluster, examples/seed-cluster.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Workload and telemetry profiles (default: the embedded seed month, examples/seed-demo.toml).
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Scheduling policy: fifo, fairshare, fifo+backfill, fairshare+backfill.
    #[arg(long, default_value = "fairshare+backfill")]
    policy: String,
    /// Simulate this many days instead of the spec's (1 to 366).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(gpuledger_sim::demo::MAX_DEMO_DAYS)))]
    days: Option<u32>,
    /// Replace the workload's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Price book (default: the embedded seed price book, examples/seed-prices.toml).
    #[arg(long)]
    price_book: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Trace in the Philly format (timestamp,duration,num_gpus,gpu_time,cluster; needs
    /// --vc-nodes) or Alibaba's 2023 GPU-sharing pod list (openb_pod_list_*.csv: num_gpu,
    /// gpu_milli, ...; each QoS class an account of weight 1), told apart by the header.
    #[arg(long, conflicts_with = "jobs")]
    trace: Option<PathBuf>,
    /// VC sizes (`vc,node num`) of a Philly trace, used as fair-share weights.
    #[arg(long)]
    vc_nodes: Option<PathBuf>,
    /// Nodes of 8 GPUs in the simulated cluster (with --trace); a pod's `gpu_spec` is not
    /// replayed on them.
    #[arg(long)]
    nodes: Option<u32>,
    /// Alibaba's node list (openb_node_list_gpu_node.csv: sn,cpu_milli,memory_mib,gpu,model)
    /// as the cluster of an Alibaba --trace, instead of --nodes: each node's GPUs and model
    /// (V100M16, V100M32, P100, T4, A10), and each pod held to the types its `gpu_spec` names.
    #[arg(long, conflicts_with_all = ["nodes", "jobs"])]
    node_list: Option<PathBuf>,
    /// Jobs in gpuledger's own CSV format (submit,account,gpus,run_time_s[,job_id,project,
    /// partition,min_gpus,time_limit_s,grace_s,checkpoint_every_s,checkpoint_save_s,outcome,
    /// gpus_per_node,nodes,gpu_types,gpu_share]).
    #[arg(long, required_unless_present = "trace")]
    jobs: Option<PathBuf>,
    /// Cluster config for --jobs (the embedded seed cluster when absent); with --trace, its
    /// `[fair_share]` and `[scheduler]` settings and the weights of the accounts it names
    /// (`vc-<id>`) replace the defaults and the VC sizes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Advance reservations in force (TOML `[[reservations]]`).
    #[arg(long)]
    reservations: Option<PathBuf>,
    /// fifo or fairshare, optionally +backfill (EASY) or +conservative.
    #[arg(long, default_value = "fairshare+backfill")]
    policy: String,
    /// Time limits from true run times (traces): exact, hour (rounded up to the next hour) or
    /// double.
    #[arg(long, default_value = "hour")]
    limit_estimate: String,
    /// Where jobs.csv, report.md and the SVG plots go.
    #[arg(long)]
    out: PathBuf,
    /// Also store the simulated month (job events and synthesised telemetry, through the
    /// aggregator's ingest path) here and bill it; needs --month.
    #[arg(long, requires = "month")]
    data_dir: Option<PathBuf>,
    /// The month to store and bill, YYYY-MM (UTC).
    #[arg(long)]
    month: Option<String>,
    /// Price book for --data-dir (default: the embedded seed price book).
    #[arg(long)]
    price_book: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Start of the window, YYYY-MM-DD (UTC, inclusive).
    #[arg(long)]
    from: chrono::NaiveDate,
    /// End of the window, YYYY-MM-DD (UTC, exclusive).
    #[arg(long)]
    to: chrono::NaiveDate,
    /// Data directory: a path or an object-store URL (`s3://...`, `file://...`), as the
    /// aggregator's --data-dir.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "GPULEDGER_DATA_DIR")]
    data_dir: String,
}

/// Exit status 1 with one line, `error: ...` and its causes joined by `: `, never a backtrace
/// (whatever `RUST_BACKTRACE` says); clap exits 2 for a bad command line.
fn main() -> std::process::ExitCode {
    gpuledger_service::exit_status(run())
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse_from(expand_exporter_config(std::env::args().collect())?);
    gpuledger_service::init_logging(cli.log_format);
    match cli.command {
        Command::Demo(args) => demo(args),
        Command::Up(options) => Ok(gpuledger_stack::up(
            &options,
            &gpuledger_stack::Binary {
                exe: std::env::current_exe()?,
                seed_cluster_toml: gpuledger_sim::seed::SEED_CLUSTER_TOML,
            },
        )?),
        Command::Invoice(args) => gpuledger::invoice_cmd::invoice(args),
        Command::StorageScan(args) => gpuledger::invoice_cmd::storage_scan(args),
        Command::Report(args) => report(args),
        Command::Simulate(args) => simulate(args),
        Command::Aggregator(args) => {
            let cluster = load_cluster(args.config.as_deref())?;
            Ok(gpuledger_aggregator::serve::run(args, cluster)?)
        }
        Command::Exporter(args) => Ok(gpuledger_exporter::daemon::run(args)?),
        Command::Bench(command) => gpuledger_bench::run(command),
        Command::Scheduler(command) => gpuledger::scheduler_cmd::run(command),
        Command::Dashboards(command) => gpuledger::dashboards_cmd::run(command),
        Command::Token(command) => gpuledger::token_cmd::run(command),
        Command::Import(command) => gpuledger::adopt_cmd::import(command),
        Command::Slurm(command) => gpuledger::slurm_cmd::run(command),
        Command::Export(command) => gpuledger::adopt_cmd::export(command),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "gpuledger",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::ConfigReference => {
            print!("{}", gpuledger_model::reference::configuration_reference());
            Ok(())
        }
        Command::Man { out } => {
            let written = gpuledger::man_cmd::write_man_pages(Cli::command(), &out)?;
            println!("{written} man pages in {}", out.display());
            Ok(())
        }
        Command::CheckConfig { file, kind } => check_config(&file, kind),
    }
}

/// `gpuledger exporter --config FILE ...`: the file's options go before the typed ones, which
/// win (the exporter owns the file's format). Other command lines pass through unchanged.
fn expand_exporter_config(mut argv: Vec<String>) -> anyhow::Result<Vec<String>> {
    use clap::Args;
    if argv.get(1).map(String::as_str) != Some("exporter") {
        return Ok(argv);
    }
    let typed = argv.split_off(2);
    let command = gpuledger_exporter::daemon::ExporterOptions::augment_args(clap::Command::new(
        "gpuledger exporter",
    ));
    argv.extend(gpuledger_exporter::daemon::expand_config_file(
        typed, &command,
    )?);
    Ok(argv)
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn phase(&self, name: &str, total: u64) {
        self.0.reset();
        self.0.set_length(total);
        self.0.set_position(0);
        self.0.set_message(name.to_owned());
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// Removes the outputs of an earlier demo, refusing to touch a directory that holds anything else.
fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let config = load_cluster(args.config.as_deref())?;
    let mut spec = load_demo(args.spec.as_deref())?;
    if let Some(days) = args.days {
        spec.workload.days = days;
    }
    if let Some(seed) = args.seed {
        spec.workload.seed = seed;
    }
    let options = SchedulerOptions::parse(&args.policy).with_context(|| {
        format!(
            "unknown --policy `{}`; use fifo, fairshare, fifo+backfill or fairshare+backfill",
            args.policy
        )
    })?;
    let prices = load_price_book(args.price_book.as_deref())?;
    pipeline::clear_outputs(&args.data_dir)?;
    println!(
        "gpuledger demo: cluster `{}` ({} nodes, {} GPUs), {} days from {}, policy {}, samples every {} s",
        config.cluster.name,
        config.nodes().len(),
        config.total_gpus(),
        spec.workload.days,
        spec.workload.start.format("%Y-%m-%d"),
        options.name(),
        spec.sample_interval_s
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let out = pipeline::run(&config, &spec, options, &prices, &args.data_dir, &Bar(bar))?;
    print_summary(&out);
    Ok(())
}

fn hours(secs: i64) -> String {
    format!("{:.1}", secs as f64 / 3600.0)
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn wait_h(x: Option<f64>) -> String {
    x.map(|v| format!("{:.2}", v / 3600.0))
        .unwrap_or_else(|| "-".into())
}

fn indicator_rows(
    indicators: &[AccountIndicators],
    cost: impl Fn(&str) -> Option<Decimal>,
) -> Vec<Vec<String>> {
    indicators
        .iter()
        .map(|i| {
            vec![
                i.account.clone(),
                i.jobs.to_string(),
                hours(i.gpu_seconds),
                pct(i.mean_mfu),
                i.mean_gpu_util_pct
                    .map(|u| format!("{u:.1}%"))
                    .unwrap_or_else(|| "-".into()),
                i.mean_mem_util
                    .map(|m| format!("{:.1}%", m * 100.0))
                    .unwrap_or_else(|| "-".into()),
                wait_h(i.mean_queue_wait_s),
                wait_h(i.p50_queue_wait_s),
                wait_h(i.p95_queue_wait_s),
                wait_h(i.max_queue_wait_s),
                pct(i.success_rate),
                cost(&i.account)
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect()
}

const INDICATOR_HEADER: [&str; 12] = [
    "account",
    "jobs",
    "GPU-hours",
    "mean MFU",
    "GPU util",
    "mem util",
    "wait mean h",
    "wait p50 h",
    "wait p95 h",
    "wait max h",
    "success",
    "cost",
];

fn print_summary(out: &RunOutput) {
    let currency = out
        .invoices
        .first()
        .map(|i| i.currency.code())
        .unwrap_or("");
    let cost = |account: &str| {
        out.invoices
            .iter()
            .find(|i| i.account.as_str() == account)
            .map(|i| i.total())
    };
    println!();
    println!(
        "Per account, {} (cost in {currency} under each account's billing model):",
        out.month
    );
    print!(
        "{}",
        table::render(&INDICATOR_HEADER, &indicator_rows(&out.indicators, cost))
    );
    let billed: i64 = out.invoices.iter().map(|i| i.gpu_seconds()).sum();
    let total: Decimal = out.invoices.iter().map(|i| i.total()).sum();
    let allocated: i64 = out
        .sim
        .records
        .iter()
        .map(|r| r.gpu_seconds_until(out.sim.horizon_s))
        .sum();
    println!();
    println!(
        "cluster: {} jobs submitted, {} refused at submission, {} never started; utilization {} measured from telemetry (target > 85%)",
        out.sim.records.len(),
        out.sim.refused.len(),
        out.sim.records.iter().filter(|r| r.start_s.is_none()).count(),
        pct(out.measured_utilization)
    );
    let preempted = out.sim.records.iter().filter(|r| r.preemptions > 0).count();
    let redone: i64 = out.sim.records.iter().map(|r| r.lost_gpu_s).sum();
    let backfilled = out.sim.records.iter().filter(|r| r.backfilled).count();
    println!(
        "scheduler: {backfilled} jobs backfilled, {preempted} preempted by a higher tier ({} GPU-hours of work redone)",
        hours(redone)
    );
    println!(
        "billing: {} GPU-hours billed, {} GPU-seconds allocated by the scheduler, {} billed ({}); total {total} {currency}",
        hours(billed),
        allocated,
        billed,
        if billed == allocated { "equal" } else { "DIFFERENT" }
    );
    println!(
        "telemetry: {} samples in {} batches -> {} Parquet sample files, {} rollup rows",
        out.samples, out.batches, out.flush.sample_files, out.flush.rollup_rows
    );
    for (refused, reason) in out.sim.refused.iter().take(5) {
        println!(
            "refused: job {} of {}: {reason}",
            refused.id, refused.account
        );
    }
    println!();
    println!("outputs under {}:", out.data_dir.display());
    println!("  samples/date=YYYY-MM-DD/*.parquet         one row per GPU per sample interval");
    println!("  rollups/hourly/date=YYYY-MM-DD/*.parquet  per job x GPU x hour");
    println!("  jobs/date=YYYY-MM-DD/*.parquet            job lifecycle events");
    let invoice_dir = out.data_dir.join("invoices").join(&out.month);
    println!(
        "  invoices/{}/<account>/rN.{{csv,json,html}}  {} invoices (revision N; late data adds N+1)",
        out.month,
        out.invoices.len()
    );
    for f in out
        .invoice_files
        .iter()
        .filter(|f| f.parent() == Some(invoice_dir.as_path()))
    {
        println!("  {}", f.strip_prefix(&out.data_dir).unwrap_or(f).display());
    }
    let times: Vec<String> = out
        .timings
        .iter()
        .map(|(n, d)| format!("{n} {:.1}s", d.as_secs_f64()))
        .collect();
    println!("time: {}", times.join(", "));
}

fn report(args: ReportArgs) -> anyhow::Result<()> {
    let ms = gpuledger_model::time::day_start_ms;
    let layout = gpuledger_aggregator::serve::open_layout(&args.data_dir, None, false)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let indicators = runtime.block_on(async {
        Query::open(&layout)
            .await?
            .account_indicators(ms(args.from), ms(args.to))
            .await
    })?;
    let utilization = runtime.block_on(async {
        Query::open(&layout)
            .await?
            .cluster_utilization(ms(args.from), ms(args.to))
            .await
    })?;
    println!(
        "{} to {} (UTC), from {}: cluster utilization {} (target > 85%)",
        args.from,
        args.to,
        args.data_dir,
        pct(utilization)
    );
    print!(
        "{}",
        table::render(
            &INDICATOR_HEADER[..INDICATOR_HEADER.len() - 1],
            &indicator_rows(&indicators, |_| None)
                .into_iter()
                .map(|mut r| {
                    r.pop();
                    r
                })
                .collect::<Vec<_>>()
        )
    );
    Ok(())
}

/// A file read for a replay as the text its library takes.
fn as_text(file: &Option<(String, String)>) -> Option<gpuledger_sim::replay::Text<'_>> {
    file.as_ref()
        .map(|(text, origin)| gpuledger_sim::replay::Text { text, origin })
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    use gpuledger_scheduler::trace::{parse_jobs, LimitEstimate};
    use gpuledger_sim::replay::{trace_replay, Text, TraceFiles};
    let options = SchedulerOptions::parse(&args.policy).with_context(|| {
        format!(
            "unknown --policy `{}`; use fifo or fairshare, optionally with +backfill or +conservative",
            args.policy
        )
    })?;
    let estimate = LimitEstimate::parse(&args.limit_estimate).with_context(|| {
        format!(
            "unknown --limit-estimate `{}`; use exact, hour or double",
            args.limit_estimate
        )
    })?;
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let (config, jobs) = match (&args.trace, &args.jobs) {
        (Some(trace), _) => {
            let text = read(trace)?;
            let origin = trace.display().to_string();
            let read_named = |p: &Option<PathBuf>| -> anyhow::Result<Option<(String, String)>> {
                p.as_deref()
                    .map(|p| Ok((read(p)?, p.display().to_string())))
                    .transpose()
            };
            let (vc_nodes, node_list) = (read_named(&args.vc_nodes)?, read_named(&args.node_list)?);
            let replay = trace_replay(TraceFiles {
                trace: Text {
                    text: &text,
                    origin: &origin,
                },
                vc_nodes: as_text(&vc_nodes),
                node_list: as_text(&node_list),
                nodes: args.nodes,
                estimate,
            })?;
            if let Some(left_out) = &replay.left_out {
                eprintln!("{left_out}");
            }
            let mut config = replay.config;
            if let Some(path) = &args.config {
                gpuledger_sim::report::apply_settings(&mut config, &load_cluster(Some(path))?);
            }
            (config, replay.jobs)
        }
        (None, Some(file)) => (
            load_cluster(args.config.as_deref())?,
            parse_jobs(&read(file)?, &file.display().to_string())?,
        ),
        (None, None) => anyhow::bail!("give --trace (with --vc-nodes and --nodes) or --jobs"),
    };
    let reservations = match &args.reservations {
        Some(path) => gpuledger_scheduler::reservation::parse_reservations(
            &read(path)?,
            &path.display().to_string(),
        )?
        .iter()
        .map(|r| r.to_request())
        .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let bar = ProgressBar::new(jobs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("simulating [{bar:40}] {pos}/{len} jobs ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let result = gpuledger_scheduler::simulate_with_reservations(
        &config,
        options,
        jobs,
        reservations,
        None,
        &mut |done, _| bar.set_position(done as u64),
    )
    .context("a reservation cannot be placed")?;
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    let md = gpuledger_sim::report::write_outputs(&args.out, &config, &result)?;
    print!("{md}");
    if let (Some(data_dir), Some(month)) = (&args.data_dir, &args.month) {
        store_simulated_month(
            &config,
            &result,
            data_dir,
            month,
            args.price_book.as_deref(),
        )?;
    }
    println!(
        "\nsimulated in {:.2} s; wrote {}/jobs.csv and {}/report.md",
        elapsed.as_secs_f64(),
        args.out.display(),
        args.out.display()
    );
    Ok(())
}

/// Stores a simulated month as telemetry and job events in `data_dir` and prints what it billed.
fn store_simulated_month(
    config: &gpuledger_model::ClusterConfig,
    result: &gpuledger_scheduler::SimResult,
    data_dir: &Path,
    month: &str,
    price_book: Option<&Path>,
) -> anyhow::Result<()> {
    let prices = load_price_book(price_book)?;
    let month_out = pipeline::store_simulated_month(config, result, data_dir, month, &prices)
        .with_context(|| format!("storing --month `{month}`"))?;
    println!(
        "stored {month}: {} samples, {} invoices under {}; {} GPU-seconds allocated in the month, {} billed",
        month_out.stored.samples,
        month_out.stored.invoices.len(),
        data_dir.display(),
        month_out.allocated_gpu_seconds,
        month_out.billed_gpu_seconds
    );
    Ok(())
}

/// What a file passed to `check-config` configures.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ConfigKind {
    /// Told by its keys: `[cluster]`, `[workload]`, `node`, `currency`.
    Auto,
    Cluster,
    Prices,
    Demo,
    Exporter,
}

fn config_kind(file: &Path) -> anyhow::Result<ConfigKind> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let origin = file.display().to_string();
    let table: toml::Table = gpuledger_model::config::parse_toml(&text, &origin)?;
    Ok(if table.contains_key("cluster") {
        ConfigKind::Cluster
    } else if table.contains_key("workload") {
        ConfigKind::Demo
    } else if table.contains_key("currency") || table.contains_key("versions") {
        ConfigKind::Prices
    } else if table.contains_key("node") || table.contains_key("source") {
        ConfigKind::Exporter
    } else {
        anyhow::bail!(
            "{origin}: not a cluster config ([cluster]), price book (currency), demo spec \
             ([workload]) or exporter config (node); say which with --kind"
        )
    })
}

fn check_config(file: &Path, kind: ConfigKind) -> anyhow::Result<()> {
    let kind = match kind {
        ConfigKind::Auto => config_kind(file)?,
        k => k,
    };
    match kind {
        ConfigKind::Cluster | ConfigKind::Auto => check_cluster(file),
        ConfigKind::Prices => {
            let book = load_price_book(Some(file))?;
            let versions: Vec<String> = book.versions().map(|v| v.version.clone()).collect();
            println!(
                "{}: price book: {} version(s) ({}) in {}",
                file.display(),
                versions.len(),
                versions.join(", "),
                book.currency()
            );
            Ok(())
        }
        ConfigKind::Demo => {
            let spec = load_demo(Some(file))?;
            println!(
                "{}: demo spec: {} days from {}",
                file.display(),
                spec.workload.days,
                spec.workload.start
            );
            Ok(())
        }
        ConfigKind::Exporter => {
            use clap::Args;
            let command = gpuledger_exporter::daemon::ExporterOptions::augment_args(
                clap::Command::new("gpuledger exporter"),
            );
            let args = gpuledger_exporter::daemon::config_file_args(file, &command)?;
            let parsed = command
                .clone()
                .no_binary_name(true)
                .try_get_matches_from(&args)
                .map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.to_string().trim()))?;
            let node = parsed
                .get_one::<String>("node")
                .map_or("(given on the command line)", String::as_str);
            println!("{}: exporter config for node {node}", file.display());
            Ok(())
        }
    }
}

fn check_cluster(file: &Path) -> anyhow::Result<()> {
    let config = load_cluster(Some(file))?;
    println!(
        "{}: cluster `{}`: {} nodes, {} GPUs, {} partitions, {} accounts, price book {}",
        file.display(),
        config.cluster.name,
        config.nodes().len(),
        config.total_gpus(),
        config.partitions.len(),
        config.accounts.len(),
        config.prices.version
    );
    Ok(())
}
