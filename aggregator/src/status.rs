//! The status page at `/`: the seed's indicators against their targets, each tenant's usage and
//! list-price cost, the queue, and charts, readable without Grafana. [`StatusView`] is what it
//! shows (also served as JSON at `/api/v1/status`); [`render`] is the page. A tenant sees its
//! own account only: the view is built for a [`Scope`] and holds nothing outside it.
//!
//! Every figure carries its exact value in a `data-value` attribute beside the text a reader
//! sees, so a browser test can hold the page to the API.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use serde::Serialize;

use gpuledger_auth::Scope;
use gpuledger_model::config::ClusterConfig;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::live::LiveJob;
use crate::query::{AccountIndicators, Query};
use crate::Result;
use gpuledger_charts::{self as svg, escape, Series};

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
        flagged,
        coverage_gaps,
    })
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{:.1}%", v * 100.0))
}

fn pct_of_100(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.1}%"))
}

/// A duration for people: `42 s`, `12 min`, `3.5 h`, `2.1 d`.
pub fn duration(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(s) if s < 60.0 => format!("{s:.0} s"),
        Some(s) if s < 3600.0 => format!("{:.0} min", s / 60.0),
        Some(s) if s < 86_400.0 * 2.0 => format!("{:.1} h", s / 3600.0),
        Some(s) => format!("{:.1} d", s / 86_400.0),
    }
}

fn time(ms: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// A `<td>` with the exact value and its text.
fn cell(field: &str, value: Option<f64>, text: &str) -> String {
    let value = value.map_or_else(String::new, |v| format!(" data-value=\"{v}\""));
    format!("<td data-field=\"{field}\"{value}>{}</td>", escape(text))
}

/// One indicator against its target: `above` says whether higher is better.
fn indicator_row(
    key: &str,
    name: &str,
    value: Option<f64>,
    text: String,
    target: Option<(f64, bool, String)>,
) -> String {
    let (target_text, status) = match (target, value) {
        (Some((t, above, label)), Some(v)) => {
            let met = if above { v >= t } else { v <= t };
            (
                label,
                if met {
                    ("met", "on target")
                } else {
                    ("missed", "off target")
                },
            )
        }
        (Some((_, _, label)), None) => (label, ("none", "not measured")),
        (None, _) => ("reference".into(), ("none", "")),
    };
    let value_attr = value.map_or_else(String::new, |v| format!(" data-value=\"{v}\""));
    format!(
        "<tr data-indicator=\"{key}\"><td>{}</td><td class=\"num\"{value_attr}>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>\n",
        escape(name),
        escape(&text),
        escape(&target_text),
        status.0,
        status.1
    )
}

fn indicators_table(html: &mut String, i: &AccountIndicators, utilization: Option<(f64, String)>) {
    html.push_str("<table class=\"indicators\"><tr><th>indicator</th><th>value</th><th>target</th><th></th></tr>\n");
    if let Some((u, name)) = utilization {
        html.push_str(&indicator_row(
            "utilization",
            &name,
            Some(u),
            pct(Some(u)),
            Some((target::CLUSTER_UTILIZATION, true, "> 85%".into())),
        ));
    }
    html.push_str(&indicator_row(
        "mean_mfu",
        "Mean MFU (GPU-seconds weighted)",
        i.mean_mfu,
        pct(i.mean_mfu),
        Some((target::JOB_MFU, true, "> 50%".into())),
    ));
    html.push_str(&indicator_row(
        "mean_gpu_util_pct",
        "GPU utilization",
        i.mean_gpu_util_pct,
        pct_of_100(i.mean_gpu_util_pct),
        Some((target::GPU_UTIL_PCT, true, "> 70%".into())),
    ));
    html.push_str(&indicator_row(
        "mean_mem_util",
        "Memory utilization",
        i.mean_mem_util,
        pct(i.mean_mem_util),
        Some((target::MEM_UTIL, true, "> 60%".into())),
    ));
    html.push_str(&indicator_row(
        "p95_queue_wait_s",
        "Queue wait p95",
        i.p95_queue_wait_s,
        duration(i.p95_queue_wait_s),
        Some((target::QUEUE_WAIT_S, false, "< 4 h".into())),
    ));
    html.push_str(&indicator_row(
        "max_queue_wait_s",
        "Queue wait max",
        i.max_queue_wait_s,
        duration(i.max_queue_wait_s),
        None,
    ));
    html.push_str(&indicator_row(
        "success_rate",
        "Job success rate",
        i.success_rate,
        pct(i.success_rate),
        Some((target::SUCCESS_RATE, true, "> 95%".into())),
    ));
    html.push_str(&indicator_row(
        "jobs",
        "Jobs submitted",
        Some(i.jobs as f64),
        i.jobs.to_string(),
        None,
    ));
    html.push_str("</table>\n");
}

const STYLE: &str = "body{font-family:sans-serif;margin:0;background:#f4f5f7;color:#222}\
header{background:#1f2d3d;color:white;padding:10px 18px;display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}\
header h1{font-size:18px;margin:0} header a{color:#cde} header form{margin-left:auto}\
main{padding:12px 18px} section{background:white;border:1px solid #ddd;border-radius:4px;padding:10px 14px;margin-bottom:12px}\
h2{font-size:15px;margin:0 0 8px} table{border-collapse:collapse;font-size:13px} th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:left}\
td.num,td[data-value]{text-align:right;font-variant-numeric:tabular-nums} .met{color:#1a7f37} .missed{color:#c62828;font-weight:bold} .none{color:#888}\
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:10px} svg{max-width:100%;height:auto}\
.muted{color:#777;font-size:12px}";

/// Coverage gaps (jobs' GPUs no exporter measured) and flagged GPU-hours (measured, billed to
/// nobody), where there are any.
fn ledger_section(html: &mut String, view: &StatusView) {
    if view.coverage_gaps.is_empty() && view.flagged.is_empty() {
        return;
    }
    html.push_str("<section id=\"ledger\"><h2>Ledger: coverage gaps and flagged telemetry</h2>\n");
    if !view.coverage_gaps.is_empty() {
        html.push_str("<table id=\"coverage-gaps\"><tr><th>account</th><th>job</th><th>node</th><th>GPU-hours held, not measured</th></tr>\n");
        for g in &view.coverage_gaps {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
                escape(&g.account),
                escape(&g.job_id),
                escape(&g.node),
                cell(
                    "gap_gpu_hours",
                    Some(g.gpu_hours),
                    &format!("{:.2}", g.gpu_hours)
                )
            );
        }
        html.push_str("</table>\n");
    }
    if !view.flagged.is_empty() {
        html.push_str("<table id=\"flagged\"><tr><th>node</th><th>reason</th><th>GPU-hours billed to nobody</th></tr>\n");
        for f in &view.flagged {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td>{}</tr>",
                escape(&f.node),
                escape(f.reason),
                cell(
                    "flagged_gpu_hours",
                    Some(f.gpu_hours),
                    &format!("{:.2}", f.gpu_hours)
                )
            );
        }
        html.push_str("</table><p class=\"muted\">Flagged: a node reported a job on a GPU the job did not hold then (not_held), a job no event names (unknown_job), or another account than the job's (account_mismatch).</p>\n");
    }
    html.push_str("</section>\n");
}

