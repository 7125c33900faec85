//! The status page and the sign-in page as HTML, through maud: every value that came from
//! outside (account, project, job, node and partition names from pods, Slurm and projects) is
//! escaped by the template. A figure shown against a target never reads as the other side of
//! it: "60.0% ≥ 60% off target" cannot happen ([`shown_against`]).

use maud::{html, Markup, DOCTYPE};
use rust_decimal::prelude::ToPrimitive;

use super::{target, AccountRow, StatusView};
use crate::query::{AccountIndicators, FinishedJob};
use gpuledger_charts::{self as svg, Series};
use gpuledger_model::time::UnixMillis;

const STYLE: &str = "body{font-family:sans-serif;margin:0;background:#f4f5f7;color:#222}\
header{background:#1f2d3d;color:white;padding:10px 18px;display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}\
header h1{font-size:18px;margin:0} header a{color:#cde} header form{margin-left:auto}\
main{padding:12px 18px} section{background:white;border:1px solid #ddd;border-radius:4px;padding:10px 14px;margin-bottom:12px}\
h2{font-size:15px;margin:0 0 8px} table{border-collapse:collapse;font-size:13px} th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:left}\
td.num,td[data-value]{text-align:right;font-variant-numeric:tabular-nums} .met{color:#1a7f37} .missed{color:#c62828;font-weight:bold} .none{color:#888}\
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:10px} svg{max-width:100%;height:auto}\
.muted{color:#777;font-size:12px} .header-note{color:#cde;font-size:12px}";

/// What the header offers the reader.
#[derive(Clone, Copy, Debug, Default)]
pub struct Nav<'a> {
    /// Who is signed in (`None`: nobody, or authentication is off).
    pub signed_in: Option<&'a str>,
    /// Whether the reader may see invoices (a link to `/invoices`).
    pub invoices: bool,
}

/// What a status page's `<body>` says of itself, for scripts and tests reading it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyData<'a> {
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    scope: &'a str,
}

/// A whole page: the header (title, `links`, who is signed in) and `main`.
pub(crate) fn shell(
    title: &str,
    nav: Nav<'_>,
    links: Markup,
    data: Option<BodyData<'_>>,
    main: Markup,
) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (STYLE) }
            }
            body data-from-ms=[data.map(|d| d.from_ms)] data-to-ms=[data.map(|d| d.to_ms)] data-scope=[data.map(|d| d.scope)] {
                header {
                    h1 { (title) }
                    (links)
                    @if nav.invoices { a href="/invoices" { "invoices" } }
                    @if let Some(who) = nav.signed_in {
                        form method="post" action="/logout" {
                            span { (who) } " "
                            button type="submit" { "sign out" }
                        }
                    }
                }
                main { (main) }
            }
        }
    }
    .into_string()
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{:.1}%", v * 100.0))
}

fn pct_of_100(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.1}%"))
}

/// How a kind of figure is shown: the exact value times `factor`, to `decimals`, then `suffix`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Unit {
    factor: f64,
    decimals: i32,
    suffix: &'static str,
}

const PERCENT_OF_RATIO: Unit = Unit {
    factor: 100.0,
    decimals: 1,
    suffix: "%",
};
const PERCENT: Unit = Unit {
    factor: 1.0,
    decimals: 1,
    suffix: "%",
};

/// The unit a duration of `s` seconds reads best in: `42 s`, `12 min`, `3.5 h`, `2.1 d`.
fn duration_unit(s: f64) -> Unit {
    let (factor, decimals, suffix) = if s < 60.0 {
        (1.0, 0, " s")
    } else if s < 3600.0 {
        (1.0 / 60.0, 0, " min")
    } else if s < 86_400.0 * 2.0 {
        (1.0 / 3600.0, 1, " h")
    } else {
        (1.0 / 86_400.0, 1, " d")
    };
    Unit {
        factor,
        decimals,
        suffix,
    }
}

