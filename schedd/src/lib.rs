//! The live gpuledger scheduler: the pure policy of `gpuledger-scheduler` run against the wall
//! clock, with jobs run as real processes.
//!
//! - [`Service`] owns the scheduler, the job table and an [`executor::Executor`]; [`Service::tick`]
//!   reaps exited jobs, delivers SIGKILL at grace and time-limit deadlines, takes fair-share usage
//!   from the aggregator's feed (or accrues its own), runs one scheduling cycle and acts on it
//!   (launch, checkpoint signal, resize), then saves its [`state::State`] and sends job events.
//! - [`http`] is the API (`squeue`/`sshare`-like views, submit, cancel, reservations, the
//!   allocation feed exporters read).
//! - On start the state file is read back: pending jobs queue again, running ones keep their
//!   GPUs and their processes are adopted.

pub mod executor;
pub mod http;
pub mod state;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Serialize;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::time::{Clock, UnixSeconds};
use gpuledger_model::{AccountId, Allocation, JobId, ProjectId};
use gpuledger_scheduler::reservation::{reservations_toml, ReservationEntry};
use gpuledger_scheduler::{Cycle, JobSpec, Preempting, Refusal, Scheduler, SchedulerOptions};

use crate::executor::{Executor, ExitStatus, Launch};
use crate::state::{JobInfo, JobState, State, SubmitRequest};

/// What can go wrong in the service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: state file unreadable: {message}")]
    State { path: PathBuf, message: String },
    #[error("job {job}: {message}")]
    Restore { job: JobId, message: String },
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("job `{0}` is not known")]
    UnknownJob(JobId),
    #[error(transparent)]
    Reservation(#[from] gpuledger_scheduler::reservation::ReservationError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the service runs.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub options: SchedulerOptions,
    /// Holds `state.json`, `jobs/<id>/` and `job-mapping/<node>/<gpu>`.
    pub dir: PathBuf,
    /// Where billing reads reservations (`DATA/reservations.toml`), if anywhere.
    pub billing_reservations: Option<PathBuf>,
    /// The aggregator's base URL, for job events and the usage feed.
    pub aggregator: Option<String>,
    /// Bearer token for the aggregator (an operator token), when it runs with `--tokens`.
    pub aggregator_token: Option<String>,
    /// How often the usage feed (and the storage scans) are read.
    pub usage_every: Duration,
    /// `DATA/storage/scans.csv`, written by `gpuledger storage-scan`: the storage quota holds
    /// the jobs of accounts over it.
    pub storage_scans: Option<PathBuf>,
    /// What an `https://` aggregator must present (the cluster's CA, or else the Mozilla
    /// roots).
    pub tls: ureq::tls::TlsConfig,
}

/// The service: scheduler, job table, executor, persisted state.
#[derive(Debug)]
pub struct Service {
    inner: Mutex<Inner>,
    /// The aggregator's client: usage feed and job events.
    agent: ureq::Agent,
    config: ServiceConfig,
    cluster: ClusterConfig,
    clock: Arc<dyn Clock>,
}

#[derive(Debug)]
struct Inner {
    sched: Scheduler,
    state: State,
    executor: Box<dyn Executor>,
    dirty: bool,
    last_usage_s: UnixSeconds,
    last_storage_s: UnixSeconds,
    counters: Counters,
}

/// Counters since the service started (Prometheus counters reset with the process).
#[derive(Debug, Default)]
struct Counters {
    started: u64,
    preempted: u64,
    resized: u64,
    cycles: u64,
    cycle_seconds: f64,
}

fn signal_named(name: Option<&str>) -> Result<Signal> {
    match name.unwrap_or("TERM").trim_start_matches("SIG") {
        "TERM" => Ok(Signal::SIGTERM),
        "USR1" => Ok(Signal::SIGUSR1),
        "USR2" => Ok(Signal::SIGUSR2),
        "INT" => Ok(Signal::SIGINT),
        other => Err(Error::Invalid {
            field: "checkpoint_signal".into(),
            message: format!("`{other}` is not TERM, USR1, USR2 or INT"),
        }),
    }
}

