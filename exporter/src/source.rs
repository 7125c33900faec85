//! The trait every GPU source implements, and how a reading becomes a sample row.

use gpuledger_model::sample::SampleRef;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "the NVIDIA driver's library {library} could not be loaded ({detail}); \
         on a node without NVIDIA GPUs use `--source synthetic`, or `--source dcgm-exporter` to read an existing dcgm-exporter"
    )]
    DriverMissing {
        library: &'static str,
        detail: String,
    },
    #[error("NVML call {call} failed for GPU {gpu:?}: {detail}")]
    Nvml {
        call: &'static str,
        gpu: Option<u32>,
        detail: String,
    },
    #[error("scraping {url}: {message}")]
    Scrape { url: String, message: String },
    #[error("GPU model `{0}` is not known to gpuledger (its peak FLOP/s are needed for MFU)")]
    UnknownModel(String),
}

pub type Result<T, E = SourceError> = std::result::Result<T, E>;

/// A GPU (or MIG instance) a source reports on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    pub index: u16,
    pub uuid: String,
    pub model: GpuModel,
    /// `PROFILE/ID` of a MIG instance (`1g.10gb/3`).
    pub mig_instance: Option<String>,
    /// The PCI address (`00000000:18:00.0`), empty where the source does not say.
    pub pci_bus_id: String,
}

impl GpuDevice {
    /// A MIG instance's profile and GPU instance id, as dcgm-exporter's `GPU_I_PROFILE` and
    /// `GPU_I_ID` labels.
    pub fn mig_profile_and_id(&self) -> Option<(&str, &str)> {
        let m = self.mig_instance.as_deref()?;
        Some(m.rsplit_once('/').unwrap_or((m, "")))
    }
}

/// One reading of one GPU. `None`: not measured by this source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    pub index: u16,
    pub gpu_util_pct: Option<f32>,
    pub sm_active: Option<f32>,
    pub tensor_active: Option<f32>,
    pub dram_active: Option<f32>,
    pub sm_clock_mhz: Option<u32>,
    /// Ratio of time the graphics (compute) engine was active, 0-1 (`PROF_GR_ENGINE_ACTIVE`).
    pub gr_engine_active: Option<f32>,
    /// Percent of time device memory was read or written (`DEV_MEM_COPY_UTIL`).
    pub mem_copy_util_pct: Option<f32>,
    pub mem_clock_mhz: Option<u32>,
    /// PCIe and NVLink traffic, bytes per second (`PROF_PCIE_*_BYTES`, `PROF_NVLINK_*_BYTES`).
    pub pcie_tx_bytes_per_s: Option<f64>,
    pub pcie_rx_bytes_per_s: Option<f64>,
    pub nvlink_tx_bytes_per_s: Option<f64>,
    pub nvlink_rx_bytes_per_s: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_w: Option<f32>,
    /// Energy used since the previous reading, in joules.
    pub energy_j: Option<f64>,
    pub temperature_c: Option<f32>,
    pub xid: Option<u32>,
    /// Compute processes running on the GPU and the device memory they hold (for /metrics;
    /// not part of the sample record).
    pub processes: Option<u32>,
    pub process_memory_bytes: Option<u64>,
}

/// The job a GPU works for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobLabel {
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
}

/// A source of GPU readings. Sampling runs in its own loop; nothing here is called from a
/// scrape.
pub trait GpuSource: Send {
    /// `nvml`, `synthetic`, ...
    fn kind(&self) -> &'static str;
    fn devices(&self) -> &[GpuDevice];
    /// Reads every GPU once.
    fn read(&mut self, now_ms: UnixMillis) -> Result<Vec<GpuReading>>;
    /// Tells the source which job each GPU works for (by position in `devices`). Real GPUs
    /// do not care; synthetic ones look busy when they have a job.
    fn set_jobs(&mut self, _labels: &[Option<JobLabel>]) {}
    /// Job labels the source itself knows (dcgm-exporter's `hpc_job`, `pod`, `namespace`),
    /// by position in `devices`; `None`: it knows none.
    fn job_labels(&self) -> Option<Vec<Option<JobLabel>>> {
        None
    }
}

/// A reading with its device, node, interval and job label, as a sample row.
pub fn sample_ref<'a>(
    node: &'a str,
    device: &'a GpuDevice,
    reading: &GpuReading,
    label: Option<&'a JobLabel>,
    time_ms: UnixMillis,
    interval_s: u32,
) -> SampleRef<'a> {
    SampleRef {
        time_ms,
        interval_s,
        node,
        gpu_index: device.index,
        gpu_uuid: &device.uuid,
        gpu_model: device.model.key(),
        mig_instance: device.mig_instance.as_deref(),
        job_id: label.map(|l| l.job_id.as_str()),
        account: label.map(|l| l.account.as_str()),
        project: label.and_then(|l| l.project.as_deref()),
        gpu_util_pct: reading.gpu_util_pct,
        sm_active: reading.sm_active,
        tensor_active: reading.tensor_active,
        dram_active: reading.dram_active,
        sm_clock_mhz: reading.sm_clock_mhz,
        mem_used_bytes: reading.mem_used_bytes,
        mem_total_bytes: reading.mem_total_bytes,
        power_w: reading.power_w,
        energy_j: reading.energy_j,
        xid: reading.xid,
    }
}
