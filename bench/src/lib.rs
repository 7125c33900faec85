//! `gpuledger bench`: measurements that are not tests (docs/benchmarks.md records them). A
//! harness like the tests, so `anyhow` is its error type, as it is theirs.
//!
//! - `ingest`: a real aggregator process on loopback, N node threads pushing pre-encoded
//!   batches concurrently; samples acknowledged per second and the aggregator's peak RSS.
//! - `render`: `/metrics` render time of the exporter for a number of GPUs (p50, p99).
//! - `exporter`: a real exporter process sampling synthetic GPUs every second for a while;
//!   its CPU time per sample and its resident memory.
//! - `load` ([`load`]): a thousand simulated exporters at a steady rate; latency
//!   percentiles, memory over time, every sample stored once;
//! - `schedule` ([`schedule`]): one scheduling cycle over a long queue;
//! - `submit` ([`submit`]): submissions to a real scheduler process, each saved before it is
//!   answered;
//! - `launch` ([`launch`]): jobs started and reaped by the scheduler's executor under each way
//!   of containing them;
//! - `fairness` ([`fairness`]): a policy against fifo+backfill on variants of a trace at
//!   several loads, by the figures issue 22's goals name;
//! - [`process`]: the services under measurement as child processes, their CPU and memory.

pub mod fairness;
pub mod fill;
pub mod launch;
pub mod load;
pub mod process;
pub mod schedule;
pub mod submit;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_exporter::exposition::{render, Format, Health, Snapshot};
use gpuledger_exporter::source::{sample_ref, JobLabel};
use gpuledger_exporter::synthetic::{synthetic_devices, synthetic_reading, TelemetryProfile};
use gpuledger_model::sample::SampleBatchBuilder;
use gpuledger_model::GpuModel;

use gpuledger_model::stats::percentile;

use crate::process::{cpu_seconds_of, memory_of, spawn, spawn_self, stop, Service};

/// Which measurement.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Ingest over loopback HTTP from many concurrent nodes into a real aggregator process.
    Ingest {
        #[arg(long, default_value_t = 100)]
        nodes: usize,
        /// Batches each node sends.
        #[arg(long, default_value_t = 20)]
        batches: u64,
        /// Rows per batch (8 GPUs x samples per push).
        #[arg(long, default_value_t = 800)]
        rows: usize,
    },
    /// `/metrics` render time of the exporter's page.
    Render {
        #[arg(long, default_value_t = 8)]
        gpus: u16,
        #[arg(long, default_value_t = 2000)]
        iterations: usize,
    },
    /// The monthly per-account report over a data directory: raw samples (bench/report.sql,
    /// the SQL bench/duckdb_report.py runs too) and the indicators from rollups.
    Report {
        #[arg(long)]
        data_dir: std::path::PathBuf,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Run this SQL file instead of bench/report.sql.
        #[arg(long)]
        sql: Option<std::path::PathBuf>,
    },
    /// A month's invoices for a cluster of `--gpus` (8 a node, one job per node a day, 10
    /// accounts, 5% idle), from usage rows at rollup granularity; or, with `--data-dir`, from
    /// that directory's stored rollups through DataFusion.
    Invoice {
        #[arg(long, default_value_t = 512)]
        gpus: u32,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// The month, YYYY-MM.
        #[arg(long, default_value = "2026-06")]
        month: String,
    },
    /// One scheduling cycle with `--pending` jobs queued on a full cluster of `--nodes`.
    Schedule(schedule::ScheduleArgs),
    /// Submissions to a real scheduler process over loopback, each saved before it is
    /// answered, into a queue that only grows: per second, latency, the state file's size.
    Submit(submit::SubmitArgs),
    /// Jobs started and reaped by the scheduler's executor (as root): a cgroup alone, with
    /// memory, CPU and task limits, with a /tmp of its own, with both; launches per second.
    Launch(launch::LaunchArgs),
    /// A policy against fifo+backfill on variants of a trace at several offered loads: jobs
    /// waiting over 7 days, the longest wait, weeks under 0.5 and 0.8 of the fair share, mean
    /// wait and utilization against the baseline's, per run and summed.
    Fairness(fairness::FairnessArgs),
    /// Placement's fill test: jobs arrive and never end until they stop fitting; the share of
    /// GPUs held then, on a uniform and a mixed cluster, with free-form and shaped jobs.
    Fill(fill::FillArgs),
    /// A real exporter process sampling 8 synthetic GPUs every second: CPU and memory.
    Exporter {
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 8)]
        gpus: u16,
    },
    /// Many simulated exporters pushing to a real aggregator at a steady rate: ingest latency
    /// percentiles, the aggregator's CPU and memory over time, every sample stored once. With
    /// `--seconds 1800`, the soak test.
    Load(load::LoadArgs),
}

