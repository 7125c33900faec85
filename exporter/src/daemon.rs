//! The exporter daemon: wires a GPU source, the sampling and push loops of [`crate::agent`],
//! and `/metrics` over HTTP(S); on SIGTERM or Ctrl-C it spools what it collected, tries one last
//! push, and returns (anything unsent stays in the spool). [`ExporterOptions`] is the one
//! declaration of its options: the command line parses them, and a `--config` TOML file is
//! checked against the same declaration ([`expand_config_file`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gpuledger_model::time::{Clock, SystemClock};
use gpuledger_model::GpuModel;
use gpuledger_service::{announce, ClientTlsArgs, Exposure, HttpLimits, TlsArgs};

use crate::agent::{run_pusher, run_sampler, AgentConfig, Shared};
use crate::dcgm::DcgmExporterSource;
use crate::exposition::{render, Format, Snapshot};
use crate::nvml::NvmlSource;
use crate::otlp::{self, OtlpConfig};
use crate::spool::{Spool, SpoolError};
use crate::synthetic::SyntheticSource;
use crate::{GpuSource, SourceError};

/// Why the daemon cannot start or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Source(&'static str, #[source] SourceError),
    #[error("opening the spool {}: {source}", dir.display())]
    Spool { dir: PathBuf, source: SpoolError },
    #[error(transparent)]
    Service(#[from] gpuledger_service::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A configuration file or option that cannot work; the message names file, line and key.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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

/// Options of the exporter (`gpuledger exporter`, `gpuledger-exporter`). A TOML file given
/// with `--config` holds the same options ([`expand_config_file`]).
#[derive(clap::Args, Debug, Clone)]
pub struct ExporterOptions {
    /// A TOML file of these options (keys are the option names with `_`, e.g.
    /// `sample_interval = "1s"`); options given on the command line win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's name, as the aggregator knows it.
    #[arg(long, env = "GPULEDGER_NODE", value_parser = parse_node)]
    pub node: String,
    /// Source of GPU readings.
    #[arg(long, value_enum, default_value = "synthetic")]
    pub source: SourceKind,
    /// Synthetic source: number of GPUs.
    #[arg(long, default_value_t = 8)]
    pub gpus: u16,
    /// Synthetic source: GPU model (a100, h100-sxm, h100-pcie, h200, v100-16gb, v100-32gb, p100,
    /// t4, a10).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu_model: GpuModel,
    /// Synthetic source: seed of the readings.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// dcgm-exporter source: the page to read.
    #[arg(long, default_value = "http://127.0.0.1:9400/metrics", value_parser = parse_http_url)]
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
    #[arg(long, env = "GPULEDGER_AGGREGATOR_URL", value_parser = parse_http_url)]
    pub aggregator_url: Option<String>,
    /// A file holding this node's token for the aggregator (`gpuledger token add --role node
    /// --node NAME`), when the aggregator runs with --tokens.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    pub aggregator_token_file: Option<PathBuf>,
    /// Durable outbox of batches not yet acknowledged (default: `./gpuledger-spool/NODE`, so
    /// that exporters of several nodes on one host keep apart).
    #[arg(long)]
    pub spool_dir: Option<PathBuf>,
    /// Bound of the spool in bytes (at least 1 MiB); past it the oldest batches are dropped and
    /// counted.
    #[arg(long, default_value_t = 1 << 30, value_parser = clap::value_parser!(u64).range(MIN_SPOOL_BYTES..))]
    pub spool_max_bytes: u64,
    /// Job-mapping directory: a file per GPU index holding `job_id account [project]`, or
    /// dcgm-exporter's (a job id a line; each job's account from the aggregator's allocation
    /// feed).
    #[arg(long)]
    pub job_mapping_dir: Option<PathBuf>,
    /// `gpuledger scheduler`'s URL: label GPUs from its allocation feed (wins over
    /// --job-mapping-dir).
    #[arg(long, value_parser = parse_http_url)]
    pub scheduler_url: Option<String>,
    /// Address of /metrics (`127.0.0.1:0` picks a free port; the address is printed). Default:
    /// `0.0.0.0:9401`, one exporter per node; the synthetic source, which runs several to a
    /// host, takes 9400 plus the number its node name ends with (gpu003: 9403).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Token file (`gpuledger token add`): /metrics then wants an operator's bearer token
    /// (Prometheus's `authorization` in its scrape config). Without it /metrics is open.
    #[arg(long, env = "GPULEDGER_TOKENS")]
    pub tokens: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub client_tls: ClientTlsArgs,
    /// Also export the GPU series over OTLP/HTTP (JSON) to this receiver, e.g.
    /// `http://collector:4318` (`/v1/metrics` is appended).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_parser = parse_http_url)]
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

/// Expands `--config FILE` in the exporter's arguments (`args` without the binary name and
/// subcommand) into the file's options, placed before the typed ones so that those win when
/// parsed. Each key of the file must be an option of `command` (its long name with `_` for
/// `-`), and each value must parse as that option's value; errors name the file, line and key.
pub fn expand_config_file(args: Vec<String>, command: &clap::Command) -> Result<Vec<String>> {
    let mut file = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--config" {
            file = args.get(i + 1).cloned();
        } else if let Some(v) = a.strip_prefix("--config=") {
            file = Some(v.to_owned());
        }
    }
    let Some(file) = file else {
        return Ok(args);
    };
    let mut out = config_file_args(Path::new(&file), command)?;
    out.extend(args);
    Ok(out)
}

