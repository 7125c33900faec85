//! GPU models and the figures MFU needs: peak dense BF16 FLOP/s and the SM clock that peak is
//! rated at (so the tensor-pipe proxy can be scaled by the clock actually sampled).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A GPU model gpuledger knows the peak of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum GpuModel {
    A100,
    H100Sxm,
    H100Pcie,
    H200,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model `{0}`; known: a100, h100-sxm (or h100), h100-pcie, h200")]
pub struct UnknownGpuModel(pub String);

impl GpuModel {
    pub const ALL: [GpuModel; 4] = [
        GpuModel::A100,
        GpuModel::H100Sxm,
        GpuModel::H100Pcie,
        GpuModel::H200,
    ];

    /// The short name used in config files, labels and Parquet columns.
    pub fn key(self) -> &'static str {
        match self {
            GpuModel::A100 => "a100",
            GpuModel::H100Sxm => "h100-sxm",
            GpuModel::H100Pcie => "h100-pcie",
            GpuModel::H200 => "h200",
        }
    }

    /// The name NVML reports, as dcgm-exporter's `modelName` label carries it.
    pub fn marketing_name(self) -> &'static str {
        match self {
            GpuModel::A100 => "NVIDIA A100-SXM4-80GB",
            GpuModel::H100Sxm => "NVIDIA H100 80GB HBM3",
            GpuModel::H100Pcie => "NVIDIA H100 PCIe",
            GpuModel::H200 => "NVIDIA H200",
        }
    }

    /// Peak dense BF16 tensor throughput in TFLOP/s (not the 2:4-sparse figure).
    pub fn peak_dense_bf16_tflops(self) -> u32 {
        match self {
            GpuModel::A100 => 312,
            GpuModel::H100Sxm => 989,
            GpuModel::H100Pcie => 756,
            GpuModel::H200 => 989,
        }
    }

    pub fn peak_dense_bf16_flops(self) -> f64 {
        f64::from(self.peak_dense_bf16_tflops()) * 1e12
    }

    /// The SM clock at which the peak above is computed (SMs x FLOP/clock x this clock).
    pub fn rated_sm_clock_mhz(self) -> u32 {
        match self {
            GpuModel::A100 => 1410,
            GpuModel::H100Sxm | GpuModel::H200 => 1830,
            GpuModel::H100Pcie => 1620,
        }
    }

    /// The highest SM clock the model runs at (its maximum boost): a sample above it is not a
    /// reading of this GPU.
    pub fn max_sm_clock_mhz(self) -> u32 {
        match self {
            GpuModel::A100 => 1410,
            GpuModel::H100Sxm | GpuModel::H200 => 1980,
            GpuModel::H100Pcie => 1755,
        }
    }

    /// Device memory as NVML reports its total.
    pub fn memory_bytes(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            GpuModel::A100 => 81_920 * MIB,
            GpuModel::H100Sxm | GpuModel::H100Pcie => 81_559 * MIB,
            GpuModel::H200 => 143_771 * MIB,
        }
    }

    /// Board power limit in watts.
    pub fn power_limit_w(self) -> f32 {
        match self {
            GpuModel::A100 => 400.0,
            GpuModel::H100Sxm | GpuModel::H200 => 700.0,
            GpuModel::H100Pcie => 350.0,
        }
    }

    /// Recognises NVML's marketing names (`NVIDIA H100 80GB HBM3`) as well as the short keys.
    pub fn from_marketing_name(name: &str) -> Option<GpuModel> {
        let upper = name.to_ascii_uppercase();
        if upper.contains("H200") {
            Some(GpuModel::H200)
        } else if upper.contains("H100") && upper.contains("PCIE") {
            Some(GpuModel::H100Pcie)
        } else if upper.contains("H100") {
            Some(GpuModel::H100Sxm)
        } else if upper.contains("A100") {
            Some(GpuModel::A100)
        } else {
            None
        }
    }
}

impl FromStr for GpuModel {
    type Err = UnknownGpuModel;
    fn from_str(s: &str) -> Result<Self, UnknownGpuModel> {
        match s {
            "a100" => Ok(GpuModel::A100),
            "h100" | "h100-sxm" => Ok(GpuModel::H100Sxm),
            "h100-pcie" => Ok(GpuModel::H100Pcie),
            "h200" => Ok(GpuModel::H200),
            _ => Err(UnknownGpuModel(s.to_owned())),
        }
    }
}

impl TryFrom<String> for GpuModel {
    type Error = UnknownGpuModel;
    fn try_from(s: String) -> Result<Self, UnknownGpuModel> {
        s.parse()
    }
}

impl From<GpuModel> for String {
    fn from(m: GpuModel) -> String {
        m.key().to_owned()
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_the_dense_figures() {
        assert_eq!(GpuModel::H100Sxm.peak_dense_bf16_tflops(), 989);
        assert_eq!(GpuModel::A100.peak_dense_bf16_tflops(), 312);
        assert_eq!(GpuModel::H200.peak_dense_bf16_tflops(), 989);
    }

    #[test]
    fn names_round_trip() {
        for m in GpuModel::ALL {
            assert_eq!(m.key().parse::<GpuModel>(), Ok(m));
            assert_eq!(GpuModel::from_marketing_name(m.marketing_name()), Some(m));
        }
    }
}
