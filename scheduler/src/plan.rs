//! The future as the backfill planner sees it: running jobs give their GPUs back when their
//! time limits run out (or at their kill deadline when they are being preempted), and pending
//! jobs hold planned starts. A job may start now only where it is free for its whole time
//! limit, so it never delays a planned start; EASY backfill plans one job, conservative
//! backfill many.

use std::borrow::Cow;
use std::cell::{Ref, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, JobId};
use smallvec::SmallVec;

use crate::cluster::{set_bits, Cluster, NodeFilter, Placement, Shape, Slot, Stamp, WholeNodes};
use crate::releases::{Release, ReleaseBook};

/// A planned start: these GPUs are spoken for during `[start, end)`.
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub job: JobId,
    pub start: UnixSeconds,
    pub end: UnixSeconds,
    pub placement: Placement,
    /// Whole GPUs the job was planned on (before a multi-node plan was widened to whole
    /// nodes): free then, and apart from every other plan running at the same time.
    pub whole_gpus: u32,
}

impl Hold {
    fn overlaps(&self, start: UnixSeconds, end: UnixSeconds) -> bool {
        self.start < end && self.end > start
    }

    /// The nodes it holds GPUs of.
    fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.placement
            .0
            .iter()
            .filter(|s| s.mask != 0)
            .map(|s| s.node)
    }
}

/// Which times a plan search tries: from `not_before` on, with the free-count pruning (a test
/// compares with and without it), skipping a stretch the caller knows fails, and before a
/// bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Search {
    prune: bool,
    not_before: UnixSeconds,
    /// Times in `[skip.0, skip.1)` are not tried.
    skip: (UnixSeconds, UnixSeconds),
    /// Times from this one on are not tried.
    before: UnixSeconds,
}

impl Search {
    /// Every time from `not_before` on.
    pub fn from(not_before: UnixSeconds) -> Search {
        Search {
            prune: true,
            not_before,
            skip: (0, 0),
            before: UnixSeconds::MAX,
        }
    }

    /// Not the times in `[from, until)` (the caller knows they fail).
    pub fn skipping(self, (from, until): (UnixSeconds, UnixSeconds)) -> Search {
        Search {
            skip: (from, until),
            ..self
        }
    }

    /// Only the times before `before`.
    pub fn before(self, before: UnixSeconds) -> Search {
        Search { before, ..self }
    }
}

/// The cluster as a job starting at some time would find it for its whole run, as a search
/// hands it to its `find`: every GPU, or for a job placed on wholly free nodes only (see
/// [`Cluster::needs_whole_nodes`]) which nodes are wholly free then.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Window<'a> {
    Cluster(&'a Cluster),
    WholeNodes {
        /// The cluster now (what every node is).
        cluster: &'a Cluster,
        whole: WholeNodes<'a>,
    },
}

