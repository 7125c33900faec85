//! The live gpuledger scheduler: the pure policy of `gpuledger-scheduler` run against the wall
//! clock, with jobs run as real processes.
//!
//! - [`Service`] owns the scheduler, the job table and an [`executor::Executor`]; [`Service::tick`]
//!   reaps exited jobs, delivers SIGKILL at grace and time-limit deadlines, takes fair-share usage
//!   from the aggregator's feed (or accrues its own), runs one scheduling cycle and acts on it
//!   (launch, checkpoint signal, resize), then saves its [`state::State`] and sends job events.
//!   Split by concept: the jobs on the executor between cycles (`jobs.rs`), advance
//!   reservations (`reservations.rs`), the storage scans, usage feed and job events on their
//!   own schedule (`feeds.rs`), nodes in and out of service (`nodes.rs`), `/metrics`
//!   (`metrics.rs`).
//! - [`aggregator`] is the link to the aggregator (usage in, events out) behind a trait.
//! - [`executor`] runs jobs as processes, each in its own cgroup ([`cgroup`]) where the host
//!   allows.
//! - [`http`] is the API (`squeue`/`sshare`-like views, submit, cancel, reservations, the
//!   allocation feed exporters read); [`serve`] runs it and the cycle loop.
//! - A request's change is appended to the journal (`journal.rs`) and flushed before it is
//!   answered; a cycle appends its own changes, and now and then writes the whole
//!   [`state::State`] beside the service, after which the journal starts again.
//! - On start the state file is read back, with the journal's later records: pending jobs
//!   queue again, running ones keep their GPUs and their processes are adopted.

pub mod aggregator;
pub mod cgroup;
mod cores;
pub mod executor;
mod feeds;
pub mod http;
mod job_files;
pub mod job_tmp;
mod jobs;
mod journal;
mod metrics;
pub mod nodes;
mod reservations;
pub mod serve;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Serialize;

use gpuledger_model::billed_reservations::{BilledReservation, BilledReservations};
use gpuledger_model::config::ClusterConfig;
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::storage_scan::{latest_scan, parse_scans};
use gpuledger_model::time::{Clock, UnixSeconds};
use gpuledger_model::{AccountId, Allocation, JobId, ProjectId};
use gpuledger_scheduler::reservation::{reservations_toml, ReservationEntry};
use gpuledger_scheduler::{Cycle, JobSpec, Preempting, Refusal, Scheduler, SchedulerOptions};

