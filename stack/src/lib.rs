//! `gpuledger up`: a whole live stack on one host, under one state directory, for an
//! operator's first hour: the aggregator, the scheduler, N synthetic exporters (each its own
//! node, port and spool), a small workload of jobs, and Prometheus with the shipped rules when
//! it is installed. Tokens are on: the first start writes the token file, gives each service
//! its own token in a file of its own, and prints the operator's token once. Every URL is
//! printed; Ctrl-C (or SIGTERM) stops everything; starting again continues with the same data
//! and tokens.
//!
//! - [`layout`]: the state directory, the stack's cluster config and its tokens;
//! - [`jobs_dir`]: where its jobs' directories go when their users cannot reach it;
//! - [`processes`]: starting a service, learning its address, stopping them all;
//! - [`prometheus`]: the scrape configuration and Prometheus itself;
//! - [`workload`]: jobs submitted while the stack runs.

pub mod jobs_dir;
pub mod layout;
pub mod processes;
pub mod prometheus;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

use self::layout::Layout;
use self::processes::{Service, Services};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokens(#[from] gpuledger_auth::Error),
    #[error(transparent)]
    Service(#[from] gpuledger_service::Error),
    #[error("{0}")]
    Config(String),
    /// A service did not come up, or went down.
    #[error("{0}")]
    Down(String),
    #[error("{0}")]
    Usage(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O failure while doing `what`, for `map_err`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// Options of `gpuledger up`.
#[derive(clap::Args, Debug, Clone)]
pub struct UpOptions {
    /// Where the stack keeps everything (data, spools, tokens, logs); starting again with the
    /// same directory continues with the same data.
    #[arg(long, default_value = "./gpuledger-up")]
    pub state_dir: PathBuf,
    /// Synthetic exporters, one per node (the first nodes of the cluster config).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub exporters: u16,
    /// The cluster config, read at the first start (kept in the state directory). Default: the
    /// seed cluster's partitions, prices and ten accounts on as many nodes as exporters.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The first port: the aggregator on it, the exporters on the next ones, the scheduler 100
    /// above, Prometheus 200 above. 0: any free ports.
    #[arg(long, default_value_t = 9400)]
    pub port_base: u16,
    /// Start no Prometheus even where one is installed.
    #[arg(long)]
    pub no_prometheus: bool,
    /// Submit no jobs.
    #[arg(long)]
    pub no_workload: bool,
    /// Where the jobs' directories go (default: under the state directory, or, when the stack
    /// runs as root and its jobs' users cannot pass a directory above it, as under `/root`, a
    /// directory of its own under `/var/tmp`).
    #[arg(long)]
    pub jobs_dir: Option<PathBuf>,
}

/// The ports of the stack's services (0: the service picks one and says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub aggregator: u16,
    pub scheduler: u16,
    pub prometheus: u16,
    first_exporter: u16,
}

impl Ports {
    pub fn from_base(base: u16, exporters: u16) -> Result<Ports> {
        if base == 0 {
            return Ok(Ports {
                aggregator: 0,
                scheduler: 0,
                prometheus: 0,
                first_exporter: 0,
            });
        }
        let past = |n: u16| {
            base.checked_add(n)
                .ok_or_else(|| Error::Usage(format!("--port-base {base}: ports past 65535")))
        };
        past(200.max(exporters))?;
        Ok(Ports {
            aggregator: base,
            scheduler: past(100)?,
            prometheus: past(200)?,
            first_exporter: past(1)?,
        })
    }

    /// The port of the `i`-th exporter (from 0).
    pub fn exporter(&self, i: u16) -> u16 {
        if self.first_exporter == 0 {
            0
        } else {
            self.first_exporter + i
        }
    }
}

/// What the binary gives the stack: itself (every service is a subcommand of it) and the
/// seed cluster it embeds.
#[derive(Clone, Debug)]
pub struct Binary<'a> {
    pub exe: PathBuf,
    pub seed_cluster_toml: &'a str,
}

fn listen(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// Starts the stack and runs it until SIGINT or SIGTERM (or until one of its services stops).
pub fn up(options: &UpOptions, binary: &Binary) -> Result<()> {
    let ports = Ports::from_base(options.port_base, options.exporters)?;
    let layout = Layout::prepare(options, binary.seed_cluster_toml)?;
    let stop = gpuledger_service::stop_flag()?;
    let mut services = Services::new(layout.logs());
    let result = start_and_watch(options, binary, &layout, ports, &mut services, &stop);
    services.stop_all();
    if result.is_ok() {
        gpuledger_service::announce("gpuledger up: stopped; starting it again continues");
    }
    result
}

fn start_and_watch(
    options: &UpOptions,
    binary: &Binary,
    layout: &Layout,
    ports: Ports,
    services: &mut Services,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    let exe = &binary.exe;
    let config = processes::arg(&layout.config_path());
    let tokens = processes::arg(&layout.tokens_path());
    let data = processes::arg(&layout.data());
    let jobs_dir = layout.jobs_dir().map(|j| processes::arg(&j.path));
    let aggregator = services.start(Service::new("aggregator", exe).args([
        "aggregator",
        "--listen",
        &listen(ports.aggregator),
        "--data-dir",
        &data,
        "--config",
        &config,
        "--tokens",
        &tokens,
        "--flush-interval",
        "10s",
    ]))?;
    let scheduler = services.start(
        Service::new("scheduler", exe).args(
            [
                "scheduler",
                "serve",
                "--listen",
                &listen(ports.scheduler),
                "--data-dir",
                &data,
                "--config",
                &config,
                "--tokens",
                &tokens,
                "--aggregator",
                &aggregator,
                "--aggregator-token-file",
                &processes::arg(&layout.secret("scheduler")),
            ]
            .into_iter()
            .chain(jobs_dir.iter().flat_map(|dir| ["--jobs-dir", dir.as_str()])),
        ),
    )?;
    let mut exporters = Vec::new();
    for (i, node) in layout.nodes().iter().enumerate() {
        let url = services.start(Service::new(&format!("exporter {}", node.name), exe).args([
            "exporter",
            "--node",
            &node.name,
            "--gpus",
            &node.gpus.to_string(),
            "--gpu-model",
            node.model.key(),
            "--seed",
            &(i + 1).to_string(),
            "--listen",
            &listen(ports.exporter(i as u16)),
            "--spool-dir",
            &processes::arg(&layout.spool(&node.name)),
            "--aggregator-url",
            &aggregator,
            "--aggregator-token-file",
            &processes::arg(&layout.secret(&format!("node-{}", node.name))),
            "--scheduler-url",
            &scheduler,
            "--tokens",
            &tokens,
        ]))?;
        exporters.push((node.name.clone(), url));
    }
    let prometheus = if options.no_prometheus {
        None
    } else {
        prometheus::start(
            services,
            layout,
            ports.prometheus,
            &aggregator,
            &scheduler,
            &exporters,
        )?
    };
    let workload = (!options.no_workload)
        .then(|| workload::Workload::start(layout, &scheduler))
        .transpose()?;
    print_urls(
        layout,
        &aggregator,
        &scheduler,
        &exporters,
        prometheus.as_deref(),
    );
    let outcome = services.watch(stop);
    if let Some(w) = workload {
        w.stop();
    }
    outcome
}

fn print_urls(
    layout: &Layout,
    aggregator: &str,
    scheduler: &str,
    exporters: &[(String, String)],
    prometheus: Option<&str>,
) {
    let mut lines = vec![format!(
        "gpuledger up: {} in {}",
        if layout.first_start() {
            "started"
        } else {
            "started again, with the same data and tokens,"
        },
        layout.root().display()
    )];
    if let Some(token) = layout.operator_token() {
        lines.push(format!(
            "  operator token (shown once; it signs in to the status page and the scheduler CLI): {token}"
        ));
    }
    lines.push(format!("  status page        {aggregator}/"));
    lines.push(format!("  aggregator         {aggregator}/metrics"));
    lines.push(format!("  scheduler          {scheduler}/metrics"));
    for (node, url) in exporters {
        lines.push(format!("  exporter {node:<9} {url}/metrics"));
    }
    match prometheus {
        Some(url) => lines.push(format!("  Prometheus         {url}/targets")),
        None => lines.push(
            "  Prometheus         not started (not installed, or --no-prometheus)".to_owned(),
        ),
    }
    lines.push(format!(
        "  scheduler CLI      GPULEDGER_TOKEN=<token> gpuledger scheduler queue --url {scheduler}"
    ));
    match layout.jobs_dir() {
        Some(jobs_dir::JobsDir {
            path,
            closed: Some(closed),
        }) => lines.push(format!(
            "  jobs' directories  {} (the accounts' users cannot pass {})",
            path.display(),
            closed.display()
        )),
        Some(jobs) => lines.push(format!("  jobs' directories  {}", jobs.path.display())),
        None => {}
    }
    lines.push(format!(
        "  logs in {}; Ctrl-C stops everything",
        layout.logs().display()
    ));
    gpuledger_service::announce(&lines.join("\n"));
}

/// How long a service may take to say where it listens.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
