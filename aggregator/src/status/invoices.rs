//! The invoices page at `/invoices`: every month's invoice of each account the reader may see
//! (a tenant its own, finance and operators every account), its revisions, and its HTML, CSV
//! and JSON at `/invoices/{month}/{account}`. The files are those `gpuledger invoice` writes
//! under the state directory ([`gpuledger_billing::invoices`] owns their layout).

use maud::html;
use rust_decimal::Decimal;
use serde::Serialize;

use gpuledger_billing::invoices::InvoiceOnFile;

use super::page::{shell, Nav};

/// One account's invoice of one month, as listed (also `GET /api/v1/invoices`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InvoiceSummary {
    pub month: String,
    pub account: String,
    pub invoice_id: String,
    /// The latest revision, and every revision on file.
    pub revision: u32,
    pub revisions: Vec<u32>,
    pub billing_model: Option<String>,
    pub currency: String,
    pub total: Decimal,
    pub gpu_seconds: i64,
    /// Where its HTML is; `?format=csv` and `?format=json` give the others.
    pub url: String,
}

impl From<&InvoiceOnFile> for InvoiceSummary {
    fn from(f: &InvoiceOnFile) -> Self {
        let inv = &f.latest;
        InvoiceSummary {
            month: inv.period.clone(),
            account: inv.account.to_string(),
            invoice_id: inv.invoice_id.clone(),
            revision: inv.revision,
            revisions: f.revisions.clone(),
            billing_model: inv.billing_model.map(|m| m.to_string()),
            currency: inv.currency.code().to_owned(),
            total: inv.total(),
            gpu_seconds: inv.gpu_seconds(),
            url: invoice_url(&inv.period, inv.account.as_str()),
        }
    }
}

/// Where one account's invoice of `month` is served.
pub fn invoice_url(month: &str, account: &str) -> String {
    format!("/invoices/{month}/{account}")
}

/// The list page: `invoices`, the latest month first; `account` the filter applied, if any.
pub fn invoices_page(
    cluster_name: &str,
    invoices: &[InvoiceSummary],
    account: Option<&str>,
    nav: Nav<'_>,
) -> String {
    let title = format!("gpuledger · {cluster_name} · invoices");
    let links = html! { a href="/" { "status" } };
    let main = html! {
        section #invoices {
            h2 {
                "Invoices"
                @if let Some(a) = account { " of " (a) }
            }
            table {
                tr {
                    th { "month" } th { "account" } th { "invoice" } th { "revision" } th { "billing model" }
                    th { "GPU-hours" } th { "total" } th { "currency" } th { "files" }
                }
                @if invoices.is_empty() {
                    tr { td colspan="9" class="muted" { "no invoice yet: " code { "gpuledger invoice --month YYYY-MM" } " writes them" } }
                }
                @for i in invoices {
                    tr data-invoice=(i.invoice_id) data-account=(i.account) data-month=(i.month) {
                        td { (i.month) }
                        td { (i.account) }
                        td { a href=(i.url) { (i.invoice_id) } }
                        td {
                            @for (k, r) in i.revisions.iter().enumerate() {
                                @if k > 0 { " " }
                                a href=(format!("{}?revision={r}", i.url)) { "r" (r) }
                            }
                        }
                        td { (i.billing_model.as_deref().unwrap_or("none (platform overhead)")) }
                        td data-field="gpu_hours" data-value=(i.gpu_seconds as f64 / 3600.0) { (format!("{:.2}", i.gpu_seconds as f64 / 3600.0)) }
                        td data-field="total" data-value=(i.total) { (i.total) }
                        td { (i.currency) }
                        td {
                            a href=(format!("{}?format=csv", i.url)) { "CSV" } " "
                            a href=(format!("{}?format=json", i.url)) { "JSON" }
                        }
                    }
                }
            }
            p.muted { "Each invoice is its latest revision; a correction is a new revision, and the earlier ones stay readable. The month's FOCUS export is written beside them by " code { "gpuledger invoice" } "." }
        }
    };
    shell(&title, nav, links, None, main)
}
