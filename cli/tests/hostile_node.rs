//! A node that lies, with its real token, against a real aggregator with authentication on,
//! while honest nodes push and the scheduler's job events say who held which GPUs: every
//! forgery of issue 19 is refused (by row and field, or as a conflict) or stored and flagged,
//! and every tenant's invoice and the FOCUS file are byte-identical to a run without the liar.
//! The liar moves nothing but the platform's flagged-GPU-seconds note. A node reimaged with a
//! fresh spool (a new epoch, numbering from 0 again) is stored, not taken for duplicates.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use common::ingest::agent;
use common::{gpuledger_ok, spawn, terminate};
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};
use gpuledger_model::wire::{EPOCH_HEADER, LOW_SEQ_HEADER, NODE_HEADER, SEQ_HEADER};
use serde_json::{json, Value};

const HOUR: i64 = 3_600_000;
const MIN: i64 = 60_000;

/// Three nodes of eight H100, the seed's accounts and prices.
const CLUSTER: &str = r#"version = 1
[cluster]
name = "ledger"
[[node_pools]]
name = "h100"
prefix = "gpu"
count = 3
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10.00" }
[[accounts]]
id = "team-a"
name = "A"
weight = 2
projects = [{ id = "pretrain" }]
[[accounts]]
id = "team-b"
name = "B"
weight = 1
projects = [{ id = "finetune" }]
[[accounts]]
id = "team-c"
name = "C"
weight = 1
projects = [{ id = "experiments" }]
"#;

/// A job the scheduler ran: id, account, project, node, GPUs, start and end (minutes from H).
struct Job {
    id: &'static str,
    account: &'static str,
    project: &'static str,
    node: &'static str,
    gpus: std::ops::Range<u16>,
    from_min: i64,
    to_min: i64,
}

const JOBS: [Job; 3] = [
    Job {
        id: "101",
        account: "team-b",
        project: "finetune",
        node: "gpu001",
        gpus: 0..2,
        from_min: 0,
        to_min: 60,
    },
    Job {
        id: "102",
        account: "team-a",
        project: "pretrain",
        node: "gpu002",
        gpus: 0..8,
        from_min: 0,
        to_min: 120,
    },
    Job {
        id: "103",
        account: "team-c",
        project: "experiments",
        node: "gpu003",
        gpus: 0..4,
        from_min: 30,
        to_min: 150,
    },
];

fn row(node: &str, gpu: u16, time_ms: i64, interval_s: u32) -> SampleRow {
    SampleRow {
        time_ms,
        interval_s,
        node: node.into(),
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{node}-{gpu}"),
        gpu_model: "h100-sxm".into(),
        gpu_util_pct: Some(80.0),
        tensor_active: Some(0.4),
        sm_clock_mhz: Some(1830),
        mem_used_bytes: Some(40 << 30),
        mem_total_bytes: Some(81_559 << 20),
        power_w: Some(600.0),
        energy_j: Some(36_000.0),
        ..SampleRow::default()
    }
}

fn labelled(mut r: SampleRow, job: &str, account: &str, project: Option<&str>) -> SampleRow {
    r.job_id = Some(job.into());
    r.account = Some(account.into());
    r.project = project.map(str::to_owned);
    r
}

fn ipc(rows: &[SampleRow]) -> Vec<u8> {
    let mut b = SampleBatchBuilder::with_capacity(rows.len());
    for r in rows {
        b.push(r);
    }
    encode_ipc(&b.finish().unwrap()).unwrap()
}

/// What an honest exporter of `node` sends for minutes `[from, to)` after `h`: each GPU each
/// minute, labelled with the job that held it.
fn honest(node: &str, h: i64, from: i64, to: i64) -> Vec<SampleRow> {
    let mut rows = Vec::new();
    for minute in from..to {
        for gpu in 0..8u16 {
            let r = row(node, gpu, h + minute * MIN, 60);
            let holder = JOBS.iter().find(|j| {
                j.node == node && j.gpus.contains(&gpu) && (j.from_min..j.to_min).contains(&minute)
            });
            rows.push(match holder {
                Some(j) => labelled(r, j.id, j.account, Some(j.project)),
                None => r,
            });
        }
    }
    rows
}

struct Push<'a> {
    token: &'a str,
    node: &'a str,
    epoch: &'a str,
    seq: String,
    low: Option<String>,
}

