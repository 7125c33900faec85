//! The whole path of the demo: a workload goes through the scheduler in simulated time; every
//! GPU's telemetry is synthesised from what the scheduler placed on it and pushed through the
//! aggregator's ingest path into Parquet; billing prices the stored usage. Nothing is computed
//! twice from different sources: the invoice comes from the stored rollups, not from the
//! scheduler's records, so the end-to-end test can compare the two. A trace replay's month is
//! stored and billed the same way ([`store_simulated_month`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use gpuledger_aggregator::billing_source::TablesUsage;
use gpuledger_aggregator::query::{AccountIndicators, Query};
use gpuledger_aggregator::store::{FlushStats, StoreOptions};
use gpuledger_aggregator::{Accepted, IngestOutcome, Ingestor, IngestorConfig, Store};
use gpuledger_billing::invoices::bill_month;
use gpuledger_billing::source::{gather, Metering, NodeModels};
use gpuledger_billing::storage::read_storage_scans;
use gpuledger_billing::{Invoice, Period, PriceBook};
use gpuledger_exporter::synthetic::{
    synthesize_node, synthetic_devices, Segment, TelemetryProfile,
};
use gpuledger_exporter::{GpuDevice, JobLabel};
use gpuledger_model::config::{ConfigError, FieldError};
use gpuledger_model::time::{ManualClock, MS_PER_HOUR};
use gpuledger_model::ClusterConfig;
use gpuledger_scheduler::workload::WorkloadSpec;
use gpuledger_scheduler::{simulate, SchedulerOptions, SimResult};

use crate::{Error, Result};

/// A demo month: the workload and how each team uses its GPUs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSpec {
    /// Seconds between samples of each GPU.
    #[serde(default = "default_interval")]
    pub sample_interval_s: u32,
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub telemetry: Vec<TelemetryProfile>,
}

fn default_interval() -> u32 {
    10
}

/// The longest demo: its telemetry is simulated second by second for every GPU.
pub const MAX_DEMO_DAYS: u32 = 366;

impl DemoSpec {
    /// Parses and checks a demo spec; errors name `origin`, the field and its line.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<DemoSpec, ConfigError> {
        let spec: DemoSpec = gpuledger_model::config::parse_toml(src, origin)?;
        let errors = spec.validate();
        if errors.is_empty() {
            return Ok(spec);
        }
        Err(ConfigError::invalid_in(src, origin, errors))
    }

    /// Every value that would stop or mislead the demo: a zero sample interval (nothing would
    /// advance), more days than [`MAX_DEMO_DAYS`], the workload's and the telemetry profiles'
    /// figures outside their ranges.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut err = |field: String, message: String| errors.push(FieldError::new(field, message));
        if !(1..=3600).contains(&self.sample_interval_s) {
            err(
                "sample_interval_s".into(),
                format!("{} is out of range; use 1 to 3600", self.sample_interval_s),
            );
        }
        if !(1..=MAX_DEMO_DAYS).contains(&self.workload.days) {
            err(
                "workload.days".into(),
                format!(
                    "{} is out of range; use 1 to {MAX_DEMO_DAYS}",
                    self.workload.days
                ),
            );
        }
        for (field, message) in self.workload.problems() {
            err(format!("workload.{field}"), message);
        }
        for (i, p) in self.telemetry.iter().enumerate() {
            let mut fraction = |name: &str, value: f32, max: f32| {
                if !(value.is_finite() && (0.0..=max).contains(&value)) {
                    err(
                        format!("telemetry[{i}].{name}"),
                        format!("{value} is out of range; use 0 to {max}"),
                    );
                }
            };
            fraction("gpu_util_pct", p.gpu_util_pct, 100.0);
            fraction("sm_active", p.sm_active, 1.0);
            fraction("tensor_active", p.tensor_active, 1.0);
            fraction("dram_active", p.dram_active, 1.0);
            fraction("memory_fraction", p.memory_fraction, 1.0);
            fraction("power_fraction", p.power_fraction, 1.0);
            if let Some(mfu) = p.reported_mfu {
                fraction("reported_mfu", mfu, 1.0);
            }
        }
        errors
    }
}

/// Reports progress of the long phases.
pub trait Progress: Sync {
    fn phase(&self, name: &str, total: u64);
    fn advance(&self, n: u64);
    fn finish(&self);
}