/// A duration for people: `42 s`, `12 min`, `3.5 h`, `2.1 d`.
pub fn duration(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |s| shown_against(s, duration_unit(s), None))
}

/// A target an indicator is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Target {
    value: f64,
    higher_is_better: bool,
    label: &'static str,
}

impl Target {
    fn met_by(&self, v: f64) -> bool {
        if self.higher_is_better {
            v >= self.value
        } else {
            v <= self.value
        }
    }
}

/// `value` as `unit` shows it. Against a target, plain rounding can put the shown figure on
/// the target's other side (0.5996 reads "60.0%" against "≥ 60%", yet misses it): the shown
/// figure is then moved by one last digit to the side the exact value is on.
fn shown_against(value: f64, unit: Unit, target: Option<Target>) -> String {
    let scale = 10f64.powi(unit.decimals);
    let mut steps = (value * unit.factor * scale).round();
    if let Some(t) = target {
        let shown = |steps: f64| steps / scale / unit.factor;
        let toward_better = if t.higher_is_better { 1.0 } else { -1.0 };
        match (t.met_by(value), t.met_by(shown(steps))) {
            (false, true) => steps -= toward_better,
            (true, false) => steps += toward_better,
            _ => {}
        }
    }
    format!(
        "{:.*}{}",
        usize::try_from(unit.decimals).unwrap_or(0),
        steps / scale,
        unit.suffix
    )
}

fn time(ms: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// A `<td>` with the exact value and its text.
fn cell(field: &str, value: Option<f64>, text: &str) -> Markup {
    html! { td data-field=(field) data-value=[value] { (text) } }
}

/// One indicator against its target, or shown for reference.
fn indicator_row(
    key: &str,
    name: &str,
    value: Option<f64>,
    unit: Unit,
    target: Option<Target>,
) -> Markup {
    let text = value.map_or_else(|| "–".into(), |v| shown_against(v, unit, target));
    let (target_text, class, verdict) = match (target, value) {
        (Some(t), Some(v)) if t.met_by(v) => (t.label, "met", "on target"),
        (Some(t), Some(_)) => (t.label, "missed", "off target"),
        (Some(t), None) => (t.label, "none", "not measured"),
        (None, _) => ("reference", "none", ""),
    };
    html! {
        tr data-indicator=(key) {
            td { (name) }
            td.num data-value=[value] { (text) }
            td { (target_text) }
            td class=(class) { (verdict) }
        }
    }
}

fn indicators_table(i: &AccountIndicators, utilization: Option<(f64, &str)>) -> Markup {
    let duration_of = |v: Option<f64>| duration_unit(v.unwrap_or(0.0));
    html! {
        table.indicators {
            tr { th { "indicator" } th { "value" } th { "target" } th {} }
            @if let Some((u, name)) = utilization {
                (indicator_row("utilization", name, Some(u), PERCENT_OF_RATIO, Some(Target { value: target::CLUSTER_UTILIZATION, higher_is_better: true, label: "≥ 85%" })))
            }
            (indicator_row("mean_mfu", "Mean MFU (GPU-seconds weighted)", i.mean_mfu, PERCENT_OF_RATIO, Some(Target { value: target::JOB_MFU, higher_is_better: true, label: "≥ 50%" })))
            (indicator_row("mean_gpu_util_pct", "GPU utilization", i.mean_gpu_util_pct, PERCENT, Some(Target { value: target::GPU_UTIL_PCT, higher_is_better: true, label: "≥ 70%" })))
            (indicator_row("mean_mem_util", "Memory utilization", i.mean_mem_util, PERCENT_OF_RATIO, Some(Target { value: target::MEM_UTIL, higher_is_better: true, label: "≥ 60%" })))
            (indicator_row("p95_queue_wait_s", "Queue wait p95", i.p95_queue_wait_s, duration_of(i.p95_queue_wait_s), Some(Target { value: target::QUEUE_WAIT_S, higher_is_better: false, label: "≤ 4 h" })))
            (indicator_row("max_queue_wait_s", "Queue wait max", i.max_queue_wait_s, duration_of(i.max_queue_wait_s), None))
            (indicator_row("success_rate", "Job success rate", i.success_rate, PERCENT_OF_RATIO, Some(Target { value: target::SUCCESS_RATE, higher_is_better: true, label: "≥ 95%" })))
            (indicator_row("jobs", "Jobs submitted", Some(i.jobs as f64), Unit { factor: 1.0, decimals: 0, suffix: "" }, None))
        }
    }
}

/// Coverage gaps (jobs' GPUs no exporter measured) and flagged GPU-hours (measured, billed to
/// nobody), where there are any.
fn ledger_section(view: &StatusView) -> Markup {
    html! {
        @if !view.coverage_gaps.is_empty() || !view.flagged.is_empty() {
            section #ledger {
                h2 { "Ledger: coverage gaps and flagged telemetry" }
                @if !view.coverage_gaps.is_empty() {
                    table #coverage-gaps {
                        tr { th { "account" } th { "job" } th { "node" } th { "GPU-hours held, not measured" } }
                        @for g in &view.coverage_gaps {
                            tr {
                                td { (g.account) } td { (g.job_id) } td { (g.node) }
                                (cell("gap_gpu_hours", Some(g.gpu_hours), &format!("{:.2}", g.gpu_hours)))
                            }
                        }
                    }
                }
                @if !view.flagged.is_empty() {
                    table #flagged {
                        tr { th { "node" } th { "reason" } th { "GPU-hours billed to nobody" } }
                        @for f in &view.flagged {
                            tr {
                                td { (f.node) } td { (f.reason) }
                                (cell("flagged_gpu_hours", Some(f.gpu_hours), &format!("{:.2}", f.gpu_hours)))
                            }
                        }
                    }
                    p.muted { "Flagged: a node reported a job on a GPU the job did not hold then (not_held), a job no event names (unknown_job), or another account than the job's (account_mismatch)." }
                }
            }
        }
    }
}

