//! The charge engine: usage in, priced lines out. Quantities stay integers until a line is
//! priced: GPU-seconds times an MFU factor in basis points, or byte-seconds. Each line is
//! rounded once, half to even, to the currency's minor unit; a line's amount is split over its
//! jobs (and idle capacity over accounts) by largest remainder, so the parts sum exactly.

use std::collections::{BTreeMap, HashMap};

use chrono::NaiveDate;
use gpuledger_model::{AccountId, Currency, GpuModel, JobId, NodeId, ProjectId};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::pricebook::{BillingModel, Coverage, IdlePolicy, PriceBook, PLATFORM_ACCOUNT};
use crate::{Error, Result};

/// One MFU factor unit: factors are integer basis points.
pub const FACTOR_ONE: i128 = 10_000;
const SECONDS_PER_HOUR: i128 = 3_600;
const BYTE_SECONDS_PER_TB_DAY: i128 = 1_000_000_000_000 * 86_400;

/// A billing period: `[start, end)` in Unix seconds, named `YYYY-MM` (UTC months).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    pub name: String,
    pub start: i64,
    pub end: i64,
}

impl Period {
    /// The UTC calendar month `YYYY-MM`.
    pub fn month(name: &str) -> Result<Period> {
        let bad = || Error::BadPeriod(name.to_owned());
        let first =
            NaiveDate::parse_from_str(&format!("{name}-01"), "%Y-%m-%d").map_err(|_| bad())?;
        if format!("{}", first.format("%Y-%m")) != name {
            return Err(bad());
        }
        let next = first
            .checked_add_months(chrono::Months::new(1))
            .ok_or_else(bad)?;
        let secs = |d: NaiveDate| {
            d.and_hms_opt(0, 0, 0)
                .expect("midnight")
                .and_utc()
                .timestamp()
        };
        Ok(Period {
            name: name.to_owned(),
            start: secs(first),
            end: secs(next),
        })
    }
}

/// GPU-seconds of one job (or an account's unattributed use) on one node in one UTC hour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageHour {
    pub account: AccountId,
    pub project: Option<ProjectId>,
    pub job_id: Option<JobId>,
    pub node: NodeId,
    pub gpu_model: GpuModel,
    /// Start of the UTC hour, Unix seconds.
    pub hour_start: i64,
    pub gpu_seconds: i64,
    /// The GPU-seconds in each quarter of the hour, where the store knows them: an hour that a
    /// band or a price-book version cuts (a zone off UTC by a half or a quarter hour) is then
    /// cut exactly; without them it is split in proportion to the pieces' lengths.
    pub quarter_seconds: Option<[i64; 4]>,
    /// Measured MFU in basis points (0-10000), if any.
    pub mfu_bp: Option<u32>,
}

/// GPU-seconds sampled on GPUs that ran no job, per node and UTC hour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleHour {
    pub node: NodeId,
    pub gpu_model: GpuModel,
    pub hour_start: i64,
    pub gpu_seconds: i64,
    /// As [`UsageHour::quarter_seconds`].
    pub quarter_seconds: Option<[i64; 4]>,
}

/// One storage scan figure: bytes held under a tenant directory at an instant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StorageScan {
    pub account: AccountId,
    pub project: Option<ProjectId>,
    /// Unix seconds.
    pub time: i64,
    pub bytes: u64,
}

/// An advance reservation: GPUs held for an account over a window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    pub id: String,
    pub account: AccountId,
    #[serde(default)]
    pub project: Option<ProjectId>,
    pub gpu_model: GpuModel,
    pub gpus: u32,
    /// The reserved nodes; empty when only a count was reserved.
    #[serde(default)]
    pub nodes: Vec<NodeId>,
    /// Unix seconds, `[start, end)`.
    pub start: i64,
    pub end: i64,
}

impl Reservation {
    /// GPU-seconds the reservation holds, all of it.
    pub fn reserved_gpu_seconds(&self) -> i64 {
        i64::from(self.gpus) * (self.end - self.start).max(0)
    }
}

/// Everything one period is billed from.
#[derive(Clone, Debug, Default)]
pub struct BillingInput {
    /// Measured usage (on GPUs the job held, where allocations are known).
    pub usage: Vec<UsageHour>,
    /// GPU-seconds jobs held that no exporter measured: billed where the price book's
    /// `coverage` is `allocation`, and noted on the invoice either way.
    pub gaps: Vec<UsageHour>,
    pub idle: Vec<IdleHour>,
    pub storage: Vec<StorageScan>,
    pub reservations: Vec<Reservation>,
    /// Measured GPU-seconds billed to nobody (per node and reason), for the platform's notes.
    pub flagged: Vec<FlagNote>,
}

