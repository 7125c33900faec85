//! The pending queue, kept so that a cycle does not revisit thousands of waiting jobs when
//! nothing about them changed: jobs arrive in submission order, so under FIFO the queue stays
//! in order without a check; under a strict order (no backfill) the jobs a blocked head left
//! waiting keep their reason until something moves them, so a cycle touches only the jobs it
//! looked at last time and the ones that arrived since; and what a cycle reads of every job
//! (its order, size, limit, account, reason) sits beside it in the queue's own array, so that
//! under fair share, where every priority changes at every cycle, ordering and walking ten
//! thousand jobs reads one array instead of ten thousand boxes.

use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering as MemoryOrder};

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::JobId;

use super::ordering::{id_key, id_order, queue_order};
use super::quota_scopes::NO_PROJECT;
use super::types::{PendingJob, PendingReason};

/// What a cycle reads of a waiting job at every cycle, copied out of it when it enters the
/// queue. `reason` and `estimated_start_s` are the job's own, mirrored: they are set here
/// and written through to the job only when they change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Hot {
    /// Its multifactor priority at the last cycle (0 under FIFO).
    pub(super) priority: f64,
    pub(super) submit_s: UnixSeconds,
    pub(super) time_limit_s: u64,
    /// Its smallest size, in GPUs and in share units.
    pub(super) min: u32,
    pub(super) units: u64,
    pub(super) tier: u32,
    /// Its partition's index (see `JobLimits`).
    pub(super) partition: u32,
    pub(super) account: usize,
    /// Its project's index in its account's list (see `JobLimits`).
    pub(super) project: u32,
    pub(super) quota_priority: f64,
    /// Its shape's number (see `JobLimits`): `DEFAULT_SHAPE` when it asks for no particular
    /// GPUs per node, node count, model or share.
    pub(super) shape: u32,
    /// Since when it has waited for GPUs without its quota holding it (the job's own
    /// `gpu_wait_from`, mirrored: set by [`Queue::set_reason`]).
    gpu_wait_from: MaybeTime,
    /// Its id as a number in id order, where it is short enough ([`id_key`]), in two halves
    /// (a `u128` would align every slot to 16 bytes); `[0, 0]` where it is not.
    id_key: [u64; 2],
    reason: PendingReason,
    estimated_start_s: MaybeTime,
    /// `LIMITED`, `CLAIMED`, `HAS_PREEMPTED` and `CHANGED`, in one byte: the slot is a
    /// multiple of 8 bytes, and a fourth `bool` would have made it 8 bytes longer.
    flags: u8,
}

/// Any of its quotas needs a look before it starts.
const LIMITED: u8 = 1;
/// It preempted and waits for its victims (it holds a claim): set by the cycle, not the job's
/// own.
const CLAIMED: u8 = 2;
/// It preempted during this wait (the job's own `has_preempted`, mirrored): it does not
/// preempt again before it starts.
const HAS_PREEMPTED: u8 = 4;
/// Its reason, planned start or wait for GPUs changed, or it entered the queue, since the
/// last [`Queue::take_changed`]: what a caller mirroring the waiting jobs copies.
const CHANGED: u8 = 8;

impl Hot {
    fn of(job: &PendingJob) -> Hot {
        let (spec, limits) = (&job.spec, &job.limits);
        let limited = limits.running_limited
            || limits.gpus_limited
            || limits.gpu_hours_limited
            || limits.storage_limited;
        Hot {
            priority: 0.0,
            submit_s: spec.submit_s,
            time_limit_s: spec.time_limit_s,
            min: spec.min_size(),
            units: spec.share_units_of(spec.min_size()),
            tier: job.tier,
            partition: limits.partition,
            account: limits.account,
            project: limits.project,
            quota_priority: limits.quota_priority,
            shape: limits.shape,
            gpu_wait_from: MaybeTime::of(job.gpu_wait_from),
            id_key: key_halves(&spec.id),
            reason: job.reason,
            estimated_start_s: MaybeTime::of(job.estimated_start_s),
            flags: 0,
        }
        .with(LIMITED, limited)
        .with(HAS_PREEMPTED, job.has_preempted)
        .with(CHANGED, true)
    }

    fn with(mut self, flag: u8, on: bool) -> Hot {
        self.set(flag, on);
        self
    }

    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Any of its quotas needs a look before it starts.
    pub(super) fn limited(&self) -> bool {
        self.has(LIMITED)
    }

    /// It preempted and waits for its victims (it holds a claim).
    pub(super) fn claimed(&self) -> bool {
        self.has(CLAIMED)
    }

    /// It preempted during this wait: it does not preempt again before it starts.
    pub(super) fn has_preempted(&self) -> bool {
        self.has(HAS_PREEMPTED)
    }

    pub(super) fn reason(&self) -> PendingReason {
        self.reason
    }

    pub(super) fn estimated_start_s(&self) -> Option<UnixSeconds> {
        self.estimated_start_s.get()
    }

    /// Whether the relief lifts it at `now`: it has waited `relief_after` seconds for GPUs
    /// (`None`: the relief is off).
    pub(super) fn relieved(&self, now: UnixSeconds, relief_after: Option<i64>) -> bool {
        let waited = |after| {
            self.gpu_wait_from
                .get()
                .is_some_and(|from| now - from >= after)
        };
        relief_after.is_some_and(waited)
    }
}

/// [`id_key`] as the queue keeps it, in two halves; `[0, 0]` for an id too long for one.
fn key_halves(id: &JobId) -> [u64; 2] {
    id_key(id).map_or([0, 0], |k| [(k >> 64) as u64, k as u64])
}

/// A time that may be absent, in 8 bytes where an `Option` takes 16: the queue's copy of
/// every job is walked at every cycle, and its size is what a walk of a deep queue costs.
/// `UnixSeconds::MIN` stands for none; that time itself is kept as the second after it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct MaybeTime(UnixSeconds);

impl MaybeTime {
    const NONE: MaybeTime = MaybeTime(UnixSeconds::MIN);

