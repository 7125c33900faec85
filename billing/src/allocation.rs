//! What job events say each job held. A run goes from a `started` or `resumed` event to the
//! next `preempted` or `finished` one, or to a `resumed` event that names another allocation
//! while it runs (an elastic job resized), and holds the GPUs its allocation names. Usage by
//! allocation ([`allocation_hours`], as Slurm and Kubernetes account) and the reconciliation
//! of telemetry against allocations ([`crate::reconcile`]) both rest on these runs.

use std::collections::BTreeMap;

use gpuledger_model::job::{JobEvent, JobEventKind};
use gpuledger_model::time::{hour_start_ms, quarter_split, UnixMillis, MS_PER_HOUR};
use gpuledger_model::{Allocation, GpuModel, SHARE_UNITS_PER_GPU};

use crate::rows::MeteredHour;
use crate::{Error, Result};

/// A node's GPU model, where the cluster config knows the node.
pub type ModelOf<'a> = &'a dyn Fn(&str) -> Option<GpuModel>;

/// The node a run without an allocation is booked to.
pub const UNALLOCATED_NODE: &str = "unallocated";

/// One run of a job: from `start_ms` to `end_ms` it held `gpus` GPUs, on the nodes and GPUs of
/// `allocation` where its events named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRun {
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
    pub gpus: u32,
    pub allocation: Option<Allocation>,
}

impl HeldRun {
    /// The GPUs held on each node, where the allocation names them.
    pub fn nodes(&self) -> Option<&[gpuledger_model::NodeGpus]> {
        self.allocation
            .as_ref()
            .filter(|a| a.gpu_count() > 0)
            .map(|a| a.0.as_slice())
    }
}

