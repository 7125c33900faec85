//! Simulation and what it reports, apart from the services:
//!
//! - [`demo`]: the demo month end to end, i.e. a workload through the scheduler in virtual time,
//!   every GPU's telemetry synthesised from what was placed on it and pushed through the
//!   aggregator's ingest path into Parquet, billed from the stored rollups; a trace replay's
//!   month stored and billed the same way;
//! - [`report`]: a trace replay's report (queueing, completion, utilization, shares), its
//!   `jobs.csv` and its SVG plots;
//! - [`fairness`]: each account's fair share week by week (weighted max-min among accounts
//!   with demand) against what it received, and what it could have held without preemption;
//! - [`idle`]: where the idle GPUs sit while jobs wait, on nodes the smallest waiting job
//!   fits or on nodes too full for every waiting job;
//! - [`backlog`]: each job's own backlog, i.e. how long its account's fair share took to
//!   deliver the work the account submitted before it, to tell a wait its account's demand
//!   forced from one the policy caused, and the shortest waits were other tenants to give up
//!   part of their shares;
//! - [`replay`]: what a trace replay runs, from the trace and the files given with it;
//! - [`variants`]: variants of a trace and the cluster size for an offered load, to check a
//!   scheduling change on more than the trace it was tuned on;
//! - [`seed`]: the seed scenario embedded in the binary.
//!
//! The end-to-end tests drive [`demo::run`] as `gpuledger demo` does.

pub mod backlog;
pub mod demo;
pub mod fairness;
pub mod idle;
pub mod replay;
pub mod report;
pub mod seed;
#[cfg(test)]
mod test_records;
pub mod variants;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Aggregator(#[from] gpuledger_aggregator::Error),
    #[error(transparent)]
    Billing(#[from] gpuledger_billing::Error),
    #[error(transparent)]
    Config(#[from] gpuledger_model::ConfigError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Trace(#[from] gpuledger_scheduler::trace::TraceError),
    /// What was being done when `cause` happened.
    #[error("{what}: {cause}")]
    Context { what: String, cause: Box<Error> },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O failure while doing `what`, for `map_err`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    /// This error, said to have happened while doing `what`.
    pub fn context(self, what: impl Into<String>) -> Error {
        Error::Context {
            what: what.into(),
            cause: Box::new(self),
        }
    }
}