/// Runs a measurement and prints its figures.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Ingest {
            nodes,
            batches,
            rows,
        } => ingest(nodes, batches, rows),
        BenchCommand::Render { gpus, iterations } => render_bench(gpus, iterations),
        BenchCommand::Schedule(args) => {
            print!("{}", schedule::run(&args)?);
            Ok(())
        }
        BenchCommand::Submit(args) => {
            print!("{}", submit::run(&args)?);
            Ok(())
        }
        BenchCommand::Launch(args) => {
            print!("{}", launch::run(&args)?);
            Ok(())
        }
        BenchCommand::Fairness(args) => {
            print!("{}", fairness::run(&args)?);
            Ok(())
        }
        BenchCommand::Exporter { seconds, gpus } => exporter(seconds, gpus),
        BenchCommand::Fill(args) => {
            print!("{}", fill::run(&args)?);
            Ok(())
        }
        BenchCommand::Load(args) => load::run(&args),
        BenchCommand::Invoice {
            gpus,
            runs,
            data_dir,
            month,
        } => invoice_bench(gpus, runs, data_dir.as_deref(), &month),
        BenchCommand::Report {
            data_dir,
            runs,
            sql,
        } => {
            let text = match sql {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
                None => REPORT_SQL.to_owned(),
            };
            report(&data_dir, runs, &text)
        }
    }
}

fn spawn_exporter(alone: Option<&Path>, args: &[&str]) -> anyhow::Result<Service> {
    match alone {
        Some(binary) => spawn(binary, args),
        None => {
            let mut with_sub = vec!["exporter"];
            with_sub.extend_from_slice(args);
            spawn_self(&with_sub)
        }
    }
}

/// The cluster a load pushes into: `nodes` nodes of `gpus` H100 named `node001`.., account
/// `team-a`, billed as labelled (the pushers post no job events). Written to `dir`; its path.
pub fn bench_cluster(dir: &Path, nodes: usize, gpus: u16) -> anyhow::Result<std::path::PathBuf> {
    let toml = format!(
        r#"version = 1
[cluster]
name = "bench"
[[node_pools]]
name = "h100"
prefix = "node"
count = {nodes}
gpus_per_node = {gpus}
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
[prices]
version = "bench"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = {{ h100-sxm = "10.00" }}
[[accounts]]
id = "team-a"
name = "A"
weight = 1
[telemetry]
allocations = "none"
"#
    );
    gpuledger_model::ClusterConfig::from_toml_str(&toml, "bench cluster")?;
    let path = dir.join("bench-cluster.toml");
    std::fs::write(&path, toml)?;
    Ok(path)
}

/// The name of load node `n` (from 0) in [`bench_cluster`].
pub fn bench_node(n: usize) -> String {
    format!("node{:03}", n + 1)
}

fn node_batches(node: &str, batches: u64, rows: usize, t0_ms: i64) -> anyhow::Result<Vec<Vec<u8>>> {
    let gpus = 8;
    let devices = synthetic_devices(1, node, gpus, GpuModel::H100Sxm);
    let profile = TelemetryProfile::generic("team-a".parse()?);
    let label = JobLabel {
        job_id: format!("{node}-job"),
        account: "team-a".into(),
        project: None,
    };
    (0..batches)
        .map(|b| {
            let mut builder = SampleBatchBuilder::with_capacity(rows);
            for r in 0..rows {
                let step = b as i64 * (rows / gpus as usize) as i64 + (r / gpus as usize) as i64;
                let device = &devices[r % gpus as usize];
                let time_ms = t0_ms + step * 1000;
                let reading = synthetic_reading(1, r as u64, device, Some(&profile), time_ms, 1);
                builder.push_ref(&sample_ref(
                    node,
                    device,
                    &reading,
                    Some(&label),
                    time_ms,
                    1,
                ));
            }
            Ok(encode_ipc(&builder.finish()?)?)
        })
        .collect()
}

