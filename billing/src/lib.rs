//! The charge engine of gpuledger: pure, decimal, no floats for money. It turns usage (integer
//! GPU-seconds per account, project, job and GPU model) into priced invoice lines under a
//! versioned price book, rounds each line once (half to even, to the currency's minor unit),
//! and renders invoices. Reading usage from storage is the caller's business.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuledger_model::config::PriceBookConfig;
use gpuledger_model::{AccountId, Currency, GpuModel, GpuSeconds, JobId, ProjectId};
use rust_decimal::Decimal;

/// Billing errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("price book `{version}` has no GPU-hour price for `{model}`")]
    NoPrice { version: String, model: GpuModel },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Usage of one job (or of an account's unattributed use) on one GPU model.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsageRecord {
    pub account: AccountId,
    pub project: Option<ProjectId>,
    pub job_id: Option<JobId>,
    pub gpu_model: GpuModel,
    pub gpu_seconds: GpuSeconds,
}

/// What a line charges for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChargeType {
    /// GPUs x hours x unit price.
    GpuHours,
}

impl ChargeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeType::GpuHours => "gpu_hours",
        }
    }
}

/// One priced line: a project x charge type x GPU model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvoiceLine {
    pub project: Option<ProjectId>,
    pub charge_type: ChargeType,
    pub gpu_model: GpuModel,
    pub jobs: u64,
    pub gpu_seconds: GpuSeconds,
    /// Price of one GPU-hour.
    pub unit_price: Decimal,
    /// Rounded once, half to even, to the currency's minor unit.
    pub amount: Decimal,
    pub price_book_version: String,
}

/// One account's invoice for one period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invoice {
    pub invoice_id: String,
    /// `YYYY-MM`.
    pub period: String,
    pub account: AccountId,
    pub currency: Currency,
    pub lines: Vec<InvoiceLine>,
}

impl Invoice {
    /// The sum of the rounded lines: lines always add up to the total.
    pub fn total(&self) -> Decimal {
        self.lines.iter().map(|l| l.amount).sum()
    }

    pub fn gpu_seconds(&self) -> GpuSeconds {
        self.lines.iter().map(|l| l.gpu_seconds).sum()
    }
}

/// The prices in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriceBook {
    config: PriceBookConfig,
}

impl PriceBook {
    pub fn new(config: PriceBookConfig) -> Self {
        PriceBook { config }
    }

    pub fn version(&self) -> &str {
        &self.config.version
    }

    pub fn currency(&self) -> Currency {
        self.config.currency
    }

    pub fn gpu_hour_price(&self, model: GpuModel) -> Result<Decimal> {
        self.config
            .gpu_hour
            .get(&model)
            .copied()
            .ok_or_else(|| Error::NoPrice {
                version: self.config.version.clone(),
                model,
            })
    }
}

/// Prices `gpu_seconds` at `unit_price` per GPU-hour, rounded once.
pub fn price_gpu_seconds(
    gpu_seconds: GpuSeconds,
    unit_price: Decimal,
    currency: Currency,
) -> Decimal {
    currency.round(Decimal::from(gpu_seconds.0) * unit_price / Decimal::from(3600))
}

