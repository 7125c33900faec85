//! Synthetic GPUs: deterministic from a seed, with utilization, tensor activity, memory and
//! power that follow the job placed on each GPU (an idle GPU looks idle). The demo, the tests
//! and the benchmarks use them in place of NVML.

use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use gpuledger_model::rng::{hash_coords, mix64, unit_f64};
use gpuledger_model::sample::SampleBatchBuilder;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::{AccountId, GpuModel};
use serde::Deserialize;

use crate::source::{sample_ref, GpuDevice, GpuReading, GpuSource, JobLabel, Result};

/// How a tenant's jobs use their GPUs, as means; readings vary around them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryProfile {
    pub account: AccountId,
    /// Mean `DCGM_FI_DEV_GPU_UTIL` (a kernel was running), 0-100.
    pub gpu_util_pct: f32,
    /// Mean SM activity, 0-1.
    pub sm_active: f32,
    /// Mean tensor-pipe activity, 0-1: with the clock, the MFU proxy.
    pub tensor_active: f32,
    pub dram_active: f32,
    /// Share of device memory in use.
    pub memory_fraction: f32,
    /// Share of the board power limit drawn.
    pub power_fraction: f32,
    /// The MFU the tenant's training framework reports for each job (achieved FLOP/s over its
    /// GPUs' peak), posted as a `flops_reported` job event when a run ends; none: the tenant
    /// reports nothing and billing uses the tensor-activity proxy.
    #[serde(default)]
    pub reported_mfu: Option<f32>,
}

impl TelemetryProfile {
    /// What a job of an unknown tenant looks like.
    pub fn generic(account: AccountId) -> Self {
        TelemetryProfile {
            account,
            gpu_util_pct: 80.0,
            sm_active: 0.6,
            tensor_active: 0.3,
            dram_active: 0.3,
            memory_fraction: 0.6,
            power_fraction: 0.6,
            reported_mfu: None,
        }
    }
}

const IDLE_SM_CLOCK_MHZ: u32 = 345;
const IDLE_POWER_FRACTION: f32 = 0.1;
const IDLE_MEMORY_BYTES: u64 = 512 << 20;