impl Window<'_> {
    /// Where [`Cluster::find`] places the job on this window.
    pub fn find(
        self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        match self {
            Window::Cluster(cluster) => cluster.find(gpus, account, filter, shape),
            Window::WholeNodes { cluster, whole } => {
                cluster.find_whole_nodes_in(whole, gpus, account, filter, shape)
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    now: UnixSeconds,
    /// When running jobs give their GPUs back, sorted by time (then job).
    releases: Vec<Release>,
    /// Sorted by start.
    holds: Vec<Hold>,
    /// The holds' ends, sorted (times a search tries).
    hold_ends: Vec<UnixSeconds>,
    /// Times other than releases when what a job may use changes (advance reservations).
    boundaries: Vec<UnixSeconds>,
    /// Whether any release or hold is a part of a GPU (searches then copy the cluster for
    /// every time they try, see `Sweep`).
    shares: bool,
    /// What the releases leave free over time, for every size at once, worked out on the
    /// first search and kept until the releases or the cluster change.
    bounds: RefCell<Option<NodeBounds>>,
    /// The free count over time (see `free_profile`), worked out on the first search, brought
    /// up to date as plans are added and kept until the releases or the cluster change.
    profile: RefCell<Option<FreeProfile>>,
    /// What pruned searches count with, kept between them (see `SweepCounts`).
    sweep_counts: RefCell<Option<SweepCounts>>,
    /// The copy a search moves forward, kept between searches so that each copies into it
    /// once rather than allocating a cluster.
    sweep_window: RefCell<Option<Cluster>>,
    /// The copy a search among parts of GPUs holds the plans on (see `Copies`), kept likewise.
    held_window: RefCell<Option<Cluster>>,
    /// A sweep's heap of overlapping plans, kept empty between searches for its buffer.
    sweep_active: RefCell<BinaryHeap<Reverse<(UnixSeconds, usize)>>>,
    /// What searches of jobs of whole nodes count with, kept between them (see
    /// `WholeSweep`).
    whole_counts: RefCell<Option<WholeCounts>>,
    /// The cluster as the releases alone leave it at points along them, taken as searches
    /// need them and kept until the releases or the cluster change (see `Checkpoints`).
    checkpoints: RefCell<Option<Checkpoints>>,
    /// The cluster now with the first plans by start held, at points along them (see
    /// `HeldPrefixes`).
    held_prefixes: RefCell<Option<HeldPrefixes>>,
    /// How many plans end by now (none but a plan of no length made now): the held prefixes
    /// count only plans that overlap a run from now.
    ended_holds: usize,
    /// The GPUs free now that plans take, and from when (see `TakenNow`).
    taken_now: RefCell<Option<TakenNow>>,
}

/// The whole GPUs free now (in the cluster with stamp `stamp`) that plans running after now
/// hold, each with the earliest start of a plan holding it: a run from now until `end` finds
/// free the GPUs free now less those taken before `end` (what the window of
/// `Plan::with_window_now` counts), so a job that needs more is known not to start now without
/// that window being made. Worked out when first asked, brought up to date as plans are added,
/// dropped when a plan is forgotten or the cluster changes.
#[derive(Clone, Debug)]
struct TakenNow {
    stamp: Stamp,
    /// Each such GPU, `(node, GPU)` ascending, with its earliest start.
    gpus: Vec<((usize, usize), UnixSeconds)>,
    /// Those starts, ascending.
    starts: Vec<UnixSeconds>,
}

impl TakenNow {
    /// From `holds`, the plans of a plan at `now`, sorted by start.
    fn of(cluster: &Cluster, holds: &[Hold], now: UnixSeconds) -> Self {
        let mut gpus: Vec<((usize, usize), UnixSeconds)> = holds
            .iter()
            .filter(|h| h.end > now)
            .flat_map(|h| {
                h.placement.0.iter().flat_map(move |slot| {
                    set_bits(slot.mask & cluster.free_mask(slot.node))
                        .map(move |gpu| ((slot.node, gpu), h.start))
                })
            })
            .collect();
        // Stable: of the plans holding a GPU, the first by start is kept.
        gpus.sort_by_key(|(gpu, _)| *gpu);
        gpus.dedup_by_key(|(gpu, _)| *gpu);
        let mut starts: Vec<UnixSeconds> = gpus.iter().map(|(_, start)| *start).collect();
        starts.sort_unstable();
        TakenNow {
            stamp: cluster.stamp(),
            gpus,
            starts,
        }
    }

    /// Counts the GPUs free in `cluster` that `hold` (a plan running after now) holds as
    /// taken from its start, where no plan took them earlier.
    fn take(&mut self, cluster: &Cluster, hold: &Hold) {
        for slot in &hold.placement.0 {
            for gpu in set_bits(slot.mask & cluster.free_mask(slot.node)) {
                let key = (slot.node, gpu);
                let was = match self.gpus.binary_search_by_key(&key, |(k, _)| *k) {
                    Ok(i) if self.gpus[i].1 <= hold.start => continue,
                    Ok(i) => Some(std::mem::replace(&mut self.gpus[i].1, hold.start)),
                    Err(i) => {
                        self.gpus.insert(i, (key, hold.start));
                        None
                    }
                };
                if let Some(k) = was.and_then(|w| self.starts.binary_search(&w).ok()) {
                    self.starts.remove(k);
                }
                let at = self.starts.partition_point(|s| *s <= hold.start);
                self.starts.insert(at, hold.start);
            }
        }
    }

    /// The GPUs free in `cluster` for a run from now until `end`.
    fn free_until(&self, cluster: &Cluster, end: UnixSeconds) -> u32 {
        let taken = self.starts.partition_point(|s| *s < end);
        cluster
            .free_gpus()
            .saturating_sub(u32::try_from(taken).unwrap_or(u32::MAX))
    }
}

/// Copies of the cluster with stamp `stamp` holding the first plans by start, taken every
/// [`HeldPrefixes::EVERY`] plans as `Plan::with_window_now` reaches them. A job starting now would
/// overlap exactly the plans that start before it would end (all plans end after now), a
/// prefix of them: its window is the copy of the longest prefix within that one, with the few
/// plans after it held, instead of the cluster with every overlapping plan held again for each
/// job tried. A plan added within a copy's prefix is held on that copy too; one forgotten
/// there drops the copy.
#[derive(Clone, Debug)]
struct HeldPrefixes {
    stamp: Stamp,
    /// `(n, the cluster with holds[..n] held)`, by `n`.
    taken: Vec<(usize, Cluster)>,
}

impl HeldPrefixes {
    const EVERY: usize = 8;
}

/// Copies of the cluster with stamp `stamp` after every `every` releases: a sweep starts from
/// the last one due by its first candidate time instead of giving every release back again
/// (on a large cluster most searches start days out, past most of tens of thousands of
/// releases). A sweep's cluster at a time depends only on the releases due and the plans
/// overlapping, so starting from a copy and holding the plans there is the same.
#[derive(Clone, Debug)]
struct Checkpoints {
    stamp: Stamp,
    every: usize,
    /// `taken[k]`: the cluster after releases `..(k + 1) * every`.
    taken: Vec<Cluster>,
}

/// When the running jobs' releases first leave one node with `g` GPUs free (for every `g` up
/// to the largest node), how many GPUs whole free nodes hold after each release that frees a
/// node, and which node that is, from the cluster with stamp `stamp`. All only grow with time.
#[derive(Clone, Debug)]
struct NodeBounds {
    stamp: Stamp,
    one_node: Vec<UnixSeconds>,
    whole: Vec<(UnixSeconds, u32)>,
    /// The nodes the releases leave wholly free (not free now), by time.
    became_whole: Vec<(UnixSeconds, usize)>,
    /// The nodes wholly free after the first `(k + 1) * whole_every` of `became_whole`, a bit
    /// per node: a whole-node search starts from the last one due by its first time instead of
    /// walking every node that came free before it.
    whole_after: Vec<Vec<u64>>,
    whole_every: usize,
}

impl NodeBounds {
    fn of(plan: &Plan, cluster: &Cluster) -> NodeBounds {
        let mut free: Vec<u64> = (0..cluster.node_count())
            .map(|n| cluster.free_mask(n))
            .collect();
        let mut one_node = vec![UnixSeconds::MAX; cluster.gpus_per_node_max() as usize + 1];
        let mut most = 0;
        let mut whole_free = 0u32;
        for (n, mask) in free.iter().enumerate() {
            let count = mask.count_ones();
            most = most.max(count);
            if *mask == cluster.full_mask(n) {
                whole_free += count;
            }
        }
        one_node[..=most as usize].fill(plan.now);
        let mut whole = vec![(plan.now, whole_free)];
        let mut became_whole = Vec::new();
        for release in &plan.releases {
            let at = release.at.max(plan.now);
            for slot in &release.placement().0 {
                // A part of a GPU counts as the whole GPU freed: an upper bound of what is free.
                let was_whole = free[slot.node] == cluster.full_mask(slot.node);
                free[slot.node] |= slot.mask;
                let count = free[slot.node].count_ones();
                if !was_whole && free[slot.node] == cluster.full_mask(slot.node) {
                    whole_free += count;
                    whole.push((at, whole_free));
                    became_whole.push((at, slot.node));
                }
                if count > most {
                    one_node[most as usize + 1..=count as usize].fill(at);
                    most = count;
                }
            }
        }
        // A copy costs a word per 64 nodes, walking a node that came free about as much.
        let now = cluster.whole_nodes().nodes;
        let whole_every = now.len().max(64);
        let mut nodes = now.to_vec();
        let mut whole_after = Vec::new();
        for (k, (_, node)) in became_whole.iter().enumerate() {
            nodes[node / 64] |= 1 << (node % 64);
            if (k + 1) % whole_every == 0 {
                whole_after.push(nodes.clone());
            }
        }
        NodeBounds {
            stamp: cluster.stamp(),
            one_node,
            whole,
            became_whole,
            whole_after,
            whole_every,
        }
    }

    /// The first time `gpus` could be placed: on one node (when `one_node`), or on whole
    /// free nodes.
    fn first(&self, gpus: u32, one_node: bool) -> UnixSeconds {
        let on_one = if one_node {
            self.one_node
                .get(gpus as usize)
                .copied()
                .unwrap_or(UnixSeconds::MAX)
        } else {
            UnixSeconds::MAX
        };
        let k = self.whole.partition_point(|(_, w)| *w < gpus);
        let on_whole = self.whole.get(k).map_or(UnixSeconds::MAX, |(t, _)| *t);
        on_one.min(on_whole)
    }
}

impl Plan {
    /// A plan at `now` from running jobs' releases in any order (tests).
    #[cfg(test)]
    pub fn new(
        now: UnixSeconds,
        releases: Vec<(UnixSeconds, JobId, Placement)>,
        boundaries: Vec<UnixSeconds>,
    ) -> Self {
        let mut releases: Vec<Release> = releases
            .into_iter()
            .map(|(at, job, placement)| Release::new(at, job, placement))
            .collect();
        releases.sort_by(|a, b| (a.at, a.job()).cmp(&(b.at, b.job())));
        Self::sorted(now, releases, boundaries)
    }

    /// A plan at `now` from the running jobs' releases as the scheduler keeps them.
    pub fn from_book(now: UnixSeconds, book: &ReleaseBook, boundaries: Vec<UnixSeconds>) -> Self {
        Self::sorted(now, book.releases(), boundaries)
    }

    /// `releases` by time, then job.
    fn sorted(now: UnixSeconds, releases: Vec<Release>, mut boundaries: Vec<UnixSeconds>) -> Self {
        boundaries.retain(|t| *t > now);
        boundaries.sort_unstable();
        boundaries.dedup();
        let shares = releases.iter().any(|r| r.placement().has_share());
        Plan {
            now,
            releases,
            holds: Vec::new(),
            hold_ends: Vec::new(),
            boundaries,
            shares,
            bounds: RefCell::new(None),
            profile: RefCell::new(None),
            sweep_counts: RefCell::new(None),
            sweep_window: RefCell::new(None),
            held_window: RefCell::new(None),
            sweep_active: RefCell::new(BinaryHeap::new()),
            whole_counts: RefCell::new(None),
            checkpoints: RefCell::new(None),
            held_prefixes: RefCell::new(None),
            ended_holds: 0,
            taken_now: RefCell::new(None),
        }
    }

    /// The GPUs the plans for later starts hold, node by node (ascending, masks merged): a
    /// free one among them is what Slurm's `sinfo` calls planned, kept for a waiting job.
    pub fn planned_gpus(&self) -> Vec<(usize, u64)> {
        let mut gpus: Vec<(usize, u64)> = self
            .holds
            .iter()
            .filter(|h| h.start > self.now)
            .flat_map(|h| h.placement.0.iter().map(|s| (s.node, s.mask)))
            .collect();
        gpus.sort_unstable();
        gpus.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 |= later.1;
            }
            same
        });
        gpus
    }

    pub fn has_holds(&self) -> bool {
        !self.holds.is_empty()
    }

    /// Whether a running job or a plan holds a part of a GPU (where placement depends on the
    /// order parts were taken in).
    pub fn has_shares(&self) -> bool {
        self.shares
    }

    /// A job started now and gives its GPUs back at `end`.
    pub fn started(&mut self, id: JobId, end: UnixSeconds, placement: Placement) {
        let at = self
            .releases
            .partition_point(|r| (r.at, r.job()) < (end, &id));
        self.shares |= placement.has_share();
        self.releases.insert(at, Release::new(end, id, placement));
        *self.bounds.get_mut() = None;
        *self.profile.get_mut() = None;
        *self.checkpoints.get_mut() = None;
        *self.held_prefixes.get_mut() = None;
        *self.taken_now.get_mut() = None;
    }

    /// Makes `window` the cluster as the releases due at `t` leave it, from the last
    /// checkpoint they reach (taking the ones missing), and returns how many releases that
    /// gave back; 0, and `window` untouched, when no checkpoint is due yet.
    fn copy_checkpoint(&self, cluster: &Cluster, t: UnixSeconds, window: &mut Cluster) -> usize {
        let due = self.releases.partition_point(|r| r.at <= t);
        let mut checkpoints = self.checkpoints.borrow_mut();
        let checkpoints = match &mut *checkpoints {
            Some(c) if c.stamp == cluster.stamp() => c,
            other => other.insert(Checkpoints {
                stamp: cluster.stamp(),
                // A copy costs a few bytes a node to take and to start from; every release
                // between a checkpoint and the first time tried costs a count update per node it
                // frees. Every nodes / 32 releases took 4-7% fewer instructions per cycle than
                // every nodes / 4 (512 nodes, 10,000 pending, conservative).
                every: (cluster.node_count() / 32).max(8),
                taken: Vec::new(),
            }),
        };
        let every = checkpoints.every;
        let reached = due / every;
        while checkpoints.taken.len() < reached {
            let k = checkpoints.taken.len();
            let mut next = checkpoints.taken.last().unwrap_or(cluster).clone();
            for release in &self.releases[k * every..(k + 1) * every] {
                next.release_held(release.placement());
            }
            checkpoints.taken.push(next);
        }
        match reached.checked_sub(1) {
            Some(k) => {
                window.copy_from(&checkpoints.taken[k]);
                reached * every
            }
            None => 0,
        }
    }

    /// A running job now gives its GPUs back at `end` (it is being preempted, or shrank).
    pub fn released_at(&mut self, id: &JobId, end: UnixSeconds, placement: Placement) {
        self.releases.retain(|r| r.job() != id);
        self.started(id.clone(), end, placement);
    }

    /// How many whole GPUs the window of a job starting now and running `limit_s` has free
    /// (see `with_window_now`; the job holds no plan), without making it: `None` where a
    /// release or plan holds a part of a GPU (what a part leaves free depends on the order
    /// parts were taken in).
    pub fn free_now_for(&self, cluster: &Cluster, limit_s: u64) -> Option<u32> {
        if self.shares {
            return None;
        }
        let end = self.now.saturating_add(limit_s as i64);
        let mut taken = self.taken_now.borrow_mut();
        let taken = match &mut *taken {
            Some(t) if t.stamp == cluster.stamp() => t,
            other => other.insert(TakenNow::of(cluster, &self.holds, self.now)),
        };
        Some(taken.free_until(cluster, end))
    }

    /// `f` of the cluster as a job starting now and running `limit_s` would find it: what is
    /// free now, less what other jobs' planned starts within its run hold. `own`: the job,
    /// where it may hold a plan of its own (not held for it); `None` where the caller knows
    /// it holds none (most jobs try to start before they are planned), which spares looking
    /// for it among the plans at every try. Where a copy of the first plans held is kept (see
    /// `HeldPrefixes`), the few plans after those are held on that copy for `f` and lifted
    /// again, rather than copied with it.
    pub fn with_window_now<R>(
        &self,
        cluster: &Cluster,
        limit_s: u64,
        own: Option<&JobId>,
        f: impl FnOnce(&Cluster) -> R,
    ) -> R {
        let end = self.now.saturating_add(limit_s as i64);
        let overlapping = self.holds.partition_point(|h| h.start < end);
        let prefix = &self.holds[..overlapping];
        // Parts of GPUs held on a copy depend on the order they are held in: held afresh.
        let is_prefix = !self.shares
            && overlapping >= HeldPrefixes::EVERY
            && self.ended_holds == 0
            && own.is_none_or(|job| prefix.iter().all(|h| &h.job != job));
        if !is_prefix {
            return f(&self.window_holding(cluster, end, own));
        }
        let mut prefixes = self.held_prefixes.borrow_mut();
        let prefixes = match &mut *prefixes {
            Some(p) if p.stamp == cluster.stamp() => p,
            other => other.insert(HeldPrefixes {
                stamp: cluster.stamp(),
                taken: Vec::new(),
            }),
        };
        loop {
            let (held, from) = prefixes.taken.last().map_or((0, cluster), |(n, c)| (*n, c));
            let next = held + HeldPrefixes::EVERY;
            if next > overlapping {
                break;
            }
            let mut copy = from.clone();
            for hold in &self.holds[held..next] {
                copy.hold(&hold.placement);
            }
            prefixes.taken.push((next, copy));
        }
        let before = prefixes.taken.partition_point(|(n, _)| *n <= overlapping);
        let Some((held, copy)) = before
            .checked_sub(1)
            .and_then(|k| prefixes.taken.get_mut(k))
        else {
            return f(&self.window_holding(cluster, end, own));
        };
        // Whole GPUs only (no part of a GPU is held or running): each node's free GPUs as
        // they were bring it back exactly.
        let mut was: SmallVec<[(usize, u64); 16]> = SmallVec::new();
        for hold in &self.holds[*held..overlapping] {
            was.extend(
                hold.placement
                    .0
                    .iter()
                    .map(|s| (s.node, copy.free_mask(s.node))),
            );
            copy.hold(&hold.placement);
        }
        let result = f(copy);
        for (node, free) in was.into_iter().rev() {
            copy.set_free_mask(node, free);
        }
        result
    }

    /// `with_window_now`'s window made afresh: every plan overlapping `[now, end)` but `own`'s
    /// held on the cluster.
    fn window_holding<'c>(
        &self,
        cluster: &'c Cluster,
        end: UnixSeconds,
        own: Option<&JobId>,
    ) -> Cow<'c, Cluster> {
        let mut window = Cow::Borrowed(cluster);
        for hold in self
            .holds
            .iter()
            .filter(|h| own != Some(&h.job) && h.overlaps(self.now, end))
        {
            window.to_mut().hold(&hold.placement);
        }
        window
    }

    /// Whether a search of a job shaped `shape` tries `t`: now, a release on a type it may
    /// use, a plan's end or a reservation boundary (see `earliest`).
    pub fn tries(&self, cluster: &Cluster, shape: &Shape, t: UnixSeconds) -> bool {
        if t <= self.now {
            return t == self.now;
        }
        let types = cluster.type_mask(shape);
        let from = self.releases.partition_point(|r| r.at < t);
        let released = self.releases[from..]
            .iter()
            .take_while(|r| r.at == t)
            .any(|r| gives_back_some_of(cluster, r, types));
        released
            || self.hold_ends.binary_search(&t).is_ok()
            || self.boundaries.binary_search(&t).is_ok()
    }

    /// Where `find` places the job when it starts at `t`, on the cluster as a search sees it
    /// then (a start kept from the last cycle, looked up again).
    pub fn place_at(
        &self,
        cluster: &Cluster,
        gpus: u32,
        shape: &Shape,
        limit_s: u64,
        t: UnixSeconds,
        mut find: impl FnMut(Window<'_>, UnixSeconds) -> Option<Placement>,
    ) -> Option<Placement> {
        let end = t.saturating_add(limit_s as i64);
        let mut ahead = self.ahead(cluster, gpus, shape, true);
        let placed = ahead
            .at(t, end, gpus, shape)
            .and_then(|window| find(window, t));
        placed
    }

    /// How a search sees the cluster ahead: node by node where the job needs whole nodes,
    /// one copy moved forward where whole GPUs are held (and `sweep`), else a copy per time.
    fn ahead<'p>(
        &'p self,
        cluster: &'p Cluster,
        gpus: u32,
        shape: &Shape,
        sweep: bool,
    ) -> Ahead<'p> {
        let whole_gpus_only = sweep && !self.shares && shape.gpu_share.is_none();
        if whole_gpus_only && cluster.needs_whole_nodes(gpus, shape) {
            Ahead::Whole(WholeSweep::new(self, cluster))
        } else if whole_gpus_only {
            Ahead::Sweep(Sweep::new(self, cluster))
        } else {
            Ahead::Copies(Copies::new(self, cluster))
        }
    }

    /// The earliest time at or after now, among those `search` tries, when `find` places the
    /// job on the cluster as it will be for its whole run, and the placement. `find` gets that
    /// cluster and the start time. Times the free count rules out are skipped when
    /// `search.prune` (a test compares both). Pruned searches of whole GPUs move one copy of
    /// the cluster forward (`Sweep`); the others copy it for every time they try (`Copies`).
    pub fn earliest(
        &self,
        cluster: &Cluster,
        gpus: u32,
        shape: &Shape,
        limit_s: u64,
        search: Search,
        mut find: impl FnMut(Window<'_>, UnixSeconds) -> Option<Placement>,
    ) -> Option<(UnixSeconds, Placement)> {
        let mut low =
            (search.prune && shape.gpu_share.is_none()).then(|| self.low_stretches(cluster, gpus));
        // Candidates before this time are known to fail (the free count dips below `gpus`,
        // no node is free enough yet, or the caller knows).
        let mut fails_before = search.not_before;
        if search.prune && shape.gpu_share.is_none() && shape.gpus_per_node.is_none() {
            fails_before = fails_before.max(self.node_bound(cluster, gpus));
        }
        // The cluster as the releases up to the candidate leave it, brought forward only when
        // a candidate gets past the counts: most are ruled out before.
        let mut ahead = self.ahead(cluster, gpus, shape, search.prune);
        // A release only on nodes of types the job may not use leaves what it may use as it
        // was: that time would fail as the time tried before it did (plans ending are tried
        // in their own right), so it is not tried. The cluster still takes the release.
        let types = cluster.type_mask(shape);
        let typed = search.prune && types != u64::MAX;
        // Times before the first that may succeed are not walked (on a busy cluster most of
        // the releases come before it).
        let start = fails_before;
        let first_release = self
            .releases
            .partition_point(|r| r.at.max(self.now) < start);
        let first_end = self.hold_ends.partition_point(|t| *t < start);
        let first_boundary = self.boundaries.partition_point(|t| *t < start);
        let release_times = self.releases[first_release..]
            .iter()
            .filter(|r| !typed || gives_back_some_of(cluster, r, types))
            .map(|r| r.at.max(self.now));
        let others = merge_sorted(
            std::iter::once(self.now).filter(|now| *now >= start),
            merge_sorted(
                self.hold_ends[first_end..].iter().copied(),
                self.boundaries[first_boundary..].iter().copied(),
            ),
        );
        let mut last = None;
        for t in merge_sorted(release_times, others) {
            if t >= search.before {
                break;
            }
            if last == Some(t) || t < fails_before || (search.skip.0..search.skip.1).contains(&t) {
                continue;
            }
            last = Some(t);
            let end = t.saturating_add(limit_s as i64);
            if let Some(low) = &mut low {
                if let Some(until) = low.within(t, end) {
                    fails_before = until;
                    continue;
                }
            }
            // Releases only add GPUs and holds only take some: a cluster with too few free
            // GPUs cannot place the job.
            let Some(window) = ahead.at(t, end, gpus, shape) else {
                continue;
            };
            if let Some(p) = find(window, t) {
                return Some((t, p));
            }
        }
        None
    }

    /// When fewer than `gpus` whole GPUs are free at most (see `free_profile`), read as a
    /// search asks, for rising start times.
    fn low_stretches(&self, cluster: &Cluster, gpus: u32) -> LowStretches<'_> {
        {
            let mut profile = self.profile.borrow_mut();
            if !profile.as_ref().is_some_and(|p| p.stamp == cluster.stamp()) {
                *profile = Some(self.free_profile(cluster));
            }
        }
        let steps = Ref::map(self.profile.borrow(), |p| match p {
            Some(p) => p.steps.as_slice(),
            None => &[],
        });
        LowStretches {
            steps,
            gpus: i64::from(gpus),
            scanned: 0,
            next: None,
        }
    }

    /// An upper bound of the whole GPUs free at every time from now on: free now, plus what
    /// each running job gives back when it does (a part of a GPU counted as the GPU), less the
    /// plans running then. Plans running at the same time hold GPUs apart from each other, on
    /// GPUs free when they start (see [`Hold::whole_gpus`]), so at any instant they take that
    /// many off the count one for one; filters and reservations only take more.
    fn free_profile(&self, cluster: &Cluster) -> FreeProfile {
        let releases = self.releases.iter().map(|r| (r.at.max(self.now), r.gpus));
        let mut steps: Vec<(UnixSeconds, i64)> = Vec::with_capacity(self.releases.len() + 1);
        steps.push((self.now, i64::from(cluster.free_gpus())));
        for (at, delta) in releases {
            let value = steps.last().map_or(0, |s| s.1) + delta;
            match steps.last_mut() {
                Some(last) if last.0 == at => last.1 = value,
                _ => steps.push((at, value)),
            }
        }
        let mut profile = FreeProfile {
            stamp: cluster.stamp(),
            steps,
        };
        for h in &self.holds {
            profile.plan(self.now, h);
        }
        profile
    }

    /// The earliest time the default placement of `gpus` GPUs (one node with that many free,
    /// else whole free nodes holding that many; see `Cluster::find`) could succeed, from the
    /// running jobs' releases alone: plans, filters and reservations only take GPUs away.
    /// `UnixSeconds::MAX` when not even every release is enough. The free count cannot see
    /// fragmentation: on a busy cluster the GPUs free add up long before a node is free
    /// enough, and every candidate time in between would be copied and searched in vain.
    fn node_bound(&self, cluster: &Cluster, gpus: u32) -> UnixSeconds {
        self.bounds(cluster)
            .first(gpus, gpus <= cluster.gpus_per_node_max())
    }

    /// The node bounds of the releases on `cluster`, worked out when they are not known.
    fn bounds(&self, cluster: &Cluster) -> Ref<'_, NodeBounds> {
        {
            let mut bounds = self.bounds.borrow_mut();
            if !bounds.as_ref().is_some_and(|b| b.stamp == cluster.stamp()) {
                *bounds = Some(NodeBounds::of(self, cluster));
            }
        }
        Ref::map(self.bounds.borrow(), |b| match b {
            Some(b) => b,
            None => unreachable!("worked out above"),
        })
    }

    /// Forgets `job`'s planned start (it started), and returns it.
    pub fn forget(&mut self, job: &JobId) -> Option<Hold> {
        let k = self.holds.iter().position(|h| &h.job == job)?;
        let hold = self.holds.remove(k);
        if hold.end <= self.now {
            self.ended_holds -= 1;
        }
        if let Ok(e) = self.hold_ends.binary_search(&hold.end) {
            self.hold_ends.remove(e);
        }
        *self.profile.get_mut() = None;
        *self.taken_now.get_mut() = None;
        if let Some(prefixes) = self.held_prefixes.get_mut() {
            prefixes.taken.retain(|(n, _)| *n <= k);
        }
        Some(hold)
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
        let whole_gpus = placement
            .0
            .iter()
            .filter(|s| s.share.is_none())
            .map(|s| s.mask.count_ones())
            .sum();
        let placement = if placement.0.len() > 1 {
            Placement(
                placement
                    .0
                    .iter()
                    .map(|s| Slot::whole(s.node, cluster.full_mask(s.node)))
                    .collect(),
            )
        } else {
            placement
        };
        if end <= self.now {
            self.ended_holds += 1;
        }
        let hold = Hold {
            job,
            start,
            end,
            placement,
            whole_gpus,
        };
        self.shares |= hold.placement.has_share();
        if let Some(profile) = self.profile.get_mut() {
            profile.plan(self.now, &hold);
        }
        let taken_now = self.taken_now.get_mut();
        match taken_now {
            Some(taken) if taken.stamp == cluster.stamp() => {
                if hold.end > self.now {
                    taken.take(cluster, &hold);
                }
            }
            _ => *taken_now = None,
        }
        let e = self.hold_ends.partition_point(|t| *t <= end);
        self.hold_ends.insert(e, end);
        let k = self.holds.partition_point(|h| h.start <= start);
        if let Some(prefixes) = self.held_prefixes.get_mut() {
            for (n, copy) in prefixes.taken.iter_mut().filter(|(n, _)| *n > k) {
                copy.hold(&hold.placement);
                *n += 1;
            }
        }
        self.holds.insert(k, hold);
    }
}