/// Every run of every job in `events` (any order); a run still going is held up to
/// `until_ms` (now).
pub fn held_runs(events: &[JobEvent], until_ms: UnixMillis) -> Vec<HeldRun> {
    let mut by_job: BTreeMap<&str, Vec<&JobEvent>> = BTreeMap::new();
    for e in events {
        by_job.entry(e.job_id.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (job, mut evs) in by_job {
        evs.sort_by_key(|e| (e.time_ms, kind_order(e.kind)));
        let mut running: Option<(UnixMillis, &JobEvent)> = None;
        let close =
            |out: &mut Vec<HeldRun>, (start, e): (UnixMillis, &JobEvent), end: UnixMillis| {
                if end > start {
                    out.push(HeldRun {
                        job_id: job.to_owned(),
                        account: e.account.to_string(),
                        project: e.project.as_ref().map(ToString::to_string),
                        start_ms: start,
                        end_ms: end,
                        gpus: e.gpus.unwrap_or(0),
                        allocation: e.allocation.clone(),
                    });
                }
            };
        for e in evs {
            match e.kind {
                JobEventKind::Started | JobEventKind::Resumed => {
                    if let Some(r) = running.take() {
                        // A resize: the run so far ends, the new allocation starts now.
                        close(&mut out, r, e.time_ms);
                    }
                    running = Some((e.time_ms, e));
                }
                JobEventKind::Preempted | JobEventKind::Finished => {
                    if let Some(r) = running.take() {
                        close(&mut out, r, e.time_ms);
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = running {
            close(&mut out, r, until_ms.max(r.0));
        }
    }
    out
}

/// At the same instant a run ends before the next begins.
fn kind_order(kind: JobEventKind) -> u8 {
    match kind {
        JobEventKind::Preempted | JobEventKind::Finished => 0,
        _ => 1,
    }
}

/// Calls `f(hour, offset into the hour, ms)` for each UTC hour piece of `[from, to)`.
pub fn for_each_hour(from: UnixMillis, to: UnixMillis, mut f: impl FnMut(UnixMillis, i64, i64)) {
    let mut at = from;
    while at < to {
        let hour = hour_start_ms(at);
        let next = (hour + MS_PER_HOUR).min(to);
        f(hour, at - hour, next - at);
        at = next;
    }
}

/// account, project, job, node, GPU model, hour.
type HourKey = (String, Option<String>, String, String, String, i64);

/// Per job, node, GPU model and hour of `[from_ms, to_ms)`, the GPU-seconds its runs held
/// (with the quarters of each hour they were held in). A part of a GPU (`node:3@250m`) holds
/// its part: counted in share units and rounded down to whole GPU-seconds once per job, node
/// and hour, so a quarter of a GPU for an hour is 900 GPU-seconds.
pub fn allocation_hours(
    runs: &[HeldRun],
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    model_of: ModelOf<'_>,
    default_model: Option<GpuModel>,
) -> Result<Vec<MeteredHour>> {
    let mut out: BTreeMap<HourKey, (i64, [i64; 4])> = BTreeMap::new();
    for run in runs {
        let (s, t) = (run.start_ms.max(from_ms), run.end_ms.min(to_ms));
        if t <= s || run.gpus == 0 {
            continue;
        }
        let per_gpu = i64::from(SHARE_UNITS_PER_GPU);
        let nodes: Vec<(String, i64)> = match run.nodes() {
            Some(held) => held
                .iter()
                .map(|n| (n.node.to_string(), n.share_units() as i64))
                .collect(),
            None => vec![(UNALLOCATED_NODE.to_owned(), i64::from(run.gpus) * per_gpu)],
        };
        for (node, units) in nodes {
            let model = model_of(&node).or(default_model).ok_or_else(|| {
                Error::Input(format!(
                    "job {}: no GPU model for node `{node}` (name it in a node pool, or keep one GPU model)",
                    run.job_id
                ))
            })?;
            for_each_hour(s, t, |hour, offset, ms| {
                let held = ms / 1000;
                let key = (
                    run.account.clone(),
                    run.project.clone(),
                    run.job_id.clone(),
                    node.clone(),
                    model.key().to_owned(),
                    hour,
                );
                let (total, quarters) = out.entry(key).or_default();
                *total += units * held;
                for (q, add) in quarters.iter_mut().zip(quarter_split(offset, held)) {
                    *q += units * add;
                }
            });
        }
    }
    Ok(out
        .into_iter()
        .map(|(key, (unit_s, quarters))| (key, to_gpu_seconds(unit_s, quarters)))
        .filter(|(_, (secs, _))| *secs > 0)
        .map(
            |((account, project, job_id, node, gpu_model, hour_ms), (gpu_seconds, quarters))| {
                MeteredHour {
                    account,
                    project,
                    job_id: Some(job_id),
                    node,
                    gpu_model,
                    hour_ms,
                    gpu_seconds,
                    quarter_seconds: Some(quarters),
                    mfu_proxy_sum: 0.0,
                    mfu_seconds: 0,
                }
            },
        )
        .collect())
}

/// Share-unit-seconds of an hour and its quarters as whole GPU-seconds: the hour rounded
/// down, the quarters rounded down and the seconds left given to the quarters with the largest
/// remainders, so the quarters still sum to the hour.
fn to_gpu_seconds(unit_s: i64, quarters: [i64; 4]) -> (i64, [i64; 4]) {
    let per_gpu = i64::from(SHARE_UNITS_PER_GPU);
    let total = unit_s / per_gpu;
    let mut whole = quarters.map(|q| q / per_gpu);
    let mut order = [0usize, 1, 2, 3];
    order.sort_by_key(|&i| std::cmp::Reverse(quarters[i] % per_gpu));
    let left = total - whole.iter().sum::<i64>();
    for &i in order.iter().take(left.clamp(0, 4) as usize) {
        whole[i] += 1;
    }
    (total, whole)
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
        let runs = held_runs(&events, 10 * h);
        let rows = allocation_hours(&runs, 0, 10 * h, &h100, None).unwrap();
        let got: Vec<(&str, i64, i64, Option<[i64; 4]>)> = rows
            .iter()
            .map(|r| (r.node.as_str(), r.hour_ms, r.gpu_seconds, r.quarter_seconds))
            .collect();
        assert_eq!(
            got,
            [
                ("gpu001", 0, 1200, Some([0, 0, 0, 1200])),
                ("gpu001", h, 1200, Some([1200, 0, 0, 0])),
                ("gpu002", 0, 600, Some([0, 0, 0, 600])),
                ("gpu002", h, 600, Some([600, 0, 0, 0]))
            ]
        );
    }

    #[test]
    fn a_part_of_a_gpu_is_billed_for_its_part() {
        let h = 3_600_000;
        let events = [
            ev(
                0,
                "q",
                JobEventKind::Started,
                Some(1),
                Some("gpu001:3@250m"),
            ),
            ev(h, "q", JobEventKind::Finished, None, None),
            ev(0, "m", JobEventKind::Started, Some(1), Some("gpu001:4@1g")),
            ev(h, "m", JobEventKind::Finished, None, None),
            ev(0, "w", JobEventKind::Started, Some(1), Some("gpu001:5")),
            ev(h - 1000, "w", JobEventKind::Finished, None, None),
        ];
        let rows = allocation_hours(&held_runs(&events, 2 * h), 0, 2 * h, &h100, None).unwrap();
        let got: Vec<(&str, i64, [i64; 4])> = rows
            .iter()
            .map(|r| {
                let q = r.quarter_seconds.unwrap();
                assert_eq!(q.iter().sum::<i64>(), r.gpu_seconds);
                (r.job_id.as_deref().unwrap(), r.gpu_seconds, q)
            })
            .collect();
        assert_eq!(
            got,
            [
                // A seventh of 3,600 s is 514.29: 514, the quarters 128.57 each, one gets
                // the second left.
                ("m", 514, [129, 129, 128, 128]),
                ("q", 900, [225, 225, 225, 225]),
                ("w", 3599, [900, 900, 900, 899]),
            ]
        );
    }

    #[test]
    fn a_requeued_job_pays_for_each_run_and_an_open_run_until_now() {
        let events = [
            ev(0, "7", JobEventKind::Started, Some(8), None),
            ev(100_000, "7", JobEventKind::Preempted, None, None),
            ev(400_000, "7", JobEventKind::Started, Some(8), None),
        ];
        let runs = held_runs(&events, 500_000);
        let rows =
            allocation_hours(&runs, 0, 3_600_000, &|_| None, Some(GpuModel::H100Sxm)).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].node, UNALLOCATED_NODE);
        assert_eq!(rows[0].gpu_seconds, 8 * (100 + 100));
        let err = allocation_hours(&runs, 0, 3_600_000, &|_| None, None).unwrap_err();
        assert!(err.to_string().contains("no GPU model"), "{err}");
    }

    #[test]
    fn an_elastic_resize_ends_one_run_and_starts_the_next_on_the_new_gpus() {
        let events = [
            ev(0, "9", JobEventKind::Started, Some(2), Some("gpu001:0-1")),
            ev(
                600_000,
                "9",
                JobEventKind::Resumed,
                Some(4),
                Some("gpu001:0-3"),
            ),
            ev(900_000, "9", JobEventKind::Finished, None, None),
        ];
        let runs = held_runs(&events, 3_600_000);
        assert_eq!(runs.len(), 2);
        let rows = allocation_hours(&runs, 0, 3_600_000, &h100, None).unwrap();
        assert_eq!(rows[0].gpu_seconds, 2 * 600 + 4 * 300);
    }
}
