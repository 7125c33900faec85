//! The per-node agent's GPU side: every source of GPU readings sits behind one trait,
//! [`source::GpuSource`], so the NVML reader, the synthetic GPUs the demo and tests use, and
//! (later) a dcgm-exporter scrape are interchangeable. Readings plus job labels become sample
//! rows of the shared schema ([`gpuledger_model::sample`]). [`agent`] runs the sampling and
//! push loops over a durable [`spool`]; [`exposition`] renders `/metrics` from a snapshot.

pub mod agent;
pub mod exposition;
pub mod nvml;
pub mod source;
pub mod spool;
pub mod synthetic;

pub use source::{GpuDevice, GpuReading, GpuSource, JobLabel, SourceError};