fn indicators_section(view: &StatusView) -> Markup {
    let running = || view.queue.iter().filter(|q| q.state == "running");
    html! {
        @if let Some(c) = &view.cluster {
            section #indicators {
                h2 { "Cluster indicators against their targets" }
                p.muted {
                    (c.total_gpus) " GPUs; " (running().count()) " jobs running on "
                    (running().map(|q| q.gpus).sum::<u32>()) " GPUs, "
                    (view.queue.iter().filter(|q| q.state == "pending").count()) " waiting now; "
                    (format!("{:.1}", c.gpu_hours)) " GPU-hours, " (c.cost) " " (view.currency)
                    " at list prices in the window."
                }
                (indicators_table(&c.indicators, c.utilization.map(|u| (u, "Cluster utilization (GPUs working for a job)"))))
            }
        } @else if let Some(a) = view.accounts.first() {
            section #indicators {
                h2 { (a.indicators.account) " indicators against their targets" }
                (indicators_table(&a.indicators, None))
            }
        }
    }
}

fn accounts_section(view: &StatusView, invoices: bool) -> Markup {
    html! {
        section #accounts {
            h2 { "Usage and cost per tenant" }
            table {
                tr {
                    th { "account" } th { "name" } th { "jobs" } th { "GPU-hours" } th { "gap GPU-hours" }
                    th { "share" } th { "GPUs now" } th { "entitled GPUs" } th { "mean MFU" } th { "GPU util" }
                    th { "mem util" } th { "wait p95" } th { "success" } th { "cost (" (view.currency) ")" }
                    @if invoices { th { "invoices" } }
                }
                @for a in &view.accounts {
                    @let i = &a.indicators;
                    tr data-account=(i.account) {
                        td { (i.account) }
                        td { (a.name) }
                        (cell("jobs", Some(i.jobs as f64), &i.jobs.to_string()))
                        (cell("gpu_hours", Some(a.gpu_hours), &format!("{:.1}", a.gpu_hours)))
                        (cell("gap_gpu_hours", Some(a.gap_gpu_hours), &format!("{:.1}", a.gap_gpu_hours)))
                        (cell("share", a.share, &pct(a.share)))
                        (cell("gpus_now", Some(f64::from(a.gpus_now)), &a.gpus_now.to_string()))
                        (cell("entitled_gpus", Some(a.entitled_gpus), &format!("{:.1}", a.entitled_gpus)))
                        (cell("mean_mfu", i.mean_mfu, &pct(i.mean_mfu)))
                        (cell("mean_gpu_util_pct", i.mean_gpu_util_pct, &pct_of_100(i.mean_gpu_util_pct)))
                        (cell("mean_mem_util", i.mean_mem_util, &pct(i.mean_mem_util)))
                        (cell("p95_queue_wait_s", i.p95_queue_wait_s, &duration(i.p95_queue_wait_s)))
                        (cell("success_rate", i.success_rate, &pct(i.success_rate)))
                        (cell("cost", a.cost.to_f64(), &a.cost.to_string()))
                        @if invoices {
                            td { a href=(format!("/invoices?account={}", i.account)) { "invoices" } }
                        }
                    }
                }
            }
            p.muted { "GPU-hours are what each tenant's GPUs measured while its jobs held them; gap GPU-hours are what its jobs held that no exporter measured. Cost is both at the cluster's list prices; the monthly invoice (coverage, time-of-use, MFU weighting, reservations, storage) is what is billed." }
        }
    }
}

