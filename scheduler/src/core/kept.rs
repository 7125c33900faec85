//! Planned starts kept from one cycle to the next. Conservative backfill plans a start for
//! every job up to its depth, at every cycle; most cycles come when a job arrives, and then
//! most plans are what they were. A plan is kept, and its search skipped, when the cluster it
//! was made for can only have become busier since:
//!
//! - no GPU came free earlier than the last cycle counted on: no job ended before its time
//!   limit or had its end moved earlier, no node came back from a drain and no reservation
//!   changed since (the scheduler marks that, `Scheduler::plans_spoiled`), and nothing was
//!   preempted or shrunk so far in this cycle, nor did a job with a planned start start
//!   other than now on its planned GPUs (its plan's GPUs came free);
//! - every plan the last cycle made before this job's is made again, the same GPUs at the same
//!   time, or its job started now on exactly those GPUs until the same end (new plans ahead of
//!   it only take more).
//!
//! Then no time before the kept start can place the job (placement only fails on a busier
//! cluster, and the last search tried every time before it), and the search would return the
//! kept start: the placement is looked up there again, so plans are exactly what a fresh
//! search makes (a test drives two schedulers, one keeping plans and one not, and compares
//! every cycle), parts of GPUs among them.
//!
//! Looking a kept start up again means holding every plan its run overlaps on a copy of the
//! cluster: on the Philly months under conservative backfill, 4.75 M of 10.7 M such copies.
//! Where the cluster the last search saw at the kept start is provably the one a search would
//! see now, the placement is taken as it was: every job that started since that plan was made
//! gives its GPUs back by then (the release book numbers its bookings), and every plan made so
//! far in this cycle that the last cycle had not made before this one stays off its run
//! (`Keeping::kept_placement`; whole GPUs only).

use std::collections::HashMap;

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::JobId;

use crate::cluster::Placement;
use crate::releases::ReleaseBook;

/// One planned start, as the cycle made it.
#[derive(Clone, Debug)]
struct Made {
    start: UnixSeconds,
    end: UnixSeconds,
    min: u32,
    limit_s: u64,
    placement: Placement,
    /// The release book's bookings when it was made (see `ReleaseBook::bookings`).
    booked: u64,
    /// Where the last cycle made the same plan, when it did.
    was: Option<usize>,
}

/// A cycle's planned starts in the order they were made (each one's search saw those before
/// it), including those whose jobs started later in the same cycle.
#[derive(Clone, Debug, Default)]
pub(super) struct KeptPlans {
    /// The cycle's time.
    at: UnixSeconds,
    made: Vec<Made>,
    index: HashMap<JobId, usize>,
}

impl KeptPlans {
    /// Empty, for a cycle at `at`, keeping the buffers: a cycle's plans are written into the
    /// ones of the cycle before last rather than into new ones (allocating and freeing
    /// buffers of every plan each cycle cost the allocator more than the copies did).
    fn cleared(mut self, at: UnixSeconds) -> Self {
        self.at = at;
        self.made.clear();
        self.index.clear();
        self
    }
}

/// What a cycle takes from the last cycle's plans and what it leaves the next.
#[derive(Debug, Default)]
pub(super) struct Keeping {
    last: KeptPlans,
    /// Per position in `last`, whether it was made again (identically) so far in this cycle.
    made_again: Vec<bool>,
    /// The first position in `last` not made again.
    first_missing: usize,
    /// GPUs came free within this cycle (a preemption or a shrink): nothing more is kept.
    spoiled: bool,
    this: KeptPlans,
}

impl Keeping {
    /// A cycle at `now`; `last`: the last cycle's plans, `None` when nothing may be kept from
    /// them; `spare`: buffers for this cycle's (see `into_next`). Nothing is kept for a cycle
    /// at an earlier time (its searches would try times the last ones did not).
    pub fn new(last: Option<KeptPlans>, spare: KeptPlans, now: UnixSeconds) -> Self {
        let last = last.filter(|l| l.at <= now).unwrap_or_default();
        Keeping {
            made_again: vec![false; last.made.len()],
            first_missing: 0,
            last,
            spoiled: false,
            this: spare.cleared(now),
        }
    }

