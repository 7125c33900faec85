//! The charge engine of gpuledger: pure, decimal, no floats for money. It owns the price book
//! (versions, time-of-use bands, storage price, MFU weighting, reservation and idle policies,
//! each account's billing model), turns usage (integer GPU-seconds per account, project, job,
//! GPU model and hour; byte-seconds of storage; reservations) into priced invoice lines,
//! revises invoices when late data arrives, and renders them (CSV, JSON, HTML, FOCUS). No
//! clock is read here: times come in as arguments.
//!
//! - [`pricebook`]: the versioned price book file and its validation;
//! - [`engine`]: lines, rounding once per line, largest-remainder splits, revisions;
//! - [`render`]: the invoice files and the model comparison;
//! - [`source`]: the [`source::UsageSource`] seam a store implements (the aggregator's tables
//!   do), and the policy that turns its rows into a [`BillingInput`] (which MFU is billed);
//! - [`rows`]: what a store reports and what billing makes of it before pricing;
//! - [`allocation`]: the runs job events describe, and usage by allocation;
//! - [`reconcile`]: telemetry against allocations: what a job is billed is what it measured on
//!   GPUs it held; the rest is flagged, and allocations without telemetry are coverage gaps;
//! - [`storage`]: tenant directories scanned and the scans recorded and read back;
//! - [`invoices`]: each account's revisions on disk, the month's exports, the reservations
//!   file. These two and nothing else touch files.

pub mod allocation;
pub mod engine;
pub mod invoices;
pub mod pricebook;
pub mod reconcile;
pub mod render;
pub mod rows;
pub mod source;
pub mod storage;

use gpuledger_model::GpuModel;

pub use engine::{
    charge, revise, split_largest_remainder, BillingInput, ChargeType, FlagNote, GapNote, IdleHour,
    Invoice, InvoiceLine, InvoiceNotes, JobPart, LineKey, Period, Reservation, StorageScan,
    UsageHour,
};
pub use pricebook::{BillingModel, PriceBook};

/// Billing errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("price book `{version}` has no GPU-hour price for `{model}`")]
    NoPrice { version: String, model: GpuModel },
    #[error("price book `{version}` has no storage price, but an account's model bills storage")]
    NoStoragePrice { version: String },
    #[error("`{0}` is not a month; write YYYY-MM")]
    BadPeriod(String),
    #[error("an amount is too large for exact decimal arithmetic")]
    Overflow,
    /// A row or file billing reads that does not say what it must; the message names it.
    #[error("{0}")]
    Input(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

impl Error {
    /// An I/O failure on `path`, for `map_err`.
    pub fn io(path: impl AsRef<std::path::Path>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().display().to_string();
        move |e| Error::Io {
            path,
            message: e.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