/// Measured GPU-seconds of a node billed to nobody, and why ([`crate::reconcile`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlagNote {
    pub node: NodeId,
    pub reason: String,
    pub gpu_seconds: i64,
}

/// A job's GPU-seconds held but not measured in the period, and how many of them were billed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GapNote {
    pub job_id: Option<JobId>,
    pub node: NodeId,
    pub gpu_seconds: i64,
    pub billed_gpu_seconds: i64,
}

/// What an invoice says beside its lines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceNotes {
    /// The account's coverage gaps, per job and node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coverage_gaps: Vec<GapNote>,
    /// On the platform's invoice: measured GPU-seconds billed to nobody, per node and reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flagged: Vec<FlagNote>,
}

impl InvoiceNotes {
    pub fn is_empty(&self) -> bool {
        self.coverage_gaps.is_empty() && self.flagged.is_empty()
    }
}

/// What a line charges for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeType {
    /// GPUs x hours x unit price.
    GpuHours,
    /// GPUs x hours x MFU factor x unit price.
    MfuWeightedGpuHours,
    /// Reserved GPU-hours the reserving account did not use.
    ReservationUnused,
    /// This account's share of the GPUs that ran no job.
    IdleShare,
    /// GPUs that ran no job, on the platform's own invoice.
    IdleCapacity,
    /// TB x days held under the account's directories.
    Storage,
}

impl ChargeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeType::GpuHours => "gpu_hours",
            ChargeType::MfuWeightedGpuHours => "mfu_weighted_gpu_hours",
            ChargeType::ReservationUnused => "reservation_unused",
            ChargeType::IdleShare => "idle_share",
            ChargeType::IdleCapacity => "idle_capacity",
            ChargeType::Storage => "storage",
        }
    }

    /// The unit its quantity is priced in.
    pub fn unit(self) -> &'static str {
        match self {
            ChargeType::Storage => "TB-day",
            ChargeType::MfuWeightedGpuHours => "MFU-weighted GPU-hour",
            _ => "GPU-hour",
        }
    }

    fn denominator(self) -> i128 {
        match self {
            ChargeType::Storage => BYTE_SECONDS_PER_TB_DAY,
            _ => SECONDS_PER_HOUR * FACTOR_ONE,
        }
    }
}

/// What identifies a line: the same key in two revisions is the same charge.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LineKey {
    pub project: Option<ProjectId>,
    pub charge_type: ChargeType,
    pub gpu_model: Option<GpuModel>,
    /// Time-of-use band; `-` where none applies (storage).
    pub band: String,
    pub reservation: Option<String>,
    pub price_book_version: String,
}

/// One job's part of a line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPart {
    pub job_id: Option<JobId>,
    pub gpu_seconds: i64,
    /// GPU-seconds x factor in basis points (equal to seconds x 10000 without weighting).
    pub weighted: i128,
    pub amount: Decimal,
}

/// One priced line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceLine {
    #[serde(flatten)]
    pub key: LineKey,
    /// The revision that added this line; a correction line carries a difference.
    pub revision: u32,
    pub correction: bool,
    pub gpu_seconds: i64,
    pub byte_seconds: i128,
    /// The priced quantity in integer units: weighted GPU-seconds (x 10000) or byte-seconds.
    pub weighted: i128,
    /// The priced quantity in `unit`, to 9 decimal places (display and FOCUS).
    pub quantity: Decimal,
    pub unit: String,
    /// Base price of the unit in the price book.
    pub list_unit_price: Decimal,
    /// The price applied: base x band multiplier (x reservation multiplier).
    pub unit_price: Decimal,
    /// Mean MFU factor of an MFU-weighted line.
    pub mfu_factor: Option<Decimal>,
    /// Rounded once, half to even, to the currency's minor unit.
    pub amount: Decimal,
    pub jobs: Vec<JobPart>,
}

/// One account's charges for one period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoice {
    pub invoice_id: String,
    pub period: String,
    pub period_start: i64,
    pub period_end: i64,
    pub account: AccountId,
    pub currency: Currency,
    /// The model of the version in force at the end of the period; `None` for the platform's
    /// own invoice (idle capacity), which no model prices.
    pub billing_model: Option<BillingModel>,
    pub revision: u32,
    pub lines: Vec<InvoiceLine>,
    /// GPU-seconds per UTC day, for the usage chart.
    pub daily_gpu_seconds: Vec<(NaiveDate, i64)>,
    #[serde(default, skip_serializing_if = "InvoiceNotes::is_empty")]
    pub notes: InvoiceNotes,
}

