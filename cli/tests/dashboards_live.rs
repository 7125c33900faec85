//! The dashboards against a real Prometheus (Debian's `prometheus`): a scheduler, an
//! aggregator and three exporters (synthetic GPUs) run on loopback with a short workload (jobs
//! that run, complete, fail, wait, and one urgent job that preempts); Prometheus scrapes them
//! every second with gpuledger's rules loaded. Then every query of every panel of every
//! dashboard must return data and name only metrics the services export
//! (`gpuledger dashboards check`), the example Prometheus configuration must pass `promtool
//! check config`, and each dashboard's preview (`gpuledger dashboards preview`) is saved as a
//! screenshot from a real headless Chromium.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::browser::{screenshot_dir, Browser};
use common::{scrape, spawn, wait_for, Process};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

const CONFIG: &str = r#"version = 1
[cluster]
name = "live"
[[node_pools]]
name = "p"
prefix = "gpu"
count = 3
gpus_per_node = 4
gpu_model = "h100-sxm"
[[partitions]]
name = "urgent"
priority_tier = 50
[[partitions]]
name = "train"
priority_tier = 20
default = true
[scheduler]
min_run_time = "1s"
default_grace = "2s"
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10.00" }
[[accounts]]
id = "team-a"
name = "Research"
weight = 2
quota = { gpu_hours_per_day = 100, gpu_hours_per_week = 500 }
projects = [{ id = "pretrain" }]
run_as = { user = "root" }
[[accounts]]
id = "team-b"
name = "Product"
weight = 1
quota = { gpu_hours_per_day = 50 }
projects = [{ id = "finetune" }]
run_as = { user = "root" }
"#;

fn host_port(url: &str) -> &str {
    url.trim_start_matches("http://").trim_end_matches('/')
}