/// The cluster as a job starting at `t` finds it for its whole run `[t, end)`, for rising `t`
/// within one search: what the releases up to `t` give back, less every plan overlapping the
/// run. `None` where too few GPUs are free for `gpus`.
enum Ahead<'p> {
    Sweep(Sweep<'p>),
    Copies(Copies<'p>),
    Whole(WholeSweep<'p>),
}

impl Ahead<'_> {
    fn at(
        &mut self,
        t: UnixSeconds,
        end: UnixSeconds,
        gpus: u32,
        shape: &Shape,
    ) -> Option<Window<'_>> {
        match self {
            Ahead::Sweep(s) => Some(s.at(t, end))
                .filter(|c| c.may_fit(gpus, shape))
                .map(Window::Cluster),
            Ahead::Copies(c) => c.at(t, end, gpus, shape).map(Window::Cluster),
            Ahead::Whole(w) => {
                let cluster = w.base;
                let whole = w.at(t, end);
                (whole.gpus >= gpus).then_some(Window::WholeNodes { cluster, whole })
            }
        }
    }
}

/// The plain way, and the only one for parts of GPUs: the cluster brought forward through
/// the releases (from the last checkpoint before the first time tried), copied for every time
/// tried and the overlapping plans held on the copy. Both copies are the plan's, handed from
/// one search to the next.
struct Copies<'p> {
    plan: &'p Plan,
    /// The cluster now, which the checkpoints were taken from.
    base: &'p Cluster,
    future: Cluster,
    fresh: bool,
    /// Overwritten per time tried: no allocation per time tried, nor per search once the plan
    /// has one.
    scratch: Option<Cluster>,
    next_release: usize,
}

