//! Slurm's job records to gpuledger job events. Four readings of a Slurm cluster, each parsed
//! to the same [`SlurmJob`]:
//!
//! - `sacct --parsable2 --allocations --format=JobID,Account,User,Partition,Submit,Start,End,
//!   State,ExitCode,AllocTRES,NodeList,Timelimit` (needs slurmdbd; GPUs from `AllocTRES` when
//!   `AccountingStorageTRES` has `gres/gpu`): [`parse_sacct`];
//! - the text job-completion log (`JobCompType=jobcomp/filetxt`), a line per finished job:
//!   [`parse_jobcomp`];
//! - `squeue --noheader --states=all --format=%i|%a|%P|%T|%V|%S|%e|%b|%N|%l|%u` (pending,
//!   running and recently ended jobs, with their GRES): [`parse_squeue`], [`SQUEUE_FORMAT`];
//! - `scontrol -d -o show job` (one line per known job, with each node's GPU indices,
//!   `GRES=gpu:h100:3(IDX:0-2)`): [`parse_scontrol`].
//!
//! [`Tracker`] turns successive readings into events: submitted, started with its GPUs,
//! preempted or requeued, finished with its outcome. It remembers what it sent, so a job read
//! twice (or by two readings) gives each event once; its state is plain JSON to keep across
//! restarts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use gpuledger_model::allocation::{Allocation, NodeGpus};
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::{AccountId, JobId, NodeId, ProjectId};

use super::{duration, gres_gpus, hostlist, index_list, time_ms, tres_gpus, Zone};
use crate::{LineError, Result};

/// A job's state as Slurm names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Pending,
    Running,
    Suspended,
    Completing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
    BootFail,
    Deadline,
    Requeued,
    Other,
}

impl State {
    /// `COMPLETED`, `CANCELLED by 0`, `CA`, `RUNNING+`, ...
    pub fn parse(text: &str) -> State {
        let word = text
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+')
            .to_ascii_uppercase();
        match word.as_str() {
            "PENDING" | "PD" => State::Pending,
            "RUNNING" | "R" | "CONFIGURING" | "CF" => State::Running,
            "SUSPENDED" | "S" | "STOPPED" | "ST" => State::Suspended,
            "COMPLETING" | "CG" => State::Completing,
            "COMPLETED" | "CD" => State::Completed,
            "FAILED" | "F" => State::Failed,
            "CANCELLED" | "CA" => State::Cancelled,
            "TIMEOUT" | "TO" => State::Timeout,
            "NODE_FAIL" | "NF" => State::NodeFail,
            "PREEMPTED" | "PR" => State::Preempted,
            "OUT_OF_MEMORY" | "OOM" => State::OutOfMemory,
            "BOOT_FAIL" | "BF" => State::BootFail,
            "DEADLINE" | "DL" => State::Deadline,
            "REQUEUED" | "RQ" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESIZING" => State::Requeued,
            _ => State::Other,
        }
    }

    /// How a job in this state ended, if it did.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            State::Completed => Some(Outcome::Completed),
            State::Failed | State::BootFail => Some(Outcome::Failed),
            State::OutOfMemory => Some(Outcome::OutOfMemory),
            State::Cancelled => Some(Outcome::Cancelled),
            State::Timeout | State::Deadline => Some(Outcome::Timeout),
            State::NodeFail => Some(Outcome::NodeFail),
            _ => None,
        }
    }

    /// Running or done running (its start time is real, not an estimate).
    pub fn has_run(self) -> bool {
        !matches!(self, State::Pending | State::Other)
    }
}

/// One job as a reading of Slurm saw it. Unknown fields are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlurmJob {
    pub job_id: String,
    pub account: String,
    pub user: Option<String>,
    pub partition: Option<String>,
    pub state: Option<State>,
    pub submit_ms: Option<i64>,
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    pub exit_code: Option<i32>,
    pub gpus: Option<u32>,
    pub nodes: Vec<String>,
    /// GPU indices per node, where a reading knows them (`scontrol -d`).
    pub gpu_indices: BTreeMap<String, Vec<u16>>,
    pub time_limit_s: Option<u64>,
}

impl SlurmJob {
    /// Fills what `self` lacks from `other` (another reading of the same job).
    pub fn merge(&mut self, other: &SlurmJob) {
        macro_rules! fill {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = other.$f.clone(); } )* };
        }
        fill!(
            user,
            partition,
            submit_ms,
            start_ms,
            end_ms,
            exit_code,
            gpus,
            time_limit_s
        );
        // The later reading's state wins where it says more (ended beats running).
        match (self.state, other.state) {
            (None, s) => self.state = s,
            (Some(a), Some(b)) if a.outcome().is_none() && b.outcome().is_some() => {
                self.state = Some(b);
                self.end_ms = other.end_ms.or(self.end_ms);
                self.exit_code = other.exit_code.or(self.exit_code);
            }
            _ => {}
        }
        if self.nodes.is_empty() {
            self.nodes = other.nodes.clone();
        }
        if self.gpu_indices.is_empty() {
            self.gpu_indices = other.gpu_indices.clone();
        }
        if self.account.is_empty() {
            self.account = other.account.clone();
        }
    }

    /// The GPUs it holds as gpuledger writes them, where the indices are known.
    pub fn allocation(&self) -> Option<Allocation> {
        if self.gpu_indices.is_empty() {
            return None;
        }
        let mut nodes = Vec::new();
        for (node, gpus) in &self.gpu_indices {
            nodes.push(NodeGpus::whole(
                NodeId::new(node).ok()?,
                gpus.iter().map(|g| u32::from(*g)).collect(),
            ));
        }
        Some(Allocation(nodes))
    }
}