impl Invoice {
    /// The sum of the rounded lines: lines always add up to the total.
    pub fn total(&self) -> Decimal {
        self.lines.iter().map(|l| l.amount).sum()
    }

    pub fn gpu_seconds(&self) -> i64 {
        self.lines
            .iter()
            .filter(|l| {
                matches!(
                    l.key.charge_type,
                    ChargeType::GpuHours | ChargeType::MfuWeightedGpuHours
                )
            })
            .map(|l| l.gpu_seconds)
            .sum()
    }

    pub fn id_for(period: &str, account: &AccountId, revision: u32) -> String {
        format!("INV-{period}-{account}-r{revision}")
    }
}

#[derive(Default)]
struct LineAcc {
    gpu_seconds: i64,
    byte_seconds: i128,
    weighted: i128,
    list_unit_price: Decimal,
    unit_price: Decimal,
    fixed_amount: Option<Decimal>,
    jobs: BTreeMap<Option<JobId>, (i64, i128)>,
}

type Lines = BTreeMap<AccountId, BTreeMap<LineKey, LineAcc>>;

/// Per account, job and node: GPU-seconds held and not measured, and how many were billed.
type GapTotals<'a> = BTreeMap<&'a AccountId, BTreeMap<(Option<JobId>, NodeId), (i64, i64)>>;

/// Per GPU model and hour: idle GPU-seconds and, while every row knows them, their quarters.
type IdleByHour = BTreeMap<(GpuModel, i64), (i64, Option<[i64; 4]>)>;

/// One UTC hour cut where the band or the price-book version changes, each piece with its
/// band, multiplier and version. Bands start at whole local hours and versions at local
/// midnight, and every zone's offset and change of offset is a whole number of quarter hours,
/// so the cuts fall on quarters of the UTC hour: each quarter is looked up and equal
/// neighbours merged.
struct Piece<'a> {
    seconds: i64,
    /// The quarters of the hour it covers.
    quarters: std::ops::Range<usize>,
    band: &'a str,
    multiplier: Decimal,
    version: &'a crate::pricebook::PriceVersion,
}

/// The pieces of each UTC hour, computed once per hour: many usage rows share an hour.
struct HourPieces<'a> {
    book: &'a PriceBook,
    cache: HashMap<i64, Vec<Piece<'a>>>,
}

impl<'a> HourPieces<'a> {
    fn new(book: &'a PriceBook) -> Self {
        HourPieces {
            book,
            cache: HashMap::new(),
        }
    }

    fn get(&mut self, hour_start: i64) -> Result<&[Piece<'a>]> {
        if !self.cache.contains_key(&hour_start) {
            let pieces = pieces_of_hour(self.book, hour_start)?;
            self.cache.insert(hour_start, pieces);
        }
        Ok(&self.cache[&hour_start])
    }
}

const QUARTER_SECONDS: i64 = 900;

fn pieces_of_hour(book: &PriceBook, hour_start: i64) -> Result<Vec<Piece<'_>>> {
    let mut out: Vec<Piece<'_>> = Vec::new();
    for q in 0..4 {
        let from = hour_start + q as i64 * QUARTER_SECONDS;
        let (version, tz) = book.at(from)?;
        let band = version.band_at(tz, from);
        match out.last_mut() {
            Some(p) if p.band == band.name && p.version.version == version.version => {
                p.seconds += QUARTER_SECONDS;
                p.quarters.end = q + 1;
            }
            _ => out.push(Piece {
                seconds: QUARTER_SECONDS,
                quarters: q..q + 1,
                band: band.name,
                multiplier: band.multiplier,
                version,
            }),
        }
    }
    Ok(out)
}

/// Splits `seconds` over an hour's pieces: by the quarters they were used in where those are
/// known and add up, else in proportion to the pieces' lengths.
fn split_over_pieces(seconds: i64, quarters: Option<[i64; 4]>, pieces: &[Piece<'_>]) -> Vec<i64> {
    if pieces.len() == 1 {
        return vec![seconds];
    }
    if let Some(q) = quarters.filter(|q| q.iter().sum::<i64>() == seconds) {
        return pieces
            .iter()
            .map(|p| q[p.quarters.clone()].iter().sum())
            .collect();
    }
    let weights: Vec<i128> = pieces.iter().map(|p| i128::from(p.seconds)).collect();
    split_largest_remainder(i128::from(seconds), &weights)
        .into_iter()
        .map(|v| v as i64)
        .collect()
}

/// Splits `total` in proportion to `weights` (all >= 0) so the parts sum exactly to `total`:
/// each part is the floor of its exact share, and the units left over go to the largest
/// remainders (ties to the earlier part). Equal weights when they are all zero.
pub fn split_largest_remainder(total: i128, weights: &[i128]) -> Vec<i128> {
    if weights.is_empty() {
        return Vec::new();
    }
    let (sign, total) = (total.signum(), total.abs());
    let sum: i128 = weights.iter().sum();
    let weights: Vec<i128> = if sum == 0 {
        vec![1; weights.len()]
    } else {
        weights.to_vec()
    };
    let sum: i128 = weights.iter().sum();
    let mut parts: Vec<i128> = weights.iter().map(|w| total * w / sum).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(total * weights[i] % sum), i));
    let left = total - parts.iter().sum::<i128>();
    for &i in order.iter().take(left as usize) {
        parts[i] += 1;
    }
    parts.into_iter().map(|p| p * sign).collect()
}