fn push(url: &str, p: &Push<'_>, body: &[u8]) -> (u16, Value) {
    let mut request = agent()
        .post(format!("{url}/api/v1/ingest"))
        .header("authorization", format!("Bearer {}", p.token))
        .header(NODE_HEADER, p.node)
        .header(EPOCH_HEADER, p.epoch)
        .header(SEQ_HEADER, &p.seq);
    if let Some(low) = &p.low {
        request = request.header(LOW_SEQ_HEADER, low);
    }
    let mut response = request.send(body).unwrap();
    let text = response.body_mut().read_to_string().unwrap();
    (
        response.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn as_node<'a>(token: &'a str, node: &'a str, epoch: &'a str, seq: u64) -> Push<'a> {
    Push {
        token,
        node,
        epoch,
        seq: seq.to_string(),
        low: Some(seq.to_string()),
    }
}

/// The fields a refusal names.
fn fields(reply: &Value) -> Vec<String> {
    reply["errors"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| e["field"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One run: honest nodes push the three hours after `h`, the scheduler posts its jobs, and with
/// `liar` gpu001's token tries every forgery. The invoices of the month(s), by file.
fn run(dir: &Path, h: i64, months: &[String], liar: bool) -> BTreeMap<String, String> {
    let config = dir.join("cluster.toml");
    std::fs::write(&config, CLUSTER).unwrap();
    let tokens = dir.join("tokens");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "operator", "--name", "ops",
    ]);
    let node_tokens: BTreeMap<&str, String> = ["gpu001", "gpu002", "gpu003"]
        .into_iter()
        .map(|n| {
            let t = gpuledger_ok(&[
                "token", "add", "--file", tokens_arg, "--role", "node", "--node", n, "--name", n,
            ]);
            (n, t)
        })
        .collect();
    let data = dir.join("data");
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--tokens",
            tokens_arg,
        ],
        Stdio::inherit(),
    );
    let url = aggregator.url.clone();

    // The scheduler's job events.
    let mut events = Vec::new();
    for j in &JOBS {
        let alloc = format!("{}:{}-{}", j.node, j.gpus.start, j.gpus.end - 1);
        events.push(json!({"time_ms": h + j.from_min * MIN - 5 * MIN, "job_id": j.id, "account": j.account, "project": j.project, "kind": "submitted", "gpus": j.gpus.len()}));
        events.push(json!({"time_ms": h + j.from_min * MIN, "job_id": j.id, "account": j.account, "project": j.project, "kind": "started", "gpus": j.gpus.len(), "allocation": alloc}));
        events.push(json!({"time_ms": h + j.to_min * MIN, "job_id": j.id, "account": j.account, "project": j.project, "kind": "finished", "outcome": "completed"}));
    }
    let mut response = agent()
        .post(format!("{url}/api/v1/events"))
        .header("authorization", format!("Bearer {operator}"))
        .header("content-type", "application/json")
        .send(json!({"source": "scheduler", "seq": 1, "events": events}).to_string())
        .unwrap();
    let text = response.body_mut().read_to_string().unwrap();
    assert_eq!(response.status().as_u16(), 200, "{text}");

    // Honest exporters: half an hour a batch. gpu003 is reimaged after 150 minutes: its fresh
    // spool has a new epoch and numbers from 0 again.
    for node in ["gpu001", "gpu002", "gpu003"] {
        let token = &node_tokens[node];
        for (seq, from) in (0..180).step_by(30).enumerate() {
            let (epoch, seq) = match (node, from) {
                ("gpu003", f) if f >= 150 => ("reimaged-0002", seq as u64 - 5),
                _ => ("spool-0001", seq as u64),
            };
            let body = ipc(&honest(node, h, from, from + 30));
            let (status, reply) = push(&url, &as_node(token, node, epoch, seq), &body);
            assert_eq!(
                (status, reply["status"].as_str()),
                (200, Some("accepted")),
                "{node} {from}: {reply}"
            );
        }
    }

    if liar {
        lie(&url, &node_tokens["gpu001"], h);
    }
    let mut response = agent()
        .get(format!("{url}/metrics"))
        .header("authorization", format!("Bearer {operator}"))
        .call()
        .unwrap();
    let page = response.body_mut().read_to_string().unwrap();
    terminate(aggregator);

    let mut out = BTreeMap::new();
    for month in months {
        gpuledger_ok(&[
            "invoice",
            "--month",
            month,
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ]);
        let dir = data.join("invoices").join(month);
        for entry in walk(&dir) {
            let key = entry.strip_prefix(&data).unwrap().display().to_string();
            out.insert(key, std::fs::read_to_string(&entry).unwrap());
        }
    }
    out.insert("metrics".into(), page);
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Every forgery of issue 19, as gpu001 with its own token.
fn lie(url: &str, token: &str, h: i64) {
    let node = "gpu001";
    let mut seq = 1000;
    let mut next = || {
        seq += 1;
        seq
    };
    // 65,536 rows, one per GPU index, an hour each, billed to team-b's job 101.
    let every_index: Vec<SampleRow> = (0..=u16::MAX)
        .map(|g| labelled(row(node, g, h, 3600), "101", "team-b", Some("finetune")))
        .collect();
    let (status, reply) = push(
        url,
        &as_node(token, node, "liar", next()),
        &ipc(&every_index),
    );
    assert_eq!(status, 422, "{reply}");
    assert!(fields(&reply).iter().all(|f| f == "gpu_index"), "{reply}");

    // Readings no GPU gives, and tenants the config does not define.
    let mut clock = row(node, 0, h - 3 * HOUR, 60);
    clock.sm_clock_mhz = Some(4_000_000_000);
    let mut energy = row(node, 1, h - 3 * HOUR, 60);
    energy.energy_j = Some(f64::INFINITY);
    let mut memory = row(node, 2, h - 3 * HOUR, 60);
    memory.mem_used_bytes = Some((1 << 63) + 5);
    let stranger = labelled(row(node, 3, h - 3 * HOUR, 60), "7", "team-zz", None);
    let dots = labelled(row(node, 4, h - 3 * HOUR, 60), "8", "..", None);
    let (status, reply) = push(
        url,
        &as_node(token, node, "liar", next()),
        &ipc(&[clock, energy, memory, stranger, dots]),
    );
    assert_eq!(status, 422, "{reply}");
    let named = fields(&reply);
    for f in ["sm_clock_mhz", "energy_j", "mem_used_bytes", "account"] {
        assert!(named.iter().any(|n| n == f), "{f} not in {reply}");
    }

    // A sequence number at the top of the range, to make every later batch a "duplicate".
    let top = Push {
        token,
        node,
        epoch: "liar",
        seq: u64::MAX.to_string(),
        low: Some(u64::MAX.to_string()),
    };
    let (status, reply) = push(url, &top, &ipc(&[row(node, 0, h - 3 * HOUR, 60)]));
    assert_eq!(status, 400, "{reply}");
    assert_eq!(fields(&reply), ["x-gpuledger-seq"], "{reply}");

    // Pushing as another node.
    let (status, _) = push(
        url,
        &as_node(token, "gpu002", "liar", next()),
        &ipc(&[row("gpu002", 0, h, 60)]),
    );
    assert_eq!(status, 403);

    // Its own honest rows again, under new numbers and another epoch: duplicates, not usage.
    for from in [0, 30] {
        let (status, reply) = push(
            url,
            &as_node(token, node, "liar-2", next()),
            &ipc(&honest(node, h, from, from + 30)),
        );
        assert_eq!(
            (status, reply["status"].as_str()),
            (200, Some("duplicate")),
            "{reply}"
        );
    }
    // A batch under an epoch and number the node already used, with other content.
    let (status, reply) = push(
        url,
        &as_node(token, node, "spool-0001", 0),
        &ipc(&[labelled(
            row(node, 5, h - 4 * HOUR, 60),
            "101",
            "team-b",
            None,
        )]),
    );
    assert_eq!(status, 409, "{reply}");

    // Well-formed rows naming jobs that did not hold these GPUs then, in the hour after the
    // honest rows: stored, flagged, billed to nobody. Job 101 on all eight GPUs two hours after
    // it ended; then team-a's job 102 (which ran on gpu002) here, a job nobody ran, and job 101
    // under another account.
    let after = h + 3 * HOUR;
    let mut forged = Vec::new();
    for g in 0..8 {
        forged.push(labelled(
            row(node, g, after, 1800),
            "101",
            "team-b",
            Some("finetune"),
        ));
    }
    let later = after + 30 * MIN;
    forged.push(labelled(
        row(node, 0, later, 1800),
        "102",
        "team-a",
        Some("pretrain"),
    ));
    forged.push(labelled(row(node, 1, later, 1800), "999", "team-a", None));
    forged.push(labelled(row(node, 2, later, 1800), "101", "team-a", None));
    let (status, reply) = push(url, &as_node(token, node, "liar-3", 0), &ipc(&forged));
    assert_eq!(
        (status, reply["status"].as_str()),
        (200, Some("accepted")),
        "{reply}"
    );
}

fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_lying_node_moves_no_tenants_bill_and_is_flagged() {
    // Four past hours within one month: three of honest data, one of forgeries after them.
    let now = chrono::Utc::now().timestamp_millis();
    let month_of = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .format("%Y-%m")
            .to_string()
    };
    let mut h = now - now.rem_euclid(HOUR) - 4 * HOUR;
    if month_of(h) != month_of(h + 4 * HOUR - 1) {
        let first = chrono::NaiveDate::parse_from_str(
            &format!("{}-01", month_of(h + 4 * HOUR)),
            "%Y-%m-%d",
        )
        .unwrap();
        h = gpuledger_model::time::day_start_ms(first) - 4 * HOUR;
    }
    let months = vec![month_of(h)];
    let (honest_dir, lying_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let honest_run = run(honest_dir.path(), h, &months, false);
    let lying_run = run(lying_dir.path(), h, &months, true);

    // Every job is billed what it held (GPUs x minutes), in both runs.
    let billed: BTreeMap<String, i64> = honest_run
        .iter()
        .filter(|(k, _)| k.ends_with("/r1.json"))
        .map(|(_, v)| {
            let inv: Value = serde_json::from_str(v).unwrap();
            let secs: i64 = inv["lines"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| {
                    l["charge_type"] == "gpu_hours" || l["charge_type"] == "mfu_weighted_gpu_hours"
                })
                .map(|l| l["gpu_seconds"].as_i64().unwrap())
                .sum();
            (inv["account"].as_str().unwrap().to_owned(), secs)
        })
        .fold(BTreeMap::new(), |mut m, (a, s)| {
            *m.entry(a).or_default() += s;
            m
        });
    for j in &JOBS {
        let held = j.gpus.len() as i64 * (j.to_min - j.from_min) * 60;
        assert_eq!(
            billed.get(j.account),
            Some(&held),
            "{}: {billed:?}",
            j.account
        );
    }

    let mut platform_checked = false;
    for (file, honest_text) in &honest_run {
        if file == "metrics" {
            continue;
        }
        let lying_text = lying_run
            .get(file)
            .unwrap_or_else(|| panic!("{file} only in the honest run"));
        if file.contains("/platform/") && file.ends_with(".json") {
            // The platform's invoice: its lines the same, and the flagged seconds in its notes.
            let (a, b): (Value, Value) = (
                serde_json::from_str(honest_text).unwrap(),
                serde_json::from_str(lying_text).unwrap(),
            );
            assert_eq!(a["lines"], b["lines"], "{file}");
            platform_checked = true;
            assert!(a.get("notes").is_none(), "{file}: {a}");
            let flagged: BTreeMap<String, i64> = b["notes"]["flagged"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    assert_eq!(f["node"], "gpu001");
                    (
                        f["reason"].as_str().unwrap().to_owned(),
                        f["gpu_seconds"].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                flagged,
                BTreeMap::from([
                    ("account_mismatch".to_owned(), 1800),
                    ("not_held".to_owned(), 9 * 1800),
                    ("unknown_job".to_owned(), 1800),
                ]),
                "{b}"
            );
        } else if file.contains("/platform/") {
            continue;
        } else {
            assert!(honest_text == lying_text, "{file} differs when a node lies");
        }
    }
    assert!(
        platform_checked,
        "the platform's invoice (idle capacity) was compared"
    );
    for file in lying_run.keys() {
        assert!(
            honest_run.contains_key(file),
            "{file} only in the lying run"
        );
    }

    // The refusals and the rows set aside are counted, per node and reason: the honest rows
    // sent again, and of the 65,536-index forgery the rows naming the node's eight real GPUs
    // (its good rows, stored but for their intervals, stored already: duplicates) apart from
    // the 65,528 refused.
    let page = &lying_run["metrics"];
    let set_aside = |reason: &str| {
        metric(
            page,
            &format!(
                "gpuledger_ingest_rows_set_aside_total{{node=\"gpu001\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert_eq!(
        (set_aside("duplicate_interval"), set_aside("refused")),
        ((2 * 30 * 8 + 8) as f64, (65_536 - 8) as f64),
        "{page}"
    );
    assert!(
        metric(
            page,
            "gpuledger_ingest_refused_batches_total{reason=\"conflict\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            page,
            "gpuledger_ingest_refused_values_total{field=\"gpu_index\"}"
        ) >= 1.0
    );
}
