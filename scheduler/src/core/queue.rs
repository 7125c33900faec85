//! The pending queue, kept so that a cycle does not revisit thousands of waiting jobs when
//! nothing about them changed: jobs arrive in submission order, so under FIFO the queue stays
//! in order without a check; and under a strict order (no backfill) the jobs a blocked head
//! left waiting keep their reason until something moves them, so a cycle touches only the
//! jobs it looked at last time and the ones that arrived since.

use std::cmp::Ordering;
use std::collections::VecDeque;

use gpuledger_model::JobId;

use super::ordering::queue_order;
use super::types::{PendingJob, PendingReason};

#[derive(Clone, Debug)]
pub(super) struct Queue {
    /// Boxed: a job is a few hundred bytes, and sorting or dropping started jobs from the
    /// middle of ten thousand would move them all.
    jobs: VecDeque<Box<PendingJob>>,
    /// `jobs` is known to be in scheduling order as far as anything but the priorities goes
    /// (which fair share changes at every cycle anyway).
    in_order: bool,
    /// Jobs in `settled_from..fresh_from` were left behind a blocked job by the last cycle
    /// (reason `Priority`, no planned start) and nothing moved them since; jobs from
    /// `fresh_from` on arrived after it.
    settled_from: usize,
    fresh_from: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            jobs: VecDeque::new(),
            in_order: true,
            settled_from: 0,
            fresh_from: 0,
        }
    }
}