/// No progress display (tests).
#[derive(Debug)]
pub struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// What a run produced.
#[derive(Debug)]
pub struct RunOutput {
    pub sim: SimResult,
    pub samples: u64,
    pub batches: u64,
    pub flush: FlushStats,
    pub month: String,
    pub invoices: Vec<Invoice>,
    pub invoice_files: Vec<PathBuf>,
    pub indicators: Vec<AccountIndicators>,
    /// Cluster utilization measured from the stored telemetry.
    pub measured_utilization: Option<f64>,
    pub timings: Vec<(&'static str, Duration)>,
    pub data_dir: PathBuf,
}

/// Runs the pipeline into `data_dir`.
pub fn run(
    config: &ClusterConfig,
    spec: &DemoSpec,
    options: SchedulerOptions,
    prices: &PriceBook,
    data_dir: &Path,
    progress: &dyn Progress,
) -> Result<RunOutput> {
    let mut timings = Vec::new();
    let started = Instant::now();
    let jobs = spec.workload.generate();
    let start_s = spec.workload.start_s();
    let end_s = spec.workload.end_s();

    progress.phase("scheduling", jobs.len() as u64);
    let mut last = 0usize;
    let sim = simulate(config, options, jobs, Some(end_s), &mut |done, _| {
        progress.advance((done - last) as u64);
        last = done;
    });
    progress.finish();
    timings.push(("schedule", started.elapsed()));

    let month = spec.workload.start.format("%Y-%m").to_string();
    let stored = store_and_bill(
        config, spec, &sim, prices, data_dir, &month, start_s, end_s, progress,
    )?;
    timings.extend(stored.timings);
    timings.push(("total", started.elapsed()));
    Ok(RunOutput {
        sim,
        samples: stored.samples,
        batches: stored.batches,
        flush: stored.flush,
        month,
        invoices: stored.invoices,
        invoice_files: stored.invoice_files,
        indicators: stored.indicators,
        measured_utilization: stored.measured_utilization,
        timings,
        data_dir: data_dir.to_path_buf(),
    })
}

/// What [`store_and_bill`] produced.
#[derive(Debug)]
pub struct Stored {
    pub samples: u64,
    pub batches: u64,
    pub flush: FlushStats,
    pub invoices: Vec<Invoice>,
    pub invoice_files: Vec<PathBuf>,
    pub indicators: Vec<AccountIndicators>,
    pub measured_utilization: Option<f64>,
    pub timings: Vec<(&'static str, Duration)>,
}

/// Stores a simulation's job events and synthesised telemetry for `[start_s, end_s)` in
/// `data_dir` through the aggregator's ingest path, then bills `month` from the stored files.
#[allow(clippy::too_many_arguments)]
pub fn store_and_bill(
    config: &ClusterConfig,
    spec: &DemoSpec,
    sim: &SimResult,
    prices: &PriceBook,
    data_dir: &Path,
    month: &str,
    start_s: i64,
    end_s: i64,
    progress: &dyn Progress,
) -> Result<Stored> {
    let mut timings = Vec::new();
    let t = Instant::now();
    let store = Arc::new(Store::open(data_dir, StoreOptions::default())?);
    // Telemetry is replayed after the fact, so the aggregator's clock stands at the month's end.
    let clock = Arc::new(ManualClock::new(end_s * 1000 + 60_000));
    let ingestor = Ingestor::new(
        Arc::clone(&store),
        IngestorConfig::new(gpuledger_model::Inventory::from_config(config)),
        clock,
    );
    ingestor
        .ingest_job_events("scheduler", None, &sim.events)?
        .into_result()?;
    let reports = flops_reports(config, spec, sim, end_s);
    ingestor
        .ingest_job_events("frameworks", None, &reports)?
        .into_result()?;
    let (samples, batches) =
        ingest_telemetry(config, spec, sim, &ingestor, start_s, end_s, progress)?;
    let flush = store.flush()?;
    timings.push(("telemetry + ingest + parquet", t.elapsed()));

    let t = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(Error::io("starting the query runtime"))?;
    let period = Period::month(month)?;
    let q = runtime.block_on(Query::open(store.layout()))?;
    let storage = read_storage_scans(store.layout().root())?;
    // Runs still going at the month's end are held up to it.
    let input = gather(
        &TablesUsage::new(&q, &runtime),
        &period,
        Metering::for_cluster(&config.telemetry, end_s * 1000),
        &NodeModels::from_config(config),
        storage,
        Vec::new(),
    )?;
    let (from, to) = (start_s * 1000, end_s * 1000);
    let (indicators, measured_utilization) = runtime.block_on(async {
        let indicators = q.account_indicators(from, to).await?;
        let utilization = q.cluster_utilization(from, to).await?;
        Ok::<_, Error>((indicators, utilization))
    })?;
    let billed = bill_month(
        &store.layout().invoices_dir(&period.name),
        &period,
        &input,
        prices,
        None,
        &config.cluster.name,
    )?;
    let (invoices, invoice_files) = (billed.invoices, billed.files);
    timings.push(("query + billing", t.elapsed()));
    Ok(Stored {
        samples,
        batches,
        flush,
        invoices,
        invoice_files,
        indicators,
        measured_utilization,
        timings,
    })
}

/// The FLOP/s each job of a tenant that reports its MFU ([`TelemetryProfile::reported_mfu`])
/// posts when a run ends (or at `end_s` for one still running): its MFU x its GPUs x their
/// model's peak, what a training framework computes from its model's FLOPs per step.
fn flops_reports(
    config: &ClusterConfig,
    spec: &DemoSpec,
    sim: &SimResult,
    end_s: i64,
) -> Vec<gpuledger_model::job::JobEvent> {
    use gpuledger_model::job::{JobEvent, JobEventKind};
    let reported: HashMap<&str, f32> = spec
        .telemetry
        .iter()
        .filter_map(|p| Some((p.account.as_str(), p.reported_mfu?)))
        .collect();
    let models: HashMap<String, gpuledger_model::GpuModel> = config
        .nodes()
        .into_iter()
        .map(|n| (n.id.to_string(), n.gpu_model))
        .collect();
    let mut out = Vec::new();
    for record in &sim.records {
        let Some(&mfu) = reported.get(record.spec.account.as_str()) else {
            continue;
        };
        for run in &record.runs {
            let Some(model) = run
                .allocation
                .0
                .first()
                .and_then(|n| models.get(n.node.as_str()))
            else {
                continue;
            };
            let at_s = run.end_s.unwrap_or(end_s).min(end_s);
            let mut event = JobEvent::new(
                at_s * 1000,
                record.spec.id.clone(),
                record.spec.account.clone(),
                record.spec.project.clone(),
                JobEventKind::FlopsReported,
            );
            event.achieved_flops =
                Some(f64::from(mfu) * run.gpu_equivalent() * model.peak_dense_bf16_flops());
            out.push(event);
        }
    }
    out
}

/// Per node, per GPU: the job segments the scheduler placed there.
type Timelines = HashMap<String, Vec<Vec<Segment>>>;

fn timelines(config: &ClusterConfig, spec: &DemoSpec, sim: &SimResult) -> Timelines {
    let profiles: HashMap<&str, &TelemetryProfile> = spec
        .telemetry
        .iter()
        .map(|p| (p.account.as_str(), p))
        .collect();
    let mut out: Timelines = config
        .nodes()
        .iter()
        .map(|n| (n.id.to_string(), vec![Vec::new(); n.gpus as usize]))
        .collect();
    for rec in &sim.records {
        let label = JobLabel {
            job_id: rec.spec.id.to_string(),
            account: rec.spec.account.to_string(),
            project: rec.spec.project.as_ref().map(|p| p.to_string()),
        };
        let profile = profiles
            .get(rec.spec.account.as_str())
            .map(|p| (*p).clone())
            .unwrap_or_else(|| TelemetryProfile::generic(rec.spec.account.clone()));
        for run in &rec.runs {
            let end = run.end_s.unwrap_or(sim.horizon_s).min(sim.horizon_s);
            if end <= run.start_s {
                continue;
            }
            for held in &run.allocation.0 {
                let Some(gpus) = out.get_mut(held.node.as_str()) else {
                    continue;
                };
                for &g in &held.gpus {
                    if let Some(segments) = gpus.get_mut(g as usize) {
                        segments.push(Segment {
                            start_ms: run.start_s * 1000,
                            end_ms: end * 1000,
                            label: label.clone(),
                            profile: profile.clone(),
                        });
                    }
                }
            }
        }
    }
    for gpus in out.values_mut() {
        for segments in gpus.iter_mut() {
            segments.sort_by_key(|s| s.start_ms);
        }
    }
    out
}

/// Synthesises every GPU's samples hour by hour and pushes each node-hour as one batch through
/// the ingest path, on all cores (one UTC day per worker at a time).
fn ingest_telemetry(
    config: &ClusterConfig,
    spec: &DemoSpec,
    sim: &SimResult,
    ingestor: &Ingestor,
    start_s: i64,
    end_s: i64,
    progress: &dyn Progress,
) -> Result<(u64, u64)> {
    let timelines = timelines(config, spec, sim);
    let nodes: Vec<(String, Vec<GpuDevice>)> = config
        .nodes()
        .iter()
        .map(|n| {
            let id = n.id.to_string();
            let devices = synthetic_devices(spec.workload.seed, &id, n.gpus as u16, n.gpu_model);
            (id, devices)
        })
        .collect();
    let hours = ((end_s - start_s) * 1000 + MS_PER_HOUR - 1)
        .div_euclid(MS_PER_HOUR)
        .max(0) as usize;
    let days = hours.div_ceil(24);
    progress.phase("telemetry", (hours * nodes.len()) as u64);
    let next_day = AtomicUsize::new(0);
    let samples = AtomicUsize::new(0);
    let batches = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let day = next_day.fetch_add(1, Ordering::Relaxed);
                        if day >= days {
                            return Ok(());
                        }
                        for hour in day * 24..((day + 1) * 24).min(hours) {
                            let from = start_s * 1000 + hour as i64 * MS_PER_HOUR;
                            let to = (from + MS_PER_HOUR).min(end_s * 1000);
                            for (node, devices) in &nodes {
                                let batch = synthesize_node(
                                    spec.workload.seed,
                                    node,
                                    devices,
                                    &timelines[node],
                                    from,
                                    to,
                                    spec.sample_interval_s,
                                )
                                .map_err(|e| {
                                    Error::Invalid(format!("synthesising {node} hour {hour}: {e}"))
                                })?;
                                match ingestor.ingest_samples(node, hour as u64, &batch).map_err(
                                    |e| {
                                        Error::from(e)
                                            .context(format!("ingesting {node} hour {hour}"))
                                    },
                                )? {
                                    IngestOutcome::Accepted(Accepted { rows, .. }) => {
                                        samples.fetch_add(rows, Ordering::Relaxed);
                                        batches.fetch_add(1, Ordering::Relaxed);
                                    }
                                    IngestOutcome::Duplicate => {
                                        return Err(Error::Invalid(format!(
                                            "node {node} hour {hour} was ingested twice"
                                        )))
                                    }
                                }
                                progress.advance(1);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| Error::Invalid("a telemetry worker panicked".into()))??;
        }
        Ok(())
    })?;
    progress.finish();
    Ok((
        samples.load(Ordering::Relaxed) as u64,
        batches.load(Ordering::Relaxed) as u64,
    ))
}

