//! The NVML source: reads real NVIDIA GPUs through nvml-wrapper, which loads
//! `libnvidia-ml.so.1` at run time. Where no driver is installed it fails at start with a message
//! that names the library and the other sources, never a panic.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::source::{GpuDevice, GpuReading, GpuSource, Result, SourceError};

/// The library NVML is loaded from.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Reads every GPU NVML sees.
pub struct NvmlSource {
    nvml: Nvml,
    devices: Vec<GpuDevice>,
    /// Last energy counter per GPU (mJ), to report energy per interval.
    last_energy_mj: Vec<Option<u64>>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("devices", &self.devices)
            .finish()
    }
}

fn nvml_err(call: &'static str, gpu: Option<u32>) -> impl FnOnce(NvmlError) -> SourceError {
    move |e| SourceError::Nvml {
        call,
        gpu,
        detail: e.to_string(),
    }
}

impl NvmlSource {
    /// Loads NVML and lists the GPUs.
    pub fn open() -> Result<Self> {
        let nvml = Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(detail) => SourceError::DriverMissing {
                library: NVML_LIBRARY,
                detail: detail.to_string(),
            },
            NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => SourceError::DriverMissing {
                library: NVML_LIBRARY,
                detail: e.to_string(),
            },
            other => nvml_err("nvmlInit", None)(other),
        })?;
        let count = nvml
            .device_count()
            .map_err(nvml_err("nvmlDeviceGetCount", None))?;
        let mut devices = Vec::new();
        for i in 0..count {
            let device = nvml
                .device_by_index(i)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", Some(i)))?;
            let name = device
                .name()
                .map_err(nvml_err("nvmlDeviceGetName", Some(i)))?;
            let model =
                GpuModel::from_marketing_name(&name).ok_or(SourceError::UnknownModel(name))?;
            devices.push(GpuDevice {
                index: i as u16,
                uuid: device
                    .uuid()
                    .map_err(nvml_err("nvmlDeviceGetUUID", Some(i)))?,
                model,
                mig_instance: None,
            });
        }
        let last_energy_mj = vec![None; devices.len()];
        Ok(NvmlSource {
            nvml,
            devices,
            last_energy_mj,
        })
    }

    fn read_one(&mut self, i: u32) -> Result<GpuReading> {
        let device = self
            .nvml
            .device_by_index(i)
            .map_err(nvml_err("nvmlDeviceGetHandleByIndex", Some(i)))?;
        let util = device
            .utilization_rates()
            .map_err(nvml_err("nvmlDeviceGetUtilizationRates", Some(i)))?;
        let mem = device
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo", Some(i)))?;
        // Optional figures: a GPU that does not support one reports it as not measured.
        let power_w = device.power_usage().ok().map(|mw| mw as f32 / 1000.0);
        let energy_mj = device.total_energy_consumption().ok();
        let slot = &mut self.last_energy_mj[i as usize];
        let energy_j = match (energy_mj, *slot) {
            (Some(now), Some(before)) if now >= before => Some((now - before) as f64 / 1000.0),
            _ => None,
        };
        *slot = energy_mj;
        Ok(GpuReading {
            index: i as u16,
            gpu_util_pct: Some(util.gpu as f32),
            sm_active: None,
            tensor_active: None,
            dram_active: None,
            sm_clock_mhz: device.clock_info(Clock::SM).ok(),
            mem_used_bytes: Some(mem.used),
            mem_total_bytes: Some(mem.total),
            power_w,
            energy_j,
            temperature_c: device
                .temperature(TemperatureSensor::Gpu)
                .ok()
                .map(|t| t as f32),
            xid: None,
        })
    }
}

impl GpuSource for NvmlSource {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn read(&mut self, _now_ms: UnixMillis) -> Result<Vec<GpuReading>> {
        (0..self.devices.len() as u32)
            .map(|i| self.read_one(i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_driver_is_a_clear_error_not_a_panic() {
        // These machines have no NVIDIA driver; where one exists, every GPU must have an id.
        match NvmlSource::open() {
            Ok(source) => assert!(source
                .devices()
                .iter()
                .all(|d| d.uuid.starts_with("GPU-") || d.uuid.starts_with("MIG-"))),
            Err(SourceError::DriverMissing { library, .. }) => assert_eq!(library, NVML_LIBRARY),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}
