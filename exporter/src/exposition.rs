//! `/metrics` of the exporter, rendered from the latest snapshot: a scrape only encodes, it
//! never waits on NVML, the scheduler or the disk. GPU series keep dcgm-exporter's names,
//! units and labels, so its dashboards (Grafana 12239), OpenCost and existing alert rules
//! read them unchanged: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia0`), `modelName`,
//! `Hostname`, and on a MIG instance `GPU_I_PROFILE` and `GPU_I_ID`; then the job id as
//! dcgm-exporter's `hpc_job` (not `job`: Prometheus sets `job` to the scrape job's name),
//! `account` and `project`. `PROF_*` fields are ratios 0-1 as dcgm-exporter's are.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::source::{GpuDevice, GpuReading, JobLabel};

/// The exporter's own health, as counted by its loops.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    pub samples_total: u64,
    pub collections_total: u64,
    pub collection_seconds_total: f64,
    pub last_collection_seconds: f64,
    pub source_errors_total: u64,
    pub source_up: bool,
    pub source_error: Option<String>,
    pub pushes_ok_total: u64,
    pub pushes_failed_total: u64,
    pub batches_rejected_total: u64,
    pub spool_bytes: u64,
    pub spool_batches: u64,
    pub spool_dropped_total: u64,
    pub spool_lost_total: u64,
    pub last_push_timestamp_seconds: Option<f64>,
    pub otlp_exports_total: u64,
    pub otlp_exports_failed_total: u64,
}

/// What the last collection saw, per GPU, and the running totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub node: String,
    pub source: &'static str,
    pub devices: Vec<GpuDevice>,
    /// Aligned with `devices`; `None` when the GPU could not be read (its `up` is 0).
    pub readings: Vec<Option<GpuReading>>,
    pub labels: Vec<Option<JobLabel>>,
    pub energy_joules_total: Vec<f64>,
    /// XID errors seen, per (GPU index, XID).
    pub xid_total: BTreeMap<(u16, u32), u64>,
    pub health: Health,
}

/// Text format 0.0.4, or OpenMetrics 1.0 when the scraper asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Prometheus,
    OpenMetrics,
}

