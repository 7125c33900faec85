//! Node-granular placement. Jobs of up to one node's GPUs are packed best-fit onto the fullest
//! node that still fits them, which keeps whole nodes free for multi-node jobs; multi-node jobs
//! take whole free nodes (the largest first on a cluster of mixed node sizes, so a job spans
//! as few nodes as it can). A job's [`Shape`] narrows that: GPUs per node (best-fit nodes with
//! that many free), at most so many nodes, only some GPU models. Which nodes a job may use at
//! all (dedicated pools, advance reservations) is a [`NodeFilter`] worked out by the caller.
//!
//! The node specs are shared (`Arc`), so a copy of the cluster for planning (backfill, trial
//! preemption) costs one `u64` per node.

use std::sync::Arc;

use gpuledger_model::config::NodeSpec;
use gpuledger_model::{AccountId, Allocation, GpuModel, NodeGpus};

/// GPUs held on one node, as a bit mask of GPU indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub node: usize,
    pub mask: u64,
}

/// The GPUs a job holds, by node index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement(pub Vec<Slot>);

impl Placement {
    pub fn gpu_count(&self) -> u32 {
        self.0.iter().map(|s| s.mask.count_ones()).sum()
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
        let mut removed = Vec::new();
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
                removed.push(Slot {
                    node: last.node,
                    mask: give,
                });
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
/// models (Slurm's `--gpus-per-node`, `--nodes` and `--gres=gpu:TYPE:N`). The default asks
/// nothing: one node when the job fits one, else whole free nodes, the largest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Exactly this many GPUs on each node the job uses (its GPUs a multiple of it).
    pub gpus_per_node: Option<u32>,
    /// At most this many nodes.
    pub max_nodes: Option<u32>,
    /// Only GPUs of these models (any when empty).
    pub gpu_models: Vec<GpuModel>,
}

impl Shape {
    /// Whether the job may use a GPU of `model`.
    pub fn allows_model(&self, model: GpuModel) -> bool {
        self.gpu_models.is_empty() || self.gpu_models.contains(&model)
    }

    /// Whether it fixes how its GPUs spread over nodes.
    pub fn fixes_layout(&self) -> bool {
        self.gpus_per_node.is_some() || self.max_nodes.is_some()
    }
}

#[derive(Clone, Debug)]
struct NodeMeta {
    spec: NodeSpec,
    all: u64,
}

/// Free and held GPUs of every node.
#[derive(Clone, Debug)]
pub struct Cluster {
    meta: Arc<[NodeMeta]>,
    free: Vec<u64>,
    free_count: u32,
    gpus_per_node_max: u32,
    total_gpus: u32,
    /// Whether every node has as many GPUs (whole-node placement need not prefer any).
    uniform: bool,
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
    pub fn new(nodes: Vec<NodeSpec>) -> Self {
        let gpus_per_node_max = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
        let meta: Arc<[NodeMeta]> = nodes
            .into_iter()
            .map(|spec| NodeMeta {
                all: full_mask(spec.gpus),
                spec,
            })
            .collect();
        let free: Vec<u64> = meta.iter().map(|m| m.all).collect();
        let free_count = free.iter().map(|m| m.count_ones()).sum();
        let uniform = meta.iter().all(|m| m.spec.gpus == gpus_per_node_max);
        Cluster {
            meta,
            free,
            total_gpus: free_count,
            free_count,
            gpus_per_node_max,
            uniform,
        }
    }

    /// The same nodes, all free.
    pub fn empty_like(&self) -> Self {
        let free: Vec<u64> = self.meta.iter().map(|m| m.all).collect();
        Cluster {
            meta: Arc::clone(&self.meta),
            free_count: free.iter().map(|m| m.count_ones()).sum(),
            free,
            gpus_per_node_max: self.gpus_per_node_max,
            total_gpus: self.total_gpus,
            uniform: self.uniform,
        }
    }

    pub fn node_count(&self) -> usize {
        self.meta.len()
    }