/// The page for `view`; `who` says who is signed in (`None`: authentication is off).
pub fn render(view: &StatusView, who: Option<&str>) -> String {
    let mut html = String::with_capacity(32 * 1024);
    let title = format!("gpuledger · {}", view.cluster_name);
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"60\">\
         <title>{t}</title><style>{STYLE}</style></head>\n<body data-from-ms=\"{}\" data-to-ms=\"{}\" data-scope=\"{}\">\n<header><h1>{t}</h1>",
        view.window.from_ms,
        view.window.to_ms,
        escape(&view.scope),
        t = escape(&title)
    );
    for (name, label) in [
        ("mtd", "month to date"),
        ("24h", "24 h"),
        ("7d", "7 days"),
        ("30d", "30 days"),
    ] {
        let current = if view.window.name == name {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(html, "<a href=\"/?window={name}\"{current}>{label}</a>");
    }
    let _ = write!(
        html,
        "<span class=\"muted\" style=\"color:#cde\">{} to {}</span>",
        time(view.window.from_ms),
        time(view.window.to_ms)
    );
    if let Some(who) = who {
        let _ = write!(
            html,
            "<form method=\"post\" action=\"/logout\"><span>{}</span> <button type=\"submit\">sign out</button></form>",
            escape(who)
        );
    }
    html.push_str("</header>\n<main>\n");

    match &view.cluster {
        Some(c) => {
            let _ = write!(
                html,
                "<section id=\"indicators\"><h2>Cluster indicators against their targets</h2>\
                 <p class=\"muted\">{} GPUs; {} jobs running on {} GPUs, {} waiting now; {} GPU-hours, {} {} at list prices in the window.</p>",
                c.total_gpus,
                view.queue.iter().filter(|q| q.state == "running").count(),
                view.queue.iter().filter(|q| q.state == "running").map(|q| q.gpus).sum::<u32>(),
                view.queue.iter().filter(|q| q.state == "pending").count(),
                format_args!("{:.1}", c.gpu_hours),
                c.cost,
                escape(&view.currency)
            );
            let util = c
                .utilization
                .map(|u| (u, "Cluster utilization (GPUs working for a job)".to_owned()));
            indicators_table(&mut html, &c.indicators, util);
            html.push_str("</section>\n");
        }
        None => {
            if let Some(a) = view.accounts.first() {
                let _ = write!(
                    html,
                    "<section id=\"indicators\"><h2>{} indicators against their targets</h2>",
                    escape(&a.indicators.account)
                );
                indicators_table(&mut html, &a.indicators, None);
                html.push_str("</section>\n");
            }
        }
    }

    let _ = writeln!(
        html,
        "<section id=\"accounts\"><h2>Usage and cost per tenant</h2><table><tr><th>account</th><th>name</th><th>jobs</th>\
         <th>GPU-hours</th><th>gap GPU-hours</th><th>share</th><th>GPUs now</th><th>entitled GPUs</th><th>mean MFU</th><th>GPU util</th><th>mem util</th>\
         <th>wait p95</th><th>success</th><th>cost ({})</th></tr>",
        escape(&view.currency)
    );
    for a in &view.accounts {
        let i = &a.indicators;
        let _ = writeln!(
            html,
            "<tr data-account=\"{acc}\"><td>{acc}</td><td>{}</td>{}{}{}{}{}{}{}{}{}{}{}{}</tr>",
            escape(&a.name),
            cell("jobs", Some(i.jobs as f64), &i.jobs.to_string()),
            cell(
                "gpu_hours",
                Some(a.gpu_hours),
                &format!("{:.1}", a.gpu_hours)
            ),
            cell(
                "gap_gpu_hours",
                Some(a.gap_gpu_hours),
                &format!("{:.1}", a.gap_gpu_hours)
            ),
            cell("share", a.share, &pct(a.share)),
            cell(
                "gpus_now",
                Some(f64::from(a.gpus_now)),
                &a.gpus_now.to_string()
            ),
            cell(
                "entitled_gpus",
                Some(a.entitled_gpus),
                &format!("{:.1}", a.entitled_gpus)
            ),
            cell("mean_mfu", i.mean_mfu, &pct(i.mean_mfu)),
            cell(
                "mean_gpu_util_pct",
                i.mean_gpu_util_pct,
                &pct_of_100(i.mean_gpu_util_pct)
            ),
            cell("mean_mem_util", i.mean_mem_util, &pct(i.mean_mem_util)),
            cell(
                "p95_queue_wait_s",
                i.p95_queue_wait_s,
                &duration(i.p95_queue_wait_s)
            ),
            cell("success_rate", i.success_rate, &pct(i.success_rate)),
            cell("cost", a.cost.to_f64(), &a.cost.to_string()),
            acc = escape(&i.account),
        );
    }
    html.push_str("</table><p class=\"muted\">GPU-hours are what each tenant's GPUs measured while its jobs held them; gap GPU-hours are what its jobs held that no exporter measured. Cost is both at the cluster's list prices; the monthly invoice (coverage, time-of-use, MFU weighting, reservations, storage) is what is billed.</p></section>\n");
    ledger_section(&mut html, view);

    html.push_str("<section id=\"charts\"><h2>Charts</h2><div class=\"charts\">\n");
    let per_account = |f: &dyn Fn(&AccountRow) -> f64| -> Vec<(String, f64)> {
        view.accounts
            .iter()
            .map(|a| (a.indicators.account.clone(), f(a)))
            .collect()
    };
    let share = per_account(&|a| a.gpu_hours);
    if view.cluster.is_some() {
        html.push_str(&svg::pie_chart(
            "GPU share (GPU-hours in the window)",
            &share,
        ));
    }
    let mfu = per_account(&|a| a.indicators.mean_mfu.unwrap_or(f64::NAN));
    html.push_str(&svg::bars_with_target(
        "Mean MFU per tenant",
        "MFU",
        &mfu,
        Some(1.0),
        Some((target::JOB_MFU, "target 50%")),
        |v| {
            if v.is_finite() {
                format!("{:.0}%", v * 100.0)
            } else {
                "–".into()
            }
        },
    ));
    let columns: Vec<String> = view
        .daily_gpu_hours
        .iter()
        .map(|(d, _)| {
            gpuledger_model::time::date_of_ms(*d)
                .format("%m-%d")
                .to_string()
        })
        .collect();
    let series: Vec<Series> = view
        .accounts
        .iter()
        .map(|a| Series {
            name: a.indicators.account.clone(),
            points: view
                .daily_gpu_hours
                .iter()
                .enumerate()
                .map(|(j, (_, by))| {
                    (
                        j as f64,
                        by.get(&a.indicators.account).copied().unwrap_or(0.0),
                    )
                })
                .collect(),
        })
        .collect();
    html.push_str(&svg::stacked_bars(
        "GPU-hours per day",
        "GPU-hours",
        &columns,
        &series,
    ));
    let waits = per_account(&|a| {
        a.indicators
            .p95_queue_wait_s
            .map_or(f64::NAN, |s| s / 3600.0)
    });
    html.push_str(&svg::bars_with_target(
        "Queue wait p95 per tenant (hours)",
        "hours",
        &waits,
        None,
        Some((target::QUEUE_WAIT_S / 3600.0, "target 4 h")),
        |v| {
            if v.is_finite() {
                format!("{v:.1}")
            } else {
                "–".into()
            }
        },
    ));
    html.push_str("</div></section>\n");

    html.push_str(
        "<section id=\"queue\"><h2>Queue</h2><table><tr><th>job</th><th>account</th><th>project</th><th>partition</th><th>state</th>\
         <th>GPUs</th><th>submitted</th><th>waiting / running for</th><th>MFU so far</th></tr>\n",
    );
    if view.queue.is_empty() {
        html.push_str(
            "<tr><td colspan=\"9\" class=\"muted\">no job waiting or running</td></tr>\n",
        );
    }
    for q in &view.queue {
        let _ = writeln!(
            html,
            "<tr data-job=\"{}\" data-state=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}<td>{}</td>{}{}</tr>",
            escape(&q.job_id),
            q.state,
            escape(&q.job_id),
            escape(&q.account),
            escape(q.project.as_deref().unwrap_or("")),
            escape(q.partition.as_deref().unwrap_or("")),
            q.state,
            cell("gpus", Some(f64::from(q.gpus)), &q.gpus.to_string()),
            q.submitted_ms.map(time).unwrap_or_default(),
            cell("for_s", Some(q.for_s as f64), &duration(Some(q.for_s as f64))),
            cell(
                "mfu",
                q.mfu,
                &q.mfu.map_or_else(|| "–".into(), |m| format!("{:.1}% ({})", m * 100.0, q.mfu_source.unwrap_or(""))),
            ),
        );
    }
    let _ = write!(
        html,
        "</table></section>\n<p class=\"muted\">Generated {}. Indicators read the stored data (flushed every minute); the queue is live. \
         JSON: <a href=\"/api/v1/status?from={}&amp;to={}\">/api/v1/status</a>.</p>\n</main></body></html>\n",
        time(view.generated_ms),
        view.window.from_ms,
        view.window.to_ms
    );
    html
}

