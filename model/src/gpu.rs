//! GPU models and the figures MFU needs: peak dense BF16 FLOP/s and the SM clock that peak is
//! rated at (so the tensor-pipe proxy can be scaled by the clock actually sampled). Models
//! without BF16 (V100, T4, P100) are rated at their dense FP16 peak, the precision they train
//! in: on tensor cores for V100 and T4, on the CUDA cores for P100, which has none.

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
    /// V100 SXM2 with 16 GB (Alibaba's traces call it `V100M16`).
    V100_16,
    /// V100 SXM2 with 32 GB (`V100M32`).
    V100_32,
    /// P100 PCIe, 16 GB.
    P100,
    T4,
    A10,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown GPU model `{0}`; known: a100, h100-sxm (or h100), h100-pcie, h200, v100-16gb, \
     v100-32gb, p100, t4, a10"
)]
pub struct UnknownGpuModel(pub String);

impl GpuModel {
    pub const ALL: [GpuModel; 9] = [
        GpuModel::A100,
        GpuModel::H100Sxm,
        GpuModel::H100Pcie,
        GpuModel::H200,
        GpuModel::V100_16,
        GpuModel::V100_32,
        GpuModel::P100,
        GpuModel::T4,
        GpuModel::A10,
    ];

    /// The short name used in config files, labels and Parquet columns.
    pub fn key(self) -> &'static str {
        match self {
            GpuModel::A100 => "a100",
            GpuModel::H100Sxm => "h100-sxm",
            GpuModel::H100Pcie => "h100-pcie",
            GpuModel::H200 => "h200",
            GpuModel::V100_16 => "v100-16gb",
            GpuModel::V100_32 => "v100-32gb",
            GpuModel::P100 => "p100",
            GpuModel::T4 => "t4",
            GpuModel::A10 => "a10",
        }
    }

    /// The name NVML reports, as dcgm-exporter's `modelName` label carries it.
    pub fn marketing_name(self) -> &'static str {
        match self {
            GpuModel::A100 => "NVIDIA A100-SXM4-80GB",
            GpuModel::H100Sxm => "NVIDIA H100 80GB HBM3",
            GpuModel::H100Pcie => "NVIDIA H100 PCIe",
            GpuModel::H200 => "NVIDIA H200",
            GpuModel::V100_16 => "Tesla V100-SXM2-16GB",
            GpuModel::V100_32 => "Tesla V100-SXM2-32GB",
            GpuModel::P100 => "Tesla P100-PCIE-16GB",
            GpuModel::T4 => "Tesla T4",
            GpuModel::A10 => "NVIDIA A10",
        }
    }

    /// Peak dense BF16 tensor throughput in TFLOP/s (not the 2:4-sparse figure); FP16 for the
    /// models without BF16 (see the module docs).
    pub fn peak_dense_bf16_tflops(self) -> f64 {
        match self {
            GpuModel::A100 => 312.0,
            GpuModel::H100Sxm => 989.0,
            GpuModel::H100Pcie => 756.0,
            GpuModel::H200 => 989.0,
            GpuModel::V100_16 | GpuModel::V100_32 => 125.0,
            GpuModel::P100 => 18.7,
            GpuModel::T4 => 65.0,
            GpuModel::A10 => 125.0,
        }
    }

    pub fn peak_dense_bf16_flops(self) -> f64 {
        self.peak_dense_bf16_tflops() * 1e12
    }

    /// The SM clock at which the peak above is computed (SMs x FLOP/clock x this clock).
    pub fn rated_sm_clock_mhz(self) -> u32 {
        match self {
            GpuModel::A100 => 1410,
            GpuModel::H100Sxm | GpuModel::H200 => 1830,
            GpuModel::H100Pcie => 1620,
            GpuModel::V100_16 | GpuModel::V100_32 => 1530,
            GpuModel::P100 => 1329,
            GpuModel::T4 => 1590,
            GpuModel::A10 => 1695,
        }
    }

    /// The highest SM clock the model runs at (its maximum boost): a sample above it is not a
    /// reading of this GPU.
    pub fn max_sm_clock_mhz(self) -> u32 {
        match self {
            GpuModel::A100 => 1410,
            GpuModel::H100Sxm | GpuModel::H200 => 1980,
            GpuModel::H100Pcie => 1755,
            GpuModel::V100_16 | GpuModel::V100_32 => 1530,
            GpuModel::P100 => 1329,
            GpuModel::T4 => 1590,
            GpuModel::A10 => 1695,
        }
    }

    /// Device memory as NVML reports its total.
    pub fn memory_bytes(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            GpuModel::A100 => 81_920 * MIB,
            GpuModel::H100Sxm | GpuModel::H100Pcie => 81_559 * MIB,
            GpuModel::H200 => 143_771 * MIB,
            GpuModel::V100_16 => 16_160 * MIB,
            GpuModel::V100_32 => 32_510 * MIB,
            GpuModel::P100 => 16_280 * MIB,
            GpuModel::T4 => 15_360 * MIB,
            GpuModel::A10 => 23_028 * MIB,
        }
    }

    /// Board power limit in watts.
    pub fn power_limit_w(self) -> f32 {
        match self {
            GpuModel::A100 => 400.0,
            GpuModel::H100Sxm | GpuModel::H200 => 700.0,
            GpuModel::H100Pcie => 350.0,
            GpuModel::V100_16 | GpuModel::V100_32 => 300.0,
            GpuModel::P100 => 250.0,
            GpuModel::T4 => 70.0,
            GpuModel::A10 => 150.0,
        }
    }

    /// Recognises NVML's marketing names (`NVIDIA H100 80GB HBM3`) as well as the short keys.
    /// A variant with other figures (V100S, A10G) is not taken for its namesake.
    pub fn from_marketing_name(name: &str) -> Option<GpuModel> {
        let upper = name.to_ascii_uppercase();
        let word = |w: &str| {
            upper
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|t| t == w)
        };
        if word("V100") {
            Some(if word("32GB") {
                GpuModel::V100_32
            } else {
                GpuModel::V100_16
            })
        } else if word("P100") {
            Some(GpuModel::P100)
        } else if word("T4") {
            Some(GpuModel::T4)
        } else if word("A10") {
            Some(GpuModel::A10)
        } else if upper.contains("H200") {
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
            "v100-16gb" => Ok(GpuModel::V100_16),
            "v100-32gb" => Ok(GpuModel::V100_32),
            "p100" => Ok(GpuModel::P100),
            "t4" => Ok(GpuModel::T4),
            "a10" => Ok(GpuModel::A10),
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

/// The type of GPU a job asks for and a node offers, as Slurm's GRES type (`gpu:a100:8`) or a
/// Kueue flavor: a model's key, or a name a site (or a trace) gives GPUs of its own. Scheduling
/// matches types exactly; prices and MFU go by the model. A name that is a model's key or alias,
/// in any case (`A100`, `h100`), is that model's key, so `h100` and `h100-sxm` are one type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuType(Box<str>);

/// Most characters in a GPU type's name.
pub const MAX_GPU_TYPE_LEN: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a GPU type: use 1 to 32 letters, digits, `.`, `_` and `-`, starting with a \
     letter or digit"
)]
pub struct InvalidGpuType(pub String);

