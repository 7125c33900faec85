//! The charge engine of gpuledger: pure, decimal, no floats for money. It owns the price book
//! (versions, time-of-use bands, storage price, MFU weighting, reservation and idle policies,
//! each account's billing model), turns usage (integer GPU-seconds per account, project, job,
//! GPU model and hour; byte-seconds of storage; reservations) into priced invoice lines,
//! revises invoices when late data arrives, and renders them (CSV, JSON, HTML, FOCUS).
//! Reading usage from storage is the caller's business; no clock is read here.
//!
//! - [`pricebook`]: the versioned price book file and its validation;
//! - [`engine`]: lines, rounding once per line, largest-remainder splits, revisions;
//! - [`render`]: the invoice files and the model comparison.

pub mod engine;
pub mod pricebook;
pub mod render;

use gpuledger_model::GpuModel;

pub use engine::{
    charge, revise, split_largest_remainder, BillingInput, ChargeType, IdleHour, Invoice,
    InvoiceLine, JobPart, LineKey, Period, Reservation, StorageScan, UsageHour,
};
pub use pricebook::{BillingModel, PriceBook};

/// Billing errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("price book `{version}` has no GPU-hour price for `{model}`")]
    NoPrice { version: String, model: GpuModel },
    #[error("price book `{version}` has no storage price, but an account's model bills storage")]
    NoStoragePrice { version: String },
    #[error("no price-book version is in force at {at}; the first starts {first}")]
    NoVersion {
        at: String,
        first: chrono::NaiveDate,
    },
    #[error("`{0}` is not a month; write YYYY-MM")]
    BadPeriod(String),
    #[error("an amount is too large for exact decimal arithmetic")]
    Overflow,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