/// Prices every account's usage in `period`. `force_model` bills every account under one
/// model (for the comparison report); otherwise each account's model comes from the book.
pub fn charge(
    period: &Period,
    input: &BillingInput,
    book: &PriceBook,
    force_model: Option<BillingModel>,
) -> Result<Vec<Invoice>> {
    let model_of = |version: &crate::pricebook::PriceVersion, account: &AccountId| {
        force_model.unwrap_or_else(|| version.model_of(account))
    };
    let mut lines: Lines = BTreeMap::new();
    let mut hours = HourPieces::new(book);
    let mut daily: BTreeMap<&AccountId, BTreeMap<NaiveDate, i64>> = BTreeMap::new();
    let mut model_seconds: BTreeMap<(GpuModel, &AccountId), i64> = BTreeMap::new();
    let mut gaps: GapTotals<'_> = BTreeMap::new();
    let rows = input
        .usage
        .iter()
        .map(|u| (u, false))
        .chain(input.gaps.iter().map(|u| (u, true)));
    for (u, gap) in rows.filter(|(u, _)| in_period(period, u.hour_start)) {
        let date = chrono::DateTime::from_timestamp(u.hour_start, 0)
            .unwrap_or_default()
            .date_naive();
        let pieces = hours.get(u.hour_start)?;
        for (piece, seconds) in
            pieces
                .iter()
                .zip(split_over_pieces(u.gpu_seconds, u.quarter_seconds, pieces))
        {
            if seconds == 0 {
                continue;
            }
            if gap {
                let note = gaps
                    .entry(&u.account)
                    .or_default()
                    .entry((u.job_id.clone(), u.node.clone()))
                    .or_default();
                note.0 += seconds;
                if piece.version.coverage == Coverage::Telemetry {
                    continue;
                }
                note.1 += seconds;
            }
            *daily
                .entry(&u.account)
                .or_default()
                .entry(date)
                .or_default() += seconds;
            *model_seconds.entry((u.gpu_model, &u.account)).or_default() += seconds;
            let base = price_of(piece.version, u.gpu_model)?;
            let (charge_type, factor) = match model_of(piece.version, &u.account) {
                BillingModel::MfuWeighted => (
                    ChargeType::MfuWeightedGpuHours,
                    piece
                        .version
                        .mfu
                        .factor(u.mfu_bp.map(|bp| Decimal::new(i64::from(bp), 4))),
                ),
                _ => (ChargeType::GpuHours, Decimal::ONE),
            };
            let key = LineKey {
                project: u.project.clone(),
                charge_type,
                gpu_model: Some(u.gpu_model),
                band: piece.band.to_owned(),
                reservation: None,
                price_book_version: piece.version.version.clone(),
            };
            let acc = line(&mut lines, &u.account, key, base, base * piece.multiplier);
            let weighted = i128::from(seconds) * factor_bp(factor);
            acc.gpu_seconds += seconds;
            acc.weighted += weighted;
            let job = acc.jobs.entry(u.job_id.clone()).or_default();
            job.0 += seconds;
            job.1 += weighted;
        }
    }
    let reserved_unused = charge_reservations(period, input, &mut hours, &mut lines)?;
    charge_idle(
        period,
        input,
        &mut hours,
        &reserved_unused,
        &model_seconds,
        &mut lines,
    )?;
    charge_storage(period, input, book, &model_of, &mut lines)?;
    let mut invoices = finish(period, book, lines, daily, force_model)?;
    for inv in &mut invoices {
        if let Some(account_gaps) = gaps.get(&inv.account) {
            inv.notes.coverage_gaps = account_gaps
                .iter()
                .filter(|(_, (held, _))| *held > 0)
                .map(|((job_id, node), (held, billed))| GapNote {
                    job_id: job_id.clone(),
                    node: node.clone(),
                    gpu_seconds: *held,
                    billed_gpu_seconds: *billed,
                })
                .collect();
        }
        if inv.account.as_str() == PLATFORM_ACCOUNT {
            inv.notes.flagged = input.flagged.clone();
        }
    }
    Ok(invoices)
}

