//! The status page at `/`: the seed's indicators against their targets, each tenant's usage and
//! list-price cost, the queue, and charts, readable without Grafana. [`StatusView`] is what it
//! shows (also served as JSON at `/api/v1/status`); [`render`] is the page. A tenant sees its
//! own account only: the view is built for a [`Scope`] and holds nothing outside it.
//!
//! Every figure carries its exact value in a `data-value` attribute beside the text a reader
//! sees, so a browser test can hold the page to the API.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use gpuledger_auth::Scope;
use gpuledger_model::config::ClusterConfig;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::live::LiveJob;
use crate::query::{AccountIndicators, Query};
use crate::Result;

mod invoices;
mod page;
pub use invoices::{invoice_url, invoices_page, InvoiceSummary};
pub use page::{login_page, render, Nav};

/// The seed's targets (DESIGN.md, "Monitoring").
pub mod target {
    pub const CLUSTER_UTILIZATION: f64 = 0.85;
    pub const JOB_MFU: f64 = 0.50;
    pub const GPU_UTIL_PCT: f64 = 70.0;
    pub const MEM_UTIL: f64 = 0.60;
    pub const QUEUE_WAIT_S: f64 = 4.0 * 3600.0;
    pub const SUCCESS_RATE: f64 = 0.95;
}

/// The window a page covers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    pub from_ms: UnixMillis,
    pub to_ms: UnixMillis,
    /// `mtd` (month to date), `24h`, `7d`, `30d` or `custom`.
    pub name: String,
}

impl Window {
    /// A named window ending at `now_ms`; `None` for an unknown name.
    pub fn named(name: &str, now_ms: UnixMillis) -> Option<Self> {
        let from_ms = match name {
            "mtd" => month_start_ms(now_ms),
            "24h" => now_ms - 86_400_000,
            "7d" => now_ms - 7 * 86_400_000,
            "30d" => now_ms - 30 * 86_400_000,
            _ => return None,
        };
        Some(Window {
            from_ms,
            to_ms: now_ms,
            name: name.to_owned(),
        })
    }
}

/// The first millisecond of the UTC month holding `ms`.
pub fn month_start_ms(ms: UnixMillis) -> UnixMillis {
    use chrono::Datelike;
    let date = gpuledger_model::time::date_of_ms(ms);
    let first = date.with_day(1).unwrap_or(date);
    gpuledger_model::time::day_start_ms(first)
}

/// One account's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AccountRow {
    #[serde(flatten)]
    pub indicators: AccountIndicators,
    pub name: String,
    /// GPU-hours measured on GPUs its jobs held (reconciled with the job events).
    pub gpu_hours: f64,
    /// GPU-hours its jobs held that no exporter measured (node down, exporter missing).
    pub gap_gpu_hours: f64,
    /// Those GPU-hours, measured and gap, at the cluster's list prices (the invoice, under the
    /// price book's `coverage`, is authoritative).
    pub cost: Decimal,
    /// Share of the window's GPU-hours of the accounts shown.
    pub share: Option<f64>,
    /// GPUs its fair-share weight entitles it to.
    pub entitled_gpus: f64,
    /// GPUs its running jobs hold now.
    pub gpus_now: u32,
}

/// The cluster as a whole (operators and finance only).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterRow {
    #[serde(flatten)]
    pub indicators: AccountIndicators,
    pub total_gpus: u64,
    /// GPU-seconds working for a job over all GPU-seconds sampled.
    pub utilization: Option<f64>,
    pub gpu_hours: f64,
    pub cost: Decimal,
}

/// A job waiting or running.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueRow {
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
    pub partition: Option<String>,
    pub state: &'static str,
    pub gpus: u32,
    pub submitted_ms: Option<UnixMillis>,
    pub started_ms: Option<UnixMillis>,
    /// How long it has waited (pending) or run (running), in seconds.
    pub for_s: i64,
    pub mfu: Option<f64>,
    pub mfu_source: Option<&'static str>,
}

/// Finished jobs listed at most (the latest first).
pub const FINISHED_ROWS: usize = 50;

