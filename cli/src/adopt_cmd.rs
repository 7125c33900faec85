//! `gpuledger import slurm-assoc` and `gpuledger export kubernetes`: the tenant tree from the
//! Slurm associations a cluster already has, and to the Kubernetes and Kueue objects that
//! enforce it (see `gpuledger_adapters`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use gpuledger_adapters::slurm::assoc;
use gpuledger_adapters::slurm::jobs::AccountMap;
use gpuledger_model::ClusterConfig;

use gpuledger_sim::seed::load_cluster;

#[derive(clap::Subcommand, Debug)]
pub enum ImportCommand {
    /// Read `sacctmgr dump CLUSTER` (Slurm's associations and limits) and write the gpuledger
    /// accounts, projects and quotas they map to; say on stderr what could not be mapped.
    SlurmAssoc {
        /// The dump file (`sacctmgr dump mycluster file=mycluster.cfg`).
        file: PathBuf,
        /// A cluster config whose accounts the import replaces (nodes, partitions and prices
        /// are kept); the result is checked and written whole. Without it only the
        /// `[[accounts]]` tables are written.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write; standard output when absent.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write which gpuledger account and project each Slurm account books to (a line
        /// `slurm_account account [project]`), for the Slurm prolog and `gpuledger slurm follow`.
        #[arg(long)]
        account_map: Option<PathBuf>,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum ExportCommand {
    /// Write Namespaces, ResourceQuotas and Kueue ResourceFlavors, WorkloadPriorityClasses,
    /// ClusterQueues and LocalQueues for the cluster config's accounts and projects (YAML).
    Kubernetes {
        /// Cluster config (default: the embedded seed cluster).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write; standard output when absent.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn write_out(out: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// `base` with its `[[accounts]]` tables (and what belongs to them) removed.
fn without_accounts(base: &str) -> String {
    let mut out = String::new();
    let mut in_accounts = false;
    for line in base.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            let name = t.trim_matches(|c| c == '[' || c == ']').trim();
            in_accounts = name == "accounts" || name.starts_with("accounts.");
        }
        if !in_accounts {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

pub fn import(command: ImportCommand) -> anyhow::Result<()> {
    match command {
        ImportCommand::SlurmAssoc {
            file,
            config,
            out,
            account_map,
        } => {
            let origin = file.display().to_string();
            let text =
                std::fs::read_to_string(&file).with_context(|| format!("reading {origin}"))?;
            let lines = assoc::parse_dump(&text, &origin)?;
            let import = assoc::import(&lines, &origin)?;
            let accounts = assoc::accounts_toml(&import.accounts);
            let whole = match &config {
                Some(base) => {
                    let base_text = std::fs::read_to_string(base)
                        .with_context(|| format!("reading {}", base.display()))?;
                    let merged = format!("{}\n{accounts}", without_accounts(&base_text).trim_end());
                    ClusterConfig::from_toml_str(
                        &merged,
                        &format!("{} with {origin}", base.display()),
                    )?;
                    merged
                }
                None => {
                    // Checked against the seed cluster's nodes, partitions and prices.
                    let seed = without_accounts(gpuledger_sim::seed::SEED_CLUSTER_TOML);
                    ClusterConfig::from_toml_str(&format!("{seed}\n{accounts}"), &origin)?;
                    accounts
                }
            };
            write_out(out.as_deref(), &whole)?;
            if let Some(path) = account_map {
                let map = AccountMap::from_accounts(&import.accounts);
                std::fs::write(&path, map.to_text(&import.accounts))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            let projects: usize = import.accounts.iter().map(|a| a.projects.len()).sum();
            eprintln!(
                "cluster `{}`: {} accounts, {} projects imported; {} item(s) not mapped",
                import.cluster,
                import.accounts.len(),
                projects,
                import.not_mapped.len()
            );
            eprint!("{}", assoc::report(&import));
            Ok(())
        }
    }
}

pub fn export(command: ExportCommand) -> anyhow::Result<()> {
    match command {
        ExportCommand::Kubernetes { config, out } => {
            let config = load_cluster(config.as_deref())?;
            write_out(
                out.as_deref(),
                &gpuledger_adapters::kubernetes::export(&config),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_cut_out_of_a_base_config() {
        let base = "version = 1\n[cluster]\nname = \"x\"\n[[accounts]]\nid = \"a\"\n[accounts.quota]\nmax_running_jobs = 1\n[[partitions]]\nname = \"p\"\n";
        assert_eq!(
            without_accounts(base),
            "version = 1\n[cluster]\nname = \"x\"\n[[partitions]]\nname = \"p\"\n"
        );
    }
}
