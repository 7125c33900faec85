//! Planned starts kept from one cycle to the next. Conservative backfill plans a start for
//! every job up to its depth, at every cycle; most cycles come when a job arrives or ends,
//! and then most plans are what they were. The last cycle's search of a job tried every time
//! before its planned start and failed. Placement only fails on a busier cluster, so those
//! times still fail now unless something came free since that a run from them overlaps
//! (`Freed`):
//!
//! - a running job ended before the time the last cycle counted on (`[its end, that time)`;
//!   under real traces' time limits nearly every job does);
//! - a plan of the last cycle made before this job's is not made again so far in this cycle
//!   (its run), or a job with a planned start started other than now on its planned GPUs
//!   (its plan's run, for the rest of this cycle and for the next);
//! - plans made in this cycle that the last had not made only take more.
//!
//! When nothing freed overlaps a run from any time before the kept start, the search begins
//! at the kept start, and the placement is looked up there at once. Otherwise the times whose
//! runs overlap something freed (`KeptStart::recheck`) are tried first; where none places the
//! job, the kept start stands as above, unless its own run overlaps something freed
//! (`KeptStart::touched`): then one search tries those times, skips the others before the
//! kept start and goes on from it. Past 16 things freed before a job it is searched as afresh.
//! Either way plans are exactly what a fresh search makes (a test drives two schedulers, one
//! keeping plans and one not, and compares every cycle), parts of GPUs among them. What
//! nothing can bound keeps nothing: a node back from a drain, a reservation changed (the
//! scheduler marks that, `Scheduler::plans_spoiled`), a preemption or a shrink within the
//! cycle.
//!
//! Looking a kept start up again means holding every plan its run overlaps on a copy of the
//! cluster: on the Philly months under conservative backfill, 4.75 M of 10.7 M such copies.
//! Where the cluster the last search saw at the kept start is provably the one a search would
//! see now, the placement is taken as it was: nothing freed overlaps its run, every job that
//! started since that plan was made gives its GPUs back by then (the release book numbers its
//! bookings), and every plan made so far in this cycle that the last cycle had not made before
//! this one stays off its run (`Keeping::kept_placement`; whole GPUs only).

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
    /// Runs of plans dropped within the cycle before their end (see `Keeping::freed`): plans
    /// made before the drop were searched with them held.
    dropped: Vec<Freed>,
}

impl KeptPlans {
    /// Empty, for a cycle at `at`, keeping the buffers: a cycle's plans are written into the
    /// ones of the cycle before last rather than into new ones (allocating and freeing
    /// buffers of every plan each cycle cost the allocator more than the copies did).
    fn cleared(mut self, at: UnixSeconds) -> Self {
        self.at = at;
        self.made.clear();
        self.index.clear();
        self.dropped.clear();
        self
    }
}

/// GPUs busy during `[from, until)` in the picture the last cycle planned with and free now
/// (a job that ended before its limit, a plan dropped or not made again): a run that overlaps
/// it may find room it did not find then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Freed {
    pub from: UnixSeconds,
    pub until: UnixSeconds,
}

impl Freed {
    /// Whether a run of `limit_s` from `start` overlaps it.
    fn overlaps_run(self, start: UnixSeconds, limit_s: u64) -> bool {
        start.saturating_add(limit_s as i64) > self.from && start < self.until
    }

    /// The starts of runs of `limit_s` that overlap it, within `[floor, before)`.
    fn starts_touched(
        self,
        limit_s: u64,
        floor: UnixSeconds,
        before: UnixSeconds,
    ) -> Option<(UnixSeconds, UnixSeconds)> {
        let lo = self
            .from
            .saturating_sub(limit_s as i64)
            .saturating_add(1)
            .max(floor);
        let hi = self.until.min(before);
        (lo < hi).then_some((lo, hi))
    }
}

/// A start the last cycle planned that a search from now can begin from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KeptStart {
    /// Its place among the last cycle's plans.
    position: usize,
    pub start: UnixSeconds,
    /// The times before `start` that what was freed since may have opened (every other time
    /// before it fails as it did), as `[from, until)`.
    pub recheck: Option<(UnixSeconds, UnixSeconds)>,
    /// Whether the cluster a run from `start` finds may differ from the last cycle's in what
    /// was freed (the placement is then looked up again).
    pub touched: bool,
}

