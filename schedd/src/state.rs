//! What the service keeps on disk: every job it knows (request, state, times, allocation,
//! process id), the reservations, and the job events not yet delivered to the aggregator.
//! Written whole to `state.json` through a temporary file and a rename, so a crash leaves the
//! old state or the new one, never half of one.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use gpuledger_model::job::JobEvent;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, DurationSpec, JobId, ProjectId};
use gpuledger_scheduler::reservation::ReservationEntry;

use crate::{Error, Result};

/// A job as a user submits it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// A shell command, run with `sh -c`.
    pub command: String,
    pub account: AccountId,
    #[serde(default)]
    pub project: Option<ProjectId>,
    #[serde(default)]
    pub partition: Option<String>,
    /// GPUs; the most an elastic job grows to.
    pub gpus: u32,
    /// An elastic job's smallest size.
    #[serde(default)]
    pub min_gpus: Option<u32>,
    pub time_limit: DurationSpec,
    /// Time between the checkpoint signal and SIGKILL when preempted.
    #[serde(default)]
    pub grace: Option<DurationSpec>,
    /// The signal that asks the job to checkpoint and exit: TERM (default), USR1, USR2, INT.
    #[serde(default)]
    pub checkpoint_signal: Option<String>,
    /// How often the job checkpoints by itself, if it does.
    #[serde(default)]
    pub checkpoint_every: Option<DurationSpec>,
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    /// Signalled to make room for a higher tier; back to pending when it exits.
    Preempting,
    Completed,
    Failed,
    Cancelled,
    Timeout,
}

impl JobState {
    /// The state as the API writes it (`pending`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Preempting => "preempting",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Timeout => "timeout",
        }
    }

    pub fn is_done(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Timeout
        )
    }
}

/// Everything the service knows about a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: JobId,
    pub request: SubmitRequest,
    pub submit_s: UnixSeconds,
    pub state: JobState,
    /// Why it pends, as Slurm's reason codes.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub estimated_start_s: Option<UnixSeconds>,
    #[serde(default)]
    pub start_s: Option<UnixSeconds>,
    #[serde(default)]
    pub end_s: Option<UnixSeconds>,
    /// `node:gpus;...` while it runs.
    #[serde(default)]
    pub allocation: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub preemptions: u32,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub last_checkpoint_s: Option<UnixSeconds>,
    /// Set while being preempted: by which job, and when SIGKILL comes.
    #[serde(default)]
    pub preempted_by: Option<Preemptor>,
    #[serde(default)]
    pub signal_s: Option<UnixSeconds>,
    #[serde(default)]
    pub kill_s: Option<UnixSeconds>,
    /// Why it is being stopped, when the service stops it: cancel or time limit.
    #[serde(default)]
    pub stopping: Option<JobState>,
}

impl JobInfo {
    /// A job just submitted.
    pub fn pending(id: JobId, request: SubmitRequest, submit_s: UnixSeconds) -> JobInfo {
        JobInfo {
            id,
            request,
            submit_s,
            state: JobState::Pending,
            reason: Some("None".into()),
            estimated_start_s: None,
            start_s: None,
            end_s: None,
            allocation: None,
            exit_code: None,
            preemptions: 0,
            pid: None,
            last_checkpoint_s: None,
            preempted_by: None,
            signal_s: None,
            kill_s: None,
            stopping: None,
        }
    }
}

/// What preempts a job: the job, as stored and as its own account or an operator sees it; to
/// another account, only that it is of a higher tier (its id would name another tenant's job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Preemptor {
    Job(JobId),
    Unnamed(String),
}

impl Preemptor {
    /// What another account is told.
    pub const UNNAMED: &'static str = "a higher tier";

    pub fn job(&self) -> Option<&JobId> {
        match self {
            Preemptor::Job(id) => Some(id),
            Preemptor::Unnamed(_) => None,
        }
    }
}

/// The whole persisted state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The next number of the old global job ids (`1`, `2`, ...), kept for state files
    /// written before jobs were numbered per account.
    #[serde(default)]
    pub next_id: u64,
    /// Each account's next job number: a job is `ACCOUNT.N`, so an id says nothing of other
    /// accounts' submissions.
    #[serde(default)]
    pub next_job_number: BTreeMap<AccountId, u64>,
    pub jobs: BTreeMap<JobId, JobInfo>,
    #[serde(default)]
    pub reservations: Vec<ReservationEntry>,
    /// Job events not yet acknowledged by the aggregator.
    #[serde(default)]
    pub outbox: Vec<JobEvent>,
    /// Sequence number of the next batch of events sent.
    #[serde(default)]
    pub event_seq: u64,
}

impl State {
    /// Reads the state file, or an empty state when there is none.
    pub fn load(path: &Path) -> Result<State> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::State {
                path: path.to_owned(),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State {
                next_id: 1,
                ..State::default()
            }),
            Err(source) => Err(Error::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Writes the state durably: a temporary file flushed, renamed over, the directory flushed.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::State {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        gpuledger_model::durable::replace_file(path, &bytes).map_err(io)
    }
}
