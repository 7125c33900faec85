//! Node-granular placement. Jobs of up to one node's GPUs are packed best-fit onto the fullest
//! node that still fits them, which keeps whole nodes free for multi-node jobs; multi-node jobs
//! take whole free nodes (the largest first on a cluster of mixed node sizes, so a job spans
//! as few nodes as it can). A job's [`Shape`] narrows that: GPUs per node (best-fit nodes with
//! that many free), at most so many nodes, only some GPU models. Which nodes a job may use at
//! all (dedicated pools, advance reservations) is a [`NodeFilter`] worked out by the caller.
//!
//! A job may ask for a part of one GPU instead ([`GpuShare`]: thousandths of its time, or a
//! MIG instance): it goes best fit onto the GPU of the same sharing mode with the least room
//! that still holds it, else onto a free GPU of the fullest node, so shares pack onto few GPUs
//! and whole GPUs stay whole.
//!
//! The node specs are shared (`Arc`), so a copy of the cluster for planning (backfill, trial
//! preemption) costs one `u64` per node, plus one entry per GPU held in shares.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use smallvec::{smallvec, SmallVec};

use gpuledger_model::config::NodeSpec;
use gpuledger_model::{
    AccountId, Allocation, GpuShare, GpuType, NodeGpus, ShareMode, SHARE_UNITS_PER_GPU,
};

/// GPUs held on one node, as a bit mask of GPU indices; or, with `share`, a part of the one
/// GPU in the mask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub node: usize,
    pub mask: u64,
    pub share: Option<GpuShare>,
}

impl Slot {
    /// Whole GPUs on `node`.
    pub fn whole(node: usize, mask: u64) -> Self {
        Slot {
            node,
            mask,
            share: None,
        }
    }
}

/// The GPUs a job holds, by node index. Most jobs hold one node: its slot is kept inline, so
/// that a search's placements and the plans' copies of them allocate nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement(pub Slots);

/// A placement's slots.
pub type Slots = SmallVec<[Slot; 1]>;

impl From<Vec<Slot>> for Placement {
    fn from(slots: Vec<Slot>) -> Self {
        Placement(Slots::from_vec(slots))
    }
}

impl Placement {
    pub fn gpu_count(&self) -> u32 {
        self.0.iter().map(|s| s.mask.count_ones()).sum()
    }

    /// Whether it holds a part of a GPU.
    pub fn has_share(&self) -> bool {
        self.0.iter().any(|s| s.share.is_some())
    }

    /// What it holds in share units ([`SHARE_UNITS_PER_GPU`] to a GPU).
    pub fn share_units(&self) -> u64 {
        self.0
            .iter()
            .map(|s| match s.share {
                Some(share) => u64::from(share.units()),
                None => u64::from(s.mask.count_ones()) * u64::from(SHARE_UNITS_PER_GPU),
            })
            .sum()
    }

    /// What it holds in GPUs, a part of a GPU as its fraction (fair-share usage).
    pub fn gpu_equivalent(&self) -> f64 {
        self.share_units() as f64 / f64::from(SHARE_UNITS_PER_GPU)
    }

    /// Adds GPUs to the placement (an elastic job growing).
    pub fn extend(&mut self, more: &Placement) {
        for slot in &more.0 {
            match self.0.iter_mut().find(|s| s.node == slot.node) {
                Some(s) => s.mask |= slot.mask,
                None => self.0.push(slot.clone()),
            }
        }
    }

    /// Removes GPUs until `keep` remain, last slots first, and returns what was removed (an
    /// elastic job shrinking). Whole slots go first, so a multi-node job gives back whole nodes.
    pub fn shrink_to(&mut self, keep: u32) -> Placement {
        let mut removed = Slots::new();
        let mut excess = self.gpu_count().saturating_sub(keep);
        while excess > 0 {
            let Some(last) = self.0.last_mut() else { break };
            let n = last.mask.count_ones();
            if n <= excess {
                excess -= n;
                if let Some(slot) = self.0.pop() {
                    removed.push(slot);
                }
            } else {
                let give = highest_bits(last.mask, excess);
                last.mask &= !give;
                removed.push(Slot::whole(last.node, give));
                excess = 0;
            }
        }
        Placement(removed)
    }

    fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().map(|s| s.node)
    }
}

/// Nodes a job may not use (dedicated to another account, reserved for others in its window).
/// Empty means every node is allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFilter {
    blocked: Vec<bool>,
}

impl NodeFilter {
    pub fn none() -> Self {
        NodeFilter::default()
    }

    pub fn block(&mut self, node: usize, node_count: usize) {
        if self.blocked.is_empty() {
            self.blocked = vec![false; node_count];
        }
        self.blocked[node] = true;
    }

    pub fn allows(&self, node: usize) -> bool {
        !self.blocked.get(node).copied().unwrap_or(false)
    }

    pub fn is_empty(&self) -> bool {
        !self.blocked.iter().any(|b| *b)
    }
}

/// Where a job's GPUs may be: how many on each node, over how many nodes, and of which GPU
/// types (Slurm's `--gpus-per-node`, `--nodes` and `--gres=gpu:TYPE:N`). The default asks
/// nothing: one node when the job fits one, else whole free nodes, the largest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Exactly this many GPUs on each node the job uses (its GPUs a multiple of it).
    pub gpus_per_node: Option<u32>,
    /// At most this many nodes.
    pub max_nodes: Option<u32>,
    /// Only GPUs of these types (any when empty): models' keys, or the types node pools name.
    pub gpu_types: Vec<GpuType>,
    /// A part of one GPU instead of whole GPUs (the job asks for one GPU).
    pub gpu_share: Option<GpuShare>,
}

impl Shape {
    /// Whether the job may use a GPU of type `gpu_type`.
    pub fn allows_type(&self, gpu_type: &GpuType) -> bool {
        self.gpu_types.is_empty() || self.gpu_types.contains(gpu_type)
    }

    /// Whether it fixes how its GPUs spread over nodes.
    pub fn fixes_layout(&self) -> bool {
        self.gpus_per_node.is_some() || self.max_nodes.is_some()
    }
}

/// A GPU held in parts: by shares of one mode, `used` share units of it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SharedGpu {
    node: usize,
    gpu: u32,
    mode: ShareMode,
    used: u32,
}

impl SharedGpu {
    fn room(&self) -> u32 {
        SHARE_UNITS_PER_GPU - self.used
    }
}

#[derive(Clone, Debug)]
struct NodeMeta {
    spec: NodeSpec,
    all: u64,
    /// Its GPU type as one bit: the type's index in `NodeFacts::types`.
    type_bit: u64,
}

pub use gpuledger_model::config::MAX_GPU_TYPES;

/// What the node set is, worked out once: one per cluster, shared by its copies.
#[derive(Debug)]
struct NodeFacts {
    /// Where nodes differ in size, the nodes of each size as a bit per node, the largest size
    /// first: whole-node placement takes the largest free nodes first (ties in node order),
    /// visiting only the wholly free ones. Empty on a uniform cluster.
    by_size: Vec<(u32, Vec<u64>)>,
    /// The GPU types the nodes have, in the order first met.
    types: Vec<GpuType>,
    /// The nodes of each type, in node order: the one-node search of a job asking for some
    /// types walks those (walking `type_bits` instead took a third more instructions in
    /// `Cluster::find` on the Alibaba-like replay).
    nodes_of_type: Vec<Vec<usize>>,
    /// The same as a bit per node: a whole-node search of a job asking for some types visits
    /// the wholly free nodes of those types only.
    type_bits: Vec<Vec<u64>>,
    gpus_per_node_max: u32,
    total_gpus: u32,
    /// Every node's GPUs as a mask, in one array (read per node by the planner's bounds,
    /// where a node's whole description is a cache line or more).
    full_masks: Vec<u64>,
}

impl NodeFacts {
    /// Whether every node has as many GPUs (whole-node placement need not prefer any).
    fn uniform(&self) -> bool {
        self.by_size.is_empty()
    }
}