/// A TOML file of options as command-line arguments.
pub fn config_file_args(path: &Path, command: &clap::Command) -> Result<Vec<String>> {
    let origin = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {origin}"), e))?;
    let table: toml::Table = gpuledger_model::config::parse_toml(&text, &origin)
        .map_err(|e| Error::Usage(e.to_string()))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let at = format!("{origin}:{}", key_line(&text, key));
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| Error::Usage(format!("{at}: unknown key `{key}`")))?;
        let values = match value {
            toml::Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        for value in values {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                    value.to_string()
                }
                _ => {
                    return Err(Error::Usage(format!(
                        "{at}: `{key}`: expected a string or a number"
                    )))
                }
            };
            check_value(arg, &text)
                .map_err(|e| Error::Usage(format!("{at}: `{key}`: {}", clap_message(&e))))?;
            out.push(format!("--{long}"));
            out.push(text);
        }
    }
    Ok(out)
}

/// Parses `value` as the option `arg` would be parsed on the command line (alone: its
/// relations to other options are checked when the whole command line is).
fn check_value(arg: &clap::Arg, value: &str) -> Result<(), clap::Error> {
    let id = arg.get_id().clone();
    let alone = clap::Arg::new(id.clone())
        .long(id.clone())
        .action(clap::ArgAction::Set)
        .value_parser(arg.get_value_parser().clone());
    clap::Command::new("config")
        .no_binary_name(true)
        .arg(alone)
        .try_get_matches_from([format!("--{id}"), value.to_owned()])
        .map(drop)
}

/// The line a top-level key is set on (1 when it cannot be found).
fn key_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(1, |i| i + 1)
}

