//! The jobs the aggregator knows to be waiting or running now, followed from the job events as
//! they are accepted (the stored `jobs` table only sees them after a flush). It feeds the
//! per-job series of `/metrics` (running jobs only, so the label set stays bounded: a finished
//! job leaves), the queue of the status page, and each running job's MFU so far: its own FLOP/s
//! report over its GPUs' peak where it sent one, else the tensor-activity proxy of its samples.

use std::collections::HashMap;

use gpuledger_model::allocation_feed::AllocationRow;
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::time::UnixMillis;
use gpuledger_model::GpuModel;

/// Where a job's MFU figure comes from, as `/api/v1/jobs/{id}` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MfuSource {
    Reported,
    TensorActiveProxy,
}

impl MfuSource {
    pub fn as_str(self) -> &'static str {
        match self {
            MfuSource::Reported => "reported",
            MfuSource::TensorActiveProxy => "tensor_active_proxy",
        }
    }
}

/// A job that is waiting or running.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveJob {
    pub job_id: String,
    pub account: String,
    pub project: Option<String>,
    pub partition: Option<String>,
    /// GPUs asked for while pending, held while running.
    pub gpus: u32,
    /// First submission; `None` for a job first seen starting.
    pub submitted_ms: Option<UnixMillis>,
    /// `Some` while running.
    pub started_ms: Option<UnixMillis>,
    /// A requeued job (preempted) waits again; its second wait is not a queue wait.
    pub requeued: bool,
    /// The GPUs it holds, where its start event said (the allocation feed serves them).
    pub allocation: Option<gpuledger_model::allocation::Allocation>,
    reported_flops: Option<f64>,
    peak_flops_per_gpu: Option<f64>,
    proxy_sum: f64,
    proxy_seconds: u64,
}

impl LiveJob {
    pub fn is_running(&self) -> bool {
        self.started_ms.is_some()
    }

    /// MFU so far: the job's FLOP/s report over its GPUs' peak, else the proxy's mean.
    pub fn mfu(&self) -> Option<(f64, MfuSource)> {
        if let (Some(flops), Some(peak)) = (self.reported_flops, self.peak_flops_per_gpu) {
            if self.gpus > 0 && peak > 0.0 {
                return Some((flops / (f64::from(self.gpus) * peak), MfuSource::Reported));
            }
        }
        (self.proxy_seconds > 0).then(|| {
            (
                self.proxy_sum / self.proxy_seconds as f64,
                MfuSource::TensorActiveProxy,
            )
        })
    }
}

/// What an accepted event changed, for the counters that follow it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A job started: its queue wait when this was its first start after a submission.
    Started { job: LiveJob, wait_ms: Option<i64> },
    /// A running job was preempted: its series leave `/metrics` until it runs again.
    Stopped { job: LiveJob },
    /// A job ended; `running` is the job as it ran, when it was running (its series leave).
    Finished {
        account: String,
        outcome: Option<Outcome>,
        running: Option<LiveJob>,
    },
    /// A running job's MFU source may have changed.
    Reported { job: LiveJob },
}

/// Jobs waiting or running, by id, and the ids of the latest jobs that ended.
#[derive(Debug, Default)]
pub struct LiveJobs {
    jobs: HashMap<String, LiveJob>,
    /// Ended jobs, so an event read again (a follower that re-reads its cluster) neither brings
    /// one back nor counts its end twice; the oldest are forgotten past [`ENDED_KEPT`].
    ended: std::collections::HashSet<String>,
    ended_order: std::collections::VecDeque<String>,
}

/// How many ended job ids are remembered.
pub const ENDED_KEPT: usize = 200_000;

impl LiveJobs {
    pub fn get(&self, job_id: &str) -> Option<&LiveJob> {
        self.jobs.get(job_id)
    }

    /// Every job, pending first (oldest submission first), then running (oldest start first).
    pub fn snapshot(&self) -> Vec<LiveJob> {
        let mut jobs: Vec<LiveJob> = self.jobs.values().cloned().collect();
        jobs.sort_by(|a, b| {
            (a.is_running(), a.started_ms, a.submitted_ms, &a.job_id).cmp(&(
                b.is_running(),
                b.started_ms,
                b.submitted_ms,
                &b.job_id,
            ))
        });
        jobs
    }

