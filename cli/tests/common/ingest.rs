//! Sample batches pushed to a real aggregator over HTTP, as an exporter would.

use std::time::Duration;

use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};

/// A client that reads every answer (no error on 4xx/5xx) and gives up after 20 s.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// Batch `seq` of `node`: `rows` samples of 8 GPUs, 1 s each, consecutive across batches from
/// `t0_ms`, account `team-a`, a job per GPU; Arrow IPC, as the ingest route takes it.
pub fn batch(node: &str, seq: u64, t0_ms: i64, rows: usize) -> Vec<u8> {
    batch_of(node, seq, t0_ms, rows, "team-a")
}

/// As [`batch`], the GPUs' jobs booked to `account`.
pub fn batch_of(node: &str, seq: u64, t0_ms: i64, rows: usize, account: &str) -> Vec<u8> {
    let mut b = SampleBatchBuilder::with_capacity(rows);
    for i in 0..rows {
        let step = seq as i64 * (rows / 8) as i64 + (i / 8) as i64;
        b.push(&SampleRow {
            time_ms: t0_ms + step * 1000,
            interval_s: 1,
            node: node.into(),
            gpu_index: (i % 8) as u16,
            gpu_uuid: format!("GPU-{node}-{}", i % 8),
            gpu_model: "h100-sxm".into(),
            mig_instance: None,
            job_id: Some(format!("{}", 100 + i % 8)),
            account: Some(account.into()),
            project: None,
            gpu_util_pct: Some(90.0),
            sm_active: None,
            tensor_active: Some(0.4),
            dram_active: None,
            sm_clock_mhz: None,
            mem_used_bytes: Some(1 << 30),
            mem_total_bytes: Some(80 << 30),
            power_w: Some(600.0),
            energy_j: None,
            xid: None,
        });
    }
    encode_ipc(&b.finish().unwrap()).unwrap()
}

/// Pushes one batch; the HTTP status and the reply's text, `None` when the aggregator did not
/// answer.
pub fn try_push(
    agent: &ureq::Agent,
    url: &str,
    node: &str,
    seq: u64,
    body: &[u8],
) -> Option<(u16, String)> {
    let mut response = agent
        .post(format!("{url}/api/v1/ingest"))
        .header(gpuledger_model::wire::NODE_HEADER, node)
        .header(gpuledger_model::wire::SEQ_HEADER, seq.to_string())
        .send(body)
        .ok()?;
    let text = response.body_mut().read_to_string().ok()?;
    Some((response.status().as_u16(), text))
}

/// Pushes one batch; `Some(status)` of the reply ("accepted" or "duplicate"), `None` when
/// the aggregator did not answer.
pub fn push(agent: &ureq::Agent, url: &str, node: &str, seq: u64, body: &[u8]) -> Option<String> {
    let (status, text) = try_push(agent, url, node, seq, body)?;
    assert_eq!(status, 200, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    Some(json["status"].as_str().unwrap().to_owned())
}
