//! The exporter reading dcgm-exporter's HPC job mapping (a file per GPU, one job id a line,
//! no tenant) beside a live aggregator: each job's account and project come from the
//! aggregator's allocation feed (the job's start event), read with the node's own token. A job
//! the aggregator does not know leaves its GPU unlabelled, and a node cannot learn another
//! node's jobs.

mod common;

use serde_json::{json, Value};

use common::{gpuledger_ok, terminate, wait_for};

const CONFIG: &str = r#"version = 1
[cluster]
name = "dcgm-mapping"
[[node_pools]]
name = "p"
prefix = "node"
count = 2
gpus_per_node = 4
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 10
default = true
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "USD"
gpu_hour = { h100-sxm = "2.00" }
[[accounts]]
id = "team-a"
name = "A"
weight = 1
projects = [{ id = "pretrain" }]
[[accounts]]
id = "team-b"
name = "B"
weight = 1
"#;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn sql(url: &str, token: &str, sql: &str) -> Value {
    let mut r = agent()
        .post(format!("{url}/api/v1/query"))
        .header("authorization", format!("Bearer {token}"))
        .send(json!({ "sql": sql }).to_string().as_bytes())
        .unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

#[test]
fn dcgm_exporter_job_files_are_labelled_with_the_jobs_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "operator", "--name", "ops",
    ]);
    let node = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "node", "--node", "node001", "--name",
        "node001",
    ]);
    let node_token_file = dir.path().join("node-token");
    std::fs::write(&node_token_file, format!("{node}\n")).unwrap();
    let aggregator = common::spawn_aggregator_with_tokens(dir.path(), &config, &tokens);
    let url = aggregator.url.clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Job 51 (team-a) holds GPUs 0-1 of node001 and GPU 0 of node002; job 52 (team-b) GPU 2.
    let events = json!({"source": "slurm", "seq": 0, "events": [
        {"time_ms": now - 60_000, "job_id": "51", "account": "team-a", "project": "pretrain", "kind": "started", "gpus": 3, "allocation": "node001:0-1;node002:0"},
        {"time_ms": now - 60_000, "job_id": "52", "account": "team-b", "kind": "started", "gpus": 1, "allocation": "node001:2"},
        {"time_ms": now - 60_000, "job_id": "60", "account": "team-b", "kind": "started", "gpus": 1, "allocation": "node002:3"},
    ]});
    let posted = agent()
        .post(format!("{url}/api/v1/events"))
        .header("authorization", format!("Bearer {operator}"))
        .header("content-type", "application/json")
        .send(events.to_string().as_bytes())
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(posted, 200);

    // dcgm-exporter's files: job ids only; GPU 2 shared by two jobs (the first labels it);
    // GPU 3 names job 60, which runs on node002: node001 must not learn its tenant.
    let mapping = dir.path().join("mapping");
    std::fs::create_dir_all(&mapping).unwrap();
    for (gpu, text) in [(0, "51\n"), (1, "51\n"), (2, "52\n53\n"), (3, "60\n")] {
        std::fs::write(mapping.join(gpu.to_string()), text).unwrap();
    }
    let exporter =
        common::spawn_mapped_exporter("node001", 4, &url, &node_token_file, &mapping, dir.path());
    let labelled = "SELECT gpu_index, job_id, account, project, COUNT(*) AS n FROM samples \
                    WHERE node = 'node001' GROUP BY gpu_index, job_id, account, project ORDER BY gpu_index";
    wait_for("labelled samples of every GPU", 90, || {
        let reply = sql(&url, &operator, labelled);
        reply["rows"].as_array().is_some_and(|rows| {
            (0..4).all(|g| {
                rows.iter()
                    .any(|r| r["gpu_index"] == g && r["n"].as_i64() >= Some(3))
            })
        })
    });
    terminate(exporter);
    let reply = sql(&url, &operator, labelled);
    let rows: Vec<(i64, Value, Value, Value)> = reply["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["gpu_index"].as_i64().unwrap(),
                r["job_id"].clone(),
                r["account"].clone(),
                r["project"].clone(),
            )
        })
        .collect();
    // The first samples may precede the exporter's first read of the feed (the feed is read
    // before the first sample, so none should): every GPU's rows carry one label.
    assert_eq!(
        rows,
        vec![
            (0, json!("51"), json!("team-a"), json!("pretrain")),
            (1, json!("51"), json!("team-a"), json!("pretrain")),
            (2, json!("52"), json!("team-b"), Value::Null),
            (3, Value::Null, Value::Null, Value::Null),
        ],
        "{reply}"
    );
    terminate(aggregator);
}
