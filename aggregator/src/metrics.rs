//! The aggregator's `/metrics`: its own health (ingest outcomes, refusals by reason and field,
//! log size, flushes), the cluster's capacity, and its figures per account and project
//! (GPU-seconds, cost, MFU-weighted GPU-seconds, queue wait, pending and running jobs, quotas,
//! fair-share entitlement), and per running job (GPUs, MFU so far). Label sets are bounded:
//! accounts and projects come from the cluster configuration (anything else is `unknown`), and
//! a job is a label only while it runs (`hpc_job`, as dcgm-exporter names it).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, UInt32Type};
use arrow::record_batch::RecordBatch;
use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, Outcome};
use gpuledger_model::sample::col;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::api_error::ApiError;
use crate::live::{Change, LiveJob, LiveJobs, MfuSource};

/// Queue-wait histogram buckets, in seconds: ten seconds to a week.
const WAIT_BUCKETS: [f64; 13] = [
    10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0,
    604800.0,
];
const UNKNOWN: &str = "unknown";

/// The metrics and the registry they render from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    batches: IntCounterVec,
    refused: IntCounterVec,
    refused_values: IntCounterVec,
    rows_set_aside: IntCounterVec,
    ledger_flagged: IntGaugeVec,
    ledger_gaps: IntGaugeVec,
    samples: IntCounter,
    bytes: IntCounter,
    wal_bytes: IntGauge,
    quarantined: IntGauge,
    clock_offset: IntGaugeVec,
    clock_corrected: IntCounter,
    clock_nodes: Mutex<std::collections::HashSet<String>>,
    pending_rows: IntGauge,
    flushes: IntCounter,
    last_flush: Gauge,
    gpu_seconds: IntCounterVec,
    cost: CounterVec,
    queue_wait: HistogramVec,
    jobs_running: IntGaugeVec,
    gpus_allocated: IntGaugeVec,
    jobs_finished: IntCounterVec,
    jobs_pending: IntGaugeVec,
    mfu_gpu_seconds: CounterVec,
    mfu_measured_seconds: IntCounterVec,
    job_gpus: IntGaugeVec,
    job_mfu: GaugeVec,
    accounts: HashMap<String, Vec<String>>,
    prices: HashMap<String, Decimal>,
    currency: String,
    live: Mutex<LiveJobs>,
}

/// One job's sums over one batch, per account, project and GPU model.
#[derive(Debug, Default)]
struct BatchUsage {
    gpu_seconds: u64,
    proxy_sum: f64,
    proxy_seconds: u64,
}

impl BatchUsage {
    fn add(&mut self, other: &BatchUsage) {
        self.gpu_seconds += other.gpu_seconds;
        self.proxy_sum += other.proxy_sum;
        self.proxy_seconds += other.proxy_seconds;
    }
}

/// A batch row's job, account, project and GPU model as sent.
type RawLabels<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a str);

