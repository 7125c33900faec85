//! The aggregator's `/metrics`: its own health (ingest outcomes, refusals by reason and field,
//! log size, flushes) and the cluster's figures per account and project (GPU-seconds, cost,
//! queue wait, running jobs, quotas). Label sets are bounded: accounts and projects come from
//! the cluster configuration (anything else is `unknown`), jobs never become labels.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use arrow::array::{Array, AsArray};
use arrow::datatypes::UInt32Type;
use arrow::record_batch::RecordBatch;
use prometheus::{
    CounterVec, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, JobEventKind};
use gpuledger_model::sample::col;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::http::ApiError;

/// Queue-wait histogram buckets, in seconds: ten seconds to a week.
const WAIT_BUCKETS: [f64; 13] = [
    10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0,
    604800.0,
];
const UNKNOWN: &str = "unknown";

#[derive(Debug, Default)]
struct JobTracker {
    submitted: HashMap<String, UnixMillis>,
    running: HashMap<String, (String, i64)>,
}

/// The metrics and the registry they render from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    batches: IntCounterVec,
    refused: IntCounterVec,
    refused_values: IntCounterVec,
    samples: IntCounter,
    bytes: IntCounter,
    wal_bytes: IntGauge,
    pending_rows: IntGauge,
    flushes: IntCounter,
    last_flush: Gauge,
    gpu_seconds: IntCounterVec,
    cost: CounterVec,
    queue_wait: HistogramVec,
    jobs_running: IntGaugeVec,
    gpus_allocated: IntGaugeVec,
    jobs_finished: IntCounterVec,
    accounts: HashMap<String, Vec<String>>,
    prices: HashMap<String, Decimal>,
    currency: String,
    jobs: Mutex<JobTracker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    // Names are fixed and distinct, so registration cannot clash.
    let _ = r.register(Box::new(m.clone()));
    m
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

impl Metrics {
    pub fn new(config: &ClusterConfig) -> Self {
        let r = Registry::new();
        let accounts: HashMap<String, Vec<String>> = config
            .accounts
            .iter()
            .map(|a| {
                let projects = a.projects.iter().map(|p| p.id.to_string()).collect();
                (a.id.to_string(), projects)
            })
            .collect();
        let quota = gauge_vec(
            &r,
            "gpuledger_account_quota_gpu_seconds",
            "An account's GPU-hour quota per period (day or week), in GPU-seconds, from the cluster configuration.",
            &["account", "period"],
        );
        for a in &config.accounts {
            for (period, q) in [
                ("day", a.quota.gpu_hours_per_day),
                ("week", a.quota.gpu_hours_per_week),
            ] {
                if let Some(q) = q {
                    quota
                        .with_label_values(&[a.id.as_str(), period])
                        .set(i64::try_from(q.saturating_mul(3600)).unwrap_or(i64::MAX));
                }
            }
        }
        Metrics {
            batches: counter_vec(&r, "gpuledger_ingest_batches_total", "Sample batches received, by outcome (accepted, duplicate, refused).", &["outcome"]),
            refused: counter_vec(&r, "gpuledger_ingest_refused_batches_total", "Batches refused, by reason (header, decode, schema, invalid_rows, unavailable).", &["reason"]),
            refused_values: counter_vec(&r, "gpuledger_ingest_refused_values_total", "Bad values found in refused batches, by field.", &["field"]),
            samples: register(&r, IntCounter::new("gpuledger_ingest_samples_total", "Samples accepted.").expect("valid metric")),
            bytes: register(&r, IntCounter::new("gpuledger_ingest_bytes_total", "Bytes of Arrow IPC received in accepted batches.").expect("valid metric")),
            wal_bytes: register(&r, IntGauge::new("gpuledger_wal_bytes", "Bytes in the write-ahead log not yet checkpointed.").expect("valid metric")),
            pending_rows: register(&r, IntGauge::new("gpuledger_pending_rows", "Sample rows stored since the last flush to Parquet.").expect("valid metric")),
            flushes: register(&r, IntCounter::new("gpuledger_flushes_total", "Flushes of the store to Parquet.").expect("valid metric")),
            last_flush: register(&r, Gauge::new("gpuledger_last_flush_timestamp_seconds", "When the last flush finished (Unix time).").expect("valid metric")),
            gpu_seconds: counter_vec(&r, "gpuledger_account_gpu_seconds_total", "GPU-seconds used by jobs, per account, project and GPU model.", &["account", "project", "gpu_model"]),
            cost: register(&r, CounterVec::new(Opts::new("gpuledger_account_cost_total", "List-price cost of the GPU-seconds above, per account and project (invoices are authoritative)."), &["account", "project", "currency"]).expect("valid metric")),
            queue_wait: register(&r, HistogramVec::new(HistogramOpts::new("gpuledger_queue_wait_seconds", "Time from submission to start, per account.").buckets(WAIT_BUCKETS.to_vec()), &["account"]).expect("valid metric")),
            jobs_running: gauge_vec(&r, "gpuledger_jobs_running", "Jobs running now, per account.", &["account"]),
            gpus_allocated: gauge_vec(&r, "gpuledger_gpus_allocated", "GPUs held by running jobs, per account.", &["account"]),
            jobs_finished: counter_vec(&r, "gpuledger_jobs_finished_total", "Jobs finished, per account and outcome.", &["account", "outcome"]),
            registry: r,
            accounts,
            prices: config
                .prices
                .gpu_hour
                .iter()
                .map(|(m, p)| (m.key().to_owned(), *p))
                .collect(),
            currency: config.prices.currency.to_string(),
            jobs: Mutex::new(JobTracker::default()),
        }
    }