fn spec_of(info: &JobInfo) -> JobSpec {
    let r = &info.request;
    let mut spec = JobSpec::new(
        info.id.clone(),
        r.account.clone(),
        r.gpus,
        r.time_limit.as_secs(),
        info.submit_s,
    );
    spec.project = r.project.clone();
    spec.partition = r.partition.clone();
    spec.min_gpus = r.min_gpus;
    spec.grace_s = r.grace.map(|g| g.as_secs());
    spec.checkpoint_every_s = r.checkpoint_every.map(|c| c.as_secs());
    spec
}

/// One row of the fair-share view (as `sshare`).
#[derive(Clone, Debug, Serialize)]
pub struct ShareRow {
    pub account: String,
    pub weight: u32,
    /// The account's share of all weights.
    pub norm_shares: f64,
    pub decayed_gpu_hours: f64,
    /// The fair-share factor in [0, 1] under the configured formula.
    pub fair_share: f64,
    pub running_gpus: u32,
    pub pending_jobs: usize,
}

/// One GPU in the allocation feed.
#[derive(Clone, Debug, Serialize)]
pub struct AllocationRow {
    pub node: String,
    pub gpu: u32,
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
}

impl Service {
    /// Opens the service on `config.dir`, reading back its state and adopting running jobs.
    pub fn open(
        cluster: ClusterConfig,
        config: ServiceConfig,
        executor: Box<dyn Executor>,
        clock: Arc<dyn Clock>,
    ) -> Result<Service> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(&config.dir).map_err(io(&config.dir))?;
        let state = State::load(&config.dir.join("state.json"))?;
        let mut sched = Scheduler::new(&cluster, config.options);
        let mut executor = executor;
        for r in &state.reservations {
            sched.add_reservation(r.to_request())?;
        }
        let restore = |e: Refusal, job: &JobId| Error::Restore {
            job: job.clone(),
            message: e.to_string(),
        };
        for info in state.jobs.values() {
            match info.state {
                JobState::Pending => sched
                    .submit_with_history(spec_of(info), info.preemptions)
                    .map_err(|e| restore(e, &info.id))?,
                JobState::Running | JobState::Preempting => {
                    let allocation: Allocation = info
                        .allocation
                        .as_deref()
                        .unwrap_or_default()
                        .parse()
                        .map_err(|e: gpuledger_model::allocation::AllocationError| {
                            Error::Restore {
                                job: info.id.clone(),
                                message: e.to_string(),
                            }
                        })?;
                    let preempting = match (&info.preempted_by, info.signal_s, info.kill_s) {
                        (Some(by), Some(signal_s), Some(kill_s)) => Some(Preempting {
                            by: by.clone(),
                            signal_s,
                            kill_s,
                        }),
                        _ => None,
                    };
                    sched
                        .restore_running(
                            spec_of(info),
                            info.start_s.unwrap_or(info.submit_s),
                            &allocation,
                            info.preemptions,
                            info.last_checkpoint_s,
                            preempting,
                        )
                        .map_err(|e| restore(e, &info.id))?;
                    if let Some(pid) = info.pid {
                        executor.adopt(&info.id, pid);
                    }
                }
                _ => {}
            }
        }
        tracing::info!(
            jobs = state.jobs.len(),
            dir = %config.dir.display(),
            "scheduler state loaded"
        );
        Ok(Service {
            inner: Mutex::new(Inner {
                sched,
                state,
                executor,
                dirty: true,
                last_usage_s: i64::MIN,
                last_storage_s: i64::MIN,
                counters: Counters::default(),
            }),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(5)))
                .tls_config(config.tls.clone())
                .build()
                .into(),
            config,
            cluster,
            clock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_s(&self) -> UnixSeconds {
        self.clock.now_ms().div_euclid(1000)
    }

    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// Queues a job; refused when it could never run as asked.
    pub fn submit(&self, request: SubmitRequest) -> Result<JobId> {
        signal_named(request.checkpoint_signal.as_deref())?;
        if request.command.trim().is_empty() {
            return Err(Error::Invalid {
                field: "command".into(),
                message: "must not be empty".into(),
            });
        }
        let now = self.now_s();
        let mut inner = self.lock();
        let id = JobId::new(inner.state.next_id.to_string()).map_err(|e| Error::Invalid {
            field: "job_id".into(),
            message: e.to_string(),
        })?;
        let info = JobInfo::pending(id.clone(), request, now);
        inner.sched.submit(spec_of(&info))?;
        inner.state.next_id += 1;
        let mut ev = event(&info, now, JobEventKind::Submitted);
        ev.gpus = Some(info.request.gpus);
        ev.partition = info.request.partition.clone();
        ev.time_limit_s = Some(info.request.time_limit.as_secs());
        inner.state.outbox.push(ev);
        tracing::info!(job = %id, account = %info.request.account, gpus = info.request.gpus, "job submitted");
        inner.state.jobs.insert(id.clone(), info);
        inner.dirty = true;
        Ok(id)
    }