use crate::aggregator::{AggregatorLink, HttpAggregator};
use crate::executor::{Executor, ExitStatus, JobUser, Launch};
use crate::journal::{Change, Journal, Undelivered};
use crate::state::{JobInfo, JobState, Preemptor, State, SubmitRequest};

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
    #[error("node `{0}` is not in the cluster config")]
    UnknownNode(String),
    #[error(transparent)]
    Reservation(#[from] gpuledger_scheduler::reservation::ReservationError),
    #[error(transparent)]
    Service(#[from] gpuledger_service::Error),
    /// A submission past the jobs its account (or project) may have pending or running at
    /// once; taken again once some end.
    #[error("{field}: {message}")]
    TooManyJobs { field: String, message: String },
    /// A request's change could not be written to the journal: not acknowledged.
    #[error("{what}; the scheduler's state could not be saved ({path}: {source})")]
    NotStored {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The service's state, in its directory.
const STATE_FILE: &str = "state.json";

/// The journal grows to at least this before a cycle writes `state.json` again.
const MIN_JOURNAL_BYTES: u64 = 1 << 20;

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
    /// Requests' changes, on disk before they are answered.
    journal: Journal,
    /// The aggregator: usage feed and job events.
    aggregator: Option<Box<dyn AggregatorLink>>,
    config: ServiceConfig,
    cluster: ClusterConfig,
    clock: Arc<dyn Clock>,
}

#[derive(Debug)]
struct Inner {
    sched: Scheduler,
    state: State,
    executor: Box<dyn Executor>,
    /// The job mapping and `state.json` are due at the next cycle whatever it changes (at
    /// start, and after a write that failed).
    dirty: bool,
    /// What cycles changed that no request's record holds, for the cycle's own record.
    unrecorded: Unrecorded,
    /// The size of the last `state.json` written (or read): the journal grows to half of it
    /// before the next is written.
    state_file_bytes: u64,
    /// Billing's reservations file lags the state (its last write failed).
    billing_file_stale: bool,
    last_usage_s: UnixSeconds,
    last_storage_s: UnixSeconds,
    counters: Counters,
    /// The jobs that have ended, by end time ([`State::ended`]): those past the job history
    /// are forgotten without a walk of every job at every cycle.
    ended: BTreeSet<(UnixSeconds, JobId)>,
}

/// What a cycle, and what it does to jobs (launches, reaping, signals, the events it sends),
/// changed that no request's journal record holds: the cycle ends by writing it as one record
/// ([`Inner::take_unrecorded`]), as the objects are then.
#[derive(Debug, Default)]
struct Unrecorded {
    jobs: BTreeSet<JobId>,
    forgotten: Vec<JobId>,
    /// Waiting jobs whose wait for GPUs started or stopped (only that field changed).
    waits: BTreeSet<JobId>,
    drained: BTreeSet<String>,
    /// The outbox, the batch being sent or its number.
    events: bool,
}

impl Inner {
    /// Marks the job changed: the cycle's record holds it as it is at the cycle's end.
    fn touched(&mut self, id: &JobId) {
        self.unrecorded.jobs.insert(id.clone());
    }

    /// Marks the undelivered events changed (queued, batched or acknowledged).
    fn touched_events(&mut self) {
        self.unrecorded.events = true;
    }

    /// The record of what is unrecorded, as it is now; `None` when nothing is.
    fn take_unrecorded(&mut self) -> Option<Change> {
        let unrecorded = std::mem::take(&mut self.unrecorded);
        let nothing = unrecorded.jobs.is_empty()
            && unrecorded.forgotten.is_empty()
            && unrecorded.waits.is_empty()
            && unrecorded.drained.is_empty()
            && !unrecorded.events;
        if nothing {
            return None;
        }
        let state = &self.state;
        Some(Change {
            jobs: unrecorded
                .jobs
                .iter()
                .filter_map(|id| state.jobs.get(id).cloned())
                .collect(),
            forgotten: unrecorded.forgotten,
            waits: unrecorded
                .waits
                .iter()
                .filter(|id| !unrecorded.jobs.contains(*id))
                .filter_map(|id| Some((id.clone(), state.jobs.get(id)?.gpu_wait_from_s)))
                .collect(),
            drained: unrecorded
                .drained
                .into_iter()
                .map(|node| {
                    let drained = state.drained.get(&node).cloned();
                    (node, drained)
                })
                .collect(),
            undelivered: unrecorded.events.then(|| Undelivered {
                outbox: state.outbox.clone(),
                sending: state.sending.clone(),
                event_seq: state.event_seq,
            }),
            ..Change::default()
        })
    }

    /// A journal record of the jobs `ids` as they are now and the events queued since the
    /// outbox held `from`.
    fn jobs_change(&self, ids: &[&JobId], from: usize) -> Change {
        Change {
            jobs: ids
                .iter()
                .filter_map(|id| self.state.jobs.get(*id).cloned())
                .collect(),
            events: self.state.outbox[from.min(self.state.outbox.len())..].to_vec(),
            ..Change::default()
        }
    }
}

/// Counters since the service started (Prometheus counters reset with the process).
#[derive(Debug, Default)]
struct Counters {
    started: u64,
    preempted: u64,
    resized: u64,
    cycles: u64,
    cycle_seconds: f64,
    event_batches_refused: u64,
    out_of_memory: u64,
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
    spec.shape = gpuledger_scheduler::cluster::Shape {
        gpus_per_node: r.gpus_per_node,
        max_nodes: r.nodes,
        gpu_types: r.gpu_types.clone(),
        gpu_share: r.gpu_share,
    };
    spec
}

/// One row of the fair-share view (as `sshare`).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
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

/// One waiting job's priority and its weighted parts (as `sprio -l`); `priority` is the sum
/// of `fair_share`, `age`, `job_size` and `quota`. Within a tier a higher priority goes first.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct PriorityRow {
    pub job_id: String,
    pub account: String,
    /// The partition it asked for (`null`: the default).
    pub partition: Option<String>,
    /// Its partition's priority tier: a higher tier goes first whatever the priority.
    pub tier: u32,
    pub priority: f64,
    pub fair_share: f64,
    pub age: f64,
    pub job_size: f64,
    pub quota: f64,
    /// It has waited `relief_after` for GPUs: its fair-share part is the relief's rank and it
    /// has no age.
    pub relieved: bool,
    /// Where its account stands against its fair share of the cluster now: `below_floor`
    /// (under the relief's floor), `below_share` or `at_share`; `null` where the ranking does
    /// not look at shares.
    pub standing: Option<String>,
}

/// The text of a [`Standing`](gpuledger_scheduler::fairshare::Standing) in [`PriorityRow`].
fn standing_name(standing: gpuledger_scheduler::fairshare::Standing) -> &'static str {
    use gpuledger_scheduler::fairshare::Standing;
    match standing {
        Standing::BelowFloor => "below_floor",
        Standing::BelowShare => "below_share",
        Standing::AtShare => "at_share",
    }
}

