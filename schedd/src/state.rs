//! What the service keeps on disk: every job it knows (request, state, times, allocation,
//! process id), the reservations, and the job events not yet delivered to the aggregator.
//! Written whole to `state.json` through a temporary file and a rename, so a crash leaves the
//! old state or the new one, never half of one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

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
    /// Exactly this many GPUs on each node it uses (`--gpus-per-node`).
    #[serde(default)]
    pub gpus_per_node: Option<u32>,
    /// At most this many nodes (`--nodes`).
    #[serde(default)]
    pub nodes: Option<u32>,
    /// Only GPUs of these types (any when empty): models' keys, or types node pools name
    /// (`gpu_models`, the older name, is read the same).
    #[serde(default, alias = "gpu_models")]
    pub gpu_types: Vec<gpuledger_model::GpuType>,
    /// A part of one GPU instead of whole GPUs (`250m`, or a MIG profile `3g`), with `gpus` 1.
    #[serde(default)]
    pub gpu_share: Option<gpuledger_model::GpuShare>,
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
    /// Variables for the job's environment (`sbatch --export`); the job sees these and
    /// gpuledger's own (`CUDA_VISIBLE_DEVICES`, `GPULEDGER_*`, `PATH`, `HOME`, `TMPDIR`), never the
    /// service's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// At most this many variables in a job's `env`.
pub const MAX_JOB_ENV_VARS: usize = 64;
/// At most this many bytes in one variable's value.
pub const MAX_JOB_ENV_VALUE_BYTES: usize = 4096;

/// At most this many bytes in a job's command: one argument of `sh -c`, which Linux takes up
/// to 128 KiB (`MAX_ARG_STRLEN`), with room left for the environment.
pub const MAX_COMMAND_BYTES: usize = 64 << 10;

impl SubmitRequest {
    /// Checks what the scheduler's admission does not: a command that `sh -c` can run (not
    /// blank, no NUL, at most [`MAX_COMMAND_BYTES`]), a time limit and a checkpoint interval
    /// of at least a second, and the `env` ([`SubmitRequest::check_env`]). The field that is
    /// wrong and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        let wrong = |field: &str, why: String| Err((field.to_owned(), why));
        if self.command.trim().is_empty() {
            return wrong("command", "must not be empty".into());
        }
        if self.command.contains('\0') {
            return wrong("command", "must not contain a NUL byte".into());
        }
        if self.command.len() > MAX_COMMAND_BYTES {
            return wrong(
                "command",
                format!(
                    "{} bytes; at most {MAX_COMMAND_BYTES} (put a longer one in a script)",
                    self.command.len()
                ),
            );
        }
        if self.time_limit.as_secs() == 0 {
            return wrong("time_limit", "must be at least 1s".into());
        }
        if self.checkpoint_every.is_some_and(|e| e.as_secs() == 0) {
            return wrong("checkpoint_every", "must be at least 1s when given".into());
        }
        self.check_env()
    }

    /// Checks the job's `env`: names of letters, digits and `_` (not starting with a digit, at
    /// most 128), values without NUL of at most 4 KiB, at most 64 of them, and none of the
    /// names gpuledger sets itself. The field that is wrong and why.
    pub fn check_env(&self) -> Result<(), (String, String)> {
        if self.env.len() > MAX_JOB_ENV_VARS {
            return Err((
                "env".into(),
                format!("{} variables; at most {MAX_JOB_ENV_VARS}", self.env.len()),
            ));
        }
        for (name, value) in &self.env {
            let field = format!("env.{name}");
            let well_formed = !name.is_empty()
                && name.len() <= 128
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !well_formed {
                return Err((
                    field,
                    "a name is letters, digits and `_`, not starting with a digit, at most 128"
                        .into(),
                ));
            }
            if name == "CUDA_VISIBLE_DEVICES"
                || name == crate::executor::MPS_THREAD_PERCENTAGE
                || name.starts_with("GPULEDGER_")
            {
                return Err((field, "gpuledger sets this one itself".into()));
            }
            if value.len() > MAX_JOB_ENV_VALUE_BYTES || value.contains('\0') {
                return Err((
                    field,
                    format!("a value is at most {MAX_JOB_ENV_VALUE_BYTES} bytes, without NUL"),
                ));
            }
        }
        Ok(())
    }
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
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Running,
        JobState::Preempting,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
    ];

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
    /// Why it pends, as Slurm's reason codes; for a job that failed because it could not be
    /// launched, `launch failed: ` and why.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub estimated_start_s: Option<UnixSeconds>,
    /// While it pends: since when it has waited for GPUs, its own quota not holding it (the
    /// relief's count, `PendingJob::gpu_wait_from`); `null` while a quota holds it. A state
    /// written before this field reads as held, so the count starts again at the first cycle.
    #[serde(default)]
    pub gpu_wait_from_s: Option<UnixSeconds>,
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
    /// Since when some of its processes have outlived SIGKILL past the executor's timeout: its
    /// GPUs stay held and its nodes drained until they are gone.
    #[serde(default)]
    pub unkillable_s: Option<UnixSeconds>,
    /// Its last run's CPU time, all its processes together, in milliseconds (Slurm's
    /// `TotalCPU`), where its cgroup counts it.
    #[serde(default)]
    pub cpu_time_ms: Option<u64>,
    /// Its last run's peak memory, in bytes (its cgroup's high-water mark, page cache
    /// included: what its memory limit is held against), where memory is limited.
    #[serde(default)]
    pub peak_memory_bytes: Option<u64>,
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
            gpu_wait_from_s: Some(submit_s),
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
            unkillable_s: None,
            cpu_time_ms: None,
            peak_memory_bytes: None,
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
    /// Each shared with the copy a `state.json` being written holds (`journal.rs`), and copied
    /// only where it changes meanwhile (`Arc::make_mut`): the copy costs a reference a job.
    #[serde(with = "shared")]
    pub jobs: BTreeMap<JobId, Arc<JobInfo>>,
    #[serde(default)]
    pub reservations: Vec<ReservationEntry>,
    /// Job events not yet put in a batch.
    #[serde(default)]
    pub outbox: Vec<JobEvent>,
    /// The batch numbered `event_seq`, sent and not yet acknowledged: sent again exactly as it
    /// is until it is, since the aggregator keeps the first copy of a number and drops any
    /// later one whole (a batch that grew while its answer was lost would lose the new events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sending: Vec<JobEvent>,
    /// Sequence number of the batch in `sending`, or of the next one.
    #[serde(default)]
    pub event_seq: u64,
    /// Nodes out of service, by name.
    #[serde(default)]
    pub drained: BTreeMap<String, Drained>,
    /// The last journal record this state holds (`journal.rs`).
    #[serde(default)]
    pub journal_seq: u64,
}

