//! Unit types: usage in integer GPU-seconds, sizes in bytes, durations written as `14d`, `4h`.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Sub};
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Usage of GPUs, in whole GPU-seconds. Usage stays an integer until it is priced.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct GpuSeconds(pub i64);

impl GpuSeconds {
    pub const ZERO: GpuSeconds = GpuSeconds(0);

    /// GPU-hours as an exact decimal (no float on the way to money).
    pub fn as_gpu_hours(self) -> Decimal {
        Decimal::from(self.0) / Decimal::from(3600)
    }

    /// GPU-hours as a float, for display and for fair-share priority only.
    pub fn as_gpu_hours_f64(self) -> f64 {
        self.0 as f64 / 3600.0
    }
}

impl Add for GpuSeconds {
    type Output = GpuSeconds;
    fn add(self, rhs: GpuSeconds) -> GpuSeconds {
        GpuSeconds(self.0 + rhs.0)
    }
}

impl AddAssign for GpuSeconds {
    fn add_assign(&mut self, rhs: GpuSeconds) {
        self.0 += rhs.0;
    }
}

impl Sub for GpuSeconds {
    type Output = GpuSeconds;
    fn sub(self, rhs: GpuSeconds) -> GpuSeconds {
        GpuSeconds(self.0 - rhs.0)
    }
}

impl Sum for GpuSeconds {
    fn sum<I: Iterator<Item = GpuSeconds>>(iter: I) -> GpuSeconds {
        GpuSeconds(iter.map(|g| g.0).sum())
    }
}

impl fmt::Display for GpuSeconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} GPU-s", self.0)
    }
}

/// Why a unit string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a valid {what}: {hint}")]
pub struct UnitError {
    pub input: String,
    pub what: &'static str,
    pub hint: &'static str,
}

/// A size in bytes. Written as an integer or as `500GB`, `2TB`, `1.5TiB` (SI and binary units).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(try_from = "SizeRepr", into = "String")]
pub struct ByteSize(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for ByteSize {
    type Error = UnitError;
    fn try_from(repr: SizeRepr) -> Result<Self, UnitError> {
        match repr {
            SizeRepr::Int(n) => Ok(ByteSize(n)),
            SizeRepr::Text(s) => s.parse(),
        }
    }
}

impl From<ByteSize> for String {
    fn from(size: ByteSize) -> String {
        size.to_string()
    }
}

const SIZE_HINT: &str =
    "write a number and a unit: B, KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB";

impl FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let err = || UnitError {
            input: input.to_owned(),
            what: "size",
            hint: SIZE_HINT,
        };
        let text = input.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: Decimal = number.parse().map_err(|_| err())?;
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            "PB" => 1_000_000_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "PiB" => 1 << 50,
            _ => return Err(err()),
        };
        let bytes = number
            .checked_mul(Decimal::from(multiplier))
            .ok_or_else(err)?;
        if bytes.fract() != Decimal::ZERO {
            return Err(err());
        }
        u64::try_from(bytes).map(ByteSize).map_err(|_| err())
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 9] = [
            ("PB", 1_000_000_000_000_000),
            ("TB", 1_000_000_000_000),
            ("GB", 1_000_000_000),
            ("MB", 1_000_000),
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KB", 1_000),
            ("KiB", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// A duration written with a unit: `90s`, `30m`, `4h`, `14d`, `2w`, or combined: `1d12h`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    pub fn from_secs(secs: u64) -> Self {
        DurationSpec(Duration::from_secs(secs))
    }

    pub fn as_secs(self) -> u64 {
        self.0.as_secs()
    }
}

impl TryFrom<String> for DurationSpec {
    type Error = UnitError;
    fn try_from(s: String) -> Result<Self, UnitError> {
        s.parse()
    }
}

impl From<DurationSpec> for String {
    fn from(d: DurationSpec) -> String {
        d.to_string()
    }
}

/// The longest duration accepted (100 years of 365 days, in seconds): any duration, times any
/// GPU count, still fits the signed seconds that time arithmetic uses.
pub const MAX_DURATION_S: u64 = 100 * 365 * 86_400;

impl FromStr for DurationSpec {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let err = || UnitError {
            input: input.to_owned(),
            what: "duration",
            hint: "write whole numbers with units s, m, h, d or w, such as 90s, 4h, 14d or 1d12h",
        };
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in input.trim().chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3_600,
                'd' => 86_400,
                'w' => 7 * 86_400,
                _ => return Err(err()),
            };
            let n: u64 = digits.parse().map_err(|_| err())?;
            total = n
                .checked_mul(unit)
                .and_then(|s| total.checked_add(s))
                .ok_or_else(err)?;
            digits.clear();
        }
        if !digits.is_empty() || input.trim().is_empty() {
            return Err(err());
        }
        if total > MAX_DURATION_S {
            return Err(UnitError {
                input: input.to_owned(),
                what: "duration",
                hint: "durations are at most 100 years (5218w)",
            });
        }
        Ok(DurationSpec::from_secs(total))
    }
}

impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut secs = self.as_secs();
        if secs == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            if secs >= size {
                write!(f, "{}{unit}", secs / size)?;
                secs %= size;
            }
        }
        Ok(())
    }
}

/// A duration that may be under a second (`500ms`, `2s`).
#[derive(Clone, Copy, Debug)]
pub struct DurationSpecMs(pub Duration);

impl FromStr for DurationSpecMs {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(ms) = s.strip_suffix("ms") {
            return ms
                .parse::<u64>()
                .map(|v| DurationSpecMs(Duration::from_millis(v)))
                .map_err(|_| format!("`{s}` is not a number of milliseconds"));
        }
        s.parse::<DurationSpec>()
            .map(|d| DurationSpecMs(Duration::from_secs(d.as_secs())))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_si_and_binary_units() {
        assert_eq!("2TB".parse::<ByteSize>(), Ok(ByteSize(2_000_000_000_000)));
        assert_eq!(
            "1.5TiB".parse::<ByteSize>(),
            Ok(ByteSize(1_649_267_441_664))
        );
        assert_eq!("512".parse::<ByteSize>(), Ok(ByteSize(512)));
        assert!("2 XB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(50_000_000_000_000).to_string(), "50TB");
    }

    #[test]
    fn durations_parse_and_print_back() {
        let d: DurationSpec = "1d12h".parse().unwrap();
        assert_eq!(d.as_secs(), 129_600);
        assert_eq!(d.to_string(), "1d12h");
        assert_eq!("2w".parse::<DurationSpec>().unwrap().as_secs(), 1_209_600);
        assert!("12".parse::<DurationSpec>().is_err());
        assert!("4 hours".parse::<DurationSpec>().is_err());
    }

    #[test]
    fn gpu_hours_are_exact_decimals() {
        assert_eq!(
            GpuSeconds(5400).as_gpu_hours().normalize().to_string(),
            "1.5"
        );
    }
}
