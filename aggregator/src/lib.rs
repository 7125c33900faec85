//! The aggregator: the central store and calculator of gpuledger. What it stores is what
//! tenants are billed for and what fair share rests on, so a batch is validated whole and
//! accepted or refused whole, de-duplicated on (node, sequence), and written to Parquet in the
//! hive layout of DESIGN.md, with exact hourly rollups beside the raw samples. Indicators are
//! DataFusion SQL over those files ([`query`]).
//!
//! - [`validate`]: per-row checks of a sample batch, naming row and field; [`clock_skew`]: a
//!   node's clock offset, corrected or refused;
//! - [`ingest`]: the one ingest path (HTTP and the demo alike): validate, de-duplicate, store;
//!   [`coverage`]: which stretches of time each GPU has stored, so a re-sent interval is
//!   stored once;
//! - [`wal`]: the write-ahead log that makes an acknowledged batch durable;
//! - [`objects`]: where the files live, a local directory or an object store (`file://`,
//!   `s3://`), behind one set of calls;
//! - [`store`]: Parquet writers (temporary name, then rename) for samples, rollups, job events;
//! - [`rollup`]: per job x GPU x hour sums, exact in GPU-seconds;
//! - [`query`]: DataFusion tables and the indicator queries; [`quarantine`] sets corrupt files
//!   aside so the rest is served;
//! - [`status`]: the status page at `/` (its charts are `gpuledger-charts`');
//! - [`billing_source`]: the tables as billing's usage source (job events, GPU-hours,
//!   reported FLOP/s); billing owns what is made of them; [`ledger`]: the same reconciliation
//!   for the status page and `/metrics` (flagged GPU-seconds, coverage gaps);
//! - [`live`]: the jobs waiting and running now, followed from accepted job events;
//! - [`http`]: the axum API over all of it, [`metrics`] its `/metrics`, [`events`] job-event
//!   parsing;
//! - [`serve`]: the service: recovery, the listener, the flush, compaction and retention
//!   loop, shutdown.

pub mod api_error;
pub mod billing_source;
pub mod clock_skew;
pub mod coverage;
pub mod http;
pub mod ingest;
pub mod layout;
pub mod ledger;
pub mod live;
pub mod metrics;
pub mod objects;
pub mod quarantine;
pub mod query;
pub mod rollup;
pub mod runs;
pub mod serve;
pub mod sql_api;
pub mod status;
pub mod store;
pub mod wal;

/// The sample checks and the job-event parser live with the wire format in `gpuledger-model`,
/// where the fuzz targets reach them without building the query engine.
pub use gpuledger_model::{event_json as events, validate};

pub use ingest::{
    Accepted, EventsIngested, IngestOutcome, Ingested, Ingestor, IngestorConfig, RecoveryReport,
    SamplePush,
};
pub use store::Store;

/// Aggregator errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{location}: {source}")]
    ObjectStore {
        location: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("Arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("query: {0}")]
    Query(#[from] datafusion::error::DataFusionError),
    #[error("batch refused: {} bad row(s); first: {}", .0.len(), .0.first().map(|e| e.to_string()).unwrap_or_default())]
    Invalid(Vec<validate::RowError>),
    /// Some rows of a batch were refused (named in `refusal`); the other `stored_rows` stored.
    #[error("{} row(s) of the batch refused, {stored_rows} stored; first: {}", .refused_rows, .refusal.errors.first().map(|e| e.to_string()).unwrap_or_default())]
    RowsRefused {
        refusal: validate::Refusal,
        refused_rows: usize,
        stored_rows: usize,
    },
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A request whose `field` (a header) is refused.
    #[error("`{field}`: {message}")]
    BadRequest { field: String, message: String },
    /// A batch under a key already stored with other content: refused, nothing stored.
    #[error("`{field}`: {message}")]
    Conflict { field: String, message: String },
    #[error("stored data is not as expected: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Service(#[from] gpuledger_service::Error),
    /// What was being done when `cause` happened.
    #[error("{what}: {cause}")]
    Context { what: String, cause: Box<Error> },
}

impl Error {
    /// This error, said to have happened while doing `what`.
    pub fn context(self, what: impl Into<String>) -> Error {
        Error::Context {
            what: what.into(),
            cause: Box::new(self),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<std::path::PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}