fn charts_section(view: &StatusView) -> Markup {
    let per_account = |f: &dyn Fn(&AccountRow) -> f64| -> Vec<(String, f64)> {
        view.accounts
            .iter()
            .map(|a| (a.indicators.account.clone(), f(a)))
            .collect()
    };
    let finite_or_dash = |v: f64, text: String| if v.is_finite() { text } else { "–".into() };
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
    html! {
        section #charts {
            h2 { "Charts" }
            div.charts {
                @if view.cluster.is_some() {
                    (svg::pie_chart("GPU share (GPU-hours in the window)", &per_account(&|a| a.gpu_hours)))
                }
                (svg::bars_with_target(
                    "Mean MFU per tenant", "MFU",
                    &per_account(&|a| a.indicators.mean_mfu.unwrap_or(f64::NAN)),
                    Some(1.0), Some((target::JOB_MFU, "target 50%")),
                    |v| finite_or_dash(v, format!("{:.0}%", v * 100.0)),
                ))
                (svg::stacked_bars("GPU-hours per day", "GPU-hours", &columns, &series))
                (svg::bars_with_target(
                    "Queue wait p95 per tenant (hours)", "hours",
                    &per_account(&|a| a.indicators.p95_queue_wait_s.map_or(f64::NAN, |s| s / 3600.0)),
                    None, Some((target::QUEUE_WAIT_S / 3600.0, "target 4 h")),
                    |v| finite_or_dash(v, format!("{v:.1}")),
                ))
            }
        }
    }
}

fn queue_section(view: &StatusView) -> Markup {
    html! {
        section #queue {
            h2 { "Queue" }
            table {
                tr {
                    th { "job" } th { "account" } th { "project" } th { "partition" } th { "state" }
                    th { "GPUs" } th { "submitted" } th { "waiting / running for" } th { "MFU so far" }
                }
                @if view.queue.is_empty() {
                    tr { td colspan="9" class="muted" { "no job waiting or running" } }
                }
                @for q in &view.queue {
                    tr data-job=(q.job_id) data-state=(q.state) {
                        td { (q.job_id) }
                        td { (q.account) }
                        td { (q.project.as_deref().unwrap_or("")) }
                        td { (q.partition.as_deref().unwrap_or("")) }
                        td { (q.state) }
                        (cell("gpus", Some(f64::from(q.gpus)), &q.gpus.to_string()))
                        td { (q.submitted_ms.map(time).unwrap_or_default()) }
                        (cell("for_s", Some(q.for_s as f64), &duration(Some(q.for_s as f64))))
                        (cell("mfu", q.mfu, &q.mfu.map_or_else(|| "–".into(), |m| format!("{:.1}% ({})", m * 100.0, q.mfu_source.unwrap_or("")))))
                    }
                }
            }
        }
    }
}