    fn of(t: Option<UnixSeconds>) -> MaybeTime {
        t.map_or(Self::NONE, |t| MaybeTime(t.max(UnixSeconds::MIN + 1)))
    }

    fn get(self) -> Option<UnixSeconds> {
        (self != Self::NONE).then_some(self.0)
    }
}

// What a walk of the queue reads per job (an `Option` for each time made it 128 bytes).
const _: () = assert!(size_of::<Slot>() <= 112);

#[derive(Clone, Debug)]
struct Slot {
    hot: Hot,
    /// Boxed: a job is a few hundred bytes, and sorting or dropping started jobs from the
    /// middle of ten thousand would move them all.
    job: Box<PendingJob>,
}

impl Slot {
    /// Sets its reason at a cycle at `now` (and when it began to wait for GPUs), writing
    /// through to the job what changed: returns how many times the job was written.
    fn set_reason(&mut self, reason: PendingReason, now: UnixSeconds) -> u64 {
        let wait = match self.hot.gpu_wait_from.get() {
            None if reason.waits_for_gpus() => Some(now),
            Some(_) if !reason.waits_for_gpus() && reason != PendingReason::None => None,
            unchanged => unchanged,
        };
        let mut written = 0;
        if self.hot.gpu_wait_from != MaybeTime::of(wait) {
            self.hot.gpu_wait_from = MaybeTime::of(wait);
            self.job.gpu_wait_from = wait;
            written += 1;
        }
        if self.hot.reason != reason {
            self.hot.reason = reason;
            self.job.reason = reason;
            written += 1;
        }
        if written > 0 {
            self.hot.set(CHANGED, true);
        }
        written
    }

    /// As [`Slot::set_reason`], its planned start.
    fn set_estimated_start(&mut self, at: Option<UnixSeconds>) -> u64 {
        if self.hot.estimated_start_s == MaybeTime::of(at) {
            return 0;
        }
        self.hot.estimated_start_s = MaybeTime::of(at);
        self.job.estimated_start_s = at;
        self.hot.set(CHANGED, true);
        1
    }

    /// Waits for `reason` with no planned start, as the walk leaves a job it did nothing
    /// else with (in that order).
    fn wait_for(&mut self, reason: PendingReason, now: UnixSeconds) -> u64 {
        self.set_estimated_start(None) + self.set_reason(reason, now)
    }
}

/// A waiting job's box, counted as opened each time it is read ([`Queue::opened`]).
#[derive(Clone, Copy)]
pub(super) struct JobRef<'a> {
    job: &'a PendingJob,
    opened: &'a Opened,
}

impl<'a> JobRef<'a> {
    /// The record, not counted: for checks that only debug builds make.
    #[cfg(debug_assertions)]
    pub(super) fn uncounted(&self) -> &'a PendingJob {
        self.job
    }
}

impl Deref for JobRef<'_> {
    type Target = PendingJob;

    fn deref(&self) -> &PendingJob {
        self.opened.add(1);
        self.job
    }
}

/// A count that reads can add to: relaxed, as it only measures (a racy add loses a count,
/// never a job).
#[derive(Debug, Default)]
struct Opened(AtomicU64);

impl Opened {
    fn add(&self, n: u64) {
        let count = self.0.load(MemoryOrder::Relaxed);
        self.0.store(count.saturating_add(n), MemoryOrder::Relaxed);
    }
}

impl Clone for Opened {
    fn clone(&self) -> Self {
        Opened(AtomicU64::new(self.0.load(MemoryOrder::Relaxed)))
    }
}

/// Scheduling order: tier, priority and submission from the queue's own copy; the job ids
/// (in the boxes) only break ties.
fn slot_order(a: &Slot, b: &Slot) -> Ordering {
    queue_order(&a.hot, &b.hot).then_with(|| match (a.hot.id_key, b.hot.id_key) {
        (x, y) if x != [0, 0] && y != [0, 0] => x.cmp(&y),
        _ => id_order(&a.job.spec.id, &b.job.spec.id),
    })
}

/// At most this many jobs out of place are merged in where they belong (`Queue::arrange`).
const FEW_DESCENTS: usize = 16;

/// Below this many jobs on either side of an overlap, they are moved in one by one.
const FEW_TO_MOVE: usize = 8;

/// At most this many stretches are rotated into place before the rest of an overlap is sorted.
const FEW_ROTATIONS: usize = 4;

/// Puts `jobs[..end]` in order where `jobs[..mid]` and `jobs[mid..end]` each are: only the
/// stretch where they overlap moves (the jobs ahead of the second part's first job, and
/// behind the first part's last one, are in place already).
fn merge_adjacent(jobs: &mut VecDeque<Slot>, mid: usize, end: usize) {
    if mid == 0 || mid >= end {
        return;
    }
    let lo = count_leading(jobs, 0..mid, |s| slot_order(s, &jobs[mid]).is_lt());
    let hi = mid + count_leading(jobs, mid..end, |s| slot_order(s, &jobs[mid - 1]).is_lt());
    let (ahead, behind) = (mid - lo, hi - mid);
    if behind <= ahead.min(FEW_TO_MOVE) {
        // Each of the second part's few into its place among the first's, in turn.
        let mut from = lo;
        for i in mid..hi {
            let at = from + count_leading(jobs, from..i, |s| slot_order(s, &jobs[i]).is_lt());
            move_job(jobs, i, at);
            from = at + 1;
        }
    } else if ahead <= FEW_TO_MOVE {
        // Each of the first part's few into its place among the second's, last first.
        let mut to = hi;
        for i in (lo..mid).rev() {
            let at = i + count_leading(jobs, i..to, |s| slot_order(s, &jobs[i]).is_le());
            move_job(jobs, i, at - 1);
            to = at - 1;
        }
    } else {
        merge_by_rotations(jobs, lo, mid, hi);
    }
}

