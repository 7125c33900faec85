//! The invoice files: CSV (a line per project x charge type x GPU model x band), JSON (the
//! canonical record, read back to make the next revision), a printable HTML page with a usage
//! chart, the FinOps FOCUS 1.2 export for finance, and the comparison of billing models.
//! Everything is a pure function of the invoices: the same invoices give the same bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rust_decimal::Decimal;

use crate::engine::{mean_factor, quantity, ChargeType, Invoice, InvoiceLine, JobPart};
use crate::pricebook::BillingModel;

mod html;
pub use html::invoice_html;

const CSV_HEADER: &str = "invoice_id,period,account,billing_model,line_revision,correction,project,charge_type,gpu_model,band,reservation,jobs,gpu_seconds,byte_seconds,quantity,unit,mfu_factor,list_unit_price,unit_price,amount,currency,price_book_version";

/// Quotes a CSV field when it needs it (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

pub(crate) fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_default()
}

/// The invoice as CSV: its lines, then a total line.
pub fn invoice_csv(inv: &Invoice) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for l in &inv.lines {
        let fields = [
            inv.invoice_id.clone(),
            inv.period.clone(),
            inv.account.to_string(),
            opt(&inv.billing_model),
            l.revision.to_string(),
            l.correction.to_string(),
            opt(&l.key.project),
            l.key.charge_type.as_str().to_owned(),
            opt(&l.key.gpu_model),
            l.key.band.clone(),
            opt(&l.key.reservation),
            l.jobs
                .iter()
                .filter(|j| j.job_id.is_some())
                .count()
                .to_string(),
            l.gpu_seconds.to_string(),
            l.byte_seconds.to_string(),
            l.quantity.to_string(),
            l.unit.clone(),
            opt(&l.mfu_factor),
            l.list_unit_price.to_string(),
            l.unit_price.to_string(),
            l.amount.to_string(),
            inv.currency.to_string(),
            l.key.price_book_version.clone(),
        ];
        let row: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        let _ = writeln!(out, "{}", row.join(","));
    }
    let _ = writeln!(
        out,
        "{},{},{},{},,,,total,,,,,{},,,,,,,{},{},",
        inv.invoice_id,
        inv.period,
        inv.account,
        opt(&inv.billing_model),
        inv.gpu_seconds(),
        inv.total(),
        inv.currency
    );
    out
}

/// The canonical JSON record of an invoice.
pub fn invoice_json(inv: &Invoice) -> String {
    let mut s = serde_json::to_string_pretty(inv).expect("invoices serialise");
    s.push('\n');
    s
}

/// Reads back an invoice written by [`invoice_json`].
pub fn invoice_from_json(text: &str) -> serde_json::Result<Invoice> {
    serde_json::from_str(text)
}

pub(crate) fn charge_label(l: &InvoiceLine) -> String {
    let mut s = l.key.charge_type.as_str().to_owned();
    if let Some(r) = &l.key.reservation {
        s.push_str(&format!(" ({r})"));
    }
    if let Some(f) = l.mfu_factor {
        s.push_str(&format!(" x MFU {f}"));
    }
    if l.correction {
        s.push_str(&format!(" correction r{}", l.revision));
    }
    s
}

/// The FOCUS 1.2 mandatory columns, in the spec's (alphabetical) order.
pub const FOCUS_MANDATORY: [&str; 21] = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
];

/// Conditional FOCUS columns that apply to GPU usage, then gpuledger's `x_` columns.
pub const FOCUS_OPTIONAL: [&str; 22] = [
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeFrequency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedUnitPrice",
    "InvoiceId",
    "ListUnitPrice",
    "PricingCategory",
    "ResourceId",
    "ResourceType",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "x_BillingModel",
    "x_GpuModel",
    "x_GpuSeconds",
    "x_JobId",
    "x_Mfu",
    "x_PriceBookVersion",
    "x_TimeOfUseBand",
];

