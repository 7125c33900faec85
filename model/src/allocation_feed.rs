//! The allocation feed (`GET /api/v1/allocations`): which job holds each GPU, so that an
//! exporter labels each GPU's samples with its job and tenant. gpuledger's scheduler serves it
//! from its own placements, the aggregator from the allocations its job events carry (a Slurm
//! follower's, a scheduler's); the exporter reads it, either for every GPU's label or, with a
//! job-mapping directory in dcgm-exporter's format (job ids only), for each job's account.
//! A node's token reads its own node's rows only.

use serde::{Deserialize, Serialize};

/// The route, on the scheduler and on the aggregator.
pub const ALLOCATIONS_PATH: &str = "/api/v1/allocations";

/// One GPU held by a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRow {
    pub node: String,
    pub gpu: u32,
    pub job_id: String,
    pub account: String,
    #[serde(default)]
    pub project: Option<String>,
    /// The job's part of the GPU where it holds a part (several rows then name one GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::GpuShare>,
}

/// The reply: every GPU held, of the nodes the caller may see.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationFeed {
    pub gpus: Vec<AllocationRow>,
}