fn in_period(period: &Period, t: i64) -> bool {
    t >= period.start && t < period.end
}

fn factor_bp(factor: Decimal) -> i128 {
    (factor * Decimal::from(FACTOR_ONE as i64))
        .round()
        .try_into()
        .unwrap_or(0)
}

fn price_of(version: &crate::pricebook::PriceVersion, model: GpuModel) -> Result<Decimal> {
    version
        .gpu_hour
        .get(&model)
        .copied()
        .ok_or_else(|| Error::NoPrice {
            version: version.version.clone(),
            model,
        })
}

fn line<'a>(
    lines: &'a mut Lines,
    account: &AccountId,
    key: LineKey,
    list_unit_price: Decimal,
    unit_price: Decimal,
) -> &'a mut LineAcc {
    lines
        .entry(account.clone())
        .or_default()
        .entry(key)
        .or_insert_with(|| LineAcc {
            list_unit_price,
            unit_price,
            ..LineAcc::default()
        })
}

/// Charges reserved GPU-hours left unused; returns the unused GPU-seconds per model and hour
/// (already paid for, so not idle capacity).
fn charge_reservations(
    period: &Period,
    input: &BillingInput,
    hours: &mut HourPieces<'_>,
    lines: &mut Lines,
) -> Result<HashMap<(GpuModel, i64), i64>> {
    let mut unused_by_hour: HashMap<(GpuModel, i64), i64> = HashMap::new();
    if input.reservations.is_empty() {
        return Ok(unused_by_hour);
    }
    let mut by_model: HashMap<(&AccountId, GpuModel, i64), i64> = HashMap::new();
    let mut by_node: HashMap<(&AccountId, &NodeId, i64), i64> = HashMap::new();
    for u in &input.usage {
        *by_model
            .entry((&u.account, u.gpu_model, u.hour_start))
            .or_default() += u.gpu_seconds;
        *by_node
            .entry((&u.account, &u.node, u.hour_start))
            .or_default() += u.gpu_seconds;
    }
    for r in &input.reservations {
        let from = r.start.max(period.start);
        let to = r.end.min(period.end);
        let mut hour = from - from.rem_euclid(3600);
        while hour < to {
            let overlap = (hour + 3600).min(to) - hour.max(from);
            let reserved = i64::from(r.gpus) * overlap;
            let used = if r.nodes.is_empty() {
                by_model
                    .get(&(&r.account, r.gpu_model, hour))
                    .copied()
                    .unwrap_or(0)
            } else {
                r.nodes
                    .iter()
                    .map(|n| by_node.get(&(&r.account, n, hour)).copied().unwrap_or(0))
                    .sum()
            };
            let unused = (reserved - used.min(reserved)).max(0);
            hour += 3600;
            if unused == 0 {
                continue;
            }
            let start = hour - 3600;
            let pieces = hours.get(start)?;
            for (piece, seconds) in pieces.iter().zip(split_over_pieces(unused, None, pieces)) {
                let policy = &piece.version.reservations;
                if !policy.charge_unused {
                    continue;
                }
                *unused_by_hour.entry((r.gpu_model, start)).or_default() += seconds;
                let base = price_of(piece.version, r.gpu_model)?;
                let key = LineKey {
                    project: r.project.clone(),
                    charge_type: ChargeType::ReservationUnused,
                    gpu_model: Some(r.gpu_model),
                    band: piece.band.to_owned(),
                    reservation: Some(r.id.clone()),
                    price_book_version: piece.version.version.clone(),
                };
                let acc = line(
                    lines,
                    &r.account,
                    key,
                    base,
                    base * piece.multiplier * policy.multiplier,
                );
                acc.gpu_seconds += seconds;
                acc.weighted += i128::from(seconds) * FACTOR_ONE;
                let job = acc.jobs.entry(None).or_default();
                job.0 += seconds;
                job.1 += i128::from(seconds) * FACTOR_ONE;
            }
        }
    }
    Ok(unused_by_hour)
}

/// Idle GPU-seconds of one GPU model, band and price-book version.
struct IdleBucket {
    seconds: i64,
    base: Decimal,
    unit_price: Decimal,
    policy: IdlePolicy,
}

