//! Writes the starting corpus of every fuzz target under `corpus/` (run from `fuzz/`):
//! well-formed and slightly wrong sample batches as Arrow IPC, events requests, the example
//! config and price book, dcgm-exporter fixtures. The fuzzer grows the corpus from these.

use std::fs;
use std::path::Path;

use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};
use gpuledger_model::wire::encode_ipc;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn row(i: usize) -> SampleRow {
    SampleRow {
        time_ms: 1_761_951_600_000 + (i / 8) as i64 * 1000,
        interval_s: 1,
        node: "node000".into(),
        gpu_index: (i % 8) as u16,
        gpu_uuid: format!("GPU-{i:08x}"),
        gpu_model: "h100-sxm".into(),
        mig_instance: (i % 3 == 0).then(|| format!("{}", i % 7)),
        job_id: (i % 4 != 0).then(|| format!("{}", 100 + i % 8)),
        account: (i % 4 != 0).then(|| "team-a".into()),
        project: (i % 2 == 0).then(|| "llm".into()),
        gpu_util_pct: Some((i * 13 % 101) as f32),
        sm_active: Some(0.5),
        tensor_active: Some(0.4),
        dram_active: None,
        sm_clock_mhz: Some(1980),
        mem_used_bytes: Some(1 << 30),
        mem_total_bytes: Some(80 << 30),
        power_w: Some(600.0),
        energy_j: Some(1.0e6 + i as f64),
        xid: (i == 5).then_some(79),
    }
}

fn batch(rows: impl IntoIterator<Item = SampleRow>) -> Vec<u8> {
    let mut b = SampleBatchBuilder::with_capacity(8);
    for r in rows {
        b.push(&r);
    }
    encode_ipc(&b.finish().unwrap()).unwrap()
}

fn main() {
    write("ingest_samples", "one-row", &batch([row(1)]));
    write(
        "ingest_samples",
        "sixty-four-rows",
        &batch((0..64).map(row)),
    );
    write("ingest_samples", "empty", &batch([]));
    let mut bad = row(2);
    bad.gpu_util_pct = Some(150.0);
    bad.node = "node999".into();
    write("ingest_samples", "bad-values", &batch([row(1), bad]));

    let events = r#"{"source": "schedd", "seq": 1, "events": [
        {"time_ms": 1761951600000, "job_id": "1000", "account": "team-a", "project": "llm", "kind": "submitted", "partition": "batch", "gpus": 2, "time_limit_s": 3600},
        {"time_ms": 1761951660000, "job_id": "1000", "account": "team-a", "project": "llm", "kind": "started", "gpus": 2, "allocation": "node001:0,4"},
        {"time_ms": 1761955200000, "job_id": "1000", "account": "team-a", "kind": "finished", "outcome": "completed", "exit_code": 0, "achieved_flops": 1.5e15}
    ]}"#;
    write("ingest_events", "lifecycle.json", events.as_bytes());
    write(
        "ingest_events",
        "bad-row.json",
        br#"{"source": "s", "events": [{"time_ms": "soon", "job_id": "j2", "account": "team-a", "kind": "submitted"}]}"#,
    );

    for (target, name, path) in [
        (
            "cluster_config",
            "seed-cluster.toml",
            "../examples/seed-cluster.toml",
        ),
        (
            "cluster_config",
            "seed-demo.toml",
            "../examples/seed-demo.toml",
        ),
        (
            "price_book",
            "seed-prices.toml",
            "../examples/seed-prices.toml",
        ),
        (
            "dcgm_text",
            "h100.txt",
            "../exporter/tests/fixtures/dcgm-exporter-h100.txt",
        ),
        (
            "dcgm_text",
            "mig.txt",
            "../exporter/tests/fixtures/dcgm-exporter-mig.txt",
        ),
    ] {
        write(
            target,
            name,
            &fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}")),
        );
    }
}
