//! The per-node agent's GPU side: every source of GPU readings sits behind one trait,
//! [`source::GpuSource`], so the NVML reader, the synthetic GPUs the demo and tests use, and
//! a dcgm-exporter scrape ([`dcgm`], over [`promtext`]) are interchangeable. Readings plus job labels become sample
//! rows of the shared schema ([`gpuledger_model::sample`]). [`agent`] runs the sampling and
//! push loops over a durable [`spool`]; [`exposition`] renders `/metrics` from a snapshot, and
//! [`otlp`] sends the same series to an OpenTelemetry receiver. [`daemon`] runs all of it as a
//! service, the `gpuledger-exporter` binary of this package and `gpuledger exporter`.

pub mod agent;
pub mod daemon;
pub mod dcgm;
pub mod exposition;
pub mod nvml;
pub mod otlp;
pub mod promtext;
pub mod source;
pub mod spool;
pub mod synthetic;

pub use source::{GpuDevice, GpuReading, GpuSource, JobLabel, SourceError};