/// Job, account label, project label and GPU model: what one batch's usage is summed by.
type UsageKey<'a> = (&'a str, &'a str, &'a str, &'a str);

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
        let capacity = gauge_vec(
            &r,
            "gpuledger_cluster_gpus",
            "GPUs in the cluster, by GPU model, from the cluster configuration.",
            &["gpu_model"],
        );
        for pool in &config.node_pools {
            capacity
                .with_label_values(&[pool.gpu_model.key()])
                .add(i64::from(pool.count) * i64::from(pool.gpus_per_node));
        }
        let share = register(
            &r,
            GaugeVec::new(
                Opts::new(
                    "gpuledger_account_share_gpus",
                    "GPUs an account is entitled to by its fair-share weight (weight over all weights, times the cluster's GPUs).",
                ),
                &["account"],
            )
            .expect("valid metric"),
        );
        let weights: u64 = config.accounts.iter().map(|a| u64::from(a.weight)).sum();
        let total_gpus = config.total_gpus() as f64;
        for a in &config.accounts {
            share
                .with_label_values(&[a.id.as_str()])
                .set(total_gpus * f64::from(a.weight) / weights.max(1) as f64);
        }
        let jobs_pending = gauge_vec(
            &r,
            "gpuledger_jobs_pending",
            "Jobs submitted and not running now (waiting, or requeued after preemption), per account.",
            &["account"],
        );
        for a in &config.accounts {
            jobs_pending.with_label_values(&[a.id.as_str()]).set(0);
        }
        Metrics {
            jobs_pending,
            mfu_gpu_seconds: register(&r, CounterVec::new(Opts::new("gpuledger_account_mfu_gpu_seconds_total", "GPU-seconds weighted by MFU (the job's FLOP/s report where it sent one, else the tensor-activity proxy), per account and project; over gpuledger_account_mfu_measured_gpu_seconds_total it is the mean MFU."), &["account", "project"]).expect("valid metric")),
            mfu_measured_seconds: counter_vec(&r, "gpuledger_account_mfu_measured_gpu_seconds_total", "GPU-seconds whose MFU was measured or reported, per account and project.", &["account", "project"]),
            job_gpus: gauge_vec(&r, "gpuledger_job_gpus", "GPUs held by each running job.", &["hpc_job", "account", "project"]),
            job_mfu: register(&r, GaugeVec::new(Opts::new("gpuledger_job_mfu_ratio", "Each running job's MFU so far, with its source (reported or tensor_active_proxy)."), &["hpc_job", "account", "project", "source"]).expect("valid metric")),
            batches: counter_vec(&r, "gpuledger_ingest_batches_total", "Sample batches received, by outcome (accepted, duplicate, refused).", &["outcome"]),
            refused: counter_vec(&r, "gpuledger_ingest_refused_batches_total", "Batches refused, by reason (header, decode, schema, invalid_rows, unknown_node, clock, conflict, unauthorized, unavailable).", &["reason"]),
            refused_values: counter_vec(&r, "gpuledger_ingest_refused_values_total", "Bad values found in refused batches, by field.", &["field"]),
            rows_set_aside: counter_vec(&r, "gpuledger_ingest_rows_set_aside_total", "Rows of stored batches not stored as sent, per node and reason: duplicate_interval (the GPU's interval was stored already: dropped), trimmed_interval (cut to the part not stored yet), unknown_tenant (an account or project the config does not define, booked to the platform account), refused (a bad value: refused and named in the answer, the batch's other rows stored).", &["node", "reason"]),
            ledger_flagged: gauge_vec(&r, "gpuledger_ledger_flagged_gpu_seconds", "Measured GPU-seconds of the month so far billed to nobody, per node and reason: unknown_job (no job event names it), not_held (the job did not hold that GPU then), account_mismatch (the row names another account than the job's). Recomputed every few minutes.", &["node", "reason"]),
            ledger_gaps: gauge_vec(&r, "gpuledger_account_coverage_gap_gpu_seconds", "GPU-seconds of the month so far that an account's jobs held (by their events) and no exporter measured. Recomputed every few minutes.", &["account"]),
            samples: register(&r, IntCounter::new("gpuledger_ingest_samples_total", "Samples accepted.").expect("valid metric")),
            bytes: register(&r, IntCounter::new("gpuledger_ingest_bytes_total", "Bytes of Arrow IPC received in accepted batches.").expect("valid metric")),
            wal_bytes: register(&r, IntGauge::new("gpuledger_wal_bytes", "Bytes in the write-ahead log not yet checkpointed.").expect("valid metric")),
            clock_offset: gauge_vec(&r, "gpuledger_node_clock_offset_seconds", "Each pushing node's clock offset from the aggregator's at its last push (positive: ahead).", &["node"]),
            clock_corrected: register(&r, IntCounter::new("gpuledger_ingest_clock_corrected_batches_total", "Batches whose sample times were moved onto the aggregator's clock (node off by more than 2 s and up to an hour).").expect("valid metric")),
            clock_nodes: Mutex::new(std::collections::HashSet::new()),
            quarantined: register(&r, IntGauge::new("gpuledger_quarantined_files", "Corrupt Parquet files set aside under DATA/quarantine/ since start; queries read the rest.").expect("valid metric")),
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
            live: Mutex::new(LiveJobs::default()),
        }
        .with_known_series(config)
    }

    /// Creates every series the configuration makes possible, at zero: a counter that first
    /// appears at 1 would hide that first increase from `increase()` and `rate()`.
    fn with_known_series(self, config: &ClusterConfig) -> Self {
        let mut models: Vec<&str> = config
            .node_pools
            .iter()
            .map(|p| p.gpu_model.key())
            .collect();
        models.sort_unstable();
        models.dedup();
        for a in &config.accounts {
            let account = a.id.as_str();
            let projects = std::iter::once("").chain(a.projects.iter().map(|p| p.id.as_str()));
            for project in projects {
                for model in &models {
                    self.gpu_seconds
                        .with_label_values(&[account, project, model]);
                }
                self.cost
                    .with_label_values(&[account, project, self.currency.as_str()]);
                self.mfu_gpu_seconds.with_label_values(&[account, project]);
                self.mfu_measured_seconds
                    .with_label_values(&[account, project]);
            }
            self.queue_wait.with_label_values(&[account]);
            self.jobs_running.with_label_values(&[account]);
            self.gpus_allocated.with_label_values(&[account]);
            for outcome in [
                Outcome::Completed,
                Outcome::Failed,
                Outcome::Cancelled,
                Outcome::Timeout,
                Outcome::NodeFail,
                Outcome::OutOfMemory,
            ] {
                self.jobs_finished
                    .with_label_values(&[account, outcome.as_str()]);
            }
        }
        self
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
        match result {
            Ok((bytes, _)) => {
                self.bytes.inc_by(*bytes as u64);
                self.batches.with_label_values(&["accepted"]).inc();
            }
            Err(e) => self.count_refused_ingest(e),
        }
    }

    /// Counts an ingest request refused, by reason (and, for bad rows, by field).
    pub fn count_refused_ingest(&self, refused: &ApiError) {
        let reason = match refused {
            ApiError::BadRequest { field, .. } if field == "body" => "decode",
            ApiError::BadRequest { .. } => "header",
            ApiError::Invalid { errors, .. }
                if errors
                    .iter()
                    .any(|e| e.field == gpuledger_model::wire::SENT_AT_HEADER) =>
            {
                "clock"
            }
            ApiError::Invalid { errors, .. }
                if errors
                    .iter()
                    .any(|e| e.field == gpuledger_model::wire::NODE_HEADER) =>
            {
                "unknown_node"
            }
            ApiError::Invalid { errors, .. } => {
                for e in errors {
                    self.refused_values
                        .with_label_values(&[e.field.as_str()])
                        .inc();
                }
                if errors.iter().any(|e| e.row.is_none()) {
                    "schema"
                } else {
                    "invalid_rows"
                }
            }
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Conflict { .. } => "conflict",
            ApiError::Unauthenticated(_) | ApiError::Forbidden(_) => "unauthorized",
            _ => "internal",
        };
        self.refused.with_label_values(&[reason]).inc();
        self.batches.with_label_values(&["refused"]).inc();
    }

    /// Counts the bad rows of a batch of `node` refused while its other rows were stored.
    pub fn count_refused_rows(&self, node: &str, rows: usize) {
        if rows > 0 {
            self.rows_set_aside
                .with_label_values(&[node, "refused"])
                .inc_by(rows as u64);
        }
    }

    /// Counts the rows of an accepted batch of `node` that were not stored as sent.
    pub fn count_set_aside(&self, node: &str, accepted: &crate::ingest::Accepted) {
        for (reason, rows) in [
            ("duplicate_interval", accepted.duplicate_rows),
            ("trimmed_interval", accepted.trimmed_rows),
            ("unknown_tenant", accepted.rebooked_rows),
        ] {
            if rows > 0 {
                self.rows_set_aside
                    .with_label_values(&[node, reason])
                    .inc_by(rows as u64);
            }
        }
    }

    /// Sets the month-to-date ledger figures: flagged GPU-seconds per node and reason, coverage
    /// gaps per account (accounts the config does not define under one label).
    pub fn set_ledger(&self, ledger: &gpuledger_billing::reconcile::Reconciled) {
        self.ledger_flagged.reset();
        for ((node, reason), secs) in ledger.flagged_by_node() {
            self.ledger_flagged
                .with_label_values(&[node.as_str(), reason.as_str()])
                .set(secs);
        }
        self.ledger_gaps.reset();
        let mut gaps: HashMap<&str, i64> = HashMap::new();
        for g in &ledger.gaps {
            *gaps
                .entry(self.account_label(Some(&g.account)))
                .or_default() += g.gpu_seconds;
        }
        for (account, secs) in gaps {
            self.ledger_gaps.with_label_values(&[account]).set(secs);
        }
    }

    /// Marks a batch that was a duplicate (counted as received, not accepted).
    pub fn count_duplicate(&self) {
        self.batches.with_label_values(&["duplicate"]).inc();
    }

    pub fn count_refused_events(&self) {
        self.refused.with_label_values(&["invalid_events"]).inc();
    }

    /// Adds an accepted batch's samples, GPU-seconds, cost and MFU-weighted GPU-seconds (of
    /// GPUs working for a job), and each running job's MFU proxy.
    pub fn count_usage(&self, batch: &RecordBatch) {
        self.samples.inc_by(batch.num_rows() as u64);
        let column = |name: &str| batch.column_by_name(name);
        let (
            Some(interval),
            Some(job),
            Some(account),
            Some(project),
            Some(model),
            Some(tensor),
            Some(clock),
        ) = (
            column(col::INTERVAL_S),
            column(col::JOB_ID),
            column(col::ACCOUNT),
            column(col::PROJECT),
            column(col::GPU_MODEL),
            column(col::TENSOR_ACTIVE),
            column(col::SM_CLOCK_MHZ),
        )
        else {
            return;
        };
        let interval = interval.as_primitive::<UInt32Type>();
        let (job, account, project, model) = (
            job.as_string::<i32>(),
            account.as_string::<i32>(),
            project.as_string::<i32>(),
            model.as_string::<i32>(),
        );
        let (tensor, clock) = (
            tensor.as_primitive::<Float32Type>(),
            clock.as_primitive::<UInt32Type>(),
        );
        // One GPU's samples come in time order, so consecutive rows nearly always share a
        // job: labels are resolved and the map entered once per run of rows, not per row.
        let mut sums: HashMap<UsageKey<'_>, BatchUsage> = HashMap::new();
        let mut run: Option<(RawLabels<'_>, UsageKey<'_>, f64, BatchUsage)> = None;
        for row in 0..batch.num_rows() {
            if job.is_null(row) {
                continue;
            }
            let raw = (
                job.value(row),
                account.is_valid(row).then(|| account.value(row)),
                project.is_valid(row).then(|| project.value(row)),
                model.value(row),
            );
            if run.as_ref().is_none_or(|(labels, ..)| *labels != raw) {
                if let Some((_, key, _, usage)) = run.take() {
                    sums.entry(key).or_default().add(&usage);
                }
                let a = self.account_label(raw.1);
                let p = self.project_label(a, raw.2);
                let rated_mhz = raw
                    .3
                    .parse::<GpuModel>()
                    .map_or(f64::NAN, |g| f64::from(g.rated_sm_clock_mhz()));
                run = Some((raw, (raw.0, a, p, raw.3), rated_mhz, BatchUsage::default()));
            }
            let Some((_, _, rated_mhz, u)) = run.as_mut() else {
                continue;
            };
            let secs = u64::from(interval.value(row));
            u.gpu_seconds += secs;
            if tensor.is_valid(row) && clock.is_valid(row) && rated_mhz.is_finite() {
                u.proxy_sum += f64::from(tensor.value(row)) * f64::from(clock.value(row))
                    / *rated_mhz
                    * secs as f64;
                u.proxy_seconds += secs;
            }
        }
        if let Some((_, key, _, usage)) = run {
            sums.entry(key).or_default().add(&usage);
        }
        let mut live = lock(&self.live);
        for ((j, a, p, m), u) in sums {
            let gpu_model = m.parse::<GpuModel>().ok();
            let m = gpu_model.map(GpuModel::key).unwrap_or(UNKNOWN);
            self.gpu_seconds
                .with_label_values(&[a, p, m])
                .inc_by(u.gpu_seconds);
            if let Some(price) = self.prices.get(m) {
                let cost = Decimal::from(u.gpu_seconds) * price / Decimal::from(3600);
                self.cost
                    .with_label_values(&[a, p, self.currency.as_str()])
                    .inc_by(cost.to_f64().unwrap_or(0.0));
            }
            live.add_usage(j, gpu_model, u.proxy_sum, u.proxy_seconds);
            let job = live.get(j).filter(|job| job.is_running());
            let (weighted, measured) = match job.and_then(LiveJob::mfu) {
                Some((mfu, MfuSource::Reported)) => (mfu * u.gpu_seconds as f64, u.gpu_seconds),
                _ => (u.proxy_sum, u.proxy_seconds),
            };
            self.mfu_gpu_seconds
                .with_label_values(&[a, p])
                .inc_by(weighted);
            self.mfu_measured_seconds
                .with_label_values(&[a, p])
                .inc_by(measured);
            if let Some(job) = job {
                self.set_job_mfu(job);
            }
        }
    }

    /// The labels of a running job's series.
    fn job_labels<'a>(&'a self, job: &'a LiveJob) -> [&'a str; 3] {
        let a = self.account_label(Some(job.account.as_str()));
        let p = self.project_label(a, job.project.as_deref());
        [job.job_id.as_str(), a, p]
    }

    fn set_job_mfu(&self, job: &LiveJob) {
        let Some((mfu, source)) = job.mfu() else {
            return;
        };
        let [j, a, p] = self.job_labels(job);
        let other = match source {
            MfuSource::Reported => MfuSource::TensorActiveProxy,
            MfuSource::TensorActiveProxy => MfuSource::Reported,
        };
        let _ = self.job_mfu.remove_label_values(&[j, a, p, other.as_str()]);
        self.job_mfu
            .with_label_values(&[j, a, p, source.as_str()])
            .set(mfu);
    }

    fn start_series(&self, job: &LiveJob) {
        let [j, a, p] = self.job_labels(job);
        self.jobs_running.with_label_values(&[a]).inc();
        self.gpus_allocated
            .with_label_values(&[a])
            .add(i64::from(job.gpus));
        self.job_gpus
            .with_label_values(&[j, a, p])
            .set(i64::from(job.gpus));
        self.set_job_mfu(job);
    }

    fn stop_series(&self, job: &LiveJob) {
        let [j, a, p] = self.job_labels(job);
        self.jobs_running.with_label_values(&[a]).dec();
        self.gpus_allocated
            .with_label_values(&[a])
            .sub(i64::from(job.gpus));
        let _ = self.job_gpus.remove_label_values(&[j, a, p]);
        for source in [MfuSource::Reported, MfuSource::TensorActiveProxy] {
            let _ = self
                .job_mfu
                .remove_label_values(&[j, a, p, source.as_str()]);
        }
    }

    fn set_pending(&self, live: &LiveJobs) {
        let pending = live.pending_by_account();
        for account in self.accounts.keys() {
            let n = pending.get(account.as_str()).copied().unwrap_or(0);
            self.jobs_pending
                .with_label_values(&[account.as_str()])
                .set(n);
        }
        let unknown: i64 = pending
            .iter()
            .filter(|(a, _)| !self.accounts.contains_key(**a))
            .map(|(_, n)| n)
            .sum();
        if unknown > 0 {
            self.jobs_pending.with_label_values(&[UNKNOWN]).set(unknown);
        }
    }

    /// Follows accepted job events: queue waits, pending and running jobs, GPUs held, finished
    /// jobs, and each running job's series.
    pub fn observe_events(&self, events: &[JobEvent]) {
        let mut live = lock(&self.live);
        for e in events {
            match live.apply(e) {
                Some(Change::Started { job, wait_ms }) => {
                    if let Some(wait) = wait_ms {
                        let a = self.account_label(Some(job.account.as_str()));
                        self.queue_wait
                            .with_label_values(&[a])
                            .observe(wait as f64 / 1000.0);
                    }
                    self.start_series(&job);
                }
                Some(Change::Stopped { job }) => self.stop_series(&job),
                Some(Change::Finished {
                    account,
                    outcome,
                    running,
                }) => {
                    if let Some(job) = running {
                        self.stop_series(&job);
                    }
                    let outcome = outcome.map_or(UNKNOWN, |o| o.as_str());
                    self.jobs_finished
                        .with_label_values(&[self.account_label(Some(account.as_str())), outcome])
                        .inc();
                }
                Some(Change::Reported { job }) => self.set_job_mfu(&job),
                None => {}
            }
        }
        self.set_pending(&live);
    }

    /// Rebuilds the jobs waiting and running from stored events at start, without counting
    /// their waits or outcomes again (those counters started from zero with this process);
    /// `ended` are jobs known to have finished, whose events read again must change nothing.
    pub fn restore_live(&self, events: &[JobEvent], ended: &[String]) {
        let mut live = lock(&self.live);
        for id in ended {
            live.mark_ended(id);
        }
        for e in events {
            match live.apply(e) {
                Some(Change::Started { job, .. }) => self.start_series(&job),
                Some(Change::Stopped { job })
                | Some(Change::Finished {
                    running: Some(job), ..
                }) => self.stop_series(&job),
                _ => {}
            }
        }
        self.set_pending(&live);
    }

    /// The jobs waiting and running now.
    pub fn live_jobs(&self) -> Vec<LiveJob> {
        lock(&self.live).snapshot()
    }

    /// The allocation feed's rows of `node` (all nodes when `None`).
    pub fn allocations(
        &self,
        node: Option<&str>,
    ) -> Vec<gpuledger_model::allocation_feed::AllocationRow> {
        lock(&self.live).allocations(node)
    }

    pub fn set_wal_bytes(&self, bytes: u64) {
        self.wal_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Notes a node's clock offset (bounded to the first 10,000 nodes seen).
    pub fn observe_clock(&self, node: &str, skew: crate::clock_skew::Skew) {
        use crate::clock_skew::Skew;
        {
            let mut nodes = lock(&self.clock_nodes);
            if !nodes.contains(node) {
                if nodes.len() >= 10_000 {
                    return;
                }
                nodes.insert(node.to_owned());
            }
        }
        let before = self.clock_offset.with_label_values(&[node]).get();
        self.clock_offset
            .with_label_values(&[node])
            .set(skew.offset_s());
        match skew {
            Skew::Corrected { offset_s } | Skew::Refused { offset_s } if before != offset_s => {
                tracing::warn!(
                    node,
                    offset_s,
                    corrected = matches!(skew, Skew::Corrected { .. }),
                    "node clock off"
                );
            }
            _ => {}
        }
        if matches!(skew, Skew::Corrected { .. }) {
            self.clock_corrected.inc();
        }
    }

    pub fn set_quarantined(&self, files: usize) {
        self.quarantined
            .set(i64::try_from(files).unwrap_or(i64::MAX));
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
