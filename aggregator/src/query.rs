//! The stored tables as DataFusion SQL tables (`samples`, `rollups_hourly`, `jobs`, hive
//! partitioned by `date`) and the indicator queries over them.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use arrow::record_batch::RecordBatch;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::ListingOptions;
use datafusion::prelude::SessionContext;
use serde::Serialize;

use gpuledger_model::job::job_event_schema;
use gpuledger_model::sample::sample_schema;
use gpuledger_model::stats::percentile;
use gpuledger_model::time::UnixMillis;

use crate::layout::{Layout, Table};
use crate::rollup::rollup_schema;
use crate::{Error, Result};

/// A query session over a data directory.
pub struct Query {
    ctx: SessionContext,
    layout: Layout,
    quarantined: std::sync::Mutex<Vec<crate::quarantine::Quarantined>>,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Query")
    }
}

/// What billing prices, in the rows billing defines: what each GPU measured per hour and label
/// (with the MFU proxy's sums); jobs' FLOP/s reports.
pub use gpuledger_billing::source::{GpuHour, ReportedFlops as ReportedMfu};

/// The seed's indicators for one account over a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AccountIndicators {
    pub account: String,
    /// Jobs submitted in the window.
    pub jobs: i64,
    pub gpu_seconds: i64,
    /// Tensor-activity MFU proxy, weighted by GPU-seconds; `None`: not measured.
    pub mean_mfu: Option<f64>,
    pub mean_gpu_util_pct: Option<f64>,
    pub mean_mem_util: Option<f64>,
    /// Queue wait of the jobs submitted in the window that started (nearest-rank
    /// percentiles).
    pub mean_queue_wait_s: Option<f64>,
    pub p50_queue_wait_s: Option<f64>,
    pub p95_queue_wait_s: Option<f64>,
    pub max_queue_wait_s: Option<f64>,
    /// Completed over finished.
    pub success_rate: Option<f64>,
}

/// One job's queue wait and outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    pub wait_ms: Option<i64>,
    pub outcome: Option<String>,
}

/// Sets the job counts, queue-wait figures and success rate of an account from its jobs.
pub fn fill_job_figures(entry: &mut AccountIndicators, jobs: &[JobOutcome]) {
    entry.jobs = jobs.len() as i64;
    let mut waits: Vec<i64> = jobs.iter().filter_map(|j| j.wait_ms).collect();
    waits.sort_unstable();
    let secs = |ms: Option<i64>| ms.map(|ms| ms as f64 / 1000.0);
    entry.mean_queue_wait_s = (!waits.is_empty())
        .then(|| waits.iter().map(|w| *w as f64).sum::<f64>() / waits.len() as f64 / 1000.0);
    entry.p50_queue_wait_s = secs(percentile(&waits, 50.0));
    entry.p95_queue_wait_s = secs(percentile(&waits, 95.0));
    entry.max_queue_wait_s = secs(waits.last().copied());
    let finished = jobs.iter().filter(|j| j.outcome.is_some()).count();
    let completed = jobs
        .iter()
        .filter(|j| j.outcome.as_deref() == Some("completed"))
        .count();
    entry.success_rate = (finished > 0).then(|| completed as f64 / finished as f64);
}

/// GPU-seconds, the MFU proxy, GPU and memory utilization of the GPUs working for an account in
/// `[from_ms, to_ms)`, from the rollups: per account (first column), or for the whole cluster
/// (an empty first column).
fn efficiency_sql(from_ms: UnixMillis, to_ms: UnixMillis, by_account: bool) -> String {
    let (key, group) = if by_account {
        ("account", " GROUP BY account")
    } else {
        ("''", "")
    };
    format!(
        "SELECT {key}, SUM(gpu_seconds) AS gpu_seconds, \
           SUM(mfu_proxy_sum) / NULLIF(SUM(mfu_seconds), 0) AS mfu, \
           SUM(util_pct_sum) / NULLIF(SUM(util_seconds), 0) AS util, \
           SUM(CAST(mem_used_byte_seconds AS DOUBLE)) / NULLIF(SUM(CAST(mem_total_byte_seconds AS DOUBLE)), 0) AS mem \
         FROM rollups_hourly \
         WHERE account IS NOT NULL AND CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms}{group}"
    )
}

/// GPU-seconds of one account on one GPU model (or in one day) of a window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccountUsage {
    pub account: String,
    /// The GPU model (by model) or the day's start in ms as text (by day).
    pub key: String,
    pub gpu_seconds: i64,
}

