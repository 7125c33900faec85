//! OpenTelemetry export: the same series `/metrics` serves ([`crate::exposition::emit`]), pushed
//! every interval as an OTLP/HTTP request (`POST {endpoint}/v1/metrics`) in OTLP's JSON
//! encoding, which every OTLP/HTTP receiver (the OpenTelemetry Collector's `otlp` receiver
//! among them) must accept. Gauges stay gauges; counters become cumulative monotonic sums named
//! without `_total` (a Prometheus exporter downstream adds it back). The node is the resource
//! (`host.name`), the labels are data-point attributes.
//!
//! Export runs in its own loop from the latest snapshot, like a scrape: it never waits on the
//! GPUs, and a receiver that is down costs a logged warning and a counted failure, never a
//! sample (samples reach the aggregator through the spool, not through OTLP).

use std::time::Duration;

use serde_json::{json, Value};

use crate::agent::Shared;
use crate::exposition::{emit, Sink, Snapshot};
use gpuledger_model::time::Clock;

/// Where and how often to export.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// The receiver's base URL (`http://collector:4318`); `/v1/metrics` is appended unless
    /// the URL already ends with it.
    pub endpoint: String,
    pub interval: Duration,
    /// Extra request headers (an API key, a tenant header).
    pub headers: Vec<(String, String)>,
    pub tls: ureq::tls::TlsConfig,
}

impl OtlpConfig {
    pub fn metrics_url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        if base.ends_with("/v1/metrics") {
            base.to_owned()
        } else {
            format!("{base}/v1/metrics")
        }
    }
}

/// An `ExportMetricsServiceRequest` (OTLP JSON) of the snapshot at `now_ns`; counters count
/// from `start_ns`.
pub fn export_request(snapshot: &Snapshot, start_ns: u64, now_ns: u64) -> Value {
    let mut metrics = Metrics {
        start: start_ns.to_string(),
        now: now_ns.to_string(),
        done: Vec::new(),
        current: None,
    };
    emit(snapshot, &mut metrics);
    metrics.finish();
    json!({
        "resourceMetrics": [{
            "resource": {
                "attributes": [
                    attribute("service.name", "gpuledger-exporter"),
                    attribute("service.version", env!("CARGO_PKG_VERSION")),
                    attribute("host.name", &snapshot.node),
                    attribute("gpuledger.source", snapshot.source),
                ]
            },
            "scopeMetrics": [{
                "scope": { "name": "gpuledger-exporter", "version": env!("CARGO_PKG_VERSION") },
                "metrics": metrics.done,
            }]
        }]
    })
}

fn attribute(key: &str, value: &str) -> Value {
    json!({ "key": key, "value": { "stringValue": value } })
}

/// The unit OTLP names, from the base-unit suffix of a Prometheus name or a DCGM field.
fn unit_of(name: &str) -> &'static str {
    let base = name.strip_suffix("_total").unwrap_or(name);
    match base.rsplit('_').next() {
        Some("seconds") => "s",
        Some("bytes") => "By",
        Some("joules") => "J",
        _ if name.starts_with("DCGM_FI_PROF_") || name == "DCGM_FI_DEV_GPU_UTIL" => "%",
        _ if name == "DCGM_FI_DEV_POWER_USAGE" => "W",
        _ if name == "DCGM_FI_DEV_SM_CLOCK" => "MHz",
        _ if name == "DCGM_FI_DEV_GPU_TEMP" => "Cel",
        _ if name.starts_with("DCGM_FI_DEV_FB_") => "MiBy",
        _ => "1",
    }
}

struct Family {
    name: String,
    counter: bool,
    help: String,
    points: Vec<Value>,
}

struct Metrics {
    start: String,
    now: String,
    done: Vec<Value>,
    current: Option<Family>,
}

impl Metrics {
    fn finish(&mut self) {
        let Some(f) = self.current.take() else {
            return;
        };
        if f.points.is_empty() {
            return;
        }
        let unit = unit_of(&f.name);
        let metric = if f.counter {
            json!({
                "name": f.name.strip_suffix("_total").unwrap_or(&f.name),
                "description": f.help,
                "unit": unit,
                // 2: AGGREGATION_TEMPORALITY_CUMULATIVE
                "sum": { "aggregationTemporality": 2, "isMonotonic": true, "dataPoints": f.points },
            })
        } else {
            json!({
                "name": f.name,
                "description": f.help,
                "unit": unit,
                "gauge": { "dataPoints": f.points },
            })
        };
        self.done.push(metric);
    }
}

impl Sink for Metrics {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        self.finish();
        self.current = Some(Family {
            name: name.to_owned(),
            counter: kind == "counter",
            help: help.to_owned(),
            points: Vec::new(),
        });
    }

    fn sample(&mut self, _name: &str, labels: &[(&str, &str)], value: f64) {
        let Some(family) = self.current.as_mut() else {
            return;
        };
        // JSON has no NaN: OTLP marks a point without a value by a flag instead.
        let attributes: Vec<Value> = labels
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| attribute(k, v))
            .collect();
        let mut point = json!({
            "attributes": attributes,
            "timeUnixNano": self.now,
        });
        if family.counter {
            point["startTimeUnixNano"] = json!(self.start);
        }
        if value.is_finite() {
            point["asDouble"] = json!(value);
        } else {
            // 1: DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
            point["flags"] = json!(1);
        }
        family.points.push(point);
    }
}

