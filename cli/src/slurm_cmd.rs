//! `gpuledger slurm`: gpuledger against a Slurm cluster (`gpuledger-slurm`).

use gpuledger_slurm::follow::FollowOptions;

#[derive(clap::Subcommand, Debug)]
pub enum SlurmCommand {
    /// Poll a Slurm cluster and post its jobs' events to the aggregator.
    Follow(FollowOptions),
}

pub fn run(command: SlurmCommand) -> anyhow::Result<()> {
    match command {
        SlurmCommand::Follow(options) => Ok(gpuledger_slurm::follow::follow(options)?),
    }
}