fn start_prometheus(
    dir: &Path,
    exporters: &[&Process],
    aggregator: &Process,
    scheduler: &Process,
) -> Process {
    let rules = Path::new(REPO).join("dashboards/prometheus/gpuledger-rules.yml");
    let targets = |ps: &[&Process]| {
        ps.iter()
            .map(|p| format!("\"{}\"", host_port(&p.url)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n\
         \x20 - job_name: gpuledger-exporter\n    static_configs:\n      - targets: [{}]\n\
         \x20 - job_name: gpuledger-aggregator\n    static_configs:\n      - targets: [{}]\n\
         \x20 - job_name: gpuledger-scheduler\n    static_configs:\n      - targets: [{}]\n",
        rules.display(),
        targets(exporters),
        targets(&[aggregator]),
        targets(&[scheduler]),
    );
    common::start_prometheus(dir, &config)
}

fn submit(scheduler: &str, body: serde_json::Value) -> String {
    let mut r = ureq::post(format!("{scheduler}/api/v1/jobs"))
        .header("content-type", "application/json")
        .send(body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("submit {body}: {e}"));
    let v: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    v["job_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v["job_id"].to_string())
}

fn gpuledger(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .unwrap()
}

fn instant(prom: &str, expr: &str) -> Vec<serde_json::Value> {
    let mut r = ureq::get(format!("{prom}/api/v1/query"))
        .query("query", expr)
        .call()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// A job that runs until signalled (two minutes at most, so a failed test leaves nothing
/// behind for long).
const LONG: &str = "trap 'exit 0' TERM; i=0; while [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done";

#[test]
fn every_panel_of_every_dashboard_has_data_in_a_real_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.to_str().unwrap().to_owned();
    let data = dir.path().join("data");
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.join("agg").to_str().unwrap(),
            "--config",
            &config,
            "--flush-interval",
            "1s",
        ],
        Stdio::inherit(),
    );
    let scheduler = spawn(
        &[
            "scheduler",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            &config,
            "--aggregator",
            &aggregator.url,
            "--cycle",
            "200ms",
            "--usage-every",
            "2s",
        ],
        Stdio::inherit(),
    );
    let exporters: Vec<Process> = ["gpu001", "gpu002", "gpu003"]
        .iter()
        .map(|node| {
            spawn(
                &[
                    "exporter",
                    "--node",
                    node,
                    "--gpus",
                    "4",
                    "--sample-interval",
                    "1s",
                    "--push-interval",
                    "1s",
                    "--listen",
                    "127.0.0.1:0",
                    "--scheduler-url",
                    &scheduler.url,
                    "--aggregator-url",
                    &aggregator.url,
                    "--spool-dir",
                    dir.path().join(format!("spool-{node}")).to_str().unwrap(),
                ],
                Stdio::inherit(),
            )
        })
        .collect();
    let exporter_refs: Vec<&Process> = exporters.iter().collect();
    let prom = start_prometheus(dir.path(), &exporter_refs, &aggregator, &scheduler);
    // Prometheus hands targets to its scrapers only after a few seconds: the first scrapes must
    // see the counters at 0, before any job ends.
    wait_for("Prometheus to scrape every service", 60, || {
        instant(&prom.url, "up == 1").len() == 5
    });

    // The workload: two long jobs and three short ones (two complete, one fails) fill the
    // twelve GPUs; once the short ones are done, team-b's job of two nodes waits (one node is
    // free) and team-a's urgent job of two nodes preempts a long one.
    let s = scheduler.url.as_str();
    let job = |account: &str, project: &str, gpus: u32, partition: &str, command: &str| {
        serde_json::json!({"account": account, "project": project, "gpus": gpus, "partition": partition,
                           "time_limit": "1h", "grace": "2s", "command": command})
    };
    submit(s, job("team-a", "pretrain", 4, "train", LONG));
    submit(s, job("team-b", "finetune", 4, "train", LONG));
    submit(s, job("team-a", "pretrain", 1, "train", "sleep 3"));
    submit(s, job("team-a", "pretrain", 1, "train", "sleep 2; exit 3"));
    submit(s, job("team-b", "finetune", 2, "train", "sleep 3"));
    wait_for("the short jobs to finish", 60, || {
        let page = scrape(&aggregator.url);
        page.contains("gpuledger_jobs_finished_total{account=\"team-a\",outcome=\"completed\"} 1")
            && page
                .contains("gpuledger_jobs_finished_total{account=\"team-a\",outcome=\"failed\"} 1")
            && page.contains(
                "gpuledger_jobs_finished_total{account=\"team-b\",outcome=\"completed\"} 1",
            )
    });
    submit(s, job("team-b", "finetune", 8, "train", LONG));
    std::thread::sleep(Duration::from_secs(2));
    let urgent = submit(s, job("team-a", "pretrain", 8, "urgent", LONG));
    wait_for("a preemption", 60, || {
        scrape(s).contains("gpuledger_scheduler_preemptions_total 1")
    });
    wait_for("the exporters to label the urgent job's GPUs", 60, || {
        exporters
            .iter()
            .filter(|e| {
                scrape(&e.url).contains(&format!("hpc_job=\"{urgent}\",account=\"team-a\""))
            })
            .count()
            == 2
    });
    // Rates and increases need a few scrapes after the last change; the one-hour windows of
    // the rules need two samples.
    wait_for("Prometheus to have recorded the rules", 90, || {
        !instant(&prom.url, "gpuledger:account_queue_wait_seconds:p95_1h").is_empty()
            && !instant(&prom.url, "gpuledger:job_mfu:ratio").is_empty()
            && !instant(&prom.url, "gpuledger:account_mfu:ratio_1h").is_empty()
    });
    std::thread::sleep(Duration::from_secs(12));

    let up = instant(&prom.url, "up == 1");
    assert_eq!(
        up.len(),
        5,
        "three exporters, the aggregator and the scheduler: {up:?}"
    );
    let query_args = [
        "--prometheus",
        &prom.url,
        "--var",
        "account=team-a",
        "--range",
        "5m",
        "--scrape-interval",
        "1s",
    ];
    let check = gpuledger(&[&["dashboards", "check"][..], &query_args].concat());
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "{report}");
    assert!(report.contains("queries returned data"), "{report}");
    let queries = report.lines().filter(|l| l.ends_with(" points")).count();
    let targets: usize = ["cluster", "tenants", "jobs", "nodes"]
        .iter()
        .map(|d| {
            std::fs::read_to_string(Path::new(REPO).join(format!("dashboards/grafana/{d}.json")))
                .unwrap()
                .matches("\"expr\":")
                .count()
        })
        .sum();
    assert_eq!(
        queries, targets,
        "every query of every panel was run:\n{report}"
    );

    // With every family populated by the workload, promtool finds nothing to complain about on
    // any of the services' pages.
    let pages: Vec<(&str, String)> = exporters
        .iter()
        .map(|e| ("exporter", scrape(&e.url)))
        .chain([
            ("aggregator", scrape(&aggregator.url)),
            ("scheduler", scrape(s)),
        ])
        .collect();
    for (name, page) in pages {
        assert!(
            page.contains("hpc_job=") || name == "scheduler",
            "{name}: {page}"
        );
        let complaints = common::promtool_check_metrics(&page);
        assert!(
            complaints.is_empty(),
            "{name}: promtool complains:\n{complaints}"
        );
    }

    // A query that finds nothing fails the check: the check can fail.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("broken.json"),
        r#"{"uid": "broken", "title": "broken", "panels": [{"id": 1, "type": "stat", "title": "nothing",
            "targets": [{"refId": "A", "expr": "gpuledger_no_such_metric"}]}]}"#,
    )
    .unwrap();
    let out = gpuledger(&[
        "dashboards",
        "check",
        "--prometheus",
        &prom.url,
        "--dir",
        broken.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("no data")
            && err.contains("gpuledger_no_such_metric"),
        "{err}"
    );

    // The example scrape configuration passes as shipped, with its rules, and with its
    // authorization blocks uncommented beside a token file.
    let example = dir.path().join("example");
    std::fs::create_dir_all(&example).unwrap();
    for f in ["prometheus.yml", "gpuledger-rules.yml"] {
        std::fs::copy(
            Path::new(REPO).join("dashboards/prometheus").join(f),
            example.join(f),
        )
        .unwrap();
    }
    let promtool_check = |file: &Path| {
        let out = Command::new("promtool")
            .args(["check", "config", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    promtool_check(&example.join("prometheus.yml"));
    let shipped = std::fs::read_to_string(example.join("prometheus.yml")).unwrap();
    let with_tokens = shipped
        .replace("# authorization:", "authorization:")
        .replace("#   credentials_file", "  credentials_file");
    assert_eq!(
        with_tokens
            .matches("credentials_file: gpuledger-token")
            .count(),
        3
    );
    std::fs::write(example.join("with-tokens.yml"), with_tokens).unwrap();
    std::fs::write(example.join("gpuledger-token"), "gpl_x\n").unwrap();
    promtool_check(&example.join("with-tokens.yml"));

    // Each dashboard's panel list with the data it drew, in a real browser.
    let previews = dir.path().join("previews");
    let out = gpuledger(
        &[
            &["dashboards", "preview"][..],
            &query_args,
            &["--out", previews.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let browser = Browser::start(1400, 1000);
    let shots = screenshot_dir();
    for uid in [
        "gpuledger-cluster",
        "gpuledger-tenants",
        "gpuledger-jobs",
        "gpuledger-nodes",
    ] {
        browser.open(&format!(
            "file://{}",
            previews.join(format!("{uid}.html")).display()
        ));
        let text = browser.text();
        assert!(
            !text.contains("no data"),
            "{uid}: a panel drew nothing:\n{text}"
        );
        let panels = browser.script("return document.querySelectorAll('.panel').length;");
        let charts = browser
            .script("return document.querySelectorAll('.panel svg path, .panel table td').length;");
        assert!(panels.as_u64().unwrap_or(0) >= 8, "{uid}: {panels}");
        assert!(
            charts.as_u64().unwrap_or(0) >= panels.as_u64().unwrap_or(0),
            "{uid}: {charts} drawn things"
        );
        browser.fit_height(1400);
        browser.screenshot(&shots.join(format!("{uid}.png")));
    }
    drop(browser);
    drop(prom);
    for e in exporters {
        common::terminate(e);
    }
    // Jobs outlive a scheduler that stops (it adopts them when it comes back): cancel them.
    let queue = gpuledger(&["scheduler", "queue", "--url", s]);
    let ids = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|id| id.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_owned)
            .collect()
    };
    for id in ids(&String::from_utf8_lossy(&queue.stdout)) {
        let _ = gpuledger(&["scheduler", "cancel", &id, "--url", s]);
    }
    wait_for("the jobs to end", 30, || {
        ids(&String::from_utf8_lossy(
            &gpuledger(&["scheduler", "queue", "--url", s]).stdout,
        ))
        .is_empty()
    });
    common::terminate(scheduler);
    common::terminate(aggregator);
}