/// Exports every interval until the exporter stops, then once more.
pub fn run_exporter(config: &OtlpConfig, clock: &dyn Clock, shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(config.tls.clone())
        .build()
        .into();
    let url = config.metrics_url();
    let start_ns = clock_ns(clock);
    loop {
        let stopping = shared.wait_or_stop(config.interval);
        let request = export_request(&shared.snapshot(), start_ns, clock_ns(clock));
        let mut call = agent.post(&url).header("content-type", "application/json");
        for (k, v) in &config.headers {
            call = call.header(k, v);
        }
        let outcome = match call.send(request.to_string().as_bytes()) {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(mut r) => Err(format!(
                "HTTP {}: {}",
                r.status(),
                r.body_mut().read_to_string().unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(()) => shared.count_otlp_export(true),
            Err(error) => {
                tracing::warn!(url, %error, "OTLP export failed");
                shared.count_otlp_export(false);
            }
        }
        if stopping {
            return;
        }
    }
}

fn clock_ns(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now_ms()).unwrap_or(0) * 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::Health;
    use crate::source::{GpuReading, JobLabel};
    use crate::synthetic::synthetic_devices;
    use gpuledger_model::GpuModel;

    fn snapshot() -> Snapshot {
        let devices = synthetic_devices(1, "gpu001", 2, GpuModel::H100Sxm);
        Snapshot {
            node: "gpu001".into(),
            source: "synthetic",
            readings: vec![
                Some(GpuReading {
                    gpu_util_pct: Some(87.0),
                    tensor_active: Some(41.5),
                    ..GpuReading::default()
                }),
                None,
            ],
            labels: vec![
                Some(JobLabel {
                    job_id: "17".into(),
                    account: "team-a".into(),
                    project: None,
                }),
                None,
            ],
            energy_joules_total: vec![1500.0, 20.0],
            devices,
            health: Health {
                samples_total: 42,
                ..Health::default()
            },
            ..Snapshot::default()
        }
    }

    fn metric<'a>(request: &'a Value, name: &str) -> &'a Value {
        request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    fn attributes(point: &Value) -> Vec<(String, String)> {
        point["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["key"].as_str().unwrap().to_owned(),
                    a["value"]["stringValue"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn gauges_and_counters_carry_the_pages_values_and_labels() {
        let request = export_request(&snapshot(), 1_000, 2_000);
        let resource = &request["resourceMetrics"][0]["resource"]["attributes"];
        assert!(resource
            .as_array()
            .unwrap()
            .contains(&attribute("host.name", "gpu001")));

        let util = metric(&request, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(util["unit"], "%");
        let points = util["gauge"]["dataPoints"].as_array().unwrap();
        // The unread GPU has no reading, so one point.
        assert_eq!(points.len(), 1);
        assert_eq!(points[0]["asDouble"], 87.0);
        assert_eq!(points[0]["timeUnixNano"], "2000");
        let labels = attributes(&points[0]);
        assert!(
            labels.contains(&("hpc_job".into(), "17".into())),
            "{labels:?}"
        );
        assert!(labels.contains(&("account".into(), "team-a".into())));
        assert!(
            !labels.iter().any(|(k, _)| k == "project"),
            "empty labels are left out"
        );

        let energy = metric(&request, "gpuledger_gpu_energy_joules");
        assert_eq!(energy["unit"], "J");
        let sum = &energy["sum"];
        assert_eq!(sum["isMonotonic"], true);
        assert_eq!(sum["aggregationTemporality"], 2);
        let values: Vec<f64> = sum["dataPoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["asDouble"].as_f64().unwrap())
            .collect();
        assert_eq!(values, [1500.0, 20.0]);
        assert_eq!(sum["dataPoints"][0]["startTimeUnixNano"], "1000");

        let up = metric(&request, "gpuledger_gpu_up");
        let ups: Vec<f64> = up["gauge"]["dataPoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["asDouble"].as_f64().unwrap())
            .collect();
        assert_eq!(ups, [1.0, 0.0]);
        let samples = metric(&request, "gpuledger_exporter_samples");
        assert_eq!(samples["sum"]["dataPoints"][0]["asDouble"], 42.0);
        // Families with no sample (no XID seen) are not sent.
        let names: Vec<&str> = request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert!(!names.contains(&"gpuledger_gpu_xid_errors"), "{names:?}");
    }

    #[test]
    fn the_metrics_path_is_appended_once() {
        let config = |endpoint: &str| OtlpConfig {
            endpoint: endpoint.into(),
            interval: Duration::from_secs(10),
            headers: Vec::new(),
            tls: ureq::tls::TlsConfig::default(),
        };
        assert_eq!(
            config("http://c:4318").metrics_url(),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            config("http://c:4318/v1/metrics/").metrics_url(),
            "http://c:4318/v1/metrics"
        );
    }
}