/// Idle capacity: on the platform's invoice, or each bucket's amount (model x band x version)
/// split over the accounts by their GPU-seconds on that model.
fn charge_idle(
    period: &Period,
    input: &BillingInput,
    hours: &mut HourPieces<'_>,
    reserved_unused: &HashMap<(GpuModel, i64), i64>,
    model_seconds: &BTreeMap<(GpuModel, &AccountId), i64>,
    lines: &mut Lines,
) -> Result<()> {
    let mut idle_by_hour: IdleByHour = BTreeMap::new();
    for i in input
        .idle
        .iter()
        .filter(|i| in_period(period, i.hour_start))
    {
        let e = idle_by_hour
            .entry((i.gpu_model, i.hour_start))
            .or_insert((0, Some([0; 4])));
        e.0 += i.gpu_seconds;
        e.1 = match (e.1, i.quarter_seconds) {
            (Some(a), Some(b)) => Some(std::array::from_fn(|q| a[q] + b[q])),
            _ => None,
        };
    }
    let mut buckets: BTreeMap<(GpuModel, String, String), IdleBucket> = BTreeMap::new();
    for ((model, hour), (seconds, quarters)) in idle_by_hour {
        let reserved = reserved_unused.get(&(model, hour)).copied().unwrap_or(0);
        let idle = (seconds - reserved).max(0);
        let quarters = quarters.filter(|_| reserved == 0);
        let pieces = hours.get(hour)?;
        for (piece, seconds) in pieces.iter().zip(split_over_pieces(idle, quarters, pieces)) {
            let policy = piece.version.idle.policy;
            if policy == IdlePolicy::None || seconds == 0 {
                continue;
            }
            let base = price_of(piece.version, model)?;
            let b = buckets
                .entry((model, piece.band.to_owned(), piece.version.version.clone()))
                .or_insert(IdleBucket {
                    seconds: 0,
                    base,
                    unit_price: base * piece.multiplier,
                    policy,
                });
            b.seconds += seconds;
        }
    }
    let currency = hours.book.currency();
    let platform = AccountId::new(PLATFORM_ACCOUNT).expect("valid id");
    for (
        (model, band, version),
        IdleBucket {
            seconds,
            base,
            unit_price,
            policy,
        },
    ) in buckets
    {
        let sharers: Vec<(&AccountId, i64)> = model_seconds
            .iter()
            .filter(|((m, _), s)| *m == model && **s > 0)
            .map(|((_, a), s)| (*a, *s))
            .collect();
        let key = |charge_type| LineKey {
            project: None,
            charge_type,
            gpu_model: Some(model),
            band: band.clone(),
            reservation: None,
            price_book_version: version.clone(),
        };
        if policy == IdlePolicy::Platform || sharers.is_empty() {
            let acc = line(
                lines,
                &platform,
                key(ChargeType::IdleCapacity),
                base,
                unit_price,
            );
            acc.gpu_seconds += seconds;
            acc.weighted += i128::from(seconds) * FACTOR_ONE;
            // The part carries its quantity as every line's parts do (FOCUS prices it).
            let part = acc.jobs.entry(None).or_default();
            part.0 += seconds;
            part.1 += i128::from(seconds) * FACTOR_ONE;
            continue;
        }
        let whole = price_exact(
            i128::from(seconds) * FACTOR_ONE,
            ChargeType::IdleShare,
            unit_price,
            currency,
        )?;
        let minor = minor_units(whole, currency);
        let weights: Vec<i128> = sharers.iter().map(|(_, s)| i128::from(*s)).collect();
        let amounts = split_largest_remainder(minor, &weights);
        let secs = split_largest_remainder(i128::from(seconds), &weights);
        for (((account, _), amount), secs) in sharers.iter().zip(amounts).zip(secs) {
            let acc = line(lines, account, key(ChargeType::IdleShare), base, unit_price);
            acc.gpu_seconds += secs as i64;
            acc.weighted += secs * FACTOR_ONE;
            let part = from_minor_units(amount, currency);
            acc.fixed_amount = Some(acc.fixed_amount.unwrap_or_default() + part);
            let part = acc.jobs.entry(None).or_default();
            part.0 += secs as i64;
            part.1 += secs * FACTOR_ONE;
        }
    }
    Ok(())
}

