//! A part of one GPU a job may ask for instead of whole GPUs: a share of its time
//! (`250m`: 250 thousandths, as Kubernetes GPU sharing and Alibaba's GPU trace ask) or a MIG
//! instance (`3g` or `3g.40gb`: 3 of the GPU's 7 compute slices). A GPU shared by time-slicing
//! and a GPU cut into MIG instances are different modes: one GPU holds shares of one mode.
//!
//! Both kinds are counted in share units, 7,000 to a GPU, so that a thousandth (7 units) and a
//! seventh (1,000 units) are whole numbers: packing and usage stay integer, and a bill prices
//! a MIG slice at exactly a seventh.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Share units in one whole GPU.
pub const SHARE_UNITS_PER_GPU: u32 = 7000;

/// MIG compute-slice counts NVIDIA's profiles have (1g, 2g, 3g, 4g, 7g).
const MIG_SLICES: [u8; 5] = [1, 2, 3, 4, 7];

/// How a GPU is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShareMode {
    /// Time-sliced (or MPS): thousandths of the GPU.
    Time,
    /// Cut into MIG instances.
    Mig,
}

/// A part of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum GpuShare {
    /// Thousandths of the GPU's time, 1 to 999.
    Milli(u16),
    /// A MIG instance of this many compute slices out of 7.
    Mig(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a GPU share; write thousandths of a GPU (`250m`, 1m to 999m) or a MIG profile (`1g`, `2g`, `3g`, `4g`, `7g`, optionally with its memory: `3g.40gb`)")]
pub struct GpuShareError(pub String);

impl GpuShare {
    /// The share in units of [`SHARE_UNITS_PER_GPU`] to a GPU.
    pub fn units(self) -> u32 {
        match self {
            GpuShare::Milli(m) => u32::from(m) * (SHARE_UNITS_PER_GPU / 1000),
            GpuShare::Mig(slices) => u32::from(slices) * (SHARE_UNITS_PER_GPU / 7),
        }
    }

    pub fn mode(self) -> ShareMode {
        match self {
            GpuShare::Milli(_) => ShareMode::Time,
            GpuShare::Mig(_) => ShareMode::Mig,
        }
    }

    /// The fraction of a GPU, for figures that are not money (fair-share usage, plots).
    pub fn fraction(self) -> f64 {
        f64::from(self.units()) / f64::from(SHARE_UNITS_PER_GPU)
    }

    /// The share of Alibaba's `gpu_milli` column: `None` for a whole GPU (1000).
    pub fn from_milli(milli: u32) -> Result<Option<GpuShare>, GpuShareError> {
        match milli {
            1000 => Ok(None),
            1..=999 => Ok(Some(GpuShare::Milli(milli as u16))),
            _ => Err(GpuShareError(format!("{milli}m"))),
        }
    }
}

impl fmt::Display for GpuShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuShare::Milli(m) => write!(f, "{m}m"),
            GpuShare::Mig(s) => write!(f, "{s}g"),
        }
    }
}

impl FromStr for GpuShare {
    type Err = GpuShareError;
    fn from_str(s: &str) -> Result<Self, GpuShareError> {
        let bad = || GpuShareError(s.to_owned());
        let text = s.trim();
        if let Some(milli) = text.strip_suffix('m') {
            let m: u16 = milli.parse().map_err(|_| bad())?;
            return (1..=999)
                .contains(&m)
                .then_some(GpuShare::Milli(m))
                .ok_or_else(bad);
        }
        // A MIG profile: `3g` or `3g.40gb` (the memory part names the card, not the share).
        let profile = text.split_once('.').map_or(text, |(slices, memory)| {
            if memory.ends_with("gb") && memory[..memory.len() - 2].parse::<u32>().is_ok() {
                slices
            } else {
                ""
            }
        });
        let slices: u8 = profile
            .strip_suffix('g')
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        MIG_SLICES
            .contains(&slices)
            .then_some(GpuShare::Mig(slices))
            .ok_or_else(bad)
    }
}

impl TryFrom<String> for GpuShare {
    type Error = GpuShareError;
    fn try_from(s: String) -> Result<Self, GpuShareError> {
        s.parse()
    }
}

impl From<GpuShare> for String {
    fn from(s: GpuShare) -> String {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_and_print() {
        assert_eq!("250m".parse(), Ok(GpuShare::Milli(250)));
        assert_eq!("3g".parse(), Ok(GpuShare::Mig(3)));
        assert_eq!("3g.40gb".parse(), Ok(GpuShare::Mig(3)));
        assert_eq!(GpuShare::Milli(5).to_string(), "5m");
        assert_eq!(GpuShare::Mig(7).to_string(), "7g");
        for bad in [
            "0m", "1000m", "5g", "0g", "3g.40", "3g.xgb", "0.25", "", "m", "-1m",
        ] {
            assert!(bad.parse::<GpuShare>().is_err(), "{bad}");
        }
    }

    #[test]
    fn units_are_exact_for_thousandths_and_sevenths() {
        assert_eq!(GpuShare::Milli(1).units(), 7);
        assert_eq!(GpuShare::Milli(999).units(), 6993);
        assert_eq!(GpuShare::Mig(1).units() * 7, SHARE_UNITS_PER_GPU);
        assert_eq!(GpuShare::Mig(7).units(), SHARE_UNITS_PER_GPU);
        // 3g + 3g + 1g fill a GPU exactly.
        let three = GpuShare::Mig(3).units();
        assert_eq!(three * 2 + GpuShare::Mig(1).units(), SHARE_UNITS_PER_GPU);
    }

    #[test]
    fn alibaba_milli_maps_whole_gpus_to_none() {
        assert_eq!(GpuShare::from_milli(1000), Ok(None));
        assert_eq!(GpuShare::from_milli(220), Ok(Some(GpuShare::Milli(220))));
        assert!(GpuShare::from_milli(0).is_err());
        assert!(GpuShare::from_milli(1500).is_err());
    }
}
