//! The exporter's loops. The sampler reads the source every sample interval, labels each GPU
//! with its job (from the job-mapping directory), publishes a snapshot for `/metrics`, and every
//! push interval spools the collected rows as one Arrow IPC batch. The pusher sends spooled
//! batches to the aggregator oldest first, deleting each once acknowledged; when the
//! aggregator is unreachable it backs off exponentially with jitter and the spool holds the
//! batches.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use gpuledger_model::rng::SplitMix64;
use gpuledger_model::sample::SampleBatchBuilder;
use gpuledger_model::time::Clock;
use gpuledger_model::wire::encode_ipc;

use crate::exposition::Snapshot;
use crate::source::{sample_ref, GpuDevice, GpuSource, JobLabel};
use crate::spool::Spool;

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node: String,
    pub sample_interval: Duration,
    pub push_interval: Duration,
    /// Base URL of the aggregator; `None` keeps batches in the spool.
    pub aggregator_url: Option<String>,
    /// Files named by GPU index holding `job_id account [project]`; absent or empty: idle.
    pub job_mapping_dir: Option<PathBuf>,
    /// Base URL of `gpuledger scheduler`: its allocation feed labels the GPUs instead
    /// (re-read every few seconds; the last answer stands while it is away).
    pub scheduler_url: Option<String>,
    /// This node's token: sent to the aggregator with each push and to the scheduler's
    /// allocation feed (both read the same token file).
    pub aggregator_token: Option<String>,
    pub max_backoff: Duration,
    /// What an `https://` aggregator or scheduler must present (the cluster's CA, or else the
    /// Mozilla roots).
    pub tls: ureq::tls::TlsConfig,
}

/// State shared by the loops and the `/metrics` handler.
#[derive(Debug)]
pub struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    spool: Mutex<Spool>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(snapshot: Snapshot, spool: Spool) -> Arc<Self> {
        Arc::new(Shared {
            snapshot: RwLock::new(Arc::new(snapshot)),
            spool: Mutex::new(spool),
            stop: AtomicBool::new(false),
        })
    }

    /// The latest snapshot; cheap, never blocks on collection.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        let mut guard = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        let mut next = (**guard).clone();
        f(&mut next);
        *guard = Arc::new(next);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps up to `period`, waking early when the exporter stops; whether it is stopping.
    pub(crate) fn wait_or_stop(&self, period: Duration) -> bool {
        let until = Instant::now() + period;
        while !self.stopping() {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return false;
            };
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        true
    }

    pub(crate) fn count_otlp_export(&self, ok: bool) {
        self.update(|s| {
            s.health.otlp_exports_total += u64::from(ok);
            s.health.otlp_exports_failed_total += u64::from(!ok);
        });
    }

    fn publish_spool(&self) {
        let (bytes, batches, dropped, lost) = {
            let spool = lock(&self.spool);
            (
                spool.bytes(),
                spool.len() as u64,
                spool.dropped(),
                spool.lost(),
            )
        };
        self.update(|s| {
            s.health.spool_bytes = bytes;
            s.health.spool_batches = batches;
            s.health.spool_dropped_total = dropped;
            s.health.spool_lost_total = lost;
        });
    }
}

/// Reads the job-mapping directory: file `<gpu index>` holds `job_id account [project]`.
/// Returns a label per device, by position; a MIG instance in slot S of GPU G reads `G-S`,
/// else G's file.
pub fn read_job_mapping(dir: &std::path::Path, devices: &[GpuDevice]) -> Vec<Option<JobLabel>> {
    devices
        .iter()
        .map(|d| {
            let i = d.index;
            // A MIG instance (`<profile>/<slot>`) reads `<gpu>-<slot>` first, then its GPU's file.
            let own = d
                .mig_instance
                .as_deref()
                .and_then(|m| m.rsplit_once('/'))
                .map(|(_, slot)| format!("{i}-{slot}"));
            let text = own
                .and_then(|name| std::fs::read_to_string(dir.join(name)).ok())
                .or_else(|| std::fs::read_to_string(dir.join(i.to_string())).ok())?;
            let mut words = text.split_whitespace();
            let job_id = words.next()?.to_owned();
            let Some(account) = words.next() else {
                tracing::warn!(
                    gpu = i,
                    "job mapping names a job without its account; GPU shown idle"
                );
                return None;
            };
            Some(JobLabel {
                job_id,
                account: account.to_owned(),
                project: words.next().map(str::to_owned),
            })
        })
        .collect()
}