/// What a demo writes under its data directory; [`clear_outputs`] removes only these.
const OUTPUTS: [&str; 6] = ["samples", "rollups", "jobs", "invoices", "wal", "storage"];

/// Empties `dir` of an earlier demo's outputs, and refuses a directory holding anything else
/// (so `--data-dir ~` cannot remove a home directory's files).
pub fn clear_outputs(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let entries =
        std::fs::read_dir(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    for entry in entries {
        let name = entry
            .map_err(Error::io(format!("reading {}", dir.display())))?
            .file_name();
        if !OUTPUTS.contains(&name.to_string_lossy().as_ref()) {
            return Err(Error::Invalid(format!(
                "{} holds `{}`, which gpuledger did not write; choose another --data-dir",
                dir.display(),
                name.to_string_lossy()
            )));
        }
    }
    for sub in OUTPUTS {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(Error::io(format!("removing {}", p.display())))?;
        }
    }
    Ok(())
}

/// What [`store_simulated_month`] stored: the month's figures and what was billed.
#[derive(Debug)]
pub struct StoredMonth {
    pub stored: Stored,
    /// GPU-seconds the scheduler allocated within the month.
    pub allocated_gpu_seconds: i64,
    /// GPU-seconds the month's invoices bill.
    pub billed_gpu_seconds: i64,
}