/// What a cycle takes from the last cycle's plans and what it leaves the next.
#[derive(Debug, Default)]
pub(super) struct Keeping {
    last: KeptPlans,
    /// Per position in `last` (and one past the end), a position at or after it not made
    /// again (identically) so far in this cycle: a position not made again points to itself,
    /// and the others are followed (and shortened as they are) to the next one, so that the
    /// plans not made again before a position are visited without the ones that were.
    next_unmade: Vec<usize>,
    /// What came free since the last cycle's plans were searched (see `Freed`), besides the
    /// last cycle's plans not made again.
    freed: Vec<Freed>,
    /// GPUs came free within this cycle (a preemption or a shrink): nothing more is kept.
    spoiled: bool,
    this: KeptPlans,
}

impl Keeping {
    /// The most plans not made again that a kept start looks at (each one's run is a time
    /// range to search again); beyond, it is searched as afresh.
    const MOST_UNMADE_LOOKED_AT: usize = 16;

    /// A cycle at `now`; `last`: the last cycle's plans, `None` when nothing may be kept from
    /// them; `spare`: buffers for this cycle's (see `into_next`); `ended_early`: GPUs jobs
    /// gave back before the last cycle counted on. Nothing is kept for a cycle at an earlier
    /// time (its searches would try times the last ones did not).
    pub fn new(
        last: Option<KeptPlans>,
        spare: KeptPlans,
        now: UnixSeconds,
        ended_early: Option<Freed>,
    ) -> Self {
        let last = last.filter(|l| l.at <= now).unwrap_or_default();
        let freed = last.dropped.iter().copied().chain(ended_early).collect();
        Keeping {
            next_unmade: (0..=last.made.len()).collect(),
            freed,
            last,
            spoiled: false,
            this: spare.cleared(now),
        }
    }