/// Storage in TB-days: each scan's bytes stand until the next scan of the same directory, at
/// most `max_hold`; billed to accounts whose model bills storage.
fn charge_storage(
    period: &Period,
    input: &BillingInput,
    book: &PriceBook,
    model_of: &dyn Fn(&crate::pricebook::PriceVersion, &AccountId) -> BillingModel,
    lines: &mut Lines,
) -> Result<()> {
    let mut scans: BTreeMap<(&AccountId, &Option<ProjectId>), Vec<&StorageScan>> = BTreeMap::new();
    for s in &input.storage {
        scans.entry((&s.account, &s.project)).or_default().push(s);
    }
    for ((account, project), mut list) in scans {
        list.sort_by_key(|s| s.time);
        for (i, scan) in list.iter().enumerate() {
            let next = list.get(i + 1).map(|n| n.time).unwrap_or(i64::MAX);
            let from = scan.time.max(period.start);
            let pieces = book.pieces(from, next.min(period.end));
            // How long a figure stands is the price version's it is first priced under; each
            // stretch of it is then priced under the version in force over that stretch.
            let Some(hold) = pieces
                .iter()
                .find_map(|(_, _, v)| v.storage.as_ref().map(|s| s.max_hold))
            else {
                // No version prices storage while it stands; one that bills it is an error below.
                if let Some((_, _, v)) = pieces
                    .iter()
                    .find(|(_, _, v)| model_of(v, account).bills_storage())
                {
                    return Err(Error::NoStoragePrice {
                        version: v.version.clone(),
                    });
                }
                continue;
            };
            let hold_end = scan.time.saturating_add(hold.as_secs() as i64);
            for (piece_from, piece_to, version) in pieces {
                let to = piece_to.min(hold_end);
                if to <= piece_from || !model_of(version, account).bills_storage() {
                    continue;
                }
                let Some(price) = &version.storage else {
                    return Err(Error::NoStoragePrice {
                        version: version.version.clone(),
                    });
                };
                let byte_seconds = i128::from(scan.bytes) * i128::from(to - piece_from);
                let key = LineKey {
                    project: project.clone(),
                    charge_type: ChargeType::Storage,
                    gpu_model: None,
                    band: "-".into(),
                    reservation: None,
                    price_book_version: version.version.clone(),
                };
                let acc = line(lines, account, key, price.tb_day, price.tb_day);
                acc.byte_seconds += byte_seconds;
                acc.weighted += byte_seconds;
            }
        }
    }
    Ok(())
}

/// `weighted / denominator x unit_price`, exact, before rounding.
fn exact_amount(weighted: i128, charge_type: ChargeType, unit_price: Decimal) -> Result<Decimal> {
    let num = Decimal::try_from_i128_with_scale(weighted, 0).map_err(|_| Error::Overflow)?;
    let den = Decimal::try_from_i128_with_scale(charge_type.denominator(), 0)
        .map_err(|_| Error::Overflow)?;
    num.checked_mul(unit_price)
        .and_then(|v| v.checked_div(den))
        .ok_or(Error::Overflow)
}

fn price_exact(
    weighted: i128,
    charge_type: ChargeType,
    unit_price: Decimal,
    currency: Currency,
) -> Result<Decimal> {
    Ok(currency.round(exact_amount(weighted, charge_type, unit_price)?))
}

fn minor_units(amount: Decimal, currency: Currency) -> i128 {
    let mut a = amount;
    a.rescale(currency.minor_units());
    a.mantissa()
}

fn from_minor_units(units: i128, currency: Currency) -> Decimal {
    Decimal::from_i128_with_scale(units, currency.minor_units())
}

/// A priced quantity in its charge type's unit, to 9 decimal places.
pub fn quantity(weighted: i128, charge_type: ChargeType) -> Decimal {
    let num = Decimal::from_i128_with_scale(weighted, 0);
    let den = Decimal::from_i128_with_scale(charge_type.denominator(), 0);
    (num / den).round_dp(9).normalize()
}

/// The mean MFU factor of weighted GPU-seconds, to 4 decimal places.
pub fn mean_factor(weighted: i128, gpu_seconds: i64) -> Option<Decimal> {
    (gpu_seconds > 0).then(|| {
        (Decimal::from_i128_with_scale(weighted, 0)
            / Decimal::from_i128_with_scale(i128::from(gpu_seconds) * FACTOR_ONE, 0))
        .round_dp(4)
    })
}

