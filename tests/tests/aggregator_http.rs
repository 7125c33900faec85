//! The aggregator's HTTP API, driven through its router (`tower::ServiceExt::oneshot`) over a
//! real data directory: every bad input gets its 4xx and leaves the stored data unchanged; a
//! re-sent batch is stored once; the indicators, the usage feed and /metrics read back what
//! was sent.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpuledger_model::wire::{LOW_SEQ_HEADER, NODE_HEADER, SEQ_HEADER};
use serde_json::{json, Value};

use common::{api, ipc, T0};
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_tests::sample_batch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_stored_once_however_often_it_is_sent() {
    let api = api().await;
    let (status, reply) = api.ingest("node001", 0, ipc(0..80, "node001")).await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (StatusCode::OK, Some("accepted"))
    );
    assert_eq!(reply["rows"], 80);
    let (status, reply) = api.ingest("node001", 0, ipc(0..80, "node001")).await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (StatusCode::OK, Some("duplicate"))
    );
    let (status, _) = api.ingest("node001", 1, ipc(80..160, "node001")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(api.stored().await, (160, 1600));
    // After a flush the sequence numbers are still known.
    let (_, reply) = api.ingest("node001", 1, ipc(80..160, "node001")).await;
    assert_eq!(reply["status"], "duplicate");
    assert_eq!(api.stored().await, (160, 1600));
    let (_, _, metrics) = api.get("/metrics").await;
    assert!(
        metrics.contains("gpuledger_ingest_batches_total{outcome=\"accepted\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuledger_ingest_batches_total{outcome=\"duplicate\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuledger_ingest_samples_total 160"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_4xx_and_changes_nothing() {
    let api = api().await;
    api.ingest("node001", 0, ipc(0..80, "node001")).await;
    let before = api.stored().await;
    assert_eq!(before, (80, 800));

    // Rows out of range, NaN, negative memory is unrepresentable (unsigned): use the others.
    // (A batch with good rows too stores those: `bad_rows_are_refused_and_the_rest_stored`.)
    let mut rows: Vec<_> = (0..4)
        .map(|i| gpuledger_tests::sample_row(i, T0, "node001"))
        .collect();
    rows[0].gpu_util_pct = Some(140.0);
    rows[1].tensor_active = Some(f32::NAN);
    rows[2].time_ms = T0 + 10 * 86_400_000; // far in the future
    rows[3].time_ms = T0 - 400 * 86_400_000; // older than retention
    let mut builder = gpuledger_model::sample::SampleBatchBuilder::with_capacity(4);
    for r in &rows {
        builder.push(r);
    }
    let bad = builder.finish().unwrap();
    let (status, reply) = api.ingest("node001", 1, encode_ipc(&bad).unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    let named: Vec<(i64, String)> = reply["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["row"].as_i64().unwrap(),
                e["field"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(reply["stored_rows"], 0, "{reply}");
    for expected in [
        (0, "gpu_util_pct"),
        (1, "tensor_active"),
        (2, "time"),
        (3, "time"),
    ] {
        assert!(
            named.contains(&(expected.0, expected.1.to_owned())),
            "{expected:?} not in {named:?}"
        );
    }

    // A node the cluster config does not know (refused at its header, before the body is
    // read), and a batch claiming another node's rows.
    let (status, reply) = api.ingest("node999", 0, ipc(0..8, "node999")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(reply["errors"][0]["field"], "x-gpuledger-node");
    let (status, _) = api.ingest("node002", 0, ipc(0..8, "node001")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Wrong schema: job events sent as samples.
    let events = gpuledger_model::job::job_events_to_batch(&[gpuledger_model::job::JobEvent::new(
        T0,
        "1".parse().unwrap(),
        "alpha".parse().unwrap(),
        None,
        gpuledger_model::job::JobEventKind::Submitted,
    )])
    .unwrap();
    let (status, reply) = api.ingest("node001", 2, encode_ipc(&events).unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert!(reply["errors"][0]["row"].is_null());

    // Not Arrow at all, a truncated stream, missing and malformed headers.
    let (status, reply) = api.ingest("node001", 3, b"hello".to_vec()).await;
    assert_eq!(
        (status, reply["errors"][0]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("body"))
    );
    let mut truncated = ipc(0..80, "node001");
    truncated.truncate(truncated.len() / 2);
    let (status, _) = api.ingest("node001", 4, truncated).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let request = Request::post("/api/v1/ingest")
        .header(SEQ_HEADER, "x")
        .header(NODE_HEADER, "node001")
        .body(Body::from(ipc(0..8, "node001")))
        .unwrap();
    let (status, reply, _) = api.call(request).await;
    assert_eq!(
        (status, reply["errors"][0]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some(SEQ_HEADER))
    );

    // Bad events: each row and field named, nothing stored.
    let (status, reply) = api
        .post_json(
            "/api/v1/events",
            json!({"source": "sched", "seq": 0, "events": [
                {"time_ms": T0, "job_id": "1", "account": "alpha", "kind": "finished"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        (
            reply["errors"][0]["row"].as_i64(),
            reply["errors"][0]["field"].as_str()
        ),
        (Some(0), Some("outcome"))
    );
    // Times no event can have: before 1970, or a day ahead of the aggregator's clock (a job
    // finished then would be billed a day of GPUs it has not held).
    let (status, reply) = api
        .post_json(
            "/api/v1/events",
            json!({"source": "sched", "seq": 1, "events": [
                {"time_ms": -1, "job_id": "2", "account": "alpha", "kind": "submitted"},
                {"time_ms": T0 + 86_400_000, "job_id": "2", "account": "alpha", "kind": "finished", "outcome": "completed"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(
        rows_and_fields(&reply),
        [(Some(0), Some("time_ms")), (Some(1), Some("time_ms"))],
        "{reply}"
    );
    // A source name is a key of numbered batches the aggregator keeps: bounded and plain.
    for source in ["", "a b", "../x", &"s".repeat(65)] {
        let (status, reply) = api
            .post_json(
                "/api/v1/events",
                json!({"source": source, "seq": 0, "events": [
                    {"time_ms": T0, "job_id": "9", "account": "alpha", "kind": "submitted"},
                ]}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{source:?}: {reply}");
        assert_eq!(reply["errors"][0]["field"], "source", "{source:?}: {reply}");
    }
    // Events against the config: an account it does not define, a project not the account's,
    // more GPUs than the cluster's 16, a node it does not have, a GPU a node does not have.
    // Each would put a charge on a bill nobody owns, or one of any size.
    let (status, reply) = api
        .post_json(
            "/api/v1/events",
            json!({"source": "sched", "seq": 2, "events": [
                {"time_ms": T0, "job_id": "4", "account": "nosuch", "kind": "submitted"},
                {"time_ms": T0, "job_id": "5", "account": "alpha", "project": "nosuch", "kind": "submitted"},
                {"time_ms": T0, "job_id": "6", "account": "alpha", "kind": "submitted", "gpus": 2_000_000},
                {"time_ms": T0, "job_id": "7", "account": "alpha", "kind": "started", "gpus": 1, "allocation": "node099:0"},
                {"time_ms": T0, "job_id": "8", "account": "alpha", "kind": "started", "gpus": 1, "allocation": "node001:8"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(
        rows_and_fields(&reply),
        [
            (Some(0), Some("account")),
            (Some(1), Some("project")),
            (Some(2), Some("gpus")),
            (Some(3), Some("allocation")),
            (Some(4), Some("allocation")),
        ],
        "{reply}"
    );

    // DDL through the query endpoint would read any file: refused.
    let (status, _) = api
        .post_json(
            "/api/v1/query",
            json!({"sql": "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    assert_eq!(
        api.stored().await,
        before,
        "refusals left the data unchanged"
    );
    let (status, reply) = api
        .post_json(
            "/api/v1/query",
            json!({"sql": "SELECT COUNT(*) AS n FROM jobs"}),
        )
        .await;
    assert_eq!(
        (status, reply["rows"][0]["n"].as_i64()),
        (StatusCode::OK, Some(0))
    );
    let (_, _, metrics) = api.get("/metrics").await;
    for line in [
        "gpuledger_ingest_refused_batches_total{reason=\"invalid_rows\"} 2",
        "gpuledger_ingest_refused_batches_total{reason=\"unknown_node\"} 1",
        "gpuledger_ingest_refused_batches_total{reason=\"schema\"} 1",
        "gpuledger_ingest_refused_batches_total{reason=\"decode\"} 2",
        "gpuledger_ingest_refused_batches_total{reason=\"header\"} 1",
        "gpuledger_ingest_refused_batches_total{reason=\"invalid_events\"} 7",
        "gpuledger_ingest_refused_values_total{field=\"gpu_util_pct\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_are_refused_and_the_rest_stored() {
    let api = api().await;
    // One GPU's reading no GPU can give among a node's honest interval: the 422 names it, the
    // node's other rows are stored (not set aside with it).
    let mut rows: Vec<_> = (0..8)
        .map(|i| gpuledger_tests::sample_row(i, T0, "node001"))
        .collect();
    rows[5].gpu_util_pct = Some(140.0);
    let mut builder = gpuledger_model::sample::SampleBatchBuilder::with_capacity(8);
    for r in &rows {
        builder.push(r);
    }
    let batch = encode_ipc(&builder.finish().unwrap()).unwrap();
    for attempt in ["first", "sent again"] {
        let (status, reply) = api.ingest("node001", 0, batch.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{attempt}: {reply}"
        );
        assert_eq!(rows_and_fields(&reply), [(Some(5), Some("gpu_util_pct"))]);
        assert_eq!(
            (reply["stored_rows"].as_u64(), &reply["refused_rows"]),
            (Some(7), &json!([5])),
            "{attempt}: {reply}"
        );
        assert_eq!(api.stored().await.0, 7, "{attempt}: stored once");
    }

    // Events: a row that does not parse and a row the config refuses, among good ones.
    let batch = json!({"source": "sched", "seq": 0, "events": [
        {"time_ms": T0, "job_id": "1", "account": "alpha", "kind": "submitted", "gpus": 1},
        {"time_ms": T0, "job_id": "2", "account": "alpha", "kind": "finished"},
        {"time_ms": T0, "job_id": "3", "account": "nosuch", "kind": "submitted"},
        {"time_ms": T0, "job_id": "4", "account": "alpha", "kind": "submitted", "gpus": 2},
    ]});
    for attempt in ["first", "sent again"] {
        let (status, reply) = api.post_json("/api/v1/events", batch.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{attempt}: {reply}"
        );
        assert_eq!(
            rows_and_fields(&reply),
            [(Some(1), Some("outcome")), (Some(2), Some("account"))],
            "{attempt}"
        );
        assert_eq!(
            (reply["stored_rows"].as_u64(), &reply["refused_rows"]),
            (Some(2), &json!([1, 2])),
            "{attempt}: {reply}"
        );
        api.stored().await;
        let (_, jobs) = api
            .post_json(
                "/api/v1/query",
                json!({"sql": "SELECT job_id FROM jobs ORDER BY job_id"}),
            )
            .await;
        assert_eq!(
            jobs["rows"],
            json!([{"job_id": "1"}, {"job_id": "4"}]),
            "{attempt}: the good events, once"
        );
    }
    let (_, _, metrics) = api.get("/metrics").await;
    for line in [
        "gpuledger_ingest_rows_set_aside_total{node=\"node001\",reason=\"refused\"} 2",
        "gpuledger_ingest_refused_values_total{field=\"gpu_util_pct\"} 2",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indicators_usage_feed_and_job_detail_read_back_what_was_sent() {
    let api = api().await;
    // 360 steps of 8 GPUs = one hour at 10 s.
    api.ingest("node001", 0, ipc(0..2880, "node001")).await;
    let events = json!({"source": "sched", "seq": 0, "events": [
        {"time_ms": T0 - 60_000, "job_id": "1000", "account": "alpha", "project": "train", "kind": "submitted", "gpus": 2},
        {"time_ms": T0, "job_id": "1000", "account": "alpha", "project": "train", "kind": "started", "gpus": 2, "allocation": "node001:0,4"},
        {"time_ms": T0 + 1000, "job_id": "1000", "account": "alpha", "kind": "flops_reported", "achieved_flops": 7.9e14},
        {"time_ms": T0 + 3_600_000, "job_id": "1000", "account": "alpha", "kind": "finished", "outcome": "completed"},
        {"time_ms": T0, "job_id": "1001", "account": "alpha", "kind": "submitted", "gpus": 2},
        {"time_ms": T0 + 600_000, "job_id": "1001", "account": "alpha", "kind": "started", "gpus": 2},
        {"time_ms": T0 + 3_600_000, "job_id": "1001", "account": "alpha", "kind": "finished", "outcome": "failed"},
    ]});
    let (status, reply) = api.post_json("/api/v1/events", events.clone()).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (_, reply) = api.post_json("/api/v1/events", events).await;
    assert_eq!(reply["status"], "duplicate");
    api.stored().await;

    // Two GPUs in three busy for an hour: 2/3 of 8 GPU-hours.
    let busy_gpu_seconds = (0..2880).filter(|i| i % 3 != 0).count() as i64 * 10;
    let (status, s, _) = api
        .get("/api/v1/accounts/alpha/summary?from=2026-06-01&to=2026-06-02")
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["gpu_seconds"].as_i64(), Some(busy_gpu_seconds));
    assert_eq!(s["jobs"], 1, "only 1001 was submitted inside the window");
    assert_eq!(s["max_queue_wait_s"], 600.0);
    assert_eq!(s["success_rate"], 0.0);

    // Usage feed at the end of the hour with a one-hour half-life: the hour's midpoint is
    // half an hour back, so the decay is 2^-0.5.
    let (status, u, _) = api
        .get(&format!("/api/v1/usage?at={}&half_life=1h", T0 + 3_600_000))
        .await;
    assert_eq!(status, StatusCode::OK, "{u}");
    let expected = busy_gpu_seconds as f64 / 3600.0 * 0.5f64.sqrt();
    let got = u["accounts"]["alpha"]["decayed_gpu_hours"]
        .as_f64()
        .unwrap();
    assert!((got - expected).abs() < 1e-9, "{got} vs {expected}");

    let (status, j, _) = api.get("/api/v1/jobs/1000").await;
    assert_eq!(status, StatusCode::OK, "{j}");
    assert_eq!(j["mfu_source"], "reported");
    let mfu = j["mfu"].as_f64().unwrap();
    assert!((mfu - 7.9e14 / (2.0 * 989e12)).abs() < 1e-9, "{mfu}");
    assert_eq!(j["events"].as_array().unwrap().len(), 4);
    let (status, j, _) = api.get("/api/v1/jobs/1001").await;
    assert_eq!(
        (status, j["mfu_source"].as_str()),
        (StatusCode::OK, Some("tensor_active_proxy"))
    );
    assert_eq!(api.get("/api/v1/jobs/4242").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        api.get("/api/v1/accounts/nobody/summary").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.get("/api/v1/usage?at=someday").await.0,
        StatusCode::BAD_REQUEST
    );
    // A parameter no route takes, or one given twice, is answered in the same JSON as every
    // other bad request, naming it (axum's own answer was plain text).
    for (uri, field) in [
        ("/api/v1/usage?since=-1", "since"),
        ("/api/v1/usage?at=1&at=2", "at"),
        ("/api/v1/status?window=7d&window=30d", "window"),
        ("/api/v1/invoices?month=2026-06&x=1", "x"),
    ] {
        let (status, body, text) = api.get(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {text}");
        assert_eq!(body["errors"][0]["field"], field, "{uri}: {text}");
    }

    let (_, _, metrics) = api.get("/metrics").await;
    assert!(
        metrics.contains(
            "gpuledger_account_gpu_seconds_total{account=\"alpha\",gpu_model=\"h100-sxm\",project=\"train\"}"
        ), "{metrics}");
    assert!(
        metrics.contains("gpuledger_queue_wait_seconds_count{account=\"alpha\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuledger_jobs_finished_total{account=\"alpha\",outcome=\"failed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuledger_jobs_running{account=\"alpha\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_query_sees_the_files_of_every_flush_so_far() {
    // DataFusion would cache a directory's listing for good: a query after the second flush
    // must still see its file.
    let api = api().await;
    api.ingest("node001", 0, ipc(0..80, "node001")).await;
    let first = api.stored().await;
    api.ingest("node001", 1, ipc(80..160, "node001")).await;
    let second = api.stored().await;
    assert_eq!((first.0, second.0), (80, 160));
    let (_, s, _) = api
        .get("/api/v1/accounts/alpha/summary?from=2026-06-01&to=2026-06-02")
        .await;
    let busy = (0..160).filter(|i| i % 3 != 0).count() as i64 * 10;
    assert_eq!(s["gpu_seconds"].as_i64(), Some(busy), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_minutes_off_is_moved_onto_the_aggregators_clock_and_hours_off_is_refused() {
    let api = api().await;
    let now = T0 + 2 * 3_600_000; // the harness's clock
    let push = |seq: u64, node_clock_ahead_ms: i64| {
        // The node stamps its samples and its send with its own clock.
        let body = encode_ipc(&sample_batch(0..16, T0 + node_clock_ahead_ms, "node001")).unwrap();
        Request::post("/api/v1/ingest")
            .header(NODE_HEADER, "node001")
            .header(SEQ_HEADER, seq.to_string())
            .header(
                gpuledger_model::wire::SENT_AT_HEADER,
                (now + node_clock_ahead_ms).to_string(),
            )
            .body(Body::from(body))
            .unwrap()
    };
    let (status, reply, _) = api.call(push(0, 180_000)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    api.stored().await;
    let (_, r) = api
        .post_json(
            "/api/v1/query",
            json!({"sql": "SELECT MIN(CAST(time AS BIGINT)) AS t FROM samples"}),
        )
        .await;
    assert_eq!(
        r["rows"][0]["t"], T0,
        "three minutes ahead: moved back three minutes"
    );
    let before = api.stored().await;
    let (status, reply, _) = api.call(push(1, 2 * 3_600_000)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(reply["errors"][0]["field"], "x-gpuledger-sent-at");
    let message = reply["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("7200 s ahead"), "{message}");
    assert_eq!(api.stored().await, before, "nothing stored");
    let (_, _, metrics) = api.get("/metrics").await;
    for line in [
        "gpuledger_node_clock_offset_seconds{node=\"node001\"} 7200",
        "gpuledger_ingest_clock_corrected_batches_total 1",
        "gpuledger_ingest_refused_batches_total{reason=\"clock\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
}

/// The Parquet files of a table, sorted.
fn parquet_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for day in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(day.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|x| x == "parquet") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_file_is_set_aside_and_the_rest_is_served() {
    let api = api().await;
    api.ingest("node001", 0, ipc(0..80, "node001")).await;
    api.stored().await;
    api.ingest("node001", 1, ipc(80..200, "node001")).await;
    assert_eq!(api.stored().await.0, 200);
    let root = api._dir.path();
    let samples = parquet_files(&root.join("samples"));
    assert_eq!(samples.len(), 2);
    // Garble the data pages of the first file and keep its footer: only reading it fails.
    let mut bytes = std::fs::read(&samples[0]).unwrap();
    let len = bytes.len();
    for b in &mut bytes[8..len / 2] {
        *b = 0x5a;
    }
    std::fs::write(&samples[0], bytes).unwrap();
    let (status, reply) = api
        .post_json(
            "/api/v1/query",
            json!({"sql": "SELECT COUNT(*) AS n FROM samples"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["rows"][0]["n"], 120, "the other file is served");
    assert!(!samples[0].exists());
    let moved = gpuledger_aggregator::quarantine::quarantined_files(
        &gpuledger_aggregator::layout::Layout::new(root),
    )
    .unwrap();
    assert_eq!(moved.len(), 1);
    assert!(moved[0].key.starts_with("quarantine/samples/"), "{moved:?}");
    assert!(root.join(&moved[0].key).exists());
    let reason = std::fs::read_to_string(root.join(format!("{}.reason", moved[0].key))).unwrap();
    assert!(!reason.trim().is_empty());
    assert_eq!(reason.trim(), moved[0].reason);
    let (_, _, metrics) = api.get("/metrics").await;
    assert!(
        metrics.contains("gpuledger_quarantined_files 1"),
        "{metrics}"
    );
    // A torn rollup file is found when the tables are opened, before any query fails.
    let rollups = parquet_files(&root.join("rollups/hourly"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&rollups[1])
        .unwrap();
    file.set_len(100).unwrap();
    let query =
        gpuledger_aggregator::query::Query::open(&gpuledger_aggregator::layout::Layout::new(root))
            .await
            .unwrap();
    assert_eq!(query.quarantined().len(), 1);
    assert_eq!(query.quarantined()[0].table, "rollups_hourly");
    let rows = query
        .sql("SELECT SUM(gpu_seconds) AS s FROM rollups_hourly")
        .await
        .unwrap();
    assert!(
        rows[0].num_rows() == 1,
        "the rest of the rollups are served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_watermark_closes_gaps_and_must_not_pass_the_batch() {
    let api = api().await;
    let send = |seq: u64, low: Option<u64>| {
        let mut request = Request::post("/api/v1/ingest")
            .header(NODE_HEADER, "node001")
            .header(SEQ_HEADER, seq.to_string());
        if let Some(low) = low {
            request = request.header(LOW_SEQ_HEADER, low.to_string());
        }
        request
            .body(Body::from(ipc(
                seq as usize * 8..seq as usize * 8 + 8,
                "node001",
            )))
            .unwrap()
    };
    let (status, reply, _) = api.call(send(0, Some(0))).await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (StatusCode::OK, Some("accepted"))
    );
    // Batches 1-4 were dropped from the node's full spool; 5 comes with that promise.
    let (status, _, _) = api.call(send(5, Some(5))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply, _) = api.call(send(7, Some(8))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(reply["errors"][0]["field"], LOW_SEQ_HEADER);
    let ingestor = Arc::clone(&api.service.ingestor);
    tokio::task::spawn_blocking(move || ingestor.flush().unwrap())
        .await
        .unwrap();
    let checkpoint: Value = serde_json::from_slice(
        &std::fs::read(api._dir.path().join("wal/agg0/checkpoint.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        checkpoint["samples"]["node001"]["contiguous"], 5,
        "{checkpoint}"
    );
    assert!(
        checkpoint["samples"]["node001"].get("above").is_none(),
        "{checkpoint}"
    );
    assert_eq!(api.stored().await.0, 16, "batches 0 and 5, 8 rows each");
}

/// The (row, field) of each error in a 422's body.
fn rows_and_fields(reply: &Value) -> Vec<(Option<i64>, Option<&str>)> {
    reply["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["row"].as_i64(), e["field"].as_str()))
        .collect()
}