    /// Cancels a job: a pending one leaves the queue, a running one gets its checkpoint signal
    /// and SIGKILL after its grace.
    pub fn cancel(&self, id: &JobId) -> Result<JobInfo> {
        let now = self.now_s();
        let mut inner = self.lock();
        let Some(info) = inner.state.jobs.get(id).cloned() else {
            return Err(Error::UnknownJob(id.clone()));
        };
        match info.state {
            JobState::Pending => {
                inner.sched.cancel_pending(id);
                inner
                    .finish_record(id, now, JobState::Cancelled, None)
                    .ok_or_else(|| Error::UnknownJob(id.clone()))
            }
            JobState::Running | JobState::Preempting => {
                let grace = self.grace_of(&info);
                inner.stop(id, now, grace, JobState::Cancelled);
                Ok(inner.state.jobs[id].clone())
            }
            _ => Ok(info),
        }
    }

    /// Records a checkpoint the job reports: preempting it now loses less.
    pub fn checkpointed(&self, id: &JobId) -> Result<()> {
        let now = self.now_s();
        let mut inner = self.lock();
        if !inner.sched.checkpointed(id, now) {
            return Err(Error::UnknownJob(id.clone()));
        }
        if let Some(job) = inner.state.jobs.get_mut(id) {
            job.last_checkpoint_s = Some(now);
        }
        inner.dirty = true;
        Ok(())
    }

    pub fn job(&self, id: &JobId) -> Option<JobInfo> {
        self.lock().state.jobs.get(id).cloned()
    }