    /// Where the last cycle planned `job` to start, when that still stands for a search from
    /// `now` and `not_before` of a job of `min` GPUs and limit `limit_s`.
    pub fn kept_start(
        &self,
        job: &JobId,
        min: u32,
        limit_s: u64,
        now: UnixSeconds,
        not_before: UnixSeconds,
    ) -> Option<UnixSeconds> {
        if self.spoiled {
            return None;
        }
        let &k = self.last.index.get(job)?;
        let made = &self.last.made[k];
        let same_job = made.min == min && made.limit_s == limit_s;
        let all_before_made = self.first_missing >= k;
        (same_job && all_before_made && made.start >= now && made.start >= not_before)
            .then_some(made.start)
    }

    /// The GPUs the last cycle planned `job` on at `t`, where the cluster its search saw
    /// for the run is provably the one a search sees now, so that looking the placement up
    /// again would find the same: nothing freed anything (as for any kept start); every job
    /// started since that plan was made gives its GPUs back by `t` (`book`'s bookings); and
    /// every plan made so far in this cycle that the last cycle had not made before it is off
    /// its run.
    pub fn kept_placement(
        &self,
        job: &JobId,
        t: UnixSeconds,
        book: &ReleaseBook,
    ) -> Option<&Placement> {
        if self.spoiled {
            return None;
        }
        let &k = self.last.index.get(job)?;
        let made = &self.last.made[k];
        if made.start != t || book.booked_since(made.booked)?.iter().any(|at| *at > t) {
            return None;
        }
        let unseen_overlaps = self
            .this
            .made
            .iter()
            .any(|m| m.was.is_none_or(|w| w >= k) && m.start < made.end && m.end > t);
        (!unseen_overlaps).then_some(&made.placement)
    }

    /// A plan made in this cycle; `booked`: the release book's bookings then.
    pub fn made(
        &mut self,
        job: &JobId,
        (start, end): (UnixSeconds, UnixSeconds),
        (min, limit_s): (u32, u64),
        placement: &Placement,
        booked: u64,
    ) {
        let was = self.made_again(job, start, end, placement);
        self.this.index.insert(job.clone(), self.this.made.len());
        self.this.made.push(Made {
            start,
            end,
            min,
            limit_s,
            placement: placement.clone(),
            booked,
            was,
        });
    }

    /// A job started now: where it had a plan of the last cycle for now on exactly these GPUs
    /// until `end`, the jobs planned after it find the cluster as they did. Not for a job on
    /// several nodes: its plan held those nodes whole (see `Plan::hold`), the job holds only
    /// its GPUs.
    pub fn started(
        &mut self,
        job: &JobId,
        now: UnixSeconds,
        end: UnixSeconds,
        placement: &Placement,
    ) {
        if placement.0.len() <= 1 {
            self.made_again(job, now, end, placement);
        }
    }

    /// Where the last cycle made the same plan, if it did.
    fn made_again(
        &mut self,
        job: &JobId,
        start: UnixSeconds,
        end: UnixSeconds,
        placement: &Placement,
    ) -> Option<usize> {
        let &k = self.last.index.get(job)?;
        let was = &self.last.made[k];
        let same = was.start == start && was.end == end && &was.placement == placement;
        same.then(|| {
            self.made_again[k] = true;
            while self.made_again.get(self.first_missing) == Some(&true) {
                self.first_missing += 1;
            }
            k
        })
    }

    /// GPUs came free in this cycle: no plan is kept from here on, nor for the next cycle.
    pub fn spoil(&mut self) {
        self.spoiled = true;
    }