impl<'p> Copies<'p> {
    fn new(plan: &'p Plan, cluster: &'p Cluster) -> Self {
        let future = plan.sweep_window.borrow_mut().take();
        Copies {
            plan,
            base: cluster,
            future: future.unwrap_or_else(|| cluster.clone()),
            fresh: true,
            scratch: plan.held_window.borrow_mut().take(),
            next_release: 0,
        }
    }

    fn at(
        &mut self,
        t: UnixSeconds,
        end: UnixSeconds,
        gpus: u32,
        shape: &Shape,
    ) -> Option<&Cluster> {
        if std::mem::take(&mut self.fresh) {
            self.next_release = self.plan.copy_checkpoint(self.base, t, &mut self.future);
            if self.next_release == 0 {
                self.future.copy_from(self.base);
            }
        }
        while let Some(r) = self.plan.releases.get(self.next_release) {
            if r.at > t {
                break;
            }
            self.future.release(r.placement());
            self.next_release += 1;
        }
        // Releases only add GPUs and holds only take some: a cluster with too few free
        // GPUs before the holds cannot place the job.
        if !self.future.may_fit(gpus, shape) {
            return None;
        }
        let mut overlapping = self
            .plan
            .holds
            .iter()
            .filter(|h| h.overlaps(t, end))
            .peekable();
        if overlapping.peek().is_none() {
            return Some(&self.future);
        }
        let held = self.scratch.get_or_insert_with(|| self.future.clone());
        held.copy_from(&self.future);
        for hold in overlapping {
            held.hold(&hold.placement);
        }
        Some(held)
    }
}

impl Drop for Copies<'_> {
    /// Gives the copies back to the plan for the next search.
    fn drop(&mut self) {
        let hollow = self.future.hollow();
        let future = std::mem::replace(&mut self.future, hollow);
        *self.plan.sweep_window.borrow_mut() = Some(future);
        if let Some(held) = self.scratch.take() {
            *self.plan.held_window.borrow_mut() = Some(held);
        }
    }
}

