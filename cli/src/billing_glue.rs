//! Turns the aggregator's usage rows into the billing crate's records, and writes invoices.

use std::path::{Path, PathBuf};

use anyhow::Context;
use gpuledger_aggregator::query::UsageRow;
use gpuledger_billing::{gpu_hour_invoices, invoice_csv, Invoice, PriceBook, UsageRecord};
use gpuledger_model::{AccountId, ClusterConfig, GpuModel, GpuSeconds, JobId, ProjectId};

/// Parses usage rows read from storage; a bad id or model names the row.
pub fn usage_records(rows: &[UsageRow]) -> anyhow::Result<Vec<UsageRecord>> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            Ok(UsageRecord {
                account: AccountId::new(&r.account)
                    .with_context(|| format!("usage row {i}: account"))?,
                project: r
                    .project
                    .as_deref()
                    .map(ProjectId::new)
                    .transpose()
                    .with_context(|| format!("usage row {i}: project"))?,
                job_id: Some(
                    JobId::new(&r.job_id).with_context(|| format!("usage row {i}: job_id"))?,
                ),
                gpu_model: r
                    .gpu_model
                    .parse::<GpuModel>()
                    .with_context(|| format!("usage row {i}: gpu_model"))?,
                gpu_seconds: GpuSeconds(r.gpu_seconds),
            })
        })
        .collect()
}

/// Prices a month's usage.
pub fn invoices_for(
    config: &ClusterConfig,
    month: &str,
    rows: &[UsageRow],
) -> anyhow::Result<Vec<Invoice>> {
    let usage = usage_records(rows)?;
    Ok(gpu_hour_invoices(
        month,
        &usage,
        &PriceBook::new(config.prices.clone()),
    )?)
}

/// Writes one CSV per account under `dir`; returns the paths.
pub fn write_invoices(dir: &Path, invoices: &[Invoice]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    invoices
        .iter()
        .map(|inv| {
            let path = dir.join(format!("{}.csv", inv.account));
            std::fs::write(&path, invoice_csv(inv))
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}
