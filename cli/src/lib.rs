//! The `gpuledger` binary's library side: it wires the crates together (the libraries own their
//! errors; `anyhow` lives only here and in tests). [`pipeline`] is the whole path from a
//! workload to invoices that `gpuledger demo` runs and the end-to-end tests call.

pub mod bench;
pub mod bench_schedule;
pub mod billing_glue;
pub mod defaults;
pub mod exporter_cmd;
pub mod invoice_cmd;
pub mod pipeline;
pub mod scheduler_cmd;
pub mod serve;
pub mod simulate;
pub mod svg;
pub mod table;

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