/// Whole GPUs only: one copy of the cluster moved forward with the search. A release frees
/// its GPUs where no overlapping plan holds them, a plan is held when the run comes to
/// overlap it and lifted when the run starts after it ends, so each release and plan is
/// applied once per search rather than once per time tried.
struct Sweep<'p> {
    plan: &'p Plan,
    /// The cluster now, which the checkpoints were taken from.
    base: &'p Cluster,
    /// Set from `base` or a checkpoint at the first time tried.
    window: Cluster,
    fresh: bool,
    /// Borrowed from the plan for the search and given back clean (see `SweepCounts`).
    counts: SweepCounts,
    next_release: usize,
    /// The next plan (by start) not yet overlapping.
    next_hold: usize,
    /// The overlapping plans, by end.
    active: BinaryHeap<Reverse<(UnixSeconds, usize)>>,
}

/// Per GPU, how many of the plans overlapping the run hold it (plans at different times may
/// hold the same GPU, and a long run overlaps both), and per node the GPUs the releases have
/// freed that a plan holds (free again when no plan does). All zero between searches: a
/// search clears what its overlapping plans still hold when it ends, so a plan's searches
/// share one set instead of clearing a cluster-sized one each.
#[derive(Clone, Debug, Default)]
struct SweepCounts {
    /// Where each node's GPUs start in `holders`.
    first_gpu: Vec<usize>,
    holders: Vec<u32>,
    /// Per node, the GPUs with a holder (read for every GPU a release gives back).
    held: Vec<u64>,
    freed: Vec<u64>,
}

impl SweepCounts {
    fn for_cluster(cluster: &Cluster) -> Self {
        let nodes = cluster.node_count();
        let mut first_gpu = Vec::with_capacity(nodes);
        let mut total = 0usize;
        for node in 0..nodes {
            first_gpu.push(total);
            total += cluster.node_spec(node).gpus as usize;
        }
        SweepCounts {
            first_gpu,
            holders: vec![0; total],
            held: vec![0; nodes],
            freed: vec![0; nodes],
        }
    }

    /// The GPUs of `mask` on `node` some overlapping plan holds.
    fn held(&self, node: usize, mask: u64) -> u64 {
        self.held[node] & mask
    }
}

impl<'p> Sweep<'p> {
    fn new(plan: &'p Plan, cluster: &'p Cluster) -> Self {
        let counts = plan
            .sweep_counts
            .borrow_mut()
            .take()
            .filter(|c| c.first_gpu.len() == cluster.node_count())
            .unwrap_or_else(|| SweepCounts::for_cluster(cluster));
        let window = plan
            .sweep_window
            .borrow_mut()
            .take()
            .unwrap_or_else(|| cluster.clone());
        Sweep {
            plan,
            base: cluster,
            window,
            fresh: true,
            counts,
            next_release: 0,
            next_hold: 0,
            active: std::mem::take(&mut *plan.sweep_active.borrow_mut()),
        }
    }

    fn at(&mut self, t: UnixSeconds, end: UnixSeconds) -> &Cluster {
        if std::mem::take(&mut self.fresh) {
            self.next_release = self.plan.copy_checkpoint(self.base, t, &mut self.window);
            if self.next_release == 0 {
                self.window.copy_from(self.base);
            }
        }
        while let Some(&Reverse((ends, k))) = self.active.peek() {
            if ends > t {
                break;
            }
            self.active.pop();
            self.lift(k);
        }
        while let Some(r) = self.plan.releases.get(self.next_release) {
            if r.at > t {
                break;
            }
            for slot in &r.placement().0 {
                let held = self.counts.held(slot.node, slot.mask);
                self.counts.freed[slot.node] |= held;
                self.window.free_held_gpus(slot.node, slot.mask & !held);
            }
            self.next_release += 1;
        }
        while let Some(hold) = self.plan.holds.get(self.next_hold) {
            if hold.start >= end {
                break;
            }
            if hold.end > t {
                self.put(self.next_hold);
                self.active.push(Reverse((hold.end, self.next_hold)));
            }
            self.next_hold += 1;
        }
        &self.window
    }

    fn put(&mut self, k: usize) {
        for slot in &self.plan.holds[k].placement.0 {
            self.counts.freed[slot.node] |= self.window.free_mask(slot.node) & slot.mask;
            let first = self.counts.first_gpu[slot.node];
            match run_of(slot.mask) {
                // Most plans hold a run of GPUs (whole nodes for multi-node plans).
                Some((from, n)) => self.counts.holders[first + from..first + from + n]
                    .iter_mut()
                    .for_each(|h| *h += 1),
                None => {
                    for b in set_bits(slot.mask) {
                        self.counts.holders[first + b] += 1;
                    }
                }
            }
            self.counts.held[slot.node] |= slot.mask;
            self.window.hold_gpus(slot.node, slot.mask);
        }
    }

    fn lift(&mut self, k: usize) {
        for slot in &self.plan.holds[k].placement.0 {
            let first = self.counts.first_gpu[slot.node];
            let mut unheld = 0u64;
            match run_of(slot.mask) {
                Some((from, n)) => {
                    let run = &mut self.counts.holders[first + from..first + from + n];
                    for (i, holders) in run.iter_mut().enumerate() {
                        *holders -= 1;
                        unheld |= u64::from(*holders == 0) << i;
                    }
                    unheld <<= from;
                }
                None => {
                    for b in set_bits(slot.mask) {
                        let holders = &mut self.counts.holders[first + b];
                        *holders -= 1;
                        if *holders == 0 {
                            unheld |= 1 << b;
                        }
                    }
                }
            }
            self.counts.held[slot.node] &= !unheld;
            let free_again = unheld & self.counts.freed[slot.node];
            self.counts.freed[slot.node] &= !free_again;
            self.window.free_held_gpus(slot.node, free_again);
        }
    }
}

impl Drop for Sweep<'_> {
    /// Clears what the plans still overlapping hold (everything else is back to zero) and
    /// gives the counts, the emptied heap and the copy back to the plan.
    fn drop(&mut self) {
        let mut counts = std::mem::take(&mut self.counts);
        for Reverse((_, k)) in self.active.drain() {
            for slot in &self.plan.holds[k].placement.0 {
                // Only the plans still overlapping hold anything: a node's counts are cleared
                // whole, once.
                if counts.held[slot.node] == 0 {
                    continue;
                }
                counts.freed[slot.node] = 0;
                counts.held[slot.node] = 0;
                let first = counts.first_gpu[slot.node];
                let gpus = self.window.node_spec(slot.node).gpus as usize;
                counts.holders[first..first + gpus].fill(0);
            }
        }
        *self.plan.sweep_counts.borrow_mut() = Some(counts);
        *self.plan.sweep_active.borrow_mut() = std::mem::take(&mut self.active);
        let hollow = self.window.hollow();
        let window = std::mem::replace(&mut self.window, hollow);
        *self.plan.sweep_window.borrow_mut() = Some(window);
    }
}

/// Jobs of whole nodes only (see [`Cluster::needs_whole_nodes`]): which nodes are wholly free
/// for a run is all `find` reads, so the search moves a bit per node forward rather than a
/// copy of every GPU. A node is wholly free for a run from `t` when the releases by `t` leave
/// it so (`NodeBounds::became_whole`) and no plan overlapping the run holds any of its GPUs
/// (counted per node as plans come to overlap the run and stop).
struct WholeSweep<'p> {
    plan: &'p Plan,
    base: &'p Cluster,
    bounds: Ref<'p, NodeBounds>,
    next_became: usize,
    fresh: bool,
    /// Borrowed from the plan for the search and given back clean.
    counts: WholeCounts,
    next_hold: usize,
    /// The overlapping plans, by end.
    active: BinaryHeap<Reverse<(UnixSeconds, usize)>>,
}

/// A whole-node search's state per node. `holders` and `held` are all zero between searches
/// (a search clears what its overlapping plans still hold when it ends).
#[derive(Clone, Debug, Default)]
struct WholeCounts {
    /// Per node, how many plans overlapping the run hold some of its GPUs.
    holders: Vec<u32>,
    /// The nodes some overlapping plan holds, a bit per node.
    held: Vec<u64>,
    /// The nodes the releases up to the time tried leave wholly free, a bit per node.
    released: Vec<u64>,
    /// `released` less `held`: what `find` reads.
    whole: Vec<u64>,
}

impl WholeCounts {
    /// One more overlapping plan holds GPUs of `node`.
    fn hold(&mut self, node: usize) {
        self.holders[node] += 1;
        self.held[node / 64] |= 1 << (node % 64);
    }

    /// One plan holding GPUs of `node` no longer overlaps.
    fn lift(&mut self, node: usize) {
        self.holders[node] -= 1;
        if self.holders[node] == 0 {
            self.held[node / 64] &= !(1 << (node % 64));
        }
    }
}

impl<'p> WholeSweep<'p> {
    fn new(plan: &'p Plan, cluster: &'p Cluster) -> Self {
        let words = cluster.whole_nodes().nodes.len();
        let counts = plan
            .whole_counts
            .borrow_mut()
            .take()
            .filter(|c| c.holders.len() == cluster.node_count())
            .unwrap_or_else(|| WholeCounts {
                holders: vec![0; cluster.node_count()],
                held: vec![0; words],
                released: vec![0; words],
                whole: vec![0; words],
            });
        WholeSweep {
            plan,
            base: cluster,
            bounds: plan.bounds(cluster),
            next_became: 0,
            fresh: true,
            counts,
            next_hold: 0,
            active: std::mem::take(&mut *plan.sweep_active.borrow_mut()),
        }
    }