    /// Every GPU a running job holds by its start event's allocation, of `node` (all nodes
    /// when `None`), ordered by node, GPU and job.
    pub fn allocations(&self, node: Option<&str>) -> Vec<AllocationRow> {
        let mut rows: Vec<AllocationRow> = self
            .jobs
            .values()
            .filter(|j| j.is_running())
            .flat_map(|j| {
                j.allocation
                    .iter()
                    .flat_map(|a| a.0.iter())
                    .filter(|ng| node.is_none_or(|n| ng.node.as_str() == n))
                    .flat_map(move |ng| {
                        ng.gpus.iter().map(move |gpu| AllocationRow {
                            node: ng.node.to_string(),
                            gpu: *gpu,
                            job_id: j.job_id.clone(),
                            account: j.account.clone(),
                            project: j.project.clone(),
                            share: ng.share,
                        })
                    })
            })
            .collect();
        rows.sort_by(|a, b| (&a.node, a.gpu, &a.job_id).cmp(&(&b.node, b.gpu, &b.job_id)));
        rows
    }

    /// Pending jobs per account.
    pub fn pending_by_account(&self) -> HashMap<&str, i64> {
        let mut out: HashMap<&str, i64> = HashMap::new();
        for j in self.jobs.values().filter(|j| !j.is_running()) {
            *out.entry(j.account.as_str()).or_default() += 1;
        }
        out
    }

    fn entry(&mut self, e: &JobEvent) -> &mut LiveJob {
        self.jobs
            .entry(e.job_id.to_string())
            .or_insert_with(|| LiveJob {
                job_id: e.job_id.to_string(),
                account: e.account.to_string(),
                project: e.project.as_ref().map(ToString::to_string),
                partition: e.partition.clone(),
                gpus: e.gpus.unwrap_or(0),
                submitted_ms: None,
                started_ms: None,
                requeued: false,
                allocation: None,
                reported_flops: None,
                peak_flops_per_gpu: None,
                proxy_sum: 0.0,
                proxy_seconds: 0,
            })
    }

    /// Remembers that a job ended.
    pub fn mark_ended(&mut self, job_id: &str) {
        if self.ended.insert(job_id.to_owned()) {
            self.ended_order.push_back(job_id.to_owned());
            if self.ended_order.len() > ENDED_KEPT {
                if let Some(old) = self.ended_order.pop_front() {
                    self.ended.remove(&old);
                }
            }
        }
    }

    /// Follows one accepted event; events of a job that already ended change nothing.
    pub fn apply(&mut self, e: &JobEvent) -> Option<Change> {
        let id = e.job_id.as_str();
        if self.ended.contains(id) {
            return None;
        }
        match e.kind {
            JobEventKind::Submitted => {
                let job = self.entry(e);
                job.submitted_ms.get_or_insert(e.time_ms);
                if let Some(g) = e.gpus {
                    job.gpus = g;
                }
                None
            }
            JobEventKind::Started | JobEventKind::Resumed => {
                let job = self.entry(e);
                if job.is_running() {
                    return None;
                }
                let wait_ms = (!job.requeued)
                    .then_some(job.submitted_ms)
                    .flatten()
                    .map(|s| (e.time_ms - s).max(0));
                job.started_ms = Some(e.time_ms);
                if let Some(g) = e.gpus {
                    job.gpus = g;
                }
                job.allocation = e.allocation.clone();
                Some(Change::Started {
                    job: job.clone(),
                    wait_ms,
                })
            }
            JobEventKind::Preempted => {
                let job = self.jobs.get_mut(id)?;
                let was = job.clone();
                job.started_ms = None;
                job.requeued = true;
                job.allocation = None;
                was.is_running().then_some(Change::Stopped { job: was })
            }
            JobEventKind::Finished => {
                self.mark_ended(id);
                let job = self.jobs.remove(id);
                let account = job
                    .as_ref()
                    .map_or_else(|| e.account.to_string(), |j| j.account.clone());
                Some(Change::Finished {
                    account,
                    outcome: e.outcome,
                    running: job.filter(LiveJob::is_running),
                })
            }
            JobEventKind::FlopsReported => {
                let job = self.jobs.get_mut(id)?;
                job.reported_flops = e.achieved_flops.filter(|f| f.is_finite() && *f >= 0.0);
                job.is_running()
                    .then(|| Change::Reported { job: job.clone() })
            }
            JobEventKind::Checkpointed => None,
        }
    }

