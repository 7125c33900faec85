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
use gpuledger_model::time::UnixMillis;

use crate::layout::{Layout, Table};
use crate::rollup::rollup_schema;
use crate::{io_err, Error, Result};

/// A query session over a data directory.
pub struct Query {
    ctx: SessionContext,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Query")
    }
}

/// GPU-seconds of one job on one GPU model, for billing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UsageRow {
    pub account: String,
    pub project: Option<String>,
    pub job_id: String,
    pub gpu_model: String,
    pub gpu_seconds: i64,
}

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
    pub mean_queue_wait_s: Option<f64>,
    pub max_queue_wait_s: Option<f64>,
    /// Completed over finished.
    pub success_rate: Option<f64>,
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

impl Query {
    /// Registers the tables of the data directory at `root`.
    pub async fn open(layout: &Layout) -> Result<Self> {
        let ctx = SessionContext::new();
        for (table, schema) in [
            (Table::Samples, sample_schema()),
            (Table::RollupsHourly, rollup_schema()),
            (Table::Jobs, job_event_schema()),
        ] {
            let dir = layout.table_dir(table);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
                .with_file_extension(".parquet")
                .with_table_partition_cols(vec![("date".to_owned(), DataType::Utf8)]);
            let url = format!("{}/", dir.canonicalize().map_err(io_err(&dir))?.display());
            ctx.register_listing_table(table.sql_name(), url, options, Some(schema), None)
                .await?;
        }
        Ok(Query { ctx })
    }

    /// Runs SQL over the tables.
    pub async fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        Ok(self.ctx.sql(sql).await?.collect().await?)
    }

    /// Per job and GPU model, the GPU-seconds of `[from_ms, to_ms)`, from the hourly rollups.
    pub async fn job_usage(&self, from_ms: UnixMillis, to_ms: UnixMillis) -> Result<Vec<UsageRow>> {
        let sql = format!(
            "SELECT account, project, job_id, gpu_model, SUM(gpu_seconds) AS gpu_seconds \
             FROM rollups_hourly \
             WHERE job_id IS NOT NULL AND CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms} \
             GROUP BY account, project, job_id, gpu_model \
             ORDER BY account, project, job_id, gpu_model"
        );
        let mut out = Vec::new();
        for b in self.sql(&sql).await? {
            for row in 0..b.num_rows() {
                let text = |i: usize| str_at(b.column(i), row);
                out.push(UsageRow {
                    account: text(0)?
                        .ok_or_else(|| Error::Corrupt("labelled usage without account".into()))?,
                    project: text(1)?,
                    job_id: text(2)?.unwrap_or_default(),
                    gpu_model: text(3)?.unwrap_or_default(),
                    gpu_seconds: i64_at(b.column(4), row)?,
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
        let usage_sql = format!(
            "SELECT account, SUM(gpu_seconds) AS gpu_seconds, \
               SUM(mfu_proxy_sum) / NULLIF(SUM(mfu_seconds), 0) AS mfu, \
               SUM(util_pct_sum) / NULLIF(SUM(util_seconds), 0) AS util, \
               CAST(SUM(mem_used_byte_seconds) AS DOUBLE) / NULLIF(CAST(SUM(mem_total_byte_seconds) AS DOUBLE), 0) AS mem \
             FROM rollups_hourly \
             WHERE account IS NOT NULL AND CAST(hour AS BIGINT) >= {from_ms} AND CAST(hour AS BIGINT) < {to_ms} \
             GROUP BY account"
        );
        let jobs_sql = format!(
            "WITH j AS ( \
               SELECT job_id, account, \
                 MIN(CASE WHEN kind = 'submitted' THEN CAST(time AS BIGINT) END) AS submitted_ms, \
                 MIN(CASE WHEN kind = 'started' THEN CAST(time AS BIGINT) END) AS started_ms, \
                 MAX(CASE WHEN kind = 'finished' THEN outcome END) AS outcome \
               FROM jobs GROUP BY job_id, account) \
             SELECT account, COUNT(*) AS jobs, \
               AVG(started_ms - submitted_ms) / 1000.0 AS mean_wait_s, \
               MAX(started_ms - submitted_ms) / 1000.0 AS max_wait_s, \
               CAST(SUM(CASE WHEN outcome = 'completed' THEN 1 ELSE 0 END) AS DOUBLE) \
                 / NULLIF(CAST(SUM(CASE WHEN outcome IS NOT NULL THEN 1 ELSE 0 END) AS DOUBLE), 0) AS success \
             FROM j WHERE submitted_ms >= {from_ms} AND submitted_ms < {to_ms} \
             GROUP BY account"
        );
        let mut by_account: std::collections::BTreeMap<String, AccountIndicators> =
            Default::default();
        self.fill_per_account(&usage_sql, &mut by_account, |e, b, row| {
            e.gpu_seconds = i64_at(b.column(1), row)?;
            e.mean_mfu = f64_at(b.column(2), row)?;
            e.mean_gpu_util_pct = f64_at(b.column(3), row)?;
            e.mean_mem_util = f64_at(b.column(4), row)?;
            Ok(())
        })
        .await?;
        self.fill_per_account(&jobs_sql, &mut by_account, |e, b, row| {
            e.jobs = i64_at(b.column(1), row)?;
            e.mean_queue_wait_s = f64_at(b.column(2), row)?;
            e.max_queue_wait_s = f64_at(b.column(3), row)?;
            e.success_rate = f64_at(b.column(4), row)?;
            Ok(())
        })
        .await?;
        Ok(by_account.into_values().collect())
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
