//! Usage from allocations rather than telemetry: each run of a job (from its `started` or
//! `resumed` event to its `preempted` or `finished` one) holds its GPUs for its whole length,
//! as Slurm and Kubernetes account for it. This is what a cluster bills when its nodes run no
//! gpuledger exporter, or when its policy is to bill what was allocated, not what was sampled.
//! Runs are cut at UTC hours and split by node where the allocation names the GPUs.

use std::collections::BTreeMap;

use gpuledger_model::job::{JobEvent, JobEventKind};
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

use crate::query::BillableHour;

/// A node's GPU model, where the cluster config knows the node.
pub type ModelOf<'a> = &'a dyn Fn(&str) -> Option<GpuModel>;

/// Why a run could not be priced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("job {job_id}: {message}")]
pub struct AllocationError {
    pub job_id: String,
    pub message: String,
}

/// The node a run without an allocation is booked to.
pub const UNALLOCATED_NODE: &str = "unallocated";

/// account, project, job, node, GPU model, hour.
type HourKey = (String, Option<String>, String, String, String, i64);

struct Run<'a> {
    start_ms: UnixMillis,
    gpus: u32,
    event: &'a JobEvent,
}

/// Per job, node, GPU model and hour of `[from_ms, to_ms)`, the GPU-seconds its runs held;
/// a run still going is counted up to `until_ms` (now). `events` in any order.
pub fn allocation_hours(
    events: &[JobEvent],
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    until_ms: UnixMillis,
    model_of: ModelOf<'_>,
    default_model: Option<GpuModel>,
) -> Result<Vec<BillableHour>, AllocationError> {
    let mut by_job: BTreeMap<&str, Vec<&JobEvent>> = BTreeMap::new();
    for e in events {
        by_job.entry(e.job_id.as_str()).or_default().push(e);
    }
    let mut out: BTreeMap<HourKey, i64> = BTreeMap::new();
    let end = to_ms.min(until_ms);
    for (job, mut evs) in by_job {
        evs.sort_by_key(|e| (e.time_ms, kind_order(e.kind)));
        let mut running: Option<Run> = None;
        let mut runs: Vec<(Run, UnixMillis)> = Vec::new();
        for e in evs {
            match e.kind {
                JobEventKind::Started | JobEventKind::Resumed if running.is_none() => {
                    running = Some(Run {
                        start_ms: e.time_ms,
                        gpus: e.gpus.unwrap_or(0),
                        event: e,
                    });
                }
                JobEventKind::Preempted | JobEventKind::Finished => {
                    if let Some(r) = running.take() {
                        runs.push((r, e.time_ms));
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = running {
            runs.push((r, until_ms));
        }
        for (run, stop_ms) in runs {
            let (s, t) = (run.start_ms.max(from_ms), stop_ms.min(end));
            if t <= s || run.gpus == 0 {
                continue;
            }
            let e = run.event;
            let nodes: Vec<(String, u32)> = match &e.allocation {
                Some(a) if a.gpu_count() > 0 => {
                    a.0.iter()
                        .map(|n| (n.node.to_string(), n.gpus.len() as u32))
                        .collect()
                }
                _ => vec![(UNALLOCATED_NODE.to_owned(), run.gpus)],
            };
            for (node, gpus) in nodes {
                let model = model_of(&node).or(default_model).ok_or_else(|| AllocationError {
                    job_id: job.to_owned(),
                    message: format!("no GPU model for node `{node}` (name it in a node pool, or keep one GPU model)"),
                })?;
                let mut at = s;
                while at < t {
                    let hour = at - at.rem_euclid(3_600_000);
                    let next = (hour + 3_600_000).min(t);
                    let secs = i64::from(gpus) * ((next - at) / 1000);
                    let key = (
                        e.account.to_string(),
                        e.project.as_ref().map(ToString::to_string),
                        job.to_owned(),
                        node.clone(),
                        model.key().to_owned(),
                        hour,
                    );
                    *out.entry(key).or_default() += secs;
                    at = next;
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .filter(|(_, secs)| *secs > 0)
        .map(
            |((account, project, job_id, node, gpu_model, hour_ms), gpu_seconds)| BillableHour {
                account,
                project,
                job_id: Some(job_id),
                node,
                gpu_model,
                hour_ms,
                gpu_seconds,
                mfu_proxy_sum: 0.0,
                mfu_seconds: 0,
            },
        )
        .collect())
}

/// At the same instant a run ends before the next begins.
fn kind_order(kind: JobEventKind) -> u8 {
    match kind {
        JobEventKind::Preempted | JobEventKind::Finished => 0,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{AccountId, JobId};

    fn ev(
        t: i64,
        job: &str,
        kind: JobEventKind,
        gpus: Option<u32>,
        allocation: Option<&str>,
    ) -> JobEvent {
        let mut e = JobEvent::new(
            t,
            job.parse::<JobId>().unwrap(),
            "team-a".parse::<AccountId>().unwrap(),
            None,
            kind,
        );
        e.gpus = gpus;
        e.allocation = allocation.map(|a| a.parse().unwrap());
        e
    }

    fn h100(_: &str) -> Option<GpuModel> {
        Some(GpuModel::H100Sxm)
    }

    #[test]
    fn runs_are_cut_at_hours_and_split_by_node() {
        let h = 3_600_000;
        let events = [
            ev(
                h - 600_000,
                "1",
                JobEventKind::Started,
                Some(3),
                Some("gpu001:0-1;gpu002:0"),
            ),
            ev(h + 600_000, "1", JobEventKind::Finished, None, None),
        ];
        let rows = allocation_hours(&events, 0, 10 * h, 10 * h, &h100, None).unwrap();
        let got: Vec<(&str, i64, i64)> = rows
            .iter()
            .map(|r| (r.node.as_str(), r.hour_ms, r.gpu_seconds))
            .collect();
        assert_eq!(
            got,
            [
                ("gpu001", 0, 1200),
                ("gpu001", h, 1200),
                ("gpu002", 0, 600),
                ("gpu002", h, 600)
            ]
        );
        assert_eq!(
            rows.iter().map(|r| r.gpu_seconds).sum::<i64>(),
            3 * 1200,
            "3 GPUs x 20 min"
        );
    }

    #[test]
    fn a_requeued_job_pays_for_each_run_and_an_open_run_until_now() {
        let events = [
            ev(0, "7", JobEventKind::Started, Some(8), None),
            ev(100_000, "7", JobEventKind::Preempted, None, None),
            ev(400_000, "7", JobEventKind::Started, Some(8), None),
        ];
        let rows = allocation_hours(
            &events,
            0,
            3_600_000,
            500_000,
            &|_| None,
            Some(GpuModel::H100Sxm),
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].node, UNALLOCATED_NODE);
        assert_eq!(rows[0].gpu_seconds, 8 * (100 + 100));
        let err = allocation_hours(&events, 0, 3_600_000, 500_000, &|_| None, None).unwrap_err();
        assert!(err.message.contains("no GPU model"), "{err}");
    }
}
