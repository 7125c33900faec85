//! What every gpuledger HTTP service (the aggregator, the scheduler, the exporter's `/metrics`)
//! runs on, so that each has the same limits, the same TLS and the same door:
//!
//! - [`accept`]: the accept loop, with connection limits in total and per client address
//!   (`connections`: idle connections give way), header, request and write-stall time-outs,
//!   over plain TCP or TLS;
//! - [`budget`]: one budget of buffered request bytes, taken before a body is read;
//! - [`tls`]: the listener's certificate and what a client trusts, as command options;
//! - [`door`]: who gets in, i.e. protected mode (no tokens only on loopback), the bearer token of a
//!   request, the token file a client reads;
//! - [`query`]: query strings read into a route's parameters, a bad one named by field;
//! - `unread`: an answer given before the request's body was read says `connection: close`
//!   (the service closes that connection; a client's pool must not reuse it);
//! - [`signals`]: SIGTERM and SIGINT as a future or a flag;
//! - [`announce`]: the line on stdout that says a service is listening (scripts and tests
//!   read the port from it).
//!
//! The services own their routes and policies; this crate owns none.

pub mod accept;
pub mod budget;
mod connections;
pub mod door;
pub mod query;
pub mod signals;
pub mod tls;
mod unread;

pub use accept::{serve, HttpLimits};
pub use budget::{hold_body_budget, BodyBudget};
pub use door::{bearer_token, denied_message, guard, read_token_file, AccessArgs, Exposure};
pub use query::{parse_query, BadQuery};
pub use signals::{shutdown_signal, stop_flag};
pub use tls::{scheme, ClientTlsArgs, TlsArgs};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Auth(#[from] gpuledger_auth::Error),
    #[error(transparent)]
    Tls(#[from] gpuledger_auth::tls::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A setting that cannot work, with what to do instead.
    #[error("{0}")]
    Usage(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// A line on stdout for whoever started the service; a closed stdout is not an error for a
/// daemon (a supervisor may have stopped reading), so failures are ignored.
pub fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// A binary's exit: status 1 with one line on stderr, `error: ` and the error in its alternate
/// form (anyhow's cause chain joined by `: `), never a backtrace; success otherwise.
pub fn exit_status<E: std::fmt::Display>(
    result: std::result::Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How log lines are written (`--log-format`, `GPULEDGER_LOG_FORMAT`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event, coloured only when standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`, `span`), for a log
    /// shipper.
    Json,
}

/// Logs to stderr as `format` says, filtered by `GPULEDGER_LOG` (default `warn`); every binary
/// calls it.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
            .unwrap_or_else(|_| "warn".into())
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Binds `addr`, naming it when that fails.
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("listening on {addr}"), e))
}
