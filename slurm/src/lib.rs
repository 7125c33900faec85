//! gpuledger against a Slurm cluster, the side that runs its commands and talks to the
//! aggregator (the parsing is `gpuledger-adapters`', pure):
//!
//! - [`follow`]: `gpuledger slurm follow`, polling `squeue`/`scontrol`, the jobcomp log or
//!   `sacct` and posting each job's lifecycle to the aggregator as job events, exactly once
//!   across crashes (a state file with a numbered outbox);
//! - [`steer`]: `gpuledger slurm steer`, setting pending jobs' fair-share factors from
//!   gpuledger's measured usage and holding jobs over GPU-hour quotas, with the policy code of
//!   gpuledger's own scheduler.

pub mod follow;
pub mod steer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A Slurm command failed or printed what cannot be read.
    #[error("{0}")]
    Slurm(String),
    #[error(transparent)]
    Reading(#[from] gpuledger_adapters::LineError),
    #[error("the state file {0}")]
    State(String),
    #[error("{0}")]
    Aggregator(String),
    #[error(transparent)]
    Service(#[from] gpuledger_service::Error),
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
