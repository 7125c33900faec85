//! Which GPUs of which nodes a job holds, and its text form `gpu001:0-3,6;gpu002:0-7`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{IdError, NodeId};
use crate::share::{GpuShare, GpuShareError, SHARE_UNITS_PER_GPU};

/// The GPUs a job holds on one node (sorted indices).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeGpus {
    pub node: NodeId,
    pub gpus: Vec<u32>,
    /// A part of the one GPU in `gpus` rather than all of it (written `node:3@250m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<GpuShare>,
}

impl NodeGpus {
    /// Whole GPUs on `node`.
    pub fn whole(node: NodeId, gpus: Vec<u32>) -> Self {
        NodeGpus {
            node,
            gpus,
            share: None,
        }
    }

    /// What is held here in share units ([`SHARE_UNITS_PER_GPU`] to a GPU).
    pub fn share_units(&self) -> u64 {
        match self.share {
            Some(share) => u64::from(share.units()),
            None => self.gpus.len() as u64 * u64::from(SHARE_UNITS_PER_GPU),
        }
    }
}

/// All the GPUs a job holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Allocation(pub Vec<NodeGpus>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("`{0}` is not an allocation; write node:gpus;node:gpus, e.g. gpu001:0-3,6;gpu002:0-7")]
    Syntax(String),
    #[error(transparent)]
    Node(#[from] IdError),
    #[error(transparent)]
    Share(#[from] GpuShareError),
}

impl Allocation {
    pub fn gpu_count(&self) -> u32 {
        self.0.iter().map(|n| n.gpus.len() as u32).sum()
    }

    /// What the allocation holds in share units ([`SHARE_UNITS_PER_GPU`] to a GPU): a part
    /// of a GPU counts as its part.
    pub fn share_units(&self) -> u64 {
        self.0.iter().map(NodeGpus::share_units).sum()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.0.iter().map(|n| &n.node)
    }
}

fn write_ranges(f: &mut fmt::Formatter<'_>, gpus: &[u32]) -> fmt::Result {
    let mut i = 0;
    let mut first = true;
    while i < gpus.len() {
        let mut j = i;
        while j + 1 < gpus.len() && gpus[j + 1] == gpus[j] + 1 {
            j += 1;
        }
        if !first {
            f.write_str(",")?;
        }
        first = false;
        if j > i {
            write!(f, "{}-{}", gpus[i], gpus[j])?;
        } else {
            write!(f, "{}", gpus[i])?;
        }
        i = j + 1;
    }
    Ok(())
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, n) in self.0.iter().enumerate() {
            if k > 0 {
                f.write_str(";")?;
            }
            write!(f, "{}:", n.node)?;
            write_ranges(f, &n.gpus)?;
            if let Some(share) = n.share {
                write!(f, "@{share}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Allocation {
    type Err = AllocationError;
    fn from_str(s: &str) -> Result<Self, AllocationError> {
        let syntax = || AllocationError::Syntax(s.to_owned());
        if s.is_empty() {
            return Ok(Allocation::default());
        }
        let mut out = Vec::new();
        for part in s.split(';') {
            let (node, list) = part.split_once(':').ok_or_else(syntax)?;
            let (list, share) = match list.split_once('@') {
                Some((list, share)) => (list, Some(share.parse::<GpuShare>()?)),
                None => (list, None),
            };
            let mut gpus = Vec::new();
            for range in list.split(',') {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let lo: u32 = lo.parse().map_err(|_| syntax())?;
                let hi: u32 = hi.parse().map_err(|_| syntax())?;
                if hi < lo {
                    return Err(syntax());
                }
                gpus.extend(lo..=hi);
            }
            gpus.sort_unstable();
            gpus.dedup();
            if share.is_some() && gpus.len() != 1 {
                return Err(syntax());
            }
            out.push(NodeGpus {
                node: NodeId::new(node)?,
                gpus,
                share,
            });
        }
        Ok(Allocation(out))
    }
}

impl TryFrom<String> for Allocation {
    type Error = AllocationError;
    fn try_from(s: String) -> Result<Self, AllocationError> {
        s.parse()
    }
}

impl From<Allocation> for String {
    fn from(a: Allocation) -> String {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        let a: Allocation = "gpu001:0-3,6;gpu002:0-7".parse().unwrap();
        assert_eq!(a.gpu_count(), 13);
        assert_eq!(a.to_string(), "gpu001:0-3,6;gpu002:0-7");
        assert!("gpu001".parse::<Allocation>().is_err());
        assert!("gpu001:3-1".parse::<Allocation>().is_err());
    }

    #[test]
    fn a_part_of_a_gpu_is_written_after_its_index() {
        let a: Allocation = "gpu001:3@250m;gpu002:0-1".parse().unwrap();
        assert_eq!(a.0[0].share, Some(GpuShare::Milli(250)));
        assert_eq!(a.to_string(), "gpu001:3@250m;gpu002:0-1");
        assert_eq!(a.share_units(), 250 * 7 + 2 * 7000);
        // A share is of one GPU; an unknown share is refused.
        assert!("gpu001:0-1@3g".parse::<Allocation>().is_err());
        assert!("gpu001:0@9g".parse::<Allocation>().is_err());
    }
}
