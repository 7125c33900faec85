//! `squeue --json`: the jobs slurmctld holds now, as the steering loop needs them (state, hold
//! reason, priority, comment, GPUs, time limit). JSON rather than `--format`, because a job's
//! comment is the user's free text: in a delimited line a comment holding the delimiter or a
//! newline could forge another job's fields.
//!
//! The document's shape moved between Slurm releases (22.05's `openapi/v0.0.38`: plain numbers
//! and a state string; 23.02 and later: `{"set", "infinite", "number"}` objects and a list of
//! state flags); both are read.

use serde_json::Value;

use super::gres_gpus;
use super::jobs::State;
use crate::{LineError, Result};

/// One job in Slurm's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedJob {
    pub job_id: String,
    pub account: String,
    pub user: String,
    pub partition: String,
    pub state: State,
    /// Slurm's reason (`Priority`, `Resources`, `JobHeldAdmin`, `JobHeldUser`, ...).
    pub reason: String,
    /// 0 for a held job.
    pub priority: u64,
    pub comment: String,
    /// GPUs of the whole job (per node times nodes, per job, or per task times tasks).
    pub gpus: u32,
    /// `None`: no limit.
    pub time_limit_s: Option<u64>,
    /// Unix seconds; only for a job that has started.
    pub start_s: Option<i64>,
    pub submit_s: Option<i64>,
    /// Since when Slurm counts the job eligible to run (`eligible_time`): unset while it is
    /// held, and the release time after a hold (Slurm 22.05, seen here: `accrue_time` keeps
    /// the submit time through a hold, so it cannot say how long a job waited for GPUs).
    pub eligible_s: Option<i64>,
}

impl QueuedJob {
    /// Held by an operator (`scontrol hold`, priority 0) or its user (`scontrol uhold`).
    pub fn is_held(&self) -> bool {
        self.state == State::Pending && (self.priority == 0 || self.reason.starts_with("JobHeld"))
    }
}

/// A number as either release writes it: `5`, or `{"set": true, "infinite": false,
/// "number": 5}`; `None` when unset or infinite.
fn number(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => {
            let set = o.get("set").and_then(Value::as_bool).unwrap_or(true);
            let infinite = o.get("infinite").and_then(Value::as_bool).unwrap_or(false);
            (set && !infinite)
                .then(|| o.get("number").and_then(Value::as_i64))
                .flatten()
        }
        _ => None,
    }
}

