//! The NVML source: reads real NVIDIA GPUs through nvml-wrapper, which loads
//! `libnvidia-ml.so.1` at run time. Where no driver is installed it fails at start with a message
//! that names the library and the other sources, never a panic. XID errors arrive as NVML
//! events, drained without waiting at each reading.
//!
//! A GPU in MIG mode is read as its MIG instances (NVML's slots are iterated and the empty ones
//! skipped): each is a device with the parent's index and `mig_instance` = `<profile>/<slot>`,
//! with its own memory and processes; NVML gives no utilization for an instance. On Hopper and
//! later, GPM (GPU performance monitoring) gives SM activity, tensor activity and DRAM
//! bandwidth between two samples, the MFU proxy without DCGM: one sample is kept per GPU and
//! each reading covers the time since the previous one. GPM per MIG instance needs the
//! instance's GPU-instance id, which nvml-wrapper 0.13 does not expose safely: instances have no
//! GPM figures yet.
//!
//! Written and compiled without a GPU at hand: `scripts/nvml-on-device.sh` runs the source on a
//! machine with one.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml};

use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::source::{GpuDevice, GpuReading, GpuSource, Result, SourceError};

/// The library NVML is loaded from.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// `nvmlDeviceGetMigMode`'s "enabled".
const MIG_ENABLED: u32 = 1;

/// The GPM metrics read, in the order they fill a reading.
const GPM_METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::GraphicsUtil,
];

