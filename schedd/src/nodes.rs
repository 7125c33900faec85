//! Nodes in and out of service. An operator drains a node (`gpuledger scheduler drain`) and
//! resumes it; the service drains the nodes of a job whose processes outlive SIGKILL past the
//! executor's timeout (Slurm's "Kill task failed"): the job keeps its GPUs until its last
//! process is gone, and no job starts on those nodes until an operator resumes them.

use super::*;
use crate::state::Drained;

/// The longest reason an operator may give for a drain.
pub const MAX_DRAIN_REASON_CHARS: usize = 256;

/// Who drained a node when the service did it itself.
pub const DRAINED_BY_SERVICE: &str = "gpuledger";

/// One node as `sinfo` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NodeRow {
    pub node: String,
    pub gpus: u32,
    /// What jobs ask for to run here (`gpu_types`): the pool's type, or its model's key.
    #[serde(default)]
    pub gpu_type: String,
    pub allocated_gpus: u32,
    /// Free GPUs backfill holds for a waiting job's planned start (as of the last cycle).
    #[serde(default)]
    pub planned_gpus: u32,
    /// `idle`, `planned` (no job on it, but a waiting job is planned to start there: Slurm's
    /// `PLANNED`), `mixed`, `allocated`; out of service: `drained` (no job left on it) or
    /// `draining` (jobs still on it).
    pub state: String,
    /// Why it is out of service, since when and by whom.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub since_s: Option<UnixSeconds>,
    #[serde(default)]
    pub by: Option<String>,
}

/// Checks an operator's reason: some text, at most [`MAX_DRAIN_REASON_CHARS`] characters, no
/// control characters (it is shown in tables and logs).
fn check_reason(reason: &str) -> Result<()> {
    let invalid = |message: String| Error::Invalid {
        field: "reason".into(),
        message,
    };
    if reason.trim().is_empty() {
        return Err(invalid("must say why the node is drained".into()));
    }
    if reason.chars().count() > MAX_DRAIN_REASON_CHARS {
        return Err(invalid(format!(
            "at most {MAX_DRAIN_REASON_CHARS} characters"
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(invalid("no control characters".into()));
    }
    Ok(())
}

impl Service {
    /// Takes `node` out of service: no job starts on it; jobs on it run on. Draining a drained
    /// node again replaces its reason.
    pub fn drain(&self, node: &str, reason: &str, by: &str) -> Result<()> {
        check_reason(reason)?;
        let now = self.now_s();
        let mut inner = self.lock();
        let drained = Drained {
            reason: reason.to_owned(),
            since_s: now,
            by: by.to_owned(),
        };
        if !inner.drain_node(node, drained.clone()) {
            return Err(Error::UnknownNode(node.to_owned()));
        }
        tracing::warn!(node, reason, by, "node drained");
        let change = Change {
            drained: vec![(node.to_owned(), Some(drained))],
            ..Change::default()
        };
        let ticket = self.record(&mut inner, change);
        drop(inner);
        self.commit(&ticket, || format!("node {node} drained"))
    }

    /// Puts `node` back in service; false when it was not drained.
    pub fn resume(&self, node: &str) -> Result<bool> {
        let mut inner = self.lock();
        if inner.sched.cluster().node_index(node).is_none() {
            return Err(Error::UnknownNode(node.to_owned()));
        }
        let was = inner.state.drained.remove(node).is_some();
        inner.sched.set_drained(node, false);
        if !was {
            return Ok(false);
        }
        tracing::info!(node, "node resumed");
        let change = Change {
            drained: vec![(node.to_owned(), None)],
            ..Change::default()
        };
        let ticket = self.record(&mut inner, change);
        drop(inner);
        self.commit(&ticket, || format!("node {node} resumed"))?;
        Ok(true)
    }

    /// Every node with its GPUs, what is allocated and whether it is in service (as `sinfo`).
    pub fn nodes(&self) -> Vec<NodeRow> {
        let inner = self.lock();
        let cluster = inner.sched.cluster();
        let mut allocated = vec![0u32; cluster.node_count()];
        for r in inner.sched.running() {
            for slot in &r.placement.0 {
                allocated[slot.node] += slot.mask.count_ones();
            }
        }
        let mut planned = vec![0u32; cluster.node_count()];
        for (node, n) in inner.sched.planned_idle_gpus() {
            planned[node] = n;
        }
        (0..cluster.node_count())
            .map(|i| {
                let spec = cluster.node_spec(i);
                let name = spec.id.to_string();
                let drained = inner.state.drained.get(&name);
                let state = match (drained.is_some(), allocated[i]) {
                    (true, 0) => "drained",
                    (true, _) => "draining",
                    (false, 0) if planned[i] > 0 => "planned",
                    (false, 0) => "idle",
                    (false, n) if n < spec.gpus => "mixed",
                    (false, _) => "allocated",
                };
                NodeRow {
                    node: name,
                    gpus: spec.gpus,
                    gpu_type: spec.gpu_type.to_string(),
                    allocated_gpus: allocated[i],
                    planned_gpus: if drained.is_some() { 0 } else { planned[i] },
                    state: state.to_owned(),
                    reason: drained.map(|d| d.reason.clone()),
                    since_s: drained.map(|d| d.since_s),
                    by: drained.map(|d| d.by.clone()),
                }
            })
            .collect()
    }
}

impl Inner {
    /// Records `node` as drained, in the scheduler and the state; false when there is no such
    /// node.
    pub(crate) fn drain_node(&mut self, node: &str, drained: Drained) -> bool {
        if !self.sched.set_drained(node, true) {
            return false;
        }
        self.state.drained.insert(node.to_owned(), drained);
        self.unrecorded.drained.insert(node.to_owned());
        true
    }

    /// Jobs whose processes outlived SIGKILL past the executor's timeout: their nodes are
    /// drained with the reason, and the jobs keep their GPUs until the processes are gone.
    pub(crate) fn drain_for_unkillable(&mut self, now: UnixSeconds) {
        for (id, left) in self.executor.unkillable() {
            let Some(job) = self.state.jobs.get_mut(&id).map(Arc::make_mut) else {
                continue;
            };
            job.unkillable_s = Some(now);
            let nodes: Vec<String> = job
                .allocation
                .as_deref()
                .and_then(|a| a.parse::<Allocation>().ok())
                .map(|a| a.0.iter().map(|ng| ng.node.to_string()).collect())
                .unwrap_or_default();
            let reason = format!("job {id}: processes outlived SIGKILL ({left} left)");
            tracing::error!(job = %id, processes = left, nodes = ?nodes, "processes of a job would not die: its GPUs stay held and its nodes are drained");
            for node in nodes {
                let drained = Drained {
                    reason: reason.clone(),
                    since_s: now,
                    by: DRAINED_BY_SERVICE.to_owned(),
                };
                self.drain_node(&node, drained);
            }
            self.touched(&id);
        }
    }
}