    fn at(&mut self, t: UnixSeconds, end: UnixSeconds) -> WholeNodes<'_> {
        let counts = &mut self.counts;
        let bounds = &*self.bounds;
        if std::mem::take(&mut self.fresh) {
            let due = bounds.became_whole.partition_point(|(at, _)| *at <= t);
            let taken = due / bounds.whole_every;
            let from = match taken.checked_sub(1) {
                Some(k) => &bounds.whole_after[k],
                None => self.base.whole_nodes().nodes,
            };
            counts.released.copy_from_slice(from);
            self.next_became = taken * bounds.whole_every;
        }
        while let Some(&Reverse((ends, k))) = self.active.peek() {
            if ends > t {
                break;
            }
            self.active.pop();
            self.plan.holds[k]
                .nodes()
                .for_each(|node| counts.lift(node));
        }
        while let Some(&(at, node)) = bounds.became_whole.get(self.next_became) {
            if at > t {
                break;
            }
            counts.released[node / 64] |= 1 << (node % 64);
            self.next_became += 1;
        }
        while let Some(hold) = self.plan.holds.get(self.next_hold) {
            if hold.start >= end {
                break;
            }
            if hold.end > t {
                hold.nodes().for_each(|node| counts.hold(node));
                self.active.push(Reverse((hold.end, self.next_hold)));
            }
            self.next_hold += 1;
        }
        let words = counts
            .whole
            .iter_mut()
            .zip(&counts.released)
            .zip(&counts.held);
        for ((whole, released), held) in words {
            *whole = released & !held;
        }
        WholeNodes {
            nodes: &counts.whole,
            gpus: self.base.gpus_of(&counts.whole),
        }
    }
}

impl Drop for WholeSweep<'_> {
    /// Clears what the plans still overlapping hold (the nodes with a holder are the ones
    /// `held` has, without reading the plans again) and gives the counts and the emptied heap
    /// back to the plan.
    fn drop(&mut self) {
        let mut counts = std::mem::take(&mut self.counts);
        self.active.clear();
        for (w, word) in counts.held.iter_mut().enumerate() {
            for b in set_bits(std::mem::take(word)) {
                counts.holders[w * 64 + b] = 0;
            }
        }
        *self.plan.whole_counts.borrow_mut() = Some(counts);
        *self.plan.sweep_active.borrow_mut() = std::mem::take(&mut self.active);
    }
}

/// Whether `release` gives back GPUs of a type in `types` (a [`Cluster::type_mask`]): a
/// typed search tries only the releases that do.
fn gives_back_some_of(cluster: &Cluster, release: &Release, types: u64) -> bool {
    types == u64::MAX
        || release
            .placement()
            .0
            .iter()
            .any(|s| cluster.type_bit(s.node) & types != 0)
}

/// Where `mask`'s bits form one run: (its lowest bit, how many).
fn run_of(mask: u64) -> Option<(usize, usize)> {
    if mask == 0 {
        return None;
    }
    let from = mask.trailing_zeros();
    let shifted = mask >> from;
    (shifted & shifted.wrapping_add(1) == 0).then(|| (from as usize, mask.count_ones() as usize))
}

/// Two sorted sequences as one sorted sequence (ties: the first's item first).
fn merge_sorted_by<T, K: Ord>(
    a: impl Iterator<Item = T>,
    b: impl Iterator<Item = T>,
    key: impl Fn(&T) -> K,
) -> impl Iterator<Item = T> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if key(y) < key(x) => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

fn merge_sorted(
    a: impl Iterator<Item = UnixSeconds>,
    b: impl Iterator<Item = UnixSeconds>,
) -> impl Iterator<Item = UnixSeconds> {
    merge_sorted_by(a, b, |t| *t)
}

/// Whole GPUs free at most, as a step function of time: `(from, count)`, sorted, the
/// first at the plan's now; worked out from the cluster with stamp `stamp`.
#[derive(Clone, Debug)]
struct FreeProfile {
    stamp: Stamp,
    steps: Vec<(UnixSeconds, i64)>,
}

impl FreeProfile {
    /// Takes a plan's GPUs off the count while it runs.
    fn plan(&mut self, now: UnixSeconds, hold: &Hold) {
        if hold.end <= now {
            return;
        }
        let from = self.step_at(hold.start.max(now));
        let until = self.step_at(hold.end);
        for step in &mut self.steps[from..until] {
            step.1 -= i64::from(hold.whole_gpus);
        }
    }

    /// The index of the step that starts at `at` (not before the first), split off the
    /// step running then when there is none.
    fn step_at(&mut self, at: UnixSeconds) -> usize {
        let k = self.steps.partition_point(|s| s.0 <= at);
        // Never before the first: plans are cut at now.
        let Some(j) = k.checked_sub(1) else {
            return 0;
        };
        if self.steps[j].0 == at {
            return j;
        }
        let count = self.steps[j].1;
        self.steps.insert(k, (at, count));
        k
    }
}

/// When too few GPUs are free for one job size: the stretches of a free count's steps below
/// `gpus`, found as a search's rising start times reach them. A search usually ends within
/// the first few of hundreds of steps, so it does not walk them all.
struct LowStretches<'p> {
    steps: Ref<'p, [(UnixSeconds, i64)]>,
    gpus: i64,
    /// Steps before this one have been looked at.
    scanned: usize,
    /// The last stretch found, `[from, until)`.
    next: Option<(UnixSeconds, UnixSeconds)>,
}

