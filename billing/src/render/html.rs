//! The printable HTML invoice, through maud: every name in it (account, project, job, node,
//! reason, price book) is escaped by the template, whoever chose it.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use maud::{html, Markup, DOCTYPE};
use rust_decimal::Decimal;

use super::{charge_label, opt};
use crate::engine::Invoice;

const STYLE: &str = "body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ccc; padding: 4px 8px; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.correction td { font-style: italic; color: #8a4b00; }
tfoot td { font-weight: bold; border-top: 2px solid #222; }
@media print { body { margin: 0; } }";

/// GPU-seconds as GPU-hours, to two decimals.
fn hours(secs: i64) -> String {
    (Decimal::from(secs) / Decimal::from(3600))
        .round_dp(2)
        .normalize()
        .to_string()
}

/// GPU-hours per day of the period as an inline SVG bar chart.
fn usage_chart(inv: &Invoice) -> Markup {
    let first = chrono::DateTime::from_timestamp(inv.period_start, 0)
        .unwrap_or_default()
        .date_naive();
    let last = chrono::DateTime::from_timestamp(inv.period_end - 1, 0)
        .unwrap_or_default()
        .date_naive();
    let days: Vec<NaiveDate> = first.iter_days().take_while(|d| *d <= last).collect();
    let by_day: BTreeMap<NaiveDate, i64> = inv.daily_gpu_seconds.iter().copied().collect();
    let max = by_day.values().copied().max().unwrap_or(0).max(1);
    let (w, h, pad) = (620.0, 140.0, 20.0);
    let bar = (w - 2.0 * pad) / days.len().max(1) as f64;
    let c = |v: f64| format!("{v:.1}");
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(w) height=(h) role="img" aria-label="GPU-hours per day" {
            @for (i, d) in days.iter().enumerate() {
                @let secs = by_day.get(d).copied().unwrap_or(0);
                @let bh = (h - 2.0 * pad) * secs as f64 / max as f64;
                rect x=(c(pad + i as f64 * bar + 1.0)) y=(c(h - pad - bh)) width=(c((bar - 2.0).max(1.0))) height=(c(bh)) fill="#3b6ea5" {
                    title { (d) ": " (hours(secs)) " GPU-hours" }
                }
            }
            text x=(pad) y="14" font-size="11" { "peak " (hours(max)) " GPU-hours/day" }
            text x=(pad) y=(h - 4.0) font-size="11" { (first) }
            text x=(w - pad) y=(h - 4.0) font-size="11" text-anchor="end" { (last) }
        }
    }
}

/// The invoice's notes: coverage gaps per job and node, flagged GPU-seconds per node and
/// reason; nothing where there are none.
fn notes(inv: &Invoice) -> Markup {
    html! {
        @if !inv.notes.coverage_gaps.is_empty() {
            h2 { "Coverage gaps" }
            p { "GPUs a job held, by its events, that no exporter measured (node down, exporter missing), and how much of that is billed under the price book's coverage." }
            table #coverage-gaps {
                thead { tr { th { "job" } th { "node" } th.n { "GPU-hours held, not measured" } th.n { "of which billed" } } }
                tbody {
                    @for g in &inv.notes.coverage_gaps {
                        tr { td { (opt(&g.job_id)) } td { (g.node.as_str()) } td.n { (hours(g.gpu_seconds)) } td.n { (hours(g.billed_gpu_seconds)) } }
                    }
                }
            }
        }
        @if !inv.notes.flagged.is_empty() {
            h2 { "Flagged telemetry" }
            p { "GPU-seconds a node measured for a job that did not hold that GPU then (not_held), a job no event names (unknown_job) or another account than the job's (account_mismatch): stored, and billed to nobody." }
            table #flagged {
                thead { tr { th { "node" } th { "reason" } th.n { "GPU-hours" } } }
                tbody {
                    @for f in &inv.notes.flagged {
                        tr { td { (f.node.as_str()) } td { (f.reason) } td.n { (hours(f.gpu_seconds)) } }
                    }
                }
            }
        }
    }
}

/// A printable HTML invoice with a usage chart.
pub fn invoice_html(inv: &Invoice) -> String {
    let model = inv
        .billing_model
        .map(|m| m.to_string())
        .unwrap_or_else(|| "none (platform overhead)".into());
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (inv.invoice_id) }
                style { (STYLE) }
            }
            body {
                h1 { "Invoice " (inv.invoice_id) }
                p {
                    "Account " strong { (inv.account.as_str()) }
                    " · period " (inv.period) " (UTC) · billing model " (model)
                    " · revision " (inv.revision)
                }
                h2 { "GPU-hours per day" }
                (usage_chart(inv))
                h2 { "Charges" }
                table {
                    thead {
                        tr {
                            th { "project" } th { "charge" } th { "GPU model" } th { "band" }
                            th.n { "quantity" } th { "unit" } th.n { "unit price" }
                            th.n { "amount (" (inv.currency) ")" } th { "price book" }
                        }
                    }
                    tbody {
                        @for l in &inv.lines {
                            tr.correction[l.correction] {
                                td { (opt(&l.key.project)) }
                                td { (charge_label(l)) }
                                td { (opt(&l.key.gpu_model)) }
                                td { (l.key.band) }
                                td.n { (l.quantity) }
                                td { (l.unit) }
                                td.n { (l.unit_price) }
                                td.n { (l.amount) }
                                td { (l.key.price_book_version) }
                            }
                        }
                    }
                    tfoot {
                        tr { td colspan="7" { "Total" } td.n #total { (inv.total()) } td { (inv.currency) } }
                    }
                }
                p {
                    "Each line is rounded once, half to even, to the currency's minor unit; the total is the sum of the lines. Usage is measured in GPU-seconds; "
                    (hours(inv.gpu_seconds())) " GPU-hours of compute are billed here."
                }
                (notes(inv))
            }
        }
    }
    .into_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{FlagNote, InvoiceNotes};
    use gpuledger_model::{AccountId, NodeId};

    #[test]
    fn text_from_outside_is_escaped() {
        let hostile = "<img src=x onerror=alert(1)>\"&";
        let inv = Invoice {
            invoice_id: "2026-06-team-a-r1".into(),
            period: "2026-06".into(),
            period_start: 1_780_272_000,
            period_end: 1_782_864_000,
            account: AccountId::new("team-a").unwrap(),
            currency: "USD".parse().unwrap(),
            billing_model: None,
            revision: 1,
            lines: Vec::new(),
            daily_gpu_seconds: Vec::new(),
            notes: InvoiceNotes {
                coverage_gaps: Vec::new(),
                flagged: vec![FlagNote {
                    node: NodeId::new("gpu001").unwrap(),
                    reason: hostile.into(),
                    gpu_seconds: 7200,
                }],
            },
        };
        let page = invoice_html(&inv);
        assert!(!page.contains("<img"), "{page}");
        assert!(
            page.contains(
                "<td>&lt;img src=x onerror=alert(1)&gt;&quot;&amp;</td><td class=\"n\">2</td>"
            ),
            "{page}"
        );
    }
}