/// Puts `jobs[a..end]` in order where `jobs[a..m]` and `jobs[m..end]` each are, by rotating
/// each stretch of the second part to the front of what is left of the first: when an
/// account's jobs moved past another's as a block, one rotation moves them without a
/// comparison each. Stretches that keep alternating are sorted after `FEW_ROTATIONS`.
fn merge_by_rotations(jobs: &mut VecDeque<Slot>, mut a: usize, mut m: usize, end: usize) {
    for _ in 0..FEW_ROTATIONS {
        // The first part's jobs ahead of the second's first are in place.
        a += count_leading(jobs, a..m, |s| slot_order(s, &jobs[m]).is_lt());
        if a == m {
            return;
        }
        // The second part's jobs ahead of the first part's next go before it.
        let n = count_leading(jobs, m..end, |s| slot_order(s, &jobs[a]).is_lt());
        jobs.make_contiguous()[a..m + n].rotate_left(m - a);
        a += n;
        m += n;
        if m == end {
            return;
        }
    }
    jobs.make_contiguous()[a..end].sort_by(slot_order);
}

/// How many of the jobs in `range`, from its start, `pred` holds for (it holds for a prefix).
fn count_leading(
    jobs: &VecDeque<Slot>,
    range: std::ops::Range<usize>,
    pred: impl Fn(&Slot) -> bool,
) -> usize {
    let (mut lo, mut hi) = (range.start, range.end);
    while lo < hi {
        let m = lo + (hi - lo) / 2;
        if pred(&jobs[m]) {
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    lo - range.start
}

/// Moves the job at `from` to `to`, the jobs between shifting by one: past them, or out at
/// one end of the queue and in at the other where that moves fewer.
fn move_job(jobs: &mut VecDeque<Slot>, from: usize, to: usize) {
    let last = jobs.len() - 1;
    let between = from.abs_diff(to);
    let by_the_ends = from.min(last - from) + to.min(last - to);
    if between <= by_the_ends {
        let slots = jobs.make_contiguous();
        if from > to {
            slots[to..=from].rotate_right(1);
        } else {
            slots[from..=to].rotate_left(1);
        }
    } else if let Some(slot) = jobs.remove(from) {
        jobs.insert(to, slot);
    }
}

/// After this many jobs in a row from one run, a merge gallops (`Queue::merge_two`).
const GALLOP_AFTER: usize = 7;

/// How many of `run`'s first positions `pred` holds for (it holds for the first, and for a
/// prefix): found by steps doubling in length, then halving.
fn galloped(run: &[u32], pred: impl Fn(u32) -> bool) -> usize {
    let (mut known, mut step) = (1, 1);
    while known + step <= run.len() && pred(run[known + step - 1]) {
        known += step;
        step *= 2;
    }
    let end = (known + step - 1).min(run.len());
    known + run[known..end].partition_point(|&i| pred(i))
}

#[derive(Clone, Debug)]
pub(super) struct Queue {
    jobs: VecDeque<Slot>,
    /// How many times a job's box was read or written through the queue ([`Queue::opened`]).
    opened: Opened,
    /// `jobs` is known to be in scheduling order as far as anything but the priorities goes
    /// (which fair share changes at every cycle anyway).
    in_order: bool,
    /// Jobs in `settled_from..fresh_from` were left behind a blocked job by the last cycle
    /// (reason `Priority`, no planned start) and nothing moved them since; jobs from
    /// `fresh_from` on arrived after it.
    settled_from: usize,
    fresh_from: usize,
    /// Where `set_priorities` found a job ahead of one it should follow (the later one's
    /// position), ascending: all of them where there are at most `FEW_DESCENTS`.
    descents_at: Vec<usize>,
    /// Share units waiting, by account index.
    waiting_units: Vec<u64>,
    /// Jobs waiting, by account index and by account and project index.
    waiting_jobs: Vec<u32>,
    waiting_per_project: HashMap<(usize, u32), u32>,
    /// The time of the cycle setting reasons ([`Queue::begin_cycle`]).
    cycle_s: UnixSeconds,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            jobs: VecDeque::new(),
            opened: Opened::default(),
            in_order: true,
            settled_from: 0,
            fresh_from: 0,
            descents_at: Vec::new(),
            waiting_units: Vec::new(),
            waiting_jobs: Vec::new(),
            waiting_per_project: HashMap::new(),
            cycle_s: 0,
        }
    }
}

impl Queue {
    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = &PendingJob> {
        self.jobs.iter().map(|s| &*s.job)
    }

    /// What a cycle reads of each job, in queue order.
    pub(super) fn hot(&self) -> impl ExactSizeIterator<Item = &Hot> {
        self.jobs.iter().map(|s| &s.hot)
    }

    /// The job at `i` with what the queue keeps of it.
    pub(super) fn at(&self, i: usize) -> Option<(&Hot, JobRef<'_>)> {
        self.jobs.get(i).map(|s| (&s.hot, self.job_ref(s)))
    }

    fn job_ref<'a>(&'a self, slot: &'a Slot) -> JobRef<'a> {
        JobRef {
            job: &slot.job,
            opened: &self.opened,
        }
    }

    /// The job at `i`, to change what only the job holds. Its reason and planned start are
    /// set through [`Queue::set_reason`] and [`Queue::set_estimated_start`].
    pub(super) fn job_mut(&mut self, i: usize) -> Option<&mut PendingJob> {
        self.opened.add(1);
        self.jobs.get_mut(i).map(|s| &mut *s.job)
    }

    pub(super) fn set_reason(&mut self, i: usize, reason: PendingReason) {
        if let Some(slot) = self.jobs.get_mut(i) {
            self.opened.add(slot.set_reason(reason, self.cycle_s));
        }
    }

    pub(super) fn set_estimated_start(&mut self, i: usize, at: Option<UnixSeconds>) {
        if let Some(slot) = self.jobs.get_mut(i) {
            self.opened.add(slot.set_estimated_start(at));
        }
    }