/// GPU-hours a node measured that were billed to nobody, and why (operators only).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlaggedRow {
    pub node: String,
    pub reason: &'static str,
    pub gpu_hours: f64,
}

/// A job's GPU-hours held but not measured on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GapRow {
    pub account: String,
    pub job_id: String,
    pub node: String,
    pub gpu_hours: f64,
}

/// Coverage gaps listed at most (the largest first).
const GAP_ROWS: usize = 50;

/// Everything the page shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusView {
    pub cluster_name: String,
    pub generated_ms: UnixMillis,
    pub window: Window,
    /// `all`, or the one account shown.
    pub scope: String,
    pub currency: String,
    pub cluster: Option<ClusterRow>,
    pub accounts: Vec<AccountRow>,
    /// GPU-hours per UTC day (day start in ms) and account.
    pub daily_gpu_hours: Vec<(UnixMillis, BTreeMap<String, f64>)>,
    pub queue: Vec<QueueRow>,
    /// Jobs that finished in the window, the latest first (at most [`FINISHED_ROWS`]); from
    /// the stored tables, so a job shows here once its end is flushed.
    pub finished: Vec<crate::query::FinishedJob>,
    /// Measured GPU-hours billed to nobody, per node and reason (operators and finance).
    pub flagged: Vec<FlaggedRow>,
    /// Held and not measured, per job and node, the largest first.
    pub coverage_gaps: Vec<GapRow>,
}

fn list_cost(config: &ClusterConfig, model: &str, gpu_seconds: i64) -> Decimal {
    let price = model
        .parse::<GpuModel>()
        .ok()
        .and_then(|m| config.prices.gpu_hour.get(&m).copied())
        .unwrap_or_default();
    config
        .prices
        .currency
        .round(Decimal::from(gpu_seconds) * price / Decimal::from(3600))
}