    /// What the next cycle may keep, when nothing came free in this one, and buffers for the
    /// plans it makes.
    pub fn into_next(self) -> (Option<KeptPlans>, KeptPlans) {
        if self.spoiled {
            (None, self.this)
        } else {
            (Some(self.this), self.last)
        }
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

    fn on(node: usize) -> Placement {
        Placement(smallvec![Slot::whole(node, 0b11)])
    }

    #[test]
    fn a_plan_is_kept_only_while_every_plan_made_before_it_is_made_again() {
        let mut first = Keeping::new(None, KeptPlans::default(), 0);
        first.made(&id("a"), (100, 200), (2, 100), &on(0), 0);
        first.made(&id("b"), (200, 300), (2, 100), &on(0), 0);
        first.made(&id("c"), (300, 400), (2, 100), &on(1), 0);
        let (last, _) = first.into_next();

        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 50);
        // The first plan stands; the second only once the first is made again.
        assert_eq!(
            next.kept_start(&id("a"), 2, 100, 50, UnixSeconds::MIN),
            Some(100)
        );
        assert_eq!(
            next.kept_start(&id("b"), 2, 100, 50, UnixSeconds::MIN),
            None
        );
        next.made(&id("a"), (100, 200), (2, 100), &on(0), 0);
        assert_eq!(
            next.kept_start(&id("b"), 2, 100, 50, UnixSeconds::MIN),
            Some(200)
        );
        // Made again elsewhere: what came after it is searched afresh.
        next.made(&id("b"), (200, 300), (2, 100), &on(1), 0);
        assert_eq!(
            next.kept_start(&id("c"), 2, 100, 50, UnixSeconds::MIN),
            None
        );

        // Not for another size or limit, not before now or the caller's floor, not once
        // GPUs came free.
        let next = Keeping::new(last.clone(), KeptPlans::default(), 50);
        assert_eq!(
            next.kept_start(&id("a"), 4, 100, 50, UnixSeconds::MIN),
            None
        );
        assert_eq!(next.kept_start(&id("a"), 2, 90, 50, UnixSeconds::MIN), None);
        assert_eq!(
            next.kept_start(&id("a"), 2, 100, 150, UnixSeconds::MIN),
            None
        );
        assert_eq!(next.kept_start(&id("a"), 2, 100, 50, 150), None);
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 50);
        next.spoil();
        assert_eq!(
            next.kept_start(&id("a"), 2, 100, 50, UnixSeconds::MIN),
            None
        );
        assert!(next.into_next().0.is_none());
        // Not for a cycle at an earlier time.
        let next = Keeping::new(last.clone(), KeptPlans::default(), -1);
        assert_eq!(
            next.kept_start(&id("a"), 2, 100, -1, UnixSeconds::MIN),
            None
        );

        // A job that starts now on its planned GPUs until its planned end counts as its plan,
        // unless it spans nodes (its plan held them whole).
        let mut next = Keeping::new(last, KeptPlans::default(), 100);
        next.started(&id("a"), 100, 200, &on(0));
        assert_eq!(
            next.kept_start(&id("b"), 2, 100, 100, UnixSeconds::MIN),
            Some(200)
        );
        let mut wide = Keeping::new(None, KeptPlans::default(), 0);
        let two_nodes = Placement(smallvec![Slot::whole(0, 0b11), Slot::whole(1, 0b11)]);
        wide.made(&id("a"), (100, 200), (4, 100), &two_nodes, 0);
        wide.made(&id("b"), (200, 300), (2, 100), &on(0), 0);
        let mut next = Keeping::new(wide.into_next().0, KeptPlans::default(), 100);
        next.started(&id("a"), 100, 200, &two_nodes);
        assert_eq!(
            next.kept_start(&id("b"), 2, 100, 100, UnixSeconds::MIN),
            None
        );
    }

    #[test]
    fn a_spare_lends_its_buffers_and_nothing_it_held() {
        let mut first = Keeping::new(None, KeptPlans::default(), 0);
        first.made(&id("a"), (100, 200), (2, 100), &on(0), 0);
        let (last, _) = first.into_next();
        // The last cycle's plans as the spare of a cycle that keeps nothing.
        let mut next = Keeping::new(None, last.clone().unwrap(), 50);
        assert_eq!(
            next.kept_start(&id("a"), 2, 100, 50, UnixSeconds::MIN),
            None
        );
        next.made(&id("b"), (200, 300), (2, 100), &on(1), 0);
        let (kept, spare) = next.into_next();
        let kept = kept.unwrap();
        assert_eq!(kept.at, 50);
        assert_eq!(kept.index.keys().collect::<Vec<_>>(), [&id("b")]);
        assert_eq!(kept.made.len(), 1);
        // What this cycle kept from goes back as the next spare.
        assert!(spare.made.is_empty());
        let mut again = Keeping::new(Some(kept), last.unwrap(), 60);
        assert_eq!(
            again.kept_start(&id("b"), 2, 100, 60, UnixSeconds::MIN),
            Some(200)
        );
        again.made(&id("b"), (200, 300), (2, 100), &on(1), 0);
        let (kept, _) = again.into_next();
        assert_eq!(kept.unwrap().made.len(), 1, "the spare's old plan is gone");
    }
}
