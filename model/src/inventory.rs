//! What the cluster config says exists, in the shape the ingest path checks sample rows
//! against: each node with its GPU count and model, each account with its projects, and what
//! becomes of a row that names a tenant the config does not know. A node's token proves who
//! pushed a batch, not that what it says is possible; this is what "possible" means.

use std::collections::{HashMap, HashSet};

use crate::config::{ClusterConfig, UnknownTenants};
use crate::gpu::GpuModel;

/// The account a row of an unknown tenant is booked to under [`UnknownTenants::Platform`]
/// (the same account billing books idle capacity to).
pub const PLATFORM_ACCOUNT: &str = "platform";

/// MIG slots a GPU can have at most (GPU instance ids run 0-14 on A100 and H100).
pub const MAX_MIG_SLOTS: u32 = 15;

/// One node as the config defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub gpus: u32,
    pub gpu_model: GpuModel,
}

/// Nodes, accounts and projects the cluster config defines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    nodes: HashMap<String, NodeFacts>,
    /// The nodes whose batches are taken (the aggregator's `--node`); all when `None`.
    pushing: Option<HashSet<String>>,
    accounts: HashMap<String, HashSet<String>>,
    unknown_tenants: UnknownTenants,
}

/// Why a list of nodes cannot narrow an inventory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node `{0}` is not a node of the cluster config; its node pools define the nodes")]
pub struct NotANode(pub String);

impl Inventory {
    /// An inventory of these nodes and accounts (each with its projects).
    pub fn new(
        nodes: impl IntoIterator<Item = (String, NodeFacts)>,
        accounts: impl IntoIterator<Item = (String, Vec<String>)>,
        unknown_tenants: UnknownTenants,
    ) -> Self {
        Inventory {
            nodes: nodes.into_iter().collect(),
            pushing: None,
            accounts: accounts
                .into_iter()
                .map(|(a, projects)| (a, projects.into_iter().collect()))
                .collect(),
            unknown_tenants,
        }
    }

    pub fn from_config(config: &ClusterConfig) -> Self {
        Inventory {
            nodes: config
                .nodes()
                .into_iter()
                .map(|n| {
                    (
                        n.id.to_string(),
                        NodeFacts {
                            gpus: n.gpus,
                            gpu_model: n.gpu_model,
                        },
                    )
                })
                .collect(),
            pushing: None,
            accounts: config
                .accounts
                .iter()
                .map(|a| {
                    let projects = a.projects.iter().map(|p| p.id.to_string()).collect();
                    (a.id.to_string(), projects)
                })
                .collect(),
            unknown_tenants: config.telemetry.unknown_tenants,
        }
    }

    /// Takes batches only from `nodes` (the aggregator's `--node`); each must be a node of the
    /// config. Jobs' allocations may still name any node of the config.
    pub fn only_nodes(mut self, nodes: &[String]) -> Result<Self, NotANode> {
        if nodes.is_empty() {
            return Ok(self);
        }
        if let Some(stranger) = nodes.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(NotANode(stranger.clone()));
        }
        self.pushing = Some(nodes.iter().cloned().collect());
        Ok(self)
    }

    /// The node, if its batches are taken.
    pub fn node(&self, name: &str) -> Option<NodeFacts> {
        if self.pushing.as_ref().is_some_and(|p| !p.contains(name)) {
            return None;
        }
        self.cluster_node(name)
    }

    /// The node, if the config defines it (whether or not its batches are taken here).
    pub fn cluster_node(&self, name: &str) -> Option<NodeFacts> {
        self.nodes.get(name).copied()
    }

    /// Every GPU of the config's nodes: no job holds more.
    pub fn cluster_gpus(&self) -> u64 {
        self.nodes.values().map(|n| u64::from(n.gpus)).sum()
    }

    pub fn has_account(&self, account: &str) -> bool {
        self.accounts.contains_key(account)
    }

    /// Whether `project` is one of `account`'s (false when the account is unknown).
    pub fn has_project(&self, account: &str, project: &str) -> bool {
        self.accounts
            .get(account)
            .is_some_and(|projects| projects.contains(project))
    }

    pub fn unknown_tenants(&self) -> UnknownTenants {
        self.unknown_tenants
    }
}

/// Checks a `mig_instance` value, `<profile>/<slot>` (e.g. `1g.10gb/3`): a profile of
/// letters, digits, `.`, `+`, `_` or `-`, and a slot below [`MAX_MIG_SLOTS`].
pub fn check_mig_instance(value: &str) -> Result<(), String> {
    let Some((profile, slot)) = value.rsplit_once('/') else {
        return Err(format!(
            "`{value}` is not `<profile>/<slot>`, e.g. `1g.10gb/3`"
        ));
    };
    if profile.is_empty()
        || profile.len() > 32
        || !profile
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_' | '-'))
    {
        return Err(format!(
            "profile `{}` is not a MIG profile (letters, digits, '.', '+', '_', '-')",
            profile.escape_debug()
        ));
    }
    match slot.parse::<u32>() {
        Ok(s) if s < MAX_MIG_SLOTS && !slot.starts_with('+') => Ok(()),
        _ => Err(format!(
            "slot `{}` is not a MIG slot 0-{}",
            slot.escape_debug(),
            MAX_MIG_SLOTS - 1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_instances_are_a_profile_and_a_slot_a_gpu_can_have() {
        for ok in ["1g.10gb/0", "3g.40gb/14", "1g.20gb+me/3", "mig/2"] {
            assert_eq!(check_mig_instance(ok), Ok(()), "{ok}");
        }
        for bad in [
            "1g.10gb",
            "1g.10gb/15",
            "1g.10gb/-1",
            "/3",
            "a b/1",
            "x/+1",
            "x/4294967296",
        ] {
            assert!(check_mig_instance(bad).is_err(), "{bad}");
        }
    }
}