/// Jobs shared behind `Arc`, written and read as the jobs themselves (serde's `rc` feature
/// would do it for every crate of the build, and rebuild them all).
pub(crate) mod shared {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        map: &BTreeMap<K, Arc<V>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(map.iter().map(|(k, v)| (k, &**v)))
    }

    pub fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, Arc<V>>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let map = BTreeMap::<K, V>::deserialize(deserializer)?;
        Ok(map.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
    }

    /// The same for a list.
    pub mod list {
        use std::sync::Arc;

        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<V: Serialize, S: Serializer>(
            list: &[Arc<V>],
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.collect_seq(list.iter().map(|v| &**v))
        }

        pub fn deserialize<'de, V, D>(deserializer: D) -> Result<Vec<Arc<V>>, D::Error>
        where
            V: Deserialize<'de>,
            D: Deserializer<'de>,
        {
            let list = Vec::<V>::deserialize(deserializer)?;
            Ok(list.into_iter().map(Arc::new).collect())
        }
    }
}

/// Why and since when a node is out of service (as Slurm's `scontrol show node` Reason).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drained {
    pub reason: String,
    pub since_s: UnixSeconds,
    /// `gpuledger` when the scheduler drained it itself, else the operator's name.
    pub by: String,
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

    /// The jobs that have ended, by end time and id.
    pub fn ended(&self) -> BTreeSet<(UnixSeconds, JobId)> {
        self.jobs
            .values()
            .filter(|j| j.state.is_done())
            .filter_map(|j| Some((j.end_s?, j.id.clone())))
            .collect()
    }

    /// Writes the state durably: a temporary file flushed, renamed over, the directory flushed;
    /// its size.
    pub fn save(&self, path: &Path) -> Result<u64> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::State {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        // Every tenant's jobs, commands and processes: the service's eyes only.
        // Flushed a megabyte at a time: the journal's flushes meanwhile wait behind no more.
        gpuledger_model::durable::replace_file_flushing_every(path, &bytes, Some(0o600), 1 << 20)
            .map_err(io)?;
        Ok(bytes.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_shared_behind_arc_are_written_and_read_as_the_jobs_themselves() {
        let request: SubmitRequest = serde_json::from_str(
            r#"{"command": "true", "account": "team-a", "gpus": 1, "time_limit": "1h"}"#,
        )
        .unwrap();
        let id = JobId::new("team-a.1").unwrap();
        let job = JobInfo::pending(id.clone(), request, 1_000);
        let mut state = State::default();
        state.jobs.insert(id.clone(), Arc::new(job.clone()));
        let written = serde_json::to_value(&state).unwrap();
        let plain: BTreeMap<JobId, JobInfo> = [(id.clone(), job.clone())].into();
        assert_eq!(written["jobs"], serde_json::to_value(&plain).unwrap());
        let read: State = serde_json::from_value(written).unwrap();
        assert_eq!(read, state);

        // A copy shares the job until one side changes it.
        let copy = state.clone();
        assert!(Arc::ptr_eq(&copy.jobs[&id], &state.jobs[&id]));
        if let Some(job) = state.jobs.get_mut(&id).map(Arc::make_mut) {
            job.state = JobState::Cancelled;
        }
        assert_eq!(copy.jobs[&id].state, JobState::Pending);
        assert_eq!(state.jobs[&id].state, JobState::Cancelled);
    }
}
