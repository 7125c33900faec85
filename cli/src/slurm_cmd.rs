//! `gpuledger slurm`: gpuledger against a Slurm cluster (`gpuledger-slurm`).

use gpuledger_slurm::follow::FollowOptions;
use gpuledger_slurm::steer::SteerOptions;

#[derive(clap::Subcommand, Debug)]
pub enum SlurmCommand {
    /// Poll a Slurm cluster and post its jobs' events to the aggregator.
    Follow(FollowOptions),
    /// Set pending jobs' fair-share factors from gpuledger's measured usage, and hold jobs
    /// over GPU-hour quotas until their window has room.
    Steer(SteerOptions),
}

pub fn run(command: SlurmCommand) -> anyhow::Result<()> {
    match command {
        SlurmCommand::Follow(options) => Ok(gpuledger_slurm::follow::follow(options)?),
        SlurmCommand::Steer(options) => Ok(gpuledger_slurm::steer::steer(options)?),
    }
}