/// A value parser's complaint without clap's `error:` prefix and usage lines.
fn clap_message(error: &clap::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

/// `250ms`, `1s`, `2m`.
/// The smallest spool: a few batches of a large node.
const MIN_SPOOL_BYTES: u64 = 1 << 20;

/// A node name as the cluster config's pools make them (it also names the default spool
/// directory, so `../x` would put the spool elsewhere).
fn parse_node(text: &str) -> Result<String, String> {
    gpuledger_model::NodeId::new(text)
        .map(|n| n.to_string())
        .map_err(|e| e.to_string())
}

/// An `http://` or `https://` URL with a host.
fn parse_http_url(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .ok_or_else(|| format!("`{text}` is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("`{text}` names no host"));
    }
    Ok(text.to_owned())
}

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

fn open_source(args: &ExporterOptions) -> Result<Box<dyn GpuSource>> {
    Ok(match args.source {
        SourceKind::Synthetic => Box::new(SyntheticSource::new(
            args.seed,
            &args.node,
            args.gpus,
            args.gpu_model,
        )),
        SourceKind::Nvml => {
            Box::new(NvmlSource::open().map_err(|e| Error::Source("opening the NVML source", e))?)
        }
        SourceKind::DcgmExporter => Box::new(
            DcgmExporterSource::open_with(&args.dcgm_url, args.dcgm_project_label.as_deref())
                .map_err(|e| Error::Source("opening the dcgm-exporter source", e))?,
        ),
    })
}

/// The port of /metrics when `--listen` is not given: 9401, or for the synthetic source 9400
/// plus the number the node's name ends with (1 to 599; another name hashes into that range).
pub fn default_port(node: &str, source: SourceKind) -> u16 {
    if source != SourceKind::Synthetic {
        return 9401;
    }
    let digits: String = node
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let n = match digits.parse::<u64>() {
        Ok(n) if (1..=599).contains(&n) => n,
        // FNV-1a: stable across runs and builds.
        _ => {
            let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            1 + h % 599
        }
    };
    9400 + n as u16
}

/// The spool directory when `--spool-dir` is not given: one per node.
pub fn default_spool_dir(node: &str) -> PathBuf {
    PathBuf::from("./gpuledger-spool").join(node)
}

/// Runs the exporter until SIGTERM or Ctrl-C.
pub fn run(args: ExporterOptions) -> Result<()> {
    if args.sample_interval.subsec_nanos() != 0 {
        // Samples carry their interval in whole seconds: that is what is billed.
        return Err(Error::Usage(
            "--sample-interval must be a whole number of seconds (1s, 2s, ...)".into(),
        ));
    }
    if args.push_interval < args.sample_interval {
        return Err(Error::Usage(
            "--push-interval must not be shorter than --sample-interval".into(),
        ));
    }
    // The exporter's page is open by default, as dcgm-exporter's is (GPU readings and job ids,
    // no usage totals or money); --tokens closes it.
    if let Err(e) = gpuledger_model::NodeId::new(&args.node) {
        return Err(Error::Usage(format!("--node: {e}")));
    }
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], default_port(&args.node, args.source))));
    let spool_dir = args
        .spool_dir
        .clone()
        .unwrap_or_else(|| default_spool_dir(&args.node));
    let exposure = Exposure {
        listen,
        allow_unauthenticated: true,
    };
    let guard = gpuledger_service::guard("exporter", args.tokens.as_deref(), &[], exposure)?;
    let tls = args.tls.acceptor()?;
    let source = open_source(&args)?;
    let spool = Spool::open(&spool_dir, args.spool_max_bytes).map_err(|e| Error::Spool {
        dir: spool_dir.clone(),
        source: e,
    })?;
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
            .map(gpuledger_service::read_token_file)
            .transpose()?,
        max_backoff: Duration::from_secs(30),
        tls: args.client_tls.config()?,
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let sampler = {
        let (shared, config, clock) = (Arc::clone(&shared), config.clone(), Arc::clone(&clock));
        std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || run_sampler(source, &config, clock.as_ref(), &shared))
            .map_err(|e| Error::io("starting the sampler", e))?
    };
    let pusher = {
        let (shared, config, clock) = (Arc::clone(&shared), config.clone(), Arc::clone(&clock));
        std::thread::Builder::new()
            .name("pusher".into())
            .spawn(move || run_pusher(&config, clock.as_ref(), &shared))
            .map_err(|e| Error::io("starting the pusher", e))?
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
                    .spawn(move || otlp::run_exporter(&otlp, clock.as_ref(), &shared))
                    .map_err(|e| Error::io("starting the OTLP export", e))?,
            )
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let metrics = MetricsState {
        shared: Arc::clone(&shared),
        guard: Arc::new(guard),
    };
    runtime.block_on(serve_metrics(listen, metrics, tls))?;
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
) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    let shutdown = gpuledger_service::shutdown_signal()?;
    let listener = gpuledger_service::bind(listen).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("the listener's address", e))?;
    announce(&format!(
        "gpuledger exporter listening on {}://{addr}",
        gpuledger_service::scheme(tls.as_ref()),
    ));
    // Only Prometheus scrapes here: a few connections are plenty.
    let limits = HttpLimits {
        max_connections: 64,
        ..Default::default()
    };
    gpuledger_service::serve(listener, app, limits, tls, shutdown)
        .await
        .map_err(|e| Error::io(format!("serving /metrics on {addr}"), e))?;
    Ok(())
}

/// Readiness, open to all: 200 once its spool is open and a collection has read the GPUs and
/// the source is up; 503 with the source's error otherwise.
async fn readyz(State(state): State<MetricsState>) -> Response {
    let snapshot = state.shared.snapshot();
    let health = &snapshot.health;
    if health.collections_total == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: no collection yet\n".to_owned(),
        )
            .into_response();
    }
    if !health.source_up {
        let why = health
            .source_error
            .as_deref()
            .unwrap_or("the source is down");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response();
    }
    "ready\n".into_response()
}