fn seconds_between(from: Option<UnixMillis>, to: Option<UnixMillis>) -> Option<f64> {
    Some((to? - from?).max(0) as f64 / 1000.0)
}

fn finished_row(j: &FinishedJob) -> Markup {
    let waited = seconds_between(j.submitted_ms, j.started_ms);
    let ran = seconds_between(j.started_ms, Some(j.finished_ms));
    let gpu_hours = j.gpu_seconds as f64 / 3600.0;
    let outcome = j.outcome.as_deref().unwrap_or("unknown");
    html! {
        tr data-finished-job=(j.job_id) data-outcome=(outcome) {
            td { (j.job_id) }
            td { (j.account) }
            td { (j.project.as_deref().unwrap_or("")) }
            td { (j.partition.as_deref().unwrap_or("")) }
            td class=(if outcome == "completed" { "met" } else { "missed" }) { (outcome) }
            (cell("gpus", Some(f64::from(j.gpus)), &j.gpus.to_string()))
            td { (time(j.finished_ms)) }
            (cell("waited_s", waited, &duration(waited)))
            (cell("ran_s", ran, &duration(ran)))
            (cell("gpu_hours", Some(gpu_hours), &format!("{gpu_hours:.2}")))
        }
    }
}

fn finished_section(view: &StatusView) -> Markup {
    html! {
        section #finished {
            h2 { "Finished in the window" }
            table {
                tr {
                    th { "job" } th { "account" } th { "project" } th { "partition" } th { "outcome" }
                    th { "GPUs" } th { "finished" } th { "waited" } th { "ran" } th { "GPU-hours measured" }
                }
                @if view.finished.is_empty() {
                    tr { td colspan="10" class="muted" { "no job finished in the window" } }
                }
                @for j in &view.finished { (finished_row(j)) }
            }
            p.muted {
                "The latest " (super::FINISHED_ROWS) " at most, from the stored job events (flushed every minute). "
                "Every job's events and usage: " code { "GET /api/v1/jobs/{id}" } "."
            }
        }
    }
}

/// The page for `view`.
pub fn render(view: &StatusView, nav: Nav<'_>) -> String {
    let windows = [
        ("mtd", "month to date"),
        ("24h", "24 h"),
        ("7d", "7 days"),
        ("30d", "30 days"),
    ];
    let links = html! {
        @for (name, label) in windows {
            a href=(format!("/?window={name}")) aria-current=[(view.window.name == name).then_some("page")] { (label) }
        }
        span.header-note { (time(view.window.from_ms)) " to " (time(view.window.to_ms)) }
    };
    let data = BodyData {
        from_ms: view.window.from_ms,
        to_ms: view.window.to_ms,
        scope: &view.scope,
    };
    let main = html! {
        (indicators_section(view))
        (accounts_section(view, nav.invoices))
        (ledger_section(view))
        (charts_section(view))
        (queue_section(view))
        (finished_section(view))
        p.muted {
            "Generated " (time(view.generated_ms)) ". Indicators read the stored data (flushed every minute); the queue is live. JSON: "
            a href=(format!("/api/v1/status?from={}&to={}", view.window.from_ms, view.window.to_ms)) { "/api/v1/status" } "."
        }
    };
    let title = format!("gpuledger · {}", view.cluster_name);
    shell(&title, nav, links, Some(data), main)
}

