//! The price book: versions effective from a date, each with GPU-hour prices per model,
//! time-of-use bands in a time zone, the storage price, the MFU weighting, the reservation and
//! idle-capacity policies and the billing model of each account. Amounts are decimal strings
//! in the file; a TOML float is refused, since it would have lost exactness before gpuledger
//! saw it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{Datelike, NaiveDate, TimeZone, Timelike, Weekday};
use chrono_tz::Tz;
use gpuledger_model::config::{
    decimal_from_string, decimals_from_strings, parse_toml, FieldError, PriceBookConfig,
};
use gpuledger_model::{AccountId, ConfigError, Currency, DurationSpec, GpuModel};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How an account's compute is charged: the seed's three models.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BillingModel {
    /// GPUs x hours x unit price. Storage is not billed.
    #[default]
    GpuHours,
    /// GPUs x hours x MFU (clamped to the floor and cap) x unit price. Storage is not billed.
    MfuWeighted,
    /// GPU-hours for compute, and storage apart in TB-days.
    ComputeAndStorage,
}

impl BillingModel {
    pub const ALL: [BillingModel; 3] = [
        BillingModel::GpuHours,
        BillingModel::MfuWeighted,
        BillingModel::ComputeAndStorage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BillingModel::GpuHours => "gpu_hours",
            BillingModel::MfuWeighted => "mfu_weighted",
            BillingModel::ComputeAndStorage => "compute_and_storage",
        }
    }

    pub fn bills_storage(self) -> bool {
        self == BillingModel::ComputeAndStorage
    }
}

impl fmt::Display for BillingModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BillingModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BillingModel::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!("unknown billing model `{s}`; use gpu_hours, mfu_weighted or compute_and_storage")
            })
    }
}

/// Who pays for GPUs that were up but ran no job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdlePolicy {
    /// Nobody: idle capacity is not invoiced.
    #[default]
    None,
    /// A platform overhead invoice, account [`PLATFORM_ACCOUNT`].
    Platform,
    /// Shared among the accounts in proportion to their GPU-seconds on that GPU model.
    Shared,
}

/// The account that carries idle capacity under [`IdlePolicy::Platform`].
pub const PLATFORM_ACCOUNT: &str = "platform";

/// The file: `[[versions]]`, each effective from its date.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceBookFile {
    pub versions: Vec<PriceVersion>,
}

/// One version of the prices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceVersion {
    pub version: String,
    /// In force from local midnight of this date in `time_zone`.
    pub effective_from: NaiveDate,
    pub currency: Currency,
    /// IANA name; bands and the effective date are read in this zone.
    #[serde(default = "utc")]
    pub time_zone: String,
    /// Price of one GPU-hour per GPU model.
    #[serde(deserialize_with = "decimals_from_strings")]
    pub gpu_hour: BTreeMap<GpuModel, Decimal>,
    /// Bands in order; the first that matches an instant applies, else `standard` at 1.
    #[serde(default)]
    pub time_of_use: Vec<Band>,
    #[serde(default)]
    pub storage: Option<StoragePrice>,
    #[serde(default)]
    pub mfu: MfuWeighting,
    #[serde(default)]
    pub reservations: ReservationPolicy,
    #[serde(default)]
    pub idle: IdleSettings,
    #[serde(default)]
    pub models: ModelSelection,
    /// What a job pays for GPU-seconds it held but no exporter measured (a coverage gap).
    #[serde(default)]
    pub coverage: Coverage,
}

/// What a coverage gap (GPUs a job held, by its events, that no exporter measured: node down,
/// exporter missing) is billed as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Coverage {
    /// The allocated GPU-seconds are billed, measured or not (as Slurm and Kubernetes
    /// account): a job is never cheaper for its node's exporter being down.
    #[default]
    Allocation,
    /// Only what was measured is billed; the gap is shown on the invoice, unbilled.
    Telemetry,
}

fn utc() -> String {
    "UTC".into()
}

