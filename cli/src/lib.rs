//! The `gpuledger` binary's library side: it wires the crates together (the libraries own their
//! errors; `anyhow` lives only here and in tests). [`pipeline`] is the whole path from a
//! workload to invoices that `gpuledger demo` runs and the end-to-end tests call.

pub mod adopt_cmd;
pub mod bench;
pub mod bench_load;
pub mod bench_schedule;
pub mod billing_glue;
pub mod dashboards_cmd;
pub mod defaults;
pub mod exporter_cmd;
pub mod http_server;
pub mod invoice_cmd;
pub mod pipeline;
pub mod scheduler_cmd;
pub mod serve;
pub mod simulate;
pub mod slurm_cmd;
pub mod table;
pub mod token_cmd;

/// A bearer token kept in a file (one line; surrounding whitespace ignored).
pub fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        anyhow::bail!("{}: expected one token on one line", path.display());
    }
    Ok(token.to_owned())
}

/// What a client trusts of an `https://` gpuledger service, as an option of every command that
/// calls one.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientTlsArgs {
    /// PEM file of the CAs an `https://` aggregator or scheduler's certificate must chain to
    /// (a cluster's private CA); default the Mozilla roots.
    #[arg(long, env = "GPULEDGER_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl ClientTlsArgs {
    pub fn config(&self) -> anyhow::Result<ureq::tls::TlsConfig> {
        Ok(gpuledger_auth::tls::client_tls(self.ca_file.as_deref())?)
    }
}

/// Logs to stderr, filtered by `GPULEDGER_LOG` (default `warn`); both binaries call it.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