impl Format {
    /// Picks the format from a scrape's `Accept` header.
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Where the exporter's series go: the text page here, OTLP in [`crate::otlp`]. Both get the
/// same families and samples from [`emit`].
pub trait Sink {
    /// A new family; `kind` is `gauge` or `counter`.
    fn family(&mut self, name: &str, kind: &str, help: &str);
    /// A sample of the family last begun.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64);
}

struct Out {
    text: String,
    format: Format,
}

impl Sink for Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let (family, kind) = match (self.format, kind) {
            (Format::OpenMetrics, "counter") => match name.strip_suffix("_total") {
                Some(family) => (family, kind),
                // dcgm-exporter's counters lack the suffix OpenMetrics requires of one.
                None => (name, "unknown"),
            },
            _ => (name, kind),
        };
        let _ = writeln!(self.text, "# HELP {family} {help}");
        let _ = writeln!(self.text, "# TYPE {family} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"");
                escape_into(&mut self.text, v);
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

type Field = (
    &'static str,
    &'static str,
    &'static str,
    fn(&GpuReading) -> Option<f64>,
);

/// The per-GPU gauges, dcgm-exporter's names and units (the last two are gpuledger's).
const GPU_GAUGES: [Field; 19] = [
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        |r| r.gpu_util_pct.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        |r| r.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        |r| r.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        |r| r.mem_copy_util_pct.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        |r| r.temperature_c.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        |r| r.power_w.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        |r| r.mem_used_bytes.map(|b| (b >> 20) as f64),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        |r| match (r.mem_total_bytes, r.mem_used_bytes) {
            (Some(t), Some(u)) => Some((t.saturating_sub(u) >> 20) as f64),
            _ => None,
        },
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active (0-1).",
        |r| r.gr_engine_active.map(f64::from),
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "Ratio of cycles an SM has at least 1 warp assigned (0-1).",
        |r| r.sm_active.map(f64::from),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active (0-1).",
        |r| r.tensor_active.map(f64::from),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data (0-1).",
        |r| r.dram_active.map(f64::from),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "Data sent over PCIe, headers included (in B/s).",
        |r| r.pcie_tx_bytes_per_s,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "Data received over PCIe, headers included (in B/s).",
        |r| r.pcie_rx_bytes_per_s,
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "Data sent over NVLink, headers included (in B/s).",
        |r| r.nvlink_tx_bytes_per_s,
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "Data received over NVLink, headers included (in B/s).",
        |r| r.nvlink_rx_bytes_per_s,
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        |r| r.xid.map(f64::from),
    ),
    (
        "gpuledger_gpu_processes",
        "gauge",
        "Compute processes running on the GPU.",
        |r| r.processes.map(f64::from),
    ),
    (
        "gpuledger_gpu_process_memory_bytes",
        "gauge",
        "Device memory held by the GPU's compute processes (bytes).",
        |r| r.process_memory_bytes.map(|b| b as f64),
    ),
];

/// Renders the snapshot.
pub fn render(s: &Snapshot, format: Format) -> String {
    let mut out = Out {
        text: String::with_capacity(256 + s.devices.len() * 1400),
        format,
    };
    emit(s, &mut out);
    if format == Format::OpenMetrics {
        out.text.push_str("# EOF\n");
    }
    out.text
}

/// Every family of the snapshot, in page order, into `out`.
pub fn emit(s: &Snapshot, out: &mut impl Sink) {
    let gpu_labels: Vec<(String, Option<&JobLabel>)> = s
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            (
                d.index.to_string(),
                s.labels.get(i).and_then(Option::as_ref),
            )
        })
        .collect();
    let device_files: Vec<String> = s
        .devices
        .iter()
        .map(|d| format!("nvidia{}", d.index))
        .collect();
    // dcgm-exporter's identity labels, in its order.
    let identity_of = |i: usize| -> Vec<(&str, &str)> {
        let d = &s.devices[i];
        let mut l = vec![
            ("gpu", gpu_labels[i].0.as_str()),
            ("UUID", d.uuid.as_str()),
            ("pci_bus_id", d.pci_bus_id.as_str()),
            ("device", device_files[i].as_str()),
            ("modelName", d.model.marketing_name()),
            ("Hostname", s.node.as_str()),
        ];
        if let Some((profile, id)) = d.mig_profile_and_id() {
            l.push(("GPU_I_PROFILE", profile));
            l.push(("GPU_I_ID", id));
        }
        l
    };
    let gpu_and_host = |i: usize| -> [(&str, &str); 2] {
        [
            ("gpu", gpu_labels[i].0.as_str()),
            ("Hostname", s.node.as_str()),
        ]
    };
    let labels_of = |i: usize| -> Vec<(&str, &str)> {
        let job = &gpu_labels[i].1;
        let mut l = identity_of(i);
        match job {
            Some(j) => {
                l.push(("hpc_job", j.job_id.as_str()));
                l.push(("account", j.account.as_str()));
                l.push(("project", j.project.as_deref().unwrap_or("")));
            }
            None => l.push(("hpc_job", "")),
        }
        l
    };
    for (name, kind, help, get) in GPU_GAUGES {
        let values: Vec<(usize, f64)> = s
            .readings
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().and_then(get).map(|v| (i, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        out.family(name, kind, help);
        for (i, v) in values {
            out.sample(name, &labels_of(i), v);
        }
    }
    if !s.energy_joules_total.is_empty() {
        out.family(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            "Total energy consumption since the exporter started (in mJ).",
        );
        for (i, e) in s.energy_joules_total.iter().enumerate() {
            out.sample(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                &labels_of(i),
                e * 1000.0,
            );
        }
    }
    out.family(
        "gpuledger_gpu_energy_joules_total",
        "counter",
        "Energy used by the GPU since the exporter started (J).",
    );
    for (i, e) in s.energy_joules_total.iter().enumerate() {
        out.sample("gpuledger_gpu_energy_joules_total", &gpu_and_host(i), *e);
    }
    out.family(
        "gpuledger_gpu_xid_errors_total",
        "counter",
        "XID errors seen, per GPU and XID (dcgm-exporter keeps only the last).",
    );
    for ((gpu, xid), n) in &s.xid_total {
        let (gpu, xid) = (gpu.to_string(), xid.to_string());
        out.sample(
            "gpuledger_gpu_xid_errors_total",
            &[("gpu", &gpu), ("Hostname", &s.node), ("xid", &xid)],
            *n as f64,
        );
    }
    out.family(
        "gpuledger_gpu_up",
        "gauge",
        "1 when the GPU was read at the last collection.",
    );
    for i in 0..s.devices.len() {
        let up = s.readings.get(i).is_some_and(Option::is_some);
        out.sample(
            "gpuledger_gpu_up",
            &gpu_and_host(i),
            if up { 1.0 } else { 0.0 },
        );
    }
    out.family("gpuledger_gpu_info", "gauge", "Identity of each GPU; 1.");
    for d in &s.devices {
        let gpu = d.index.to_string();
        out.sample(
            "gpuledger_gpu_info",
            &[
                ("gpu", &gpu),
                ("Hostname", &s.node),
                ("UUID", &d.uuid),
                ("model_name", d.model.marketing_name()),
                ("pci_bus_id", &d.pci_bus_id),
                ("GPU_I_PROFILE", d.mig_instance.as_deref().unwrap_or("")),
            ],
            1.0,
        );
    }
    emit_health(out, s);
}

fn emit_health(out: &mut impl Sink, s: &Snapshot) {
    let h = &s.health;
    let src = [("source", s.source)];
    let counters: [(&str, &str, f64); 10] = [
        (
            "gpuledger_exporter_samples_total",
            "GPU samples taken.",
            h.samples_total as f64,
        ),
        (
            "gpuledger_exporter_collections_total",
            "Collections (one reading of every GPU).",
            h.collections_total as f64,
        ),
        (
            "gpuledger_exporter_collection_seconds_total",
            "Time spent collecting.",
            h.collection_seconds_total,
        ),
        (
            "gpuledger_exporter_source_errors_total",
            "Collections that failed.",
            h.source_errors_total as f64,
        ),
        (
            "gpuledger_exporter_pushes_total",
            "Batches the aggregator acknowledged.",
            h.pushes_ok_total as f64,
        ),
        (
            "gpuledger_exporter_pushes_failed_total",
            "Push attempts that failed (retried).",
            h.pushes_failed_total as f64,
        ),
        (
            "gpuledger_exporter_spool_dropped_batches_total",
            "Batches dropped because the spool was full, its bound or its disk (samples lost; the newest kept).",
            h.spool_dropped_total as f64,
        ),
        (
            "gpuledger_exporter_spool_lost_batches_total",
            "Batches that could not be spooled at all (a write error with nothing older to drop).",
            h.spool_lost_total as f64,
        ),
        (
            "gpuledger_exporter_otlp_exports_total",
            "OTLP exports the receiver accepted.",
            h.otlp_exports_total as f64,
        ),
        (
            "gpuledger_exporter_otlp_exports_failed_total",
            "OTLP exports that failed (the next interval sends the then latest values).",
            h.otlp_exports_failed_total as f64,
        ),
    ];
    for (name, help, v) in counters {
        out.family(name, "counter", help);
        out.sample(name, &src, v);
    }
    let gauges: [(&str, &str, f64); 5] = [
        (
            "gpuledger_exporter_source_up",
            "1 when the last collection succeeded.",
            if h.source_up { 1.0 } else { 0.0 },
        ),
        (
            "gpuledger_exporter_last_collection_seconds",
            "Duration of the last collection.",
            h.last_collection_seconds,
        ),
        (
            "gpuledger_exporter_spool_bytes",
            "Bytes of batches waiting in the spool.",
            h.spool_bytes as f64,
        ),
        (
            "gpuledger_exporter_spool_batches",
            "Batches waiting in the spool.",
            h.spool_batches as f64,
        ),
        (
            "gpuledger_exporter_batches_rejected_total",
            "Batches the aggregator refused for good (kept in spool/rejected).",
            h.batches_rejected_total as f64,
        ),
    ];
    for (name, help, v) in gauges {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        out.family(name, kind, help);
        out.sample(name, &src, v);
    }
    if let Some(t) = h.last_push_timestamp_seconds {
        let name = "gpuledger_exporter_last_push_timestamp_seconds";
        out.family(
            name,
            "gauge",
            "When the aggregator last acknowledged a batch (Unix time).",
        );
        out.sample(name, &src, t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::synthetic_devices;
    use gpuledger_model::GpuModel;

    fn snapshot() -> Snapshot {
        let devices = synthetic_devices(1, "node001", 2, GpuModel::H100Sxm);
        Snapshot {
            node: "node001".into(),
            source: "synthetic",
            readings: vec![
                Some(GpuReading {
                    index: 0,
                    gpu_util_pct: Some(97.0),
                    tensor_active: Some(0.42),
                    mem_used_bytes: Some(3 << 30),
                    mem_total_bytes: Some(80 << 30),
                    xid: Some(79),
                    processes: Some(2),
                    ..GpuReading::default()
                }),
                None,
            ],
            labels: vec![
                Some(JobLabel {
                    job_id: "42".into(),
                    account: "team-a".into(),
                    project: Some("llm \"big\"".into()),
                }),
                None,
            ],
            energy_joules_total: vec![1500.5, 0.0],
            xid_total: [((0, 79), 2)].into(),
            devices,
            health: Health::default(),
        }
    }

    #[test]
    fn gpu_series_carry_dcgm_exporters_names_identity_labels_and_tenant_labels() {
        let snap = snapshot();
        let uuid = snap.devices[0].uuid.clone();
        let text = render(&snap, Format::Prometheus);
        let identity = format!(
            "gpu=\"0\",UUID=\"{uuid}\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node001\""
        );
        assert!(text.contains(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{{identity},hpc_job=\"42\",account=\"team-a\",project=\"llm \\\"big\\\"\"}} 97\n"
        )), "{text}");
        assert!(
            text.contains(&format!("DCGM_FI_DEV_FB_FREE{{{identity},")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "gpuledger_gpu_processes{{{identity},hpc_job=\"42\""
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{identity},hpc_job=\"42\",account=\"team-a\",project=\"llm \\\"big\\\"\"}} 1500500\n"
        )), "energy in mJ: {text}");
        assert!(
            text.contains("gpuledger_gpu_up{gpu=\"1\",Hostname=\"node001\"} 0\n"),
            "{text}"
        );
        assert!(text.contains(
            "gpuledger_gpu_xid_errors_total{gpu=\"0\",Hostname=\"node001\",xid=\"79\"} 2\n"
        ));
        assert!(!text.contains("# EOF"));
        assert!(
            text.contains("# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active (0-1).\n"),
            "PROF_* fields are ratios, as their values"
        );
        assert!(!text.contains("(in %).\n# TYPE DCGM_FI_PROF"), "{text}");
    }

    #[test]
    fn a_mig_instance_carries_its_profile_and_instance_id() {
        let mut snap = snapshot();
        snap.devices[0].mig_instance = Some("1g.10gb/3".into());
        let text = render(&snap, Format::Prometheus);
        assert!(
            text.contains(
                "Hostname=\"node001\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"3\",hpc_job=\"42\""
            ),
            "{text}"
        );
        assert_eq!(snap.devices[0].mig_profile_and_id(), Some(("1g.10gb", "3")));
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let text = render(&snapshot(), Format::OpenMetrics);
        assert!(text.contains("# TYPE gpuledger_gpu_energy_joules counter\n"));
        assert!(text.contains(
            "gpuledger_gpu_energy_joules_total{gpu=\"0\",Hostname=\"node001\"} 1500.5\n"
        ));
        assert!(text.ends_with("# EOF\n"));
        assert!(
            text.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n"),
            "a counter without _total is no OpenMetrics counter"
        );
    }
}
