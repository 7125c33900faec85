//! The stored tables as billing's [`UsageSource`]: usage by telemetry from the hourly rollups,
//! by allocation from the job events, idle capacity and jobs' FLOP/s reports. Billing's own
//! policy ([`gpuledger_billing::source::gather`]) turns these rows into what it prices.

use std::collections::HashMap;

use gpuledger_billing::source::{IdleGpuHour, MeteredHour, ReportedFlops, UsageSource};
use gpuledger_model::{ClusterConfig, GpuModel};

use crate::query::Query;
use crate::{Error, Result};

/// The tables behind `query`, read on `runtime` (so call it outside any runtime). Usage by
/// allocation needs the cluster config (each node's GPU model).
#[derive(Debug)]
pub struct TablesUsage<'a> {
    query: &'a Query,
    runtime: &'a tokio::runtime::Runtime,
    config: Option<&'a ClusterConfig>,
}

impl<'a> TablesUsage<'a> {
    pub fn new(query: &'a Query, runtime: &'a tokio::runtime::Runtime) -> Self {
        TablesUsage {
            query,
            runtime,
            config: None,
        }
    }

    /// With the cluster config, for usage by allocation.
    pub fn with_config(mut self, config: &'a ClusterConfig) -> Self {
        self.config = Some(config);
        self
    }
}

impl UsageSource for TablesUsage<'_> {
    type Error = Error;

    fn telemetry_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<MeteredHour>> {
        self.runtime
            .block_on(self.query.billable_hours(from_ms, to_ms))
    }

    fn allocation_hours(&self, from_ms: i64, to_ms: i64, now_ms: i64) -> Result<Vec<MeteredHour>> {
        let config = self.config.ok_or_else(|| {
            Error::Config(
                "usage by allocation needs the cluster config (each node's GPU model)".into(),
            )
        })?;
        let nodes: HashMap<String, GpuModel> = config
            .nodes()
            .into_iter()
            .map(|n| (n.id.to_string(), n.gpu_model))
            .collect();
        let mut models: Vec<GpuModel> = config.node_pools.iter().map(|p| p.gpu_model).collect();
        models.dedup();
        let only_model = (models.len() == 1).then(|| models[0]);
        let events = self.runtime.block_on(self.query.job_events_before(to_ms))?;
        crate::allocation::allocation_hours(
            &events,
            from_ms,
            to_ms,
            now_ms,
            &|n| nodes.get(n).copied(),
            only_model,
        )
        .map_err(|e| Error::Config(e.to_string()))
    }

    fn idle_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<IdleGpuHour>> {
        self.runtime.block_on(self.query.idle_hours(from_ms, to_ms))
    }

    fn reported_flops(&self) -> Result<Vec<ReportedFlops>> {
        self.runtime.block_on(self.query.reported_mfu())
    }
}