impl GpuType {
    pub fn new(name: &str) -> Result<GpuType, InvalidGpuType> {
        let name = name.trim();
        if let Ok(model) = name.to_ascii_lowercase().parse::<GpuModel>() {
            return Ok(GpuType::from(model));
        }
        let well_formed = (1..=MAX_GPU_TYPE_LEN).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if well_formed {
            Ok(GpuType(name.into()))
        } else {
            Err(InvalidGpuType(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The model this type is the key of, if it is one.
    pub fn model(&self) -> Option<GpuModel> {
        self.0.parse().ok()
    }
}

impl From<GpuModel> for GpuType {
    fn from(model: GpuModel) -> GpuType {
        GpuType(model.key().into())
    }
}

impl FromStr for GpuType {
    type Err = InvalidGpuType;
    fn from_str(s: &str) -> Result<Self, InvalidGpuType> {
        GpuType::new(s)
    }
}

impl TryFrom<String> for GpuType {
    type Error = InvalidGpuType;
    fn try_from(s: String) -> Result<Self, InvalidGpuType> {
        GpuType::new(&s)
    }
}

impl From<GpuType> for String {
    fn from(t: GpuType) -> String {
        t.0.into()
    }
}

impl fmt::Display for GpuType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_the_dense_figures() {
        assert_eq!(GpuModel::H100Sxm.peak_dense_bf16_tflops(), 989.0);
        assert_eq!(GpuModel::A100.peak_dense_bf16_tflops(), 312.0);
        assert_eq!(GpuModel::H200.peak_dense_bf16_tflops(), 989.0);
        assert_eq!(GpuModel::A10.peak_dense_bf16_tflops(), 125.0);
    }

    #[test]
    fn names_nvml_reports_are_recognised_and_variants_are_not() {
        for (name, model) in [
            ("Tesla V100-SXM2-16GB", Some(GpuModel::V100_16)),
            ("Tesla V100-PCIE-32GB", Some(GpuModel::V100_32)),
            ("Tesla P100-PCIE-16GB", Some(GpuModel::P100)),
            ("Tesla T4", Some(GpuModel::T4)),
            ("NVIDIA A10", Some(GpuModel::A10)),
            ("NVIDIA A100-SXM4-80GB", Some(GpuModel::A100)),
            ("NVIDIA A10G", None),
            ("Tesla V100S-PCIE-32GB", None),
            ("NVIDIA L4", None),
        ] {
            assert_eq!(GpuModel::from_marketing_name(name), model, "{name}");
        }
    }

    #[test]
    fn names_round_trip() {
        for m in GpuModel::ALL {
            assert_eq!(m.key().parse::<GpuModel>(), Ok(m));
            assert_eq!(GpuModel::from_marketing_name(m.marketing_name()), Some(m));
        }
    }

    #[test]
    fn a_gpu_type_is_a_models_key_or_a_sites_own_name() {
        let t = |s: &str| GpuType::new(s).map(|t| t.to_string());
        assert_eq!(t("h100").unwrap(), "h100-sxm");
        assert_eq!(t("A100").unwrap(), "a100");
        assert_eq!(t(" t4 ").unwrap(), "t4");
        assert_eq!(GpuType::new("A100").unwrap().model(), Some(GpuModel::A100));
        // Names a site or a trace gives its own GPUs are kept as written, case included.
        assert_eq!(t("G2").unwrap(), "G2");
        assert_eq!(t("a100_80g").unwrap(), "a100_80g");
        assert_eq!(GpuType::new("G2").unwrap().model(), None);
        assert_ne!(GpuType::new("G2"), GpuType::new("g2"));
        for bad in ["", "-x", ".x", "a b", "a:b", "ü", &"x".repeat(33)] {
            assert!(GpuType::new(bad).is_err(), "{bad:?} taken");
        }
        assert!(GpuType::new(&"x".repeat(32)).is_ok());
        let json: Result<GpuType, _> = serde_json::from_str("\"a/b\"");
        assert!(json.is_err());
    }
}