    /// Pending and running jobs, running first, pending in priority order (as `squeue`).
    pub fn queue(&self) -> Vec<JobInfo> {
        let inner = self.lock();
        let mut out: Vec<JobInfo> = inner
            .state
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Preempting))
            .cloned()
            .collect();
        out.extend(
            inner
                .sched
                .pending()
                .iter()
                .filter_map(|p| inner.state.jobs.get(&p.spec.id).cloned()),
        );
        out
    }

    /// The fair-share view (as `sshare`).
    pub fn share(&self) -> Vec<ShareRow> {
        let now = self.now_s();
        let inner = self.lock();
        let total: f64 = self
            .cluster
            .accounts
            .iter()
            .map(|a| f64::from(a.weight))
            .sum();
        self.cluster
            .accounts
            .iter()
            .map(|a| ShareRow {
                account: a.id.to_string(),
                weight: a.weight,
                norm_shares: f64::from(a.weight) / total.max(1.0),
                decayed_gpu_hours: inner.sched.ledger().gpu_hours(&a.id, now),
                fair_share: inner.sched.fair_share_of(&a.id, now),
                running_gpus: inner
                    .sched
                    .running()
                    .filter(|r| r.spec.account == a.id)
                    .map(|r| r.placement.gpu_count())
                    .sum(),
                pending_jobs: inner
                    .sched
                    .pending()
                    .iter()
                    .filter(|p| p.spec.account == a.id)
                    .count(),
            })
            .collect()
    }

    /// Which job holds each GPU: what exporters label their samples with.
    pub fn allocations(&self) -> Vec<AllocationRow> {
        let inner = self.lock();
        let mut out = Vec::new();
        for r in inner.sched.running() {
            let alloc = inner.sched.cluster().to_allocation(&r.placement);
            for ng in &alloc.0 {
                for &gpu in &ng.gpus {
                    out.push(AllocationRow {
                        node: ng.node.to_string(),
                        gpu,
                        job_id: r.spec.id.to_string(),
                        account: r.spec.account.to_string(),
                        project: r.spec.project.as_ref().map(|p| p.to_string()),
                    });
                }
            }
        }
        out
    }

    /// The Prometheus text exposition: jobs by state, pending jobs by account and reason,
    /// GPUs allocated, idle and reserved, and counters of starts, preemptions, resizes and
    /// cycles.
    pub fn metrics(&self) -> String {
        use std::fmt::Write as _;
        let now = self.now_s();
        let inner = self.lock();
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "gpuledger_scheduler_jobs",
            "gauge",
            "Jobs the scheduler holds now, by state.",
        );
        let running = inner
            .sched
            .running()
            .filter(|r| r.preempting.is_none())
            .count();
        let preempting = inner.sched.running().count() - running;
        let mut lines = vec![
            ("pending", inner.sched.pending().len()),
            ("preempting", preempting),
            ("running", running),
        ];
        lines.sort();
        let mut body = String::new();
        for (state, n) in lines {
            let _ = writeln!(body, "gpuledger_scheduler_jobs{{state=\"{state}\"}} {n}");
        }
        out.push_str(&body);
        let mut pending: BTreeMap<(String, String), u64> = BTreeMap::new();
        for p in inner.sched.pending() {
            *pending
                .entry((p.spec.account.to_string(), p.reason.to_string()))
                .or_default() += 1;
        }
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_pending_jobs Pending jobs, by account and reason.\n# TYPE gpuledger_scheduler_pending_jobs gauge"
        );
        for ((account, reason), n) in &pending {
            let _ = writeln!(
                out,
                "gpuledger_scheduler_pending_jobs{{account=\"{account}\",reason=\"{reason}\"}} {n}"
            );
        }
        let cluster = inner.sched.cluster();
        let mut allocated_on = vec![0u32; cluster.node_count()];
        for r in inner.sched.running() {
            for slot in &r.placement.0 {
                allocated_on[slot.node] += slot.mask.count_ones();
            }
        }
        let allocated: u32 = allocated_on.iter().sum();
        let mut reserved_nodes: Vec<usize> = inner
            .sched
            .reservations()
            .iter()
            .filter(|r| r.start_s <= now && now < r.end_s)
            .flat_map(|r| r.nodes.iter().copied())
            .collect();
        reserved_nodes.sort_unstable();
        reserved_nodes.dedup();
        let reserved: u32 = reserved_nodes
            .iter()
            .map(|n| cluster.node_spec(*n).gpus - allocated_on[*n])
            .sum();
        let idle = cluster.total_gpus() - allocated - reserved;
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_gpus GPUs by state: allocated to running jobs, reserved (free, in an advance reservation in force), idle.\n# TYPE gpuledger_scheduler_gpus gauge"
        );
        for (state, n) in [
            ("allocated", allocated),
            ("idle", idle),
            ("reserved", reserved),
        ] {
            let _ = writeln!(out, "gpuledger_scheduler_gpus{{state=\"{state}\"}} {n}");
        }
        let c = &inner.counters;
        for (name, help, value) in [
            (
                "gpuledger_scheduler_jobs_started_total",
                "Job starts (a requeued job starting again counts again).",
                c.started as f64,
            ),
            (
                "gpuledger_scheduler_preemptions_total",
                "Jobs signalled to make room for a higher tier.",
                c.preempted as f64,
            ),
            (
                "gpuledger_scheduler_resizes_total",
                "Elastic jobs grown or shrunk.",
                c.resized as f64,
            ),
            (
                "gpuledger_scheduler_cycles_total",
                "Scheduling cycles run.",
                c.cycles as f64,
            ),
            (
                "gpuledger_scheduler_cycle_seconds_total",
                "Time spent in scheduling cycles.",
                c.cycle_seconds,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        out
    }

    pub fn reservations(&self) -> Vec<ReservationEntry> {
        self.lock().state.reservations.clone()
    }

    /// Adds an advance reservation and writes the reservations billing reads.
    pub fn reserve(&self, entry: ReservationEntry) -> Result<ReservationEntry> {
        let mut inner = self.lock();
        let placed = inner.sched.add_reservation(entry.to_request())?;
        let mut entry = entry;
        entry.nodes = None;
        entry.node_names = placed
            .nodes
            .iter()
            .map(|n| inner.sched.cluster().node_spec(*n).id.clone())
            .collect();
        inner.state.reservations.push(entry.clone());
        inner.dirty = true;
        self.write_billing_reservations(&inner)?;
        Ok(entry)
    }

    pub fn unreserve(&self, name: &str) -> Result<bool> {
        let mut inner = self.lock();
        let removed = inner.sched.remove_reservation(name).is_some();
        inner.state.reservations.retain(|r| r.name != name);
        inner.dirty = true;
        self.write_billing_reservations(&inner)?;
        Ok(removed)
    }

    /// Billing charges the owner of a reservation for its reserved-but-unused GPU-hours; it
    /// reads them from this file.
    fn write_billing_reservations(&self, inner: &Inner) -> Result<()> {
        let Some(path) = &self.config.billing_reservations else {
            return Ok(());
        };
        let mut out = String::from("# Written by `gpuledger scheduler`; billing reads it.\n");
        for r in &inner.state.reservations {
            let Some(first) = r.node_names.first() else {
                continue;
            };
            let Some(spec) = self.cluster.nodes().into_iter().find(|n| &n.id == first) else {
                continue;
            };
            let gpus: u32 = r.node_names.len() as u32 * spec.gpus;
            let names: Vec<String> = r.node_names.iter().map(|n| format!("\"{n}\"")).collect();
            out.push_str(&format!(
                "\n[[reservations]]\nid = \"{}\"\naccount = \"{}\"\ngpu_model = \"{}\"\ngpus = {gpus}\nnodes = [{}]\nstart = \"{}\"\nend = \"{}\"\n",
                r.name,
                r.accounts[0],
                spec.gpu_model,
                names.join(", "),
                r.start.to_rfc3339(),
                r.end.to_rfc3339(),
            ));
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(path, out).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        std::fs::write(
            self.config.dir.join("reservations.toml"),
            reservations_toml(&inner.state.reservations),
        )
        .map_err(|source| Error::Io {
            path: self.config.dir.join("reservations.toml"),
            source,
        })
    }

    fn grace_of(&self, info: &JobInfo) -> u64 {
        info.request
            .grace
            .map(|g| g.as_secs())
            .or_else(|| {
                let name = info
                    .request
                    .partition
                    .clone()
                    .or_else(|| self.cluster.default_partition().map(|p| p.name.clone()))?;
                self.cluster
                    .partitions
                    .iter()
                    .find(|p| p.name == name)
                    .and_then(|p| p.grace_time)
                    .map(|g| g.as_secs())
            })
            .unwrap_or(self.cluster.scheduler.default_grace.as_secs())
    }

    /// One round: reap, deadlines, usage, a scheduling cycle and its actions, then state and
    /// events out.
    pub fn tick(&self) -> Result<Cycle> {
        let now = self.now_s();
        let usage = self.fetch_usage_if_due(now);
        let mut inner = self.lock();
        inner.reap(now);
        inner.deadlines(now);
        match usage {
            Some(accounts) => {
                for (account, hours) in accounts {
                    if let Ok(id) = AccountId::new(account) {
                        inner.sched.ledger_mut().set(&id, hours, now);
                    }
                }
                inner.last_usage_s = now;
            }
            None if self.config.aggregator.is_none() => inner.sched.accrue_usage(now),
            None => {}
        }
        if let Some(scan) = self.latest_storage_scan_if_due(&inner, now) {
            for (account, project, bytes) in scan {
                inner
                    .sched
                    .set_storage_used(&account, project.as_ref(), bytes);
            }
            inner.last_storage_s = now;
        }
        let began = std::time::Instant::now();
        let cycle = inner.sched.schedule(now);
        inner.counters.cycles += 1;
        inner.counters.cycle_seconds += began.elapsed().as_secs_f64();
        inner.counters.started += cycle.started.len() as u64;
        inner.counters.preempted += cycle.preempted.len() as u64;
        inner.counters.resized += cycle.resized.len() as u64;
        self.act(&mut inner, &cycle, now);
        inner.refresh_pending();
        if inner.dirty {
            inner.write_job_mapping(&self.config.dir)?;
            inner.state.save(&self.config.dir.join("state.json"))?;
            inner.dirty = false;
        }
        let outbox = std::mem::take(&mut inner.state.outbox);
        let seq = inner.state.event_seq;
        drop(inner);
        if !outbox.is_empty() {
            self.send_events(outbox, seq)?;
        }
        Ok(cycle)
    }

    fn act(&self, inner: &mut Inner, cycle: &Cycle, now: UnixSeconds) {
        for started in &cycle.started {
            let Some(info) = inner.state.jobs.get(&started.job_id).cloned() else {
                continue;
            };
            let launch = Launch {
                job_id: info.id.clone(),
                command: info.request.command.clone(),
                gpus: started
                    .allocation
                    .0
                    .first()
                    .map(|ng| ng.gpus.clone())
                    .unwrap_or_default(),
                allocation: started.allocation.to_string(),
                account: info.request.account.to_string(),
                project: info.request.project.as_ref().map(|p| p.to_string()),
            };
            let kind = if info.preemptions > 0 {
                JobEventKind::Resumed
            } else {
                JobEventKind::Started
            };
            match inner.executor.launch(&launch) {
                Ok(pid) => {
                    tracing::info!(job = %info.id, pid, allocation = %started.allocation, backfilled = started.backfilled, "job started");
                    let job = inner.state.jobs.get_mut(&info.id);
                    if let Some(job) = job {
                        job.state = JobState::Running;
                        job.pid = Some(pid);
                        job.start_s.get_or_insert(now);
                        job.allocation = Some(started.allocation.to_string());
                        job.reason = None;
                        job.estimated_start_s = None;
                    }
                    let mut ev = event(&info, now, kind);
                    ev.gpus = Some(started.gpus);
                    ev.allocation = Some(started.allocation.clone());
                    inner.state.outbox.push(ev);
                }
                Err(e) => {
                    tracing::error!(job = %info.id, error = %e, "job could not be launched");
                    inner.sched.finish(&info.id, now);
                    inner.finish_record(&info.id, now, JobState::Failed, None);
                }
            }
            inner.dirty = true;
        }
        for p in &cycle.preempted {
            let Some(info) = inner.state.jobs.get(&p.job_id).cloned() else {
                continue;
            };
            let signal =
                signal_named(info.request.checkpoint_signal.as_deref()).unwrap_or(Signal::SIGTERM);
            if let Err(e) = inner.executor.signal(&p.job_id, signal) {
                tracing::warn!(job = %p.job_id, error = %e, "checkpoint signal failed");
            }
            tracing::info!(job = %p.job_id, by = %p.by, kill_s = p.kill_s, "job preempted");
            if let Some(job) = inner.state.jobs.get_mut(&p.job_id) {
                job.state = JobState::Preempting;
                job.preempted_by = Some(p.by.clone());
                job.signal_s = Some(now);
                job.kill_s = Some(p.kill_s);
            }
            inner.dirty = true;
        }
        for r in &cycle.resized {
            // A process cannot change its CUDA_VISIBLE_DEVICES while it runs: an elastic job is
            // told of its new GPUs by SIGHUP and the `allocation` file in its directory
            // (`GPULEDGER_ALLOCATION_FILE`), and is expected to re-form its workers on them
            // (as torchrun's elastic agent does). Billing and the exporters' labels follow the
            // recorded allocation.
            if let Some(job) = inner.state.jobs.get_mut(&r.job_id) {
                job.allocation = Some(r.allocation.to_string());
                let info = job.clone();
                let file = self
                    .config
                    .dir
                    .join("jobs")
                    .join(r.job_id.as_str())
                    .join("allocation");
                if let Err(e) = std::fs::write(&file, format!("{}\n", r.allocation)) {
                    tracing::warn!(job = %r.job_id, error = %e, "allocation file not written");
                }
                if let Err(e) = inner.executor.signal(&r.job_id, Signal::SIGHUP) {
                    tracing::warn!(job = %r.job_id, error = %e, "resize signal failed");
                }
                tracing::info!(job = %r.job_id, gpus = r.gpus, allocation = %r.allocation, "elastic job resized");
                let mut ev = event(&info, now, JobEventKind::Resumed);
                ev.gpus = Some(r.gpus);
                ev.allocation = Some(r.allocation.clone());
                inner.state.outbox.push(ev);
            }
            inner.dirty = true;
        }
    }

    /// Bytes per account (project `None`: the account's total) and project in the newest scan
    /// of the storage-scan file.
    fn latest_storage_scan_if_due(
        &self,
        inner: &Inner,
        now: UnixSeconds,
    ) -> Option<Vec<(AccountId, Option<ProjectId>, u64)>> {
        let path = self.config.storage_scans.as_ref()?;
        if now.saturating_sub(inner.last_storage_s) < self.config.usage_every.as_secs() as i64 {
            return None;
        }
        let text = std::fs::read_to_string(path).ok()?;
        Some(latest_scan(&text))
    }

    fn fetch_usage_if_due(&self, now: UnixSeconds) -> Option<BTreeMap<String, f64>> {
        let base = self.config.aggregator.as_ref()?;
        let last = self.lock().last_usage_s;
        if now.saturating_sub(last) < self.config.usage_every.as_secs() as i64 {
            return None;
        }
        let url = format!("{base}/api/v1/usage");
        let mut request = self.agent.get(&url);
        if let Some(token) = &self.config.aggregator_token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let reply: serde_json::Value = match request
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(url, error = %e, "usage feed unavailable; keeping the last figures");
                return None;
            }
        };
        let accounts = reply.get("accounts")?.as_object()?;
        Some(
            accounts
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.get("decayed_gpu_hours")?.as_f64()?)))
                .collect(),
        )
    }

    /// Sends events; on failure they go back to the outbox and are sent again next tick.
    fn send_events(&self, events: Vec<JobEvent>, seq: u64) -> Result<()> {
        let Some(base) = &self.config.aggregator else {
            return Ok(());
        };
        let body = serde_json::json!({
            "source": "gpuledger-scheduler",
            "seq": seq,
            "events": events.iter().map(event_json).collect::<Vec<_>>(),
        });
        let mut request = self
            .agent
            .post(&format!("{base}/api/v1/events"))
            .header("content-type", "application/json");
        if let Some(token) = &self.config.aggregator_token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let sent = request.send(body.to_string().as_bytes());
        let mut inner = self.lock();
        match sent {
            Ok(_) => {
                inner.state.event_seq = seq + 1;
                inner.dirty = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, events = events.len(), "job events not delivered; will retry");
                let mut back = events;
                back.append(&mut inner.state.outbox);
                inner.state.outbox = back;
            }
        }
        Ok(())
    }
}