/// Free and held GPUs of every node.
#[derive(Debug)]
pub struct Cluster {
    /// Each node, read per node by every search (kept apart from `facts` for one load less).
    meta: Arc<[NodeMeta]>,
    facts: Arc<NodeFacts>,
    /// Free whole GPUs of each type (written only through `set_free`) where there are two
    /// types or more: a search of a job asking for some types skips the times when too few
    /// of those are free. Empty for one type (then `free_count`, kept without a second write
    /// on the hot path).
    free_by_type: Vec<u32>,
    /// GPUs no job holds any part of.
    free: Vec<u64>,
    /// How many bits of each node's `free` are set (read per node by every placement
    /// search; written only through `set_free`).
    free_on: Vec<u8>,
    /// How many nodes have each number of GPUs free (`free_on` tallied, written only through
    /// `set_free`): whether some node has enough free is read in a few steps, which rules out
    /// most start times a plan search tries for a job of several GPUs on a fragmented cluster
    /// without looking at any node.
    nodes_by_free: Vec<u32>,
    free_count: u32,
    /// The GPUs of nodes with every GPU free (written only through `set_free`): a job that
    /// needs whole nodes cannot fit in fewer, which rules out most start times a plan search
    /// tries for a multi-node job without looking at any node.
    whole_node_gpus: u32,
    /// Which nodes have every GPU free, a bit per node (written only through `set_free`): a
    /// multi-node search visits those rather than every node.
    whole_nodes: Vec<u64>,
    /// GPUs held in parts (their bits are clear in `free`), by node and GPU index.
    shared: Vec<SharedGpu>,
    /// The parts held on `shared`, summed (read at every simulated event).
    shared_used: u64,
    /// What is free, identified: this cluster's own number (every cluster, copy or clone
    /// gets a new one) and how many times what is free changed since. Equal stamps, equal
    /// clusters, so what was worked out from one (a planner's bounds) holds for the other.
    stamp: Stamp,
}

/// The nodes with every GPU free, a bit per node (`nodes[w]`: nodes `64 w..`), and how many
/// GPUs they have.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WholeNodes<'a> {
    pub nodes: &'a [u64],
    pub gpus: u32,
}

/// See [`Cluster::stamp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    cluster: u64,
    changes: u64,
}

impl Stamp {
    fn new() -> Stamp {
        static CLUSTERS: AtomicU64 = AtomicU64::new(0);
        Stamp {
            cluster: CLUSTERS.fetch_add(1, AtomicOrdering::Relaxed),
            changes: 0,
        }
    }
}

impl Clone for Cluster {
    fn clone(&self) -> Self {
        Cluster {
            meta: Arc::clone(&self.meta),
            facts: Arc::clone(&self.facts),
            free_by_type: self.free_by_type.clone(),
            free: self.free.clone(),
            free_on: self.free_on.clone(),
            nodes_by_free: self.nodes_by_free.clone(),
            free_count: self.free_count,
            whole_node_gpus: self.whole_node_gpus,
            whole_nodes: self.whole_nodes.clone(),
            shared: self.shared.clone(),
            shared_used: self.shared_used,
            stamp: Stamp::new(),
        }
    }
}

/// The set bits of every byte.
const ONES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = (i as u8).count_ones() as u8;
        i += 1;
    }
    table
};

/// `mask.count_ones()` by table for nodes of up to 8 GPUs: the build targets baseline x86-64,
/// which has no population count instruction, and plan searches count on every release.
fn ones(mask: u64) -> u32 {
    match usize::try_from(mask) {
        Ok(byte) if byte < ONES.len() => u32::from(ONES[byte]),
        _ => mask.count_ones(),
    }
}

/// A bit set with the first `nodes` bits set.
fn all_nodes(nodes: usize) -> Vec<u64> {
    (0..nodes.div_ceil(64))
        .map(|w| full_mask((nodes - w * 64).min(64) as u32))
        .collect()
}

/// Free GPUs of each of `types` GPU types; none kept for one type.
fn free_by_type(meta: &[NodeMeta], types: usize, free: &[u64]) -> Vec<u32> {
    if types < 2 {
        return Vec::new();
    }
    let mut by_type = vec![0; types];
    for (m, f) in meta.iter().zip(free) {
        by_type[m.type_bit.trailing_zeros() as usize] += f.count_ones();
    }
    by_type
}

/// How many GPUs each mask holds.
fn counts(free: &[u64]) -> Vec<u8> {
    free.iter().map(|m| m.count_ones() as u8).collect()
}

/// How many nodes have each number of GPUs free, from none to `most`.
fn nodes_by_free(free: &[u64], most: u32) -> Vec<u32> {
    let mut tally = vec![0; most as usize + 1];
    for mask in free {
        tally[mask.count_ones() as usize] += 1;
    }
    tally
}

/// The indices of the set bits of `mask`, lowest first.
pub(crate) fn set_bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            b
        })
    })
}

/// The nodes of a set given as `words` words of a bit per node (`word(w)`: nodes `64 w..`),
/// in node order.
fn nodes_where<'a>(
    words: usize,
    word: impl Fn(usize) -> u64 + 'a,
) -> impl Iterator<Item = usize> + 'a {
    (0..words).flat_map(move |w| set_bits(word(w)).map(move |b| w * 64 + b))
}

/// A set of nodes as a bit per node, `nodes` of `count`.
fn node_set(count: usize, nodes: impl Iterator<Item = usize>) -> Vec<u64> {
    let mut bits = vec![0u64; count.div_ceil(64)];
    for idx in nodes {
        bits[idx / 64] |= 1 << (idx % 64);
    }
    bits
}

fn full_mask(gpus: u32) -> u64 {
    if gpus >= 64 {
        u64::MAX
    } else {
        (1u64 << gpus) - 1
    }
}

/// The `n` lowest set bits of `mask`: the lowest-numbered `n` of a node's free GPUs.
pub fn lowest_bits(mask: u64, n: u32) -> u64 {
    let mut out = 0;
    let mut rest = mask;
    for _ in 0..n {
        let bit = rest & rest.wrapping_neg();
        out |= bit;
        rest &= !bit;
    }
    out
}

/// The `n` highest set bits of `mask`.
fn highest_bits(mask: u64, n: u32) -> u64 {
    let mut out = 0;
    let mut rest = mask;
    for _ in 0..n {
        if rest == 0 {
            break;
        }
        let bit = 1u64 << (63 - rest.leading_zeros());
        out |= bit;
        rest &= !bit;
    }
    out
}

impl Cluster {
    /// Panics past [`MAX_GPU_TYPES`] types (a config with more is refused).
    pub fn new(nodes: Vec<NodeSpec>) -> Self {
        let gpus_per_node_max = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
        let mut types: Vec<GpuType> = Vec::new();
        let meta: Arc<[NodeMeta]> = nodes
            .into_iter()
            .map(|spec| {
                let index = match types.iter().position(|t| *t == spec.gpu_type) {
                    Some(i) => i,
                    None => {
                        types.push(spec.gpu_type.clone());
                        types.len() - 1
                    }
                };
                assert!(index < MAX_GPU_TYPES, "more than {MAX_GPU_TYPES} GPU types");
                NodeMeta {
                    all: full_mask(spec.gpus),
                    type_bit: 1 << index,
                    spec,
                }
            })
            .collect();
        let uniform = meta.iter().all(|m| m.spec.gpus == gpus_per_node_max);
        let mut by_size: Vec<(u32, Vec<u64>)> = Vec::new();
        if !uniform {
            let mut sizes: Vec<u32> = meta.iter().map(|m| m.spec.gpus).collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            sizes.dedup();
            by_size = sizes
                .iter()
                .map(|size| {
                    let nodes = (0..meta.len()).filter(|i| meta[*i].spec.gpus == *size);
                    (*size, node_set(meta.len(), nodes))
                })
                .collect();
        }
        let total_gpus = meta.iter().map(|m| m.spec.gpus).sum();
        let nodes_of_type: Vec<Vec<usize>> = (0..types.len())
            .map(|t| {
                (0..meta.len())
                    .filter(|i| meta[*i].type_bit == 1 << t)
                    .collect()
            })
            .collect();
        let type_bits = nodes_of_type
            .iter()
            .map(|nodes| node_set(meta.len(), nodes.iter().copied()))
            .collect();
        let facts = NodeFacts {
            by_size,
            types,
            nodes_of_type,
            type_bits,
            gpus_per_node_max,
            total_gpus,
            full_masks: meta.iter().map(|m| m.all).collect(),
        };
        Self::hollow_of(meta, Arc::new(facts)).empty_like()
    }

