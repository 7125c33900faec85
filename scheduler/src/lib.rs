//! The scheduling policy of gpuledger and its simulator. Everything here is pure and
//! synchronous: no I/O, no wall clock (time is passed in), so a trace replay and a live service
//! run exactly the same decisions.
//!
//! - [`cluster`]: node-granular placement (best-fit packing, whole nodes for multi-node jobs,
//!   dedicated pools);
//! - [`fairshare`]: decayed usage, the fair-share factors (Fair Tree's rank, the design's
//!   `weight / (1 + usage / factor)`, Slurm's classic) and the weighted max-min split of the
//!   cluster among accounts with demand (`water_fill`: what plans and fair-share preemption
//!   aim at, and what the simulator's weekly table measures);
//! - [`core`]: admission with quota checks in every dimension, queue order (FIFO or the
//!   multifactor priority within tiers), Slurm-style pending reasons, EASY and conservative
//!   backfill (planned in `plan`), preemption with a checkpoint grace, elastic jobs;
//! - [`reservation`]: advance reservations of nodes for accounts over a window;
//! - [`windows`]: GPU-seconds per UTC day for the GPU-hour quotas;
//! - [`sim`]: a discrete-event simulator over virtual time;
//! - [`workload`]: a seeded generator of team workloads.

pub mod cluster;
pub mod core;
pub mod fairshare;
mod plan;
mod releases;
pub mod reservation;
pub mod sim;
pub mod trace;
pub mod windows;
pub mod workload;

pub use crate::core::{
    Backfill, Cycle, JobSpec, PendingJob, PendingReason, Policy, Preempting, Preemption,
    PriorityParts, Refusal, Resized, RunningJob, Scheduler, SchedulerOptions, Started,
};
pub use crate::reservation::{AdvanceReservation, NodeRequest, ReservationRequest};
pub use crate::sim::{simulate, simulate_with_reservations, JobRecord, Run, SimJob, SimResult};