fn text(job: &Value, key: &str) -> String {
    match job.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn state(job: &Value) -> State {
    match job.get("job_state") {
        Some(Value::String(s)) => State::parse(s),
        // 23.02+: the base state first, then flags.
        Some(Value::Array(flags)) => flags
            .iter()
            .filter_map(Value::as_str)
            .map(State::parse)
            .find(|s| *s != State::Other)
            .unwrap_or(State::Other),
        _ => State::Other,
    }
}

/// GPUs a job asks for: `tres_per_job` (`--gpus`), else `tres_per_node` (`--gres`,
/// `--gpus-per-node`) times its nodes, else `tres_per_task` times its tasks.
fn gpus(job: &Value) -> u64 {
    let count = |key: &str| gres_gpus(&text(job, key));
    let of = |key: &str| job.get(key).and_then(number).unwrap_or(1).max(1) as u64;
    if let Some(g) = count("tres_per_job") {
        return g;
    }
    if let Some(g) = count("tres_per_node") {
        return g * of("node_count");
    }
    if let Some(g) = count("tres_per_task") {
        return g * of("tasks");
    }
    0
}

/// Reads `squeue --json`; a job without an id or account names its place in `origin`.
pub fn parse_squeue_json(text_in: &str, origin: &str) -> Result<Vec<QueuedJob>> {
    let err = |message: String| LineError {
        origin: origin.to_owned(),
        line: 0,
        message,
    };
    let doc: Value = serde_json::from_str(text_in).map_err(|e| LineError {
        origin: origin.to_owned(),
        line: e.line(),
        message: format!("not squeue's JSON: {e}"),
    })?;
    let jobs = doc
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or_else(|| err("no `jobs` list: is this `squeue --json`?".into()))?;
    let mut out = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let job_id = job
            .get("job_id")
            .and_then(number)
            .ok_or_else(|| err(format!("jobs[{i}].job_id: missing or not a number")))?;
        let account = text(job, "account");
        if account.is_empty() {
            return Err(err(format!("jobs[{i}].account: missing (job {job_id})")));
        }
        let state = state(job);
        let time = |key: &str| job.get(key).and_then(number).filter(|t| *t > 0);
        out.push(QueuedJob {
            job_id: job_id.to_string(),
            account,
            user: text(job, "user_name"),
            partition: text(job, "partition"),
            state,
            reason: text(job, "state_reason"),
            priority: job.get("priority").and_then(number).unwrap_or(0).max(0) as u64,
            comment: text(job, "comment"),
            gpus: u32::try_from(gpus(job)).unwrap_or(u32::MAX),
            time_limit_s: job
                .get("time_limit")
                .and_then(number)
                .map(|m| m.max(0) as u64 * 60),
            start_s: state.has_run().then(|| time("start_time")).flatten(),
            submit_s: time("submit_time"),
            eligible_s: time("eligible_time"),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two jobs as Slurm 22.05 prints them (fields trimmed to those read, and some others).
    const V0038: &str = r#"{"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": [
      {"account": "teama", "job_id": 4, "job_state": "RUNNING", "state_reason": "None",
       "priority": 1, "comment": "x|y\n5|teamb|PENDING", "tres_per_node": "gres:gpu:h100:3",
       "tres_per_job": "", "node_count": 1, "time_limit": 7, "start_time": 1796217533,
       "submit_time": 1796217500, "eligible_time": 1796217500, "user_name": "alice",
       "partition": "train", "nice": null},
      {"account": "teamb", "job_id": 5, "job_state": "PENDING", "state_reason": "JobHeldAdmin",
       "priority": 0, "comment": "", "tres_per_node": "gres:gpu:2", "node_count": 2,
       "time_limit": null, "start_time": 0, "submit_time": 1796217534, "eligible_time": 0,
       "user_name": "bob", "partition": "train"}]}"#;

    /// The same two as 23.11 prints them.
    const V0040: &str = r#"{"jobs": [
      {"account": "teama", "job_id": 4, "job_state": ["RUNNING"], "state_reason": "None",
       "priority": {"set": true, "infinite": false, "number": 1}, "comment": "x|y\n5|teamb|PENDING",
       "tres_per_node": "gres/gpu:h100:3", "node_count": {"set": true, "number": 1},
       "time_limit": {"set": true, "infinite": false, "number": 7},
       "start_time": {"set": true, "number": 1796217533}, "submit_time": {"set": true, "number": 1796217500},
       "eligible_time": {"set": true, "number": 1796217500}, "user_name": "alice", "partition": "train"},
      {"account": "teamb", "job_id": 5, "job_state": ["PENDING"], "state_reason": "JobHeldAdmin",
       "priority": {"set": true, "number": 0}, "comment": "", "tres_per_job": "gres/gpu:4",
       "time_limit": {"set": false, "infinite": true, "number": 0},
       "start_time": {"set": true, "number": 0}, "submit_time": {"set": true, "number": 1796217534},
       "eligible_time": {"set": true, "number": 0}, "user_name": "bob", "partition": "train"}]}"#;

    #[test]
    fn both_shapes_read_the_same_jobs() {
        for doc in [V0038, V0040] {
            let jobs = parse_squeue_json(doc, "squeue").unwrap();
            assert_eq!(jobs.len(), 2, "a comment cannot add a job");
            let (a, b) = (&jobs[0], &jobs[1]);
            assert_eq!(a.job_id, "4");
            assert_eq!(a.account, "teama");
            assert_eq!(a.state, State::Running);
            assert_eq!(a.gpus, 3);
            assert_eq!(a.time_limit_s, Some(420));
            assert_eq!(a.start_s, Some(1_796_217_533));
            assert_eq!(a.comment, "x|y\n5|teamb|PENDING");
            assert!(!a.is_held());
            assert_eq!(b.state, State::Pending);
            assert_eq!(b.gpus, 4, "2 per node on 2 nodes, or 4 per job");
            assert_eq!(b.time_limit_s, None, "no limit");
            assert_eq!(b.start_s, None, "a pending job has not started");
            assert!(b.is_held());
            assert_eq!(
                (a.eligible_s, b.eligible_s),
                (Some(1_796_217_500), None),
                "a held job is not eligible"
            );
        }
    }

    #[test]
    fn what_is_not_squeue_json_is_refused_with_its_place() {
        let e = parse_squeue_json("squeue: error: x", "squeue --json").unwrap_err();
        assert!(e.to_string().contains("not squeue's JSON"), "{e}");
        let e = parse_squeue_json(r#"{"jobs": [{"job_id": 1}]}"#, "squeue --json").unwrap_err();
        assert!(e.to_string().contains("jobs[0].account"), "{e}");
        let e = parse_squeue_json(r#"{"errors": []}"#, "squeue --json").unwrap_err();
        assert!(e.to_string().contains("no `jobs` list"), "{e}");
    }
}