    /// The same nodes, all free.
    pub fn empty_like(&self) -> Self {
        let free: Vec<u64> = self.meta.iter().map(|m| m.all).collect();
        Cluster {
            meta: Arc::clone(&self.meta),
            facts: Arc::clone(&self.facts),
            free_by_type: free_by_type(&self.meta, self.facts.types.len(), &free),
            free_count: self.facts.total_gpus,
            whole_node_gpus: self.facts.total_gpus,
            whole_nodes: all_nodes(free.len()),
            free_on: counts(&free),
            nodes_by_free: nodes_by_free(&free, self.facts.gpus_per_node_max),
            free,
            shared: Vec::new(),
            shared_used: 0,
            stamp: Stamp::new(),
        }
    }

    /// A stand-in left where a cluster is moved out of a struct being dropped: it shares the
    /// node descriptions and allocates nothing, and describes no free GPU (not a cluster to
    /// place on; `copy_from` makes it one again).
    pub(crate) fn hollow(&self) -> Self {
        Self::hollow_of(Arc::clone(&self.meta), Arc::clone(&self.facts))
    }

    fn hollow_of(meta: Arc<[NodeMeta]>, facts: Arc<NodeFacts>) -> Self {
        Cluster {
            meta,
            facts,
            free_by_type: Vec::new(),
            free: Vec::new(),
            free_on: Vec::new(),
            nodes_by_free: Vec::new(),
            free_count: 0,
            whole_node_gpus: 0,
            whole_nodes: Vec::new(),
            shared: Vec::new(),
            shared_used: 0,
            stamp: Stamp::new(),
        }
    }

    /// Makes this cluster a copy of `other`, reusing its buffers (a planner copies the
    /// cluster for every start time it tries).
    pub fn copy_from(&mut self, other: &Cluster) {
        let Cluster {
            meta,
            facts,
            free_by_type,
            free,
            free_on,
            nodes_by_free,
            free_count,
            whole_node_gpus,
            whole_nodes,
            shared,
            shared_used,
            stamp: _,
        } = other;
        self.meta.clone_from(meta);
        self.facts.clone_from(facts);
        self.free_by_type.clone_from(free_by_type);
        self.free.clone_from(free);
        self.free_on.clone_from(free_on);
        self.nodes_by_free.clone_from(nodes_by_free);
        self.free_count = *free_count;
        self.whole_node_gpus = *whole_node_gpus;
        self.whole_nodes.clone_from(whole_nodes);
        self.shared.clone_from(shared);
        self.shared_used = *shared_used;
        self.stamp = Stamp::new();
    }

