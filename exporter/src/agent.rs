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

use gpuledger_model::allocation_feed::{
    AllocationFeed as AllocationFeedReply, AllocationRow, ALLOCATIONS_PATH,
};
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

/// What a job-mapping file says of one GPU: its job, and the job's tenant when the file names
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedJob {
    pub job_id: String,
    /// `(account, project)` from gpuledger's format; `None` from dcgm-exporter's.
    pub tenant: Option<(String, Option<String>)>,
}

/// Parses one mapping file: gpuledger's `JOBID ACCOUNT [PROJECT]` on its first line, or
/// dcgm-exporter's HPC job mapping, one job id per line (the first labels the GPU: samples
/// carry one job). Blank lines are passed over; `None` for a file without a job.
pub fn parse_job_mapping(text: &str) -> Option<MappedJob> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next()?;
    let mut words = first.split_whitespace();
    let job_id = words.next()?.to_owned();
    let tenant = words
        .next()
        .map(|account| (account.to_owned(), words.next().map(str::to_owned)));
    Some(MappedJob { job_id, tenant })
}

/// Reads the job-mapping directory: the file named for a GPU's index (a MIG instance S of GPU
/// G: `G.S` or `G-S` first, then G's) in either format of [`parse_job_mapping`]. One entry per
/// device, by position.
pub fn read_job_mapping(dir: &std::path::Path, devices: &[GpuDevice]) -> Vec<Option<MappedJob>> {
    devices
        .iter()
        .map(|d| {
            let i = d.index;
            // A MIG instance's own file: dcgm-exporter names it `<gpu>.<instance>`, gpuledger's
            // prolog `<gpu>-<instance>`; then the whole GPU's.
            let slot = d
                .mig_instance
                .as_deref()
                .and_then(|m| m.rsplit_once('/'))
                .map(|(_, slot)| slot);
            let names = slot
                .into_iter()
                .flat_map(|slot| [format!("{i}.{slot}"), format!("{i}-{slot}")])
                .chain([i.to_string()]);
            let text = names
                .into_iter()
                .find_map(|name| std::fs::read_to_string(dir.join(name)).ok())?;
            let jobs = text.lines().filter(|l| !l.trim().is_empty()).count();
            let mapped = parse_job_mapping(&text)?;
            if mapped.tenant.is_none() && jobs > 1 {
                tracing::warn!(
                    gpu = i,
                    jobs,
                    job_id = %mapped.job_id,
                    "the job mapping names several jobs on one GPU; its samples carry the first"
                );
            }
            Some(mapped)
        })
        .collect()
}

/// The labels of mapped GPUs: a job the file gave a tenant keeps it; a job id alone
/// (dcgm-exporter's files) takes its account and project from the allocation feed `rows` of
/// this node (the aggregator's, from the job's own start event). A job the feed does not know
/// (yet) leaves its GPU unlabelled; `unresolved` collects those job ids.
pub fn resolve_tenants(
    mapped: &[Option<MappedJob>],
    rows: &[AllocationRow],
    unresolved: &mut std::collections::BTreeSet<String>,
) -> Vec<Option<JobLabel>> {
    mapped
        .iter()
        .map(|m| {
            let m = m.as_ref()?;
            let (account, project) = match &m.tenant {
                Some(t) => t.clone(),
                None => match rows.iter().find(|r| r.job_id == m.job_id) {
                    Some(r) => (r.account.clone(), r.project.clone()),
                    None => {
                        unresolved.insert(m.job_id.clone());
                        return None;
                    }
                },
            };
            Some(JobLabel {
                job_id: m.job_id.clone(),
                account,
                project,
            })
        })
        .collect()
}

/// The allocation feed ([`gpuledger_model::allocation_feed`]) of the scheduler (every GPU's
/// label) or of the aggregator (the accounts of jobs a dcgm-style mapping names).
#[derive(Debug)]
pub struct AllocationFeed {
    agent: ureq::Agent,
    last: Option<(Instant, Vec<AllocationRow>)>,
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