fn exit_code(text: &str) -> Option<i32> {
    // `1:0`: exit status 1, signal 0; a signal alone is 128 + signal, as a shell reports it.
    let (status, signal) = text.trim().split_once(':').unwrap_or((text.trim(), "0"));
    let status: i32 = status.parse().ok()?;
    let signal: i32 = signal.parse().unwrap_or(0);
    Some(if status == 0 && signal > 0 {
        128 + signal
    } else {
        status
    })
}

struct Fields<'a> {
    origin: &'a str,
    line: usize,
    zone: Zone,
}

impl Fields<'_> {
    fn err(&self, message: String) -> LineError {
        LineError {
            origin: self.origin.to_owned(),
            line: self.line,
            message,
        }
    }

    fn time(&self, field: &str, v: Option<&str>) -> Result<Option<i64>> {
        v.and_then(|v| time_ms(v, self.zone))
            .transpose()
            .map_err(|e| self.err(format!("`{field}`: {e}")))
    }

    fn limit(&self, field: &str, v: Option<&str>) -> Result<Option<u64>> {
        v.and_then(duration)
            .transpose()
            .map_err(|e| self.err(format!("`{field}`: {e}")))
    }
}

/// `sacct --parsable2` output with its header line. Job steps (`123.batch`, `123.0`) are
/// skipped; the allocation line is the job.
pub fn parse_sacct(text: &str, origin: &str, zone: Zone) -> Result<Vec<SlurmJob>> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = header
        .split('|')
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let col = |n: &str| names.iter().position(|h| h == n);
    let required = ["jobid", "account", "state", "submit", "start", "end"];
    if let Some(missing) = required.iter().find(|r| col(r).is_none()) {
        return Err(LineError {
            origin: origin.to_owned(),
            line: 1,
            message: format!(
                "no `{missing}` column in the header; run sacct --parsable2 --format=JobID,Account,User,Partition,Submit,Start,End,State,ExitCode,AllocTRES,NodeList,Timelimit"
            ),
        });
    }
    let mut out = Vec::new();
    for (i, line) in lines {
        let f = Fields {
            origin,
            line: i + 1,
            zone,
        };
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() != names.len() {
            return Err(f.err(format!(
                "{} fields where the header has {}",
                cells.len(),
                names.len()
            )));
        }
        let get = |n: &str| col(n).map(|c| cells[c].trim()).filter(|v| !v.is_empty());
        let Some(id) = get("jobid") else {
            return Err(f.err("`JobID` is empty".into()));
        };
        if id.contains('.') {
            continue;
        }
        out.push(SlurmJob {
            job_id: id.to_owned(),
            account: get("account").unwrap_or("").to_owned(),
            user: get("user").map(str::to_owned),
            partition: get("partition").map(str::to_owned),
            state: get("state").map(State::parse),
            submit_ms: f.time("Submit", get("submit"))?,
            start_ms: f.time("Start", get("start"))?,
            end_ms: f.time("End", get("end"))?,
            exit_code: get("exitcode").and_then(exit_code),
            gpus: get("alloctres")
                .map(|t| tres_gpus(t).unwrap_or(0) as u32)
                .filter(|_| get("state").map(State::parse).is_some_and(State::has_run)),
            nodes: get("nodelist").map(hostlist).unwrap_or_default(),
            gpu_indices: BTreeMap::new(),
            time_limit_s: f.limit("Timelimit", get("timelimit"))?,
        });
    }
    Ok(out)
}

/// `Key=Value Key=Value ...`; a value with spaces runs up to the next ` Key=`.
fn key_values(line: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for token in line.split_whitespace() {
        match token.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') =>
            {
                out.push((k.to_owned(), v.to_owned()));
            }
            _ => {
                if let Some(last) = out.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(token);
                }
            }
        }
    }
    out
}

/// `scontrol -d`'s per-node detail, each `Nodes=` followed by its `GRES=...(IDX:0-2)`: the GPU
/// indices on each node of `node_list` (the job's, read once). A node outside it, or named by
/// two groups (text of the job's own can add a group), leaves every index unknown rather than
/// a guess at which group Slurm wrote.
fn per_node_gpus(pairs: &Pairs, node_list: &[String]) -> BTreeMap<String, Vec<u16>> {
    let mut gpu_indices = BTreeMap::new();
    let mut node: Option<Vec<String>> = None;
    for (k, v) in &pairs.0 {
        match k.as_str() {
            "Nodes" => node = Some(hostlist(v)),
            "GRES" => {
                if let (Some(nodes), Some(idx)) = (&node, v.split("IDX:").nth(1)) {
                    let idx = index_list(idx.trim_end_matches(')'));
                    for n in nodes {
                        let ours = node_list.contains(n);
                        if !ours || gpu_indices.insert(n.clone(), idx.clone()).is_some() {
                            return BTreeMap::new();
                        }
                    }
                }
            }
            _ => {}
        }
    }
    gpu_indices
}

