//! `gpuledger exporter`: the per-node agent. Wires a GPU source, the sampling and push loops
//! of `gpuledger_exporter::agent`, and `/metrics` over HTTP; on SIGTERM or Ctrl-C it spools what
//! it collected, tries one last push, and exits (anything unsent stays in the spool).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gpuledger_exporter::agent::{run_pusher, run_sampler, AgentConfig, Shared};
use gpuledger_exporter::dcgm::DcgmExporterSource;
use gpuledger_exporter::exposition::{render, Format, Snapshot};
use gpuledger_exporter::nvml::NvmlSource;
use gpuledger_exporter::otlp::{self, OtlpConfig};
use gpuledger_exporter::spool::Spool;
use gpuledger_exporter::synthetic::SyntheticSource;
use gpuledger_exporter::GpuSource;
use gpuledger_model::time::{Clock, SystemClock};
use gpuledger_model::GpuModel;

use crate::serve::announce;

/// Where GPU readings come from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// GPUs whose readings follow the jobs mapped to them; deterministic from --seed.
    Synthetic,
    /// The NVIDIA driver through NVML (libnvidia-ml.so.1).
    Nvml,
    /// An existing dcgm-exporter's page (--dcgm-url), profiling fields and job labels
    /// included.
    DcgmExporter,
}

/// Options of `gpuledger exporter`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExporterArgs {
    /// A TOML file of these options (keys are the option names with `_`, e.g.
    /// `sample_interval = "1s"`); options given on the command line win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's name, as the aggregator knows it.
    #[arg(long, env = "GPULEDGER_NODE")]
    pub node: String,
    /// Source of GPU readings.
    #[arg(long, value_enum, default_value = "synthetic")]
    pub source: SourceKind,
    /// Synthetic source: number of GPUs.
    #[arg(long, default_value_t = 8)]
    pub gpus: u16,
    /// Synthetic source: GPU model (a100, h100-sxm, h100-pcie, h200).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu_model: GpuModel,
    /// Synthetic source: seed of the readings.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// dcgm-exporter source: the page to read.
    #[arg(long, default_value = "http://127.0.0.1:9400/metrics")]
    pub dcgm_url: String,
    /// dcgm-exporter source: the series label that names a job's project (a pod label
    /// dcgm-exporter adds with --kubernetes-enable-pod-labels, such as Kueue's queue name);
    /// the namespace is the account, the pod the job.
    #[arg(long)]
    pub dcgm_project_label: Option<String>,
    /// How often every GPU is read (e.g. `1s`, `250ms`).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub sample_interval: Duration,
    /// How often collected samples are spooled and pushed as one batch.
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub push_interval: Duration,
    /// The aggregator's base URL (e.g. http://aggregator:9400); without it batches stay in the
    /// spool.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_URL")]
    pub aggregator_url: Option<String>,
    /// A file holding this node's token for the aggregator (`gpuledger token add --role node
    /// --node NAME`), when the aggregator runs with --tokens.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    pub aggregator_token_file: Option<PathBuf>,
    /// Durable outbox of batches not yet acknowledged.
    #[arg(long, default_value = "./gpuledger-spool")]
    pub spool_dir: PathBuf,
    /// Bound of the spool in bytes; past it the oldest batches are dropped and counted.
    #[arg(long, default_value_t = 1 << 30)]
    pub spool_max_bytes: u64,
    /// Job-mapping directory: a file per GPU index holding `job_id account [project]`.
    #[arg(long)]
    pub job_mapping_dir: Option<PathBuf>,
    /// `gpuledger scheduler`'s URL: label GPUs from its allocation feed (wins over
    /// --job-mapping-dir).
    #[arg(long)]
    pub scheduler_url: Option<String>,
    /// Address of /metrics (`127.0.0.1:0` picks a free port; the address is printed).
    #[arg(long, default_value = "0.0.0.0:9401")]
    pub listen: SocketAddr,
    /// Token file (`gpuledger token add`): /metrics then wants an operator's bearer token
    /// (Prometheus's `authorization` in its scrape config). Without it /metrics is open.
    #[arg(long, env = "GPULEDGER_TOKENS")]
    pub tokens: Option<PathBuf>,
    #[command(flatten)]
    pub tls: crate::http_server::TlsArgs,
    #[command(flatten)]
    pub client_tls: crate::ClientTlsArgs,
    /// Also export the GPU series over OTLP/HTTP (JSON) to this receiver, e.g.
    /// `http://collector:4318` (`/v1/metrics` is appended).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// How often the OTLP export runs.
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub otlp_interval: Duration,
    /// A header for the OTLP receiver, `KEY=VALUE` (repeat, or comma-separated as in
    /// OTEL_EXPORTER_OTLP_HEADERS).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_HEADERS", value_delimiter = ',', value_parser = parse_header)]
    pub otlp_header: Vec<(String, String)>,
}

