//! The rows a store of usage reports ([`crate::source::UsageSource`]) and what billing makes
//! of them before pricing, text not yet checked: what each GPU measured per hour, usage per
//! job, idle capacity, jobs' FLOP/s reports.

use serde::Serialize;

/// What one GPU measured in one UTC hour for one label (job, account, project; all `None` for
/// a GPU that ran no job), as a store sums its rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuHour {
    pub node: String,
    pub gpu_index: u16,
    pub gpu_model: String,
    /// Start of the UTC hour, Unix milliseconds.
    pub hour_ms: i64,
    pub job_id: Option<String>,
    pub account: Option<String>,
    pub project: Option<String>,
    pub gpu_seconds: i64,
    pub quarter_seconds: Option<[i64; 4]>,
    pub mfu_proxy_sum: f64,
    pub mfu_seconds: i64,
}

/// GPU-seconds per job x node x UTC hour, with the sums its MFU comes from, as a store
/// reports them (text not yet checked).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeteredHour {
    pub account: String,
    pub project: Option<String>,
    pub job_id: Option<String>,
    pub node: String,
    pub gpu_model: String,
    /// Start of the UTC hour, Unix milliseconds.
    pub hour_ms: i64,
    pub gpu_seconds: i64,
    /// The GPU-seconds in each quarter of the hour, where the store knows them.
    pub quarter_seconds: Option<[i64; 4]>,
    /// Sum over the hour's seconds of the tensor-activity MFU proxy.
    pub mfu_proxy_sum: f64,
    /// Seconds the proxy was measured over.
    pub mfu_seconds: i64,
}

/// GPU-seconds sampled on GPUs that ran no job, per node, model and UTC hour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdleGpuHour {
    pub node: String,
    pub gpu_model: String,
    /// Start of the UTC hour, Unix milliseconds.
    pub hour_ms: i64,
    pub gpu_seconds: i64,
    /// The GPU-seconds in each quarter of the hour, where the store knows them.
    pub quarter_seconds: Option<[i64; 4]>,
}

/// A job's own report of what it achieved: FLOP/s over its GPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReportedFlops {
    pub job_id: String,
    pub achieved_flops: f64,
    pub gpus: i64,
}