/// Builds the view of `window` for `scope`.
pub async fn build(
    query: &Query,
    config: &ClusterConfig,
    live: &[LiveJob],
    scope: &Scope,
    window: Window,
    now_ms: UnixMillis,
) -> Result<StatusView> {
    let (from, to) = (window.from_ms, window.to_ms);
    let mut indicators: BTreeMap<String, AccountIndicators> = query
        .account_indicators(from, to)
        .await?
        .into_iter()
        .filter(|i| scope.covers(&i.account))
        .map(|i| (i.account.clone(), i))
        .collect();
    let ledger = crate::ledger::reconciled(query, config, from, to, now_ms).await?;
    let mut cost: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut measured: BTreeMap<String, i64> = BTreeMap::new();
    let mut gap_seconds: BTreeMap<String, i64> = BTreeMap::new();
    for (u, gap) in ledger
        .billed
        .iter()
        .map(|u| (u, false))
        .chain(ledger.gaps.iter().map(|u| (u, true)))
        .filter(|(u, _)| scope.covers(&u.account))
    {
        *cost.entry(u.account.clone()).or_default() +=
            list_cost(config, &u.gpu_model, u.gpu_seconds);
        let into = if gap { &mut gap_seconds } else { &mut measured };
        *into.entry(u.account.clone()).or_default() += u.gpu_seconds;
    }
    let flagged: Vec<FlaggedRow> = match scope {
        Scope::All => ledger
            .flagged_by_node()
            .into_iter()
            .map(|((node, reason), secs)| FlaggedRow {
                node,
                reason: reason.as_str(),
                gpu_hours: secs as f64 / 3600.0,
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut gaps: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    for g in ledger.gaps.iter().filter(|g| scope.covers(&g.account)) {
        *gaps
            .entry((
                g.account.clone(),
                g.job_id.clone().unwrap_or_default(),
                g.node.clone(),
            ))
            .or_default() += g.gpu_seconds;
    }
    let mut coverage_gaps: Vec<GapRow> = gaps
        .into_iter()
        .map(|((account, job_id, node), secs)| GapRow {
            account,
            job_id,
            node,
            gpu_hours: secs as f64 / 3600.0,
        })
        .collect();
    coverage_gaps.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours));
    coverage_gaps.truncate(GAP_ROWS);
    let mut daily: BTreeMap<UnixMillis, BTreeMap<String, f64>> = BTreeMap::new();
    for u in query.account_usage(from, to, true).await? {
        if let (true, Ok(day)) = (scope.covers(&u.account), u.key.parse::<i64>()) {
            *daily.entry(day).or_default().entry(u.account).or_default() +=
                u.gpu_seconds as f64 / 3600.0;
        }
    }
    let weights: u64 = config.accounts.iter().map(|a| u64::from(a.weight)).sum();
    let total_gpus = config.total_gpus();
    let mut gpus_now: BTreeMap<&str, u32> = BTreeMap::new();
    for j in live.iter().filter(|j| j.is_running()) {
        *gpus_now.entry(j.account.as_str()).or_default() += j.gpus;
    }
    let mut accounts: Vec<AccountRow> = config
        .accounts
        .iter()
        .filter(|a| scope.covers(a.id.as_str()))
        .map(|a| {
            let id = a.id.to_string();
            let indicators = indicators.remove(&id).unwrap_or_else(|| AccountIndicators {
                account: id.clone(),
                ..Default::default()
            });
            AccountRow {
                name: a.name.clone(),
                gpu_hours: measured.get(&id).copied().unwrap_or(0) as f64 / 3600.0,
                gap_gpu_hours: gap_seconds.get(&id).copied().unwrap_or(0) as f64 / 3600.0,
                cost: cost.get(&id).copied().unwrap_or_default(),
                share: None,
                entitled_gpus: total_gpus as f64 * f64::from(a.weight) / weights.max(1) as f64,
                gpus_now: gpus_now.get(id.as_str()).copied().unwrap_or(0),
                indicators,
            }
        })
        .collect();
    let shown_hours: f64 = accounts.iter().map(|a| a.gpu_hours).sum();
    for a in &mut accounts {
        a.share = (shown_hours > 0.0).then(|| a.gpu_hours / shown_hours);
    }
    let cluster = match scope {
        Scope::All => {
            let indicators = query.cluster_indicators(from, to).await?;
            Some(ClusterRow {
                total_gpus,
                utilization: query.cluster_utilization(from, to).await?,
                gpu_hours: indicators.gpu_seconds as f64 / 3600.0,
                cost: cost.values().copied().sum(),
                indicators,
            })
        }
        _ => None,
    };
    let queue = live
        .iter()
        .filter(|j| scope.covers(&j.account))
        .map(|j| {
            let mfu = j.mfu();
            QueueRow {
                job_id: j.job_id.clone(),
                account: j.account.clone(),
                project: j.project.clone(),
                // A job that named no partition runs in the default one: say which.
                partition: j
                    .partition
                    .clone()
                    .or_else(|| config.default_partition().map(|p| p.name.clone())),
                state: if j.is_running() { "running" } else { "pending" },
                gpus: j.gpus,
                submitted_ms: j.submitted_ms,
                started_ms: j.started_ms,
                for_s: (now_ms - j.started_ms.or(j.submitted_ms).unwrap_or(now_ms)).max(0) / 1000,
                mfu: mfu.map(|m| m.0),
                mfu_source: mfu.map(|m| m.1.as_str()),
            }
        })
        .collect();
    Ok(StatusView {
        cluster_name: config.cluster.name.clone(),
        generated_ms: now_ms,
        window,
        scope: match scope {
            Scope::Account(a) => a.to_string(),
            _ => "all".into(),
        },
        currency: config.prices.currency.code().to_owned(),
        cluster,
        accounts,
        daily_gpu_hours: daily.into_iter().collect(),
        queue,
        finished: query
            .finished_jobs(scope, from, to, FINISHED_ROWS)
            .await?
            .into_iter()
            .map(|mut j| {
                if j.partition.is_none() {
                    j.partition = config.default_partition().map(|p| p.name.clone());
                }
                j
            })
            .collect(),
        flagged,
        coverage_gaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_durations() {
        let june_10 = 1_781_049_600_000; // 2026-06-10T00:00:00Z
        let w = Window::named("mtd", june_10 + 3_600_000).unwrap();
        assert_eq!(w.from_ms, 1_780_272_000_000, "2026-06-01");
        assert!(Window::named("week", june_10).is_none());
    }
}