/// `KEY=VALUE`.
fn parse_header(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected KEY=VALUE"))?;
    let key = key.trim();
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
    {
        return Err(format!("`{text}`: `{key}` is not a header name"));
    }
    Ok((key.to_owned(), value.trim().to_owned()))
}

/// The exporter's TOML file: the command-line options, typed, nothing else.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExporterFile {
    pub node: Option<String>,
    pub source: Option<String>,
    pub gpus: Option<u16>,
    pub gpu_model: Option<GpuModel>,
    pub seed: Option<u64>,
    pub dcgm_url: Option<String>,
    pub dcgm_project_label: Option<String>,
    pub sample_interval: Option<String>,
    pub push_interval: Option<String>,
    pub aggregator_url: Option<String>,
    pub aggregator_token_file: Option<PathBuf>,
    pub spool_dir: Option<PathBuf>,
    pub spool_max_bytes: Option<u64>,
    pub job_mapping_dir: Option<PathBuf>,
    pub scheduler_url: Option<String>,
    pub listen: Option<SocketAddr>,
    pub tokens: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub otlp_endpoint: Option<String>,
    pub otlp_interval: Option<String>,
    pub otlp_header: Option<Vec<String>>,
}

impl ExporterFile {
    /// Reads and checks a file; errors name the file, line and key.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: ExporterFile =
            gpuledger_model::config::parse_toml(&text, &path.display().to_string())?;
        for (key, value) in [
            ("sample_interval", &file.sample_interval),
            ("push_interval", &file.push_interval),
            ("otlp_interval", &file.otlp_interval),
        ] {
            if let Some(v) = value {
                parse_interval(v)
                    .map_err(|e| anyhow::anyhow!("{}: `{key}`: {e}", path.display()))?;
            }
        }
        Ok(file)
    }

    /// The file as command-line options, to go before the ones typed.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut put = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                out.push(format!("--{flag}"));
                out.push(v);
            }
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        put("node", self.node.clone());
        put("source", self.source.clone());
        put("gpus", self.gpus.map(|g| g.to_string()));
        put("gpu-model", self.gpu_model.map(|m| m.key().to_owned()));
        put("seed", self.seed.map(|s| s.to_string()));
        put("dcgm-url", self.dcgm_url.clone());
        put("dcgm-project-label", self.dcgm_project_label.clone());
        put("sample-interval", self.sample_interval.clone());
        put("push-interval", self.push_interval.clone());
        put("aggregator-url", self.aggregator_url.clone());
        put("aggregator-token-file", path(&self.aggregator_token_file));
        put("spool-dir", path(&self.spool_dir));
        put(
            "spool-max-bytes",
            self.spool_max_bytes.map(|b| b.to_string()),
        );
        put("job-mapping-dir", path(&self.job_mapping_dir));
        put("scheduler-url", self.scheduler_url.clone());
        put("listen", self.listen.map(|l| l.to_string()));
        put("tokens", path(&self.tokens));
        put("tls-cert", path(&self.tls_cert));
        put("tls-key", path(&self.tls_key));
        put("ca-file", path(&self.ca_file));
        put("otlp-endpoint", self.otlp_endpoint.clone());
        put("otlp-interval", self.otlp_interval.clone());
        for header in self.otlp_header.iter().flatten() {
            put("otlp-header", Some(header.clone()));
        }
        out
    }
}

