//! The future as the backfill planner sees it: running jobs give their GPUs back when their
//! time limits run out (or at their kill deadline when they are being preempted), and pending
//! jobs hold planned starts. A job may start now only where it is free for its whole time
//! limit, so it never delays a planned start; EASY backfill plans one job, conservative
//! backfill many.

use std::borrow::Cow;

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::JobId;

use crate::cluster::{Cluster, Placement, Shape, Slot};

/// A planned start: these GPUs are spoken for during `[start, end)`.
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub job: JobId,
    pub start: UnixSeconds,
    pub end: UnixSeconds,
    pub placement: Placement,
}

impl Hold {
    fn overlaps(&self, start: UnixSeconds, end: UnixSeconds) -> bool {
        self.start < end && self.end > start
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    now: UnixSeconds,
    /// When running jobs give their GPUs back, sorted by time.
    releases: Vec<(UnixSeconds, JobId, Placement)>,
    holds: Vec<Hold>,
    /// Times other than releases when what a job may use changes (advance reservations).
    boundaries: Vec<UnixSeconds>,
}

impl Plan {
    pub fn new(
        now: UnixSeconds,
        mut releases: Vec<(UnixSeconds, JobId, Placement)>,
        mut boundaries: Vec<UnixSeconds>,
    ) -> Self {
        releases.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        boundaries.retain(|t| *t > now);
        boundaries.sort_unstable();
        boundaries.dedup();
        Plan {
            now,
            releases,
            holds: Vec::new(),
            boundaries,
        }
    }

    pub fn has_holds(&self) -> bool {
        !self.holds.is_empty()
    }

    /// A job started now and gives its GPUs back at `end`.
    pub fn started(&mut self, id: JobId, end: UnixSeconds, placement: Placement) {
        let at = self
            .releases
            .partition_point(|(t, i, _)| (*t, i) < (end, &id));
        self.releases.insert(at, (end, id, placement));
    }

    /// A running job now gives its GPUs back at `end` (it is being preempted, or shrank).
    pub fn released_at(&mut self, id: &JobId, end: UnixSeconds, placement: Placement) {
        self.releases.retain(|(_, i, _)| i != id);
        self.started(id.clone(), end, placement);
    }

    /// The cluster as job `job` starting now and running `limit_s` would find it: what is free
    /// now, less what other jobs' planned starts within its run hold.
    pub fn window_now<'c>(
        &self,
        cluster: &'c Cluster,
        limit_s: u64,
        job: &JobId,
    ) -> Cow<'c, Cluster> {
        let end = self.now.saturating_add(limit_s as i64);
        let mut window = Cow::Borrowed(cluster);
        for hold in self
            .holds
            .iter()
            .filter(|h| &h.job != job && h.overlaps(self.now, end))
        {
            window.to_mut().hold(&hold.placement);
        }
        window
    }

    /// The earliest time at or after now when `find` places the job on the cluster as it will
    /// be for its whole run, and the placement. `find` gets that cluster and the start time.
    pub fn earliest(
        &self,
        cluster: &Cluster,
        gpus: u32,
        shape: &Shape,
        limit_s: u64,
        mut find: impl FnMut(&Cluster, UnixSeconds) -> Option<Placement>,
    ) -> Option<(UnixSeconds, Placement)> {
        let mut future = cluster.clone();
        let mut next_release = 0;
        let mut candidates: Vec<UnixSeconds> = std::iter::once(self.now)
            .chain(self.releases.iter().map(|r| r.0.max(self.now)))
            .chain(self.holds.iter().map(|h| h.end))
            .chain(self.boundaries.iter().copied())
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for t in candidates {
            while let Some((at, _, placement)) = self.releases.get(next_release) {
                if *at > t {
                    break;
                }
                future.release(placement);
                next_release += 1;
            }
            // Releases only add GPUs and holds only take some: a cluster with too few free
            // GPUs before the holds cannot place the job.
            if !future.may_fit(gpus, shape) {
                continue;
            }
            let end = t.saturating_add(limit_s as i64);
            let mut window = Cow::Borrowed(&future);
            for hold in self.holds.iter().filter(|h| h.overlaps(t, end)) {
                window.to_mut().hold(&hold.placement);
            }
            if let Some(p) = find(&window, t) {
                return Some((t, p));
            }
        }
        None
    }

    /// Forgets `job`'s planned start (it started).
    pub fn forget(&mut self, job: &JobId) {
        self.holds.retain(|h| &h.job != job);
    }

    /// Plans `job`'s start. A multi-node placement holds its nodes whole, so that the
    /// whole-node search finds them again at the planned time.
    pub fn hold(
        &mut self,
        job: JobId,
        start: UnixSeconds,
        end: UnixSeconds,
        placement: Placement,
        cluster: &Cluster,
    ) {
        let placement = if placement.0.len() > 1 {
            Placement(
                placement
                    .0
                    .iter()
                    .map(|s| Slot::whole(s.node, full_node(cluster, s.node)))
                    .collect(),
            )
        } else {
            placement
        };
        self.holds.push(Hold {
            job,
            start,
            end,
            placement,
        });
    }
}

fn full_node(cluster: &Cluster, node: usize) -> u64 {
    let gpus = cluster.node_spec(node).gpus;
    if gpus >= 64 {
        u64::MAX
    } else {
        (1u64 << gpus) - 1
    }
}
