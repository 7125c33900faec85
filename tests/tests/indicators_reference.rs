//! Each indicator, computed by DataFusion SQL over the stored Parquet, equals a brute-force
//! reference computed in plain Rust from the same random samples and job events.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::query::Query;
use gpuledger_aggregator::store::{Store, StoreOptions};
use gpuledger_aggregator::{Ingestor, IngestorConfig};
use gpuledger_model::job::{JobEvent, JobEventKind, Outcome};
use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};
use gpuledger_model::stats::percentile;
use gpuledger_model::time::ManualClock;
use gpuledger_model::GpuModel;
use proptest::prelude::*;

const T0: i64 = 1_780_272_000_000; // 2026-06-01T00:00:00Z
const JOBS: [(&str, &str); 3] = [("j1", "alpha"), ("j2", "alpha"), ("j3", "beta")];

#[derive(Clone, Debug)]
struct Cell {
    present: bool,
    job: Option<usize>,
    util: Option<u8>,
    tensor: Option<u8>,
    clock: Option<u16>,
    mem_gib: Option<u8>,
}

fn cell() -> impl Strategy<Value = Cell> {
    (
        prop::bool::weighted(0.9),
        prop::option::of(0..JOBS.len()),
        prop::option::of(0u8..=100),
        prop::option::of(0u8..=8),
        prop::option::of(900u16..=1980),
        prop::option::of(0u8..=80),
    )
        .prop_map(|(present, job, util, tensor, clock, mem_gib)| Cell {
            present,
            job,
            util,
            tensor,
            clock,
            mem_gib,
        })
}

#[derive(Clone, Debug)]
struct Job {
    account: usize,
    submit_s: i64,
    wait_s: Option<i64>,
    outcome: Option<bool>,
}

fn job() -> impl Strategy<Value = Job> {
    (
        0usize..2,
        0i64..80_000,
        prop::option::of(0i64..5_000),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(account, submit_s, wait_s, outcome)| Job {
            account,
            submit_s,
            wait_s,
            outcome,
        })
}

/// Node x GPU x 10-minute step (12 steps: two hours), each with its own interval.
/// The ingest rules of the two-node small cluster (accounts alpha, beta, gamma).
fn small_cluster_rules() -> IngestorConfig {
    let config = gpuledger_model::ClusterConfig::from_toml_str(
        &gpuledger_tests::small_cluster_toml(2),
        "small.toml",
    )
    .unwrap();
    IngestorConfig::new(gpuledger_model::Inventory::from_config(&config))
}

fn rows(cells: &[Cell]) -> Vec<SampleRow> {
    let mut out = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        if !c.present {
            continue;
        }
        let (node, gpu, step) = (i / 48, (i / 12) % 4, i % 12);
        let job = c.job.map(|j| JOBS[j]);
        out.push(SampleRow {
            time_ms: T0 + step as i64 * 600_000,
            interval_s: 600,
            node: format!("node{:03}", node + 1),
            gpu_index: gpu as u16,
            gpu_uuid: format!("GPU-{node}-{gpu}"),
            gpu_model: "h100-sxm".into(),
            mig_instance: None,
            job_id: job.map(|(j, _)| j.to_owned()),
            account: job.map(|(_, a)| a.to_owned()),
            project: None,
            gpu_util_pct: c.util.map(f32::from),
            sm_active: None,
            tensor_active: c.tensor.map(|t| f32::from(t) / 8.0),
            dram_active: None,
            sm_clock_mhz: c.clock.map(u32::from),
            mem_used_bytes: c.mem_gib.map(|g| u64::from(g) << 30),
            mem_total_bytes: c.mem_gib.map(|_| 80 << 30),
            power_w: None,
            energy_j: None,
            xid: None,
        });
    }
    out
}

#[derive(Debug, Default, PartialEq)]
struct Reference {
    gpu_seconds: i64,
    util: (f64, i64),
    mfu: (f64, i64),
    mem: (f64, f64),
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
        _ => false,
    }
}

