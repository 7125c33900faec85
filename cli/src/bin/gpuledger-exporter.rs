//! `gpuledger-exporter`: the exporter alone, for GPU nodes. The same code as
//! `gpuledger exporter`, in a binary that links nothing of the aggregator's query engine, so
//! its resident memory stays small (docs/benchmarks.md).

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "gpuledger-exporter",
    version,
    args_override_self = true,
    about = "gpuledger's per-node exporter: GPU telemetry with job and tenant labels"
)]
struct Cli {
    #[command(flatten)]
    args: gpuledger::exporter_cmd::ExporterArgs,
}

fn main() -> anyhow::Result<()> {
    gpuledger::init_logging();
    // `--config FILE` expands the same way as under `gpuledger exporter`.
    let mut argv: Vec<String> = std::env::args().collect();
    argv.insert(1, "exporter".into());
    let mut expanded = gpuledger::exporter_cmd::expand_config_file(argv)?;
    expanded.remove(1);
    gpuledger::exporter_cmd::run(Cli::parse_from(expanded).args)
}