    /// Where the last cycle planned `job` to start, when a search from `now` and `not_before`
    /// of a job of `min` GPUs and limit `limit_s` may begin from it: every time before it
    /// failed then, and fails now unless a run from it overlaps what was freed since (GPUs
    /// given back early, plans dropped, and the last cycle's plans before this one not made
    /// again so far: plans made in this cycle only take more).
    pub fn kept_start(
        &mut self,
        job: &JobId,
        min: u32,
        limit_s: u64,
        now: UnixSeconds,
        not_before: UnixSeconds,
    ) -> Option<KeptStart> {
        if self.spoiled {
            return None;
        }
        let &k = self.last.index.get(job)?;
        let made = &self.last.made[k];
        let same_job = made.min == min && made.limit_s == limit_s;
        if !(same_job && made.start >= now && made.start >= not_before) {
            return None;
        }
        let (start, floor) = (made.start, now.max(not_before));
        let mut recheck: Option<(UnixSeconds, UnixSeconds)> = None;
        let mut touched = false;
        let mut add = |freed: Freed| {
            touched |= freed.overlaps_run(start, limit_s);
            if let Some((lo, hi)) = freed.starts_touched(limit_s, floor, start) {
                recheck = Some(recheck.map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi))));
            }
            // Every time before the start is tried again and the start looked up: nothing
            // more to learn.
            touched && recheck == Some((floor, start))
        };
        let mut all_touched = self.freed.iter().any(|f| add(*f));
        let mut j = self.unmade_from(0);
        let mut looked_at = 0;
        while j < k && !all_touched {
            if looked_at == Self::MOST_UNMADE_LOOKED_AT {
                // Many plans before it moved: searched as afresh.
                (recheck, touched) = (Some((floor, start)), true);
                break;
            }
            let unmade = &self.last.made[j];
            all_touched = add(Freed {
                from: unmade.start,
                until: unmade.end,
            });
            looked_at += 1;
            j = self.unmade_from(j + 1);
        }
        Some(KeptStart {
            position: k,
            start,
            recheck,
            touched,
        })
    }

    /// The GPUs the last cycle planned a kept start on, where the cluster its search saw for
    /// the run is provably the one a search sees now, so that looking the placement up again
    /// would find the same: nothing freed overlaps the run (`KeptStart::touched`); every job
    /// started since that plan was made gives its GPUs back by the start (`book`'s
    /// bookings); and every plan made so far in this cycle that the last cycle had not made
    /// before it is off its run.
    pub fn kept_placement(&self, kept: &KeptStart, book: &ReleaseBook) -> Option<&Placement> {
        if self.spoiled || kept.touched {
            return None;
        }
        let (k, t) = (kept.position, kept.start);
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

    /// A plan made in this cycle; `booked`: the release book's bookings then; `kept`: what
    /// `kept_start` said of the job, if anything.
    pub fn made(
        &mut self,
        job: &JobId,
        (start, end): (UnixSeconds, UnixSeconds),
        (min, limit_s): (u32, u64),
        placement: &Placement,
        (booked, kept): (u64, Option<&KeptStart>),
    ) {
        let was = self.made_again(job, kept.map(|k| k.position), (start, end), placement);
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
            self.made_again(job, None, (now, end), placement);
        }
    }

    /// Where the last cycle made the same plan, if it did; `position`: where the last cycle's
    /// plan of `job` is, when known.
    fn made_again(
        &mut self,
        job: &JobId,
        position: Option<usize>,
        (start, end): (UnixSeconds, UnixSeconds),
        placement: &Placement,
    ) -> Option<usize> {
        let k = match position {
            Some(k) => k,
            None => *self.last.index.get(job)?,
        };
        let was = &self.last.made[k];
        let same = was.start == start && was.end == end && &was.placement == placement;
        same.then(|| {
            self.next_unmade[k] = k + 1;
            k
        })
    }

    /// The first position at or after `j` not made again so far (`last.made.len()` when none).
    fn unmade_from(&mut self, mut j: usize) -> usize {
        let next = &mut self.next_unmade;
        while next[j] != j {
            next[j] = next[next[j]];
            j = next[j];
        }
        j
    }

    /// GPUs came free in this cycle: no plan is kept from here on, nor for the next cycle.
    pub fn spoil(&mut self) {
        self.spoiled = true;
    }

    /// A plan's GPUs came free within this cycle for `[from, until)` (its job started
    /// elsewhere or at another time): later searches of this cycle and the next cycle's kept
    /// starts look again at the runs that overlap it.
    pub fn freed(&mut self, from: UnixSeconds, until: UnixSeconds) {
        let freed = Freed { from, until };
        self.freed.push(freed);
        self.this.dropped.push(freed);
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

    type Seen = (UnixSeconds, Option<(UnixSeconds, UnixSeconds)>, bool);

    /// A kept start as the tests compare it: start, times searched again, touched.
    fn kept(start: UnixSeconds, recheck: Option<(UnixSeconds, UnixSeconds)>) -> Seen {
        (start, recheck, false)
    }

    fn seen_of(
        keeping: &mut Keeping,
        job: &JobId,
        min: u32,
        limit_s: u64,
        now: UnixSeconds,
        not_before: UnixSeconds,
    ) -> Option<Seen> {
        let kept = keeping.kept_start(job, min, limit_s, now, not_before);
        kept.map(|k| (k.start, k.recheck, k.touched))
    }

    #[test]
    fn a_kept_start_is_searched_again_only_where_runs_overlap_what_was_freed() {
        let mut first = Keeping::new(None, KeptPlans::default(), 0, None);
        first.made(&id("a"), (100, 200), (2, 100), &on(0), (0, None));
        first.made(&id("b"), (200, 300), (2, 100), &on(0), (0, None));
        first.made(&id("c"), (300, 400), (2, 100), &on(1), (0, None));
        let (last, _) = first.into_next();
        let at_50 = |k: &mut Keeping, job: &str| seen_of(k, &id(job), 2, 100, 50, UnixSeconds::MIN);

        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 50, None);
        // The first plan stands. Until it is made again its GPUs are free for `[100, 200)`:
        // the second plan's job is searched again from now until its kept start.
        assert_eq!(at_50(&mut next, "a"), Some(kept(100, None)));
        assert_eq!(at_50(&mut next, "b"), Some(kept(200, Some((50, 200)))));
        next.made(&id("a"), (100, 200), (2, 100), &on(0), (0, None));
        assert_eq!(at_50(&mut next, "b"), Some(kept(200, None)));
        // Made again elsewhere: its old GPUs are free for `[200, 300)`, and runs of 100 s
        // starting in `(100, 300)` overlap that.
        next.made(&id("b"), (200, 300), (2, 100), &on(1), (0, None));
        assert_eq!(at_50(&mut next, "c"), Some(kept(300, Some((101, 300)))));

        // A job that ended early: runs overlapping `[60, 250)` are searched again, and the
        // run from the third plan's start does not overlap it. One that was counted on until
        // 350 touches the third plan's own run: its placement is looked up again.
        let ended = |from, until| Some(Freed { from, until });
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 60, ended(60, 250));
        let at_60 = |k: &mut Keeping, job: &str| seen_of(k, &id(job), 2, 100, 60, UnixSeconds::MIN);
        let touched = |start, recheck| (start, recheck, true);
        assert_eq!(at_60(&mut next, "a"), Some(touched(100, Some((60, 100)))));
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 60, ended(60, 250));
        next.made(&id("a"), (100, 200), (2, 100), &on(0), (0, None));
        next.made(&id("b"), (200, 300), (2, 100), &on(0), (0, None));
        assert_eq!(at_60(&mut next, "c"), Some(kept(300, Some((60, 250)))));
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 60, ended(60, 350));
        let c = at_60(&mut next, "c").unwrap();
        assert!(c.2);
        // A plan dropped within the cycle counts for the rest of it and for the next.
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 60, None);
        next.made(&id("a"), (100, 200), (2, 100), &on(0), (0, None));
        next.freed(100, 200);
        assert_eq!(at_60(&mut next, "b"), Some(kept(200, Some((60, 200)))));
        let (this, _) = next.into_next();
        let mut after = Keeping::new(this, KeptPlans::default(), 70, None);
        assert_eq!(
            seen_of(&mut after, &id("a"), 2, 100, 70, UnixSeconds::MIN),
            Some(touched(100, Some((70, 100))))
        );

        // Not for another size or limit, not before now or the caller's floor, not once
        // GPUs came free within the cycle.
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 50, None);
        assert_eq!(
            seen_of(&mut next, &id("a"), 4, 100, 50, UnixSeconds::MIN),
            None
        );
        assert_eq!(
            seen_of(&mut next, &id("a"), 2, 90, 50, UnixSeconds::MIN),
            None
        );
        assert_eq!(
            seen_of(&mut next, &id("a"), 2, 100, 150, UnixSeconds::MIN),
            None
        );
        assert_eq!(seen_of(&mut next, &id("a"), 2, 100, 50, 150), None);
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), 50, None);
        next.spoil();
        assert_eq!(at_50(&mut next, "a"), None);
        assert!(next.into_next().0.is_none());
        // Not for a cycle at an earlier time.
        let mut next = Keeping::new(last.clone(), KeptPlans::default(), -1, None);
        assert_eq!(
            seen_of(&mut next, &id("a"), 2, 100, -1, UnixSeconds::MIN),
            None
        );

        // A job that starts now on its planned GPUs until its planned end counts as its plan,
        // unless it spans nodes (its plan held them whole).
        let mut next = Keeping::new(last, KeptPlans::default(), 100, None);
        next.started(&id("a"), 100, 200, &on(0));
        assert_eq!(
            seen_of(&mut next, &id("b"), 2, 100, 100, UnixSeconds::MIN),
            Some(kept(200, None))
        );
        let mut wide = Keeping::new(None, KeptPlans::default(), 0, None);
        let two_nodes = Placement(smallvec![Slot::whole(0, 0b11), Slot::whole(1, 0b11)]);
        wide.made(&id("a"), (100, 200), (4, 100), &two_nodes, (0, None));
        wide.made(&id("b"), (200, 300), (2, 100), &on(0), (0, None));
        let mut next = Keeping::new(wide.into_next().0, KeptPlans::default(), 100, None);
        next.started(&id("a"), 100, 200, &two_nodes);
        assert_eq!(
            seen_of(&mut next, &id("b"), 2, 100, 100, UnixSeconds::MIN),
            Some(kept(200, Some((100, 200))))
        );
    }

    #[test]
    fn a_spare_lends_its_buffers_and_nothing_it_held() {
        let mut first = Keeping::new(None, KeptPlans::default(), 0, None);
        first.made(&id("a"), (100, 200), (2, 100), &on(0), (0, None));
        let (last, _) = first.into_next();
        // The last cycle's plans as the spare of a cycle that keeps nothing.
        let mut next = Keeping::new(None, last.clone().unwrap(), 50, None);
        assert_eq!(
            seen_of(&mut next, &id("a"), 2, 100, 50, UnixSeconds::MIN),
            None
        );
        next.made(&id("b"), (200, 300), (2, 100), &on(1), (0, None));
        let (plans, spare) = next.into_next();
        let plans = plans.unwrap();
        assert_eq!(plans.at, 50);
        assert_eq!(plans.index.keys().collect::<Vec<_>>(), [&id("b")]);
        assert_eq!(plans.made.len(), 1);
        // What this cycle kept from goes back as the next spare.
        assert!(spare.made.is_empty());
        let mut again = Keeping::new(Some(plans), last.unwrap(), 60, None);
        assert_eq!(
            seen_of(&mut again, &id("b"), 2, 100, 60, UnixSeconds::MIN),
            Some(kept(200, None))
        );
        again.made(&id("b"), (200, 300), (2, 100), &on(1), (0, None));
        let (kept, _) = again.into_next();
        assert_eq!(kept.unwrap().made.len(), 1, "the spare's old plan is gone");
    }
}
