//! The `gpuledger` binary's library side: it wires the crates together (the libraries own their
//! errors; `anyhow` lives only here and in tests). [`pipeline`] is the whole path from a
//! workload to invoices that `gpuledger demo` runs and the end-to-end tests call.

pub mod bench;
pub mod billing_glue;
pub mod defaults;
pub mod exporter_cmd;
pub mod pipeline;
pub mod serve;
pub mod simulate;
pub mod table;
