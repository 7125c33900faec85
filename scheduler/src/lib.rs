//! The scheduling policy of gpuledger and its simulator. Everything here is pure and
//! synchronous: no I/O, no wall clock (time is passed in), so a trace replay and a live service
//! run exactly the same decisions.
//!
//! - [`cluster`]: node-granular placement (best-fit packing, whole nodes for multi-node jobs,
//!   dedicated pools);
//! - [`fairshare`]: decayed usage and `weight / (1 + usage / factor)`;
//! - [`core`]: admission with quota checks, queue order (FIFO or fair share within tiers),
//!   Slurm-style pending reasons, EASY backfill;
//! - [`sim`]: a discrete-event simulator over virtual time;
//! - [`workload`]: a seeded generator of team workloads.

pub mod cluster;
pub mod core;
pub mod fairshare;
pub mod sim;
pub mod trace;
pub mod workload;

pub use crate::core::{
    JobSpec, PendingReason, Policy, Refusal, Scheduler, SchedulerOptions, Started,
};
pub use crate::sim::{simulate, JobRecord, SimJob, SimResult};