/// A time-of-use band: days of the week and an hour range, local time, and a multiplier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Band {
    pub name: String,
    /// `mon`..`sun`; empty means every day.
    #[serde(default)]
    pub days: Vec<String>,
    /// `[from, to)` local hours, 0-24; `from > to` wraps midnight (22 to 8). Absent: all day.
    #[serde(default)]
    pub hours: Option<HourRange>,
    #[serde(deserialize_with = "decimal_from_string")]
    pub multiplier: Decimal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HourRange {
    pub from: u32,
    pub to: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoragePrice {
    /// Price of one TB (10^12 bytes) held for one day.
    #[serde(deserialize_with = "decimal_from_string")]
    pub tb_day: Decimal,
    /// How long one scan's figure stands when no later scan follows.
    #[serde(default = "one_day")]
    pub max_hold: DurationSpec,
}

fn one() -> Decimal {
    Decimal::ONE
}

fn one_day() -> DurationSpec {
    DurationSpec::from_secs(86_400)
}

/// The MFU weighting: the factor is MFU clamped to `[floor, cap]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MfuWeighting {
    /// So that holding idle GPUs is never free.
    #[serde(deserialize_with = "decimal_from_string")]
    pub floor: Decimal,
    #[serde(deserialize_with = "decimal_from_string")]
    pub cap: Decimal,
    /// The factor where no MFU was measured: a missing measurement never makes a job cheaper.
    #[serde(default = "one", deserialize_with = "decimal_from_string")]
    pub unmeasured: Decimal,
}

impl Default for MfuWeighting {
    fn default() -> Self {
        MfuWeighting {
            floor: Decimal::new(1, 1),
            cap: Decimal::ONE,
            unmeasured: Decimal::ONE,
        }
    }
}

