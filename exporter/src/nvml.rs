//! The NVML source: reads real NVIDIA GPUs through nvml-wrapper, which loads
//! `libnvidia-ml.so.1` at run time. Where no driver is installed it fails at start with a message
//! that names the library and the other sources, never a panic. XID errors arrive as NVML
//! events, drained without waiting at each reading.
//!
//! Not yet read (no GPU on the machines this was written on): MIG instances and the Hopper
//! GPM metrics; `scripts/nvml-on-device.sh` is ready for a machine
//! with GPUs.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::source::{GpuDevice, GpuReading, GpuSource, Result, SourceError};

/// The library NVML is loaded from.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Reads every GPU NVML sees.
pub struct NvmlSource {
    /// Loaded once for the life of the process (handles and event sets borrow it).
    handles: Vec<Device<'static>>,
    /// XID events of every GPU that supports them; `None` when none does.
    xid_events: Option<EventSet<'static>>,
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
        let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(detail) => SourceError::DriverMissing {
                library: NVML_LIBRARY,
                detail: detail.to_string(),
            },
            NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => SourceError::DriverMissing {
                library: NVML_LIBRARY,
                detail: e.to_string(),
            },
            other => nvml_err("nvmlInit", None)(other),
        })?));
        let count = nvml
            .device_count()
            .map_err(nvml_err("nvmlDeviceGetCount", None))?;
        let mut devices = Vec::new();
        let mut handles = Vec::new();
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
            handles.push(device);
        }
        let last_energy_mj = vec![None; devices.len()];
        let xid_events = xid_event_set(nvml, &handles);
        Ok(NvmlSource {
            handles,
            xid_events,
            devices,
            last_energy_mj,
        })
    }

    /// The last XID per GPU index among the events waiting now.
    fn drain_xids(&self) -> std::collections::HashMap<u32, u32> {
        let mut last = std::collections::HashMap::new();
        let Some(set) = &self.xid_events else {
            return last;
        };
        // A timeout of 0 returns at once; `Timeout` means nothing is waiting.
        while let Ok(event) = set.wait(0) {
            if let (Ok(index), Some(XidError::Value(xid))) =
                (event.device.index(), event.event_data)
            {
                last.insert(index, u32::try_from(xid).unwrap_or(u32::MAX));
            }
        }
        last
    }

    fn read_one(&mut self, i: u32) -> Result<GpuReading> {
        let device = &self.handles[i as usize];
        let util = device
            .utilization_rates()
            .map_err(nvml_err("nvmlDeviceGetUtilizationRates", Some(i)))?;
        let mem = device
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo", Some(i)))?;
        // Optional figures: a GPU that does not support one reports it as not measured.
        let power_w = device.power_usage().ok().map(|mw| mw as f32 / 1000.0);
        let energy_mj = device.total_energy_consumption().ok();
        let processes = device.running_compute_processes().ok();
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
            process_memory_bytes: processes.as_ref().map(|ps| {
                ps.iter()
                    .map(|p| match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                    })
                    .sum()
            }),
            processes: processes.map(|ps| u32::try_from(ps.len()).unwrap_or(u32::MAX)),
        })
    }
}

/// One event set with every GPU registered for critical XID errors. A GPU that does not
/// support the events is left out; if registering fails the set is gone (NVML frees it) and
/// XIDs are not read, which is logged.
fn xid_event_set(nvml: &'static Nvml, handles: &[Device<'static>]) -> Option<EventSet<'static>> {
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(error) => {
            tracing::warn!(%error, "NVML event sets unavailable: XID errors will not be read");
            return None;
        }
    };
    let mut registered = 0;
    for (i, device) in handles.iter().enumerate() {
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered += 1;
            }
            Err(error) => {
                tracing::warn!(gpu = i, error = %error.error, "registering for XID events failed: XID errors will not be read");
                return None;
            }
        }
    }
    (registered > 0).then_some(set)
}

impl GpuSource for NvmlSource {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn read(&mut self, _now_ms: UnixMillis) -> Result<Vec<GpuReading>> {
        let xids = self.drain_xids();
        (0..self.devices.len() as u32)
            .map(|i| {
                let mut reading = self.read_one(i)?;
                reading.xid = xids.get(&i).copied();
                Ok(reading)
            })
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