    /// This node's rows of the feed at `url`, read again at most every [`Self::REFRESH`];
    /// `token` is the node's token (a service with tokens shows a node its own GPUs only).
    /// While the feed does not answer the last rows stand (a job keeps its GPUs while the
    /// service restarts).
    pub fn rows(&mut self, url: &str, token: Option<&str>, node: &str) -> Vec<AllocationRow> {
        if let Some((at, rows)) = &self.last {
            if at.elapsed() < Self::REFRESH {
                return rows.clone();
            }
        }
        let rows = match fetch_allocations(&self.agent, url, token) {
            Ok(feed) => feed.gpus.into_iter().filter(|r| r.node == node).collect(),
            Err(error) => {
                tracing::warn!(url, %error, "allocation feed unavailable; keeping the last labels");
                self.last.take().map(|(_, rows)| rows).unwrap_or_default()
            }
        };
        // Read again at the next refresh, not at every sample, even after a failure.
        self.last = Some((Instant::now(), rows.clone()));
        rows
    }

    /// This node's labels from the feed, by device position.
    pub fn labels(
        &mut self,
        url: &str,
        token: Option<&str>,
        node: &str,
        devices: &[GpuDevice],
    ) -> Vec<Option<JobLabel>> {
        labels_of(&self.rows(url, token, node), devices)
    }
}

/// The feed at `url`.
pub fn fetch_allocations(
    agent: &ureq::Agent,
    url: &str,
    token: Option<&str>,
) -> Result<AllocationFeedReply, String> {
    let mut request = agent.get(format!("{}{ALLOCATIONS_PATH}", url.trim_end_matches('/')));
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let text = request
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("the reply is not an allocation feed: {e}"))
}

/// A label per device from its node's rows.
pub fn labels_of(rows: &[AllocationRow], devices: &[GpuDevice]) -> Vec<Option<JobLabel>> {
    devices
        .iter()
        .map(|d| {
            rows.iter()
                .find(|r| r.gpu == u32::from(d.index))
                .map(|r| JobLabel {
                    job_id: r.job_id.clone(),
                    account: r.account.clone(),
                    project: r.project.clone(),
                })
        })
        .collect()
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
    // The aggregator's feed, for the accounts of jobs a dcgm-style mapping names by id only.
    let mut accounts_feed = AllocationFeed::new(config.tls.clone());
    let mut warned_unresolved = std::collections::BTreeSet::new();
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
            (None, Some(dir)) => {
                let mapped = read_job_mapping(dir, &devices);
                let needs_feed = mapped.iter().flatten().any(|m| m.tenant.is_none());
                let rows = match (&config.aggregator_url, needs_feed) {
                    (Some(url), true) => {
                        accounts_feed.rows(url, config.aggregator_token.as_deref(), &config.node)
                    }
                    _ => Vec::new(),
                };
                let mut unresolved = std::collections::BTreeSet::new();
                let labels = resolve_tenants(&mapped, &rows, &mut unresolved);
                for job_id in unresolved.difference(&warned_unresolved) {
                    tracing::warn!(
                        job_id = %job_id,
                        "the job mapping names a job the aggregator's allocation feed does not know on this node (no start event with its allocation yet); its GPUs are unlabelled until it does"
                    );
                }
                warned_unresolved = unresolved;
                labels
            }
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
            answered(status, text)
        }
        Err(e) => Pushed::Failed(e.to_string()),
    }
}