/// The deterministic UUID of synthetic GPU `index` of `node`.
pub fn synthetic_uuid(seed: u64, node: &str, index: u16) -> String {
    let node_hash = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let a = hash_coords(seed, &[node_hash, u64::from(index)]);
    let b = mix64(a);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// The synthetic devices of one node.
pub fn synthetic_devices(seed: u64, node: &str, count: u16, model: GpuModel) -> Vec<GpuDevice> {
    (0..count)
        .map(|index| GpuDevice {
            index,
            uuid: synthetic_uuid(seed, node, index),
            model,
            mig_instance: None,
            pci_bus_id: synthetic_pci_bus_id(index),
        })
        .collect()
}

fn jitter(h: u64, k: u64, spread: f32) -> f32 {
    (unit_f64(mix64(h ^ k)) as f32 * 2.0 - 1.0) * spread
}

/// One reading of a GPU at `time_ms` over `interval_s`, running `profile` (or idle).
/// A pure function of its arguments.
pub fn synthetic_reading(
    seed: u64,
    gpu_key: u64,
    device: &GpuDevice,
    profile: Option<&TelemetryProfile>,
    time_ms: UnixMillis,
    interval_s: u32,
) -> GpuReading {
    let h = hash_coords(seed, &[gpu_key, time_ms as u64]);
    let model = device.model;
    let total = model.memory_bytes();
    let (util, sm, tensor, dram, clock, mem, power) = match profile {
        None => (
            0.0,
            0.0,
            0.0,
            0.0,
            IDLE_SM_CLOCK_MHZ,
            IDLE_MEMORY_BYTES,
            IDLE_POWER_FRACTION,
        ),
        Some(p) => {
            let util = (p.gpu_util_pct + jitter(h, 1, 8.0)).clamp(0.0, 100.0);
            let sm = (p.sm_active + jitter(h, 2, 0.08)).clamp(0.0, 1.0);
            let tensor = (p.tensor_active + jitter(h, 3, 0.06)).clamp(0.0, sm);
            let dram = (p.dram_active + jitter(h, 4, 0.05)).clamp(0.0, 1.0);
            // Around the rated clock, never past the model's maximum boost (an A100 is rated at
            // its maximum).
            let clock = ((model.rated_sm_clock_mhz() as f32 + jitter(h, 5, 60.0)) as u32)
                .min(model.max_sm_clock_mhz());
            let mem_fraction = (p.memory_fraction + jitter(h, 6, 0.02)).clamp(0.0, 1.0);
            let power = (p.power_fraction + jitter(h, 7, 0.05)).clamp(IDLE_POWER_FRACTION, 1.0);
            (
                util,
                sm,
                tensor,
                dram,
                clock,
                (total as f64 * f64::from(mem_fraction)) as u64,
                power,
            )
        }
    };
    let power_w = model.power_limit_w() * power;
    // Host and peer traffic follow memory traffic: up to a tenth of PCIe Gen5 x16 and of
    // NVLink 4 (18 links) when busy.
    let pcie = f64::from(dram) * 6.4e9;
    let nvlink = f64::from(dram) * 45e9;
    GpuReading {
        index: device.index,
        gpu_util_pct: Some(util),
        sm_active: Some(sm),
        tensor_active: Some(tensor),
        dram_active: Some(dram),
        sm_clock_mhz: Some(clock),
        gr_engine_active: Some((util / 100.0).max(sm)),
        mem_copy_util_pct: Some(dram * 100.0),
        mem_clock_mhz: Some(memory_clock_mhz(model)),
        pcie_tx_bytes_per_s: Some(pcie * 0.4),
        pcie_rx_bytes_per_s: Some(pcie * 0.6),
        nvlink_tx_bytes_per_s: Some(nvlink),
        nvlink_rx_bytes_per_s: Some(nvlink),
        mem_used_bytes: Some(mem),
        mem_total_bytes: Some(total),
        power_w: Some(power_w),
        energy_j: Some(f64::from(power_w) * f64::from(interval_s)),
        temperature_c: Some(30.0 + 45.0 * power),
        xid: None,
        processes: None,
        process_memory_bytes: None,
    }
}

/// The HBM clock of each model (what NVML's memory clock reads on it).
fn memory_clock_mhz(model: GpuModel) -> u32 {
    match model {
        GpuModel::A100 => 1593,
        GpuModel::H200 => 3201,
        GpuModel::H100Sxm | GpuModel::H100Pcie => 2619,
        GpuModel::V100_16 | GpuModel::V100_32 => 877,
        GpuModel::P100 => 715,
        GpuModel::T4 => 5001,
        GpuModel::A10 => 6251,
    }
}

/// A PCI address like those of an 8-GPU HGX board.
fn synthetic_pci_bus_id(index: u16) -> String {
    format!(
        "00000000:{:02X}:00.0",
        (0x18 + u32::from(index) * 0x11) % 0x100
    )
}

/// A stable key of a GPU for noise: node hash and index.
fn gpu_key(node: &str, index: u16) -> u64 {
    node.bytes().fold(0u64, |h, b| mix64(h ^ u64::from(b))) ^ u64::from(index)
}

/// A live synthetic source: readings follow whatever [`SyntheticSource::assign`] placed on
/// each GPU.
#[derive(Debug)]
pub struct SyntheticSource {
    seed: u64,
    node: String,
    devices: Vec<GpuDevice>,
    running: Vec<Option<TelemetryProfile>>,
    last_read_ms: Option<UnixMillis>,
}

impl SyntheticSource {
    pub fn new(seed: u64, node: &str, count: u16, model: GpuModel) -> Self {
        SyntheticSource {
            seed,
            node: node.to_owned(),
            devices: synthetic_devices(seed, node, count, model),
            running: vec![None; usize::from(count)],
            last_read_ms: None,
        }
    }

    /// Puts a job's usage pattern on a GPU (`None`: idle).
    pub fn assign(&mut self, index: u16, profile: Option<TelemetryProfile>) {
        if let Some(slot) = self.running.get_mut(usize::from(index)) {
            *slot = profile;
        }
    }
}

impl GpuSource for SyntheticSource {
    fn kind(&self) -> &'static str {
        "synthetic"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn set_jobs(&mut self, labels: &[Option<JobLabel>]) {
        for (slot, label) in self.running.iter_mut().zip(labels) {
            let account = label
                .as_ref()
                .and_then(|l| l.account.parse::<AccountId>().ok());
            match (account, slot.as_ref()) {
                (Some(a), Some(p)) if p.account == a => {}
                (Some(a), _) => *slot = Some(TelemetryProfile::generic(a)),
                (None, _) => *slot = None,
            }
        }
    }

    fn read(&mut self, now_ms: UnixMillis) -> Result<Vec<GpuReading>> {
        let interval_s = self
            .last_read_ms
            .map(|t| ((now_ms - t) / 1000).max(1) as u32)
            .unwrap_or(1);
        self.last_read_ms = Some(now_ms);
        Ok(self
            .devices
            .iter()
            .zip(&self.running)
            .map(|(d, p)| {
                synthetic_reading(
                    self.seed,
                    gpu_key(&self.node, d.index),
                    d,
                    p.as_ref(),
                    now_ms,
                    interval_s,
                )
            })
            .collect())
    }
}

/// A stretch of time a GPU spends on one job: `[start_ms, end_ms)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
    pub label: JobLabel,
    pub profile: TelemetryProfile,
}

