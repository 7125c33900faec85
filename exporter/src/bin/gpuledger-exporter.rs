//! `gpuledger-exporter`: the node agent alone, for GPU nodes. The same daemon as
//! `gpuledger exporter`, in a package that links nothing of the aggregator's query engine, so
//! its binary and resident memory stay small (docs/benchmarks.md).

use clap::{Args, Parser};
use gpuledger_exporter::daemon::{self, ExporterOptions};

#[derive(Parser, Debug)]
#[command(
    name = "gpuledger-exporter",
    version,
    args_override_self = true,
    about = "gpuledger's per-node exporter: GPU telemetry with job and tenant labels"
)]
struct Cli {
    /// How log lines are written to standard error: text (coloured only on a terminal) or json.
    #[arg(long, value_enum, default_value = "text", env = "GPULEDGER_LOG_FORMAT")]
    log_format: gpuledger_service::LogFormat,
    #[command(flatten)]
    options: ExporterOptions,
}

/// Exit status 1 with one line, `error: ...` and its causes, never a backtrace; clap exits 2
/// for a bad command line.
fn main() -> std::process::ExitCode {
    gpuledger_service::exit_status(run())
}

fn run() -> anyhow::Result<()> {
    let options = ExporterOptions::augment_args(clap::Command::new("gpuledger-exporter"));
    let typed: Vec<String> = std::env::args().skip(1).collect();
    let args = daemon::expand_config_file(typed, &options)?;
    let cli = Cli::parse_from(std::iter::once("gpuledger-exporter".to_owned()).chain(args));
    gpuledger_service::init_logging(cli.log_format);
    daemon::run(cli.options)?;
    Ok(())
}
