//! `gpuledger bench load`: many simulated exporters push to a real aggregator process over
//! loopback at a steady rate, as a cluster's nodes do: each sends its GPUs' samples of the last
//! push interval as one batch, at its own phase within the interval, and retries a batch that
//! fails with the same sequence number (as the exporter does). Reports ingest latency
//! percentiles per report window and overall, the aggregator's CPU and resident memory over
//! time, and finally reads the stored samples back: every sample exactly once, or it fails.
//!
//! The same command is the soak test (`--seconds 1800`): the report lines show whether latency
//! or memory drift.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_exporter::source::GpuDevice;
use gpuledger_exporter::source::{sample_ref, JobLabel};
use gpuledger_exporter::synthetic::{synthetic_devices, synthetic_reading, TelemetryProfile};
use gpuledger_model::sample::SampleBatchBuilder;
use gpuledger_model::GpuModel;

use crate::process::{cpu_seconds_of, memory_of, spawn_self, stop};
use gpuledger_model::stats::percentile;

/// How long after its last push's time an exporter keeps retrying before the run fails (an
/// aggregator that stops acknowledging must fail the benchmark, not hang it).
const GRACE: Duration = Duration::from_secs(60);

/// What `bench load` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Simulated exporters (nodes).
    #[arg(long, default_value_t = 1000)]
    pub exporters: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus: u16,
    /// How long they push.
    #[arg(long, default_value_t = 120)]
    pub seconds: u64,
    /// Seconds of samples in each batch (each node pushes this often; samples are 1 s apart).
    #[arg(long, default_value_t = 1)]
    pub push_every: u64,
    /// A report line every this many seconds.
    #[arg(long, default_value_t = 10)]
    pub report_every: u64,
    /// Tables in this object store (`s3://...`, `file://...`) instead of a temporary
    /// directory; the log and staging stay in the temporary directory.
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// Latencies of acknowledged pushes, in microseconds, with the second they were sent in.
#[derive(Default)]
struct Latencies {
    by_second: Mutex<Vec<(u32, u32)>>,
}

impl Latencies {
    fn record(&self, second: u32, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.by_second
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((second, micros));
    }

    /// Milliseconds (p50, p99, p99.9, max) and the count of pushes sent in `[from, to)`.
    fn summary(&self, from: u32, to: u32) -> (f64, f64, f64, f64, usize) {
        let mut us: Vec<i64> = self
            .by_second
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(s, _)| (from..to).contains(s))
            .map(|&(_, us)| i64::from(us))
            .collect();
        us.sort_unstable();
        let ms = |p: f64| percentile(&us, p).unwrap_or(0) as f64 / 1000.0;
        (ms(50.0), ms(99.0), ms(99.9), ms(100.0), us.len())
    }
}

/// One node's batch: every GPU's sample of each second in `seconds`.
fn batch(
    node: &str,
    devices: &[GpuDevice],
    label: &JobLabel,
    profile: &TelemetryProfile,
    seconds: std::ops::Range<i64>,
) -> anyhow::Result<Vec<u8>> {
    let mut builder = SampleBatchBuilder::with_capacity(devices.len() * seconds.clone().count());
    for second in seconds {
        let time_ms = second * 1000;
        for device in devices {
            let key = u64::from(device.index);
            let reading = synthetic_reading(1, key, device, Some(profile), time_ms, 1);
            builder.push_ref(&sample_ref(node, device, &reading, Some(label), time_ms, 1));
        }
    }
    Ok(encode_ipc(&builder.finish()?)?)
}

struct Counters {
    acknowledged: AtomicU64,
    retries: AtomicU64,
    stop: AtomicBool,
}

/// What every simulated exporter shares: where to push and when.
struct Schedule {
    url: String,
    gpus: u16,
    /// The first second batch 0 covers.
    first_second: i64,
    /// Seconds of samples per batch, and between pushes.
    every: u64,
    pushes: u64,
    start: Instant,
}

