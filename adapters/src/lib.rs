//! gpuledger on the clusters people already run. Most GPU clusters already have a scheduler
//! (Slurm, or Kubernetes with Kueue); this crate translates between it and gpuledger so its
//! telemetry, indicators and invoices work on day one, without replacing what schedules jobs:
//!
//! - [`slurm::assoc`]: `sacctmgr dump` (Slurm's associations: accounts, sub-accounts, users
//!   and their limits) to gpuledger's tenant tree and quotas, saying what it could not map;
//! - [`slurm::jobs`]: Slurm's job records (`sacct --parsable2`, the `jobcomp/filetxt` log,
//!   `squeue` and `scontrol show job -d` while a job is known) to gpuledger job events, each
//!   event once however often a job is read;
//! - [`kubernetes`]: the tenant tree to Namespaces, ResourceQuotas and Kueue queues.
//!
//! Pure: text in, values out. The binary runs the commands, reads the files and posts events.

pub mod kubernetes;
pub mod slurm;

/// A problem with one line of an input, or a field of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}:{line}: {message}")]
pub struct LineError {
    pub origin: String,
    pub line: usize,
    pub message: String,
}

pub type Result<T, E = LineError> = std::result::Result<T, E>;