/// The newest scan's rows of a `time,account,project,bytes,files` file, with each account's
/// total under project `None`. Lines that do not parse are skipped (the file is billing's to
/// validate).
pub fn latest_scan(text: &str) -> Vec<(AccountId, Option<ProjectId>, u64)> {
    let rows: Vec<(i64, AccountId, Option<ProjectId>, u64)> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            let time = cells.first()?.trim().parse().ok()?;
            let account = AccountId::new(cells.get(1)?.trim()).ok()?;
            let project = match cells.get(2)?.trim() {
                "" => None,
                p => Some(ProjectId::new(p).ok()?),
            };
            let bytes = cells.get(3)?.trim().parse().ok()?;
            Some((time, account, project, bytes))
        })
        .collect();
    let Some(newest) = rows.iter().map(|r| r.0).max() else {
        return Vec::new();
    };
    let mut totals: BTreeMap<AccountId, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, account, project, bytes) in rows.into_iter().filter(|r| r.0 == newest) {
        *totals.entry(account.clone()).or_default() += bytes;
        if project.is_some() {
            out.push((account, project, bytes));
        }
    }
    out.extend(totals.into_iter().map(|(a, b)| (a, None, b)));
    out
}

/// An event as the aggregator's API takes it: absent fields left out.
pub fn event_json(ev: &JobEvent) -> serde_json::Value {
    let mut v = serde_json::to_value(ev).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.retain(|_, value| !value.is_null());
    }
    v
}