    /// Sets `reason`, and no planned start, on the jobs from `from` that `quiet` says the cycle
    /// does nothing else with, up to the first it does not or `until`: returns that position.
    /// The same as [`Queue::set_estimated_start`] and [`Queue::set_reason`] job by job, in one
    /// pass over the queue's own array: on a deep queue nearly every job is one of these, and
    /// the cycle's walk of the rest costs a few branches each.
    pub(super) fn wait_quietly(
        &mut self,
        from: usize,
        until: usize,
        reason: PendingReason,
        quiet: impl Fn(&Hot) -> bool,
    ) -> usize {
        let until = until.min(self.jobs.len());
        let slots = &mut self.jobs.make_contiguous()[..until];
        let Some(stretch) = slots.get_mut(from..) else {
            return from;
        };
        let mut opened = 0;
        let mut done = stretch.len();
        for (k, slot) in stretch.iter_mut().enumerate() {
            if !quiet(&slot.hot) {
                done = k;
                break;
            }
            opened += slot.wait_for(reason, self.cycle_s);
        }
        self.opened.add(opened);
        from + done
    }

    /// Hands `each` the jobs whose reason, planned start or wait for GPUs changed, or that
    /// entered the queue, since the last call, and forgets that they did: a caller that
    /// mirrors the waiting jobs (the live scheduler's job table) copies those alone instead
    /// of every job at every cycle. One pass over the queue's own array; only those boxes
    /// are opened.
    pub(super) fn take_changed(&mut self, mut each: impl FnMut(&PendingJob)) {
        for slot in self.jobs.iter_mut().filter(|s| s.hot.has(CHANGED)) {
            slot.hot.set(CHANGED, false);
            self.opened.add(1);
            each(&slot.job);
        }
    }

    /// How many times, since the queue was made, a job's box was read or written through
    /// it (an id breaking a tie in the order aside): what a cycle costs beyond the queue's
    /// own array, where a deep queue's time goes (each box is a cache miss), counted rather
    /// than timed so that a test can hold it.
    pub(super) fn opened(&self) -> u64 {
        self.opened.0.load(MemoryOrder::Relaxed)
    }

    /// Share units waiting in each account (by index; accounts past the end have none).
    pub(super) fn waiting_units(&self) -> &[u64] {
        &self.waiting_units
    }

    /// The time of the cycle that sets reasons from now on.
    pub(super) fn begin_cycle(&mut self, now: UnixSeconds) {
        self.cycle_s = now;
    }

    /// Adds a job at the back.
    pub(super) fn push(&mut self, job: PendingJob) {
        let slot = Slot {
            hot: Hot::of(&job),
            job: Box::new(job),
        };
        if self
            .jobs
            .back()
            .is_some_and(|last| slot_order(last, &slot).is_gt())
        {
            self.in_order = false;
        }
        let account = slot.hot.account;
        if self.waiting_units.len() <= account {
            self.waiting_units.resize(account + 1, 0);
            self.waiting_jobs.resize(account + 1, 0);
        }
        self.waiting_units[account] += slot.hot.units;
        self.waiting_jobs[account] += 1;
        if slot.hot.project != NO_PROJECT {
            *self
                .waiting_per_project
                .entry((account, slot.hot.project))
                .or_default() += 1;
        }
        self.jobs.push_back(slot);
    }

    fn forget_units(&mut self, hot: &Hot) {
        if let Some(units) = self.waiting_units.get_mut(hot.account) {
            *units -= hot.units;
        }
        if let Some(jobs) = self.waiting_jobs.get_mut(hot.account) {
            *jobs -= 1;
        }
        if let Some(jobs) = self
            .waiting_per_project
            .get_mut(&(hot.account, hot.project))
        {
            *jobs -= 1;
        }
    }

    /// Jobs waiting of the account at `account`, of its project at `project` where given.
    pub(super) fn waiting_jobs(&self, account: usize, project: Option<u32>) -> u32 {
        match project {
            None => self.waiting_jobs.get(account).copied().unwrap_or(0),
            Some(p) => self
                .waiting_per_project
                .get(&(account, p))
                .copied()
                .unwrap_or(0),
        }
    }

    pub(super) fn remove(&mut self, id: &JobId) -> Option<PendingJob> {
        // Found by the queue's copy of the id where it has one: a cancel of one of 40,000
        // waiting jobs (a user's jobs cancelled one by one) opens no other job's box.
        let key = key_halves(id);
        let pos = self
            .jobs
            .iter()
            .position(|s| s.hot.id_key == key && (key != [0, 0] || &s.job.spec.id == id))?;
        if pos < self.settled_from {
            self.settled_from -= 1;
        }
        if pos < self.fresh_from {
            self.fresh_from -= 1;
        }
        let slot = self.jobs.remove(pos)?;
        self.forget_units(&slot.hot);
        Some(*slot.job)
    }

    /// Sets every job's priority from what the queue keeps of it, and returns how many jobs
    /// now come before one they should follow (`arrange` sorts unless none does). One walk of
    /// the queue for both: on a deep queue a cycle's time is mostly walks of it.
    pub(super) fn set_priorities(&mut self, priority: impl Fn(&Hot) -> f64) -> usize {
        let slots = self.jobs.make_contiguous();
        let mut descents = 0;
        self.descents_at.clear();
        for i in 0..slots.len() {
            slots[i].hot.priority = priority(&slots[i].hot);
            if i > 0 && slot_order(&slots[i - 1], &slots[i]).is_gt() {
                descents += 1;
                if descents <= FEW_DESCENTS {
                    self.descents_at.push(i);
                }
            }
        }
        descents
    }

    /// Puts the queue in scheduling order unless it is known to be in it already: `descents`,
    /// from `set_priorities`, where the priorities were set again.
    pub(super) fn arrange(&mut self, descents: Option<usize>) {
        if let Some(descents) = descents {
            self.in_order = descents == 0;
        }
        if !self.in_order {
            // A few jobs out of place (an arrival or two, a job whose priority moved on its
            // own): the ordered stretches between them are merged, each only where it overlaps
            // the next, rather than every job going through a sort. Many: accounts changed
            // places (or tied ones parted), and the sort falls back to partitioning ten
            // thousand jobs; their accounts' runs merge cheaper.
            let few = descents.is_some_and(|d| d <= FEW_DESCENTS);
            let many = descents.unwrap_or(0) * 64 > self.jobs.len();
            if few {
                let ends = self.descents_at.iter().skip(1).copied();
                for (mid, end) in self.descents_at.iter().zip(ends.chain([self.jobs.len()])) {
                    merge_adjacent(&mut self.jobs, *mid, end);
                }
            } else if !(many && self.merge_accounts()) {
                self.jobs.make_contiguous().sort_by(slot_order);
            }
            self.unsettle();
        }
        self.in_order = true;
    }