fn iso(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// One FOCUS CSV for the month: a row per job part of every line (a row per correction line),
/// `PricingQuantity x ListUnitPrice = ListCost` and `x ContractedUnitPrice = ContractedCost`
/// exactly on every row; `BilledCost` is the rounded amount, and sums to the invoices' totals.
pub fn focus_csv(invoices: &[Invoice], issuer: &str) -> String {
    let mut out = String::new();
    let header: Vec<&str> = FOCUS_MANDATORY
        .iter()
        .chain(FOCUS_OPTIONAL.iter())
        .copied()
        .collect();
    let _ = writeln!(out, "{}", header.join(","));
    for inv in invoices {
        for l in &inv.lines {
            let parts: Vec<JobPart> = if l.jobs.is_empty() {
                vec![JobPart {
                    job_id: None,
                    gpu_seconds: l.gpu_seconds,
                    weighted: l.weighted,
                    amount: l.amount,
                }]
            } else {
                l.jobs.clone()
            };
            for part in &parts {
                let row = focus_row(inv, l, part, issuer, &header);
                let _ = writeln!(out, "{}", row.join(","));
            }
        }
    }
    out
}

fn focus_row(
    inv: &Invoice,
    l: &InvoiceLine,
    part: &JobPart,
    issuer: &str,
    header: &[&str],
) -> Vec<String> {
    let ct = l.key.charge_type;
    let qty = quantity(part.weighted, ct);
    let storage = ct == ChargeType::Storage;
    let consumed = if storage {
        qty
    } else {
        (Decimal::from(part.gpu_seconds) / Decimal::from(3600))
            .round_dp(9)
            .normalize()
    };
    let model = opt(&l.key.gpu_model);
    let sku = format!(
        "{}:{}",
        ct.as_str(),
        if storage { "tb-day" } else { model.as_str() }
    );
    let mut v: BTreeMap<&str, String> = BTreeMap::new();
    v.insert("BilledCost", part.amount.to_string());
    v.insert("BillingAccountId", inv.account.to_string());
    v.insert("BillingAccountName", inv.account.to_string());
    v.insert("BillingCurrency", inv.currency.to_string());
    v.insert("BillingPeriodEnd", iso(inv.period_end));
    v.insert("BillingPeriodStart", iso(inv.period_start));
    v.insert("ChargeCategory", "Usage".into());
    v.insert(
        "ChargeClass",
        if l.correction {
            "Correction".into()
        } else {
            String::new()
        },
    );
    v.insert(
        "ChargeDescription",
        format!(
            "{} {} {} band {}",
            ct.unit(),
            ct.as_str(),
            model,
            l.key.band
        )
        .trim()
        .to_owned(),
    );
    v.insert("ChargePeriodEnd", iso(inv.period_end));
    v.insert("ChargePeriodStart", iso(inv.period_start));
    v.insert(
        "ContractedCost",
        (qty * l.unit_price).normalize().to_string(),
    );
    v.insert("EffectiveCost", part.amount.to_string());
    v.insert("InvoiceIssuerName", issuer.to_owned());
    v.insert(
        "ListCost",
        (qty * l.list_unit_price).normalize().to_string(),
    );
    v.insert("PricingQuantity", qty.to_string());
    v.insert(
        "PricingUnit",
        match ct {
            ChargeType::Storage => "TB-Days",
            ChargeType::MfuWeightedGpuHours => "MFU-Weighted GPU-Hours",
            _ => "GPU-Hours",
        }
        .into(),
    );
    v.insert("ProviderName", issuer.to_owned());
    v.insert("PublisherName", issuer.to_owned());
    v.insert(
        "ServiceCategory",
        if storage {
            "Storage".into()
        } else {
            "AI and Machine Learning".into()
        },
    );
    v.insert(
        "ServiceName",
        if storage {
            "gpuledger storage".into()
        } else {
            "gpuledger GPU compute".into()
        },
    );
    v.insert("CapacityReservationId", opt(&l.key.reservation));
    v.insert(
        "CapacityReservationStatus",
        if l.key.reservation.is_some() {
            "Unused".into()
        } else {
            String::new()
        },
    );
    v.insert("ChargeFrequency", "Usage-Based".into());
    v.insert("ConsumedQuantity", consumed.to_string());
    v.insert(
        "ConsumedUnit",
        if storage {
            "TB-Days".into()
        } else {
            "GPU-Hours".into()
        },
    );
    v.insert("ContractedUnitPrice", l.unit_price.to_string());
    v.insert("InvoiceId", inv.invoice_id.clone());
    v.insert("ListUnitPrice", l.list_unit_price.to_string());
    v.insert("PricingCategory", "Standard".into());
    v.insert(
        "ResourceId",
        part.job_id
            .as_ref()
            .map(|j| format!("job/{j}"))
            .unwrap_or_default(),
    );
    v.insert(
        "ResourceType",
        if part.job_id.is_some() {
            "Job".into()
        } else {
            String::new()
        },
    );
    v.insert("SkuId", sku.clone());
    v.insert(
        "SkuPriceId",
        format!("{}:{sku}:{}", l.key.price_book_version, l.key.band),
    );
    v.insert("SubAccountId", opt(&l.key.project));
    v.insert("SubAccountName", opt(&l.key.project));
    v.insert("x_BillingModel", opt(&inv.billing_model));
    v.insert("x_GpuModel", model.clone());
    v.insert("x_GpuSeconds", part.gpu_seconds.to_string());
    v.insert("x_JobId", opt(&part.job_id));
    let mfu = if ct == ChargeType::MfuWeightedGpuHours {
        mean_factor(part.weighted, part.gpu_seconds)
    } else {
        None
    };
    v.insert("x_Mfu", opt(&mfu));
    v.insert("x_PriceBookVersion", l.key.price_book_version.clone());
    v.insert("x_TimeOfUseBand", l.key.band.clone());
    header
        .iter()
        .map(|h| csv_field(v.get(h).map(String::as_str).unwrap_or("")))
        .collect()
}

/// What every account would pay under each billing model, and the one it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comparison {
    pub period: String,
    pub currency: gpuledger_model::Currency,
    /// account -> (selected model, total per model in [`BillingModel::ALL`] order)
    pub rows: BTreeMap<String, (Option<BillingModel>, [Decimal; 3])>,
}