    /// Adds a batch's tensor-activity proxy sums for a job (MFU x seconds over the seconds it
    /// was measured), and notes the GPUs' peak from the model its samples name.
    pub fn add_usage(&mut self, job_id: &str, model: Option<GpuModel>, proxy: f64, seconds: u64) {
        if let Some(job) = self.jobs.get_mut(job_id) {
            job.proxy_sum += proxy;
            job.proxy_seconds += seconds;
            if let Some(m) = model {
                job.peak_flops_per_gpu = Some(m.peak_dense_bf16_flops());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{AccountId, JobId};

    fn event(t: i64, job: &str, kind: JobEventKind) -> JobEvent {
        let mut e = JobEvent::new(
            t,
            job.parse::<JobId>().unwrap(),
            "team-a".parse::<AccountId>().unwrap(),
            None,
            kind,
        );
        e.gpus = Some(8);
        e
    }

    #[test]
    fn a_job_waits_runs_is_requeued_and_finishes() {
        let mut live = LiveJobs::default();
        assert_eq!(
            live.apply(&event(1_000, "7", JobEventKind::Submitted)),
            None
        );
        assert_eq!(live.pending_by_account()["team-a"], 1);
        let Some(Change::Started { wait_ms, .. }) =
            live.apply(&event(61_000, "7", JobEventKind::Started))
        else {
            panic!("started")
        };
        assert_eq!(wait_ms, Some(60_000));
        assert!(live.pending_by_account().is_empty());
        assert!(matches!(
            live.apply(&event(70_000, "7", JobEventKind::Preempted)),
            Some(Change::Stopped { .. })
        ));
        assert_eq!(live.pending_by_account()["team-a"], 1, "requeued, waiting");
        let Some(Change::Started { wait_ms, .. }) =
            live.apply(&event(90_000, "7", JobEventKind::Resumed))
        else {
            panic!("resumed")
        };
        assert_eq!(wait_ms, None, "a requeue's wait is not a queue wait");
        assert!(matches!(
            live.apply(&event(95_000, "7", JobEventKind::Finished)),
            Some(Change::Finished {
                running: Some(_),
                ..
            })
        ));
        assert!(live.snapshot().is_empty());
    }

    #[test]
    fn events_read_again_after_the_end_change_nothing() {
        let mut live = LiveJobs::default();
        live.apply(&event(0, "3", JobEventKind::Submitted));
        live.apply(&event(1, "3", JobEventKind::Started));
        assert!(live.apply(&event(2, "3", JobEventKind::Finished)).is_some());
        for kind in [
            JobEventKind::Submitted,
            JobEventKind::Started,
            JobEventKind::Finished,
        ] {
            assert_eq!(live.apply(&event(3, "3", kind)), None);
        }
        assert!(live.snapshot().is_empty());
    }

    #[test]
    fn mfu_prefers_the_jobs_own_report() {
        let mut live = LiveJobs::default();
        live.apply(&event(0, "1", JobEventKind::Started));
        assert_eq!(live.get("1").unwrap().mfu(), None, "not measured is not 0");
        live.add_usage("1", Some(GpuModel::H100Sxm), 0.3 * 20.0, 20);
        let (mfu, source) = live.get("1").unwrap().mfu().unwrap();
        assert!((mfu - 0.3).abs() < 1e-12);
        assert_eq!(source, MfuSource::TensorActiveProxy);
        let mut report = event(5, "1", JobEventKind::FlopsReported);
        report.achieved_flops = Some(8.0 * 989e12 * 0.45);
        assert!(matches!(live.apply(&report), Some(Change::Reported { .. })));
        let (mfu, source) = live.get("1").unwrap().mfu().unwrap();
        assert!((mfu - 0.45).abs() < 1e-12);
        assert_eq!(source, MfuSource::Reported);
    }
}