/// Whether a failed query failed reading a file (rather than on its SQL or its arithmetic).
pub(crate) fn reads_a_file(e: &datafusion::error::DataFusionError) -> bool {
    use datafusion::error::DataFusionError as E;
    matches!(
        e.find_root(),
        E::ParquetError(_) | E::IoError(_) | E::ObjectStore(_)
    ) || e.to_string().to_ascii_lowercase().contains("parquet")
}

/// Rows of a batch as JSON objects.
pub fn batch_to_json_rows(batch: &RecordBatch) -> Result<Vec<serde_json::Value>> {
    let mut buf = Vec::new();
    let mut writer = arrow_json::ArrayWriter::new(&mut buf);
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let value: serde_json::Value = serde_json::from_slice(&buf)
        .map_err(|e| Error::Corrupt(format!("JSON of a result: {e}")))?;
    Ok(match value {
        serde_json::Value::Array(rows) => rows,
        _ => Vec::new(),
    })
}

/// GPU-seconds of one account and project in one hour, for the usage feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourlyUsage {
    pub account: String,
    pub project: Option<String>,
    pub hour_ms: UnixMillis,
    pub gpu_seconds: i64,
}

/// A job that finished, as its events and the rollups tell it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FinishedJob {
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
    pub partition: Option<String>,
    pub gpus: u32,
    pub submitted_ms: Option<UnixMillis>,
    pub started_ms: Option<UnixMillis>,
    pub finished_ms: UnixMillis,
    /// `completed`, `failed`, `cancelled`, `timeout`, `preempted`, `node_fail`, `out_of_memory`...
    pub outcome: Option<String>,
    /// GPU-seconds measured for it.
    pub gpu_seconds: i64,
}

/// What the tables say about one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobDetail {
    pub job_id: String,
    pub account: Option<String>,
    pub project: Option<String>,
    /// Each event: kind, time (ms), and the fields it carries.
    pub events: Vec<serde_json::Value>,
    pub gpu_seconds: i64,
    /// GPU-seconds per GPU model.
    pub gpu_seconds_by_model: std::collections::BTreeMap<String, i64>,
    pub mean_gpu_util_pct: Option<f64>,
    pub mean_mem_util: Option<f64>,
    pub mfu: Option<f64>,
    /// `reported` (job-reported FLOP/s over the GPUs' peak) or `tensor_active_proxy`.
    pub mfu_source: Option<&'static str>,
}

/// The sums of the four quarter columns, in this order, for the billing queries. A group
/// with a file of schema 1 (no quarters) sums to less than its GPU-seconds, or to null:
/// billing then splits that hour in proportion.
const QUARTER_SUMS: &str = "SUM(q0_seconds), SUM(q1_seconds), SUM(q2_seconds), SUM(q3_seconds)";

/// The four quarter-sum columns of a batch from column `first` on, as Int64.
fn quarter_columns(b: &RecordBatch, first: usize) -> Result<Vec<ArrayRef>> {
    (first..first + 4)
        .map(|i| cast(b.column(i), &DataType::Int64).map_err(Into::into))
        .collect()
}

/// A row's four quarter sums, where all four are there.
fn quarters_at(columns: &[ArrayRef], row: usize) -> Option<[i64; 4]> {
    let mut out = [0; 4];
    for (slot, column) in out.iter_mut().zip(columns) {
        let a = column.as_primitive::<Int64Type>();
        if a.is_null(row) {
            return None;
        }
        *slot = a.value(row);
    }
    Some(out)
}

fn f64_at(col: &ArrayRef, row: usize) -> Result<Option<f64>> {
    let c = cast(col, &DataType::Float64)?;
    let a = c.as_primitive::<Float64Type>();
    Ok((a.is_valid(row) && a.value(row).is_finite()).then(|| a.value(row)))
}

fn i64_at(col: &ArrayRef, row: usize) -> Result<i64> {
    let c = cast(col, &DataType::Int64)?;
    let a = c.as_primitive::<Int64Type>();
    Ok(if a.is_valid(row) { a.value(row) } else { 0 })
}

fn str_at(col: &ArrayRef, row: usize) -> Result<Option<String>> {
    let c = cast(col, &DataType::Utf8)?;
    let a = c.as_string::<i32>();
    Ok(a.is_valid(row).then(|| a.value(row).to_owned()))
}