/// What the aggregator's answer makes of a batch: stored, refused for good (set aside), or to
/// be sent again.
fn answered(status: u16, text: String) -> Pushed {
    match status {
        200..=299 => Pushed::Acknowledged,
        // A missing or wrong token is the node's configuration, not the batch's fault: keep
        // the batch and retry, loudly.
        401 | 403 => Pushed::Failed(format!("HTTP {status} (check the node's token): {text}")),
        // Timed out, or told to slow down: the request's fault, not the batch's.
        408 | 425 | 429 => Pushed::Failed(format!("HTTP {status}: {text}")),
        400..=499 => Pushed::Refused(status, text),
        _ => Pushed::Failed(format!("HTTP {status}: {text}")),
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
                if let Err(error) = lock(&shared.spool).reject(seq, &body) {
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
    fn a_batch_is_set_aside_only_for_what_it_holds_never_for_a_time_out_or_a_token() {
        let set_aside = |status| matches!(answered(status, String::new()), Pushed::Refused(..));
        assert!(answered(200, String::new()) == Pushed::Acknowledged);
        for status in [400, 409, 413, 422] {
            assert!(set_aside(status), "{status}");
        }
        // The service's request time-out, rate limits, a token, a full disk: sent again.
        for status in [401, 403, 408, 425, 429, 500, 503] {
            assert!(!set_aside(status), "{status}");
        }
    }

    fn row(gpu: u32, job: &str, account: &str) -> AllocationRow {
        AllocationRow {
            node: "n".into(),
            gpu,
            job_id: job.into(),
            account: account.into(),
            project: Some("p1".into()),
            share: None,
        }
    }

    #[test]
    fn job_mapping_reads_gpuledger_and_dcgm_exporter_files() {
        let dir = tempfile::tempdir().unwrap();
        // gpuledger's format; dcgm-exporter's (a job id a line, two jobs sharing GPU 2); none.
        std::fs::write(dir.path().join("0"), "4242 team-a llm\n").unwrap();
        std::fs::write(dir.path().join("2"), "77\n\n78\n").unwrap();
        std::fs::write(dir.path().join("3"), "\n").unwrap();
        let devices =
            crate::synthetic::synthetic_devices(1, "n", 4, gpuledger_model::GpuModel::H100Sxm);
        let mapped = read_job_mapping(dir.path(), &devices);
        assert_eq!(
            mapped,
            vec![
                Some(MappedJob {
                    job_id: "4242".into(),
                    tenant: Some(("team-a".into(), Some("llm".into())))
                }),
                None,
                Some(MappedJob {
                    job_id: "77".into(),
                    tenant: None
                }),
                None,
            ]
        );
        // The job id alone takes its tenant from the aggregator's feed; a job it does not
        // know leaves the GPU unlabelled, and is reported.
        let mut unresolved = std::collections::BTreeSet::new();
        let labels = resolve_tenants(&mapped, &[row(2, "77", "team-b")], &mut unresolved);
        let tenants: Vec<Option<(&str, &str)>> = labels
            .iter()
            .map(|l| l.as_ref().map(|l| (l.job_id.as_str(), l.account.as_str())))
            .collect();
        assert_eq!(
            tenants,
            [Some(("4242", "team-a")), None, Some(("77", "team-b")), None]
        );
        assert_eq!(labels[2].as_ref().unwrap().project.as_deref(), Some("p1"));
        assert!(unresolved.is_empty());
        let labels = resolve_tenants(&mapped, &[row(2, "99", "team-b")], &mut unresolved);
        assert!(labels[2].is_none());
        assert_eq!(unresolved.into_iter().collect::<Vec<_>>(), ["77"]);
    }

    #[test]
    fn feed_rows_label_devices_by_gpu_index() {
        let devices =
            crate::synthetic::synthetic_devices(1, "n", 3, gpuledger_model::GpuModel::H100Sxm);
        let labels = labels_of(&[row(1, "5", "team-a")], &devices);
        assert!(labels[0].is_none() && labels[2].is_none());
        assert_eq!(labels[1].as_ref().unwrap().job_id, "5");
    }

    #[test]
    fn a_mig_instance_reads_its_own_file_before_its_gpus() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0"), "1 team-a\n").unwrap();
        std::fs::write(dir.path().join("0-3"), "2 team-b\n").unwrap();
        // dcgm-exporter's name for instance 5, a job id alone.
        std::fs::write(dir.path().join("0.5"), "3\n").unwrap();
        let mut devices =
            crate::synthetic::synthetic_devices(1, "n", 3, gpuledger_model::GpuModel::H100Sxm);
        for (d, slot) in devices
            .iter_mut()
            .zip(["1g.10gb/3", "1g.10gb/4", "1g.10gb/5"])
        {
            d.index = 0;
            d.mig_instance = Some(slot.to_owned());
        }
        let jobs: Vec<String> = read_job_mapping(dir.path(), &devices)
            .into_iter()
            .map(|l| l.unwrap().job_id)
            .collect();
        assert_eq!(jobs, ["2", "1", "3"]);
    }
}