/// Reads every GPU NVML sees.
pub struct NvmlSource {
    /// Loaded once for the life of the process (handles, samples and event sets borrow it).
    nvml: &'static Nvml,
    /// Aligned with `devices`: a whole GPU's handle, or a MIG instance's.
    handles: Vec<Device<'static>>,
    /// Aligned with `devices`: the last GPM sample of a GPU that supports GPM.
    gpm: Vec<Option<GpmSample<'static>>>,
    /// XID events of every GPU that supports them; `None` when none does.
    xid_events: Option<EventSet<'static>>,
    devices: Vec<GpuDevice>,
    /// Last energy counter per device (mJ), to report energy per interval.
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
        let mut source = NvmlSource {
            nvml,
            handles: Vec::new(),
            gpm: Vec::new(),
            xid_events: None,
            devices: Vec::new(),
            last_energy_mj: Vec::new(),
        };
        let mut parents = Vec::new();
        for i in 0..count {
            let device = nvml
                .device_by_index(i)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", Some(i)))?;
            let name = device
                .name()
                .map_err(nvml_err("nvmlDeviceGetName", Some(i)))?;
            let model =
                GpuModel::from_marketing_name(&name).ok_or(SourceError::UnknownModel(name))?;
            if device.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED) {
                source.add_mig_instances(&device, i, model)?;
            } else {
                let uuid = device
                    .uuid()
                    .map_err(nvml_err("nvmlDeviceGetUUID", Some(i)))?;
                let gpm = first_gpm_sample(&device, i);
                // The XID event set needs a handle of its own (handles are not `Clone`).
                let handle = nvml
                    .device_by_index(i)
                    .map_err(nvml_err("nvmlDeviceGetHandleByIndex", Some(i)))?;
                source.push(handle, gpm, i, uuid, model, None);
            }
            parents.push(device);
        }
        source.xid_events = xid_event_set(nvml, &parents);
        Ok(source)
    }

    fn push(
        &mut self,
        handle: Device<'static>,
        gpm: Option<GpmSample<'static>>,
        index: u32,
        uuid: String,
        model: GpuModel,
        mig_instance: Option<String>,
    ) {
        // A MIG instance sits on its parent's PCI address (NVML answers for the parent only).
        let pci_bus_id = handle
            .pci_info()
            .map(|p| p.bus_id)
            .ok()
            .or_else(|| {
                self.devices
                    .iter()
                    .rev()
                    .find(|d| u32::from(d.index) == index)
                    .map(|d| d.pci_bus_id.clone())
            })
            .unwrap_or_default();
        self.devices.push(GpuDevice {
            index: index as u16,
            uuid,
            model,
            mig_instance,
            pci_bus_id,
        });
        self.handles.push(handle);
        self.gpm.push(gpm);
        self.last_energy_mj.push(None);
    }

    /// The MIG instances of GPU `index`, each a device; slots without an instance are skipped.
    fn add_mig_instances(
        &mut self,
        parent: &Device<'static>,
        index: u32,
        model: GpuModel,
    ) -> Result<()> {
        let slots = parent
            .mig_device_count()
            .map_err(nvml_err("nvmlDeviceGetMaxMigDeviceCount", Some(index)))?;
        let before = self.devices.len();
        for slot in 0..slots {
            let instance = match parent.mig_device_by_index(slot) {
                Ok(instance) => instance,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => {
                    return Err(nvml_err("nvmlDeviceGetMigDeviceHandleByIndex", Some(index))(e))
                }
            };
            let uuid = instance
                .uuid()
                .map_err(nvml_err("nvmlDeviceGetUUID", Some(index)))?;
            let profile = instance
                .name()
                .ok()
                .and_then(|n| mig_profile(&n).map(str::to_owned))
                .unwrap_or_else(|| "mig".to_owned());
            let mig_instance = Some(format!("{profile}/{slot}"));
            self.push(instance, None, index, uuid, model, mig_instance);
        }
        if self.devices.len() == before {
            tracing::warn!(
                gpu = index,
                "MIG is on but the GPU has no instances: nothing to read"
            );
        }
        Ok(())
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

    fn read_one(&mut self, position: usize) -> Result<GpuReading> {
        let i = u32::from(self.devices[position].index);
        let is_instance = self.devices[position].mig_instance.is_some();
        let device = &self.handles[position];
        // A MIG instance has no utilization in NVML; a whole GPU must have one.
        let (util, mem_copy) = match device.utilization_rates() {
            Ok(u) => (Some(u.gpu as f32), Some(u.memory as f32)),
            Err(_) if is_instance => (None, None),
            Err(e) => return Err(nvml_err("nvmlDeviceGetUtilizationRates", Some(i))(e)),
        };
        // KB/s over NVML's last 20 ms window.
        let pcie = |counter| {
            device
                .pcie_throughput(counter)
                .ok()
                .map(|kb| f64::from(kb) * 1024.0)
        };
        let (pcie_tx, pcie_rx) = (pcie(PcieUtilCounter::Send), pcie(PcieUtilCounter::Receive));
        let mem = device
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo", Some(i)))?;
        // Optional figures: a GPU that does not support one reports it as not measured.
        let power_w = device.power_usage().ok().map(|mw| mw as f32 / 1000.0);
        let energy_mj = device.total_energy_consumption().ok();
        let processes = device.running_compute_processes().ok();
        let [sm_active, tensor_active, dram_active, gr_engine_active] = self.read_gpm(position);
        let device = &self.handles[position];
        let slot = &mut self.last_energy_mj[position];
        let energy_j = match (energy_mj, *slot) {
            (Some(now), Some(before)) if now >= before => Some((now - before) as f64 / 1000.0),
            _ => None,
        };
        *slot = energy_mj;
        Ok(GpuReading {
            index: i as u16,
            gpu_util_pct: util,
            sm_active,
            tensor_active,
            dram_active,
            sm_clock_mhz: device.clock_info(Clock::SM).ok(),
            gr_engine_active,
            mem_copy_util_pct: mem_copy,
            mem_clock_mhz: device.clock_info(Clock::Memory).ok(),
            pcie_tx_bytes_per_s: pcie_tx,
            pcie_rx_bytes_per_s: pcie_rx,
            // NVLink throughput needs per-link counters NVML only offers as field values;
            // dcgm-exporter's source reads them where DCGM runs.
            nvlink_tx_bytes_per_s: None,
            nvlink_rx_bytes_per_s: None,
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

    /// SM activity, tensor activity, DRAM bandwidth and graphics-engine activity since the
    /// last GPM sample of device `position`, which the new sample replaces, as ratios 0-1 (NVML
    /// gives percent; samples and dcgm-exporter's `PROF_*` fields are ratios). `None` each where
    /// GPM is unsupported or a sample fails (the next reading starts from a fresh sample).
    fn read_gpm(&mut self, position: usize) -> [Option<f32>; 4] {
        let Some(previous) = self.gpm[position].take() else {
            return [None; 4];
        };
        let Ok(next) = self.handles[position].gpm_sample() else {
            return [None; 4];
        };
        let figures = nvml_wrapper::gpm::gpm_metrics_get(self.nvml, &previous, &next, &GPM_METRICS);
        self.gpm[position] = Some(next);
        let Ok(results) = figures else {
            return [None; 4];
        };
        let mut out = [None; 4];
        for (slot, result) in out.iter_mut().zip(results) {
            *slot = result.ok().map(|r| percent_to_ratio(r.value));
        }
        out
    }
}

/// A GPM percentage as the ratio 0-1 samples carry (the aggregator refuses a ratio past 1).
fn percent_to_ratio(percent: f64) -> f32 {
    (percent.clamp(0.0, 100.0) / 100.0) as f32
}

/// The first GPM sample of a GPU that supports GPM (Hopper and later); `None` otherwise.
fn first_gpm_sample(device: &Device<'static>, index: u32) -> Option<GpmSample<'static>> {
    if !device.gpm_support().unwrap_or(false) {
        return None;
    }
    match device.gpm_sample() {
        Ok(sample) => Some(sample),
        Err(error) => {
            tracing::warn!(gpu = index, %error, "GPM is supported but sampling failed: no SM or tensor activity");
            None
        }
    }
}

/// The profile in a MIG instance's name: `NVIDIA H100 80GB HBM3 MIG 1g.10gb` -> `1g.10gb`.
fn mig_profile(name: &str) -> Option<&str> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then_some(profile)
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
        (0..self.devices.len())
            .map(|position| {
                let mut reading = self.read_one(position)?;
                reading.xid = xids.get(&u32::from(reading.index)).copied();
                Ok(reading)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpm_percentages_become_the_ratios_samples_carry() {
        assert_eq!(percent_to_ratio(42.0), 0.42);
        assert_eq!(percent_to_ratio(130.0), 1.0);
        assert_eq!(percent_to_ratio(-1.0), 0.0);
    }

    #[test]
    fn a_mig_instance_name_gives_its_profile() {
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb"),
            Some("1g.10gb")
        );
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 3g.20gb "),
            Some("3g.20gb")
        );
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3"), None);
    }

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
