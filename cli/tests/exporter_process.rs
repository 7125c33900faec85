//! Exporter and aggregator as real processes on loopback: the aggregator is down while the
//! exporter samples, the exporter is killed with `kill -9` while it holds spooled batches and
//! restarted, then the aggregator comes up: every batch arrives exactly once, in sequence, and
//! nothing is stored twice.

mod common;

use std::process::Stdio;

use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::query::Query;

use common::{scrape, terminate, wait_for, Process};

fn spawn(args: &[&str]) -> Process {
    common::spawn(args, Stdio::null())
}

fn metric(url: &str, name: &str) -> f64 {
    let text = scrape(url);
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn scalar_of(query: &Query, rt: &tokio::runtime::Runtime, sql: &str) -> i64 {
    rt.block_on(common::scalar(query, sql))
}

#[test]
fn batches_spooled_across_an_outage_and_a_kill_9_arrive_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, data, mapping) = (
        dir.path().join("spool"),
        dir.path().join("data"),
        dir.path().join("jobs"),
    );
    std::fs::create_dir_all(&mapping).unwrap();
    for gpu in 0..4 {
        std::fs::write(mapping.join(gpu.to_string()), "7 team-a pretrain\n").unwrap();
    }
    let port = common::free_port();
    let aggregator_url = format!("http://127.0.0.1:{port}");
    let exporter_args = [
        "exporter",
        "--node",
        "gpu001",
        "--gpus",
        "8",
        "--sample-interval",
        "1s",
        "--push-interval",
        "1s",
        "--listen",
        "127.0.0.1:0",
        "--aggregator-url",
        &aggregator_url,
        "--spool-dir",
        spool.to_str().unwrap(),
        "--job-mapping-dir",
        mapping.to_str().unwrap(),
    ];

    // The aggregator is down: batches pile up in the spool.
    let mut exporter = spawn(&exporter_args);
    wait_for("spooled batches", 60, || {
        metric(&exporter.url, "gpuledger_exporter_spool_batches") >= 3.0
    });
    assert!(metric(&exporter.url, "gpuledger_exporter_pushes_failed_total") >= 1.0);
    let page = scrape(&exporter.url);
    let has = |gpu: &str, tail: &str| {
        page.lines().any(|l| {
            l.starts_with(&format!("DCGM_FI_DEV_GPU_UTIL{{gpu=\"{gpu}\",UUID=")) && l.contains(tail)
        })
    };
    assert!(
        has(
            "0",
            "Hostname=\"gpu001\",hpc_job=\"7\",account=\"team-a\",project=\"pretrain\"}"
        ),
        "{page}"
    );
    assert!(
        has("5", "Hostname=\"gpu001\",hpc_job=\"\"}"),
        "idle GPUs are labelled idle, not dropped"
    );
    exporter.child.kill().unwrap();
    exporter.child.wait().unwrap();

    // Restarted, the exporter keeps its spool and its sequence; then the aggregator comes up.
    let exporter = spawn(&exporter_args);
    let aggregator = spawn(&[
        "aggregator",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    wait_for("the spool to drain", 60, || {
        metric(&exporter.url, "gpuledger_exporter_pushes_total") >= 4.0
            && metric(&exporter.url, "gpuledger_exporter_spool_batches") == 0.0
    });
    terminate(exporter);
    let next_seq: u64 = std::fs::read_to_string(spool.join("next-seq"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let left = std::fs::read_dir(&spool)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".arrows")
        })
        .count();
    assert_eq!(left, 0, "everything was pushed before the exporter stopped");
    terminate(aggregator);

    // The aggregator stored sequence numbers 0..next_seq, each once.
    let checkpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("wal/agg0/checkpoint.json")).unwrap())
            .unwrap();
    // Known by node and the spool's epoch.
    let epoch = std::fs::read_to_string(spool.join("epoch")).unwrap();
    let sender = &checkpoint["samples"][format!("gpu001@{}", epoch.trim())];
    assert_eq!(
        sender["contiguous"].as_u64(),
        Some(next_seq - 1),
        "{checkpoint}"
    );
    assert!(sender.get("above").is_none(), "no gaps: {checkpoint}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let query = rt.block_on(Query::open(&Layout::new(&data))).unwrap();
    let rows = scalar_of(&query, &rt, "SELECT COUNT(*) FROM samples");
    let instants = scalar_of(&query, &rt, "SELECT COUNT(DISTINCT time) FROM samples");
    assert!(rows > 0);
    assert_eq!(
        rows,
        8 * instants,
        "every instant has its eight GPUs, none twice"
    );
    assert_eq!(
        scalar_of(
            &query,
            &rt,
            "SELECT COUNT(*) FROM samples WHERE account = 'team-a' AND job_id = '7'"
        ),
        rows / 2,
        "GPUs 0-3 labelled with their job, 4-7 idle"
    );
}