    pub fn gpus_per_node_max(&self) -> u32 {
        self.gpus_per_node_max
    }

    pub fn total_gpus(&self) -> u32 {
        self.total_gpus
    }

    /// Free GPUs on node `node`.
    pub fn free_on(&self, node: usize) -> u32 {
        self.free[node].count_ones()
    }

    /// Node `node`'s free GPUs as a bit mask of their indices.
    pub fn free_mask(&self, node: usize) -> u64 {
        self.free[node]
    }

    pub fn free_gpus(&self) -> u32 {
        self.free_count
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

    fn allowed(
        &self,
        node: usize,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> bool {
        filter.allows(node)
            && self.usable_by(node, account)
            && shape.allows_model(self.meta[node].spec.gpu_model)
    }

    /// Where a job of `gpus` GPUs shaped `shape` would go now, without taking it.
    pub fn find(
        &self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        if gpus == 0 || gpus > self.free_count {
            return None;
        }
        if let Some(per_node) = shape.gpus_per_node {
            return self.find_per_node(gpus, per_node, account, filter, shape);
        }
        if gpus <= self.gpus_per_node_max {
            if let Some(p) = self.find_on_one_node(gpus, account, filter, shape) {
                return Some(p);
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
        let mut best: Option<(u32, usize)> = None;
        for (idx, free) in self.free.iter().enumerate() {
            let n = free.count_ones();
            if n < gpus || best.is_some_and(|(b, _)| n >= b) {
                continue;
            }
            if self.allowed(idx, account, filter, shape) {
                best = Some((n, idx));
                if n == gpus {
                    break;
                }
            }
        }
        let (_, idx) = best?;
        Some(Placement(vec![Slot {
            node: idx,
            mask: lowest_bits(self.free[idx], gpus),
        }]))
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
        if per_node == 0 || !gpus.is_multiple_of(per_node) {
            return None;
        }
        let nodes = (gpus / per_node) as usize;
        if shape.max_nodes.is_some_and(|m| nodes > m as usize) {
            return None;
        }
        let mut fits: Vec<(u32, usize)> = self
            .free
            .iter()
            .enumerate()
            .map(|(idx, free)| (free.count_ones(), idx))
            .filter(|(n, idx)| *n >= per_node && self.allowed(*idx, account, filter, shape))
            .collect();
        if fits.len() < nodes {
            return None;
        }
        fits.sort_unstable();
        Some(Placement(
            fits.into_iter()
                .take(nodes)
                .map(|(_, idx)| Slot {
                    node: idx,
                    mask: lowest_bits(self.free[idx], per_node),
                })
                .collect(),
        ))
    }

    fn find_whole_nodes(
        &self,
        gpus: u32,
        account: &AccountId,
        filter: &NodeFilter,
        shape: &Shape,
    ) -> Option<Placement> {
        let whole = |idx: &usize| {
            self.free[*idx] == self.meta[*idx].all && self.allowed(*idx, account, filter, shape)
        };
        // Node order on a uniform cluster (no allocation on the hot path); the largest nodes
        // first on a mixed one, so a job spans as few nodes as it can.
        let n = self.meta.len();
        let mut largest_first = Vec::new();
        if !self.uniform {
            largest_first = (0..n).collect();
            largest_first.sort_by_key(|idx| std::cmp::Reverse(self.meta[*idx].spec.gpus));
        }
        let order = (0..n)
            .filter(|_| self.uniform)
            .chain(largest_first.iter().copied());
        let mut slots = Vec::new();
        let mut left = gpus;
        for idx in order.filter(whole) {
            if left == 0 {
                break;
            }
            let take = left.min(self.meta[idx].spec.gpus);
            slots.push(Slot {
                node: idx,
                mask: lowest_bits(self.free[idx], take),
            });
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
        if more == 0 {
            return None;
        }
        let single_node = held.0.len() == 1 && held.gpu_count() < self.gpus_per_node_max;
        if single_node {
            let node = held.0[0].node;
            let n = self.free[node].count_ones().min(more);
            return (n > 0).then(|| {
                Placement(vec![Slot {
                    node,
                    mask: lowest_bits(self.free[node], n),
                }])
            });
        }
        let mut slots = Vec::new();
        let mut left = more;
        for (idx, meta) in self.meta.iter().enumerate() {
            if left < meta.spec.gpus {
                continue;
            }
            if self.free[idx] != meta.all
                || !self.allowed(idx, account, filter, shape)
                || held.nodes().any(|n| n == idx)
            {
                continue;
            }
            slots.push(Slot {
                node: idx,
                mask: meta.all,
            });
            left -= meta.spec.gpus;
        }
        (!slots.is_empty()).then_some(Placement(slots))
    }

    /// How `placement` breaks `shape`, if it does: a node with another count of GPUs than
    /// asked per node, more nodes than allowed, a GPU of another model.
    pub fn breaks_shape(&self, placement: &Placement, shape: &Shape) -> Option<String> {
        if let Some(max) = shape.max_nodes {
            if placement.0.len() > max as usize {
                return Some(format!("{} nodes, at most {max} asked", placement.0.len()));
            }
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
            if !shape.allows_model(spec.gpu_model) {
                return Some(format!("{} has {} GPUs", spec.id, spec.gpu_model));
            }
        }
        None
    }

    /// Takes the GPUs of a placement. Panics in debug builds if any is already held: that
    /// would be a scheduler bug, and the invariant checks in tests look for it.
    pub fn take(&mut self, placement: &Placement) {
        for slot in &placement.0 {
            debug_assert_eq!(
                self.free[slot.node] & slot.mask,
                slot.mask,
                "GPU allocated twice"
            );
            self.free[slot.node] &= !slot.mask;
            self.free_count -= slot.mask.count_ones();
        }
    }

    /// Marks a placement's GPUs as held, whether or not they already are (planning copies,
    /// where a held GPU may be claimed by a plan that ends before another begins).
    pub fn hold(&mut self, placement: &Placement) {
        for slot in &placement.0 {
            let newly = self.free[slot.node] & slot.mask;
            self.free[slot.node] &= !slot.mask;
            self.free_count -= newly.count_ones();
        }
    }

    pub fn release(&mut self, placement: &Placement) {
        for slot in &placement.0 {
            debug_assert_eq!(self.free[slot.node] & slot.mask, 0, "GPU released twice");
            self.free[slot.node] |= slot.mask;
            self.free_count += slot.mask.count_ones();
        }
    }

    /// True when both have exactly the same GPUs free.
    pub fn same_free(&self, other: &Cluster) -> bool {
        self.free == other.free
    }

    /// True when every GPU of the placement is free.
    pub fn is_free(&self, placement: &Placement) -> bool {
        placement
            .0
            .iter()
            .all(|s| self.free[s.node] & s.mask == s.mask)
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
                Some(Slot { node, mask })
            })
            .collect::<Option<Vec<_>>>()
            .map(Placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{GpuModel, NodeId};

    /// Node `n{i:03}` with `gpus` GPUs of `model`.
    fn node(i: usize, gpus: u32, model: GpuModel) -> NodeSpec {
        NodeSpec {
            id: NodeId::new(format!("n{i:03}")).unwrap(),
            gpus,
            gpu_model: model,
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
            gpu_models: vec![GpuModel::H100Sxm],
            ..Shape::default()
        };
        let p = c.find(2, &a, &any, &h100).unwrap();
        assert_eq!(c.to_allocation(&p).to_string(), "n006:0-1");
        assert!(
            c.find(9, &a, &any, &h100).is_none(),
            "one H100 node is free"
        );
        let a100 = Shape {
            gpu_models: vec![GpuModel::A100],
            ..Shape::default()
        };
        let p = c.find(8, &a, &any, &a100).unwrap();
        assert_eq!(p.0.len(), 4, "an A100 job of 8 needs the four 2-GPU nodes");
        assert!(p.0.iter().all(|s| s.node < 4));
    }
}