/// One simulated exporter: pushes `schedule.pushes` batches, the k-th at
/// `start + (k + 1) * every + phase`.
fn exporter(
    node: String,
    phase: Duration,
    schedule: &Schedule,
    latencies: &Latencies,
    counters: &Counters,
) -> anyhow::Result<()> {
    let Schedule {
        ref url,
        gpus,
        first_second,
        every,
        pushes,
        start,
    } = *schedule;
    let devices = synthetic_devices(1, &node, gpus, GpuModel::H100Sxm);
    let profile = TelemetryProfile::generic("team-a".parse()?);
    let label = JobLabel {
        job_id: format!("{node}-job"),
        account: "team-a".into(),
        project: None,
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let give_up_at = start + Duration::from_secs(pushes * every) + GRACE;
    for k in 0..pushes {
        let due = start + Duration::from_secs(k * every + every) + phase;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let from = first_second + (k * every) as i64;
        let body = batch(&node, &devices, &label, &profile, from..from + every as i64)?;
        let second = u32::try_from(start.elapsed().as_secs()).unwrap_or(u32::MAX);
        loop {
            if counters.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if Instant::now() > give_up_at {
                bail!("{node} batch {k}: not acknowledged {GRACE:?} after the run's end");
            }
            let sent = Instant::now();
            let outcome = agent
                .post(url)
                .header(gpuledger_model::wire::NODE_HEADER, &node)
                .header(gpuledger_model::wire::SEQ_HEADER, k.to_string())
                .header(
                    gpuledger_model::wire::SENT_AT_HEADER,
                    chrono::Utc::now().timestamp_millis().to_string(),
                )
                .send(&body[..]);
            match outcome {
                Ok(r) if r.status() == 200 => {
                    latencies.record(second, sent.elapsed());
                    counters.acknowledged.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Ok(mut r) if r.status().is_client_error() => {
                    bail!(
                        "{node} batch {k}: refused: {}",
                        r.body_mut().read_to_string().unwrap_or_default()
                    );
                }
                _ => {
                    counters.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
    Ok(())
}

/// Runs the load and prints its report.
pub fn run(args: &LoadArgs) -> anyhow::Result<()> {
    if args.push_every == 0 || args.seconds < args.push_every {
        bail!("--push-every must be at least 1 and at most --seconds");
    }
    let dir = tempfile::tempdir()?;
    let data_dir = match &args.data_dir {
        Some(url) => url.clone(),
        None => dir
            .path()
            .join("data")
            .to_str()
            .context("temporary path")?
            .to_owned(),
    };
    let state_dir = dir.path().join("state");
    let max_connections = (args.exporters + 64).to_string();
    let config = crate::bench_cluster(dir.path(), args.exporters, args.gpus)?;
    let aggregator = spawn_self(&[
        "aggregator",
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        &max_connections,
        // Every simulated exporter connects from 127.0.0.1.
        "--max-connections-per-address",
        &max_connections,
        "--config",
        config.to_str().context("temporary path")?,
        "--data-dir",
        &data_dir,
        "--state-dir",
        state_dir.to_str().context("temporary path")?,
    ])?;
    let pid = aggregator.child.id();
    let url = format!("{}/api/v1/ingest", aggregator.url);
    let pushes = args.seconds / args.push_every;
    let now_s = chrono::Utc::now().timestamp();
    // Batch k holds the seconds it covers, sent just after they pass.
    let first_second = now_s - args.push_every as i64 + 1;
    let start = Instant::now();
    let latencies = Arc::new(Latencies::default());
    let counters = Arc::new(Counters {
        acknowledged: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    println!(
        "load: {} exporters x {} GPUs, a batch of {} s each every {} s, for {} s ({} samples/s)",
        args.exporters,
        args.gpus,
        args.push_every,
        args.push_every,
        args.seconds,
        args.exporters * usize::from(args.gpus)
    );
    let schedule = Arc::new(Schedule {
        url,
        gpus: args.gpus,
        first_second,
        every: args.push_every,
        pushes,
        start,
    });
    let interval = Duration::from_secs(args.push_every);
    let threads: Vec<_> = (0..args.exporters)
        .map(|n| {
            let (schedule, latencies, counters) = (
                Arc::clone(&schedule),
                Arc::clone(&latencies),
                Arc::clone(&counters),
            );
            let phase = interval.mul_f64(n as f64 / args.exporters as f64);
            std::thread::Builder::new()
                .name(crate::bench_node(n))
                .stack_size(256 << 10)
                .spawn(move || {
                    exporter(
                        crate::bench_node(n),
                        phase,
                        &schedule,
                        &latencies,
                        &counters,
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let peak_rss = monitor(args, pid, start, &latencies, &counters, &threads);
    let mut failures = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e.to_string()),
            Err(_) => failures.push("an exporter thread panicked".into()),
        }
    }
    let cpu = cpu_seconds_of(pid).unwrap_or_default();
    let (p50, p99, p999, max, n) = latencies.summary(0, u32::MAX);
    if let Some(first) = failures.first() {
        // An aggregator that stopped acknowledging may not stop on SIGTERM either.
        let mut aggregator = aggregator;
        let _ = aggregator.child.kill();
        let _ = aggregator.child.wait();
        bail!("{} exporters failed; the first: {first}", failures.len());
    }
    stop(aggregator)?;
    println!(
        "overall: {n} batches acknowledged, {} retried; latency p50 {p50:.1} ms, p99 {p99:.1} ms, \
         p99.9 {p999:.1} ms, max {max:.1} ms; aggregator CPU {cpu:.0} s ({:.0}% of a core), \
         peak RSS {:.0} MiB",
        counters.retries.load(Ordering::Relaxed),
        100.0 * cpu / start.elapsed().as_secs_f64(),
        peak_rss as f64 / 1048576.0
    );
    let expected = args.exporters as u64 * u64::from(args.gpus) * pushes * args.push_every;
    check_stored(&data_dir, expected)
}

/// Prints a line every `--report-every` seconds until the exporters are done; the peak RSS seen.
fn monitor(
    args: &LoadArgs,
    pid: u32,
    start: Instant,
    latencies: &Latencies,
    counters: &Counters,
    threads: &[std::thread::JoinHandle<anyhow::Result<()>>],
) -> u64 {
    println!("   s  batches  retries  p50 ms  p99 ms  max ms  CPU %  RSS MiB");
    let mut peak = 0;
    let mut last_cpu = cpu_seconds_of(pid).unwrap_or_default();
    let mut window_start = 0u32;
    let every = args.report_every.max(1);
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(Duration::from_secs(1));
        let (_, rss) = memory_of(pid).unwrap_or_default();
        peak = peak.max(rss);
        let now = start.elapsed().as_secs();
        if !now.is_multiple_of(every) || now == u64::from(window_start) {
            continue;
        }
        // The window just closed, less its last second (pushes still in flight).
        let window_end = now as u32 - 1;
        let (p50, p99, _, max, n) = latencies.summary(window_start, window_end);
        let cpu = cpu_seconds_of(pid).unwrap_or_default();
        println!(
            "{now:4} {n:8} {:8} {p50:7.1} {p99:7.1} {max:7.1} {:6.0} {:8.0}",
            counters.retries.load(Ordering::Relaxed),
            100.0 * (cpu - last_cpu) / f64::from(window_end - window_start).max(1.0),
            rss as f64 / 1048576.0
        );
        last_cpu = cpu;
        window_start = window_end;
    }
    peak
}

/// Reads the stored samples back: `expected` rows, none twice.
fn check_stored(data_dir: &str, expected: u64) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (rows, distinct) = runtime.block_on(async {
        let layout = gpuledger_aggregator::serve::open_layout(data_dir, None, false)?;
        let query = gpuledger_aggregator::query::Query::open(&layout).await?;
        let count = |sql: &'static str| {
            let query = &query;
            async move {
                let batches = query.sql(sql).await?;
                let column = arrow::compute::cast(
                    batches.first().context("no answer")?.column(0),
                    &arrow::datatypes::DataType::Int64,
                )?;
                let value = column
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .context("a count")?
                    .value(0);
                anyhow::Ok(u64::try_from(value)?)
            }
        };
        let rows = count("SELECT COUNT(*) FROM samples").await?;
        let distinct =
            count("SELECT COUNT(*) FROM (SELECT DISTINCT node, gpu_index, time FROM samples)")
                .await?;
        anyhow::Ok((rows, distinct))
    })?;
    println!("stored: {rows} samples, {distinct} distinct (node, GPU, second); sent {expected}");
    if rows != expected || distinct != expected {
        bail!("samples lost or doubled: {rows} stored ({distinct} distinct) of {expected} sent");
    }
    println!("no sample lost, none doubled");
    Ok(())
}