/// Expands `gpuledger exporter --config FILE ...` into the file's options followed by the
/// typed ones (which, parsed later, win). Other command lines pass through unchanged.
pub fn expand_config_file(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    let Some(sub) = args.iter().position(|a| a == "exporter") else {
        return Ok(args);
    };
    let mut file = None;
    for (i, a) in args.iter().enumerate().skip(sub + 1) {
        if a == "--config" {
            file = args.get(i + 1).cloned();
        } else if let Some(v) = a.strip_prefix("--config=") {
            file = Some(v.to_owned());
        }
    }
    let Some(file) = file else {
        return Ok(args);
    };
    let extra = ExporterFile::load(std::path::Path::new(&file))?.to_args();
    let mut out = args[..=sub].to_vec();
    out.extend(extra);
    out.extend_from_slice(&args[sub + 1..]);
    Ok(out)
}

/// `250ms`, `1s`, `2m`.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| text.split_at(i))
        .unwrap_or((text, "s"));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}`: expected a number and a unit, like 250ms, 1s or 2m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("`{text}`: unit must be ms, s or m")),
    };
    if d.is_zero() {
        return Err(format!("`{text}`: must be longer than 0"));
    }
    Ok(d)
}

fn open_source(args: &ExporterArgs) -> anyhow::Result<Box<dyn GpuSource>> {
    Ok(match args.source {
        SourceKind::Synthetic => Box::new(SyntheticSource::new(
            args.seed,
            &args.node,
            args.gpus,
            args.gpu_model,
        )),
        SourceKind::Nvml => Box::new(NvmlSource::open().context("opening the NVML source")?),
        SourceKind::DcgmExporter => Box::new(
            DcgmExporterSource::open_with(&args.dcgm_url, args.dcgm_project_label.as_deref())
                .context("opening the dcgm-exporter source")?,
        ),
    })
}

/// Runs the exporter until SIGTERM or Ctrl-C.
pub fn run(args: ExporterArgs) -> anyhow::Result<()> {
    if args.sample_interval.subsec_nanos() != 0 {
        // Samples carry their interval in whole seconds: that is what is billed.
        bail!("--sample-interval must be a whole number of seconds (1s, 2s, ...)");
    }
    if args.push_interval < args.sample_interval {
        bail!("--push-interval must not be shorter than --sample-interval");
    }
    // The exporter's page is open by default, as dcgm-exporter's is (GPU readings and job ids,
    // no usage totals or money); --tokens closes it.
    let exposure = crate::serve::Exposure {
        listen: args.listen,
        allow_unauthenticated: true,
    };
    let guard = crate::serve::guard("exporter", args.tokens.as_deref(), &[], exposure)?;
    let tls = args.tls.acceptor()?;
    let source = open_source(&args)?;
    let spool = Spool::open(&args.spool_dir, args.spool_max_bytes)
        .with_context(|| format!("opening the spool {}", args.spool_dir.display()))?;
    let devices = source.devices().to_vec();
    let snapshot = Snapshot {
        node: args.node.clone(),
        source: source.kind(),
        readings: vec![None; devices.len()],
        labels: vec![None; devices.len()],
        energy_joules_total: vec![0.0; devices.len()],
        devices,
        ..Snapshot::default()
    };
    let shared = Shared::new(snapshot, spool);
    let config = AgentConfig {
        node: args.node.clone(),
        sample_interval: args.sample_interval,
        push_interval: args.push_interval,
        aggregator_url: args.aggregator_url.clone(),
        job_mapping_dir: args.job_mapping_dir.clone(),
        scheduler_url: args.scheduler_url.clone(),
        aggregator_token: args
            .aggregator_token_file
            .as_deref()
            .map(crate::read_token_file)
            .transpose()?,
        max_backoff: Duration::from_secs(30),
        tls: args.client_tls.config()?,
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let sampler = {
        let (shared, config, clock) = (Arc::clone(&shared), config.clone(), Arc::clone(&clock));
        std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || run_sampler(source, &config, clock.as_ref(), &shared))?
    };
    let pusher = {
        let (shared, config, clock) = (Arc::clone(&shared), config.clone(), Arc::clone(&clock));
        std::thread::Builder::new()
            .name("pusher".into())
            .spawn(move || run_pusher(&config, clock.as_ref(), &shared))?
    };
    let otlp = match &args.otlp_endpoint {
        Some(endpoint) => {
            let otlp = OtlpConfig {
                endpoint: endpoint.clone(),
                interval: args.otlp_interval,
                headers: args.otlp_header.clone(),
                tls: config.tls.clone(),
            };
            let (shared, clock) = (Arc::clone(&shared), Arc::clone(&clock));
            Some(
                std::thread::Builder::new()
                    .name("otlp".into())
                    .spawn(move || otlp::run_exporter(&otlp, clock.as_ref(), &shared))?,
            )
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metrics = MetricsState {
        shared: Arc::clone(&shared),
        guard: Arc::new(guard),
    };
    runtime.block_on(serve_metrics(args.listen, metrics, tls))?;
    shared.stop();
    let _ = sampler.join();
    let _ = pusher.join();
    if let Some(otlp) = otlp {
        let _ = otlp.join();
    }
    announce("gpuledger exporter stopped");
    Ok(())
}

/// What the `/metrics` handler reads: the latest snapshot, and who may read it.
#[derive(Clone)]
struct MetricsState {
    shared: Arc<Shared>,
    guard: Arc<gpuledger_auth::Guard>,
}

async fn serve_metrics(
    listen: SocketAddr,
    state: MetricsState,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state);
    let shutdown = crate::serve::shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    announce(&format!(
        "gpuledger exporter listening on {}://{}",
        crate::http_server::scheme(tls.as_ref()),
        listener.local_addr()?
    ));
    // Only Prometheus scrapes here: a few connections are plenty.
    let limits = crate::http_server::HttpLimits {
        max_connections: 64,
        ..Default::default()
    };
    crate::http_server::serve(listener, app, limits, tls, shutdown).await?;
    Ok(())
}

async fn metrics(State(state): State<MetricsState>, headers: HeaderMap) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(gpuledger_auth::bearer);
    if let Err(denied) = state.guard.check(token, gpuledger_auth::Action::Metrics) {
        let (status, message) = match denied {
            gpuledger_auth::Denied::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is needed to read /metrics",
            ),
            gpuledger_auth::Denied::Forbidden => (
                StatusCode::FORBIDDEN,
                "this token's role may not read /metrics (an operator's may)",
            ),
        };
        let body = serde_json::json!({ "error": message });
        return (
            status,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(body),
        )
            .into_response();
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::from_accept(accept);
    let body = render(&state.shared.snapshot(), format);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::parse_interval;
    use std::time::Duration;

    #[test]
    fn the_example_config_file_expands_and_flags_win() {
        use super::expand_config_file;
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/exporter.toml");
        let args: Vec<String> = [
            "gpuledger",
            "exporter",
            "--config",
            example,
            "--node",
            "gpu999",
        ]
        .map(String::from)
        .into();
        let expanded = expand_config_file(args).unwrap();
        let node_flags: Vec<&String> = expanded
            .iter()
            .enumerate()
            .filter(|(i, _)| *i > 0 && expanded[i - 1] == "--node")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            node_flags,
            ["gpu001", "gpu999"],
            "file first, typed last (wins)"
        );
        assert!(expanded
            .windows(2)
            .any(|w| w[0] == "--push-interval" && w[1] == "10s"));
        assert!(expanded
            .windows(2)
            .any(|w| w[0] == "--otlp-interval" && w[1] == "10s"));
        use clap::Args;
        // As main.rs parses: a later option wins over the file's.
        let command = super::ExporterArgs::augment_args(clap::Command::new("exporter"))
            .no_binary_name(true)
            .args_override_self(true);
        command.try_get_matches_from(&expanded[2..]).unwrap();
    }

    #[test]
    fn a_bad_config_file_names_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exporter.toml");
        std::fs::write(&path, "node = \"n1\"\nsample_intervall = \"1s\"\n").unwrap();
        let err = format!("{:#}", super::ExporterFile::load(&path).unwrap_err());
        assert!(
            err.contains("exporter.toml:2:") && err.contains("sample_intervall"),
            "{err}"
        );
        std::fs::write(&path, "push_interval = \"10h\"\n").unwrap();
        let err = format!("{:#}", super::ExporterFile::load(&path).unwrap_err());
        assert!(err.contains("push_interval"), "{err}");
    }

    #[test]
    fn intervals_parse_with_units() {
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("3"), Ok(Duration::from_secs(3)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("1h").is_err());
    }
}