impl MfuWeighting {
    /// The weighting factor of a measured (or unmeasured) MFU.
    pub fn factor(&self, mfu: Option<Decimal>) -> Decimal {
        match mfu {
            Some(m) => m.max(self.floor).min(self.cap),
            None => self.unmeasured,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationPolicy {
    /// Reserved GPU-hours the reserving account did not use are charged to it.
    pub charge_unused: bool,
    /// Multiplier on the GPU-hour price for unused reserved hours.
    #[serde(default = "one", deserialize_with = "decimal_from_string")]
    pub multiplier: Decimal,
}

impl Default for ReservationPolicy {
    fn default() -> Self {
        ReservationPolicy {
            charge_unused: true,
            multiplier: Decimal::ONE,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleSettings {
    pub policy: IdlePolicy,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSelection {
    #[serde(default = "gpu_hours")]
    pub default: BillingModel,
    #[serde(default)]
    pub accounts: BTreeMap<AccountId, BillingModel>,
}

fn gpu_hours() -> BillingModel {
    BillingModel::GpuHours
}

/// The band an instant falls in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BandAt<'a> {
    pub name: &'a str,
    pub multiplier: Decimal,
}

/// The name of the time outside every band.
pub const STANDARD_BAND: &str = "standard";

/// A validated price book: versions sorted by the instant they come into force.
#[derive(Clone, Debug)]
pub struct PriceBook {
    versions: Vec<(i64, Tz, PriceVersion)>,
}

impl PriceBook {
    /// Parses and validates a price book file; errors name the file, field and line.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Self, ConfigError> {
        let file: PriceBookFile = parse_toml(src, origin)?;
        Self::from_versions(file.versions)
            .map_err(|errors| ConfigError::invalid_in(src, origin, errors))
    }

    /// The one-version book of a cluster config's `[prices]`: flat prices, GPU-hour model.
    pub fn from_cluster_prices(prices: &PriceBookConfig) -> Self {
        let version = PriceVersion {
            version: prices.version.clone(),
            effective_from: prices.effective_from,
            currency: prices.currency,
            time_zone: utc(),
            gpu_hour: prices.gpu_hour.clone(),
            time_of_use: Vec::new(),
            storage: None,
            mfu: MfuWeighting::default(),
            reservations: ReservationPolicy::default(),
            idle: IdleSettings::default(),
            models: ModelSelection::default(),
            coverage: Coverage::default(),
        };
        Self::from_versions(vec![version]).expect("cluster prices are validated with the config")
    }

    pub fn from_versions(versions: Vec<PriceVersion>) -> Result<Self, Vec<FieldError>> {
        let errors = validate(&versions);
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut versions: Vec<(i64, Tz, PriceVersion)> = versions
            .into_iter()
            .map(|v| {
                let tz: Tz = v.time_zone.parse().expect("validated");
                (local_midnight(tz, v.effective_from), tz, v)
            })
            .collect();
        versions.sort_by_key(|(from, _, _)| *from);
        Ok(PriceBook { versions })
    }

    pub fn versions(&self) -> impl Iterator<Item = &PriceVersion> {
        self.versions.iter().map(|(_, _, v)| v)
    }

    /// The currency of every version (validation makes them agree).
    pub fn currency(&self) -> Currency {
        self.versions[0].2.currency
    }

    /// The version in force at `secs` (Unix seconds), with its zone. Before the first version
    /// there is no other price, so the first one prices that time too: a book whose first
    /// version takes effect at local midnight of the 1st west of UTC would otherwise leave the
    /// first hours of the UTC month unpriced, and the whole month unbillable.
    pub fn at(&self, secs: i64) -> Result<(&PriceVersion, Tz)> {
        let (_, tz, v) = self
            .versions
            .iter()
            .rev()
            .find(|(from, _, _)| *from <= secs)
            .unwrap_or(&self.versions[0]);
        Ok((v, *tz))
    }

    /// `[from, to)` cut where a version takes effect: each piece with the version in force over
    /// it, in order.
    pub fn pieces(&self, from: i64, to: i64) -> Vec<(i64, i64, &PriceVersion)> {
        let mut out = Vec::new();
        for (i, (start, _, version)) in self.versions.iter().enumerate() {
            // The first version also covers what came before it (see `at`).
            let start = if i == 0 { i64::MIN } else { *start };
            let end = self
                .versions
                .get(i + 1)
                .map_or(i64::MAX, |(next, _, _)| *next);
            let (a, b) = (from.max(start), to.min(end));
            if a < b {
                out.push((a, b, version));
            }
        }
        out
    }

    /// The version in force at `secs` and the GPU-hour price of `model` in it.
    pub fn gpu_hour_price(&self, secs: i64, model: GpuModel) -> Result<(&PriceVersion, Decimal)> {
        let (v, _) = self.at(secs)?;
        let price = v
            .gpu_hour
            .get(&model)
            .copied()
            .ok_or_else(|| Error::NoPrice {
                version: v.version.clone(),
                model,
            })?;
        Ok((v, price))
    }
}

impl PriceVersion {
    /// The billing model of `account` under this version.
    pub fn model_of(&self, account: &AccountId) -> BillingModel {
        self.models
            .accounts
            .get(account)
            .copied()
            .unwrap_or(self.models.default)
    }

    /// The band in force at `secs`, read in `tz`.
    pub fn band_at(&self, tz: Tz, secs: i64) -> BandAt<'_> {
        let local = tz.timestamp_opt(secs, 0).single().unwrap_or_else(|| {
            tz.from_utc_datetime(
                &chrono::DateTime::from_timestamp(secs, 0)
                    .unwrap_or_default()
                    .naive_utc(),
            )
        });
        let (day, hour) = (local.weekday(), local.hour());
        self.time_of_use
            .iter()
            .find(|b| b.matches(day, hour))
            .map(|b| BandAt {
                name: &b.name,
                multiplier: b.multiplier,
            })
            .unwrap_or(BandAt {
                name: STANDARD_BAND,
                multiplier: Decimal::ONE,
            })
    }
}

impl Band {
    fn matches(&self, day: Weekday, hour: u32) -> bool {
        let day_ok =
            self.days.is_empty() || self.days.iter().any(|d| parse_weekday(d) == Some(day));
        let hour_ok = match self.hours {
            None => true,
            Some(HourRange { from, to }) if from < to => (from..to).contains(&hour),
            Some(HourRange { from, to }) => hour >= from || hour < to,
        };
        day_ok && hour_ok
    }
}

fn parse_weekday(s: &str) -> Option<Weekday> {
    Some(match s {
        "mon" => Weekday::Mon,
        "tue" => Weekday::Tue,
        "wed" => Weekday::Wed,
        "thu" => Weekday::Thu,
        "fri" => Weekday::Fri,
        "sat" => Weekday::Sat,
        "sun" => Weekday::Sun,
        _ => return None,
    })
}

/// Unix seconds of local midnight starting `date` in `tz` (the first instant of that date).
pub fn local_midnight(tz: Tz, date: NaiveDate) -> i64 {
    let midnight = date.and_hms_opt(0, 0, 0).expect("midnight exists");
    match tz.from_local_datetime(&midnight).earliest() {
        Some(t) => t.timestamp(),
        // A zone that skips midnight: the first hour after it.
        None => tz
            .from_local_datetime(&(midnight + chrono::Duration::hours(1)))
            .earliest()
            .map(|t| t.timestamp())
            .unwrap_or_else(|| midnight.and_utc().timestamp()),
    }
}

fn validate(versions: &[PriceVersion]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut err = |field: String, message: String| errors.push(FieldError::new(field, message));
    if versions.is_empty() {
        err(
            "versions".into(),
            "at least one `[[versions]]` is needed".into(),
        );
    }
    let mut names = std::collections::HashSet::new();
    let mut dates = std::collections::HashSet::new();
    for (i, v) in versions.iter().enumerate() {
        let at = |f: &str| format!("versions[{i}].{f}");
        if v.version.trim().is_empty() {
            err(at("version"), "must not be empty".into());
        }
        if !names.insert(&v.version) {
            err(
                at("version"),
                format!("version `{}` is defined twice", v.version),
            );
        }
        if !dates.insert(v.effective_from) {
            err(
                at("effective_from"),
                format!(
                    "another version is already effective from {}",
                    v.effective_from
                ),
            );
        }
        if v.currency != versions[0].currency {
            err(
                at("currency"),
                format!(
                    "{} differs from the first version's {}; one price book bills in one currency",
                    v.currency, versions[0].currency
                ),
            );
        }
        if v.time_zone.parse::<Tz>().is_err() {
            err(
                at("time_zone"),
                format!(
                    "`{}` is not an IANA time zone, e.g. \"Asia/Shanghai\" or \"UTC\"",
                    v.time_zone
                ),
            );
        }
        if v.gpu_hour.is_empty() {
            err(
                at("gpu_hour"),
                "at least one GPU model needs a price".into(),
            );
        }
        for (model, price) in &v.gpu_hour {
            if price.is_sign_negative() {
                err(
                    at(&format!("gpu_hour.{model}")),
                    format!("{price} is negative; a price is 0 or more"),
                );
            }
        }
        for (j, band) in v.time_of_use.iter().enumerate() {
            let bat = |f: &str| at(&format!("time_of_use[{j}].{f}"));
            if band.name.trim().is_empty() || band.name == STANDARD_BAND {
                err(
                    bat("name"),
                    format!("must be a name other than `{STANDARD_BAND}`"),
                );
            }
            if band.multiplier.is_sign_negative() {
                err(
                    bat("multiplier"),
                    format!("{} is negative", band.multiplier),
                );
            }
            for d in &band.days {
                if parse_weekday(d).is_none() {
                    err(
                        bat("days"),
                        format!("`{d}` is not a day; use mon, tue, wed, thu, fri, sat, sun"),
                    );
                }
            }
            if let Some(h) = band.hours {
                if h.from > 23 || h.to > 24 || h.from == h.to {
                    err(
                        bat("hours"),
                        format!(
                            "{}-{} is not an hour range; use from 0-23 and to 1-24, different",
                            h.from, h.to
                        ),
                    );
                }
            }
        }
        if let Some(s) = &v.storage {
            if s.tb_day.is_sign_negative() {
                err(at("storage.tb_day"), format!("{} is negative", s.tb_day));
            }
        }
        let m = &v.mfu;
        if m.floor.is_sign_negative() || m.cap > Decimal::ONE || m.floor > m.cap {
            err(
                at("mfu"),
                format!(
                    "need 0 <= floor <= cap <= 1; got floor {} and cap {}",
                    m.floor, m.cap
                ),
            );
        }
        if m.unmeasured < m.floor || m.unmeasured > m.cap {
            err(
                at("mfu.unmeasured"),
                format!("{} is outside [floor, cap]", m.unmeasured),
            );
        }
        if v.reservations.multiplier.is_sign_negative() {
            err(
                at("reservations.multiplier"),
                format!("{} is negative", v.reservations.multiplier),
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const BOOK: &str = r#"
[[versions]]
version = "2026-06"
effective_from = "2026-06-01"
currency = "CNY"
time_zone = "Asia/Shanghai"
gpu_hour = { h100-sxm = "10.00", a100 = "5.00" }

[[versions.time_of_use]]
name = "off-peak-night"
hours = { from = 22, to = 8 }
multiplier = "0.50"

[[versions.time_of_use]]
name = "weekend"
days = ["sat", "sun"]
multiplier = "0.70"
"#;

    #[test]
    fn bands_are_read_in_the_books_time_zone() {
        let book = PriceBook::from_toml_str(BOOK, "prices.toml").unwrap();
        // 2026-06-03 (Wednesday) 14:00 UTC is 22:00 in Shanghai: night.
        let t = NaiveDate::from_ymd_opt(2026, 6, 3)
            .unwrap()
            .and_hms_opt(14, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp();
        let (v, tz) = book.at(t).unwrap();
        assert_eq!(v.band_at(tz, t).name, "off-peak-night");
        assert_eq!(v.band_at(tz, t - 3600).name, STANDARD_BAND);
        // Saturday 2026-06-06 04:00 UTC is 12:00 local: weekend.
        let sat = NaiveDate::from_ymd_opt(2026, 6, 6)
            .unwrap()
            .and_hms_opt(4, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp();
        assert_eq!(v.band_at(tz, sat).name, "weekend");
    }

    #[test]
    fn a_float_price_is_refused_with_its_line() {
        let src = BOOK.replace("h100-sxm = \"10.00\"", "h100-sxm = 10.0");
        let e = PriceBook::from_toml_str(&src, "prices.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("prices.toml:7:"), "{e}");
    }

    #[test]
    fn invalid_values_name_field_and_line() {
        let src = BOOK
            .replace("to = 8", "to = 30")
            .replace("Asia/Shanghai", "Mars/Olympus");
        let e = PriceBook::from_toml_str(&src, "prices.toml").unwrap_err();
        let fields: Vec<(String, Option<usize>)> = e
            .field_errors()
            .iter()
            .map(|f| (f.field.clone(), f.line))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("versions[0].time_zone".to_string(), Some(6)),
                ("versions[0].time_of_use[0].hours".to_string(), Some(11)),
            ]
        );
    }

    #[test]
    fn the_version_in_force_is_the_latest_started() {
        let src = format!(
            "{BOOK}\n[[versions]]\nversion = \"2026-07\"\neffective_from = \"2026-07-01\"\ncurrency = \"CNY\"\ngpu_hour = {{ h100-sxm = \"12.00\" }}\n"
        );
        let book = PriceBook::from_toml_str(&src, "p.toml").unwrap();
        let june = NaiveDate::from_ymd_opt(2026, 6, 30)
            .unwrap()
            .and_hms_opt(23, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp();
        assert_eq!(
            book.gpu_hour_price(june, GpuModel::H100Sxm).unwrap().1,
            Decimal::new(1000, 2)
        );
        assert_eq!(
            book.gpu_hour_price(june + 3600, GpuModel::H100Sxm)
                .unwrap()
                .1,
            Decimal::new(1200, 2)
        );
        // Before the first version, the first prices (there is no earlier price).
        assert_eq!(book.at(0).unwrap().0.version, "2026-06");
    }
}