    /// Puts the queue in order by merging runs of each account's jobs: false (nothing moved)
    /// when there are too many runs for that to pay. Fair share moves all of an account's
    /// jobs together (one factor per account, and age grows alike for all), so when accounts
    /// change places each account's jobs are still a few ordered runs (the jobs that arrived
    /// since fall in among them), while the queue as a whole is thousands of short ones.
    fn merge_accounts(&mut self) -> bool {
        // Compared through one slice (indexing the ring buffer costs a wrap test each time).
        let slots: &[Slot] = self.jobs.make_contiguous();
        let accounts = slots.iter().map(|s| s.hot.account + 1).max().unwrap_or(0);
        let mut runs: Vec<Vec<u32>> = Vec::new();
        // Per account, its last job and the run it is in.
        let mut open: Vec<Option<(&Slot, usize)>> = vec![None; accounts];
        let most = (slots.len() / 16).max(accounts);
        for (i, slot) in slots.iter().enumerate() {
            let run = match open[slot.hot.account] {
                Some((prev, run)) if slot_order(prev, slot).is_le() => run,
                _ => {
                    if runs.len() == most {
                        return false;
                    }
                    runs.push(Vec::new());
                    runs.len() - 1
                }
            };
            open[slot.hot.account] = Some((slot, run));
            runs[run].push(i as u32);
        }
        while runs.len() > 1 {
            let mut merged = Vec::with_capacity(runs.len().div_ceil(2));
            let mut pairs = runs.into_iter();
            while let Some(a) = pairs.next() {
                merged.push(match pairs.next() {
                    Some(b) => Self::merge_two(slots, &a, &b),
                    None => a,
                });
            }
            runs = merged;
        }
        let Some(order) = runs.pop() else {
            return true;
        };
        // In place, one cycle of the permutation at a time (`order[p]`: where the job that
        // goes to `p` is now): jobs already in place are not moved.
        let slots = self.jobs.make_contiguous();
        let mut placed = vec![false; slots.len()];
        for p in 0..slots.len() {
            let mut at = p;
            while !placed[at] {
                placed[at] = true;
                let from = order[at] as usize;
                if from == p {
                    break;
                }
                slots.swap(at, from);
                at = from;
            }
        }
        true
    }

    /// Two ordered runs of positions in `slots` as one. Where one run's jobs keep coming
    /// first (accounts far apart take turns in long stretches), how many do is found by
    /// galloping (as timsort does) rather than one comparison each.
    fn merge_two(slots: &[Slot], a: &[u32], b: &[u32]) -> Vec<u32> {
        let before = |x: u32, y: u32| slot_order(&slots[x as usize], &slots[y as usize]).is_lt();
        let mut out = Vec::with_capacity(a.len() + b.len());
        let (mut x, mut y) = (0, 0);
        // Which run gave the last jobs, and how many in a row.
        let mut streak = (false, 0usize);
        while x < a.len() && y < b.len() {
            let from_b = before(b[y], a[x]);
            streak = (from_b, if streak.0 == from_b { streak.1 + 1 } else { 1 });
            if streak.1 < GALLOP_AFTER {
                if from_b {
                    out.push(b[y]);
                    y += 1;
                } else {
                    out.push(a[x]);
                    x += 1;
                }
                continue;
            }
            streak.1 = 0;
            if from_b {
                let n = galloped(&b[y..], |j| before(j, a[x]));
                out.extend_from_slice(&b[y..y + n]);
                y += n;
            } else {
                let n = galloped(&a[x..], |i| !before(b[y], i));
                out.extend_from_slice(&a[x..x + n]);
                x += n;
            }
        }
        out.extend_from_slice(&a[x..]);
        out.extend_from_slice(&b[y..]);
        out
    }

    /// Moves the jobs that hold a claim to the front, keeping the order within each part.
    pub(super) fn move_claimed_to_front(&mut self) {
        self.jobs
            .make_contiguous()
            .sort_by_key(|s| !s.hot.claimed());
        self.in_order = false;
        self.unsettle();
    }

    /// Records whether the job at `i` holds a claim.
    pub(super) fn set_claimed(&mut self, i: usize, claimed: bool) {
        if let Some(slot) = self.jobs.get_mut(i) {
            slot.hot.set(CLAIMED, claimed);
        }
    }

    /// Records whether the job at `i` preempted during this wait, as the job says (it was
    /// set on the job, whose record the cycle had open).
    pub(super) fn set_has_preempted(&mut self, i: usize, has_preempted: bool) {
        if let Some(slot) = self.jobs.get_mut(i) {
            slot.hot.set(HAS_PREEMPTED, has_preempted);
        }
    }

    /// Every job from `from` on waits behind a blocked job: reason `Priority`, no planned
    /// start. Only the jobs not already left so are visited.
    pub(super) fn wait_behind(&mut self, from: usize) {
        let len = self.jobs.len();
        let touched = from..self.settled_from.max(from);
        let fresh = self.fresh_from.max(from)..len;
        for i in touched.chain(fresh) {
            if let Some(slot) = self.jobs.get_mut(i) {
                self.opened
                    .add(slot.wait_for(PendingReason::Priority, self.cycle_s));
            }
        }
    }

