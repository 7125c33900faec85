//! The shared vocabulary of gpuledger. No I/O lives here: every other crate depends on this one
//! and agrees through it on what an account, a job, a GPU model, a telemetry sample and a job
//! event are, how they look as Arrow record batches, how the cluster is configured, and how
//! money and usage are represented (decimal money, integer GPU-seconds).
//!
//! Persisted formats carry a version: [`sample::SAMPLE_SCHEMA_VERSION`],
//! [`job::JOB_EVENT_SCHEMA_VERSION`] and [`config::CONFIG_VERSION`].

pub mod allocation;
pub mod allocation_feed;
pub mod billed_reservations;
pub mod config;
pub mod durable;
pub mod event_json;
pub mod gpu;
pub mod ids;
pub mod inventory;
pub mod job;
pub mod money;
pub mod quota;
pub mod reference;
pub mod rng;
pub mod sample;
pub mod share;
pub mod stats;
pub mod storage_scan;
pub mod tenant;
pub mod time;
pub mod units;
pub mod usage;
pub mod validate;
pub mod wire;

pub use allocation::{Allocation, NodeGpus};
pub use config::{ClusterConfig, ConfigError};
pub use gpu::{GpuModel, GpuType};
pub use ids::{AccountId, IdError, JobId, NodeId, ProjectId};
pub use inventory::Inventory;
pub use money::{Currency, Money};
pub use quota::Quota;
pub use share::{GpuShare, ShareMode, SHARE_UNITS_PER_GPU};
pub use units::{ByteSize, DurationSpec, GpuSeconds};