/// Which jobs `GET /api/v1/jobs` (and `gpuledger scheduler jobs`) lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryFilter {
    /// Only these accounts (all the caller may see when empty).
    pub accounts: Vec<String>,
    /// Only jobs in these states (all when empty).
    pub states: Vec<JobState>,
    /// Only jobs not ended before this time (Unix seconds): running, pending, or ended since.
    pub since_s: Option<UnixSeconds>,
    /// At most this many, the newest.
    pub limit: usize,
}

impl HistoryFilter {
    /// The most jobs one answer lists.
    pub const MAX_LIMIT: usize = 10_000;

    fn selects(&self, job: &JobInfo) -> bool {
        (self.accounts.is_empty()
            || self
                .accounts
                .iter()
                .any(|a| a == job.request.account.as_str()))
            && (self.states.is_empty() || self.states.contains(&job.state))
            && self
                .since_s
                .is_none_or(|since| job.end_s.is_none_or(|end| end >= since))
    }
}

pub use gpuledger_model::allocation_feed::AllocationRow;

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
        let mut state = State::load(&config.dir.join(STATE_FILE))?;
        let journal = Journal::open(&config.dir, &mut state)?;
        let mut sched = Scheduler::new(&cluster, config.options);
        let mut executor = executor;
        for r in &state.reservations {
            // One kept before a rule that now refuses it (a name, a node named twice) is named
            // with the file to mend, rather than dropped from billing unseen.
            let stored = |e: gpuledger_scheduler::reservation::ReservationError| Error::State {
                path: config.dir.join(STATE_FILE),
                message: format!(
                    "reservation `{}`: {e}",
                    gpuledger_scheduler::reservation::shown_name(&r.name)
                ),
            };
            sched
                .add_reservation(r.to_request().map_err(stored)?)
                .map_err(stored)?;
        }
        let restore = |e: Refusal, job: &JobId| Error::Restore {
            job: job.clone(),
            message: e.to_string(),
        };
        for info in state.jobs.values() {
            if info.state == JobState::Pending {
                let ended = executor.end_leftovers(&info.id);
                if ended > 0 {
                    tracing::warn!(job = %info.id, processes = ended, "a launch of this pending job outlived a crash before its start was saved; its processes were ended and it starts again");
                }
            }
            match info.state {
                JobState::Pending => sched
                    .submit_with_history(spec_of(info), info.preemptions, info.gpu_wait_from_s)
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
                    let by = info.preempted_by.as_ref().and_then(Preemptor::job);
                    let preempting = match (by, info.signal_s, info.kill_s) {
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
        for (node, drained) in &state.drained {
            if sched.set_drained(node, true) {
                tracing::warn!(node, reason = %drained.reason, "node is drained");
            } else {
                tracing::warn!(node, "a drained node is no longer in the cluster config");
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
                ended: state.ended(),
                state,
                executor,
                dirty: true,
                unrecorded: Unrecorded::default(),
                state_file_bytes: 0,
                billing_file_stale: true,
                last_usage_s: i64::MIN,
                last_storage_s: i64::MIN,
                counters: Counters::default(),
            }),
            journal,
            aggregator: config.aggregator.as_deref().map(|base| {
                Box::new(HttpAggregator::new(
                    base,
                    config.aggregator_token.clone(),
                    config.tls.clone(),
                )) as Box<dyn AggregatorLink>
            }),
            config,
            cluster,
            clock,
        })
    }

    /// The same service reading usage from and sending events to `link` instead of the
    /// configured aggregator (a test's feed, another transport).
    pub fn with_aggregator(mut self, link: Box<dyn AggregatorLink>) -> Self {
        self.aggregator = Some(link);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn state_path(&self) -> PathBuf {
        self.config.dir.join(STATE_FILE)
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
        request
            .check()
            .map_err(|(field, message)| Error::Invalid { field, message })?;
        self.job_user(&request.account, request.project.as_ref())?;
        let now = self.now_s();
        let mut inner = self.lock();
        self.check_submit_limit(&inner, &request)?;
        let number = inner
            .state
            .next_job_number
            .get(&request.account)
            .copied()
            .unwrap_or(1);
        let id =
            JobId::new(format!("{}.{number}", request.account)).map_err(|e| Error::Invalid {
                field: "job_id".into(),
                message: e.to_string(),
            })?;
        let account = request.account.clone();
        let info = JobInfo::pending(id.clone(), request, now);
        inner.sched.submit(spec_of(&info))?;
        inner
            .state
            .next_job_number
            .insert(account.clone(), number + 1);
        let from = inner.state.outbox.len();
        let mut ev = event(&info, now, JobEventKind::Submitted);
        ev.gpus = Some(info.request.gpus);
        ev.partition = info.request.partition.clone();
        ev.time_limit_s = Some(info.request.time_limit.as_secs());
        inner.state.outbox.push(ev);
        tracing::info!(job = %id, account = %info.request.account, gpus = info.request.gpus, "job submitted");
        inner.state.jobs.insert(id.clone(), Arc::new(info));
        let change = Change {
            next_job_number: Some((account, number + 1)),
            ..inner.jobs_change(&[&id], from)
        };
        let ticket = self.record_undoable(&mut inner, change);
        drop(inner);
        self.commit_or_undo(
            &ticket,
            || format!("job {id} withdrawn, nothing will run"),
            |e| self.withdraw(&id, e),
        )?;
        Ok(id)
    }

    /// Refuses a submission past the jobs its account, or its project, may have pending or
    /// running at once (`max_submit_jobs`): one tenant's loop cannot fill the scheduler's
    /// memory and state for everyone.
    fn check_submit_limit(&self, inner: &Inner, request: &SubmitRequest) -> Result<()> {
        let Some(account) = self
            .cluster
            .accounts
            .iter()
            .find(|a| a.id == request.account)
        else {
            // Not an account: admission refuses it as such.
            return Ok(());
        };
        let project = request
            .project
            .as_ref()
            .and_then(|p| account.projects.iter().find(|x| &x.id == p));
        let active = |in_project: bool| {
            let project = if in_project {
                request.project.as_ref()
            } else {
                None
            };
            inner.sched.active_jobs(&request.account, project)
        };
        let account_limit = account
            .quota
            .max_submit_jobs
            .unwrap_or(self.cluster.scheduler.max_submit_jobs);
        let limits = [
            Some((account_limit, false, format!("account `{}`", account.id))),
            project.and_then(|p| {
                let limit = p.quota.max_submit_jobs?;
                Some((limit, true, format!("project `{}`", p.id)))
            }),
        ];
        for (limit, in_project, who) in limits.into_iter().flatten() {
            let n = active(in_project);
            if n >= limit as usize {
                return Err(Error::TooManyJobs {
                    field: if in_project { "project" } else { "account" }.into(),
                    message: format!(
                        "{who} has {n} jobs pending or running; at most {limit} (max_submit_jobs): submit again once some end, or cancel some"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Ends a job whose submission could not be saved, before it runs (or at once if a cycle
    /// started it meanwhile): its owner was told it was not queued.
    fn withdraw(&self, id: &JobId, why: &Error) {
        tracing::error!(job = %id, error = %why, "submission not saved; job withdrawn");
        let withdrawn = "withdrawn: its submission could not be saved";
        if let Ok((_, Some(ticket))) = self.cancel_within(id, Some(0), Some(withdrawn)) {
            // Likely to fail as the submission did; the next cycle's save holds it either way.
            let _ = self.commit(&ticket, String::new);
        }
    }

    /// Queues `change` for the journal, in the order of the changes made under the lock (the
    /// guard is asked for so that no record is queued without it). The next `state.json` is not
    /// hastened: the record holds the change.
    fn record(&self, _inner: &mut Inner, change: Change) -> journal::Ticket {
        self.journal.push(change, false)
    }

    /// [`Service::record`] for a change undone where its write fails: it must be committed
    /// with [`Service::commit_or_undo`].
    fn record_undoable(&self, _inner: &mut Inner, change: Change) -> journal::Ticket {
        self.journal.push(change, true)
    }

    /// Returns once the change is on disk; else what was done and why it is not acknowledged
    /// (the change stays made, and the next cycle writes `state.json`, which holds it).
    fn commit(&self, ticket: &journal::Ticket, what: impl FnOnce() -> String) -> Result<()> {
        self.commit_or_undo(ticket, what, |_| {})
    }

    /// [`Service::commit`], where a change that could not be written is undone by `undo`
    /// before any `state.json` may hold it.
    pub(crate) fn commit_or_undo(
        &self,
        ticket: &journal::Ticket,
        what: impl FnOnce() -> String,
        undo: impl FnOnce(&Error),
    ) -> Result<()> {
        let Err(source) = self.journal.commit(ticket) else {
            return Ok(());
        };
        let error = Error::NotStored {
            what: what(),
            path: self.journal.path(),
            source,
        };
        undo(&error);
        self.journal.settle(ticket);
        Err(error)
    }

    /// Cancels a job: a pending one leaves the queue, a running one gets its checkpoint signal
    /// and SIGKILL after its grace.
    pub fn cancel(&self, id: &JobId) -> Result<JobInfo> {
        self.cancel_committed(id, None)
    }

    /// [`Service::cancel`], with SIGKILL at once (`cancel --now`) instead of after the grace.
    pub fn cancel_now(&self, id: &JobId) -> Result<JobInfo> {
        self.cancel_committed(id, Some(0))
    }

    fn cancel_committed(&self, id: &JobId, grace_s: Option<u64>) -> Result<JobInfo> {
        let (info, ticket) = self.cancel_within(id, grace_s, None)?;
        if let Some(ticket) = ticket {
            self.commit(&ticket, || format!("job {id} cancelled"))?;
        }
        Ok(info)
    }

    /// The job as the cancel left it, and the journal's record of the change (none when it had
    /// ended already). `reason`, when given, is what the job's record says.
    fn cancel_within(
        &self,
        id: &JobId,
        grace_s: Option<u64>,
        reason: Option<&str>,
    ) -> Result<(JobInfo, Option<journal::Ticket>)> {
        let now = self.now_s();
        let mut inner = self.lock();
        let Some(info) = inner.state.jobs.get(id).cloned() else {
            return Err(Error::UnknownJob(id.clone()));
        };
        let from = inner.state.outbox.len();
        match info.state {
            JobState::Pending => {
                inner.sched.cancel_pending(id);
                inner.finish_record(id, now, JobState::Cancelled, None);
            }
            JobState::Running | JobState::Preempting => {
                let grace = grace_s.unwrap_or_else(|| self.grace_of(&info));
                inner.stop(id, now, grace, JobState::Cancelled);
                if grace == 0 {
                    let _ = inner.executor.signal(id, Signal::SIGKILL);
                }
            }
            _ => return Ok((JobInfo::clone(&info), None)),
        }
        if let (Some(reason), Some(job)) = (reason, inner.state.jobs.get_mut(id).map(Arc::make_mut))
        {
            job.reason = Some(reason.to_owned());
        }
        let change = inner.jobs_change(&[id], from);
        let ticket = self.record(&mut inner, change);
        Ok((JobInfo::clone(&inner.state.jobs[id]), Some(ticket)))
    }

    /// Records a checkpoint the job reports: preempting it now loses less.
    pub fn checkpointed(&self, id: &JobId) -> Result<()> {
        let now = self.now_s();
        let mut inner = self.lock();
        if !inner.sched.checkpointed(id, now) {
            return Err(Error::UnknownJob(id.clone()));
        }
        if let Some(job) = inner.state.jobs.get_mut(id).map(Arc::make_mut) {
            job.last_checkpoint_s = Some(now);
        }
        let change = inner.jobs_change(&[id], inner.state.outbox.len());
        let ticket = self.record(&mut inner, change);
        drop(inner);
        self.commit(&ticket, || format!("job {id}'s checkpoint recorded"))
    }

    pub fn job(&self, id: &JobId) -> Option<JobInfo> {
        self.lock()
            .state
            .jobs
            .get(id)
            .map(|job| JobInfo::clone(job))
    }

    /// Pending and running jobs, running first, pending in priority order (as `squeue`).
    pub fn queue(&self) -> Vec<JobInfo> {
        self.queue_seen_by(&|_| true)
    }

    /// The job as a caller who may see the accounts `sees` says yes to sees it: another
    /// account's job is `None` as a missing one is, after the same steps, and a job preempted by
    /// another account's job is told only that it was "a higher tier".
    pub fn job_seen_by(&self, id: &JobId, sees: &dyn Fn(&str) -> bool) -> Option<JobInfo> {
        let inner = self.lock();
        let job = inner.state.jobs.get(id);
        let visible = job.filter(|j| sees(j.request.account.as_str()));
        visible.map(|j| inner.shown(j, sees))
    }

    /// Jobs of every state (as `sacct`), oldest submission first: those `filter` selects among
    /// the ones the caller may see, the newest `filter.limit` of them.
    pub fn history_seen_by(
        &self,
        sees: &dyn Fn(&str) -> bool,
        filter: &HistoryFilter,
    ) -> Vec<JobInfo> {
        let inner = self.lock();
        let mut jobs: Vec<&JobInfo> = inner
            .state
            .jobs
            .values()
            .map(|j| &**j)
            .filter(|j| sees(j.request.account.as_str()))
            .filter(|j| filter.selects(j))
            .collect();
        jobs.sort_by(|a, b| (a.submit_s, &a.id).cmp(&(b.submit_s, &b.id)));
        let skip = jobs.len().saturating_sub(filter.limit);
        jobs.into_iter()
            .skip(skip)
            .map(|j| inner.shown(j, sees))
            .collect()
    }

    /// [`Service::queue`] as a caller who may see the accounts `sees` says yes to sees it.
    pub fn queue_seen_by(&self, sees: &dyn Fn(&str) -> bool) -> Vec<JobInfo> {
        let inner = self.lock();
        let running = inner
            .state
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Preempting));
        let pending = inner
            .sched
            .pending()
            .filter_map(|p| inner.state.jobs.get(&p.spec.id));
        running
            .chain(pending)
            .filter(|j| sees(j.request.account.as_str()))
            .map(|j| inner.shown(j, sees))
            .collect()
    }

    /// Every waiting job `sees` lets the caller see, with its priority now and the parts it
    /// is made of, in the order a cycle run now would take them (as `sprio`).
    pub fn priorities_seen_by(&self, sees: &dyn Fn(&str) -> bool) -> Vec<PriorityRow> {
        let now = self.now_s();
        let inner = self.lock();
        inner
            .sched
            .priorities(now)
            .into_iter()
            .filter(|p| sees(p.account.as_str()))
            .map(|p| PriorityRow {
                partition: inner
                    .state
                    .jobs
                    .get(&p.job)
                    .and_then(|j| j.request.partition.clone()),
                job_id: p.job.to_string(),
                account: p.account.to_string(),
                tier: p.tier,
                priority: p.priority,
                fair_share: p.fair_share,
                age: p.age,
                job_size: p.job_size,
                quota: p.quota,
                relieved: p.relieved,
                standing: p.standing.map(|s| standing_name(s).to_owned()),
            })
            .collect()
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
                        share: ng.share,
                    });
                }
            }
        }
        out
    }

    /// The Unix user a job of `account` (in `project`) runs as: the project's `run_as`, else
    /// the account's, resolved on this host. A scheduler running as root refuses an account
    /// without one rather than run tenants' jobs as root.
    fn job_user(
        &self,
        account: &AccountId,
        project: Option<&ProjectId>,
    ) -> Result<Option<JobUser>> {
        let Some(index) = self.cluster.accounts.iter().position(|a| &a.id == account) else {
            // Not an account at all: admission refuses it as one that does not exist.
            return Ok(None);
        };
        let refuse = |message: String| Error::Invalid {
            field: "account".into(),
            message,
        };
        let a = &self.cluster.accounts[index];
        let in_project = project.and_then(|p| {
            let j = a.projects.iter().position(|x| &x.id == p)?;
            let run_as = a.projects[j].run_as.as_ref()?;
            Some((format!("accounts[{index}].projects[{j}].run_as"), run_as))
        });
        let configured = in_project.or_else(|| {
            a.run_as
                .as_ref()
                .map(|r| (format!("accounts[{index}].run_as"), r))
        });
        let Some((field, run_as)) = configured else {
            if nix::unistd::geteuid().is_root() {
                let field = format!("accounts[{index}].run_as");
                return Err(refuse(format!(
                    "account `{account}` has no Unix user to run its jobs as and the scheduler runs as root: set {field} = {{ user = \"...\" }} in the cluster config ({{ user = \"root\" }} runs them as root on purpose)"
                )));
            }
            return Ok(None);
        };
        let user = nix::unistd::User::from_name(&run_as.user)
            .ok()
            .flatten()
            .ok_or_else(|| {
                refuse(format!(
                    "{field}: user `{}` does not exist on this host",
                    run_as.user
                ))
            })?;
        let gid = match &run_as.group {
            Some(name) => {
                nix::unistd::Group::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| {
                        refuse(format!(
                            "{field}: group `{name}` does not exist on this host"
                        ))
                    })?
                    .gid
            }
            None => user.gid,
        };
        Ok(Some(JobUser {
            uid: user.uid.as_raw(),
            gid: gid.as_raw(),
        }))
    }

    /// The job's grace: its own, else its partition's, else the default; never more than its
    /// partition's `max_grace`.
    fn grace_of(&self, info: &JobInfo) -> u64 {
        let partition = info
            .request
            .partition
            .clone()
            .or_else(|| self.cluster.default_partition().map(|p| p.name.clone()))
            .and_then(|name| self.cluster.partitions.iter().find(|p| p.name == name));
        let grace = info
            .request
            .grace
            .or_else(|| partition.and_then(|p| p.grace_time))
            .unwrap_or(self.cluster.scheduler.default_grace)
            .as_secs();
        grace.min(
            partition.map_or(gpuledger_model::config::DEFAULT_MAX_GRACE_S, |p| {
                p.max_grace_s()
            }),
        )
    }

    /// One round: reap, deadlines, usage, a scheduling cycle and its actions, then state and
    /// events out.
    /// Scheduling cycles run since the service started (ready after the first: its state
    /// restored and its running jobs adopted).
    pub fn cycles_run(&self) -> u64 {
        self.lock().counters.cycles
    }

    pub fn tick(&self) -> Result<Cycle> {
        let now = self.now_s();
        let usage = self.fetch_usage_if_due(now);
        let mut inner = self.lock();
        inner.reap(now);
        inner.drain_for_unkillable(now);
        inner.deadlines(now);
        match usage {
            Some(accounts) => {
                for (account, hours) in accounts {
                    if let Ok(id) = AccountId::new(account) {
                        inner.sched.set_usage(&id, hours, now);
                    }
                }
                inner.last_usage_s = now;
            }
            None if self.aggregator.is_none() => inner.sched.accrue_usage(now),
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
        let history_s = self.cluster.scheduler.job_history.as_secs() as i64;
        inner.forget_ended_before(now - history_s);
        self.batch_events(&mut inner);
        self.save_cycle(&mut inner)?;
        if inner.billing_file_stale {
            self.write_billing_reservations_or_later(&mut inner);
        }
        let batch = inner.state.sending.clone();
        let seq = inner.state.event_seq;
        drop(inner);
        if !batch.is_empty() {
            self.send_events(&batch, seq);
        }
        Ok(cycle)
    }

    /// Makes what the cycle changed durable: its record in the journal; when the journal has
    /// grown to half the last `state.json`, a new `state.json` is begun beside the service
    /// (a copy taken under the lock, written and flushed on a thread of its own: with tens of
    /// thousands waiting, serializing and flushing it held every request for a fifth of a
    /// second), after which the journal starts again. After a failed write, one is written
    /// under the lock holding every change so far, and the journal starts again empty.
    fn save_cycle(&self, inner: &mut Inner) -> Result<()> {
        self.note_state_file_beside(inner, false);
        if inner.dirty || !inner.unrecorded.jobs.is_empty() {
            inner.write_job_mapping(&self.config.dir)?;
        }
        let ticket = inner
            .take_unrecorded()
            .map(|change| self.journal.push(change, false));
        let journal_max = (inner.state_file_bytes / 2).max(MIN_JOURNAL_BYTES);
        let written = if inner.dirty || self.journal.write_failed() {
            self.save_state_file(inner)?;
            true
        } else if self.journal.bytes() >= journal_max {
            self.begin_state_file_beside(inner)?
        } else {
            false
        };
        if let (false, Some(ticket)) = (written, ticket) {
            if let Err(source) = self.journal.commit(&ticket) {
                inner.dirty = true;
                return Err(Error::NotStored {
                    what: "the cycle's changes are kept in memory for the next state.json".into(),
                    path: self.journal.path(),
                    source,
                });
            }
        }
        #[cfg(debug_assertions)]
        if !inner.dirty {
            self.check_disk_holds(inner);
        }
        Ok(())
    }

    /// Writes `state.json` under the lock, holding every change so far; the journal starts
    /// again empty.
    fn save_state_file(&self, inner: &mut Inner) -> Result<()> {
        let seq = self.journal.last_seq();
        let path = self.state_path();
        let state = &mut inner.state;
        let mut bytes = 0;
        let saved = self.journal.save_through(seq, || {
            state.journal_seq = seq;
            bytes = state.save(&path)?;
            Ok::<_, Error>(())
        });
        let saved = match saved {
            Ok(saved) => saved,
            Err(error) => {
                inner.dirty = true;
                return Err(error);
            }
        };
        // Else a request whose record could not be written is undoing its change: the next
        // cycle saves.
        inner.dirty = !saved;
        if saved {
            inner.state_file_bytes = bytes;
        }
        Ok(())
    }

    /// Begins a `state.json` beside the service, the queued records (the cycle's among them)
    /// written first; whether it began (else they are committed as usual).
    fn begin_state_file_beside(&self, inner: &mut Inner) -> Result<bool> {
        let seq = self.journal.last_seq();
        inner.state.journal_seq = seq;
        let state = &inner.state;
        match self
            .journal
            .save_beside(seq, || state.clone(), self.state_path())
        {
            Ok(began) => Ok(began),
            Err(source) => {
                inner.dirty = true;
                Err(Error::NotStored {
                    what: "the cycle's changes are kept in memory for the next state.json".into(),
                    path: self.journal.path(),
                    source,
                })
            }
        }
    }

    /// Takes note of the `state.json` written beside the service once it is done (with `wait`,
    /// waiting for it): its size, or the failure (the next cycle writes one under the lock).
    fn note_state_file_beside(&self, inner: &mut Inner, wait: bool) {
        match self.journal.saved_beside(wait) {
            Some(Ok(bytes)) => inner.state_file_bytes = bytes,
            Some(Err(error)) => {
                tracing::error!(%error, "the state file written beside the service failed; the next cycle writes it again");
            }
            None => {}
        }
    }

    /// Returns once the `state.json` being written beside the service (if any) is on disk, or
    /// failed (logged; the next cycle writes it again). The service stops after this.
    pub fn finish_state_file(&self) {
        let mut inner = self.lock();
        self.note_state_file_beside(&mut inner, true);
    }

    /// Debug builds: what a restart would read (`state.json` and the journal) is the state in
    /// memory, but for what every cycle works out afresh (a waiting job's reason and planned
    /// start). A change a cycle made and did not record fails here, in every test that ticks.
    #[cfg(debug_assertions)]
    fn check_disk_holds(&self, inner: &Inner) {
        let on_disk = journal::read_back(&self.config.dir, STATE_FILE)
            .unwrap_or_else(|e| panic!("the state on disk cannot be read back: {e}"));
        let comparable = |state: &State| {
            let mut value = serde_json::to_value(state).expect("a state serializes");
            value["journal_seq"] = serde_json::Value::Null;
            if let Some(jobs) = value["jobs"].as_object_mut() {
                for job in jobs.values_mut() {
                    job["reason"] = serde_json::Value::Null;
                    job["estimated_start_s"] = serde_json::Value::Null;
                }
            }
            value
        };
        let (memory, disk) = (comparable(&inner.state), comparable(&on_disk));
        if memory != disk {
            let (m, d) = (memory.to_string(), disk.to_string());
            let at = m.bytes().zip(d.bytes()).take_while(|(a, b)| a == b).count();
            let around = |s: &str| {
                let bytes = &s.as_bytes()[at.saturating_sub(200)..(at + 200).min(s.len())];
                String::from_utf8_lossy(bytes).into_owned()
            };
            panic!(
                "the disk does not hold what the cycle changed:\n memory: ...{}\n disk:   ...{}",
                around(&m),
                around(&d)
            );
        }
    }

    fn act(&self, inner: &mut Inner, cycle: &Cycle, now: UnixSeconds) {
        for started in &cycle.started {
            let Some(info) = inner.state.jobs.get(&started.job_id).cloned() else {
                continue;
            };
            let user = match self.job_user(&info.request.account, info.request.project.as_ref()) {
                Ok(user) => user,
                Err(e) => {
                    inner.fail_launch(&info.id, now, &e);
                    continue;
                }
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
                env: info.request.env.clone(),
                user,
                gpu_share: info.request.gpu_share,
            };
            let kind = if info.preemptions > 0 {
                JobEventKind::Resumed
            } else {
                JobEventKind::Started
            };
            match inner.executor.launch(&launch) {
                Ok(pid) => {
                    tracing::info!(job = %info.id, pid, allocation = %started.allocation, backfilled = started.backfilled, "job started");
                    let job = inner.state.jobs.get_mut(&info.id).map(Arc::make_mut);
                    if let Some(job) = job {
                        job.state = JobState::Running;
                        job.pid = Some(pid);
                        job.start_s.get_or_insert(now);
                        job.allocation = Some(started.allocation.to_string());
                        job.reason = None;
                        job.estimated_start_s = None;
                        job.gpu_wait_from_s = None;
                    }
                    let mut ev = event(&info, now, kind);
                    ev.gpus = Some(started.gpus);
                    ev.allocation = Some(started.allocation.clone());
                    inner.state.outbox.push(ev);
                }
                Err(e) => inner.fail_launch(&info.id, now, &e),
            }
            inner.touched(&info.id);
            inner.touched_events();
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
            if let Some(job) = inner.state.jobs.get_mut(&p.job_id).map(Arc::make_mut) {
                job.state = JobState::Preempting;
                job.preempted_by = Some(Preemptor::Job(p.by.clone()));
                job.signal_s = Some(now);
                job.kill_s = Some(p.kill_s);
            }
            inner.touched(&p.job_id);
        }
        for r in &cycle.resized {
            // A process cannot change its CUDA_VISIBLE_DEVICES while it runs: an elastic job is
            // told of its new GPUs by SIGHUP and the `allocation` file in its directory
            // (`GPULEDGER_ALLOCATION_FILE`), and is expected to re-form its workers on them
            // (as torchrun's elastic agent does). Billing and the exporters' labels follow the
            // recorded allocation.
            if let Some(job) = inner.state.jobs.get_mut(&r.job_id).map(Arc::make_mut) {
                job.allocation = Some(r.allocation.to_string());
                let info = job.clone();
                let allocation = r.allocation.to_string();
                if let Err(e) = inner.executor.resized(&r.job_id, &allocation) {
                    tracing::warn!(job = %r.job_id, error = %e, "the resized job not told its new allocation");
                }
                tracing::info!(job = %r.job_id, gpus = r.gpus, allocation = %r.allocation, "elastic job resized");
                let mut ev = event(&info, now, JobEventKind::Resumed);
                ev.gpus = Some(r.gpus);
                ev.allocation = Some(r.allocation.clone());
                inner.state.outbox.push(ev);
            }
            inner.touched(&r.job_id);
            inner.touched_events();
        }
    }
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