impl LowStretches<'_> {
    /// Where the count falls too low somewhere in `[start, end)`: the end of that low stretch
    /// (a job starting before then fails too), or `None` when it never does. `start` must not
    /// fall from one call to the next.
    fn within(&mut self, start: UnixSeconds, end: UnixSeconds) -> Option<UnixSeconds> {
        loop {
            if let Some((from, until)) = self.next.filter(|s| s.1 > start) {
                return (from < end).then_some(until);
            }
            self.next = Some(self.next_stretch()?);
        }
    }

    /// The next stretch of steps below `gpus`, after those found so far.
    fn next_stretch(&mut self) -> Option<(UnixSeconds, UnixSeconds)> {
        let steps = &self.steps[self.scanned..];
        let Some(low) = steps.iter().position(|s| s.1 < self.gpus) else {
            self.scanned += steps.len();
            return None;
        };
        let high = steps[low..]
            .iter()
            .position(|s| s.1 >= self.gpus)
            .map_or(steps.len(), |k| low + k);
        let stretch = (
            steps[low].0,
            steps.get(high).map_or(UnixSeconds::MAX, |s| s.0),
        );
        self.scanned += high;
        Some(stretch)
    }

    /// Every stretch (tests).
    #[cfg(test)]
    fn all(mut self) -> Vec<(UnixSeconds, UnixSeconds)> {
        std::iter::from_fn(|| self.next_stretch()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{AccountId, GpuModel};
    use proptest::prelude::*;

    use crate::cluster::tests::node;
    use crate::cluster::NodeFilter;

    /// The node bound worked out for one size on its own, walking the releases.
    fn node_bound_reference(plan: &Plan, cluster: &Cluster, gpus: u32) -> UnixSeconds {
        let one_node = gpus <= cluster.gpus_per_node_max();
        let mut free: Vec<u64> = (0..cluster.node_count())
            .map(|n| cluster.free_mask(n))
            .collect();
        let whole = |free: &[u64]| -> u32 {
            free.iter()
                .enumerate()
                .filter(|(n, m)| **m == cluster.full_mask(*n))
                .map(|(_, m)| m.count_ones())
                .sum()
        };
        let fits = |free: &[u64]| {
            (one_node && free.iter().any(|m| m.count_ones() >= gpus)) || whole(free) >= gpus
        };
        if fits(&free) {
            return plan.now;
        }
        for release in &plan.releases {
            for slot in &release.placement().0 {
                free[slot.node] |= slot.mask;
                if fits(&free) {
                    return release.at.max(plan.now);
                }
            }
        }
        UnixSeconds::MAX
    }

    /// The free count worked out afresh, every release and plan sorted in by time.
    fn free_profile_reference(plan: &Plan, cluster: &Cluster) -> FreeProfile {
        let mut deltas: Vec<(UnixSeconds, i64)> = plan
            .releases
            .iter()
            .map(|r| (r.at.max(plan.now), r.gpus))
            .collect();
        for h in plan.holds.iter().filter(|h| h.end > plan.now) {
            deltas.push((h.start.max(plan.now), -i64::from(h.whole_gpus)));
            deltas.push((h.end, i64::from(h.whole_gpus)));
        }
        deltas.sort_by_key(|d| d.0);
        let mut steps = vec![(plan.now, i64::from(cluster.free_gpus()))];
        for (at, delta) in deltas {
            let value = steps.last().map_or(0, |s| s.1) + delta;
            match steps.last_mut() {
                Some(last) if last.0 == at => last.1 = value,
                _ => steps.push((at, value)),
            }
        }
        FreeProfile {
            stamp: cluster.stamp(),
            steps,
        }
    }

    /// The stretches below `gpus`, walking every step.
    fn below_reference(profile: &FreeProfile, gpus: u32) -> Vec<(UnixSeconds, UnixSeconds)> {
        let mut stretches: Vec<(UnixSeconds, UnixSeconds)> = Vec::new();
        for (k, (from, count)) in profile.steps.iter().enumerate() {
            if *count >= i64::from(gpus) {
                continue;
            }
            let until = profile.steps.get(k + 1).map_or(UnixSeconds::MAX, |s| s.0);
            match stretches.last_mut() {
                Some(last) if last.1 == *from => last.1 = until,
                _ => stretches.push((*from, until)),
            }
        }
        stretches
    }

    /// `LowStretches::within` looked up in the whole list of stretches.
    fn within_reference(
        stretches: &[(UnixSeconds, UnixSeconds)],
        start: UnixSeconds,
        end: UnixSeconds,
    ) -> Option<UnixSeconds> {
        let first = stretches.partition_point(|s| s.1 <= start);
        stretches.get(first).filter(|s| s.0 < end).map(|s| s.1)
    }

    #[test]
    fn runs_of_bits_are_found_and_gaps_are_not() {
        assert_eq!(run_of(0), None);
        assert_eq!(run_of(0b1), Some((0, 1)));
        assert_eq!(run_of(0b1111_0000), Some((4, 4)));
        assert_eq!(run_of(u64::MAX), Some((0, 64)));
        assert_eq!(run_of(u64::MAX << 63), Some((63, 1)));
        assert_eq!(run_of(0b1011), None);
        assert_eq!(run_of(1 | 1 << 63), None);
    }

    proptest! {
        /// Jobs of whole nodes on clusters large enough that their searches start from the
        /// copies of which nodes are wholly free taken along the releases (`whole_after`),
        /// with plans of one node and of several held: every search finds the start and the
        /// nodes that a copy of the whole cluster per time tried finds.
        #[test]
        fn whole_node_searches_find_what_copies_of_the_cluster_find(
            node_count in 130usize..300,
            mixed in any::<bool>(),
            seed in any::<u64>(),
            queries in proptest::collection::vec((9u32..100, 1i64..60, 0i64..3_000), 1..12),
        ) {
            let mut rng = gpuledger_model::rng::SplitMix64::new(seed);
            let nodes = (0..node_count)
                .map(|i| node(i, if mixed && i % 3 == 0 { 4 } else { 8 }, GpuModel::H100Sxm))
                .collect();
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            let mut cluster = Cluster::new(nodes);
            // Most nodes run one or two jobs that end at different times; a few are free.
            let mut releases = Vec::new();
            for node in 0..node_count {
                let all = cluster.full_mask(node);
                let parts = match rng.range_u64(0, 9) {
                    0 => vec![],
                    1..=5 => vec![all],
                    _ => vec![all & 0b11, all & !0b11],
                };
                for mask in parts {
                    let p = Placement(smallvec::smallvec![Slot::whole(node, mask)]);
                    cluster.take(&p);
                    let at = rng.range_u64(1, 300) as i64 * 10;
                    releases.push((at, JobId::new(format!("r{}", releases.len())).unwrap(), p));
                }
            }
            // Plans as the planner makes them (the free count's bound assumes plans running
            // at the same time hold GPUs apart, free when they start): jobs of one node and of
            // several, each at the earliest start a copy of the cluster per time finds.
            let mut plan = Plan::new(0, releases, Vec::new());
            let shape = Shape::default();
            for k in 0..rng.range_u64(0, 40) {
                let gpus = rng.range_u64(1, 40) as u32;
                let limit = rng.range_u64(1, 150) * 10;
                let search = Search { prune: false, ..Search::from(rng.range_u64(0, 2_000) as i64) };
                let found = plan.earliest(&cluster, gpus, &shape, limit, search, |w, _| {
                    w.find(gpus, &a, &any, &shape)
                });
                if let Some((t, p)) = found {
                    let id = JobId::new(format!("h{k}")).unwrap();
                    plan.hold(id, t, t + limit as i64, p, &cluster);
                }
            }
            for (gpus, limit, from) in queries {
                let found: Vec<Option<(UnixSeconds, Placement)>> = [true, false]
                    .into_iter()
                    .map(|prune| {
                        let search = Search { prune, ..Search::from(from) };
                        plan.earliest(&cluster, gpus, &shape, limit as u64 * 10, search, |w, _| {
                            w.find(gpus, &a, &any, &shape)
                        })
                    })
                    .collect();
                prop_assert_eq!(&found[0], &found[1], "{} GPUs from {}", gpus, from);
            }
        }
    }

    /// The earliest start from `from` on, the plain way: for every time a search may try, a copy
    /// of the cluster now with every release due by then given back and every plan overlapping
    /// the run held.
    fn earliest_from_now(
        plan: &Plan,
        cluster: &Cluster,
        from: UnixSeconds,
        limit_s: i64,
        find: impl Fn(&Cluster) -> Option<Placement>,
    ) -> Option<(UnixSeconds, Placement)> {
        let mut times: Vec<UnixSeconds> = std::iter::once(plan.now)
            .chain(plan.releases.iter().map(|r| r.at.max(plan.now)))
            .chain(plan.holds.iter().map(|h| h.end))
            .filter(|t| *t >= plan.now.max(from))
            .collect();
        times.sort_unstable();
        times.dedup();
        times.into_iter().find_map(|t| {
            let mut window = cluster.clone();
            for r in plan.releases.iter().filter(|r| r.at <= t) {
                window.release(r.placement());
            }
            for h in plan.holds.iter().filter(|h| h.overlaps(t, t + limit_s)) {
                window.hold(&h.placement);
            }
            find(&window).map(|p| (t, p))
        })
    }

    #[test]
    fn gpus_free_for_a_run_from_now_leave_out_plans_of_no_length_and_count_the_earliest() {
        // One 4-GPU node, all free at 0. A plan of no length at 0 holds GPU 0 (it ends by now,
        // overlapping no run); GPU 1 is held from 300, then also from 100; GPU 2 from 500.
        let nodes = vec![node(0, 4, GpuModel::H100Sxm)];
        let cluster = Cluster::new(nodes);
        let on = |mask: u64| Placement(smallvec::smallvec![Slot::whole(0, mask)]);
        let id = |s: &str| JobId::new(s).unwrap();
        let expect = |plan: &Plan, limits: [(u64, u32); 4]| {
            for (limit, free) in limits {
                let afresh = plan
                    .window_holding(&cluster, limit as i64, None)
                    .free_gpus();
                assert_eq!(afresh, free, "the window itself, {limit} s");
                assert_eq!(plan.free_now_for(&cluster, limit), Some(free), "{limit} s");
            }
        };
        let all = [(50, 4), (200, 3), (400, 3), (600, 2)];
        let plans = [
            ("z", 0, 0, 0b1),
            ("late", 300, 900, 0b10),
            ("early", 100, 150, 0b10),
            ("p2", 500, 900, 0b100),
        ];
        let planned = |asked_first: bool| {
            let mut plan = Plan::new(0, Vec::new(), Vec::new());
            if asked_first {
                assert_eq!(plan.free_now_for(&cluster, 50), Some(4));
            }
            for (job, start, end, mask) in plans {
                plan.hold(id(job), start, end, on(mask), &cluster);
            }
            plan
        };
        // Counted afresh from the plans, and counted as they come (asked before any).
        expect(&planned(false), all);
        let mut kept = planned(true);
        expect(&kept, all);
        // The earlier plan gone, GPU 1 is held from 300 again.
        kept.forget(&id("early"));
        expect(&kept, [(50, 4), (200, 4), (400, 3), (600, 2)]);
    }

    #[test]
    fn a_search_holds_the_plans_overlapping_each_time_it_tries() {
        // Three 1-GPU nodes: n2 runs a job until 100; one plan holds n0 over [0, 50), another
        // n1 over [50, 200). Two GPUs for 10 s: at 0 only n1 is free, at 50 only n0 (one plan
        // overlapping either time, not the same one), at 100 n0 and n2.
        let nodes = (0..3).map(|i| node(i, 1, GpuModel::H100Sxm)).collect();
        let (a, any) = (AccountId::new("a").unwrap(), NodeFilter::none());
        let mut cluster = Cluster::new(nodes);
        let on = |n: usize| Placement(smallvec::smallvec![Slot::whole(n, 1)]);
        cluster.take(&on(2));
        let mut plan = Plan::new(0, vec![(100, JobId::new("r").unwrap(), on(2))], Vec::new());
        plan.hold(JobId::new("p0").unwrap(), 0, 50, on(0), &cluster);
        plan.hold(JobId::new("p1").unwrap(), 50, 200, on(1), &cluster);
        let shape = Shape::default();
        let search = Search {
            prune: false,
            ..Search::from(0)
        };
        let found = plan.earliest(&cluster, 2, &shape, 10, search, |w, _| {
            w.find(2, &a, &any, &shape)
        });
        let (t, placement) = found.unwrap();
        assert_eq!(t, 100);
        let nodes: Vec<usize> = placement.0.iter().map(|s| s.node).collect();
        assert_eq!(nodes, [0, 2]);
    }

    proptest! {
        /// Where parts of GPUs run, a search copies the cluster for every time it tries,
        /// brought forward from the last checkpoint of the releases before the first: it finds
        /// the start and the GPUs that copies brought forward from now find.
        #[test]
        fn searches_among_shares_from_a_checkpoint_find_what_copies_from_now_find(
            node_count in 3usize..12,
            seed in any::<u64>(),
            queries in proptest::collection::vec((0u32..6, 1i64..60, 0i64..2_000), 1..10),
        ) {
            let mut rng = gpuledger_model::rng::SplitMix64::new(seed);
            let nodes = (0..node_count).map(|i| node(i, 4, GpuModel::H100Sxm)).collect();
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            let shape_of = |kind: u32| match kind {
                0 => Shape { gpu_share: Some("250m".parse().unwrap()), ..Shape::default() },
                1 => Shape { gpu_share: Some("500m".parse().unwrap()), ..Shape::default() },
                _ => Shape::default(),
            };
            let gpus_of = |kind: u32| kind.saturating_sub(1).max(1);
            let mut cluster = Cluster::new(nodes);
            // Enough running jobs, whole GPUs and parts, for several checkpoints.
            let mut releases = Vec::new();
            for k in 0..node_count * 5 {
                let kind = rng.range_u64(0, 5) as u32;
                let shape = shape_of(kind);
                if let Some(p) = cluster.find(gpus_of(kind), &a, &any, &shape) {
                    cluster.take(&p);
                    let at = rng.range_u64(1, 300) as i64 * 10;
                    releases.push((at, JobId::new(format!("r{k}")).unwrap(), p));
                }
            }
            let mut plan = Plan::new(0, releases, Vec::new());
            prop_assume!(plan.has_shares());
            // Up to 30 plans from all over the first 2,000 s: runs tried later overlap other
            // plans than runs tried earlier.
            for k in 0..rng.range_u64(0, 30) {
                let kind = rng.range_u64(0, 5) as u32;
                let (gpus, shape) = (gpus_of(kind), shape_of(kind));
                let limit = rng.range_u64(1, 150) * 10;
                let from = rng.range_u64(0, 2_000) as i64;
                let search = Search { prune: false, ..Search::from(from) };
                let found = plan.earliest(&cluster, gpus, &shape, limit, search, |w, _| {
                    w.find(gpus, &a, &any, &shape)
                });
                if let Some((t, p)) = found {
                    plan.hold(JobId::new(format!("h{k}")).unwrap(), t, t + limit as i64, p, &cluster);
                }
            }
            for (kind, limit, from) in queries {
                let (gpus, shape) = (gpus_of(kind), shape_of(kind));
                let limit = limit * 10;
                let expected = earliest_from_now(&plan, &cluster, from, limit, |w| {
                    w.find(gpus, &a, &any, &shape)
                });
                for prune in [true, false] {
                    let search = Search { prune, ..Search::from(from) };
                    let found = plan.earliest(&cluster, gpus, &shape, limit as u64, search, |w, _| {
                        w.find(gpus, &a, &any, &shape)
                    });
                    prop_assert_eq!(&found, &expected, "{} GPUs of kind {}", gpus, kind);
                }
            }
        }
    }

    proptest! {
        /// The free-count profile, the node bound and the releases on nodes of other types
        /// only skip times where placement fails: with and without them, every plan of a
        /// random queue on a random cluster of two GPU types starts at the same time on the
        /// same GPUs.
        #[test]
        fn pruning_never_changes_a_plan(
            node_gpus in proptest::collection::vec((prop_oneof![Just(4u32), Just(8)], any::<bool>()), 2..6),
            running in proptest::collection::vec((1u32..9, 1i64..40), 0..20),
            queue in proptest::collection::vec((1u32..20, 1u64..30, any::<bool>(), 0u8..4, 0u8..3), 1..25),
        ) {
            let nodes = node_gpus
                .iter()
                .enumerate()
                .map(|(i, (g, a100))| {
                    node(i, *g, if *a100 { GpuModel::A100 } else { GpuModel::H100Sxm })
                })
                .collect();
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            let mut cluster = Cluster::new(nodes);
            let mut releases = Vec::new();
            for (k, (gpus, ends)) in running.iter().enumerate() {
                if let Some(p) = cluster.find(*gpus, &a, &any, &Shape::default()) {
                    cluster.take(&p);
                    releases.push((ends * 100, JobId::new(format!("r{k}")).unwrap(), p));
                }
            }
            let mut plans = [Plan::new(0, releases.clone(), Vec::new()), Plan::new(0, releases, Vec::new())];
            for (k, (gpus, limit, per_node, event, typed)) in queue.iter().enumerate() {
                for g in 1..=20 {
                    prop_assert_eq!(
                        plans[0].node_bound(&cluster, g),
                        node_bound_reference(&plans[0], &cluster, g),
                        "node bound of {} GPUs before job {}", g, k
                    );
                    // The kept free count, brought up to date as plans are added, is the
                    // one worked out afresh.
                    prop_assert_eq!(
                        plans[0].low_stretches(&cluster, g).all(),
                        below_reference(&free_profile_reference(&plans[0], &cluster), g),
                        "free count below {} GPUs before job {}", g, k
                    );
                    // Read lazily for rising start times, as a search does.
                    let stretches = below_reference(&free_profile_reference(&plans[0], &cluster), g);
                    let mut low = plans[0].low_stretches(&cluster, g);
                    for start in (0..4_000).step_by(70 + 13 * g as usize) {
                        let end = start + 50 * i64::from(g) + 30 * k as i64;
                        prop_assert_eq!(
                            low.within(start, end),
                            within_reference(&stretches, start, end),
                            "low stretch within [{}, {}) for {} GPUs before job {}", start, end, g, k
                        );
                    }
                }
                // The window of a job starting now, from the copies of the first plans held,
                // is the cluster with every overlapping plan but the job's own held afresh.
                for (limit, of) in [(50, k), (450, k), (1_500, k / 2), (1_000_000, k)] {
                    let id = JobId::new(format!("q{of}")).unwrap();
                    let end = plans[0].now + limit as i64;
                    let afresh = plans[0].window_holding(&cluster, end, Some(&id));
                    prop_assert!(
                        plans[0].with_window_now(&cluster, limit, Some(&id), |w| w.same_free(&afresh)),
                        "window of q{} for {} s before job {}", of, limit, k
                    );
                    // For a job the caller knows holds no plan, nothing is left out.
                    let everyone = plans[0].window_holding(&cluster, end, None);
                    prop_assert!(
                        plans[0].with_window_now(&cluster, limit, None, |w| w.same_free(&everyone)),
                        "window of a job without a plan for {} s before job {}", limit, k
                    );
                    // Its free GPUs are counted without it, as plans come and go and the
                    // cluster changes.
                    prop_assert_eq!(
                        plans[0].free_now_for(&cluster, limit),
                        (!plans[0].shares).then(|| everyone.free_gpus()),
                        "GPUs free for a run of {} s before job {}", limit, k
                    );
                }
                // Sometimes a plan is dropped (its job started elsewhere or left).
                if *event == 3 && k > 0 {
                    let gone = JobId::new(format!("q{}", (k * 7 + 3) % k)).unwrap();
                    for plan in plans.iter_mut() {
                        plan.forget(&gone);
                    }
                }
                // Sometimes a GPU no plan holds is taken behind the plan's back, as by a
                // job the plan does not know of (the bound follows the cluster, not only the
                // plan's own changes).
                if *event == 2 {
                    let outside = JobId::new("outside").unwrap();
                    let found = plans[0].with_window_now(&cluster, 1_000_000, Some(&outside), |w| {
                        w.find(1, &a, &any, &Shape::default())
                    });
                    if let Some(p) = found {
                        cluster.take(&p);
                    }
                }
                // Sometimes a running job is told to end earlier (as a preempted one is).
                if *event == 0 {
                    if let Some(r) = plans[0].releases.get(k % plans[0].releases.len().max(1)).cloned() {
                        for plan in plans.iter_mut() {
                            plan.released_at(r.job(), r.at / 2, r.placement().clone());
                        }
                    }
                }
                let shape = Shape {
                    gpus_per_node: (*per_node && gpus % 2 == 0).then_some(2),
                    gpu_types: match typed {
                        0 => Vec::new(),
                        1 => vec![GpuModel::A100.into()],
                        _ => vec![GpuModel::H100Sxm.into()],
                    },
                    ..Shape::default()
                };
                let limit = limit * 100;
                let found: Vec<Option<(UnixSeconds, Placement)>> = plans
                    .iter()
                    .zip([true, false])
                    .map(|(plan, prune)| {
                        plan.earliest(&cluster, *gpus, &shape, limit, Search { prune, ..Search::from(UnixSeconds::MIN) }, |c, _| {
                            c.find(*gpus, &a, &any, &shape)
                        })
                    })
                    .collect();
                prop_assert_eq!(&found[0], &found[1], "job {} of {} GPUs", k, gpus);
                if let Some((t, p)) = found[0].clone() {
                    let id = JobId::new(format!("q{k}")).unwrap();
                    let starts_now = t == 0 && *event == 1 && cluster.is_free(&p);
                    for plan in plans.iter_mut() {
                        if starts_now {
                            plan.started(id.clone(), t + limit as i64, p.clone());
                        } else {
                            plan.hold(id.clone(), t, t + limit as i64, p.clone(), &cluster);
                        }
                    }
                    if starts_now {
                        cluster.take(&p);
                    }
                }
            }
        }
    }
}