    /// Ends a cycle: drops the jobs that started (`started`, ascending positions) and
    /// records that the jobs from `waiting_from` on (a position before the drop, behind every
    /// job that started) were left waiting behind a blocked job (`wait_behind`).
    pub(super) fn end_cycle(&mut self, started: &[usize], waiting_from: Option<usize>) {
        for &i in started {
            if let Some(hot) = self.jobs.get(i).map(|s| s.hot) {
                self.forget_units(&hot);
            }
        }
        let leading = started
            .iter()
            .enumerate()
            .take_while(|(k, i)| k == *i)
            .count();
        self.jobs.drain(..leading);
        let rest = &started[leading..];
        // Taken out one by one, each moves the jobs on the shorter side of it; one walk moves
        // every job after the first. A cycle usually starts a few jobs of a deep queue.
        let len = self.jobs.len();
        let one_by_one: usize = rest
            .iter()
            .map(|i| (i - leading).min(len - (i - leading)))
            .sum();
        let walk = rest.first().map_or(0, |i| len - (i - leading));
        if one_by_one <= walk {
            // The last first, so the positions before it stay as they are.
            for &i in rest.iter().rev() {
                self.jobs.remove(i - leading);
            }
        } else {
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

    /// A queue known to be in order is (by the priorities it holds); the jobs recorded as
    /// waiting behind a blocked one really are; what the queue keeps of each job is the
    /// job's; the units waiting per account add up.
    pub(super) fn check(&self, claimed: impl Fn(&JobId) -> bool) -> Result<(), String> {
        if self.in_order {
            let mut ahead = self.jobs.iter().zip(self.jobs.iter().skip(1));
            if let Some((a, b)) = ahead.find(|(a, b)| slot_order(a, b).is_gt()) {
                return Err(format!(
                    "the queue is marked in order but job {} is ahead of job {}",
                    a.job.spec.id, b.job.spec.id
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
        let mut units = vec![0u64; self.waiting_units.len()];
        let mut jobs = vec![0u32; self.waiting_jobs.len()];
        let mut per_project: HashMap<(usize, u32), u32> = HashMap::new();
        for slot in &self.jobs {
            if let Some(n) = jobs.get_mut(slot.hot.account) {
                *n += 1;
            }
            if slot.hot.project != NO_PROJECT {
                *per_project
                    .entry((slot.hot.account, slot.hot.project))
                    .or_default() += 1;
            }
            let copy = Hot {
                priority: slot.hot.priority,
                ..Hot::of(&slot.job)
            }
            .with(CLAIMED, claimed(&slot.job.spec.id))
            .with(CHANGED, slot.hot.has(CHANGED));
            if copy != slot.hot {
                return Err(format!(
                    "the queue's copy of job {} is {:?}, the job says {copy:?}",
                    slot.job.spec.id, slot.hot
                ));
            }
            match units.get_mut(slot.hot.account) {
                Some(u) => *u += slot.hot.units,
                None => return Err(format!("job {}'s account has no count", slot.job.spec.id)),
            }
        }
        if units != self.waiting_units {
            return Err(format!(
                "units waiting per account: counted {units:?}, kept {:?}",
                self.waiting_units
            ));
        }
        if jobs != self.waiting_jobs {
            return Err(format!(
                "jobs waiting per account: counted {jobs:?}, kept {:?}",
                self.waiting_jobs
            ));
        }
        let kept: HashMap<(usize, u32), u32> = self
            .waiting_per_project
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (*k, *n))
            .collect();
        if per_project != kept {
            return Err(format!(
                "jobs waiting per project: counted {per_project:?}, kept {kept:?}"
            ));
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
            reason: PendingReason::None,
            estimated_start_s: None,
            preemptions: 0,
            has_preempted: false,
            gpu_wait_from: Some(submit_s),
            limits: JobLimits::default(),
        }
    }

    fn ids(q: &Queue) -> Vec<String> {
        q.iter().map(|j| j.spec.id.to_string()).collect()
    }

    proptest::proptest! {
        /// However the arrivals since the last cycle land (merged in alone, or with old jobs
        /// that moved too), the queue ends in the order a sort of every job gives.
        #[test]
        fn arrivals_are_put_in_the_order_a_whole_sort_gives(
            old in proptest::collection::vec((0u8..6, 0i64..50), 0..40),
            new in proptest::collection::vec((0u8..6, 0i64..50), 0..5),
            shuffle in proptest::bool::ANY,
        ) {
            let priority_of = |hot: &Hot| f64::from((hot.submit_s * 7 % 6) as u8);
            let mut q = Queue::default();
            let mut n = 0u32;
            for (_, t) in &old {
                q.push(job(n, *t));
                n += 1;
            }
            let d = q.set_priorities(priority_of);
            q.arrange(Some(d));
            q.end_cycle(&[], None);
            for (p, t) in &new {
                q.push(job(n, *t + i64::from(*p)));
                n += 1;
            }
            // Either only the arrivals are out of place, or the old jobs move too.
            let d = if shuffle {
                q.set_priorities(|hot| priority_of(hot) + (hot.submit_s % 3) as f64)
            } else {
                q.set_priorities(priority_of)
            };
            let mut want: Vec<(f64, i64, u32)> = q
                .iter()
                .map(|j| {
                    let id: u32 = j.spec.id.as_str().parse().unwrap();
                    let hot = Hot { priority: 0.0, ..Hot::of(j) };
                    let p = if shuffle {
                        priority_of(&hot) + (j.spec.submit_s % 3) as f64
                    } else {
                        priority_of(&hot)
                    };
                    (p, j.spec.submit_s, id)
                })
                .collect();
            want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            q.arrange(Some(d));
            let want: Vec<String> = want.iter().map(|w| w.2.to_string()).collect();
            proptest::prop_assert_eq!(ids(&q), want);
            q.check(|_| false).map_err(proptest::test_runner::TestCaseError::fail)?;
        }
    }

    proptest::proptest! {
        /// A few jobs out of place, alone or in stretches (their priorities moved, up or down,
        /// by a little or past most of the queue): merged in where they belong, the queue ends
        /// in the order a sort of every job gives.
        #[test]
        fn a_few_jobs_out_of_place_are_merged_in_the_order_a_sort_gives(
            base in proptest::collection::vec(0i64..400, 1..200),
            moved in proptest::collection::vec((0usize..200, 1usize..40, -400i64..400), 0..6),
        ) {
            // A job's priority is looked up by its number, kept as its project.
            let mut q = Queue::default();
            for n in 0..base.len() {
                let mut j = job(n as u32, 0);
                j.limits.project = n as u32;
                q.push(j);
            }
            let d = q.set_priorities(|hot| base[hot.project as usize] as f64);
            q.arrange(Some(d));
            // Stretches of neighbours in the ordered queue move by as much.
            let mut moved_by = vec![0i64; base.len()];
            let order: Vec<u32> = q.hot().map(|h| h.project).collect();
            for (at, run, by) in &moved {
                for n in order.iter().skip(at % order.len()).take(*run) {
                    moved_by[*n as usize] = *by;
                }
            }
            let now = |n: usize| (base[n] + moved_by[n]) as f64;
            let d = q.set_priorities(|hot| now(hot.project as usize));
            q.arrange(Some(d));
            let mut want: Vec<usize> = (0..base.len()).collect();
            want.sort_by(|a, b| now(*b).total_cmp(&now(*a)).then(a.cmp(b)));
            let got: Vec<usize> = q.hot().map(|h| h.project as usize).collect();
            proptest::prop_assert_eq!(got, want);
            q.check(|_| false).map_err(proptest::test_runner::TestCaseError::fail)?;
        }
    }

    proptest::proptest! {
        /// Two accounts' ordered runs merged, whether they take turns job by job or in long
        /// stretches (where the merge gallops): the order a sort of both gives.
        #[test]
        fn two_runs_merge_in_the_order_a_sort_gives(
            jobs in proptest::collection::vec((proptest::bool::ANY, 0i64..6, 1usize..40), 0..30),
        ) {
            // Stretches of jobs of one run, of one priority each.
            let mut q = Queue::default();
            let mut n = 0u32;
            for (second, priority, stretch) in &jobs {
                for _ in 0..*stretch {
                    let mut j = job(n, 0);
                    j.limits.account = usize::from(*second);
                    j.limits.project = u32::try_from(*priority).unwrap();
                    q.push(j);
                    n += 1;
                }
            }
            q.set_priorities(|hot| f64::from(hot.project));
            let slots = q.jobs.make_contiguous();
            let run = |account: usize| {
                let mut run: Vec<u32> = (0..slots.len() as u32)
                    .filter(|i| slots[*i as usize].hot.account == account)
                    .collect();
                run.sort_by(|x, y| slot_order(&slots[*x as usize], &slots[*y as usize]));
                run
            };
            let got = Queue::merge_two(slots, &run(0), &run(1));
            let mut want: Vec<u32> = (0..slots.len() as u32).collect();
            want.sort_by(|x, y| slot_order(&slots[*x as usize], &slots[*y as usize]));
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_time_kept_in_eight_bytes_is_the_time_or_none() {
        for t in [None, Some(0), Some(-5), Some(UnixSeconds::MAX)] {
            assert_eq!(MaybeTime::of(t).get(), t);
        }
        assert_eq!(
            MaybeTime::of(Some(UnixSeconds::MIN)).get(),
            Some(UnixSeconds::MIN + 1)
        );
    }

    #[test]
    fn a_late_arrival_out_of_submission_order_is_sorted_in() {
        let mut q = Queue::default();
        for (id, t) in [(1, 10), (2, 20), (3, 5)] {
            q.push(job(id, t));
        }
        q.arrange(None);
        assert_eq!(ids(&q), ["3", "1", "2"]);
        // In order as they come: nothing moves, and nothing is checked.
        q.push(job(4, 30));
        assert!(q.in_order);
    }

    #[test]
    fn the_jobs_left_behind_a_blocked_head_stay_marked_through_starts_and_cancels() {
        let mut q = Queue::default();
        for id in 0..8 {
            q.push(job(id, i64::from(id)));
        }
        // Jobs 0 and 2 start, 3 is blocked: 4.. wait behind it.
        q.wait_behind(4);
        q.end_cycle(&[0, 2], Some(4));
        assert_eq!(ids(&q), ["1", "3", "4", "5", "6", "7"]);
        assert_eq!((q.settled_from, q.fresh_from), (2, 6));
        q.check(|_| false).unwrap();
        // A cancel ahead of the settled jobs shifts them; an arrival is fresh.
        q.remove(&JobId::new("1").unwrap());
        q.push(job(8, 8));
        assert_eq!((q.settled_from, q.fresh_from), (1, 5));
        q.check(|_| false).unwrap();
        // The next cycle blocks at the head: of the jobs behind it only the arrival is new.
        q.wait_behind(1);
        q.end_cycle(&[], Some(1));
        assert!(q
            .iter()
            .skip(1)
            .all(|j| j.reason == PendingReason::Priority));
        q.check(|_| false).unwrap();
    }

    #[test]
    fn the_wait_for_gpus_starts_again_after_a_quota_held_the_job() {
        let mut q = Queue::default();
        q.push(job(1, 5));
        let mut requeued = job(2, 5);
        requeued.gpu_wait_from = Some(40);
        q.push(requeued);
        let from = |q: &Queue, i: usize| q.at(i).map(|(h, _)| h.gpu_wait_from.get());
        assert_eq!((from(&q, 0), from(&q, 1)), (Some(Some(5)), Some(Some(40))));
        q.begin_cycle(50);
        q.set_reason(0, PendingReason::Priority);
        q.set_reason(1, PendingReason::AssocMaxJobsLimit);
        assert_eq!((from(&q, 0), from(&q, 1)), (Some(Some(5)), Some(None)));
        assert_eq!(
            q.iter().nth(1).unwrap().gpu_wait_from,
            None,
            "written through"
        );
        q.check(|_| false).unwrap();
        q.begin_cycle(90);
        for i in 0..2 {
            q.set_reason(i, PendingReason::Resources);
        }
        assert_eq!((from(&q, 0), from(&q, 1)), (Some(Some(5)), Some(Some(90))));
        q.begin_cycle(120);
        q.set_reason(1, PendingReason::ReqNodeNotAvail);
        q.set_reason(1, PendingReason::None);
        assert_eq!(from(&q, 1), Some(Some(90)));
    }

    #[test]
    fn a_job_is_removed_by_its_id_short_or_long() {
        let mut q = Queue::default();
        let long = |n: u32| format!("a-long-account-name.{n}");
        for n in 0..6 {
            let mut j = job(n, i64::from(n));
            if n % 2 == 1 {
                j.spec.id = JobId::new(long(n)).unwrap();
            }
            q.push(j);
        }
        for gone in [JobId::new("2").unwrap(), JobId::new(long(3)).unwrap()] {
            let removed = q.remove(&gone).map(|j| j.spec.id);
            assert_eq!(removed.as_ref(), Some(&gone));
            assert!(q.remove(&gone).is_none(), "{gone} only once");
        }
        assert!(q.remove(&JobId::new(long(2)).unwrap()).is_none());
        assert_eq!(ids(&q), ["0".to_owned(), long(1), "4".to_owned(), long(5)]);
        q.check(|_| false).unwrap();
    }

    #[test]
    fn the_changes_taken_are_the_jobs_that_arrived_or_whose_reason_start_or_wait_moved() {
        let mut q = Queue::default();
        for id in 0..6 {
            q.push(job(id, 5));
        }
        let taken = |q: &mut Queue| {
            let mut ids = Vec::new();
            q.take_changed(|j| ids.push(j.spec.id.to_string()));
            ids
        };
        assert_eq!(taken(&mut q), ["0", "1", "2", "3", "4", "5"], "arrivals");
        assert!(taken(&mut q).is_empty(), "each once");
        q.begin_cycle(50);
        // Unchanged: job 0's reason, job 1's planned start (none), job 2's stretch.
        q.set_reason(0, PendingReason::None);
        q.set_estimated_start(1, None);
        assert!(taken(&mut q).is_empty());
        q.set_reason(2, PendingReason::Priority);
        q.set_estimated_start(3, Some(900));
        q.set_estimated_start(3, Some(901));
        // Job 4's reason stays `None` but it no longer waits for GPUs.
        q.set_reason(4, PendingReason::AssocMaxJobsLimit);
        q.set_reason(4, PendingReason::None);
        assert_eq!(taken(&mut q), ["2", "3", "4"]);
        q.wait_quietly(0, 6, PendingReason::Priority, |_| true);
        assert_eq!(
            taken(&mut q),
            ["0", "1", "3", "4", "5"],
            "2 waited so already"
        );
        q.wait_behind(0);
        assert!(taken(&mut q).is_empty());
        q.check(|_| false).unwrap();
    }

    #[test]
    fn the_queues_copy_follows_each_job_and_counts_what_each_account_waits_for() {
        let mut q = Queue::default();
        for id in 0..4 {
            let mut j = job(id, i64::from(id));
            j.limits.account = usize::try_from(id % 2).unwrap();
            j.spec.gpus = 2;
            q.push(j);
        }
        let unit = u64::from(gpuledger_model::SHARE_UNITS_PER_GPU);
        assert_eq!(q.waiting_units(), [4 * unit, 4 * unit]);
        q.set_reason(1, PendingReason::Resources);
        q.set_estimated_start(1, Some(99));
        let (hot, job) = q.at(1).unwrap();
        assert_eq!(
            (hot.reason(), hot.estimated_start_s()),
            (job.reason, job.estimated_start_s)
        );
        assert_eq!(job.estimated_start_s, Some(99));
        q.end_cycle(&[0], None);
        q.remove(&JobId::new("3").unwrap());
        assert_eq!(q.waiting_units(), [2 * unit, 2 * unit]);
        q.check(|_| false).unwrap();
        // A job changed behind the queue's back is caught.
        q.job_mut(0).unwrap().reason = PendingReason::AssocGrpGres;
        assert!(q.check(|_| false).unwrap_err().contains("copy of job 1"));
    }

    proptest::proptest! {
        /// Cycle after cycle of accounts changing places, jobs arriving and starting, and some
        /// jobs whose priority moves on its own (their account's jobs no longer in order among
        /// themselves, so the accounts cannot be merged): the queue ends in the order a sort of
        /// it gives.
        #[test]
        fn arranging_gives_the_order_a_sort_gives(
            cycles in proptest::collection::vec(
                (
                    proptest::collection::vec(0u32..4, 4),
                    proptest::collection::vec((0usize..4, 0i64..50, 1u32..3, 0u8..8), 0..30),
                    (0usize..20, 1usize..5, 0usize..3),
                ),
                1..12,
            )
        ) {
            let mut q = Queue::default();
            let mut next = 0u32;
            for (cycle, (factors, arrivals, (starts, every, first))) in cycles.into_iter().enumerate() {
                for (account, submit, tier, own) in arrivals {
                    let mut j = job(next, submit);
                    j.limits.account = account;
                    j.limits.quota_priority = if own == 0 { 1.0 } else { 0.0 };
                    j.tier = tier;
                    q.push(j);
                    next += 1;
                }
                let descents = q.set_priorities(|hot| {
                    f64::from(factors[hot.account]) * 1_000.0 - hot.submit_s as f64
                        + hot.quota_priority * 40.0 * cycle as f64
                });
                q.arrange(Some(descents));
                let mut sorted: Vec<&Slot> = q.jobs.iter().collect();
                sorted.sort_by(|a, b| slot_order(a, b));
                let expected: Vec<&JobId> = sorted.iter().map(|s| &s.job.spec.id).collect();
                let got: Vec<&JobId> = q.iter().map(|j| &j.spec.id).collect();
                proptest::prop_assert_eq!(got, expected);
                q.check(|_| false).unwrap();
                // Jobs started anywhere in the queue, a few (taken out one by one) or many (the
                // queue walked once): the others stay, in order.
                let started: Vec<usize> = (first..q.len()).step_by(every).take(starts).collect();
                let left: Vec<JobId> = q
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !started.contains(i))
                    .map(|(_, j)| j.spec.id.clone())
                    .collect();
                q.end_cycle(&started, None);
                let after: Vec<JobId> = q.iter().map(|j| j.spec.id.clone()).collect();
                proptest::prop_assert_eq!(after, left);
                q.check(|_| false).unwrap();
            }
        }
    }
}