/// A line's pairs, read so that text a job's owner writes cannot stand in for a field.
///
/// Slurm prints each field of a job once, but a job's name, working directory, command, output
/// paths and comment are the owner's own text, printed as they are: a name of `x
/// Account=other` splits into a pair of its own. A key that comes twice is that text or the
/// field itself, and which cannot be told, so it reads as absent (never the owner's choice);
/// the fields read this way are ones Slurm prints for every job, so text cannot add one that
/// was not there.
struct Pairs(Vec<(String, String)>);

impl Pairs {
    fn of(line: &str) -> Pairs {
        Pairs(key_values(line))
    }

    /// The value of `key` when it comes exactly once, not empty and not `(null)`.
    fn once(&self, key: &str) -> Option<&str> {
        let mut found = self.0.iter().filter(|(k, _)| k == key);
        match (found.next(), found.next()) {
            (Some((_, v)), None) => Some(v.as_str()).filter(|v| !v.is_empty() && *v != "(null)"),
            _ => None,
        }
    }

    /// The first pair's value when its key is `key`: the job id opens every line, before any
    /// text of the job's owner.
    fn leading(&self, key: &str) -> Option<&str> {
        self.0
            .first()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// The text job-completion log: a line per finished job, `JobId=12 ... JobState=COMPLETED ...`.
pub fn parse_jobcomp(text: &str, origin: &str, zone: Zone) -> Result<Vec<SlurmJob>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f = Fields {
            origin,
            line: i + 1,
            zone,
        };
        let pairs = Pairs::of(line);
        let get = |k: &str| pairs.once(k);
        let Some(id) = pairs.leading("JobId") else {
            return Err(f.err("no `JobId=`: is this a jobcomp/filetxt log?".into()));
        };
        let gpus = get("Tres")
            .and_then(tres_gpus)
            .or_else(|| get("Gres").and_then(gres_gpus));
        out.push(SlurmJob {
            job_id: id.to_owned(),
            account: get("Account").unwrap_or("").to_owned(),
            user: get("UserId").map(|u| u.split('(').next().unwrap_or(u).to_owned()),
            partition: get("Partition").map(str::to_owned),
            state: get("JobState").map(State::parse),
            submit_ms: f.time("SubmitTime", get("SubmitTime"))?,
            start_ms: f.time("StartTime", get("StartTime"))?,
            end_ms: f.time("EndTime", get("EndTime"))?,
            exit_code: get("ExitCode").and_then(exit_code),
            gpus: gpus.map(|g| g as u32),
            nodes: get("NodeList").map(hostlist).unwrap_or_default(),
            gpu_indices: BTreeMap::new(),
            time_limit_s: f.limit("TimeLimit", get("TimeLimit"))?,
        });
    }
    Ok(out)
}

/// The `squeue --format` that [`parse_squeue`] reads.
pub const SQUEUE_FORMAT: &str = "%i|%a|%P|%T|%V|%S|%e|%b|%N|%l|%u";

/// `squeue --noheader --states=all --format=SQUEUE_FORMAT`. A pending job's start and end are
/// Slurm's estimates and are dropped.
pub fn parse_squeue(text: &str, origin: &str, zone: Zone) -> Result<Vec<SlurmJob>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f = Fields {
            origin,
            line: i + 1,
            zone,
        };
        let c: Vec<&str> = line.split('|').map(str::trim).collect();
        if c.len() != 11 {
            return Err(f.err(format!(
                "{} fields; expected the 11 of --format={SQUEUE_FORMAT}",
                c.len()
            )));
        }
        let state = State::parse(c[3]);
        let ran = state.has_run();
        let ended =
            state.outcome().is_some() || matches!(state, State::Preempted | State::Requeued);
        out.push(SlurmJob {
            job_id: c[0].to_owned(),
            account: c[1].to_owned(),
            user: Some(c[10].to_owned()).filter(|u| !u.is_empty()),
            partition: Some(c[2].to_owned()).filter(|p| !p.is_empty()),
            state: Some(state),
            submit_ms: f.time("SUBMIT_TIME", Some(c[4]))?,
            start_ms: if ran {
                f.time("START_TIME", Some(c[5]))?
            } else {
                None
            },
            end_ms: if ended {
                f.time("END_TIME", Some(c[6]))?
            } else {
                None
            },
            exit_code: None,
            // Unknown, not 0, where GPUs were asked per job (`--gpus`): scontrol's TRES says.
            gpus: gres_gpus(c[7])
                .map(|per_node| per_node as u32 * (hostlist(c[8]).len().max(1) as u32)),
            nodes: hostlist(c[8]),
            gpu_indices: BTreeMap::new(),
            time_limit_s: f.limit("TIME_LIMIT", Some(c[9]))?,
        });
    }
    Ok(out)
}

