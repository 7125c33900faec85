//! A source that reads an existing dcgm-exporter: many clusters already run it, and it has the
//! profiling fields (SM active, tensor pipe active, DRAM active) NVML alone does not give. The
//! page is scraped by the sampler loop (never by our own `/metrics`), parsed, and mapped to
//! readings per GPU, or per MIG instance when the GPU is partitioned. dcgm-exporter's job
//! labels become job labels: `hpc_job` or `pod` is the job, `namespace` the account.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::promtext::{parse, Sample};
use crate::source::{GpuDevice, GpuReading, GpuSource, JobLabel, Result, SourceError};

/// A device's key on the page: the GPU index and, for a MIG instance, its `GPU_I_ID`.
type Key = (u16, Option<String>);

/// What one page says, per device.
#[derive(Debug, Default)]
pub struct Page {
    pub devices: Vec<GpuDevice>,
    pub readings: Vec<GpuReading>,
    pub labels: Vec<Option<JobLabel>>,
    /// Energy counters since boot (mJ), per device, to turn into per-interval joules.
    pub energy_mj: Vec<Option<f64>>,
}

fn scrape_error(url: &str, message: String) -> SourceError {
    SourceError::Scrape {
        url: url.to_owned(),
        message,
    }
}

/// Maps a parsed page to devices and readings. GPU-level fields (clock, temperature) are
/// shared by a GPU's MIG instances; power and energy are not split between instances (not
/// measured per instance), so instances carry none.
pub fn interpret(url: &str, samples: &[Sample]) -> Result<Page> {
    interpret_with(url, samples, None)
}