/// The sign-in page: a token pasted once becomes an HttpOnly cookie for this page.
pub fn login_page(message: Option<&str>) -> String {
    let main = html! {
        section {
            h2 { "Sign in" }
            @if let Some(m) = message { p.missed { (m) } }
            form method="post" action="/login" {
                label { "Token " input type="password" name="token" size="80" autocomplete="off"; }
                " "
                button type="submit" { "sign in" }
            }
            p.muted {
                "A tenant token shows its own account and its invoices; an operator or finance token shows every account. Tokens come from "
                code { "gpuledger token add" } "."
            }
        }
    };
    shell("gpuledger", Nav::default(), html! {}, None, main)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: Target = Target {
        value: target::MEM_UTIL,
        higher_is_better: true,
        label: "≥ 60%",
    };
    const WAIT: Target = Target {
        value: target::QUEUE_WAIT_S,
        higher_is_better: false,
        label: "≤ 4 h",
    };

    #[test]
    fn durations_read_in_their_best_unit() {
        assert_eq!(duration(Some(42.0)), "42 s");
        assert_eq!(duration(Some(5400.0)), "1.5 h");
        assert_eq!(duration(Some(3.0 * 86_400.0)), "3.0 d");
        assert_eq!(duration(None), "–");
    }

    #[test]
    fn a_figure_never_reads_as_the_other_side_of_its_target() {
        // Plain rounding would show 60.0% for a value that misses 60%.
        assert_eq!(shown_against(0.5996, PERCENT_OF_RATIO, Some(MEM)), "59.9%");
        assert_eq!(shown_against(0.6, PERCENT_OF_RATIO, Some(MEM)), "60.0%");
        assert_eq!(shown_against(0.6004, PERCENT_OF_RATIO, Some(MEM)), "60.0%");
        assert_eq!(shown_against(0.5996, PERCENT_OF_RATIO, None), "60.0%");
        // A wait a second past 4 h misses "≤ 4 h": it does not read "4.0 h".
        let over = target::QUEUE_WAIT_S + 1.0;
        assert_eq!(
            shown_against(over, duration_unit(over), Some(WAIT)),
            "4.1 h"
        );
        assert_eq!(
            shown_against(
                target::QUEUE_WAIT_S,
                duration_unit(target::QUEUE_WAIT_S),
                Some(WAIT)
            ),
            "4.0 h"
        );
        for v in [
            0.0, 0.123_45, 0.599_49, 0.599_5, 0.599_99, 0.600_01, 0.75, 1.0,
        ] {
            let text = shown_against(v, PERCENT_OF_RATIO, Some(MEM));
            let shown: f64 = text.trim_end_matches('%').parse().unwrap();
            assert_eq!(shown >= 60.0, MEM.met_by(v), "{v} reads {text}");
            assert!((shown - v * 100.0).abs() <= 0.1 + 1e-9, "{v} reads {text}");
        }
    }

    #[test]
    fn an_indicator_row_says_whether_its_target_is_met() {
        let row = indicator_row(
            "mean_mfu",
            "MFU",
            Some(0.42),
            PERCENT_OF_RATIO,
            Some(Target {
                value: 0.5,
                higher_is_better: true,
                label: "≥ 50%",
            }),
        )
        .into_string();
        assert!(
            row.contains("data-value=\"0.42\"")
                && row.contains("class=\"missed\"")
                && row.contains(">42.0%<"),
            "{row}"
        );
        let row = indicator_row(
            "mean_mem_util",
            "mem",
            Some(0.5996),
            PERCENT_OF_RATIO,
            Some(MEM),
        )
        .into_string();
        assert!(
            row.contains(">59.9%<") && row.contains("off target"),
            "{row}"
        );
        let row = indicator_row(
            "p95_queue_wait_s",
            "wait",
            Some(60.0),
            duration_unit(60.0),
            Some(WAIT),
        )
        .into_string();
        assert!(
            row.contains("class=\"met\"") && row.contains(">1 min<"),
            "{row}"
        );
    }
}