async fn metrics(State(state): State<MetricsState>, headers: HeaderMap) -> Response {
    let checked = gpuledger_service::bearer_token(&headers)
        .and_then(|token| state.guard.check(token, gpuledger_auth::Action::Metrics));
    if let Err(denied) = checked {
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
    use super::*;

    #[test]
    fn synthetic_exporters_of_several_nodes_get_ports_and_spools_of_their_own() {
        assert_eq!(default_port("gpu001", SourceKind::Synthetic), 9401);
        assert_eq!(default_port("gpu003", SourceKind::Synthetic), 9403);
        assert_eq!(
            default_port("gpu003", SourceKind::Nvml),
            9401,
            "one per node"
        );
        let hashed = default_port("login-node", SourceKind::Synthetic);
        assert!((9401..=9999).contains(&hashed));
        assert_eq!(hashed, default_port("login-node", SourceKind::Synthetic));
        assert_ne!(default_spool_dir("gpu001"), default_spool_dir("gpu002"));
    }
    use clap::Args;

    fn command() -> clap::Command {
        ExporterOptions::augment_args(clap::Command::new("exporter"))
            .no_binary_name(true)
            .args_override_self(true)
    }

    #[test]
    fn the_example_config_file_expands_and_flags_win() {
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/exporter.toml");
        let args: Vec<String> = ["--config", example, "--node", "gpu999"]
            .map(String::from)
            .into();
        let expanded = expand_config_file(args, &command()).unwrap();
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
        let matches = command().try_get_matches_from(&expanded).unwrap();
        let options =
            <ExporterOptions as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(options.node, "gpu999");
        assert_eq!(options.gpus, 8);
        assert_eq!(options.spool_max_bytes, 1 << 30);
    }

    #[test]
    fn a_bad_config_file_names_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exporter.toml");
        let err_of = |text: &str| {
            std::fs::write(&path, text).unwrap();
            config_file_args(&path, &command()).unwrap_err().to_string()
        };
        let err = err_of("node = \"n1\"\nsample_intervall = \"1s\"\n");
        assert!(
            err.contains("exporter.toml:2:") && err.contains("sample_intervall"),
            "{err}"
        );
        let err = err_of("node = \"n1\"\n\npush_interval = \"10h\"\n");
        assert!(err.contains("exporter.toml:3: `push_interval`"), "{err}");
        let err = err_of("gpus = 70000\n");
        assert!(err.contains("exporter.toml:1: `gpus`"), "{err}");
        let err = err_of("source = \"cuda\"\n");
        assert!(err.contains("`source`") && err.contains("cuda"), "{err}");
        let err = err_of("node = [\n");
        assert!(err.contains("exporter.toml:"), "{err}");
        // A node that would put the default spool elsewhere (`./gpuledger-spool/../x`), a URL
        // that is no HTTP, a spool too small for one batch.
        for (text, says) in [
            (
                "node = \"../x\"\n",
                "exporter.toml:1: `node`: invalid value '../x'",
            ),
            (
                "node = \"..\"\n",
                "exporter.toml:1: `node`: invalid value '..'",
            ),
            (
                "aggregator_url = \"ftp://agg\"\n",
                "`ftp://agg` is not an http:// or https:// URL",
            ),
            ("scheduler_url = \"http://\"\n", "`http://` names no host"),
            (
                "spool_max_bytes = 0\n",
                "exporter.toml:1: `spool_max_bytes`",
            ),
        ] {
            let file = err_of(text);
            let matched = config_file_args(&path, &command())
                .map(|args| command().try_get_matches_from(args).map(drop));
            let err = match matched {
                Err(e) => e.to_string(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => String::new(),
            };
            assert!(
                file.contains(says) || err.contains(says),
                "{text}: {file} / {err}"
            );
        }
        let headers = {
            std::fs::write(&path, "otlp_header = [\"a=1\", \"b=2\"]\n").unwrap();
            config_file_args(&path, &command()).unwrap()
        };
        assert_eq!(headers, ["--otlp-header", "a=1", "--otlp-header", "b=2"]);
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