    fn account_label<'a>(&'a self, account: Option<&'a str>) -> &'a str {
        match account {
            Some(a) if self.accounts.contains_key(a) => a,
            _ => UNKNOWN,
        }
    }

    fn project_label<'a>(&self, account: &str, project: Option<&'a str>) -> &'a str {
        match project {
            Some(p)
                if self
                    .accounts
                    .get(account)
                    .is_some_and(|ps| ps.iter().any(|x| x == p)) =>
            {
                p
            }
            Some(_) => UNKNOWN,
            None => "",
        }
    }

    /// Counts one ingest request's outcome.
    pub fn count_ingest<T>(&self, result: &Result<(usize, T), ApiError>) {
        let (outcome, reason) = match result {
            Ok(_) => ("accepted", None),
            Err(ApiError::BadRequest { field, .. }) if field == "body" => {
                ("refused", Some("decode"))
            }
            Err(ApiError::BadRequest { .. }) => ("refused", Some("header")),
            Err(ApiError::Invalid { errors, .. }) => {
                for e in errors {
                    self.refused_values
                        .with_label_values(&[e.field.as_str()])
                        .inc();
                }
                let schema = errors.iter().any(|e| e.row.is_none());
                (
                    "refused",
                    Some(if schema { "schema" } else { "invalid_rows" }),
                )
            }
            Err(ApiError::Unavailable(_)) => ("refused", Some("unavailable")),
            Err(_) => ("refused", Some("internal")),
        };
        if let Some(reason) = reason {
            self.refused.with_label_values(&[reason]).inc();
        }
        if let Ok((bytes, _)) = result {
            self.bytes.inc_by(*bytes as u64);
        }
        self.batches.with_label_values(&[outcome]).inc();
    }

    /// Marks a batch that was a duplicate (counted as received, not accepted).
    pub fn count_duplicate(&self) {
        self.batches.with_label_values(&["duplicate"]).inc();
    }

    pub fn count_refused_events(&self) {
        self.refused.with_label_values(&["invalid_events"]).inc();
    }

    /// Adds an accepted batch's samples and GPU-seconds (those working for a job).
    pub fn count_usage(&self, batch: &RecordBatch) {
        self.samples.inc_by(batch.num_rows() as u64);
        let column = |name: &str| batch.column_by_name(name);
        let (Some(interval), Some(job), Some(account), Some(project), Some(model)) = (
            column(col::INTERVAL_S),
            column(col::JOB_ID),
            column(col::ACCOUNT),
            column(col::PROJECT),
            column(col::GPU_MODEL),
        ) else {
            return;
        };
        let interval = interval.as_primitive::<UInt32Type>();
        let (account, project, model) = (
            account.as_string::<i32>(),
            project.as_string::<i32>(),
            model.as_string::<i32>(),
        );
        let mut sums: HashMap<(&str, &str, &str), u64> = HashMap::new();
        for row in 0..batch.num_rows() {
            if job.is_null(row) {
                continue;
            }
            let a = self.account_label(account.is_valid(row).then(|| account.value(row)));
            let p = self.project_label(a, project.is_valid(row).then(|| project.value(row)));
            *sums.entry((a, p, model.value(row))).or_default() += u64::from(interval.value(row));
        }
        for ((a, p, m), secs) in sums {
            let m = m.parse::<GpuModel>().map(GpuModel::key).unwrap_or(UNKNOWN);
            self.gpu_seconds.with_label_values(&[a, p, m]).inc_by(secs);
            if let Some(price) = self.prices.get(m) {
                let cost = Decimal::from(secs) * price / Decimal::from(3600);
                self.cost
                    .with_label_values(&[a, p, self.currency.as_str()])
                    .inc_by(cost.to_f64().unwrap_or(0.0));
            }
        }
    }

    /// Follows accepted job events: queue waits, running jobs and GPUs, finished jobs.
    pub fn observe_events(&self, events: &[JobEvent]) {
        let mut jobs = lock(&self.jobs);
        for e in events {
            let account = self.account_label(Some(e.account.as_str())).to_owned();
            let id = e.job_id.to_string();
            match e.kind {
                JobEventKind::Submitted => {
                    jobs.submitted.insert(id, e.time_ms);
                }
                JobEventKind::Started | JobEventKind::Resumed => {
                    if let Some(submitted) = jobs.submitted.remove(&id) {
                        self.queue_wait
                            .with_label_values(&[account.as_str()])
                            .observe((e.time_ms - submitted).max(0) as f64 / 1000.0);
                    }
                    let gpus = i64::from(e.gpus.unwrap_or(0));
                    if jobs.running.insert(id, (account.clone(), gpus)).is_none() {
                        self.jobs_running
                            .with_label_values(&[account.as_str()])
                            .inc();
                        self.gpus_allocated
                            .with_label_values(&[account.as_str()])
                            .add(gpus);
                    }
                }
                JobEventKind::Preempted | JobEventKind::Finished => {
                    if let Some((account, gpus)) = jobs.running.remove(&id) {
                        self.jobs_running
                            .with_label_values(&[account.as_str()])
                            .dec();
                        self.gpus_allocated
                            .with_label_values(&[account.as_str()])
                            .sub(gpus);
                    }
                    if e.kind == JobEventKind::Finished {
                        jobs.submitted.remove(&id);
                        let outcome = e.outcome.map_or(UNKNOWN, |o| o.as_str());
                        self.jobs_finished
                            .with_label_values(&[account.as_str(), outcome])
                            .inc();
                    }
                }
                JobEventKind::Checkpointed | JobEventKind::FlopsReported => {}
            }
        }
    }

    pub fn set_wal_bytes(&self, bytes: u64) {
        self.wal_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn set_pending_rows(&self, rows: u64) {
        self.pending_rows
            .set(i64::try_from(rows).unwrap_or(i64::MAX));
    }

    /// Notes a finished flush at `now_ms`.
    pub fn count_flush(&self, now_ms: UnixMillis) {
        self.flushes.inc();
        self.last_flush.set(now_ms as f64 / 1000.0);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}