/// Labels from the scheduler's allocation feed (`GET /api/v1/allocations`), re-read at most
/// every [`AllocationFeed::REFRESH`]; while the scheduler does not answer the last labels stand
/// (a job keeps its GPUs while the scheduler restarts).
#[derive(Debug)]
pub struct AllocationFeed {
    agent: ureq::Agent,
    last: Option<(Instant, Vec<Option<JobLabel>>)>,
}

impl AllocationFeed {
    pub const REFRESH: Duration = Duration::from_secs(5);

    /// A feed read over connections that trust what `tls` says.
    pub fn new(tls: ureq::tls::TlsConfig) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .tls_config(tls)
            .build()
            .into();
        AllocationFeed { agent, last: None }
    }

    /// This node's labels; `token` is the node's token (the scheduler with `--tokens` shows a
    /// node its own GPUs only).
    pub fn labels(
        &mut self,
        url: &str,
        token: Option<&str>,
        node: &str,
        devices: &[GpuDevice],
    ) -> Vec<Option<JobLabel>> {
        if let Some((at, labels)) = &self.last {
            if at.elapsed() < Self::REFRESH && labels.len() == devices.len() {
                return labels.clone();
            }
        }
        match fetch_allocations(&self.agent, url, token, node, devices) {
            Ok(labels) => {
                self.last = Some((Instant::now(), labels.clone()));
                labels
            }
            Err(error) => {
                tracing::warn!(url, %error, "allocation feed unavailable; keeping the last labels");
                let kept = self
                    .last
                    .as_ref()
                    .map(|(_, l)| l.clone())
                    .unwrap_or_else(|| vec![None; devices.len()]);
                // Try again at the next refresh, not at every sample.
                self.last = Some((Instant::now(), kept.clone()));
                kept
            }
        }
    }
}

/// This node's GPUs in the scheduler's allocation feed, by device position.
pub fn fetch_allocations(
    agent: &ureq::Agent,
    url: &str,
    token: Option<&str>,
    node: &str,
    devices: &[GpuDevice],
) -> Result<Vec<Option<JobLabel>>, String> {
    let mut request = agent.get(format!("{}/api/v1/allocations", url.trim_end_matches('/')));
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let text = request
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let rows = value["gpus"]
        .as_array()
        .ok_or("the reply has no `gpus` list")?;
    let mut labels = vec![None; devices.len()];
    for row in rows.iter().filter(|r| r["node"] == node) {
        let Some(gpu) = row["gpu"].as_u64() else {
            continue;
        };
        let (Some(job), Some(account)) = (row["job_id"].as_str(), row["account"].as_str()) else {
            continue;
        };
        for (i, d) in devices.iter().enumerate() {
            if u64::from(d.index) == gpu {
                labels[i] = Some(JobLabel {
                    job_id: job.to_owned(),
                    account: account.to_owned(),
                    project: row["project"].as_str().map(str::to_owned),
                });
            }
        }
    }
    Ok(labels)
}

