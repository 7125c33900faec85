//! End-to-end tests across gpuledger's crates live in `tests/tests/`; this library holds the
//! small fixtures they share.

/// A cluster of `nodes` H100 nodes with three accounts, for end-to-end tests.
pub fn small_cluster_toml(nodes: u32) -> String {
    format!(
        r#"version = 1
[cluster]
name = "small"

[[node_pools]]
name = "h100"
prefix = "node"
count = {nodes}
gpus_per_node = 8
gpu_model = "h100-sxm"

[[partitions]]
name = "train"
priority_tier = 20
default = true

[[partitions]]
name = "urgent"
priority_tier = 50

[prices]
version = "test-1"
effective_from = "2026-06-01"
currency = "CNY"
gpu_hour = {{ h100-sxm = "10.00" }}

[[accounts]]
id = "alpha"
name = "Alpha"
weight = 3
projects = [{{ id = "train" }}]

[[accounts]]
id = "beta"
name = "Beta"
weight = 1
projects = [{{ id = "sweep" }}]

[[accounts]]
id = "gamma"
name = "Gamma"
weight = 1
quota = {{ max_gpus_per_job = 4 }}
"#
    )
}

/// One day of jobs for the small cluster: enough to queue, fail, and run past midnight.
pub const SMALL_DAY_TOML: &str = r#"sample_interval_s = 10

[workload]
seed = 7
start = "2026-06-01T00:00:00Z"
days = 1

[[workload.fixed_jobs]]
account = "alpha"
project = "train"
gpus = 16
submit_after = "2h"
run_time = "30h"

[[workload.teams]]
account = "alpha"
project = "train"
jobs_per_day = 6
gpus = [[8, 1.0]]
run_time_min = "20m"
run_time_max = "5h"
failure_rate = 0.2

[[workload.teams]]
account = "beta"
project = "sweep"
jobs_per_day = 20
gpus = [[1, 0.5], [2, 0.3], [4, 0.2]]
run_time_min = "5m"
run_time_max = "3h"
failure_rate = 0.1

[[workload.teams]]
account = "gamma"
jobs_per_day = 4
gpus = [[2, 0.5], [8, 0.5]]
run_time_min = "10m"
run_time_max = "1h"

[[telemetry]]
account = "alpha"
gpu_util_pct = 95
sm_active = 0.8
tensor_active = 0.45
dram_active = 0.4
memory_fraction = 0.9
power_fraction = 0.8
"#;

/// Sample `i` of a node's batch: eight GPUs every 10 s from `t0_ms`; two GPUs in three work
/// for one of four jobs of `alpha` (every other one in project `train`), the rest idle.
pub fn sample_row(i: usize, t0_ms: i64, node: &str) -> gpuledger_model::sample::SampleRow {
    let busy = !i.is_multiple_of(3);
    gpuledger_model::sample::SampleRow {
        time_ms: t0_ms + (i as i64 / 8) * 10_000,
        interval_s: 10,
        node: node.into(),
        gpu_index: (i % 8) as u16,
        gpu_uuid: format!("GPU-{node}-{:04}", i % 8),
        gpu_model: "h100-sxm".into(),
        mig_instance: None,
        job_id: busy.then(|| format!("{}", 1000 + i % 4)),
        account: busy.then(|| "alpha".to_owned()),
        project: (busy && i.is_multiple_of(2)).then(|| "train".to_owned()),
        gpu_util_pct: Some((i % 101) as f32),
        sm_active: Some(0.5),
        tensor_active: Some(0.25),
        dram_active: Some(0.125),
        sm_clock_mhz: Some(1830),
        mem_used_bytes: Some(1 << 30),
        mem_total_bytes: Some(80 << 30),
        power_w: Some(512.5),
        energy_j: Some(5125.0),
        xid: None,
    }
}

/// A batch of the rows `range` of [`sample_row`].
pub fn sample_batch(
    range: std::ops::Range<usize>,
    t0_ms: i64,
    node: &str,
) -> arrow::record_batch::RecordBatch {
    let mut b = gpuledger_model::sample::SampleBatchBuilder::with_capacity(range.len());
    for i in range {
        b.push(&sample_row(i, t0_ms, node));
    }
    b.finish().expect("fixture rows fit the schema")
}