/// Samples of one node's GPUs over `[from_ms, to_ms)` on a grid of `interval_s`, given each
/// GPU's job segments (sorted, not overlapping). A grid interval that a job starts or ends in is
/// split at that instant, so GPU-seconds per job equal the job's allocated time exactly.
pub fn synthesize_node(
    seed: u64,
    node: &str,
    devices: &[GpuDevice],
    timelines: &[Vec<Segment>],
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    interval_s: u32,
) -> Result<RecordBatch, ArrowError> {
    let step = i64::from(interval_s) * 1000;
    let per_gpu = ((to_ms - from_ms) / step + 2) as usize;
    let mut builder = SampleBatchBuilder::with_capacity(per_gpu * devices.len());
    for (device, segments) in devices.iter().zip(timelines) {
        let key = gpu_key(node, device.index);
        let mut seg_i = segments.partition_point(|s| s.end_ms <= from_ms);
        let mut t = from_ms;
        while t < to_ms {
            while seg_i < segments.len() && segments[seg_i].end_ms <= t {
                seg_i += 1;
            }
            let next_grid = (t.div_euclid(step) + 1) * step;
            let current = segments.get(seg_i).filter(|s| s.start_ms <= t);
            let boundary = match (current, segments.get(seg_i)) {
                (Some(s), _) => s.end_ms,
                (None, Some(next)) => next.start_ms,
                (None, None) => i64::MAX,
            };
            let end = next_grid.min(boundary).min(to_ms);
            let secs = ((end - t) / 1000) as u32;
            if secs > 0 {
                let reading =
                    synthetic_reading(seed, key, device, current.map(|s| &s.profile), t, secs);
                builder.push_ref(&sample_ref(
                    node,
                    device,
                    &reading,
                    current.map(|s| &s.label),
                    t,
                    secs,
                ));
            }
            t = end;
        }
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::UInt32Type;

    fn profile() -> TelemetryProfile {
        TelemetryProfile::generic(AccountId::new("a").unwrap())
    }

    #[test]
    fn intervals_split_at_job_boundaries_and_cover_the_range() {
        let devices = synthetic_devices(1, "n001", 2, GpuModel::H100Sxm);
        let seg = Segment {
            start_ms: 13_000,
            end_ms: 47_000,
            label: JobLabel {
                job_id: "7".into(),
                account: "a".into(),
                project: None,
            },
            profile: profile(),
        };
        let batch =
            synthesize_node(1, "n001", &devices, &[vec![seg], vec![]], 0, 60_000, 10).unwrap();
        let interval = batch
            .column_by_name("interval_s")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let job = batch.column_by_name("job_id").unwrap().as_string::<i32>();
        let total: u32 = interval.values().iter().sum();
        assert_eq!(total, 120, "two GPUs x 60 s");
        let job_secs: u32 = (0..batch.num_rows())
            .filter(|&i| !job.is_null(i))
            .map(|i| interval.value(i))
            .sum();
        assert_eq!(job_secs, 34, "the job held GPU 0 from 13 s to 47 s");
    }

    #[test]
    fn idle_gpus_look_idle_and_busy_ones_do_not() {
        let d = &synthetic_devices(1, "n001", 1, GpuModel::H100Sxm)[0];
        let idle = synthetic_reading(1, 0, d, None, 0, 10);
        let busy = synthetic_reading(1, 0, d, Some(&profile()), 0, 10);
        assert_eq!(idle.gpu_util_pct, Some(0.0));
        assert!(busy.gpu_util_pct.unwrap() > 50.0);
        assert_eq!(
            busy,
            synthetic_reading(1, 0, d, Some(&profile()), 0, 10),
            "deterministic"
        );
    }
}