/// Runs the sampler until [`Shared::stop`]; spools what it collected on the way out.
pub fn run_sampler(
    mut source: Box<dyn GpuSource>,
    config: &AgentConfig,
    clock: &dyn Clock,
    shared: &Shared,
) {
    let devices = source.devices().to_vec();
    let mut builder = SampleBatchBuilder::with_capacity(devices.len() * 16);
    let mut last_push = Instant::now();
    let interval_s = config.sample_interval.as_secs().max(1) as u32;
    let mut feed = AllocationFeed::new(config.tls.clone());
    while !shared.stopping() {
        let started = Instant::now();
        let now_ms = clock.now_ms();
        let mut labels = match (&config.scheduler_url, &config.job_mapping_dir) {
            (Some(url), _) => feed.labels(
                url,
                config.aggregator_token.as_deref(),
                &config.node,
                &devices,
            ),
            (None, Some(dir)) => read_job_mapping(dir, &devices),
            (None, None) => vec![None; devices.len()],
        };
        source.set_jobs(&labels);
        let result = source.read(now_ms);
        if config.job_mapping_dir.is_none() && config.scheduler_url.is_none() {
            if let Some(known) = source.job_labels() {
                labels = known;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        match result {
            Ok(readings) => {
                for (device, reading) in devices.iter().zip(&readings) {
                    let label = labels
                        .get(usize::from(device.index))
                        .and_then(Option::as_ref);
                    builder.push_ref(&sample_ref(
                        &config.node,
                        device,
                        reading,
                        label,
                        now_ms,
                        interval_s,
                    ));
                }
                shared.update(|s| {
                    for (i, r) in readings.iter().enumerate() {
                        if let Some(total) = s.energy_joules_total.get_mut(i) {
                            *total += r.energy_j.unwrap_or(0.0);
                        }
                        if let Some(xid) = r.xid {
                            *s.xid_total.entry((r.index, xid)).or_default() += 1;
                        }
                    }
                    s.readings = readings.into_iter().map(Some).collect();
                    s.labels = labels;
                    s.health.samples_total += devices.len() as u64;
                    s.health.collections_total += 1;
                    s.health.collection_seconds_total += elapsed;
                    s.health.last_collection_seconds = elapsed;
                    s.health.source_up = true;
                    s.health.source_error = None;
                });
            }
            Err(error) => {
                tracing::error!(%error, "collection failed");
                shared.update(|s| {
                    s.readings = vec![None; devices.len()];
                    s.health.source_errors_total += 1;
                    s.health.source_up = false;
                    s.health.source_error = Some(error.to_string());
                });
            }
        }
        if last_push.elapsed() >= config.push_interval {
            last_push = Instant::now();
            spool_batch(&mut builder, shared);
        }
        let wait = config.sample_interval.saturating_sub(started.elapsed());
        sleep_unless_stopped(shared, wait);
    }
    spool_batch(&mut builder, shared);
}

fn sleep_unless_stopped(shared: &Shared, wait: Duration) {
    let until = Instant::now() + wait;
    while !shared.stopping() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

fn spool_batch(builder: &mut SampleBatchBuilder, shared: &Shared) {
    if builder.is_empty() {
        return;
    }
    let result = builder
        .finish()
        .map_err(|e| e.to_string())
        .and_then(|batch| encode_ipc(&batch).map_err(|e| e.to_string()))
        .and_then(|bytes| lock(&shared.spool).push(&bytes).map_err(|e| e.to_string()));
    if let Err(error) = result {
        tracing::error!(%error, "could not spool a batch; its samples are lost");
    }
    shared.publish_spool();
}

/// What one push attempt got.
#[derive(Debug, PartialEq, Eq)]
enum Pushed {
    Acknowledged,
    /// Refused for good (4xx): kept aside, never retried.
    Refused(u16, String),
    Failed(String),
}

/// Who pushes: the node, its token, its spool's epoch.
struct Sender<'a> {
    node: &'a str,
    token: Option<&'a str>,
    epoch: &'a str,
}

fn push_once(
    agent: &ureq::Agent,
    url: &str,
    sender: &Sender<'_>,
    seq: u64,
    body: &[u8],
    sent_at_ms: i64,
) -> Pushed {
    let Sender { node, token, epoch } = *sender;
    use gpuledger_model::wire::{
        EPOCH_HEADER, INGEST_CONTENT_TYPE, INGEST_PATH, LOW_SEQ_HEADER, NODE_HEADER,
        SENT_AT_HEADER, SEQ_HEADER,
    };
    let mut request = agent.post(format!("{}{INGEST_PATH}", url.trim_end_matches('/')));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request
        .header("content-type", INGEST_CONTENT_TYPE)
        .header(NODE_HEADER, node)
        .header(EPOCH_HEADER, epoch)
        .header(SEQ_HEADER, seq.to_string())
        // Batches go oldest first: nothing below this one will ever be sent again (each was
        // acknowledged, refused, or dropped from a full spool).
        .header(LOW_SEQ_HEADER, seq.to_string())
        // The node's clock when it sent: the aggregator measures the node's offset from it.
        .header(SENT_AT_HEADER, sent_at_ms.to_string())
        .send(body);
    match response {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            match status {
                200..=299 => Pushed::Acknowledged,
                // A missing or wrong token is the node's configuration, not the batch's
                // fault: keep the batch and retry, loudly.
                401 | 403 => {
                    Pushed::Failed(format!("HTTP {status} (check the node's token): {text}"))
                }
                400..=499 => Pushed::Refused(status, text),
                _ => Pushed::Failed(format!("HTTP {status}: {text}")),
            }
        }
        Err(e) => Pushed::Failed(e.to_string()),
    }
}

/// Runs the pusher until [`Shared::stop`] (then makes one last pass over the spool).
pub fn run_pusher(config: &AgentConfig, clock: &dyn Clock, shared: &Shared) {
    let Some(url) = &config.aggregator_url else {
        return;
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(config.tls.clone())
        .build()
        .into();
    let mut rng = SplitMix64::new(clock.now_ms() as u64);
    let mut backoff = Duration::ZERO;
    loop {
        let stopping = shared.stopping();
        let (next, epoch) = {
            let spool = lock(&shared.spool);
            (spool.oldest(), spool.epoch().to_owned())
        };
        let (seq, bytes) = match next {
            Ok(Some(b)) => b,
            Ok(None) if stopping => return,
            Ok(None) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(error) => {
                tracing::error!(%error, "reading the spool");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        match push_once(
            &agent,
            url,
            &Sender {
                node: &config.node,
                token: config.aggregator_token.as_deref(),
                epoch: &epoch,
            },
            seq,
            &bytes,
            clock.now_ms(),
        ) {
            Pushed::Acknowledged => {
                backoff = Duration::ZERO;
                if let Err(error) = lock(&shared.spool).remove(seq) {
                    tracing::error!(%error, seq, "removing an acknowledged batch");
                }
                let now_s = clock.now_ms() as f64 / 1000.0;
                shared.update(|s| {
                    s.health.pushes_ok_total += 1;
                    s.health.last_push_timestamp_seconds = Some(now_s);
                });
            }
            Pushed::Refused(status, body) => {
                tracing::error!(seq, status, body = %body, "aggregator refused a batch for good; kept in spool/rejected");
                if let Err(error) = lock(&shared.spool).reject(seq) {
                    tracing::error!(%error, seq, "moving a refused batch aside");
                }
                shared.update(|s| s.health.batches_rejected_total += 1);
            }
            Pushed::Failed(error) => {
                shared.update(|s| s.health.pushes_failed_total += 1);
                if stopping {
                    tracing::warn!(%error, "aggregator unreachable at shutdown; batches stay in the spool");
                    return;
                }
                backoff = next_backoff(backoff, config.max_backoff);
                // Full jitter in [backoff/2, backoff], so restarting nodes do not retry together.
                let jittered = backoff.mul_f64(0.5 + 0.5 * rng.next_f64());
                tracing::warn!(%error, seq, retry_in_ms = jittered.as_millis() as u64, "push failed");
                sleep_unless_stopped(shared, jittered);
            }
        }
        shared.publish_spool();
    }
}

/// Doubles from 100 ms up to `max`.
pub fn next_backoff(current: Duration, max: Duration) -> Duration {
    if current.is_zero() {
        Duration::from_millis(100).min(max)
    } else {
        (current * 2).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap() {
        let max = Duration::from_secs(1);
        let mut b = Duration::ZERO;
        let steps: Vec<u128> = (0..6)
            .map(|_| {
                b = next_backoff(b, max);
                b.as_millis()
            })
            .collect();
        assert_eq!(steps, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn job_mapping_reads_dcgm_style_files_with_tenants() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0"), "4242 team-a llm\n").unwrap();
        std::fs::write(dir.path().join("2"), "77\n").unwrap();
        let devices =
            crate::synthetic::synthetic_devices(1, "n", 3, gpuledger_model::GpuModel::H100Sxm);
        let labels = read_job_mapping(dir.path(), &devices);
        assert_eq!(labels[0].as_ref().unwrap().project.as_deref(), Some("llm"));
        assert!(labels[1].is_none(), "no file: idle");
        assert!(labels[2].is_none(), "job without account: idle, warned");
    }

    #[test]
    fn a_mig_instance_reads_its_own_file_before_its_gpus() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0"), "1 team-a\n").unwrap();
        std::fs::write(dir.path().join("0-3"), "2 team-b\n").unwrap();
        let mut devices =
            crate::synthetic::synthetic_devices(1, "n", 2, gpuledger_model::GpuModel::H100Sxm);
        for (d, slot) in devices.iter_mut().zip(["1g.10gb/3", "1g.10gb/4"]) {
            d.index = 0;
            d.mig_instance = Some(slot.to_owned());
        }
        let jobs: Vec<String> = read_job_mapping(dir.path(), &devices)
            .into_iter()
            .map(|l| l.unwrap().job_id)
            .collect();
        assert_eq!(jobs, ["2", "1"]);
    }
}