/// GPU-hour invoices for every account with usage in `period`, one line per project x GPU model.
pub fn gpu_hour_invoices(
    period: &str,
    usage: &[UsageRecord],
    prices: &PriceBook,
) -> Result<Vec<Invoice>> {
    type LineKey = (Option<ProjectId>, GpuModel);
    let mut by_account: BTreeMap<AccountId, BTreeMap<LineKey, (GpuSeconds, u64)>> = BTreeMap::new();
    for u in usage {
        let entry = by_account
            .entry(u.account.clone())
            .or_default()
            .entry((u.project.clone(), u.gpu_model))
            .or_default();
        entry.0 += u.gpu_seconds;
        entry.1 += u64::from(u.job_id.is_some());
    }
    let currency = prices.currency();
    by_account
        .into_iter()
        .map(|(account, lines)| {
            let lines = lines
                .into_iter()
                .map(|((project, gpu_model), (gpu_seconds, jobs))| {
                    let unit_price = prices.gpu_hour_price(gpu_model)?;
                    Ok(InvoiceLine {
                        project,
                        charge_type: ChargeType::GpuHours,
                        gpu_model,
                        jobs,
                        gpu_seconds,
                        unit_price,
                        amount: price_gpu_seconds(gpu_seconds, unit_price, currency),
                        price_book_version: prices.version().to_owned(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Invoice {
                invoice_id: format!("INV-{period}-{account}-r1"),
                period: period.to_owned(),
                account,
                currency,
                lines,
            })
        })
        .collect()
}

/// The invoice as CSV, a line per project x charge type x GPU model, then a total line.
pub fn invoice_csv(invoice: &Invoice) -> String {
    let mut out = String::from(
        "invoice_id,period,account,project,charge_type,gpu_model,jobs,gpu_seconds,gpu_hours,unit_price,amount,currency,price_book_version\n",
    );
    for l in &invoice.lines {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            invoice.invoice_id,
            invoice.period,
            invoice.account,
            l.project.as_ref().map(|p| p.as_str()).unwrap_or(""),
            l.charge_type.as_str(),
            l.gpu_model,
            l.jobs,
            l.gpu_seconds.0,
            l.gpu_seconds.as_gpu_hours().round_dp(6).normalize(),
            l.unit_price,
            l.amount,
            invoice.currency,
            l.price_book_version
        );
    }
    let _ = writeln!(
        out,
        "{},{},{},,total,,,{},{},,{},{},",
        invoice.invoice_id,
        invoice.period,
        invoice.account,
        invoice.gpu_seconds().0,
        invoice.gpu_seconds().as_gpu_hours().round_dp(6).normalize(),
        invoice.total(),
        invoice.currency
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;
    use proptest::prelude::*;
    use rust_decimal_macros::dec;

    fn prices() -> PriceBook {
        PriceBook::new(PriceBookConfig {
            version: "2026-06".into(),
            effective_from: NaiveDate::from_ymd_opt(2026, 6, 1).unwrap(),
            currency: Currency::Cny,
            gpu_hour: [
                (GpuModel::H100Sxm, dec!(10.00)),
                (GpuModel::A100, dec!(5.00)),
            ]
            .into(),
        })
    }

    fn usage(
        account: &str,
        project: Option<&str>,
        job: u32,
        model: GpuModel,
        secs: i64,
    ) -> UsageRecord {
        UsageRecord {
            account: AccountId::new(account).unwrap(),
            project: project.map(|p| ProjectId::new(p).unwrap()),
            job_id: Some(JobId::new(job.to_string()).unwrap()),
            gpu_model: model,
            gpu_seconds: GpuSeconds(secs),
        }
    }

    #[test]
    fn seed_prices_h100_and_a100() {
        // 256 H100 for 24 h at 10 CNY and 8 A100 for 10 h at 5 CNY.
        let u = vec![
            usage(
                "team-a",
                Some("pretrain"),
                1,
                GpuModel::H100Sxm,
                256 * 24 * 3600,
            ),
            usage("team-a", Some("eval"), 2, GpuModel::A100, 8 * 10 * 3600),
        ];
        let inv = gpu_hour_invoices("2026-06", &u, &prices()).unwrap();
        assert_eq!(inv.len(), 1);
        assert_eq!(inv[0].total(), dec!(61840.00));
        assert_eq!(inv[0].lines[0].project.as_ref().unwrap().as_str(), "eval");
    }

    #[test]
    fn each_line_is_rounded_once_half_to_even() {
        // 1 GPU-second at 10/h = 0.002777..: rounds to 0.00; 9 s = 0.025 -> 0.02 (even).
        assert_eq!(
            price_gpu_seconds(GpuSeconds(1), dec!(10), Currency::Cny),
            dec!(0.00)
        );
        assert_eq!(
            price_gpu_seconds(GpuSeconds(9), dec!(10), Currency::Cny),
            dec!(0.02)
        );
        assert_eq!(
            price_gpu_seconds(GpuSeconds(27), dec!(10), Currency::Cny),
            dec!(0.08)
        );
    }

    #[test]
    fn missing_price_is_an_error() {
        let u = vec![usage("a", None, 1, GpuModel::H200, 10)];
        assert_eq!(
            gpu_hour_invoices("2026-06", &u, &prices())
                .unwrap_err()
                .to_string(),
            "price book `2026-06` has no GPU-hour price for `h200`"
        );
    }

    proptest! {
        #[test]
        fn lines_sum_to_total_and_seconds_are_conserved(
            rows in proptest::collection::vec((0usize..3, 0usize..3, 1u32..50, 0i64..10_000_000), 1..60)
        ) {
            let accounts = ["a", "b", "c"];
            let projects = [None, Some("p1"), Some("p2")];
            let u: Vec<UsageRecord> = rows.iter().map(|(a, p, j, s)| usage(accounts[*a], projects[*p], *j, GpuModel::H100Sxm, *s)).collect();
            let invoices = gpu_hour_invoices("2026-06", &u, &prices()).unwrap();
            let billed: i64 = invoices.iter().map(|i| i.gpu_seconds().0).sum();
            let used: i64 = u.iter().map(|r| r.gpu_seconds.0).sum();
            prop_assert_eq!(billed, used);
            for inv in &invoices {
                let csv = invoice_csv(inv);
                let total_line = csv.lines().last().unwrap();
                let expected = format!(",{},CNY,", inv.total());
                prop_assert!(total_line.contains(&expected), "{} lacks {}", total_line, expected);
                // Reference: each line priced independently with exact arithmetic, then rounded.
                for line in &inv.lines {
                    let exact = Decimal::from(line.gpu_seconds.0) * dec!(10) / dec!(3600);
                    prop_assert!((line.amount - exact).abs() <= dec!(0.005));
                }
            }
        }
    }
}