/// The sign-in page: a token pasted once becomes an HttpOnly cookie for this page.
pub fn login_page(message: Option<&str>) -> String {
    let note = message.map_or_else(String::new, |m| {
        format!("<p class=\"missed\">{}</p>", escape(m))
    });
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>gpuledger · sign in</title><style>{STYLE}</style></head>\
         <body><header><h1>gpuledger</h1></header><main><section><h2>Sign in</h2>{note}\
         <form method=\"post\" action=\"/login\"><label>Token <input type=\"password\" name=\"token\" size=\"80\" autocomplete=\"off\"></label> \
         <button type=\"submit\">sign in</button></form>\
         <p class=\"muted\">A tenant token shows its own account; an operator or finance token shows every account. \
         Tokens come from <code>gpuledger token add</code>.</p></section></main></body></html>\n"
    )
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
        assert_eq!(duration(Some(42.0)), "42 s");
        assert_eq!(duration(Some(5400.0)), "1.5 h");
        assert_eq!(duration(Some(3.0 * 86_400.0)), "3.0 d");
        assert_eq!(duration(None), "–");
    }

    #[test]
    fn an_indicator_row_says_whether_its_target_is_met() {
        let row = indicator_row(
            "mean_mfu",
            "MFU",
            Some(0.42),
            "42.0%".into(),
            Some((0.5, true, "> 50%".into())),
        );
        assert!(
            row.contains("data-value=\"0.42\"") && row.contains("class=\"missed\""),
            "{row}"
        );
        let row = indicator_row(
            "p95_queue_wait_s",
            "wait",
            Some(60.0),
            "1 min".into(),
            Some((14_400.0, false, "< 4 h".into())),
        );
        assert!(row.contains("class=\"met\""), "{row}");
    }
}
