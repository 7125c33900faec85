//! gpuledger's exporter as a drop-in for dcgm-exporter: a real Prometheus scrapes it, and every
//! query of NVIDIA's community dashboard for dcgm-exporter (Grafana 12239, the
//! `dcgm-exporter-dashboard.json` dcgm-exporter ships; its variable and panel queries are
//! written here as it has them) returns data, with the variables set as Grafana's "All" sets
//! them. Every GPU series carries dcgm-exporter's identity labels, and the page passes
//! `promtool check metrics`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use common::{promtool_check_metrics, scrape, spawn, start_prometheus, terminate, wait_for};

/// The dashboard's variables: `Hostname`, then `gpu` of the chosen hosts.
const VARIABLES: [(&str, &str, &str); 2] = [
    ("Hostname", "DCGM_FI_DEV_FB_FREE", "Hostname"),
    ("gpu", "DCGM_FI_DEV_FB_FREE{Hostname=~\"$Hostname\"}", "gpu"),
];

/// Each panel's query: title, expression.
const PANELS: [(&str, &str); 8] = [
    (
        "GPU Temperature",
        "max(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
    ),
    (
        "GPU Avg. Temp",
        "avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"})",
    ),
    (
        "GPU Power Usage",
        "max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
    ),
    (
        "GPU Power Total",
        "sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (gpu))",
    ),
    (
        "GPU SM Clocks",
        "max(DCGM_FI_DEV_SM_CLOCK{Hostname=~\"$Hostname\", gpu=~\"$gpu\"} * 1000000) by (Hostname, UUID, gpu)",
    ),
    (
        "GPU Utilization",
        "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
    (
        "Tensor Core Utilization",
        "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
    (
        "GPU Framebuffer Mem Used",
        "max(DCGM_FI_DEV_FB_USED{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    ),
];

fn api(prometheus: &str, path: &str, params: &[(&str, &str)]) -> Value {
    let mut request = ureq::get(format!("{prometheus}{path}"));
    for (k, v) in params {
        request = request.query(*k, *v);
    }
    let text = request.call().unwrap().body_mut().read_to_string().unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["status"], "success", "{path}: {text}");
    v["data"].clone()
}

/// Grafana's "All" for a multi-value variable: its values as one regex alternation.
fn all_of(values: &[String]) -> String {
    format!("({})", values.join("|"))
}

#[test]
fn every_query_of_the_dcgm_exporter_dashboard_has_data_from_gpuledgers_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let exporters: Vec<common::Process> = ["gpu001", "gpu002"]
        .iter()
        .map(|node| {
            spawn(
                &[
                    "exporter",
                    "--node",
                    node,
                    "--gpus",
                    "2",
                    "--listen",
                    "127.0.0.1:0",
                    "--spool-dir",
                    spool.join(node).to_str().unwrap(),
                    "--sample-interval",
                    "1s",
                ],
                Stdio::inherit(),
            )
        })
        .collect();
    let page = scrape(&exporters[0].url);
    assert_eq!(promtool_check_metrics(&page), "", "{page}");
    // Of its labels only dcgm-exporter's `modelName` is camelCase (promtool's lint allows it
    // above for that reason alone).
    for line in page.lines().filter(|l| l.starts_with("DCGM_FI_")) {
        let labels = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        for pair in labels.split("\",") {
            let name = pair.split('=').next().unwrap();
            let camel = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && name.chars().any(|c| c.is_ascii_uppercase());
            assert!(!camel || name == "modelName", "{name} in {line}");
        }
    }
    let targets: Vec<String> = exporters
        .iter()
        .map(|e| format!("\"{}\"", e.url.trim_start_matches("http://")))
        .collect();
    let prometheus = start_prometheus(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpuledger-exporter\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    );
    let url = prometheus.url.clone();
    wait_for("Prometheus to hold both exporters' GPUs", 60, || {
        let data = api(
            &url,
            "/api/v1/query",
            &[("query", "count(DCGM_FI_DEV_FB_FREE)")],
        );
        data["result"][0]["value"][1] == "4"
    });

    // The variables, as Grafana's label_values() asks Prometheus for them.
    let mut chosen: Vec<(&str, String)> = Vec::new();
    for (name, series, label) in VARIABLES {
        let mut selector = series.to_owned();
        for (var, value) in &chosen {
            selector = selector.replace(&format!("${var}"), value);
        }
        let values: Vec<String> = api(
            &url,
            &format!("/api/v1/label/{label}/values"),
            &[("match[]", &selector)],
        )
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
        let expected: &[&str] = if name == "Hostname" {
            &["gpu001", "gpu002"]
        } else {
            &["0", "1"]
        };
        assert_eq!(values, expected, "variable {name}");
        chosen.push((name, all_of(&values)));
    }

    for (title, expr) in PANELS {
        let mut query = expr.to_owned();
        for (var, value) in &chosen {
            query = query.replace(&format!("${var}"), value);
        }
        let data = api(&url, "/api/v1/query", &[("query", &query)]);
        let result = data["result"].as_array().unwrap();
        assert!(!result.is_empty(), "panel `{title}` has no data: {query}");
        // Over the last minute too, as the panel draws it.
        let now = chrono::Utc::now().timestamp();
        let range = api(
            &url,
            "/api/v1/query_range",
            &[
                ("query", &query),
                ("start", &(now - 60).to_string()),
                ("end", &(now + 2).to_string()),
                ("step", "1"),
            ],
        );
        assert!(
            !range["result"].as_array().unwrap().is_empty(),
            "panel `{title}` draws nothing over a minute"
        );
    }
    // Every GPU series carries the identity labels other tools select on.
    let series = api(
        &url,
        "/api/v1/series",
        &[("match[]", "{__name__=~\"DCGM_FI_.*\"}")],
    );
    let series = series.as_array().unwrap();
    assert!(series.len() >= 4 * 10, "{} series", series.len());
    for s in series {
        for label in [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
        ] {
            assert!(
                s[label].as_str().is_some_and(|v| !v.is_empty()),
                "{label} missing on {s}"
            );
        }
        assert_eq!(s["modelName"], "NVIDIA H100 80GB HBM3", "{s}");
    }
    // PROF fields are ratios, as dcgm-exporter's are.
    let max = api(
        &url,
        "/api/v1/query",
        &[("query", "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE) <= 1")],
    );
    assert!(!max["result"].as_array().unwrap().is_empty(), "{max}");
    std::thread::sleep(Duration::from_millis(10));
    drop(prometheus);
    for e in exporters {
        terminate(e);
    }
}