fn event(info: &JobInfo, now: UnixSeconds, kind: JobEventKind) -> JobEvent {
    JobEvent::new(
        now * 1000,
        info.id.clone(),
        info.request.account.clone(),
        info.request.project.clone(),
        kind,
    )
}

impl Inner {
    /// Marks a job done and queues its `finished` event.
    fn finish_record(
        &mut self,
        id: &JobId,
        now: UnixSeconds,
        state: JobState,
        exit_code: Option<i32>,
    ) -> Option<JobInfo> {
        let job = self.state.jobs.get_mut(id)?;
        job.state = state;
        job.end_s = Some(now);
        job.exit_code = exit_code;
        job.reason = None;
        job.estimated_start_s = None;
        job.stopping = None;
        let info = job.clone();
        let mut ev = event(&info, now, JobEventKind::Finished);
        ev.outcome = Some(match state {
            JobState::Completed => Outcome::Completed,
            JobState::Cancelled => Outcome::Cancelled,
            JobState::Timeout => Outcome::Timeout,
            _ => Outcome::Failed,
        });
        ev.exit_code = exit_code;
        self.state.outbox.push(ev);
        self.dirty = true;
        Some(info)
    }

    /// Signals a running job to stop (cancel or time limit); SIGKILL follows at the deadline.
    fn stop(&mut self, id: &JobId, now: UnixSeconds, grace_s: u64, why: JobState) {
        let signal = self
            .state
            .jobs
            .get(id)
            .and_then(|j| signal_named(j.request.checkpoint_signal.as_deref()).ok())
            .unwrap_or(Signal::SIGTERM);
        let _ = self.executor.signal(id, signal);
        if let Some(job) = self.state.jobs.get_mut(id) {
            job.stopping = Some(why);
            job.signal_s = Some(now);
            job.kill_s = Some(now + grace_s as i64);
        }
        self.dirty = true;
    }