fn events(jobs: &[Job]) -> Vec<JobEvent> {
    let accounts = ["alpha", "beta"];
    let mut out = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let id = format!("q{i}").parse().unwrap();
        let account = accounts[j.account].parse().unwrap();
        let at = |s: i64| T0 + s * 1000;
        let mut e = JobEvent::new(at(j.submit_s), id, account, None, JobEventKind::Submitted);
        out.push(e.clone());
        if let Some(w) = j.wait_s {
            e.kind = JobEventKind::Started;
            e.time_ms = at(j.submit_s + w);
            e.gpus = Some(1);
            out.push(e.clone());
            if let Some(ok) = j.outcome {
                e.kind = JobEventKind::Finished;
                e.time_ms = at(j.submit_s + w + 60);
                e.outcome = Some(if ok {
                    Outcome::Completed
                } else {
                    Outcome::Failed
                });
                out.push(e);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn indicators_equal_a_brute_force_reference(
        cells in prop::collection::vec(cell(), 96),
        jobs in prop::collection::vec(job(), 0..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
        let ingestor = Ingestor::new(store, small_cluster_rules(), Arc::new(ManualClock::new(T0 + 86_400_000)));
        let rows = rows(&cells);
        for (seq, node) in ["node001", "node002"].iter().enumerate() {
            let mut b = SampleBatchBuilder::with_capacity(rows.len());
            for r in rows.iter().filter(|r| r.node == *node) {
                b.push(r);
            }
            if !b.is_empty() {
                ingestor.ingest_samples(node, seq as u64, &b.finish().unwrap()).unwrap();
            }
        }
        ingestor
            .ingest_job_events("sched", None, &events(&jobs))
            .unwrap()
            .into_result()
            .unwrap();
        ingestor.flush().unwrap();

        // The reference.
        let rated = f64::from(GpuModel::H100Sxm.rated_sm_clock_mhz());
        let mut reference: BTreeMap<String, Reference> = BTreeMap::new();
        let (mut busy, mut all) = (0i64, 0i64);
        for r in &rows {
            let s = i64::from(r.interval_s);
            all += s;
            let Some(account) = &r.account else { continue };
            busy += s;
            let e = reference.entry(account.clone()).or_default();
            e.gpu_seconds += s;
            if let Some(u) = r.gpu_util_pct {
                e.util.0 += f64::from(u) * s as f64;
                e.util.1 += s;
            }
            if let (Some(t), Some(c)) = (r.tensor_active, r.sm_clock_mhz) {
                e.mfu.0 += f64::from(t) * f64::from(c) / rated * s as f64;
                e.mfu.1 += s;
            }
            if let (Some(u), Some(t)) = (r.mem_used_bytes, r.mem_total_bytes) {
                e.mem.0 += u as f64 * s as f64;
                e.mem.1 += t as f64 * s as f64;
            }
        }

        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let query = rt.block_on(Query::open(&Layout::new(dir.path()))).unwrap();
        let (from, to) = (T0, T0 + 86_400_000);
        let got = rt.block_on(query.account_indicators(from, to)).unwrap();
        let utilization = rt.block_on(query.cluster_utilization(from, to)).unwrap();
        prop_assert!(close(utilization, ratio(busy as f64, all as f64)), "{utilization:?} vs {busy}/{all}");

        for (account, r) in &reference {
            let g = got.iter().find(|g| &g.account == account).unwrap();
            prop_assert_eq!(g.gpu_seconds, r.gpu_seconds);
            prop_assert!(close(g.mean_gpu_util_pct, ratio(r.util.0, r.util.1 as f64)), "util {account}");
            prop_assert!(close(g.mean_mfu, ratio(r.mfu.0, r.mfu.1 as f64)), "mfu {account}");
            prop_assert!(close(g.mean_mem_util, ratio(r.mem.0, r.mem.1)), "mem {account}");
        }
        for (a, account) in ["alpha", "beta"].iter().enumerate() {
            let mine: Vec<&Job> = jobs.iter().filter(|j| j.account == a).collect();
            let Some(g) = got.iter().find(|g| g.account == *account) else {
                prop_assert!(mine.is_empty() && !reference.contains_key(*account));
                continue;
            };
            let mut waits: Vec<i64> = mine.iter().filter_map(|j| j.wait_s.map(|w| w * 1000)).collect();
            waits.sort_unstable();
            let secs = |ms: Option<i64>| ms.map(|m| m as f64 / 1000.0);
            prop_assert_eq!(g.jobs, mine.len() as i64);
            prop_assert_eq!(g.p50_queue_wait_s, secs(percentile(&waits, 50.0)));
            prop_assert_eq!(g.p95_queue_wait_s, secs(percentile(&waits, 95.0)));
            prop_assert_eq!(g.max_queue_wait_s, secs(waits.last().copied()));
            let mean = (!waits.is_empty()).then(|| waits.iter().sum::<i64>() as f64 / waits.len() as f64 / 1000.0);
            prop_assert!(close(g.mean_queue_wait_s, mean));
            let finished = mine.iter().filter(|j| j.wait_s.is_some() && j.outcome.is_some()).count();
            let completed = mine.iter().filter(|j| j.wait_s.is_some() && j.outcome == Some(true)).count();
            prop_assert!(close(g.success_rate, ratio(completed as f64, finished as f64)));
        }
    }
}

/// A month of a big cluster has more memory byte-seconds than an i64 holds: the ratio must be
/// summed in floating point, not overflow (it once printed 299.9%).
#[test]
fn memory_utilization_does_not_overflow_over_a_big_month() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    // One node of 64 GPUs.
    let big =
        gpuledger_tests::small_cluster_toml(1).replace("gpus_per_node = 8", "gpus_per_node = 64");
    let config = gpuledger_model::ClusterConfig::from_toml_str(&big, "big.toml").unwrap();
    let ingestor = Ingestor::new(
        store,
        IngestorConfig::new(gpuledger_model::Inventory::from_config(&config)),
        Arc::new(ManualClock::new(T0 + 40 * 86_400_000)),
    );
    let hours = 520;
    for gpu in 0..64u16 {
        let mut b = SampleBatchBuilder::with_capacity(hours);
        for h in 0..hours {
            b.push(&SampleRow {
                time_ms: T0 + h as i64 * 3_600_000,
                interval_s: 3600,
                node: "node001".into(),
                gpu_index: gpu,
                gpu_uuid: format!("GPU-{gpu}"),
                gpu_model: "h100-sxm".into(),
                mig_instance: None,
                job_id: Some("j1".into()),
                account: Some("alpha".into()),
                project: None,
                gpu_util_pct: Some(100.0),
                sm_active: None,
                tensor_active: None,
                dram_active: None,
                sm_clock_mhz: None,
                mem_used_bytes: Some(60 << 30),
                mem_total_bytes: Some(80 << 30),
                power_w: None,
                energy_j: None,
                xid: None,
            });
        }
        ingestor
            .ingest_samples("node001", u64::from(gpu), &b.finish().unwrap())
            .unwrap();
    }
    ingestor.flush().unwrap();
    let total: f64 = 64.0 * hours as f64 * 3600.0 * (80u64 << 30) as f64;
    assert!(total > i64::MAX as f64, "the test must pass i64's range");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let query = rt.block_on(Query::open(&Layout::new(dir.path()))).unwrap();
    let got = rt
        .block_on(query.account_indicators(T0, T0 + 40 * 86_400_000))
        .unwrap();
    let mem = got[0].mean_mem_util.unwrap();
    assert!((mem - 0.75).abs() < 1e-12, "{mem}");
}