/// The schema with its string columns as string views. The Parquet reader then decodes a
/// dictionary-encoded column (every tenant and job column) into views of the dictionary page
/// instead of copying each row's string, and grouping by one takes DataFusion's view path: the
/// monthly report's `GROUP BY account` and `COUNT(DISTINCT job_id)` spent most of their time
/// copying and hashing those strings (docs/benchmarks.md).
fn string_views(schema: &arrow::datatypes::Schema) -> arrow::datatypes::SchemaRef {
    let fields: Vec<arrow::datatypes::Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 => f.as_ref().clone().with_data_type(DataType::Utf8View),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

/// A result batch with its string views as plain strings, for readers of [`job_event_schema`]
/// and the like.
pub fn plain_strings(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if field.data_type() == &DataType::Utf8View {
            fields.push(field.as_ref().clone().with_data_type(DataType::Utf8));
            columns.push(cast(column, &DataType::Utf8)?);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(Arc::clone(column));
        }
    }
    let schema = Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A DataFusion session over the tables of `layout`, with gpuledger's functions, on a runtime
/// built from `runtime` (the SQL API adds its memory pool there).
pub(crate) async fn session(
    layout: &Layout,
    runtime: datafusion::execution::runtime_env::RuntimeEnvBuilder,
) -> Result<SessionContext> {
    // DataFusion caches each directory's file listing for good by default; the aggregator
    // writes new files every flush and compaction replaces them, so every query lists.
    let runtime = runtime
        .with_cache_manager(
            datafusion::execution::cache::cache_manager::CacheManagerConfig::default()
                .with_list_files_cache_limit(0),
        )
        .build_arc()?;
    // DataFusion's own options can be tuned with `DATAFUSION_*` variables (e.g.
    // DATAFUSION_EXECUTION_TARGET_PARTITIONS); unset, its defaults.
    let mut config = datafusion::prelude::SessionConfig::from_env()?;
    if std::env::var_os("DATAFUSION_EXECUTION_TARGET_PARTITIONS").is_none() {
        // Two scan partitions per core: days differ in size, and with one per core the
        // last file leaves a core idle (the monthly report is 8% faster on 2 cores).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        config = config.with_target_partitions(2 * cores);
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    crate::runs::register(&ctx);
    for (table, schema) in [
        (Table::Samples, string_views(&sample_schema())),
        (Table::RollupsHourly, string_views(&rollup_schema())),
        (Table::Jobs, string_views(&job_event_schema())),
    ] {
        let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
            .with_file_extension(".parquet")
            .with_table_partition_cols(vec![("date".to_owned(), DataType::Utf8)]);
        let (url, store) = layout.tables().table_url(table.dir())?;
        if let Some((base, store)) = store {
            ctx.register_object_store(&base, store);
        }
        ctx.register_listing_table(table.sql_name(), url, options, Some(schema), None)
            .await?;
    }
    Ok(ctx)
}

impl Query {
    /// Registers the tables of the data directory (a path or an object store), after setting
    /// aside files whose footer does not read.
    pub async fn open(layout: &Layout) -> Result<Self> {
        let quarantined =
            crate::quarantine::quarantine_corrupt(layout, crate::quarantine::Depth::Footer)?;
        let ctx = session(
            layout,
            datafusion::execution::runtime_env::RuntimeEnvBuilder::new(),
        )
        .await?;
        Ok(Query {
            ctx,
            layout: layout.clone(),
            quarantined: std::sync::Mutex::new(quarantined),
        })
    }

    /// The files this session set aside as corrupt.
    pub fn quarantined(&self) -> Vec<crate::quarantine::Quarantined> {
        self.quarantined
            .lock()
            .map(|q| q.clone())
            .unwrap_or_default()
    }

    /// After a query failed while reading: sets aside the files that do not read (footers
    /// first, then whole files) and says whether any was.
    pub(crate) fn quarantine_after_failure(&self) -> Result<bool> {
        use crate::quarantine::{quarantine_corrupt, Depth};
        let mut found = quarantine_corrupt(&self.layout, Depth::Footer)?;
        if found.is_empty() {
            found = quarantine_corrupt(&self.layout, Depth::Full)?;
        }
        let any = !found.is_empty();
        if let Ok(mut q) = self.quarantined.lock() {
            q.extend(found);
        }
        Ok(any)
    }

    /// Runs SQL over the tables. A query that fails reading a corrupt file runs again once
    /// that file is set aside.
    pub async fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        let first = self.ctx.sql(sql).await?.collect().await;
        match first {
            Ok(batches) => Ok(batches),
            Err(e) if reads_a_file(&e) && self.quarantine_after_failure()? => {
                tracing::warn!(error = %e, "query failed on a corrupt file; retried without it");
                Ok(self.ctx.sql(sql).await?.collect().await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Per GPU, UTC hour and label (job, account, project; none for a GPU that ran no job), the
    /// GPU-seconds of `[from_ms, to_ms)` from the hourly rollups, with their quarters and the
    /// sums the MFU proxy comes from: what billing reconciles with the jobs' allocations.
    pub async fn gpu_hours(&self, from_ms: UnixMillis, to_ms: UnixMillis) -> Result<Vec<GpuHour>> {
        let sql = format!(
            "SELECT node, gpu_index, gpu_model, CAST(hour AS BIGINT) AS hour_ms, job_id, account, project, \
               SUM(gpu_seconds), CAST(SUM(mfu_proxy_sum) AS DOUBLE), SUM(mfu_seconds), {QUARTER_SUMS} \
             FROM rollups_hourly \
             WHERE CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms} \
             GROUP BY node, gpu_index, gpu_model, CAST(hour AS BIGINT), job_id, account, project \
             ORDER BY node, gpu_index, hour_ms, job_id, account, project, gpu_model"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            let text = |i: usize| cast(b.column(i), &DataType::Utf8);
            let int = |i: usize| cast(b.column(i), &DataType::Int64);
            let (node, model, job, account, project) =
                (text(0)?, text(2)?, text(4)?, text(5)?, text(6)?);
            let (gpu, hour, secs, mfu_s) = (int(1)?, int(3)?, int(7)?, int(9)?);
            let mfu = cast(b.column(8), &DataType::Float64)?;
            let (node, model, job, account, project) = (
                node.as_string::<i32>(),
                model.as_string::<i32>(),
                job.as_string::<i32>(),
                account.as_string::<i32>(),
                project.as_string::<i32>(),
            );
            let (gpu, hour, secs, mfu_s) = (
                gpu.as_primitive::<Int64Type>(),
                hour.as_primitive::<Int64Type>(),
                secs.as_primitive::<Int64Type>(),
                mfu_s.as_primitive::<Int64Type>(),
            );
            let mfu = mfu.as_primitive::<Float64Type>();
            let opt = |a: &arrow::array::StringArray, row: usize| {
                a.is_valid(row).then(|| a.value(row).to_owned())
            };
            let quarters = quarter_columns(&b, 10)?;
            for row in 0..b.num_rows() {
                out.push(GpuHour {
                    node: node.value(row).to_owned(),
                    gpu_index: u16::try_from(gpu.value(row)).unwrap_or(u16::MAX),
                    gpu_model: model.value(row).to_owned(),
                    hour_ms: hour.value(row),
                    job_id: opt(job, row),
                    account: opt(account, row),
                    project: opt(project, row),
                    gpu_seconds: secs.value(row),
                    quarter_seconds: quarters_at(&quarters, row),
                    mfu_proxy_sum: if mfu.is_valid(row) {
                        mfu.value(row)
                    } else {
                        0.0
                    },
                    mfu_seconds: if mfu_s.is_valid(row) {
                        mfu_s.value(row)
                    } else {
                        0
                    },
                });
            }
        }
        Ok(out)
    }

    /// Jobs that reported their achieved FLOP/s, with the GPUs they started on.
    pub async fn reported_mfu(&self) -> Result<Vec<ReportedMfu>> {
        let sql = "SELECT job_id, MAX(CASE WHEN kind = 'flops_reported' THEN achieved_flops END), \
               MAX(CASE WHEN kind = 'started' THEN gpus END) \
             FROM jobs GROUP BY job_id \
             HAVING MAX(CASE WHEN kind = 'flops_reported' THEN achieved_flops END) IS NOT NULL";
        let mut out = Vec::new();
        for b in self.sql(sql).await? {
            for row in 0..b.num_rows() {
                out.push(ReportedMfu {
                    job_id: str_at(b.column(0), row)?.unwrap_or_default(),
                    achieved_flops: f64_at(b.column(1), row)?.unwrap_or(0.0),
                    gpus: i64_at(b.column(2), row)?,
                });
            }
        }
        Ok(out)
    }

    /// Cluster utilization over `[from_ms, to_ms)`: GPU-seconds working for a job over all
    /// GPU-seconds sampled (idle GPUs are sampled too). `None` when nothing was sampled.
    pub async fn cluster_utilization(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
    ) -> Result<Option<f64>> {
        let sql = format!(
            "SELECT CAST(SUM(CASE WHEN job_id IS NOT NULL THEN gpu_seconds ELSE 0 END) AS DOUBLE) \
               / NULLIF(CAST(SUM(gpu_seconds) AS DOUBLE), 0) \
             FROM rollups_hourly \
             WHERE CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms}"
        );
        let batches = self.sql(&sql).await?;
        match batches.iter().find(|b| b.num_rows() > 0) {
            Some(b) => f64_at(b.column(0), 0),
            None => Ok(None),
        }
    }

    /// The account indicators of `[from_ms, to_ms)`: usage and efficiency from the rollups,
    /// jobs, queue wait and success from the job events (jobs submitted in the window).
    pub async fn account_indicators(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
    ) -> Result<Vec<AccountIndicators>> {
        let mut by_account = self.efficiency(from_ms, to_ms, true).await?;
        for (account, jobs) in self.job_outcomes(from_ms, to_ms).await? {
            let entry = by_account
                .entry(account.clone())
                .or_insert_with(|| AccountIndicators {
                    account,
                    ..Default::default()
                });
            fill_job_figures(entry, &jobs);
        }
        Ok(by_account.into_values().collect())
    }

    /// GPU-seconds, MFU, GPU and memory utilization of `[from_ms, to_ms)` per account, or for
    /// the whole cluster under the key `""`.
    async fn efficiency(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
        by_account: bool,
    ) -> Result<std::collections::BTreeMap<String, AccountIndicators>> {
        let mut out = std::collections::BTreeMap::new();
        let sql = efficiency_sql(from_ms, to_ms, by_account);
        self.fill_per_account(&sql, &mut out, |e, b, row| {
            e.gpu_seconds = i64_at(b.column(1), row)?;
            e.mean_mfu = f64_at(b.column(2), row)?;
            e.mean_gpu_util_pct = f64_at(b.column(3), row)?;
            e.mean_mem_util = f64_at(b.column(4), row)?;
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// The cluster's indicators over `[from_ms, to_ms)`: every account's GPUs and jobs together
    /// (`account` is empty).
    pub async fn cluster_indicators(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
    ) -> Result<AccountIndicators> {
        let mut cluster = self
            .efficiency(from_ms, to_ms, false)
            .await?
            .remove("")
            .unwrap_or_default();
        let jobs: Vec<JobOutcome> = self
            .job_outcomes(from_ms, to_ms)
            .await?
            .into_values()
            .flatten()
            .collect();
        fill_job_figures(&mut cluster, &jobs);
        Ok(cluster)
    }

    /// GPU-seconds per account and GPU model (`by_day` false) or per account and UTC day
    /// (`by_day` true, the key is the day's start in ms) in `[from_ms, to_ms)`.
    pub async fn account_usage(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
        by_day: bool,
    ) -> Result<Vec<AccountUsage>> {
        let key = if by_day {
            "CAST(CAST(hour AS BIGINT) / 86400000 * 86400000 AS VARCHAR)"
        } else {
            "gpu_model"
        };
        let sql = format!(
            "SELECT account, {key} AS k, SUM(gpu_seconds) FROM rollups_hourly \
             WHERE account IS NOT NULL AND CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms} \
             GROUP BY account, {key} ORDER BY account, k"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            for row in 0..b.num_rows() {
                out.push(AccountUsage {
                    account: str_at(b.column(0), row)?.unwrap_or_default(),
                    key: str_at(b.column(1), row)?.unwrap_or_default(),
                    gpu_seconds: i64_at(b.column(2), row)?,
                });
            }
        }
        Ok(out)
    }

    /// Per account, the jobs submitted in `[from_ms, to_ms)`: queue wait (when started) and
    /// outcome (when finished).
    pub async fn job_outcomes(
        &self,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
    ) -> Result<std::collections::BTreeMap<String, Vec<JobOutcome>>> {
        let sql = format!(
            "WITH j AS ( \
               SELECT job_id, account, \
                 MIN(CASE WHEN kind = 'submitted' THEN CAST(time AS BIGINT) END) AS submitted_ms, \
                 MIN(CASE WHEN kind = 'started' THEN CAST(time AS BIGINT) END) AS started_ms, \
                 MAX(CASE WHEN kind = 'finished' THEN outcome END) AS outcome \
               FROM jobs GROUP BY job_id, account) \
             SELECT account, started_ms - submitted_ms AS wait_ms, outcome \
             FROM j WHERE submitted_ms >= {from_ms} AND submitted_ms < {to_ms}"
        );
        let mut out: std::collections::BTreeMap<String, Vec<JobOutcome>> = Default::default();
        for b in self.sql(&sql).await? {
            for row in 0..b.num_rows() {
                let Some(account) = str_at(b.column(0), row)? else {
                    continue;
                };
                let wait = b.column(1);
                out.entry(account).or_default().push(JobOutcome {
                    wait_ms: wait.is_valid(row).then(|| i64_at(wait, row)).transpose()?,
                    outcome: str_at(b.column(2), row)?,
                });
            }
        }
        Ok(out)
    }

    /// The jobs of the accounts `scope` covers that finished in `[from_ms, to_ms)`, the latest
    /// first, at most `limit`, with the GPU-seconds measured for each.
    pub async fn finished_jobs(
        &self,
        scope: &gpuledger_auth::Scope,
        from_ms: UnixMillis,
        to_ms: UnixMillis,
        limit: usize,
    ) -> Result<Vec<FinishedJob>> {
        let account_filter = match scope {
            gpuledger_auth::Scope::All => String::new(),
            gpuledger_auth::Scope::Account(a) => {
                format!(" AND account = '{}'", a.as_str().replace('\'', "''"))
            }
            gpuledger_auth::Scope::Nothing => return Ok(Vec::new()),
        };
        let sql = format!(
            "WITH j AS ( \
               SELECT job_id, MAX(account) AS account, MAX(project) AS project, \
                 MAX(partition) AS partition, MAX(gpus) AS gpus, \
                 MIN(CASE WHEN kind = 'submitted' THEN CAST(time AS BIGINT) END) AS submitted_ms, \
                 MIN(CASE WHEN kind = 'started' THEN CAST(time AS BIGINT) END) AS started_ms, \
                 MAX(CASE WHEN kind = 'finished' THEN CAST(time AS BIGINT) END) AS finished_ms, \
                 MAX(CASE WHEN kind = 'finished' THEN outcome END) AS outcome \
               FROM jobs WHERE true{account_filter} GROUP BY job_id) \
             SELECT job_id, account, project, partition, gpus, submitted_ms, started_ms, finished_ms, outcome \
             FROM j WHERE finished_ms >= {from_ms} AND finished_ms < {to_ms} \
             ORDER BY finished_ms DESC, job_id LIMIT {limit}"
        );
        let mut jobs = Vec::new();
        for b in self.sql(&sql).await? {
            let ms = |i: usize, row: usize| -> Result<Option<i64>> {
                let c = b.column(i);
                c.is_valid(row).then(|| i64_at(c, row)).transpose()
            };
            for row in 0..b.num_rows() {
                jobs.push(FinishedJob {
                    job_id: str_at(b.column(0), row)?.unwrap_or_default(),
                    account: str_at(b.column(1), row)?.unwrap_or_default(),
                    project: str_at(b.column(2), row)?,
                    partition: str_at(b.column(3), row)?,
                    gpus: u32::try_from(ms(4, row)?.unwrap_or(0)).unwrap_or(0),
                    submitted_ms: ms(5, row)?,
                    started_ms: ms(6, row)?,
                    finished_ms: ms(7, row)?.unwrap_or_default(),
                    outcome: str_at(b.column(8), row)?,
                    gpu_seconds: 0,
                });
            }
        }
        if jobs.is_empty() {
            return Ok(jobs);
        }
        let ids: Vec<String> = jobs
            .iter()
            .map(|j| format!("'{}'", j.job_id.replace('\'', "''")))
            .collect();
        let usage_sql = format!(
            "SELECT job_id, SUM(gpu_seconds) FROM rollups_hourly WHERE job_id IN ({}) GROUP BY job_id",
            ids.join(", ")
        );
        let mut seconds: std::collections::HashMap<String, i64> = Default::default();
        for b in self.sql(&usage_sql).await? {
            for row in 0..b.num_rows() {
                if let Some(id) = str_at(b.column(0), row)? {
                    seconds.insert(id, i64_at(b.column(1), row)?);
                }
            }
        }
        for j in &mut jobs {
            j.gpu_seconds = seconds.get(&j.job_id).copied().unwrap_or(0);
        }
        Ok(jobs)
    }

    /// The jobs that finished at or after `since_ms`, oldest first.
    pub async fn jobs_finished_since(&self, since_ms: UnixMillis) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT job_id, MIN(CAST(time AS BIGINT)) AS t FROM jobs \
             WHERE kind = 'finished' AND CAST(time AS BIGINT) >= {since_ms} GROUP BY job_id ORDER BY t"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            for row in 0..b.num_rows() {
                out.extend(str_at(b.column(0), row)?);
            }
        }
        Ok(out)
    }

    /// The end of the latest sample stored (Unix ms), `None` when none is: how far the store's
    /// evidence reaches. A run with no end event is held up to here when usage is billed, never
    /// into time the store knows nothing of (a demo that stopped, an aggregator behind).
    pub async fn data_through_ms(&self) -> Result<Option<UnixMillis>> {
        let last_hour = self
            .sql("SELECT MAX(CAST(hour AS BIGINT)) FROM rollups_hourly")
            .await?;
        let Some(hour) = last_hour
            .first()
            .filter(|b| b.num_rows() > 0 && b.column(0).is_valid(0))
            .map(|b| i64_at(b.column(0), 0))
            .transpose()?
        else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT MAX(CAST(time AS BIGINT) + CAST(interval_s AS BIGINT) * 1000) FROM samples \
             WHERE CAST(time AS BIGINT) >= {hour}"
        );
        let last = self.sql(&sql).await?;
        let end = last
            .first()
            .filter(|b| b.num_rows() > 0 && b.column(0).is_valid(0))
            .map(|b| i64_at(b.column(0), 0))
            .transpose()?;
        // Raw samples past retention: the rollup's hour end.
        Ok(Some(end.unwrap_or(hour + 3_600_000)))
    }

    /// Every stored job event before `to_ms`, in time order.
    pub async fn job_events_before(
        &self,
        to_ms: UnixMillis,
    ) -> Result<Vec<gpuledger_model::job::JobEvent>> {
        self.events_where(&format!("CAST(time AS BIGINT) < {to_ms}"))
            .await
    }

    /// Every stored event of the jobs that have not finished, in time order: what the jobs
    /// waiting and running now are rebuilt from at start.
    pub async fn unfinished_job_events(&self) -> Result<Vec<gpuledger_model::job::JobEvent>> {
        self.events_where("job_id NOT IN (SELECT job_id FROM jobs WHERE kind = 'finished')")
            .await
    }

    /// The stored job events matching an SQL condition, in time order.
    async fn events_where(&self, condition: &str) -> Result<Vec<gpuledger_model::job::JobEvent>> {
        let sql = format!(
            "SELECT time, job_id, account, project, kind, partition, gpus, allocation, \
               time_limit_s, outcome, exit_code, achieved_flops FROM jobs \
             WHERE {condition} ORDER BY time, job_id"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            let events =
                gpuledger_model::job::job_events_from_batch(&plain_strings(&b)?).map_err(|e| {
                    Error::Corrupt(format!(
                        "job event row {}, `{}`: {}",
                        e.row, e.field, e.message
                    ))
                })?;
            out.extend(events);
        }
        Ok(out)
    }

    /// Per account, project and hour, the GPU-seconds of hours starting before `to_ms`.
    pub async fn hourly_usage(&self, to_ms: UnixMillis) -> Result<Vec<HourlyUsage>> {
        let sql = format!(
            "SELECT account, project, CAST(hour AS BIGINT) AS hour_ms, SUM(gpu_seconds) \
             FROM rollups_hourly \
             WHERE account IS NOT NULL AND CAST(hour AS BIGINT) < {to_ms} \
             GROUP BY account, project, CAST(hour AS BIGINT)"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            for row in 0..b.num_rows() {
                out.push(HourlyUsage {
                    account: str_at(b.column(0), row)?.unwrap_or_default(),
                    project: str_at(b.column(1), row)?,
                    hour_ms: i64_at(b.column(2), row)?,
                    gpu_seconds: i64_at(b.column(3), row)?,
                });
            }
        }
        Ok(out)
    }

    /// Everything stored about one job; `None` when nothing is.
    pub async fn job_detail(&self, job_id: &str) -> Result<Option<JobDetail>> {
        let id = job_id.replace('\'', "''");
        let events_sql = format!(
            "SELECT CAST(time AS BIGINT) AS time_ms, kind, account, project, partition, gpus, \
               allocation, time_limit_s, outcome, exit_code, achieved_flops \
             FROM jobs WHERE job_id = '{id}' ORDER BY time_ms, kind"
        );
        let usage_sql = format!(
            "SELECT gpu_model, account, project, SUM(gpu_seconds), SUM(util_pct_sum), SUM(util_seconds), \
               SUM(mfu_proxy_sum), SUM(mfu_seconds), \
               SUM(CAST(mem_used_byte_seconds AS DOUBLE)), SUM(CAST(mem_total_byte_seconds AS DOUBLE)) \
             FROM rollups_hourly WHERE job_id = '{id}' GROUP BY gpu_model, account, project ORDER BY gpu_model"
        );
        let mut detail = JobDetail {
            job_id: job_id.to_owned(),
            ..JobDetail::default()
        };
        let mut reported_flops: Option<f64> = None;
        let mut gpus: Option<i64> = None;
        for b in self.sql(&events_sql).await? {
            let json = batch_to_json_rows(&b)?;
            for (row, value) in json.into_iter().enumerate() {
                detail.account = detail.account.or(str_at(b.column(2), row)?);
                detail.project = detail.project.or(str_at(b.column(3), row)?);
                let kind = str_at(b.column(1), row)?.unwrap_or_default();
                if kind == "started" {
                    gpus = gpus.or(Some(i64_at(b.column(5), row)?));
                }
                if kind == "flops_reported" {
                    reported_flops = f64_at(b.column(10), row)?.or(reported_flops);
                }
                detail.events.push(value);
            }
        }
        let (mut util, mut util_s, mut mfu, mut mfu_s, mut used, mut total) =
            (0.0, 0i64, 0.0, 0i64, 0.0, 0.0);
        let mut peak_flops = 0.0;
        for b in self.sql(&usage_sql).await? {
            for row in 0..b.num_rows() {
                let model = str_at(b.column(0), row)?.unwrap_or_default();
                let secs = i64_at(b.column(3), row)?;
                detail.account = detail.account.or(str_at(b.column(1), row)?);
                detail.project = detail.project.or(str_at(b.column(2), row)?);
                detail.gpu_seconds += secs;
                *detail
                    .gpu_seconds_by_model
                    .entry(model.clone())
                    .or_default() += secs;
                if let Ok(m) = model.parse::<gpuledger_model::GpuModel>() {
                    peak_flops = m.peak_dense_bf16_flops();
                }
                util += f64_at(b.column(4), row)?.unwrap_or(0.0);
                util_s += i64_at(b.column(5), row)?;
                mfu += f64_at(b.column(6), row)?.unwrap_or(0.0);
                mfu_s += i64_at(b.column(7), row)?;
                used += f64_at(b.column(8), row)?.unwrap_or(0.0);
                total += f64_at(b.column(9), row)?.unwrap_or(0.0);
            }
        }
        if detail.events.is_empty() && detail.gpu_seconds == 0 {
            return Ok(None);
        }
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        detail.mean_gpu_util_pct = ratio(util, util_s as f64);
        detail.mean_mem_util = ratio(used, total);
        match (reported_flops, gpus) {
            (Some(flops), Some(g)) if g > 0 && peak_flops > 0.0 => {
                detail.mfu = Some(flops / (g as f64 * peak_flops));
                detail.mfu_source = Some("reported");
            }
            _ => {
                detail.mfu = ratio(mfu, mfu_s as f64);
                detail.mfu_source = detail.mfu.map(|_| "tensor_active_proxy");
            }
        }
        Ok(Some(detail))
    }

    /// Runs `sql`, whose first column is the account, and lets `fill` set each account's
    /// figures from its row.
    async fn fill_per_account(
        &self,
        sql: &str,
        by_account: &mut std::collections::BTreeMap<String, AccountIndicators>,
        fill: impl Fn(&mut AccountIndicators, &RecordBatch, usize) -> Result<()>,
    ) -> Result<()> {
        for b in self.sql(sql).await? {
            for row in 0..b.num_rows() {
                let Some(account) = str_at(b.column(0), row)? else {
                    continue;
                };
                let entry =
                    by_account
                        .entry(account.clone())
                        .or_insert_with(|| AccountIndicators {
                            account,
                            ..Default::default()
                        });
                fill(entry, &b, row)?;
            }
        }
        Ok(())
    }
}