impl Comparison {
    /// Builds the comparison from `selected` (the invoices as billed) and one invoice set per
    /// model, in [`BillingModel::ALL`] order.
    pub fn new(selected: &[Invoice], per_model: [&[Invoice]; 3]) -> Comparison {
        let mut rows: BTreeMap<String, (Option<BillingModel>, [Decimal; 3])> = BTreeMap::new();
        for inv in selected {
            rows.entry(inv.account.to_string())
                .or_insert((inv.billing_model, [Decimal::ZERO; 3]))
                .0 = inv.billing_model;
        }
        for (i, invoices) in per_model.iter().enumerate() {
            for inv in invoices.iter() {
                rows.entry(inv.account.to_string())
                    .or_insert((inv.billing_model, [Decimal::ZERO; 3]))
                    .1[i] = inv.total();
            }
        }
        Comparison {
            period: selected
                .first()
                .or(per_model[0].first())
                .map(|i| i.period.clone())
                .unwrap_or_default(),
            currency: selected
                .first()
                .or(per_model[0].first())
                .map(|i| i.currency)
                .unwrap_or(gpuledger_model::Currency::Cny),
            rows,
        }
    }

    pub fn csv(&self) -> String {
        let mut out = String::from(
            "period,account,selected_model,gpu_hours,mfu_weighted,compute_and_storage,currency\n",
        );
        for (account, (model, totals)) in &self.rows {
            let _ = writeln!(
                out,
                "{},{account},{},{},{},{},{}",
                self.period,
                opt(model),
                totals[0],
                totals[1],
                totals[2],
                self.currency
            );
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "# Billing models compared, {}\n\nWhat each account would pay ({}) under each of the three models; `*` marks the model it is billed under.\n\n| account | gpu_hours | mfu_weighted | compute_and_storage |\n|---|---:|---:|---:|\n",
            self.period, self.currency
        );
        for (account, (model, totals)) in &self.rows {
            let cell = |i: usize| {
                let mark = if Some(BillingModel::ALL[i]) == *model {
                    " *"
                } else {
                    ""
                };
                format!("{}{mark}", totals[i])
            };
            let _ = writeln!(
                out,
                "| {account} | {} | {} | {} |",
                cell(0),
                cell(1),
                cell(2)
            );
        }
        let sum = |i: usize| self.rows.values().map(|(_, t)| t[i]).sum::<Decimal>();
        let _ = writeln!(out, "| **all** | {} | {} | {} |", sum(0), sum(1), sum(2));
        out
    }
}