/// `scontrol -d -o show job`: one line per job known to slurmctld, with `Nodes=X ...
/// GRES=gpu:type:N(IDX:a-b)` for each node.
pub fn parse_scontrol(text: &str, origin: &str, zone: Zone) -> Result<Vec<SlurmJob>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with("No jobs") {
            continue;
        }
        let f = Fields {
            origin,
            line: i + 1,
            zone,
        };
        let pairs = Pairs::of(line);
        let first = |k: &str| pairs.once(k);
        let Some(id) = pairs.leading("JobId") else {
            return Err(f.err("no `JobId=`: expected `scontrol -d -o show job`".into()));
        };
        let node_list = first("NodeList").map(hostlist).unwrap_or_default();
        let gpu_indices = per_node_gpus(&pairs, &node_list);
        let state = first("JobState").map(State::parse);
        let ran = state.is_some_and(State::has_run);
        let ended = state.is_some_and(|s| s.outcome().is_some());
        // TRES is printed for every job; TresPerNode only where it was asked, so text of the
        // job's own could add one: it counts only where TRES names no GPUs.
        let gpus = first("TRES")
            .and_then(tres_gpus)
            .or_else(|| {
                first("TresPerNode")
                    .and_then(gres_gpus)
                    .map(|per_node| per_node * node_list.len().max(1) as u64)
            })
            .or_else(|| {
                (!gpu_indices.is_empty()).then(|| {
                    gpu_indices
                        .values()
                        .map(|v: &Vec<u16>| v.len() as u64)
                        .sum()
                })
            });
        out.push(SlurmJob {
            job_id: id.to_owned(),
            account: first("Account").unwrap_or("").to_owned(),
            user: first("UserId").map(|u| u.split('(').next().unwrap_or(u).to_owned()),
            partition: first("Partition").map(str::to_owned),
            state,
            submit_ms: f.time("SubmitTime", first("SubmitTime"))?,
            start_ms: if ran {
                f.time("StartTime", first("StartTime"))?
            } else {
                None
            },
            end_ms: if ended {
                f.time("EndTime", first("EndTime"))?
            } else {
                None
            },
            exit_code: first("ExitCode").and_then(exit_code),
            gpus: gpus.map(|g| g as u32).or(Some(0)),
            nodes: node_list,
            gpu_indices,
            time_limit_s: f.limit("TimeLimit", first("TimeLimit"))?,
        });
    }
    Ok(out)
}

/// Which gpuledger account and project a Slurm account books to: a Slurm sub-account that is a
/// project of a gpuledger account goes to that account and project; any other name is an
/// account of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountMap {
    pub projects: BTreeMap<String, (String, String)>,
}

impl AccountMap {
    pub fn from_accounts(accounts: &[gpuledger_model::tenant::Account]) -> Self {
        let mut projects = BTreeMap::new();
        for a in accounts {
            for p in &a.projects {
                projects
                    .entry(p.id.to_string())
                    .or_insert((a.id.to_string(), p.id.to_string()));
            }
        }
        AccountMap { projects }
    }

    pub fn resolve(&self, slurm_account: &str) -> (String, Option<String>) {
        match self.projects.get(slurm_account) {
            Some((a, p)) => (a.clone(), Some(p.clone())),
            None => (slurm_account.to_owned(), None),
        }
    }

    /// The map as a file: `slurm_account account [project]` per line, each account of
    /// `accounts` mapped to itself, then every project.
    pub fn to_text(&self, accounts: &[gpuledger_model::tenant::Account]) -> String {
        let mut out = String::from(
            "# slurm_account gpuledger_account [project], from gpuledger import slurm-assoc\n",
        );
        for a in accounts {
            out.push_str(&format!("{} {}\n", a.id, a.id));
        }
        for (slurm, (account, project)) in &self.projects {
            out.push_str(&format!("{slurm} {account} {project}\n"));
        }
        out
    }

    /// Reads a map file (see [`AccountMap::to_text`]); a bad line names `origin` and its number.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let mut map = AccountMap::default();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let cells: Vec<&str> = t.split_whitespace().collect();
            match cells.as_slice() {
                // An account mapped to itself: what an unmapped name does anyway.
                [_, _] => {}
                [slurm, account, project] => {
                    map.projects.insert(
                        (*slurm).to_owned(),
                        ((*account).to_owned(), (*project).to_owned()),
                    );
                }
                _ => {
                    return Err(LineError {
                        origin: origin.to_owned(),
                        line: i + 1,
                        message: "expected `slurm_account account [project]`".into(),
                    })
                }
            }
        }
        Ok(map)
    }
}

/// What the tracker has sent for one job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub submitted: bool,
    /// Start of the run in progress, sent.
    pub running_since_ms: Option<i64>,
    /// Starts sent, so a requeued job's next run is told from a re-read of the same one.
    pub starts: Vec<i64>,
    pub finished: bool,
}

/// Turns readings into events, each once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracker {
    pub jobs: BTreeMap<String, Sent>,
}

/// A job event could not be made (a name that is not a valid id): the job is skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub job_id: String,
    pub why: String,
}

