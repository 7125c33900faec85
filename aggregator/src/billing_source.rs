//! The stored tables as billing's [`UsageSource`]: what each GPU measured per hour from the
//! hourly rollups, the job events, and jobs' FLOP/s reports. Billing's own policy
//! ([`gpuledger_billing::source::gather`]) turns these rows into what it prices: reconciled
//! with the allocations, billed as labelled, or by allocation.

use gpuledger_billing::source::{GpuHour, ReportedFlops, UsageSource};
use gpuledger_model::job::JobEvent;

use crate::query::Query;
use crate::{Error, Result};

/// The tables behind `query`, read on `runtime` (so call it outside any runtime).
#[derive(Debug)]
pub struct TablesUsage<'a> {
    query: &'a Query,
    runtime: &'a tokio::runtime::Runtime,
}

impl<'a> TablesUsage<'a> {
    pub fn new(query: &'a Query, runtime: &'a tokio::runtime::Runtime) -> Self {
        TablesUsage { query, runtime }
    }
}

impl UsageSource for TablesUsage<'_> {
    type Error = Error;

    fn gpu_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<GpuHour>> {
        self.runtime.block_on(self.query.gpu_hours(from_ms, to_ms))
    }

    fn job_events(&self, to_ms: i64) -> Result<Vec<JobEvent>> {
        self.runtime.block_on(self.query.job_events_before(to_ms))
    }

    fn reported_flops(&self) -> Result<Vec<ReportedFlops>> {
        self.runtime.block_on(self.query.reported_mfu())
    }
}