fn finish(
    period: &Period,
    book: &PriceBook,
    lines: Lines,
    daily: BTreeMap<&AccountId, BTreeMap<NaiveDate, i64>>,
    force_model: Option<BillingModel>,
) -> Result<Vec<Invoice>> {
    let currency = book.currency();
    let (last_version, _) = book.at(period.end - 1)?;
    lines
        .into_iter()
        .map(|(account, lines)| {
            let lines = lines
                .into_iter()
                .map(|(key, acc)| priced_line(key, acc, currency))
                .collect::<Result<Vec<_>>>()?;
            Ok(Invoice {
                invoice_id: Invoice::id_for(&period.name, &account, 1),
                period: period.name.clone(),
                period_start: period.start,
                period_end: period.end,
                currency,
                billing_model: (account.as_str() != PLATFORM_ACCOUNT)
                    .then(|| force_model.unwrap_or_else(|| last_version.model_of(&account))),
                revision: 1,
                lines,
                daily_gpu_seconds: daily
                    .get(&account)
                    .map(|d| d.iter().map(|(k, v)| (*k, *v)).collect())
                    .unwrap_or_default(),
                notes: InvoiceNotes::default(),
                account,
            })
        })
        .collect()
}

fn priced_line(key: LineKey, acc: LineAcc, currency: Currency) -> Result<InvoiceLine> {
    let charge_type = key.charge_type;
    let amount = match acc.fixed_amount {
        Some(a) => a,
        None => price_exact(acc.weighted, charge_type, acc.unit_price, currency)?,
    };
    let weights: Vec<i128> = acc.jobs.values().map(|(_, w)| *w).collect();
    let job_amounts = split_largest_remainder(minor_units(amount, currency), &weights);
    let jobs = acc
        .jobs
        .into_iter()
        .zip(job_amounts)
        .map(|((job_id, (gpu_seconds, weighted)), minor)| JobPart {
            job_id,
            gpu_seconds,
            weighted,
            amount: from_minor_units(minor, currency),
        })
        .collect();
    let mfu_factor = if charge_type == ChargeType::MfuWeightedGpuHours {
        mean_factor(acc.weighted, acc.gpu_seconds)
    } else {
        None
    };
    let tidy = |p: Decimal| {
        let mut p = p.normalize();
        if p.scale() < currency.minor_units() {
            p.rescale(currency.minor_units());
        }
        p
    };
    Ok(InvoiceLine {
        revision: 1,
        correction: false,
        gpu_seconds: acc.gpu_seconds,
        byte_seconds: acc.byte_seconds,
        weighted: acc.weighted,
        quantity: quantity(acc.weighted, charge_type),
        unit: charge_type.unit().to_owned(),
        list_unit_price: tidy(acc.list_unit_price),
        unit_price: tidy(acc.unit_price),
        mfu_factor,
        amount,
        jobs,
        key,
    })
}

/// The next revision of an invoice: `previous` unchanged when `fresh` bills the same, else
/// `previous`'s lines as issued plus correction lines carrying each key's difference. Nothing
/// already issued is ever rewritten.
pub fn revise(previous: Option<Invoice>, fresh: Invoice) -> Invoice {
    let Some(previous) = previous else {
        return fresh;
    };
    let totals = |lines: &[InvoiceLine]| {
        let mut t: BTreeMap<LineKey, (i64, i128, i128, Decimal, Decimal, Decimal)> =
            BTreeMap::new();
        for l in lines {
            let e = t.entry(l.key.clone()).or_insert((
                0,
                0,
                0,
                Decimal::ZERO,
                l.list_unit_price,
                l.unit_price,
            ));
            e.0 += l.gpu_seconds;
            e.1 += l.byte_seconds;
            e.2 += l.weighted;
            e.3 += l.amount;
        }
        t
    };
    let before = totals(&previous.lines);
    let after = totals(&fresh.lines);
    let revision = previous.revision + 1;
    let mut corrections = Vec::new();
    let keys: std::collections::BTreeSet<&LineKey> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let zero = (0, 0, 0, Decimal::ZERO, Decimal::ZERO, Decimal::ZERO);
        let b = before.get(key).unwrap_or(&zero);
        let a = after.get(key).unwrap_or(&zero);
        if (a.0, a.1, a.2, a.3) == (b.0, b.1, b.2, b.3) {
            continue;
        }
        let prices = if after.contains_key(key) { a } else { b };
        let weighted = a.2 - b.2;
        corrections.push(InvoiceLine {
            key: key.clone(),
            revision,
            correction: true,
            gpu_seconds: a.0 - b.0,
            byte_seconds: a.1 - b.1,
            weighted,
            quantity: quantity(weighted, key.charge_type),
            unit: key.charge_type.unit().to_owned(),
            list_unit_price: prices.4,
            unit_price: prices.5,
            mfu_factor: None,
            amount: a.3 - b.3,
            jobs: Vec::new(),
        });
    }
    if corrections.is_empty() {
        return previous;
    }
    let mut lines = previous.lines;
    lines.extend(corrections);
    Invoice {
        invoice_id: Invoice::id_for(&fresh.period, &fresh.account, revision),
        revision,
        lines,
        ..fresh
    }
}