impl Tracker {
    /// The events that `job` adds to what was sent; `now_ms` stands in for a preemption's end
    /// when Slurm gives none.
    pub fn update(
        &mut self,
        job: &SlurmJob,
        accounts: &AccountMap,
        now_ms: i64,
    ) -> std::result::Result<Vec<JobEvent>, Skipped> {
        let skip = |why: String| Skipped {
            job_id: job.job_id.clone(),
            why,
        };
        let (account, project) = accounts.resolve(&job.account);
        let id = JobId::new(&job.job_id).map_err(|e| skip(e.to_string()))?;
        let account = AccountId::new(&account).map_err(|e| skip(format!("account: {e}")))?;
        let project = project
            .map(ProjectId::new)
            .transpose()
            .map_err(|e| skip(format!("project: {e}")))?;
        let sent = self.jobs.entry(job.job_id.clone()).or_default();
        if sent.finished {
            return Ok(Vec::new());
        }
        let mut events = Vec::new();
        let event = |time_ms: i64, kind: JobEventKind| {
            let mut e = JobEvent::new(time_ms, id.clone(), account.clone(), project.clone(), kind);
            e.partition = job.partition.clone();
            e.time_limit_s = job.time_limit_s;
            e
        };
        let state = job.state.unwrap_or(State::Other);
        if !sent.submitted {
            if let Some(t) = job.submit_ms {
                let mut e = event(t, JobEventKind::Submitted);
                e.gpus = job.gpus;
                events.push(e);
                sent.submitted = true;
            }
        }
        // A job cancelled while it waited never ran; Slurm gives it its end as its start.
        let never_ran = |s: &i64| {
            state == State::Cancelled && job.end_ms == Some(*s) && !sent.starts.contains(s)
        };
        let start = job
            .start_ms
            .filter(|_| state.has_run())
            .filter(|s| !never_ran(s));
        if let Some(start) = start {
            // A later start than the run we know of: that run was preempted or requeued.
            if sent.running_since_ms.is_some_and(|r| r < start) {
                events.push(event(start, JobEventKind::Preempted));
                sent.running_since_ms = None;
            }
            // GPUs must be known to bill a run; wait for a reading that knows them.
            if !sent.starts.contains(&start) && job.gpus.is_some() {
                let mut e = event(start, JobEventKind::Started);
                e.gpus = job.gpus;
                e.allocation = job.allocation();
                events.push(e);
                sent.starts.push(start);
                sent.running_since_ms = Some(start);
            }
        }
        if matches!(state, State::Preempted | State::Requeued) && sent.running_since_ms.is_some() {
            events.push(event(job.end_ms.unwrap_or(now_ms), JobEventKind::Preempted));
            sent.running_since_ms = None;
        }
        if let Some(outcome) = state.outcome() {
            let started_unknown = start.is_some() && !sent.starts.contains(&start.unwrap_or(0));
            if started_unknown {
                // It ran, but no reading gave its GPUs: book the run without GPUs rather than
                // lose the job; the caller reports it.
                let mut e = event(start.unwrap_or(0), JobEventKind::Started);
                e.gpus = Some(0);
                events.push(e);
                sent.starts.extend(start);
            }
            let mut e = event(
                job.end_ms.or(start).or(job.submit_ms).unwrap_or(now_ms),
                JobEventKind::Finished,
            );
            e.outcome = Some(outcome);
            e.exit_code = job.exit_code;
            events.push(e);
            sent.finished = true;
            sent.running_since_ms = None;
        }
        Ok(events)
    }

    /// Forgets finished jobs no reading shows any more, so the state stays small.
    pub fn forget_finished_except(&mut self, still_shown: &std::collections::BTreeSet<String>) {
        self.jobs
            .retain(|id, s| !s.finished || still_shown.contains(id));
    }
}

/// Merges readings of the same jobs (by id), in the order given: earlier readings win where
/// both know a field, later ones fill the gaps.
pub fn merge_readings(readings: &[Vec<SlurmJob>]) -> Vec<SlurmJob> {
    let mut by_id: BTreeMap<String, SlurmJob> = BTreeMap::new();
    let mut order = Vec::new();
    for reading in readings {
        for j in reading {
            match by_id.get_mut(&j.job_id) {
                Some(existing) => existing.merge(j),
                None => {
                    order.push(j.job_id.clone());
                    by_id.insert(j.job_id.clone(), j.clone());
                }
            }
        }
    }
    let mut jobs: Vec<SlurmJob> = order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect();
    jobs.sort_by_key(|j| (j.submit_ms, numeric(&j.job_id)));
    jobs
}