/// [`interpret`], with the project of a GPU's job read from the series label `project_label`
/// (a pod label dcgm-exporter adds, e.g. Kueue's queue name) where given.
pub fn interpret_with(url: &str, samples: &[Sample], project_label: Option<&str>) -> Result<Page> {
    let mut gpus: BTreeMap<u16, BTreeMap<&str, f64>> = BTreeMap::new();
    let mut instances: BTreeMap<Key, (&Sample, BTreeMap<&str, f64>)> = BTreeMap::new();
    let mut first_sample: BTreeMap<u16, &Sample> = BTreeMap::new();
    // A device's job label from whichever of its series carries one.
    let mut labels: BTreeMap<Key, JobLabel> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name.starts_with("DCGM_FI_")) {
        let gpu: u16 = s
            .label("gpu")
            .ok_or_else(|| scrape_error(url, format!("`{}` has no `gpu` label", s.name)))?
            .parse()
            .map_err(|_| scrape_error(url, format!("`{}`: `gpu` label is not an index", s.name)))?;
        first_sample.entry(gpu).or_insert(s);
        let instance = s.label("GPU_I_ID").filter(|i| !i.is_empty());
        if let Some(label) = job_label(s, project_label) {
            labels
                .entry((gpu, instance.map(str::to_owned)))
                .or_insert(label);
        }
        match instance {
            Some(instance) => {
                instances
                    .entry((gpu, Some(instance.to_owned())))
                    .or_insert_with(|| (s, BTreeMap::new()))
                    .1
                    .insert(&s.name, s.value);
            }
            None => {
                gpus.entry(gpu).or_default().insert(&s.name, s.value);
            }
        }
    }
    let partitioned: std::collections::BTreeSet<u16> = instances.keys().map(|(g, _)| *g).collect();
    let mut page = Page::default();
    for (&gpu, sample) in &first_sample {
        let gpu_fields = gpus.get(&gpu).cloned().unwrap_or_default();
        if partitioned.contains(&gpu) {
            for (key, (first, fields)) in instances.iter().filter(|((g, _), _)| *g == gpu) {
                let instance = &key.1;
                let mut reading = reading_from(gpu, fields);
                reading.sm_clock_mhz = field(&gpu_fields, "DCGM_FI_DEV_SM_CLOCK").map(|v| v as u32);
                reading.temperature_c =
                    field(&gpu_fields, "DCGM_FI_DEV_GPU_TEMP").map(|v| v as f32);
                page.devices
                    .push(device(url, gpu, first, instance.as_deref())?);
                page.readings.push(reading);
                page.labels.push(labels.get(key).cloned());
                page.energy_mj.push(None);
            }
        } else {
            page.devices.push(device(url, gpu, sample, None)?);
            page.readings.push(reading_from(gpu, &gpu_fields));
            page.labels.push(labels.get(&(gpu, None)).cloned());
            page.energy_mj
                .push(field(&gpu_fields, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"));
        }
    }
    if page.devices.is_empty() {
        return Err(scrape_error(url, "no DCGM_FI_ series on the page".into()));
    }
    Ok(page)
}

fn field(fields: &BTreeMap<&str, f64>, name: &str) -> Option<f64> {
    fields.get(name).copied().filter(|v| v.is_finite())
}

fn reading_from(gpu: u16, f: &BTreeMap<&str, f64>) -> GpuReading {
    let mib = |name| field(f, name).map(|v| (v.max(0.0) as u64) << 20);
    let (used, free, reserved) = (
        mib("DCGM_FI_DEV_FB_USED"),
        mib("DCGM_FI_DEV_FB_FREE"),
        mib("DCGM_FI_DEV_FB_RESERVED"),
    );
    GpuReading {
        index: gpu,
        gpu_util_pct: field(f, "DCGM_FI_DEV_GPU_UTIL").map(|v| v as f32),
        sm_active: field(f, "DCGM_FI_PROF_SM_ACTIVE").map(|v| v as f32),
        tensor_active: field(f, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE").map(|v| v as f32),
        dram_active: field(f, "DCGM_FI_PROF_DRAM_ACTIVE").map(|v| v as f32),
        sm_clock_mhz: field(f, "DCGM_FI_DEV_SM_CLOCK").map(|v| v as u32),
        gr_engine_active: field(f, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").map(|v| v as f32),
        mem_copy_util_pct: field(f, "DCGM_FI_DEV_MEM_COPY_UTIL").map(|v| v as f32),
        mem_clock_mhz: field(f, "DCGM_FI_DEV_MEM_CLOCK").map(|v| v as u32),
        pcie_tx_bytes_per_s: field(f, "DCGM_FI_PROF_PCIE_TX_BYTES"),
        pcie_rx_bytes_per_s: field(f, "DCGM_FI_PROF_PCIE_RX_BYTES"),
        nvlink_tx_bytes_per_s: field(f, "DCGM_FI_PROF_NVLINK_TX_BYTES"),
        nvlink_rx_bytes_per_s: field(f, "DCGM_FI_PROF_NVLINK_RX_BYTES"),
        mem_used_bytes: used,
        mem_total_bytes: match (used, free) {
            (Some(u), Some(fr)) => Some(u + fr + reserved.unwrap_or(0)),
            _ => None,
        },
        power_w: field(f, "DCGM_FI_DEV_POWER_USAGE").map(|v| v as f32),
        energy_j: None,
        temperature_c: field(f, "DCGM_FI_DEV_GPU_TEMP").map(|v| v as f32),
        xid: field(f, "DCGM_FI_DEV_XID_ERRORS")
            .filter(|v| *v > 0.0)
            .map(|v| v as u32),
        // dcgm-exporter's default counters do not list processes.
        processes: None,
        process_memory_bytes: None,
    }
}

fn device(url: &str, gpu: u16, s: &Sample, instance: Option<&str>) -> Result<GpuDevice> {
    let name = s.label("modelName").unwrap_or_default();
    let model = GpuModel::from_marketing_name(name)
        .ok_or_else(|| SourceError::UnknownModel(format!("{name} (GPU {gpu} at {url})")))?;
    Ok(GpuDevice {
        index: gpu,
        uuid: s.label("UUID").unwrap_or_default().to_owned(),
        model,
        mig_instance: instance
            .map(|id| format!("{}/{id}", s.label("GPU_I_PROFILE").unwrap_or("mig"))),
        pci_bus_id: s.label("pci_bus_id").unwrap_or_default().to_owned(),
    })
}

/// A series' job: `hpc_job` or `pod` is the job, `namespace` the account, and the label
/// `project_label` (when given and present) the project.
fn job_label(s: &Sample, project_label: Option<&str>) -> Option<JobLabel> {
    let job = s
        .label("hpc_job")
        .filter(|j| !j.is_empty())
        .or_else(|| s.label("pod").filter(|p| !p.is_empty()))?;
    let account = s.label("namespace").filter(|n| !n.is_empty())?;
    Some(JobLabel {
        job_id: job.to_owned(),
        account: account.to_owned(),
        project: project_label
            .and_then(|l| s.label(l))
            .filter(|p| !p.is_empty())
            .map(str::to_owned),
    })
}

/// Scrapes a dcgm-exporter endpoint.
#[derive(Debug)]
pub struct DcgmExporterSource {
    url: String,
    project_label: Option<String>,
    agent: ureq::Agent,
    devices: Vec<GpuDevice>,
    labels: Vec<Option<JobLabel>>,
    last_energy_mj: Vec<Option<f64>>,
}

impl DcgmExporterSource {
    /// Scrapes once to learn the GPUs; fails with the reason when the page cannot be read.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, None)
    }

    /// [`Self::open`], reading each job's project from the series label `project_label`.
    pub fn open_with(url: &str, project_label: Option<&str>) -> Result<Self> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let mut source = DcgmExporterSource {
            url: url.to_owned(),
            project_label: project_label.map(str::to_owned),
            agent,
            devices: Vec::new(),
            labels: Vec::new(),
            last_energy_mj: Vec::new(),
        };
        let page = source.scrape()?;
        source.last_energy_mj = page.energy_mj;
        source.labels = page.labels;
        source.devices = page.devices;
        Ok(source)
    }

    fn scrape(&self) -> Result<Page> {
        let text = self
            .agent
            .get(&self.url)
            .call()
            .map_err(|e| scrape_error(&self.url, e.to_string()))?
            .body_mut()
            .read_to_string()
            .map_err(|e| scrape_error(&self.url, format!("reading the page: {e}")))?;
        let samples = parse(&text).map_err(|e| scrape_error(&self.url, e.to_string()))?;
        interpret_with(&self.url, &samples, self.project_label.as_deref())
    }
}

impl GpuSource for DcgmExporterSource {
    fn kind(&self) -> &'static str {
        "dcgm-exporter"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn read(&mut self, _now_ms: UnixMillis) -> Result<Vec<GpuReading>> {
        let page = self.scrape()?;
        let mut out = Vec::with_capacity(self.devices.len());
        for (i, device) in self.devices.iter().enumerate() {
            let found = page.devices.iter().position(|d| d == device);
            let Some(j) = found else {
                // A GPU that left the page: nothing measured this time.
                out.push(GpuReading {
                    index: device.index,
                    ..GpuReading::default()
                });
                continue;
            };
            let mut reading = page.readings[j].clone();
            if let (Some(now), Some(Some(before))) = (page.energy_mj[j], self.last_energy_mj.get(i))
            {
                reading.energy_j = (now >= *before).then(|| (now - before) / 1000.0);
            }
            if let Some(slot) = self.last_energy_mj.get_mut(i) {
                *slot = page.energy_mj[j];
            }
            if let Some(slot) = self.labels.get_mut(i) {
                *slot = page.labels[j].clone();
            }
            out.push(reading);
        }
        Ok(out)
    }

    fn job_labels(&self) -> Option<Vec<Option<JobLabel>>> {
        Some(self.labels.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &str) -> Page {
        interpret("fixture", &parse(text).unwrap()).unwrap()
    }

    #[test]
    fn default_counters_of_four_h100s() {
        let p = page(include_str!("../tests/fixtures/dcgm-exporter-h100.txt"));
        assert_eq!(p.devices.len(), 4);
        assert!(p
            .devices
            .iter()
            .all(|d| d.model == GpuModel::H100Sxm && d.mig_instance.is_none()));
        let r = &p.readings[0];
        assert_eq!(r.gpu_util_pct, Some(100.0));
        assert_eq!(r.tensor_active, Some(0.453125));
        assert_eq!(r.sm_clock_mhz, Some(1980));
        assert_eq!(r.mem_used_bytes, Some(77864 << 20));
        assert_eq!(r.mem_total_bytes, Some((77864 + 3215) << 20));
        assert_eq!(p.readings[2].xid, Some(79));
        assert_eq!(p.readings[0].xid, None, "0 means no XID");
        assert_eq!(p.energy_mj[0], Some(91234567890.0));
        // hpc_job without a namespace names no account: idle, not mislabelled.
        assert!(p.labels.iter().all(Option::is_none));
    }

    #[test]
    fn mig_instances_are_devices_with_their_tenants() {
        let p = page(include_str!("../tests/fixtures/dcgm-exporter-mig.txt"));
        let names: Vec<Option<&str>> = p
            .devices
            .iter()
            .map(|d| d.mig_instance.as_deref())
            .collect();
        assert_eq!(
            names,
            vec![
                Some("3g.40gb/1"),
                Some("1g.10gb/10"),
                Some("1g.10gb/9"),
                None
            ]
        );
        assert!(p.devices.iter().all(|d| d.model == GpuModel::A100));
        let trainer = &p.readings[0];
        assert_eq!(trainer.tensor_active, Some(0.5));
        assert_eq!(
            trainer.sm_clock_mhz,
            Some(1410),
            "the GPU's clock is shared"
        );
        assert_eq!(
            trainer.power_w, None,
            "power is not split between instances"
        );
        assert_eq!(
            p.labels[0]
                .as_ref()
                .map(|l| (l.job_id.as_str(), l.account.as_str())),
            Some(("trainer-0", "k8s-team-a"))
        );
        assert_eq!(p.labels[1], None, "an empty instance is idle");
        assert_eq!(p.readings[3].gpu_util_pct, Some(64.0));
        assert_eq!(
            p.labels[3].as_ref().map(|l| l.account.as_str()),
            Some("k8s-team-c")
        );
    }

    #[test]
    fn a_pod_label_names_the_project() {
        let text = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA H100 80GB HBM3\",namespace=\"team-a\",pod=\"llm-0\",label_kueue_x_k8s_io_queue_name=\"pretrain\"} 97\n";
        let samples = parse(text).unwrap();
        let plain = interpret("u", &samples).unwrap();
        assert_eq!(plain.labels[0].as_ref().unwrap().project, None);
        let p = interpret_with("u", &samples, Some("label_kueue_x_k8s_io_queue_name")).unwrap();
        let label = p.labels[0].as_ref().unwrap();
        assert_eq!(
            (
                label.job_id.as_str(),
                label.account.as_str(),
                label.project.as_deref()
            ),
            ("llm-0", "team-a", Some("pretrain"))
        );
    }

    #[test]
    fn a_truncated_page_is_a_clear_error() {
        let full = include_str!("../tests/fixtures/dcgm-exporter-h100.txt");
        let cut = &full[..full.len() / 2];
        let cut = &cut[..cut.rfind('{').unwrap() + 10];
        let err = parse(cut).unwrap_err();
        assert!(err.message.contains("truncated"), "{err}");
        let no_gpu =
            interpret("u", &parse("DCGM_FI_DEV_GPU_UTIL{UUID=\"x\"} 1\n").unwrap()).unwrap_err();
        assert!(no_gpu.to_string().contains("`gpu` label"), "{no_gpu}");
    }
}
