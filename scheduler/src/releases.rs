//! When running jobs give their GPUs back, in time order: at their time limit, or at their
//! kill deadline while they are being preempted. The scheduler keeps the book as jobs start,
//! end, shrink, grow and are preempted, so that a cycle's plan starts from it already sorted
//! (rebuilding and sorting it from every running job at every cycle, and copying every
//! placement, was a third of a replay on a 1,213-node cluster).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::JobId;

use crate::cluster::Placement;

/// A running job gives its GPUs back.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Release {
    pub at: UnixSeconds,
    /// GPUs it touches, a part of a GPU counted as the GPU (counted once, read by every
    /// search's free count).
    pub gpus: i64,
    /// Shared between the book and the plans made from it: a plan's copy of a release is one
    /// reference count, not a placement.
    what: Arc<Released>,
}

#[derive(Debug, PartialEq)]
struct Released {
    job: JobId,
    placement: Placement,
}

impl Release {
    pub fn new(at: UnixSeconds, job: JobId, placement: Placement) -> Self {
        let gpus = placement.0.iter().map(|s| s.mask.count_ones()).sum::<u32>();
        Release {
            at,
            gpus: i64::from(gpus),
            what: Arc::new(Released { job, placement }),
        }
    }

    pub fn job(&self) -> &JobId {
        &self.what.job
    }

    pub fn placement(&self) -> &Placement {
        &self.what.placement
    }
}

/// Every running job's release, by time and then job.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReleaseBook {
    by_time: BTreeMap<(UnixSeconds, JobId), Release>,
    /// Each job's key in `by_time`.
    at_of: HashMap<JobId, UnixSeconds>,
    /// The release times booked, in booking order, from booking number `log_from` on: a plan
    /// kept from the last cycle asks whether every job that started since it was made gives
    /// its GPUs back by its start (see `Keeping::kept_placement`).
    log: Vec<UnixSeconds>,
    log_from: u64,
}

impl ReleaseBook {
    /// Job `job` gives `placement` back at `at` (replacing what it was booked for).
    pub fn set(&mut self, job: &JobId, at: UnixSeconds, placement: &Placement) {
        self.remove(job);
        self.log.push(at);
        self.at_of.insert(job.clone(), at);
        self.by_time.insert(
            (at, job.clone()),
            Release::new(at, job.clone(), placement.clone()),
        );
    }

    /// Job `job` is no longer running.
    pub fn remove(&mut self, job: &JobId) {
        if let Some(at) = self.at_of.remove(job) {
            self.by_time.remove(&(at, job.clone()));
        }
    }

    /// Every release, by time and then job.
    pub fn releases(&self) -> Vec<Release> {
        self.by_time.values().cloned().collect()
    }

    /// When and what `job` gives back, if it is booked.
    pub fn of(&self, job: &JobId) -> Option<&Release> {
        let at = self.at_of.get(job)?;
        self.by_time.get(&(*at, job.clone()))
    }

    pub fn len(&self) -> usize {
        self.by_time.len()
    }

    /// How many bookings were made so far (the number the next one gets).
    pub fn bookings(&self) -> u64 {
        self.log_from + self.log.len() as u64
    }

    /// The release times booked from booking number `from` on; `None` where those are
    /// forgotten.
    pub fn booked_since(&self, from: u64) -> Option<&[UnixSeconds]> {
        let skip = usize::try_from(from.checked_sub(self.log_from)?).ok()?;
        self.log.get(skip..)
    }

    /// Forgets the release times booked before booking number `before`.
    pub fn forget_bookings_before(&mut self, before: u64) {
        let n = usize::try_from(before.saturating_sub(self.log_from))
            .unwrap_or(usize::MAX)
            .min(self.log.len());
        self.log.drain(..n);
        self.log_from += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Slot;
    use smallvec::smallvec;

    fn id(s: &str) -> JobId {
        JobId::new(s).unwrap()
    }

    fn on(node: usize, mask: u64) -> Placement {
        Placement(smallvec![Slot::whole(node, mask)])
    }

    #[test]
    fn releases_come_by_time_then_job_and_a_job_is_booked_once() {
        let mut book = ReleaseBook::default();
        book.set(&id("b"), 200, &on(0, 0b11));
        book.set(&id("a"), 200, &on(1, 0b1));
        book.set(&id("c"), 100, &on(2, 0b1111));
        let order = |book: &ReleaseBook| {
            book.releases()
                .iter()
                .map(|r| (r.at, r.job().to_string(), r.gpus))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(&book),
            [
                (100, "c".into(), 4),
                (200, "a".into(), 1),
                (200, "b".into(), 2)
            ]
        );
        // Preempted: its release moves earlier, and it is not booked twice.
        book.set(&id("b"), 50, &on(0, 0b1));
        assert_eq!(
            order(&book),
            [
                (50, "b".into(), 1),
                (100, "c".into(), 4),
                (200, "a".into(), 1)
            ]
        );
        book.remove(&id("c"));
        book.remove(&id("never-booked"));
        assert_eq!(book.len(), 2);
        assert!(book.of(&id("c")).is_none());
        assert_eq!(book.of(&id("b")).map(|r| r.at), Some(50));
    }

    #[test]
    fn bookings_are_numbered_and_their_times_kept_until_forgotten() {
        let mut book = ReleaseBook::default();
        assert_eq!(book.bookings(), 0);
        assert_eq!(book.booked_since(0), Some(&[][..]));
        book.set(&id("a"), 300, &on(0, 0b1));
        let mark = book.bookings();
        book.set(&id("b"), 100, &on(1, 0b1));
        book.set(&id("a"), 200, &on(0, 0b1));
        book.remove(&id("b"));
        assert_eq!(book.bookings(), 3);
        assert_eq!(book.booked_since(mark), Some(&[100, 200][..]));
        assert_eq!(book.booked_since(3), Some(&[][..]));
        book.forget_bookings_before(mark);
        assert_eq!(book.booked_since(mark), Some(&[100, 200][..]));
        // What was forgotten is not known any more.
        assert_eq!(book.booked_since(0), None);
        book.forget_bookings_before(10);
        assert_eq!((book.bookings(), book.booked_since(3)), (3, Some(&[][..])));
        book.set(&id("c"), 50, &on(2, 0b1));
        assert_eq!(book.booked_since(3), Some(&[50][..]));
    }
}