/// Stores a simulated month (`YYYY-MM`) as telemetry and job events in `data_dir` and bills
/// it: the path `gpuledger simulate --data-dir` takes after a trace replay.
pub fn store_simulated_month(
    config: &ClusterConfig,
    result: &SimResult,
    data_dir: &Path,
    month: &str,
    prices: &PriceBook,
) -> Result<StoredMonth> {
    let period = Period::month(month)?;
    let start = chrono::DateTime::from_timestamp(period.start, 0)
        .ok_or_else(|| Error::Invalid(format!("month `{month}` starts out of range")))?;
    let spec = DemoSpec {
        sample_interval_s: 10,
        workload: WorkloadSpec {
            seed: 1,
            start,
            days: ((period.end - period.start) / 86_400) as u32,
            teams: Vec::new(),
            fixed_jobs: Vec::new(),
        },
        telemetry: Vec::new(),
    };
    let stored = store_and_bill(
        config,
        &spec,
        result,
        prices,
        data_dir,
        month,
        period.start,
        period.end,
        &Quiet,
    )?;
    let billed_gpu_seconds = stored.invoices.iter().map(|i| i.gpu_seconds()).sum();
    // A part of a GPU counts as its part: share-unit-seconds, whole GPU-seconds per run.
    let allocated_gpu_seconds = result
        .records
        .iter()
        .flat_map(|r| &r.runs)
        .map(|run| {
            let end = run.end_s.unwrap_or(result.horizon_s).min(period.end);
            run.share_units() as i64 * (end - run.start_s.max(period.start)).max(0)
                / i64::from(gpuledger_model::SHARE_UNITS_PER_GPU)
        })
        .sum();
    Ok(StoredMonth {
        stored,
        allocated_gpu_seconds,
        billed_gpu_seconds,
    })
}
