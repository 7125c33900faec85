//! Node-granular placement. Jobs of up to one node's GPUs are packed best-fit onto the fullest
//! node that still fits them, which keeps whole nodes free for multi-node jobs; multi-node jobs
//! take whole free nodes. Dedicated pools are used only by their owner.

use gpuledger_model::config::NodeSpec;
use gpuledger_model::{AccountId, Allocation, NodeGpus};

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
}

#[derive(Clone, Debug)]
struct NodeState {
    spec: NodeSpec,
    all: u64,
    free: u64,
}

/// Free and held GPUs of every node.
#[derive(Clone, Debug)]
pub struct Cluster {
    nodes: Vec<NodeState>,
    gpus_per_node_max: u32,
}

fn full_mask(gpus: u32) -> u64 {
    if gpus >= 64 {
        u64::MAX
    } else {
        (1u64 << gpus) - 1
    }
}

/// The `n` lowest set bits of `mask`.
fn lowest_bits(mask: u64, n: u32) -> u64 {
    let mut out = 0;
    let mut rest = mask;
    for _ in 0..n {
        let bit = rest & rest.wrapping_neg();
        out |= bit;
        rest &= !bit;
    }
    out
}

impl Cluster {
    pub fn new(nodes: Vec<NodeSpec>) -> Self {
        let gpus_per_node_max = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
        Cluster {
            nodes: nodes
                .into_iter()
                .map(|spec| {
                    let all = full_mask(spec.gpus);
                    NodeState {
                        spec,
                        all,
                        free: all,
                    }
                })
                .collect(),
            gpus_per_node_max,
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.spec.gpus).sum()
    }

    pub fn free_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.free.count_ones()).sum()
    }

    pub fn node_spec(&self, node: usize) -> &NodeSpec {
        &self.nodes[node].spec
    }

    fn usable_by(&self, node: &NodeState, account: &AccountId) -> bool {
        node.spec
            .dedicated_to
            .as_ref()
            .is_none_or(|owner| owner == account)
    }

    /// The most GPUs a job of `account` could ever get (all nodes it may use, empty).
    pub fn capacity_for(&self, account: &AccountId) -> u32 {
        self.nodes
            .iter()
            .filter(|n| self.usable_by(n, account))
            .map(|n| n.spec.gpus)
            .sum()
    }

    /// Where a job of `gpus` GPUs would go now, without taking it.
    pub fn find(&self, gpus: u32, account: &AccountId) -> Option<Placement> {
        if gpus == 0 {
            return None;
        }
        if gpus <= self.gpus_per_node_max {
            if let Some(p) = self.find_on_one_node(gpus, account) {
                return Some(p);
            }
        }
        self.find_whole_nodes(gpus, account)
    }

    fn find_on_one_node(&self, gpus: u32, account: &AccountId) -> Option<Placement> {
        let (idx, node) = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| self.usable_by(n, account) && n.free.count_ones() >= gpus)
            .min_by_key(|(i, n)| (n.free.count_ones(), *i))?;
        Some(Placement(vec![Slot {
            node: idx,
            mask: lowest_bits(node.free, gpus),
        }]))
    }

    fn find_whole_nodes(&self, gpus: u32, account: &AccountId) -> Option<Placement> {
        let mut slots = Vec::new();
        let mut left = gpus;
        for (idx, node) in self.nodes.iter().enumerate() {
            if left == 0 {
                break;
            }
            if node.free != node.all || !self.usable_by(node, account) {
                continue;
            }
            let take = left.min(node.spec.gpus);
            slots.push(Slot {
                node: idx,
                mask: lowest_bits(node.free, take),
            });
            left -= take;
        }
        (left == 0).then_some(Placement(slots))
    }

    /// Takes the GPUs of a placement. Panics in debug builds if any is already held: that
    /// would be a scheduler bug, and the invariant checks in tests look for it.
    pub fn take(&mut self, placement: &Placement) {
        for slot in &placement.0 {
            let node = &mut self.nodes[slot.node];
            debug_assert_eq!(node.free & slot.mask, slot.mask, "GPU allocated twice");
            node.free &= !slot.mask;
        }
    }

    pub fn release(&mut self, placement: &Placement) {
        for slot in &placement.0 {
            let node = &mut self.nodes[slot.node];
            debug_assert_eq!(node.free & slot.mask, 0, "GPU released twice");
            node.free |= slot.mask;
        }
    }

    /// True when every GPU of the placement is free.
    pub fn is_free(&self, placement: &Placement) -> bool {
        placement
            .0
            .iter()
            .all(|s| self.nodes[s.node].free & s.mask == s.mask)
    }

    /// The placement as node names and GPU indices.
    pub fn to_allocation(&self, placement: &Placement) -> Allocation {
        Allocation(
            placement
                .0
                .iter()
                .map(|s| NodeGpus {
                    node: self.nodes[s.node].spec.id.clone(),
                    gpus: (0..64).filter(|b| s.mask & (1u64 << b) != 0).collect(),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::{GpuModel, NodeId};

    fn cluster(nodes: usize) -> Cluster {
        Cluster::new(
            (1..=nodes)
                .map(|i| NodeSpec {
                    id: NodeId::new(format!("n{i:03}")).unwrap(),
                    gpus: 8,
                    gpu_model: GpuModel::H100Sxm,
                    pool: "p".into(),
                    dedicated_to: None,
                })
                .collect(),
        )
    }

    #[test]
    fn small_jobs_pack_onto_the_fullest_node() {
        let a = AccountId::new("a").unwrap();
        let mut c = cluster(2);
        let first = c.find(3, &a).unwrap();
        c.take(&first);
        let second = c.find(4, &a).unwrap();
        assert_eq!(
            second.0[0].node, first.0[0].node,
            "packs beside the first job"
        );
        c.take(&second);
        // 1 GPU left on node 0, node 1 whole: a 8-GPU job still fits.
        let whole = c.find(8, &a).unwrap();
        assert_eq!(whole.0[0].node, 1);
    }

    #[test]
    fn multi_node_jobs_need_whole_free_nodes() {
        let a = AccountId::new("a").unwrap();
        let mut c = cluster(3);
        let small = c.find(1, &a).unwrap();
        c.take(&small);
        // 23 GPUs are free, but only two whole nodes: a 24-GPU job waits (false wait).
        assert_eq!(c.free_gpus(), 23);
        assert!(c.find(24, &a).is_none());
        let p = c.find(16, &a).unwrap();
        assert_eq!(p.gpu_count(), 16);
        assert_eq!(c.to_allocation(&p).to_string(), "n002:0-7;n003:0-7");
    }
}