fn ingest(nodes: usize, batches: u64, rows: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let span_s = batches as i64 * (rows / 8) as i64;
    let t0_ms = now_ms - now_ms.rem_euclid(1000) - (span_s + 60) * 1000;
    eprintln!("encoding {nodes} x {batches} batches of {rows} rows ...");
    let payloads: Vec<Arc<Vec<Vec<u8>>>> = (0..nodes)
        .map(|n| node_batches(&bench_node(n), batches, rows, t0_ms).map(Arc::new))
        .collect::<anyhow::Result<_>>()?;
    let bytes: usize = payloads.iter().flat_map(|p| p.iter()).map(Vec::len).sum();
    let data_dir = dir.path().join("data");
    let config = bench_cluster(dir.path(), nodes, 8)?;
    let aggregator = spawn_self(&[
        "aggregator",
        "--listen",
        "127.0.0.1:0",
        "--flush-interval",
        "10s",
        "--config",
        config.to_str().context("temporary path")?,
        "--data-dir",
        data_dir.to_str().context("temporary path")?,
    ])?;
    let pid = aggregator.child.id();
    let started = Instant::now();
    let threads: Vec<_> = payloads
        .into_iter()
        .enumerate()
        .map(|(n, batches)| {
            let url = format!("{}/api/v1/ingest", aggregator.url);
            std::thread::spawn(move || -> anyhow::Result<()> {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let node = bench_node(n);
                for (seq, body) in batches.iter().enumerate() {
                    let mut r = agent
                        .post(&url)
                        .header(gpuledger_model::wire::NODE_HEADER, &node)
                        .header(gpuledger_model::wire::SEQ_HEADER, seq.to_string())
                        .send(&body[..])?;
                    if r.status() != 200 {
                        bail!("{node} batch {seq}: {}", r.body_mut().read_to_string()?);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a node thread panicked"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (peak, rss) = memory_of(pid).unwrap_or_default();
    let server_cpu = cpu_seconds_of(pid).unwrap_or_default();
    let flush_started = Instant::now();
    stop(aggregator)?;
    let flush_s = flush_started.elapsed().as_secs_f64();
    let samples = nodes as f64 * batches as f64 * rows as f64;
    println!("ingest: {nodes} nodes x {batches} batches x {rows} rows = {samples} samples, {:.1} MiB of Arrow IPC", bytes as f64 / 1048576.0);
    println!(
        "  acknowledged in {elapsed:.2} s: {:.0} samples/s, {:.0} batches/s",
        samples / elapsed,
        nodes as f64 * batches as f64 / elapsed
    );
    println!("  aggregator CPU {server_cpu:.1} s; peak RSS {:.0} MiB (now {:.0} MiB); shutdown flush {flush_s:.2} s", peak as f64 / 1048576.0, rss as f64 / 1048576.0);
    println!(
        "  Parquet written: {:.1} MiB",
        dir_bytes(&data_dir) as f64 / 1048576.0
    );
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        dir_bytes(&p)
                    } else {
                        e.metadata().map(|m| m.len()).unwrap_or(0)
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The SQL both engines run.
pub const REPORT_SQL: &str = include_str!("../report.sql");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(data_dir: &Path, runs: usize, sql: &str) -> anyhow::Result<()> {
    use gpuledger_aggregator::layout::Layout;
    use gpuledger_aggregator::query::Query;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let query = Query::open(&Layout::new(data_dir)).await?;
        let mut raw = Vec::new();
        let mut accounts = 0;
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            let batches = query.sql(sql).await?;
            raw.push(t.elapsed().as_secs_f64());
            accounts = batches.iter().map(|b| b.num_rows()).sum();
        }
        let mut rollups = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let rows = query.account_indicators(i64::MIN / 2, i64::MAX / 2).await?;
            rollups.push(t.elapsed().as_secs_f64());
            accounts = accounts.max(rows.len());
        }
        let (peak, _) = memory_of(std::process::id()).unwrap_or_default();
        println!("datafusion: raw samples report ({accounts} accounts): median {:.2} s over {} runs (min {:.2}, max {:.2})",
            median(raw.clone()), raw.len(), raw.iter().copied().fold(f64::INFINITY, f64::min), raw.iter().copied().fold(0.0, f64::max));
        println!("datafusion: all indicators from rollups: median {:.1} ms over 5 runs", median(rollups) * 1000.0);
        println!("peak RSS {:.0} MiB", peak as f64 / 1048576.0);
        Ok(())
    })
}

fn render_bench(gpus: u16, iterations: usize) -> anyhow::Result<()> {
    let devices = synthetic_devices(1, "node001", gpus, GpuModel::H100Sxm);
    let profile = TelemetryProfile::generic("team-a".parse()?);
    let readings = devices
        .iter()
        .map(|d| {
            Some(synthetic_reading(
                1,
                u64::from(d.index),
                d,
                Some(&profile),
                0,
                1,
            ))
        })
        .collect();
    let labels = devices
        .iter()
        .map(|d| {
            Some(JobLabel {
                job_id: format!("{}", 1000 + d.index / 8),
                account: "team-a".into(),
                project: Some("llm".into()),
            })
        })
        .collect();
    let snapshot = Snapshot {
        node: "node001".into(),
        source: "synthetic",
        energy_joules_total: vec![1234.5; devices.len()],
        devices,
        readings,
        labels,
        health: Health::default(),
        ..Snapshot::default()
    };
    let mut times_ns = Vec::with_capacity(iterations);
    let mut bytes = 0;
    for _ in 0..iterations {
        let t = Instant::now();
        let page = render(&snapshot, Format::Prometheus);
        times_ns.push(t.elapsed().as_nanos() as i64);
        bytes = page.len();
    }
    times_ns.sort_unstable();
    let us = |p| percentile(&times_ns, p).unwrap_or(0) as f64 / 1000.0;
    println!("render: {gpus} GPUs, {bytes} bytes a page, {iterations} renders: p50 {:.1} us, p99 {:.1} us, max {:.1} us", us(50.0), us(99.0), us(100.0));
    Ok(())
}

fn exporter(seconds: u64, gpus: u16) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    // A cluster that defines the exporter's node: its pushes are stored, not refused.
    let config = bench_cluster(dir.path(), 1, gpus)?;
    let aggregator = spawn_self(&[
        "aggregator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().context("path")?,
        "--config",
        config.to_str().context("path")?,
    ])?;
    let spool = dir.path().join("spool");
    let gpus_text = gpus.to_string();
    // The exporter alone when it is built next to this binary (what nodes run), else
    // `gpuledger exporter`.
    let alone = std::env::current_exe()?.with_file_name("gpuledger-exporter");
    let exporter = spawn_exporter(
        alone.exists().then_some(alone.as_path()),
        &[
            "--node",
            "node001",
            "--gpus",
            &gpus_text,
            "--sample-interval",
            "1s",
            "--push-interval",
            "10s",
            "--listen",
            "127.0.0.1:0",
            "--aggregator-url",
            &aggregator.url,
            "--spool-dir",
            spool.to_str().context("path")?,
        ],
    )?;
    let pid = exporter.child.id();
    // Let it settle, then measure a window.
    std::thread::sleep(Duration::from_secs(2));
    let cpu0 = cpu_seconds_of(pid).unwrap_or_default();
    let t0 = Instant::now();
    let scraper = ureq::Agent::new_with_defaults();
    while t0.elapsed() < Duration::from_secs(seconds) {
        // A scrape every 5 s, as Prometheus would.
        let _ = scraper.get(format!("{}/metrics", exporter.url)).call();
        std::thread::sleep(Duration::from_secs(5));
    }
    let cpu = cpu_seconds_of(pid).unwrap_or_default() - cpu0;
    let window = t0.elapsed().as_secs_f64();
    let (peak, rss) = memory_of(pid).unwrap_or_default();
    stop(exporter)?;
    stop(aggregator)?;
    let samples = window * f64::from(gpus);
    let which = if alone.exists() {
        "gpuledger-exporter"
    } else {
        "gpuledger exporter"
    };
    println!("exporter ({which}): {gpus} GPUs sampled every 1 s, pushed every 10 s, scraped every 5 s, for {window:.0} s");
    println!(
        "  CPU {cpu:.2} s = {:.3}% of one core; {:.1} us of CPU per GPU sample",
        cpu / window * 100.0,
        cpu / samples * 1e6
    );
    println!(
        "  resident memory {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1048576.0,
        peak as f64 / 1048576.0
    );
    Ok(())
}

/// Usage of a synthetic month at rollup granularity (job x node x hour).
fn synthetic_month(
    gpus: u32,
    period: &gpuledger_billing::Period,
) -> gpuledger_billing::BillingInput {
    use gpuledger_billing::{BillingInput, IdleHour, UsageHour};
    use gpuledger_model::{AccountId, GpuModel, JobId, NodeId, ProjectId};
    let nodes = gpus.div_ceil(8);
    let hours = (period.end - period.start) / 3600;
    let accounts: Vec<AccountId> = (0..10)
        .map(|i| AccountId::new(format!("team-{}", (b'a' + i) as char)).expect("valid"))
        .collect();
    let project = ProjectId::new("main").expect("valid");
    let mut input = BillingInput::default();
    for n in 0..nodes {
        let node = NodeId::new(format!("n{n:05}")).expect("valid");
        for h in 0..hours {
            let day = h / 24;
            let hour_start = period.start + h * 3600;
            // One hour in twenty the node is idle.
            if (n as i64 + h) % 20 == 0 {
                input.idle.push(IdleHour {
                    node: node.clone(),
                    gpu_model: GpuModel::H100Sxm,
                    hour_start,
                    gpu_seconds: 8 * 3600,
                    quarter_seconds: None,
                });
                continue;
            }
            input.usage.push(UsageHour {
                account: accounts[(n as usize + day as usize) % accounts.len()].clone(),
                project: Some(project.clone()),
                job_id: Some(JobId::new(format!("{n}-{day}")).expect("valid")),
                node: node.clone(),
                gpu_model: GpuModel::H100Sxm,
                hour_start,
                gpu_seconds: 8 * 3600,
                quarter_seconds: None,
                mfu_bp: Some(((n as i64 * 37 + h * 11) % 6000) as u32 + 500),
            });
        }
    }
    input
}

fn invoice_bench(
    gpus: u32,
    runs: usize,
    data_dir: Option<&Path>,
    month: &str,
) -> anyhow::Result<()> {
    use gpuledger_billing::render::{focus_csv, invoice_csv, invoice_html, invoice_json};
    use gpuledger_billing::{charge, BillingModel, Period};
    let book = gpuledger_sim::seed::load_price_book(None)?;
    let period = Period::month(month)?;
    let t = Instant::now();
    let input = match data_dir {
        Some(dir) => {
            let layout = gpuledger_aggregator::layout::Layout::new(dir);
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            let q = runtime.block_on(gpuledger_aggregator::query::Query::open(&layout))?;
            let source = gpuledger_aggregator::billing_source::TablesUsage::new(&q, &runtime);
            let storage = gpuledger_billing::storage::read_storage_scans(layout.root())?;
            let config = gpuledger_sim::seed::load_cluster(None)?;
            gpuledger_billing::source::gather(
                &source,
                &period,
                gpuledger_billing::source::Metering::for_cluster(
                    &config.telemetry,
                    period.end * 1000,
                ),
                &gpuledger_billing::source::NodeModels::from_config(&config),
                storage,
                Vec::new(),
            )?
        }
        None => synthetic_month(gpus, &period),
    };
    let read = t.elapsed();
    println!(
        "invoice bench: {} usage rows, {} idle rows ({}), read in {:.3} s",
        input.usage.len(),
        input.idle.len(),
        data_dir
            .map(|d| format!("rollups under {}", d.display()))
            .unwrap_or_else(|| format!("synthetic, {gpus} GPUs")),
        read.as_secs_f64()
    );
    for run in 0..runs {
        let t = Instant::now();
        let invoices = charge(&period, &input, &book, None)?;
        let priced = t.elapsed();
        for m in BillingModel::ALL {
            charge(&period, &input, &book, Some(m))?;
        }
        let compared = t.elapsed();
        let mut bytes = 0;
        for inv in &invoices {
            bytes += invoice_csv(inv).len() + invoice_json(inv).len() + invoice_html(inv).len();
        }
        bytes += focus_csv(&invoices, "bench").len();
        let rendered = t.elapsed();
        let total: rust_decimal::Decimal = invoices.iter().map(|i| i.total()).sum();
        println!(
            "run {run}: price {:.3} s, + 3 models compared {:.3} s, + rendered ({} invoices, {} bytes) {:.3} s; total {total}",
            priced.as_secs_f64(),
            compared.as_secs_f64(),
            invoices.len(),
            bytes,
            rendered.as_secs_f64()
        );
    }
    Ok(())
}
