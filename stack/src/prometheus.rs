//! Prometheus for the stack, where one is installed: a scrape configuration naming every
//! service of the stack under the job names the shipped rules select on, with the stack's
//! metrics token, the shipped rules beside it, its time series in the state directory.

use std::path::PathBuf;

use crate::layout::Layout;
use crate::processes::{arg, Service, Services};
use crate::{Error, Result};

/// `prometheus` on the PATH, if any.
pub fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

fn host_port(url: &str) -> &str {
    url.split_once("://").map_or(url, |(_, rest)| rest)
}

/// The scrape configuration: each service's `host:port`, every job with the token in
/// `token_file`.
pub fn scrape_config(
    aggregator: &str,
    scheduler: &str,
    exporters: &[(String, String)],
    token_file: &str,
) -> String {
    let job = |name: &str, targets: Vec<&str>| {
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        format!(
            "  - job_name: {name}\n    authorization:\n      credentials_file: {token_file}\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        )
    };
    format!(
        "# Written by gpuledger up at each start.\nglobal:\n  scrape_interval: 5s\n  evaluation_interval: 5s\nrule_files:\n  - gpuledger-rules.yml\nscrape_configs:\n{}{}{}",
        job(
            "gpuledger-exporter",
            exporters.iter().map(|(_, u)| host_port(u)).collect()
        ),
        job("gpuledger-aggregator", vec![host_port(aggregator)]),
        job("gpuledger-scheduler", vec![host_port(scheduler)]),
    )
}

/// A loopback port free a moment ago.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::io("finding a free port"))?;
    Ok(l.local_addr()
        .map_err(Error::io("finding a free port"))?
        .port())
}

/// Starts Prometheus on `port` (0: a free one); its URL, or `None` where none is installed.
pub fn start(
    services: &mut Services,
    layout: &Layout,
    port: u16,
    aggregator: &str,
    scheduler: &str,
    exporters: &[(String, String)],
) -> Result<Option<String>> {
    let Some(binary) = find() else {
        tracing::warn!("no prometheus on the PATH: the stack runs without one");
        return Ok(None);
    };
    let dir = layout.prometheus();
    let token = std::fs::canonicalize(layout.secret("prometheus"))
        .map_err(Error::io("finding the Prometheus token"))?;
    let config = dir.join("prometheus.yml");
    let write = |path: PathBuf, text: &str| {
        gpuledger_model::durable::replace_file(&path, text.as_bytes())
            .map_err(Error::io(format!("writing {}", path.display())))
    };
    write(
        config.clone(),
        &scrape_config(aggregator, scheduler, exporters, &arg(&token)),
    )?;
    write(
        dir.join("gpuledger-rules.yml"),
        gpuledger_dashboards::PROMETHEUS_RULES,
    )?;
    let port = if port == 0 { free_port()? } else { port };
    let url = format!("http://127.0.0.1:{port}");
    let started = services.start(
        Service::new("prometheus", binary)
            .args([
                format!("--config.file={}", arg(&config)),
                format!("--storage.tsdb.path={}", arg(&dir.join("data"))),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .ready_at(&format!("{url}/-/ready")),
    )?;
    Ok(Some(started))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_is_a_target_of_its_rules_job_with_the_token() {
        let text = scrape_config(
            "http://127.0.0.1:9400",
            "http://127.0.0.1:9500",
            &[
                ("gpu001".into(), "http://127.0.0.1:9401".into()),
                ("gpu002".into(), "http://127.0.0.1:9402".into()),
            ],
            "/s/secrets/prometheus",
        );
        assert!(text.contains(
            "job_name: gpuledger-exporter\n    authorization:\n      credentials_file: /s/secrets/prometheus\n    static_configs:\n      - targets: [\"127.0.0.1:9401\", \"127.0.0.1:9402\"]"
        ), "{text}");
        assert!(text.contains("targets: [\"127.0.0.1:9500\"]"), "{text}");
        assert!(gpuledger_dashboards::PROMETHEUS_RULES.contains("gpuledger-exporter"));
    }
}