fn numeric(id: &str) -> (u64, String) {
    let head: String = id.chars().take_while(char::is_ascii_digit).collect();
    (head.parse().unwrap_or(u64::MAX), id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SACCT: &str = "JobID|Account|User|Partition|Submit|Start|End|State|ExitCode|AllocTRES|NodeList|Timelimit
12|teama|alice|train|2026-12-01T08:00:00|2026-12-01T08:00:05|2026-12-01T08:01:05|COMPLETED|0:0|billing=2,cpu=2,gres/gpu=3,node=1|gpu001|01:00:00
12.batch|teama||||2026-12-01T08:00:05|2026-12-01T08:01:05|COMPLETED|0:0|cpu=2,gres/gpu=3,node=1|gpu001|
13|teamb|bob|train|2026-12-01T08:00:10|2026-12-01T08:00:12|2026-12-01T08:00:42|FAILED|2:0|billing=2,cpu=2,gres/gpu=2,node=1|gpu001|00:30:00
14|teamb|bob|train|2026-12-01T08:00:20|None|2026-12-01T08:00:30|CANCELLED by 0|0:0||None assigned|00:10:00
";

    const JOBCOMP: &str = "JobId=12 UserId=alice(1000) GroupId=alice(1000) Name=wrap JobState=COMPLETED Partition=train TimeLimit=60 StartTime=2026-12-01T08:00:05 EndTime=2026-12-01T08:01:05 NodeList=gpu001 NodeCnt=1 ProcCnt=2 WorkDir=/home/alice/my runs ReservationName= Tres=cpu=2,mem=1000M,node=1,billing=2 Account=teama QOS=normal WcKey= Cluster=test SubmitTime=2026-12-01T08:00:00 EligibleTime=2026-12-01T08:00:00 DerivedExitCode=0:0 ExitCode=0:0
JobId=13 UserId=bob(1001) GroupId=bob(1001) Name=wrap JobState=FAILED Partition=train TimeLimit=30 StartTime=2026-12-01T08:00:12 EndTime=2026-12-01T08:00:42 NodeList=gpu001 NodeCnt=1 ProcCnt=2 WorkDir=/ ReservationName= Tres=cpu=2,node=1 Account=teamb QOS=normal WcKey= Cluster=test SubmitTime=2026-12-01T08:00:10 EligibleTime=2026-12-01T08:00:10 DerivedExitCode=0:0 ExitCode=2:0
";

    const SCONTROL: &str = "JobId=12 JobName=wrap UserId=alice(1000) GroupId=alice(1000) Priority=1 Account=teama QOS=normal JobState=RUNNING Reason=None ExitCode=0:0 RunTime=00:00:10 TimeLimit=01:00:00 SubmitTime=2026-12-01T08:00:00 StartTime=2026-12-01T08:00:05 EndTime=2026-12-01T09:00:05 Partition=train NodeList=gpu001 NumNodes=1 NumCPUs=2 TRES=cpu=2,mem=1000M,node=1,billing=2 Nodes=gpu001 CPU_IDs=0-1 Mem=1000 GRES=gpu:h100:3(IDX:0-2) TresPerNode=gres:gpu:h100:3
JobId=15 JobName=wrap UserId=bob(1001) Account=teamb JobState=PENDING Reason=Resources TimeLimit=00:10:00 SubmitTime=2026-12-01T08:00:50 StartTime=2026-12-01T09:00:05 EndTime=2026-12-01T09:10:05 Partition=train NodeList=(null) TresPerNode=gres:gpu:8
";

    #[test]
    fn the_four_readings_parse() {
        let sacct = parse_sacct(SACCT, "sacct", Zone::Utc).unwrap();
        assert_eq!(sacct.len(), 3, "the .batch step is not a job");
        assert_eq!(
            (sacct[0].gpus, sacct[0].nodes.as_slice()),
            (Some(3), &["gpu001".to_owned()][..])
        );
        assert_eq!(sacct[1].exit_code, Some(2));
        assert_eq!(sacct[2].state, Some(State::Cancelled));
        assert_eq!(
            (sacct[2].start_ms, sacct[2].gpus),
            (None, None),
            "never ran"
        );
        assert_eq!(sacct[0].time_limit_s, Some(3600));
        let comp = parse_jobcomp(JOBCOMP, "jobcomp.txt", Zone::Utc).unwrap();
        assert_eq!(comp[0].gpus, None, "Tres without gres/gpu: unknown, not 0");
        assert_eq!(comp[0].user.as_deref(), Some("alice"));
        assert_eq!(comp[0].time_limit_s, Some(3600), "TimeLimit in minutes");
        assert_eq!(comp[1].state, Some(State::Failed));
        let ends: Vec<Option<Outcome>> = ["FAILED", "OUT_OF_MEMORY", "OOM", "NODE_FAIL", "TIMEOUT"]
            .iter()
            .map(|word| State::parse(word).outcome())
            .collect();
        assert_eq!(
            ends,
            [
                Outcome::Failed,
                Outcome::OutOfMemory,
                Outcome::OutOfMemory,
                Outcome::NodeFail,
                Outcome::Timeout
            ]
            .map(Some)
        );
        let sc = parse_scontrol(SCONTROL, "scontrol", Zone::Utc).unwrap();
        assert_eq!(sc[0].gpu_indices["gpu001"], vec![0, 1, 2]);
        assert_eq!(sc[0].gpus, Some(3));
        assert_eq!(sc[0].allocation().unwrap().to_string(), "gpu001:0-2");
        assert_eq!(
            (sc[1].start_ms, sc[1].gpus),
            (None, Some(8)),
            "a pending job's start is an estimate"
        );
        let sq = parse_squeue("12|teama|train|RUNNING|2026-12-01T08:00:00|2026-12-01T08:00:05|2026-12-01T09:00:05|gres:gpu:h100:3|gpu001|1:00:00|alice\n", "squeue", Zone::Utc).unwrap();
        assert_eq!(
            (sq[0].gpus, sq[0].end_ms),
            (Some(3), None),
            "a running job's end is an estimate"
        );
        assert!(parse_squeue("12|teama\n", "squeue", Zone::Utc)
            .unwrap_err()
            .message
            .contains("11"));
        assert!(parse_sacct("JobID|State\n1|RUNNING\n", "s", Zone::Utc)
            .unwrap_err()
            .message
            .contains("account"));
        let err = parse_sacct(
            &SACCT.replace("2026-12-01T08:00:12", "noon"),
            "s",
            Zone::Utc,
        )
        .unwrap_err();
        assert_eq!(err.line, 4, "the header is line 1, the step line 3");
    }

    /// A job's owner writes its name, working directory and output paths; printed as they are,
    /// ` Account=victim` in them reads like a field. None of it may decide whose job it is, how
    /// many GPUs it holds, which ones, or when it ended.
    #[test]
    fn text_a_jobs_owner_writes_cannot_stand_in_for_its_fields() {
        let scontrol = "JobId=21 JobName=x Account=victim UserId=eve(1) UserId=eve(1002) Account=teama \
            JobState=RUNNING ExitCode=0:0 TimeLimit=01:00:00 SubmitTime=2026-12-01T08:00:00 \
            StartTime=2026-12-01T08:00:05 EndTime=2026-12-01T09:00:05 Partition=train NodeList=gpu001 \
            TRES=cpu=2,node=1,billing=2,gres/gpu=2 Nodes=gpu001 CPU_IDs=0-1 Mem=0 GRES=gpu:h100:2(IDX:0-1) \
            WorkDir=/home/eve/a TresPerNode=gres:gpu:8 Nodes=gpu001 GRES=gpu:h100:2(IDX:6-7) StdOut=/x";
        let sc = parse_scontrol(scontrol, "scontrol", Zone::Utc).unwrap();
        assert_eq!(sc[0].job_id, "21");
        assert_eq!(sc[0].account, "", "two `Account=`: neither is taken");
        assert_eq!(sc[0].user, None);
        assert_eq!(sc[0].gpus, Some(2), "TRES, not the TresPerNode in the path");
        assert!(
            sc[0].gpu_indices.is_empty(),
            "gpu001 twice: {:?}",
            sc[0].gpu_indices
        );
        assert_eq!(sc[0].state, Some(State::Running));
        // Indices for a node the job does not hold are not taken either.
        let elsewhere = scontrol.replace(
            "Nodes=gpu001 GRES=gpu:h100:2(IDX:6-7)",
            "Nodes=gpu002 GRES=gpu:h100:8(IDX:0-7)",
        );
        assert!(parse_scontrol(&elsewhere, "s", Zone::Utc).unwrap()[0]
            .gpu_indices
            .is_empty());
        // Without the owner's text, the same line reads whole.
        let clean = "JobId=21 JobName=x UserId=eve(1002) Account=teama JobState=RUNNING \
            SubmitTime=2026-12-01T08:00:00 StartTime=2026-12-01T08:00:05 NodeList=gpu001 \
            TRES=cpu=2,node=1,gres/gpu=2 Nodes=gpu001 GRES=gpu:h100:2(IDX:0-1) WorkDir=/home/eve/a";
        let sc_clean = parse_scontrol(clean, "s", Zone::Utc).unwrap();
        assert_eq!(sc_clean[0].account, "teama");
        assert_eq!(sc_clean[0].gpu_indices["gpu001"], vec![0, 1]);
        // `slurm follow --squeue` reads squeue first: its fields hold no owner's text.
        let sq = parse_squeue("21|teama|train|RUNNING|2026-12-01T08:00:00|2026-12-01T08:00:05|2026-12-01T09:00:05|N/A|gpu001|1:00:00|eve\n", "squeue", Zone::Utc).unwrap();
        assert_eq!(sq[0].gpus, None, "asked per job: unknown to squeue, not 0");
        let merged = merge_readings(&[sq, sc]);
        assert_eq!(
            (merged[0].account.as_str(), merged[0].gpus),
            ("teama", Some(2))
        );
        // The completion log: a path saying `EndTime=` and `Account=` takes neither field.
        let comp = JOBCOMP.lines().next().unwrap().replace(
            "WorkDir=/home/alice/my runs",
            "WorkDir=/home/alice/x EndTime=2026-12-01T08:00:06 Account=victim StartTime=soon",
        );
        let done = parse_jobcomp(&comp, "jobcomp", Zone::Utc).unwrap();
        assert_eq!(done[0].account, "");
        assert_eq!((done[0].start_ms, done[0].end_ms), (None, None));
        assert_eq!(done[0].state, Some(State::Completed));
        // A line whose first pair is not its job id is no job: `JobId=` inside a name is not.
        assert!(parse_jobcomp("UserId=a JobId=5", "j", Zone::Utc).is_err());
    }

    #[test]
    fn readings_merged_give_each_event_once() {
        let live = parse_scontrol(SCONTROL, "scontrol", Zone::Utc).unwrap();
        let done = parse_jobcomp(JOBCOMP, "jobcomp", Zone::Utc).unwrap();
        let mut tracker = Tracker::default();
        let map = AccountMap::default();
        let mut all = Vec::new();
        // First poll: job 12 running (GPUs known from scontrol), 15 pending.
        for j in merge_readings(std::slice::from_ref(&live)) {
            all.extend(tracker.update(&j, &map, 0).unwrap());
        }
        let kinds: Vec<(String, JobEventKind)> =
            all.iter().map(|e| (e.job_id.to_string(), e.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("12".into(), JobEventKind::Submitted),
                ("12".into(), JobEventKind::Started),
                ("15".into(), JobEventKind::Submitted)
            ]
        );
        assert_eq!(all[1].gpus, Some(3));
        assert_eq!(
            all[1].allocation.as_ref().unwrap().to_string(),
            "gpu001:0-2"
        );
        // Second poll: the same again, plus the completion log: only the ends are new.
        let mut second = Vec::new();
        for j in merge_readings(&[live, done.clone()]) {
            second.extend(tracker.update(&j, &map, 0).unwrap());
        }
        let kinds: Vec<(String, JobEventKind, Option<Outcome>)> = second
            .iter()
            .map(|e| (e.job_id.to_string(), e.kind, e.outcome))
            .collect();
        assert_eq!(
            kinds,
            [
                (
                    "12".into(),
                    JobEventKind::Finished,
                    Some(Outcome::Completed)
                ),
                ("13".into(), JobEventKind::Submitted, None),
                ("13".into(), JobEventKind::Started, None),
                ("13".into(), JobEventKind::Finished, Some(Outcome::Failed)),
            ]
        );
        assert_eq!(
            second[2].gpus,
            Some(0),
            "13 ran unseen: booked without GPUs, not lost"
        );
        // Third poll: nothing new.
        for j in merge_readings(&[done]) {
            assert!(tracker.update(&j, &map, 0).unwrap().is_empty());
        }
    }

    #[test]
    fn a_job_cancelled_while_it_waits_never_started() {
        let mut tracker = Tracker::default();
        let job = SlurmJob {
            job_id: "9".into(),
            account: "teamb".into(),
            state: Some(State::Cancelled),
            submit_ms: Some(1_000),
            start_ms: Some(9_000),
            end_ms: Some(9_000),
            gpus: Some(8),
            ..SlurmJob::default()
        };
        let kinds: Vec<JobEventKind> = tracker
            .update(&job, &AccountMap::default(), 0)
            .unwrap()
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [JobEventKind::Submitted, JobEventKind::Finished]);
    }

    #[test]
    fn a_requeued_job_is_preempted_then_started_again_and_sub_accounts_are_projects() {
        let mut tracker = Tracker::default();
        let map = AccountMap {
            projects: [(
                "lattice".to_owned(),
                ("physics".to_owned(), "lattice".to_owned()),
            )]
            .into(),
        };
        let run = |start: i64, state: State| SlurmJob {
            job_id: "7".into(),
            account: "lattice".into(),
            state: Some(state),
            submit_ms: Some(0),
            start_ms: Some(start),
            end_ms: (state == State::Completed).then_some(start + 10_000),
            gpus: Some(8),
            ..SlurmJob::default()
        };
        let first = tracker
            .update(&run(1_000, State::Running), &map, 0)
            .unwrap();
        assert_eq!(first[0].account.as_str(), "physics");
        assert_eq!(
            first[0].project.as_ref().map(ProjectId::as_str),
            Some("lattice")
        );
        let again = tracker
            .update(&run(50_000, State::Running), &map, 60_000)
            .unwrap();
        let kinds: Vec<(JobEventKind, i64)> = again.iter().map(|e| (e.kind, e.time_ms)).collect();
        assert_eq!(
            kinds,
            [
                (JobEventKind::Preempted, 50_000),
                (JobEventKind::Started, 50_000)
            ]
        );
        let end = tracker
            .update(&run(50_000, State::Completed), &map, 70_000)
            .unwrap();
        assert_eq!(end.len(), 1);
        assert_eq!(
            (end[0].kind, end[0].time_ms),
            (JobEventKind::Finished, 60_000)
        );
    }

    #[test]
    fn an_account_map_reads_back_as_written_and_a_bad_line_is_named() {
        let mut map = AccountMap::default();
        map.projects
            .insert("llm-pretrain".into(), ("team-a".into(), "pretrain".into()));
        let accounts: Vec<gpuledger_model::tenant::Account> = Vec::new();
        let text = map.to_text(&accounts);
        assert_eq!(AccountMap::parse(&text, "map.txt").unwrap(), map);
        assert_eq!(
            map.resolve("llm-pretrain"),
            ("team-a".into(), Some("pretrain".into()))
        );
        let err = AccountMap::parse("# c\nteam-b team-b\nx y z w\n", "map.txt").unwrap_err();
        assert_eq!((err.origin.as_str(), err.line), ("map.txt", 3));
    }
}