    /// Identifies what is free: equal stamps, equal clusters.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    pub fn node_count(&self) -> usize {
        self.meta.len()
    }

    pub fn gpus_per_node_max(&self) -> u32 {
        self.facts.gpus_per_node_max
    }

    /// Node `node`'s GPUs as a mask of their indices.
    pub(crate) fn full_mask(&self, node: usize) -> u64 {
        self.facts.full_masks[node]
    }

    pub fn total_gpus(&self) -> u32 {
        self.facts.total_gpus
    }

    /// Free GPUs on node `node`.
    pub fn free_on(&self, node: usize) -> u32 {
        u32::from(self.free_on[node])
    }

    /// Sets node `node`'s free GPUs, keeping the counts.
    fn set_free(&mut self, node: usize, mask: u64) {
        let old = self.free[node];
        if mask == old {
            return;
        }
        let (was, now) = (u32::from(self.free_on[node]), ones(mask));
        let all = self.meta[node].all;
        let whole = |m: u64| {
            if m == all {
                self.meta[node].spec.gpus
            } else {
                0
            }
        };
        self.whole_node_gpus = self.whole_node_gpus + whole(mask) - whole(old);
        let bit = 1u64 << (node % 64);
        if mask == all {
            self.whole_nodes[node / 64] |= bit;
        } else {
            self.whole_nodes[node / 64] &= !bit;
        }
        self.free[node] = mask;
        self.free_on[node] = now as u8;
        self.nodes_by_free[was as usize] -= 1;
        self.nodes_by_free[now as usize] += 1;
        self.free_count = self.free_count + now - was;
        if !self.free_by_type.is_empty() {
            let of_type =
                &mut self.free_by_type[self.meta[node].type_bit.trailing_zeros() as usize];
            *of_type = *of_type + now - was;
        }
    }

    /// Node `node`'s free GPUs as a bit mask of their indices.
    pub fn free_mask(&self, node: usize) -> u64 {
        self.free[node]
    }

    /// GPUs no job holds any part of.
    pub fn free_gpus(&self) -> u32 {
        self.free_count
    }

    /// The most GPUs free on any one node (tests; searches ask `some_node_has`).
    #[cfg(test)]
    fn most_free_on_a_node(&self) -> u32 {
        let most = self.nodes_by_free.iter().rposition(|n| *n > 0);
        most.unwrap_or(0) as u32
    }

    /// Whether some node has `gpus` GPUs free or more.
    fn some_node_has(&self, gpus: u32) -> bool {
        let enough = self.nodes_by_free.get(gpus as usize..);
        enough.is_some_and(|tally| tally.iter().any(|n| *n > 0))
    }

    /// What jobs hold, in share units ([`SHARE_UNITS_PER_GPU`] to a GPU): a GPU held in parts
    /// counts only its parts held.
    pub fn held_share_units(&self) -> u64 {
        let whole_held =
            u64::from(self.facts.total_gpus - self.free_count) - self.shared.len() as u64;
        whole_held * u64::from(SHARE_UNITS_PER_GPU) + self.shared_used
    }

    /// The GPUs held in parts: (node, GPU index, sharing mode, share units of room left), by
    /// node and GPU index.
    pub fn shared_gpus(&self) -> impl Iterator<Item = (usize, u32, ShareMode, u32)> + '_ {
        self.shared
            .iter()
            .map(|g| (g.node, g.gpu, g.mode, g.room()))
    }

    /// Whether a job of `gpus` shaped `shape` could find room by count alone (a cheap test
    /// before a search): whole free GPUs of its types enough, or for a share a GPU of its
    /// types with room.
    pub fn may_fit(&self, gpus: u32, shape: &Shape) -> bool {
        let types = self.type_mask(shape);
        let free = if types == u64::MAX || self.free_by_type.is_empty() {
            // One type: its free GPUs are all the free GPUs.
            if types & 1 != 0 {
                self.free_count
            } else {
                0
            }
        } else {
            self.free_by_type
                .iter()
                .enumerate()
                .filter(|(i, _)| types & (1 << i) != 0)
                .map(|(_, n)| n)
                .sum()
        };
        match shape.gpu_share {
            Some(share) => {
                free > 0
                    || self.shared.iter().any(|g| {
                        g.mode == share.mode()
                            && g.room() >= share.units()
                            && types & self.meta[g.node].type_bit != 0
                    })
            }
            None => free >= gpus && (shape.gpus_per_node.is_some() || self.may_place(gpus)),
        }
    }

    /// Whether the default placement of `gpus` (one node with that many free, else whole free
    /// nodes; see `find`) could succeed, by the counts alone.
    fn may_place(&self, gpus: u32) -> bool {
        self.some_node_has(gpus) || self.whole_node_gpus >= gpus
    }

    /// Word `w` (nodes `64 w..`) of the set of nodes of the types in `types` (a
    /// [`Cluster::type_mask`]), a bit per node.
    fn type_word(&self, types: u64, w: usize) -> u64 {
        if types == u64::MAX {
            return u64::MAX;
        }
        let mut bits = 0;
        for (t, nodes) in self.facts.type_bits.iter().enumerate() {
            if types & (1 << t) != 0 {
                bits |= nodes[w];
            }
        }
        bits
    }

    /// The types `shape` may use, a bit per type of `types` (every bit when it names none).
    pub(crate) fn type_mask(&self, shape: &Shape) -> u64 {
        if shape.gpu_types.is_empty() {
            return u64::MAX;
        }
        self.facts
            .types
            .iter()
            .enumerate()
            .filter(|(_, t)| shape.gpu_types.contains(t))
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    pub fn node_spec(&self, node: usize) -> &NodeSpec {
        &self.meta[node].spec
    }

    /// The index of the node named `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.meta.iter().position(|m| m.spec.id.as_str() == name)
    }

    /// True when `account` may use the node at all (it is not dedicated to someone else).
    pub fn usable_by(&self, node: usize, account: &AccountId) -> bool {
        self.meta[node]
            .spec
            .dedicated_to
            .as_ref()
            .is_none_or(|owner| owner == account)
    }

    /// The most GPUs a job of `account` could ever get (all nodes it may use, empty).
    pub fn capacity_for(&self, account: &AccountId) -> u32 {
        (0..self.meta.len())
            .filter(|i| self.usable_by(*i, account))
            .map(|i| self.meta[i].spec.gpus)
            .sum()
    }

    /// Whether a job may use `node`: `types` from [`Cluster::type_mask`].
    fn allowed(&self, node: usize, account: &AccountId, filter: &NodeFilter, types: u64) -> bool {
        types & self.meta[node].type_bit != 0
            && filter.allows(node)
            && self.usable_by(node, account)
    }

    /// The bit of `node`'s GPU type in a [`Cluster::type_mask`].
    pub(crate) fn type_bit(&self, node: usize) -> u64 {
        self.meta[node].type_bit
    }

    /// Where a job of `gpus` GPUs shaped `shape` would go now, without taking it.
    pub fn find(
        &self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        if let Some(share) = shape.gpu_share {
            return (gpus == 1)
                .then(|| self.find_share(share, account, filter, shape))
                .flatten();
        }
        if gpus == 0 || gpus > self.free_count {
            return None;
        }
        if let Some(per_node) = shape.gpus_per_node {
            return self.find_per_node(gpus, per_node, account, filter, shape);
        }
        if gpus <= self.facts.gpus_per_node_max {
            if self.some_node_has(gpus) {
                if let Some(p) = self.find_on_one_node(gpus, account, filter, shape) {
                    return Some(p);
                }
            }
            // Where every node is as large, a whole free node would have been found above:
            // only smaller nodes together can hold a job that fits one node.
            if self.facts.uniform() {
                return None;
            }
        }
        self.find_whole_nodes(gpus, account, filter, shape)
    }

    fn find_on_one_node(
        &self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let types = self.type_mask(shape);
        // The fewest free GPUs that hold the job, the first such node in node order.
        let mut best: Option<(u32, usize)> = None;
        if types == u64::MAX {
            for (idx, &n) in self.free_on.iter().enumerate() {
                let n = u32::from(n);
                if n < gpus || best.is_some_and(|(b, _)| n >= b) {
                    continue;
                }
                if self.allowed(idx, account, filter, types) {
                    best = Some((n, idx));
                    if n == gpus {
                        break;
                    }
                }
            }
        } else {
            // Only the nodes of the types asked for, type by type: a node beats the best so
            // far with fewer free GPUs, or as few and an earlier place in node order.
            let lists = (0..self.facts.types.len()).filter(|t| types & (1 << t) != 0);
            for list in lists.map(|t| &self.facts.nodes_of_type[t]) {
                for &idx in list {
                    let n = u32::from(self.free_on[idx]);
                    if n < gpus || best.is_some_and(|b| (n, idx) >= b) {
                        continue;
                    }
                    if self.allowed(idx, account, filter, types) {
                        best = Some((n, idx));
                        if n == gpus {
                            break;
                        }
                    }
                }
            }
        }
        let (_, idx) = best?;
        Some(Placement(smallvec![Slot::whole(
            idx,
            lowest_bits(self.free[idx], gpus),
        )]))
    }

    /// A part of one GPU: best fit among the GPUs already shared in the same mode, else a
    /// free GPU on the fullest node that has one.
    fn find_share(
        &self,
        share: GpuShare,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let types = self.type_mask(shape);
        let units = share.units();
        let best = self
            .shared
            .iter()
            .filter(|g| g.mode == share.mode() && g.room() >= units)
            .filter(|g| self.allowed(g.node, account, filter, types))
            .min_by_key(|g| (g.room(), g.node, g.gpu));
        let slot = match best {
            Some(g) => Slot {
                node: g.node,
                mask: 1u64 << g.gpu,
                share: Some(share),
            },
            None => {
                let mut whole = self.find_on_one_node(1, account, filter, shape)?;
                let mut slot = whole.0.pop()?;
                slot.share = Some(share);
                slot
            }
        };
        Some(Placement(smallvec![slot]))
    }

    fn shared_index(&self, node: usize, mask: u64) -> Option<usize> {
        let gpu = mask.trailing_zeros();
        self.shared
            .binary_search_by_key(&(node, gpu), |g| (g.node, g.gpu))
            .ok()
    }

    /// Takes `share` of the GPU `mask` names on `node`. `strict`: the GPU must have the room
    /// (a start); otherwise a planning copy where the part may already be counted, capped at
    /// the whole GPU.
    fn take_share(&mut self, node: usize, mask: u64, share: GpuShare, strict: bool) {
        let units = share.units();
        if self.free[node] & mask == mask {
            self.set_free(node, self.free[node] & !mask);
            let gpu = mask.trailing_zeros();
            let at = self
                .shared
                .partition_point(|g| (g.node, g.gpu) < (node, gpu));
            self.shared.insert(
                at,
                SharedGpu {
                    node,
                    gpu,
                    mode: share.mode(),
                    used: units,
                },
            );
            self.shared_used += u64::from(units);
            return;
        }
        match self.shared_index(node, mask) {
            Some(i) => {
                let g = &mut self.shared[i];
                debug_assert!(
                    !strict || (g.mode == share.mode() && g.room() >= units),
                    "GPU share over the GPU"
                );
                let before = g.used;
                g.used = (g.used + units).min(SHARE_UNITS_PER_GPU);
                self.shared_used += u64::from(g.used - before);
            }
            // Held whole: only a planning copy may claim it again.
            None => debug_assert!(!strict, "GPU shared and held whole"),
        }
    }

    /// Gives back `share` of the GPU; the GPU is free again when no part of it is held.
    fn release_share(&mut self, node: usize, mask: u64, share: GpuShare) {
        let Some(i) = self.shared_index(node, mask) else {
            return;
        };
        let g = &mut self.shared[i];
        let before = g.used;
        g.used = g.used.saturating_sub(share.units());
        self.shared_used -= u64::from(before - g.used);
        if g.used == 0 {
            self.shared.remove(i);
            self.set_free(node, self.free[node] | mask);
        }
    }

    /// `gpus / per_node` nodes with `per_node` GPUs each, the fullest nodes that fit first.
    fn find_per_node(
        &self,
        gpus: u32,
        per_node: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let types = self.type_mask(shape);
        if per_node == 0 || !gpus.is_multiple_of(per_node) {
            return None;
        }
        let nodes = (gpus / per_node) as usize;
        if shape.max_nodes.is_some_and(|m| nodes > m as usize) {
            return None;
        }
        let mut fits: Vec<(u32, usize)> = self
            .free_on
            .iter()
            .enumerate()
            .map(|(idx, n)| (u32::from(*n), idx))
            .filter(|(n, idx)| *n >= per_node && self.allowed(*idx, account, filter, types))
            .collect();
        if fits.len() < nodes {
            return None;
        }
        fits.sort_unstable();
        Some(Placement(
            fits.into_iter()
                .take(nodes)
                .map(|(_, idx)| Slot::whole(idx, lowest_bits(self.free[idx], per_node)))
                .collect(),
        ))
    }

    /// Whole free nodes for `gpus` (see `find_whole_nodes_in`).
    fn find_whole_nodes(
        &self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let whole = WholeNodes {
            nodes: &self.whole_nodes,
            gpus: self.whole_node_gpus,
        };
        self.find_whole_nodes_in(whole, gpus, account, filter, shape)
    }

    /// Whether `find` places a job of `gpus` shaped `shape` on wholly free nodes only (it
    /// asks for more GPUs than any node has, in no layout of its own): where it goes then
    /// depends only on which nodes are wholly free.
    pub(crate) fn needs_whole_nodes(&self, gpus: u32, shape: &Shape) -> bool {
        shape.gpu_share.is_none()
            && shape.gpus_per_node.is_none()
            && gpus > self.facts.gpus_per_node_max
    }

    /// The nodes with every GPU free, a bit per node, and their GPUs.
    pub(crate) fn whole_nodes(&self) -> WholeNodes<'_> {
        WholeNodes {
            nodes: &self.whole_nodes,
            gpus: self.whole_node_gpus,
        }
    }

    /// The GPUs of the nodes in `nodes`, a bit per node.
    pub(crate) fn gpus_of(&self, nodes: &[u64]) -> u32 {
        let count = |of: &[u64]| -> u32 {
            nodes
                .iter()
                .zip(of)
                .map(|(n, of)| (n & of).count_ones())
                .sum()
        };
        if self.facts.uniform() {
            let all: u32 = nodes.iter().map(|n| n.count_ones()).sum();
            all * self.facts.gpus_per_node_max
        } else {
            let by_size = self.facts.by_size.iter();
            by_size.map(|(size, of_size)| size * count(of_size)).sum()
        }
    }

    /// Whole free nodes for `gpus` where `whole` are the wholly free nodes (this cluster's
    /// own, or those a plan search works out for a time ahead), visiting only those: in node
    /// order on a uniform cluster; the largest first on a mixed one, so a job spans as few
    /// nodes as it can (ties in node order).
    pub(crate) fn find_whole_nodes_in(
        &self,
        whole: WholeNodes<'_>,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        if whole.gpus < gpus {
            return None;
        }
        let types = self.type_mask(shape);
        let of_types = |w: usize| self.type_word(types, w);
        // Two loops of one body rather than one chained iterator: this runs for every planned
        // start tried, and the uniform cluster's loop stays as plain as before.
        if self.facts.uniform() {
            self.take_whole_nodes(
                nodes_where(whole.nodes.len(), |w| whole.nodes[w] & of_types(w)),
                gpus,
                account,
                filter,
                types,
                shape,
            )
        } else {
            let by_size = self.facts.by_size.iter();
            self.take_whole_nodes(
                by_size.flat_map(|(_, of_size)| {
                    nodes_where(whole.nodes.len(), move |w| {
                        whole.nodes[w] & of_size[w] & of_types(w)
                    })
                }),
                gpus,
                account,
                filter,
                types,
                shape,
            )
        }
    }

    /// The first wholly free nodes of `order` the job may use, until they hold `gpus`.
    fn take_whole_nodes(
        &self,
        order: impl Iterator<Item = usize>,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        types: u64,
        shape: &Shape,
    ) -> Option<Placement> {
        let mut slots = Slots::new();
        let mut left = gpus;
        for idx in order {
            if left == 0 {
                break;
            }
            // A plain test rather than an iterator filter (the closure was not always inlined).
            if !self.allowed(idx, account, filter, types) {
                continue;
            }
            // Wholly free (now or at the time a plan search tries): every GPU.
            let take = left.min(self.meta[idx].spec.gpus);
            slots.push(Slot::whole(idx, lowest_bits(self.meta[idx].all, take)));
            left -= take;
        }
        let too_many = shape.max_nodes.is_some_and(|m| slots.len() > m as usize);
        (left == 0 && !too_many).then_some(Placement(slots))
    }

    /// More GPUs for an elastic job that holds `held`, up to `more`: free GPUs on its own nodes
    /// first for a one-node job, whole free nodes for a multi-node one.
    pub fn find_growth(
        &self,
        held: &Placement,
        more: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let types = self.type_mask(shape);
        if more == 0 {
            return None;
        }
        let single_node = held.0.len() == 1 && held.gpu_count() < self.facts.gpus_per_node_max;
        if single_node {
            let node = held.0[0].node;
            let n = self.free_on(node).min(more);
            return (n > 0).then(|| {
                Placement(smallvec![Slot::whole(
                    node,
                    lowest_bits(self.free[node], n)
                )])
            });
        }
        let mut slots = Slots::new();
        let mut left = more;
        for (idx, meta) in self.meta.iter().enumerate() {
            if left < meta.spec.gpus {
                continue;
            }
            if self.free[idx] != meta.all
                || !self.allowed(idx, account, filter, types)
                || held.nodes().any(|n| n == idx)
            {
                continue;
            }
            slots.push(Slot::whole(idx, meta.all));
            left -= meta.spec.gpus;
        }
        (!slots.is_empty()).then_some(Placement(slots))
    }

    /// How `placement` breaks `shape`, if it does: a node with another count of GPUs than
    /// asked per node, more nodes than allowed, a GPU of another type.
    pub fn breaks_shape(&self, placement: &Placement, shape: &Shape) -> Option<String> {
        if let Some(max) = shape.max_nodes {
            if placement.0.len() > max as usize {
                return Some(format!("{} nodes, at most {max} asked", placement.0.len()));
            }
        }
        if let Some(share) = shape.gpu_share {
            let one_part = matches!(&placement.0[..], [slot] if slot.share == Some(share) && slot.mask.count_ones() == 1);
            if !one_part {
                return Some(format!("a {share} share of one GPU asked"));
            }
        } else if placement.has_share() {
            return Some("a share of a GPU held, whole GPUs asked".into());
        }
        for slot in &placement.0 {
            let spec = &self.meta[slot.node].spec;
            if let Some(per_node) = shape.gpus_per_node {
                if slot.mask.count_ones() != per_node {
                    return Some(format!(
                        "{} GPUs on {}, {per_node} per node asked",
                        slot.mask.count_ones(),
                        spec.id
                    ));
                }
            }
            if !shape.allows_type(&spec.gpu_type) {
                return Some(format!("{} has {} GPUs", spec.id, spec.gpu_type));
            }
        }
        None
    }

    /// Takes the GPUs of a placement. Panics in debug builds if any is already held: that
    /// would be a scheduler bug, and the invariant checks in tests look for it.
    pub fn take(&mut self, placement: &Placement) {
        self.stamp.changes += 1;
        for slot in &placement.0 {
            if let Some(share) = slot.share {
                self.take_share(slot.node, slot.mask, share, true);
                continue;
            }
            debug_assert_eq!(
                self.free[slot.node] & slot.mask,
                slot.mask,
                "GPU allocated twice"
            );
            self.set_free(slot.node, self.free[slot.node] & !slot.mask);
        }
    }

    /// Marks a placement's GPUs as held, whether or not they already are (planning copies,
    /// where a held GPU may be claimed by a plan that ends before another begins). A whole GPU
    /// held where parts of it are taken leaves no room for another part.
    pub fn hold(&mut self, placement: &Placement) {
        self.stamp.changes += 1;
        for slot in &placement.0 {
            if let Some(share) = slot.share {
                self.take_share(slot.node, slot.mask, share, false);
                continue;
            }
            self.hold_gpus(slot.node, slot.mask);
            self.fill_shared(slot.node, slot.mask);
        }
    }

    /// Leaves no room on the GPUs of `mask` held in parts.
    fn fill_shared(&mut self, node: usize, mask: u64) {
        let first = self.shared.partition_point(|g| g.node < node);
        for g in self.shared[first..]
            .iter_mut()
            .take_while(|g| g.node == node)
        {
            if mask & (1 << g.gpu) != 0 {
                self.shared_used += u64::from(g.room());
                g.used = SHARE_UNITS_PER_GPU;
            }
        }
    }

    /// Marks whole GPUs of one node as held, whichever of them are free.
    pub(crate) fn hold_gpus(&mut self, node: usize, mask: u64) {
        self.stamp.changes += 1;
        self.set_free(node, self.free[node] & !mask);
    }

    /// Sets which whole GPUs of one node are free (one taken before, given back as it was).
    pub(crate) fn set_free_mask(&mut self, node: usize, mask: u64) {
        self.stamp.changes += 1;
        self.set_free(node, mask);
    }

    /// Frees whole GPUs of one node, whichever of them are held.
    pub(crate) fn free_held_gpus(&mut self, node: usize, mask: u64) {
        self.stamp.changes += 1;
        self.set_free(node, self.free[node] | mask);
    }

    pub fn release(&mut self, placement: &Placement) {
        self.stamp.changes += 1;
        for slot in &placement.0 {
            if let Some(share) = slot.share {
                self.release_share(slot.node, slot.mask, share);
                continue;
            }
            debug_assert_eq!(self.free[slot.node] & slot.mask, 0, "GPU released twice");
            self.set_free(slot.node, self.free[slot.node] | slot.mask);
        }
    }

    /// Frees what a placement holds, whatever of it is held now (a trial of what a
    /// preemption would free): whole GPUs held become free, a share comes off its GPU once.
    pub fn release_held(&mut self, placement: &Placement) {
        self.stamp.changes += 1;
        for slot in &placement.0 {
            match slot.share {
                Some(share) => self.release_share(slot.node, slot.mask, share),
                None => self.free_held_gpus(slot.node, slot.mask),
            }
        }
    }

    /// True when both have exactly the same GPUs free, and the same parts of shared ones.
    pub fn same_free(&self, other: &Cluster) -> bool {
        self.free == other.free && self.shared == other.shared
    }

    /// True when the free counts kept per node and in all match the free GPUs, and the GPUs
    /// held in parts are in order, none twice.
    pub fn counts_agree(&self) -> bool {
        let whole_node_gpus: u32 = self
            .free
            .iter()
            .zip(self.meta.iter())
            .filter(|(free, meta)| **free == meta.all)
            .map(|(_, meta)| meta.spec.gpus)
            .sum();
        let whole_nodes = self
            .free
            .iter()
            .zip(self.meta.iter())
            .enumerate()
            .filter(|(_, (free, meta))| **free == meta.all)
            .fold(
                vec![0u64; self.meta.len().div_ceil(64)],
                |mut bits, (n, _)| {
                    bits[n / 64] |= 1 << (n % 64);
                    bits
                },
            );
        let by_free = nodes_by_free(&self.free, self.facts.gpus_per_node_max);
        self.free_on == counts(&self.free)
            && self.nodes_by_free == by_free
            && self.free_count == self.free.iter().map(|m| m.count_ones()).sum::<u32>()
            && self.whole_node_gpus == whole_node_gpus
            && self.whole_nodes == whole_nodes
            && self.free_by_type == free_by_type(&self.meta, self.facts.types.len(), &self.free)
            && self
                .shared
                .windows(2)
                .all(|w| (w[0].node, w[0].gpu) < (w[1].node, w[1].gpu))
    }

    /// True when every GPU of the placement is free (for a share: free, or shared in its mode
    /// with room for it).
    pub fn is_free(&self, placement: &Placement) -> bool {
        placement.0.iter().all(|s| {
            if self.free[s.node] & s.mask == s.mask {
                return true;
            }
            match (s.share, self.shared_index(s.node, s.mask)) {
                (Some(share), Some(i)) => {
                    let g = &self.shared[i];
                    g.mode == share.mode() && g.room() >= share.units()
                }
                _ => false,
            }
        })
    }

    /// The placement as node names and GPU indices.
    pub fn to_allocation(&self, placement: &Placement) -> Allocation {
        Allocation(
            placement
                .0
                .iter()
                .map(|s| NodeGpus {
                    node: self.meta[s.node].spec.id.clone(),
                    gpus: (0..64).filter(|b| s.mask & (1u64 << b) != 0).collect(),
                    share: s.share,
                })
                .collect(),
        )
    }

    /// The placement of an allocation on this cluster (a restart reading its state back).
    pub fn from_allocation(&self, allocation: &Allocation) -> Option<Placement> {
        allocation
            .0
            .iter()
            .map(|ng| {
                let node = self.node_index(ng.node.as_str())?;
                let mut mask = 0u64;
                for g in &ng.gpus {
                    if *g >= self.meta[node].spec.gpus {
                        return None;
                    }
                    mask |= 1u64 << g;
                }
                Some(Slot {
                    node,
                    mask,
                    share: ng.share,
                })
            })
            .collect::<Option<Slots>>()
            .map(Placement)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpuledger_model::{GpuModel, NodeId};

    /// Node `n{i:03}` with `gpus` GPUs of `model`.
    pub(crate) fn node(i: usize, gpus: u32, model: GpuModel) -> NodeSpec {
        NodeSpec {
            id: NodeId::new(format!("n{i:03}")).unwrap(),
            gpus,
            gpu_model: model,
            gpu_type: model.into(),
            pool: "p".into(),
            dedicated_to: None,
        }
    }

    fn cluster(nodes: usize) -> Cluster {
        Cluster::new((1..=nodes).map(|i| node(i, 8, GpuModel::H100Sxm)).collect())
    }

    #[test]
    fn small_jobs_pack_onto_the_fullest_node() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(2);
        let first = c.find(3, &a, &any, &Shape::default()).unwrap();
        c.take(&first);
        let second = c.find(4, &a, &any, &Shape::default()).unwrap();
        assert_eq!(
            second.0[0].node, first.0[0].node,
            "packs beside the first job"
        );
        c.take(&second);
        // 1 GPU left on node 0, node 1 whole: a 8-GPU job still fits.
        let whole = c.find(8, &a, &any, &Shape::default()).unwrap();
        assert_eq!(whole.0[0].node, 1);
    }

    #[test]
    fn multi_node_jobs_need_whole_free_nodes() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(3);
        let small = c.find(1, &a, &any, &Shape::default()).unwrap();
        c.take(&small);
        // 23 GPUs are free, but only two whole nodes: a 24-GPU job waits (false wait).
        assert_eq!(c.free_gpus(), 23);
        assert!(c.find(24, &a, &any, &Shape::default()).is_none());
        let p = c.find(16, &a, &any, &Shape::default()).unwrap();
        assert_eq!(p.gpu_count(), 16);
        assert_eq!(c.to_allocation(&p).to_string(), "n002:0-7;n003:0-7");
        assert_eq!(c.from_allocation(&c.to_allocation(&p)), Some(p));
    }

    #[test]
    fn a_filter_keeps_jobs_off_blocked_nodes() {
        let a = AccountId::new("a").unwrap();
        let c = cluster(3);
        let mut filter = NodeFilter::none();
        filter.block(0, 3);
        filter.block(1, 3);
        assert_eq!(
            c.find(4, &a, &filter, &Shape::default()).unwrap().0[0].node,
            2
        );
        assert!(c.find(16, &a, &filter, &Shape::default()).is_none());
    }

    #[test]
    fn elastic_placements_grow_and_shrink_by_whole_nodes() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(4);
        let mut p = c.find(16, &a, &any, &Shape::default()).unwrap();
        c.take(&p);
        let more = c.find_growth(&p, 16, &a, &any, &Shape::default()).unwrap();
        assert_eq!(more.gpu_count(), 16);
        c.take(&more);
        p.extend(&more);
        assert_eq!(p.gpu_count(), 32);
        let back = p.shrink_to(16);
        assert_eq!(back.gpu_count(), 16);
        assert_eq!(back.0.len(), 2, "two whole nodes given back");
        c.release(&back);
        assert_eq!(c.free_gpus(), 16);
    }

    fn mixed() -> Cluster {
        // n001-n004: 2 x A100 each; n005-n006: 8 x H100 each.
        Cluster::new(
            (1..=6)
                .map(|i| match i {
                    1..=4 => node(i, 2, GpuModel::A100),
                    _ => node(i, 8, GpuModel::H100Sxm),
                })
                .collect(),
        )
    }

    #[test]
    fn too_few_gpus_on_every_node_rule_a_job_out_by_count() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let free_form = Shape::default();
        let per_node = Shape {
            gpus_per_node: Some(2),
            ..Shape::default()
        };
        let mut c = mixed();
        assert_eq!(c.most_free_on_a_node(), 8);
        // 3 GPUs taken on each 8-GPU node, one on each 2-GPU node: 14 free, at most 5 on a
        // node, no node wholly free.
        for node in 0..6 {
            let gpus = if node < 4 { 1 } else { 3 };
            c.take(&Placement(smallvec![Slot::whole(node, (1 << gpus) - 1)]));
        }
        assert!(c.counts_agree());
        assert_eq!((c.free_gpus(), c.most_free_on_a_node()), (14, 5));
        assert!(c.may_fit(5, &free_form) && c.find(5, &a, &any, &free_form).is_some());
        for gpus in [6, 8, 9, 14] {
            assert!(!c.may_fit(gpus, &free_form), "{gpus} GPUs");
            assert!(c.find(gpus, &a, &any, &free_form).is_none(), "{gpus} GPUs");
        }
        // Two GPUs on each of two nodes is not one node's count.
        assert!(c.may_fit(6, &per_node) && c.find(4, &a, &any, &per_node).is_some());
        // A node wholly free again: whole nodes count, for a job larger than any node too.
        c.release(&Placement(smallvec![Slot::whole(0, 1)]));
        c.release(&Placement(smallvec![Slot::whole(1, 1)]));
        assert!(c.counts_agree());
        assert_eq!(c.most_free_on_a_node(), 5);
        assert!(c.may_fit(4, &free_form) && !c.may_fit(6, &free_form));
        c.release(&Placement(smallvec![Slot::whole(4, 0b111)]));
        assert!(c.counts_agree());
        assert!(c.may_fit(12, &free_form) && !c.may_fit(13, &free_form));
        assert!(c.find(12, &a, &any, &free_form).is_some());
        c.take(&Placement(smallvec![Slot::whole(4, u64::from(u8::MAX))]));
        c.take(&Placement(smallvec![Slot::whole(5, 0b1111_1000)]));
        c.take(&Placement(smallvec![Slot::whole(0, 0b11)]));
        c.take(&Placement(smallvec![Slot::whole(1, 0b11)]));
        c.take(&Placement(smallvec![Slot::whole(2, 0b10)]));
        c.take(&Placement(smallvec![Slot::whole(3, 0b10)]));
        assert!(c.counts_agree());
        assert_eq!((c.free_gpus(), c.most_free_on_a_node()), (0, 0));
        assert!(!c.may_fit(1, &free_form));
    }

    #[test]
    fn a_shape_fixes_gpus_per_node_node_count_and_gpu_model() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let free_form = Shape::default();
        let mut c = mixed();
        // On mixed node sizes a large job takes the largest whole nodes, never four small ones.
        let p = c.find(8, &a, &any, &free_form).unwrap();
        assert_eq!(c.to_allocation(&p).to_string(), "n005:0-7");
        c.take(&p);
        let p = c.find(10, &a, &any, &free_form).unwrap();
        assert_eq!(c.to_allocation(&p).to_string(), "n006:0-7;n001:0-1");
        // At most one node: 10 GPUs do not fit one node.
        let one_node = Shape {
            max_nodes: Some(1),
            ..Shape::default()
        };
        assert!(c.find(10, &a, &any, &one_node).is_none());
        // 2 GPUs per node on 3 nodes: the fullest that fit, never 8 on one node.
        let per_node = Shape {
            gpus_per_node: Some(2),
            ..Shape::default()
        };
        let p = c.find(6, &a, &any, &per_node).unwrap();
        assert_eq!(
            c.to_allocation(&p).to_string(),
            "n001:0-1;n002:0-1;n003:0-1"
        );
        assert!(c.find(5, &a, &any, &per_node).is_none(), "not a multiple");
        let capped = Shape {
            gpus_per_node: Some(2),
            max_nodes: Some(2),
            ..Shape::default()
        };
        assert!(c.find(6, &a, &any, &capped).is_none(), "3 nodes > 2");
        // A model: H100 only (n006 is the one whole H100 node left).
        let h100 = Shape {
            gpu_types: vec![GpuModel::H100Sxm.into()],
            ..Shape::default()
        };
        let p = c.find(2, &a, &any, &h100).unwrap();
        assert_eq!(c.to_allocation(&p).to_string(), "n006:0-1");
        assert!(
            c.find(9, &a, &any, &h100).is_none(),
            "one H100 node is free"
        );
        let a100 = Shape {
            gpu_types: vec![GpuModel::A100.into()],
            ..Shape::default()
        };
        let p = c.find(8, &a, &any, &a100).unwrap();
        assert_eq!(p.0.len(), 4, "an A100 job of 8 needs the four 2-GPU nodes");
        assert!(p.0.iter().all(|s| s.node < 4));
        // By count alone, only the GPUs of the types asked for: 8 A100 and 8 H100 free.
        assert!(c.may_fit(16, &free_form) && !c.may_fit(17, &free_form));
        assert!(c.may_fit(8, &h100) && !c.may_fit(9, &h100));
        let h200 = Shape {
            gpu_types: vec![GpuModel::H200.into()],
            ..Shape::default()
        };
        assert!(!c.may_fit(1, &h200) && c.find(1, &a, &any, &h200).is_none());
        c.take(&c.find(8, &a, &any, &h100).unwrap());
        assert!(!c.may_fit(1, &h100) && c.may_fit(8, &a100));
        assert!(
            c.may_fit(1, &share("500m"))
                && !c.may_fit(
                    1,
                    &Shape {
                        gpu_share: Some("500m".parse().unwrap()),
                        ..h100.clone()
                    }
                )
        );
        assert!(c.counts_agree());
        // One type: counted by the free total, none for another type.
        let one = cluster(2);
        assert!(one.may_fit(16, &h100) && !one.may_fit(17, &h100) && !one.may_fit(1, &a100));
    }

    fn prop_oneof_gpus() -> impl proptest::strategy::Strategy<Value = u32> {
        proptest::prop_oneof![
            proptest::strategy::Just(2u32),
            proptest::strategy::Just(4),
            proptest::strategy::Just(8)
        ]
    }

    fn share(text: &str) -> Shape {
        Shape {
            gpu_share: Some(text.parse().unwrap()),
            ..Shape::default()
        }
    }

    #[test]
    fn shares_pack_best_fit_on_gpus_of_their_mode() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(2);
        let whole = c.find(3, &a, &any, &Shape::default()).unwrap();
        c.take(&whole);
        // The first share goes onto a free GPU of the fullest node, not the empty one.
        let quarter = c.find(1, &a, &any, &share("250m")).unwrap();
        assert_eq!(quarter.0[0].node, whole.0[0].node);
        c.take(&quarter);
        assert_eq!(c.free_gpus(), 16 - 4);
        assert_eq!(c.held_share_units(), 3 * 7000 + 250 * 7);
        // The next one shares that GPU; a MIG slice does not (another mode).
        let half = c.find(1, &a, &any, &share("500m")).unwrap();
        assert_eq!(half.0[0].mask, quarter.0[0].mask);
        c.take(&half);
        let mig = c.find(1, &a, &any, &share("3g")).unwrap();
        assert_ne!(
            (mig.0[0].node, mig.0[0].mask),
            (quarter.0[0].node, quarter.0[0].mask)
        );
        c.take(&mig);
        // 250m left on the first GPU: a 300m share goes elsewhere, a 250m one fits exactly.
        let big = c.find(1, &a, &any, &share("300m")).unwrap();
        assert_ne!(big.0[0].mask, quarter.0[0].mask);
        let exact = c.find(1, &a, &any, &share("250m")).unwrap();
        assert_eq!(exact.0[0].mask, quarter.0[0].mask);
        // A share is one GPU: two GPUs of shares is not a thing.
        assert!(c.find(2, &a, &any, &share("250m")).is_none());
        // The allocation names the share and reads back.
        let allocation = c.to_allocation(&exact);
        assert!(allocation.to_string().ends_with("@250m"), "{allocation}");
        assert_eq!(c.from_allocation(&allocation), Some(exact.clone()));
        // Giving the shares back frees the GPU whole.
        c.release(&quarter);
        c.release(&half);
        c.release(&mig);
        assert_eq!(c.free_gpus(), 16 - 3);
        assert_eq!(c.held_share_units(), 3 * 7000);
        assert!(c.same_free(&{
            let mut d = c.empty_like();
            d.take(&whole);
            d
        }));
    }

    #[test]
    fn a_plan_holding_a_shared_gpu_whole_leaves_no_room_on_it() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(1);
        let quarter = c.find(1, &a, &any, &share("250m")).unwrap();
        c.take(&quarter);
        let mut planning = c.clone();
        // A plan of the whole node, as a multi-node plan holds its nodes.
        planning.hold(&Placement(smallvec![Slot::whole(0, 0xff)]));
        assert!(planning.find(1, &a, &any, &share("250m")).is_none());
        assert_eq!(
            planning.held_share_units(),
            8 * u64::from(SHARE_UNITS_PER_GPU)
        );
        assert!(planning.counts_agree());
        // Only where the plan holds: the running share's GPU is open again off the node's plan.
        let mut others = c.clone();
        others.hold(&Placement(smallvec![Slot::whole(
            0,
            0xff & !quarter.0[0].mask
        )]));
        let next = others.find(1, &a, &any, &share("250m")).unwrap();
        assert_eq!(next.0[0].mask, quarter.0[0].mask);
    }

    #[test]
    fn mig_slices_fill_a_gpu_exactly() {
        let a = AccountId::new("a").unwrap();
        let any = NodeFilter::none();
        let mut c = cluster(1);
        let mut gpus = std::collections::BTreeSet::new();
        for profile in ["3g", "3g", "1g"] {
            let p = c.find(1, &a, &any, &share(profile)).unwrap();
            gpus.insert(p.0[0].mask);
            c.take(&p);
        }
        assert_eq!(gpus.len(), 1, "3g + 3g + 1g is one GPU");
        assert_eq!(c.free_gpus(), 7);
        let next = c.find(1, &a, &any, &share("1g")).unwrap();
        assert!(!gpus.contains(&next.0[0].mask), "the first GPU is full");
    }

    proptest::proptest! {
        /// A job asking for some types finds the node a walk of every node would: the fewest
        /// free GPUs that hold it, the first such in node order, of its types only.
        #[test]
        fn one_node_search_by_type_is_the_walk_over_every_node(
            nodes in proptest::collection::vec((0usize..3, prop_oneof_gpus(), 0u64..256), 1..24),
            asks in proptest::collection::vec((1u32..9, 1u8..8), 1..12),
        ) {
            let models = [GpuModel::A100, GpuModel::H100Sxm, GpuModel::T4];
            let specs = nodes
                .iter()
                .enumerate()
                .map(|(i, (m, g, _))| node(i + 1, *g, models[*m]))
                .collect();
            let mut c = Cluster::new(specs);
            for (i, (_, g, taken)) in nodes.iter().enumerate() {
                let mask = taken & full_mask(*g);
                if mask != 0 {
                    c.take(&Placement(smallvec![Slot::whole(i, mask)]));
                }
            }
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            for (gpus, which) in asks {
                let gpu_types: Vec<GpuType> = (0..3)
                    .filter(|t| which & (1 << t) != 0)
                    .map(|t| models[t].into())
                    .collect();
                let shape = Shape { gpu_types, ..Shape::default() };
                let walk = (0..c.node_count())
                    .filter(|n| shape.allows_type(&c.node_spec(*n).gpu_type))
                    .map(|n| (c.free_on(n), n))
                    .filter(|(free, _)| *free >= gpus)
                    .min()
                    .map(|(_, n)| n);
                let found = c.find_on_one_node(gpus, &a, &any, &shape);
                proptest::prop_assert_eq!(found.map(|p| p.0[0].node), walk);
            }
        }

        /// A job spanning nodes takes the wholly free nodes a walk of every node, the largest
        /// first and ties in node order, would take: on clusters of one size and of several
        /// (more than 64 nodes, so the nodes' bits span words), of its types only.
        #[test]
        fn whole_node_search_is_the_largest_first_walk(
            nodes in proptest::collection::vec((0usize..3, prop_oneof_gpus(), proptest::bool::weighted(0.4)), 1..140),
            uniform in proptest::bool::ANY,
            asks in proptest::collection::vec((1u32..80, 1u8..8, proptest::option::of(1u32..6)), 1..12),
        ) {
            let models = [GpuModel::A100, GpuModel::H100Sxm, GpuModel::T4];
            let size = |g: u32| if uniform { 8 } else { g };
            let specs = nodes
                .iter()
                .enumerate()
                .map(|(i, (m, g, _))| node(i + 1, size(*g), models[*m]))
                .collect();
            let mut c = Cluster::new(specs);
            for (i, (_, _, busy)) in nodes.iter().enumerate() {
                if *busy {
                    c.take(&Placement(smallvec![Slot::whole(i, 1)]));
                }
            }
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            for (gpus, which, max_nodes) in asks {
                let gpu_types: Vec<GpuType> = (0..3)
                    .filter(|t| which & (1 << t) != 0)
                    .map(|t| models[t].into())
                    .collect();
                let shape = Shape { gpu_types, max_nodes, ..Shape::default() };
                let mut order: Vec<usize> = (0..c.node_count()).collect();
                order.sort_by_key(|n| std::cmp::Reverse(c.node_spec(*n).gpus));
                let mut walk = Vec::new();
                let mut left = gpus;
                for n in order {
                    let spec = c.node_spec(n);
                    if left == 0 || c.free_on(n) != spec.gpus || !shape.allows_type(&spec.gpu_type) {
                        continue;
                    }
                    let take = left.min(spec.gpus);
                    walk.push((n, take));
                    left -= take;
                }
                let fits = left == 0 && max_nodes.is_none_or(|m| walk.len() <= m as usize);
                let found = c
                    .find_whole_nodes(gpus, &a, &any, &shape)
                    .map(|p| p.0.iter().map(|s| (s.node, s.mask.count_ones())).collect::<Vec<_>>());
                proptest::prop_assert_eq!(found, fits.then_some(walk));
            }
        }

        /// Against a reference that counts each GPU's parts: no GPU is ever over-committed or
        /// shared across modes, and the cluster's counts match the placements held.
        #[test]
        fn shares_never_overfill_a_gpu(ops in proptest::collection::vec((0u8..8, 0usize..64), 1..120)) {
            let a = AccountId::new("a").unwrap();
            let any = NodeFilter::none();
            let mut c = cluster(2);
            let mut held: Vec<Placement> = Vec::new();
            for (kind, pick) in ops {
                let shape = match kind {
                    0 => share("100m"),
                    1 => share("250m"),
                    2 => share("700m"),
                    3 => share("1g"),
                    4 => share("3g"),
                    5 => Shape::default(),
                    _ => Shape::default(),
                };
                if kind == 6 && !held.is_empty() {
                    let p = held.swap_remove(pick % held.len());
                    c.release(&p);
                } else if let Some(p) = c.find(match kind { 5 => 2, 7 => 16, _ => 1 }, &a, &any, &shape) {
                    proptest::prop_assert!(c.is_free(&p));
                    c.take(&p);
                    held.push(p);
                }
                let mut per_gpu: std::collections::BTreeMap<(usize, u64), (u32, Option<ShareMode>)> =
                    Default::default();
                for p in &held {
                    for slot in &p.0 {
                        for bit in (0..64).map(|b| 1u64 << b).filter(|b| slot.mask & b != 0) {
                            let e = per_gpu.entry((slot.node, bit)).or_default();
                            match slot.share {
                                Some(s) => {
                                    proptest::prop_assert!(e.1.is_none_or(|m| m == s.mode()));
                                    e.0 += s.units();
                                    e.1 = Some(s.mode());
                                }
                                None => e.0 += 7000,
                            }
                        }
                    }
                }
                proptest::prop_assert!(per_gpu.values().all(|(u, _)| *u <= 7000));
                let units: u64 = held.iter().map(Placement::share_units).sum();
                proptest::prop_assert_eq!(c.held_share_units(), units);
                let mut rebuilt = c.empty_like();
                for p in &held {
                    rebuilt.take(p);
                }
                proptest::prop_assert!(rebuilt.same_free(&c));
                proptest::prop_assert_eq!(rebuilt.free_gpus(), c.free_gpus());
                proptest::prop_assert!(c.counts_agree());
            }
        }
    }
}
