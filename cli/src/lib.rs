//! The `gpuledger` binary's commands: each parses its arguments, calls the libraries and prints
//! what they return (the libraries own their errors; `anyhow` lives only here and in tests).

pub mod adopt_cmd;
pub mod dashboards_cmd;
pub mod invoice_cmd;
pub mod man_cmd;
pub mod scheduler_cmd;
pub mod slurm_cmd;
pub mod table;
pub mod token_cmd;
