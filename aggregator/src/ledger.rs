//! The stored telemetry reconciled with the jobs' allocations, as the services show it: the
//! status page's usage, cost and coverage gaps, and `/metrics`' flagged GPU-seconds per node and
//! reason. The policy is billing's ([`gpuledger_billing::reconcile`]); this reads its inputs
//! from the tables, the same way `gpuledger invoice` does.

use gpuledger_billing::allocation::held_runs;
use gpuledger_billing::reconcile::{as_labelled, reconcile, Reconciled};
use gpuledger_billing::source::NodeModels;
use gpuledger_model::config::AllocationSource;
use gpuledger_model::time::UnixMillis;
use gpuledger_model::ClusterConfig;

use crate::query::Query;
use crate::{Error, Result};

/// `[from_ms, to_ms)` of the tables reconciled as the cluster's config says: with the job
/// events as allocations (runs still going held up to `now_ms`), or as labelled where the
/// cluster has no allocation source.
pub async fn reconciled(
    query: &Query,
    config: &ClusterConfig,
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    now_ms: UnixMillis,
) -> Result<Reconciled> {
    let telemetry = query.gpu_hours(from_ms, to_ms).await?;
    match config.telemetry.allocations {
        AllocationSource::None => Ok(as_labelled(&telemetry, from_ms, to_ms)),
        AllocationSource::Events => {
            let events = query.job_events_before(to_ms).await?;
            let runs = held_runs(&events, now_ms.min(to_ms));
            let nodes = NodeModels::from_config(config);
            reconcile(
                &telemetry,
                &runs,
                from_ms,
                to_ms,
                &|n| nodes.model_of(n),
                nodes.only_model(),
            )
            .map_err(|e| Error::Config(format!("reconciling usage: {e}")))
        }
    }
}