/// What an OTLP/HTTP receiver started by the test got, and whether it answers 503 for now.
#[derive(Default)]
struct Receiver {
    requests: std::sync::Mutex<Vec<(Option<String>, serde_json::Value)>>,
    down: std::sync::atomic::AtomicBool,
}

/// An OTLP/HTTP metrics receiver on a loopback port (`POST /v1/metrics`, JSON), in its own
/// thread; its base URL.
fn start_receiver(receiver: std::sync::Arc<Receiver>) -> String {
    use axum::http::{HeaderMap, StatusCode};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/v1/metrics",
                axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                    let receiver = std::sync::Arc::clone(&receiver);
                    async move {
                        if receiver.down.load(Ordering::SeqCst) {
                            return StatusCode::SERVICE_UNAVAILABLE;
                        }
                        let json = headers
                            .get("content-type")
                            .is_some_and(|v| v == "application/json");
                        let Ok(value) = serde_json::from_slice(&body) else {
                            return StatusCode::BAD_REQUEST;
                        };
                        if !json {
                            return StatusCode::UNSUPPORTED_MEDIA_TYPE;
                        }
                        let key = headers
                            .get("x-api-key")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        receiver.requests.lock().unwrap().push((key, value));
                        StatusCode::OK
                    }
                }),
            );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    url
}

/// `(metric name, data points)` of an OTLP request.
fn otlp_metrics(request: &serde_json::Value) -> Vec<(String, Vec<serde_json::Value>)> {
    request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let data = m.get("gauge").or_else(|| m.get("sum")).unwrap();
            (
                m["name"].as_str().unwrap().to_owned(),
                data["dataPoints"].as_array().unwrap().clone(),
            )
        })
        .collect()
}

#[test]
fn the_same_gpu_series_go_to_an_otlp_receiver_and_an_outage_is_counted() {
    use std::sync::atomic::Ordering;
    let receiver = std::sync::Arc::new(Receiver::default());
    let otlp_url = start_receiver(std::sync::Arc::clone(&receiver));
    let dir = tempfile::tempdir().unwrap();
    let exporter = spawn(&[
        "exporter",
        "--node",
        "gpu007",
        "--gpus",
        "4",
        "--listen",
        "127.0.0.1:0",
        "--spool-dir",
        dir.path().join("spool").to_str().unwrap(),
        "--otlp-endpoint",
        &otlp_url,
        "--otlp-interval",
        "1s",
        "--otlp-header",
        "x-api-key=k123",
    ]);
    wait_for("two OTLP exports", 60, || {
        receiver.requests.lock().unwrap().len() >= 2
    });
    let (key, last) = receiver.requests.lock().unwrap().last().cloned().unwrap();
    assert_eq!(key.as_deref(), Some("k123"));
    let resource = last["resourceMetrics"][0]["resource"]["attributes"].to_string();
    assert!(resource.contains("\"gpu007\""), "{resource}");
    let metrics = otlp_metrics(&last);
    let util = &metrics
        .iter()
        .find(|(n, _)| n == "DCGM_FI_DEV_GPU_UTIL")
        .unwrap()
        .1;
    assert_eq!(util.len(), 4, "a point per GPU");
    // Every family of the page goes over OTLP under its name (counters without `_total`),
    // except the page's families that had no sample.
    let page = scrape(&exporter.url);
    let mut page_families: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter(|l| {
            let name = l.split(' ').next().unwrap();
            page.lines()
                .any(|s| !s.starts_with('#') && s.starts_with(name))
        })
        .map(|l| {
            let name = l.split(' ').next().unwrap();
            name.strip_suffix("_total").unwrap_or(name).to_owned()
        })
        .collect();
    let mut otlp_names: Vec<String> = metrics.iter().map(|(n, _)| n.clone()).collect();
    page_families.sort();
    otlp_names.sort();
    assert_eq!(otlp_names, page_families);

    // The receiver goes away: the exporter counts failures and keeps serving, then resumes.
    receiver.down.store(true, Ordering::SeqCst);
    wait_for("failed OTLP exports to be counted", 60, || {
        metric(
            &exporter.url,
            "gpuledger_exporter_otlp_exports_failed_total",
        ) >= 2.0
    });
    let before = receiver.requests.lock().unwrap().len();
    receiver.down.store(false, Ordering::SeqCst);
    wait_for("OTLP exports to resume", 60, || {
        receiver.requests.lock().unwrap().len() > before
    });
    assert!(metric(&exporter.url, "gpuledger_exporter_otlp_exports_total") >= 3.0);
    terminate(exporter);
}