impl Queue {
    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = &PendingJob> {
        self.jobs.iter().map(|j| &**j)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut PendingJob> {
        self.jobs.iter_mut().map(|j| &mut **j)
    }

    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut PendingJob> {
        self.jobs.get_mut(i).map(|j| &mut **j)
    }

    /// Adds a job at the back; `order` is the scheduling order (priorities as they stand).
    pub(super) fn push(
        &mut self,
        job: PendingJob,
        order: impl Fn(&PendingJob, &PendingJob) -> Ordering,
    ) {
        if self
            .jobs
            .back()
            .is_some_and(|last| order(last, &job).is_gt())
        {
            self.in_order = false;
        }
        self.jobs.push_back(Box::new(job));
    }

    pub(super) fn remove(&mut self, id: &JobId) -> Option<PendingJob> {
        let pos = self.jobs.iter().position(|p| &p.spec.id == id)?;
        if pos < self.settled_from {
            self.settled_from -= 1;
        }
        if pos < self.fresh_from {
            self.fresh_from -= 1;
        }
        self.jobs.remove(pos).map(|j| *j)
    }

    /// Puts the queue in `order` unless it is known to be in it already. With
    /// `priorities_changed` the queue is checked (a walk, cheaper than moving jobs).
    pub(super) fn arrange(
        &mut self,
        priorities_changed: bool,
        order: impl Fn(&PendingJob, &PendingJob) -> Ordering,
    ) {
        if priorities_changed {
            self.in_order = self.iter().is_sorted_by(|a, b| order(a, b).is_le());
        }
        if !self.in_order {
            self.jobs.make_contiguous().sort_by(|a, b| order(a, b));
            self.unsettle();
        }
        self.in_order = true;
    }

    /// Moves the jobs `first` picks to the front, keeping the order within each part.
    pub(super) fn move_to_front(&mut self, first: impl Fn(&PendingJob) -> bool) {
        self.jobs.make_contiguous().sort_by_key(|j| !first(j));
        self.in_order = false;
        self.unsettle();
    }

    /// Every job from `from` on waits behind a blocked job: reason `Priority`, no planned
    /// start. Only the jobs not already left so are visited.
    pub(super) fn wait_behind(&mut self, from: usize) {
        let len = self.jobs.len();
        let touched = from..self.settled_from.max(from);
        let fresh = self.fresh_from.max(from)..len;
        for i in touched.chain(fresh) {
            let job = &mut self.jobs[i];
            job.reason = PendingReason::Priority;
            job.estimated_start_s = None;
        }
    }

    /// Ends a cycle: drops the jobs that started (`started`, ascending positions) and
    /// records that the jobs from `waiting_from` on (a position before the drop, behind every
    /// job that started) were left waiting behind a blocked job (`wait_behind`).
    pub(super) fn end_cycle(&mut self, started: &[usize], waiting_from: Option<usize>) {
        let leading = started
            .iter()
            .enumerate()
            .take_while(|(k, i)| k == *i)
            .count();
        self.jobs.drain(..leading);
        if leading < started.len() {
            let mut next = leading;
            let mut pos = leading;
            self.jobs.retain(|_| {
                let drop = started.get(next) == Some(&pos);
                next += usize::from(drop);
                pos += 1;
                !drop
            });
        }
        self.fresh_from = self.jobs.len();
        self.settled_from = match waiting_from {
            Some(w) => w - started.iter().filter(|&&i| i < w).count(),
            None => self.jobs.len(),
        };
    }

    /// Forgets which jobs wait settled: positions changed.
    fn unsettle(&mut self) {
        self.settled_from = self.jobs.len();
        self.fresh_from = self.jobs.len();
    }

    /// A queue known to be in order is (by the priorities it holds), and the jobs recorded
    /// as waiting behind a blocked one really are.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.in_order {
            let mut ahead = self.jobs.iter().zip(self.jobs.iter().skip(1));
            if let Some((a, b)) = ahead.find(|(a, b)| queue_order(a, b).is_gt()) {
                return Err(format!(
                    "the queue is marked in order but job {} is ahead of job {}",
                    a.spec.id, b.spec.id
                ));
            }
        }
        if self.settled_from > self.fresh_from || self.fresh_from > self.jobs.len() {
            return Err(format!(
                "queue marks out of range: settled from {}, fresh from {}, {} jobs",
                self.settled_from,
                self.fresh_from,
                self.jobs.len()
            ));
        }
        for job in self
            .iter()
            .skip(self.settled_from)
            .take(self.fresh_from - self.settled_from)
        {
            if job.reason != PendingReason::Priority || job.estimated_start_s.is_some() {
                return Err(format!(
                    "job {} is recorded as waiting behind a blocked job but has reason {} and \
                     planned start {:?}",
                    job.spec.id, job.reason, job.estimated_start_s
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use gpuledger_model::AccountId;

    use super::super::types::{JobLimits, JobSpec};
    use super::*;

    fn job(id: u32, submit_s: i64) -> PendingJob {
        PendingJob {
            spec: JobSpec::new(
                JobId::new(id.to_string()).unwrap(),
                AccountId::new("a").unwrap(),
                1,
                3600,
                submit_s,
            ),
            tier: 1,
            priority: 0.0,
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions: 0,
            has_preempted: false,
            limits: JobLimits::default(),
        }
    }

    fn ids(q: &Queue) -> Vec<String> {
        q.iter().map(|j| j.spec.id.to_string()).collect()
    }

    #[test]
    fn a_late_arrival_out_of_submission_order_is_sorted_in() {
        let mut q = Queue::default();
        for (id, t) in [(1, 10), (2, 20), (3, 5)] {
            q.push(job(id, t), queue_order);
        }
        q.arrange(false, queue_order);
        assert_eq!(ids(&q), ["3", "1", "2"]);
        // In order as they come: nothing moves, and nothing is checked.
        q.push(job(4, 30), queue_order);
        assert!(q.in_order);
    }

    #[test]
    fn the_jobs_left_behind_a_blocked_head_stay_marked_through_starts_and_cancels() {
        let mut q = Queue::default();
        for id in 0..8 {
            q.push(job(id, i64::from(id)), queue_order);
        }
        // Jobs 0 and 2 start, 3 is blocked: 4.. wait behind it.
        q.wait_behind(4);
        q.end_cycle(&[0, 2], Some(4));
        assert_eq!(ids(&q), ["1", "3", "4", "5", "6", "7"]);
        assert_eq!((q.settled_from, q.fresh_from), (2, 6));
        q.check().unwrap();
        // A cancel ahead of the settled jobs shifts them; an arrival is fresh.
        q.remove(&JobId::new("1").unwrap());
        q.push(job(8, 8), queue_order);
        assert_eq!((q.settled_from, q.fresh_from), (1, 5));
        q.check().unwrap();
        // The next cycle blocks at the head: of the jobs behind it only the arrival is new.
        q.wait_behind(1);
        q.end_cycle(&[], Some(1));
        assert!(q
            .iter()
            .skip(1)
            .all(|j| j.reason == PendingReason::Priority));
        q.check().unwrap();
    }
}