    fn reap(&mut self, now: UnixSeconds) {
        for (id, status) in self.executor.reap() {
            let Some(info) = self.state.jobs.get(&id).cloned() else {
                continue;
            };
            let code = match status {
                ExitStatus::Code(c) => Some(c),
                ExitStatus::Killed => Some(137),
            };
            if info.state == JobState::Preempting && info.stopping.is_none() {
                self.sched.requeue(&id, now);
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.state = JobState::Pending;
                    job.preemptions += 1;
                    job.pid = None;
                    job.allocation = None;
                    job.preempted_by = None;
                    job.signal_s = None;
                    job.kill_s = None;
                    job.exit_code = code;
                }
                let mut ev = event(&info, now, JobEventKind::Preempted);
                ev.exit_code = code;
                self.state.outbox.push(ev);
                tracing::info!(job = %id, exit_code = ?code, "preempted job exited and is requeued");
                self.dirty = true;
                continue;
            }
            self.sched.finish(&id, now);
            let state = match (info.stopping, status) {
                (Some(why), _) => why,
                (None, ExitStatus::Code(0)) => JobState::Completed,
                _ => JobState::Failed,
            };
            tracing::info!(job = %id, exit_code = ?code, state = ?state, "job ended");
            self.finish_record(&id, now, state, code);
        }
    }

    /// SIGKILL for jobs past their grace; the time-limit signal for jobs past their limit.
    fn deadlines(&mut self, now: UnixSeconds) {
        let due: Vec<(JobId, bool)> = self
            .state
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Preempting))
            .filter_map(|j| {
                if j.kill_s.is_some_and(|k| now >= k) {
                    return Some((j.id.clone(), true));
                }
                let limit_end = j.start_s? + j.request.time_limit.as_secs() as i64;
                (j.stopping.is_none() && j.kill_s.is_none() && now >= limit_end)
                    .then(|| (j.id.clone(), false))
            })
            .collect();
        for (id, kill) in due {
            if kill {
                let _ = self.executor.signal(&id, Signal::SIGKILL);
            } else {
                tracing::info!(job = %id, "time limit reached");
                // Slurm's KillWait: a short grace, then SIGKILL.
                self.stop(&id, now, 30, JobState::Timeout);
            }
        }
    }

    fn refresh_pending(&mut self) {
        for p in self.sched.pending() {
            if let Some(job) = self.state.jobs.get_mut(&p.spec.id) {
                let reason = Some(p.reason.to_string());
                if job.reason != reason || job.estimated_start_s != p.estimated_start_s {
                    job.reason = reason;
                    job.estimated_start_s = p.estimated_start_s;
                }
            }
        }
    }

    /// dcgm-exporter's HPC job mapping, per node: `job-mapping/<node>/<gpu>` holds
    /// `job_id account [project]` for each busy GPU.
    fn write_job_mapping(&self, dir: &Path) -> Result<()> {
        let root = dir.join("job-mapping");
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let _ = std::fs::remove_dir_all(&root);
        for r in self.sched.running() {
            let alloc = self.sched.cluster().to_allocation(&r.placement);
            for ng in &alloc.0 {
                let node_dir = root.join(ng.node.as_str());
                std::fs::create_dir_all(&node_dir).map_err(io(&node_dir))?;
                for g in &ng.gpus {
                    let line = match &r.spec.project {
                        Some(p) => format!("{} {} {p}\n", r.spec.id, r.spec.account),
                        None => format!("{} {}\n", r.spec.id, r.spec.account),
                    };
                    let file = node_dir.join(g.to_string());
                    std::fs::write(&file, line).map_err(io(&file))?;
                }
            }
        }
        Ok(())
    }
}
