//! `gpuledger token`: the token file the services read (`--tokens FILE`). A new token is printed
//! once and only its SHA-256 is kept; `list` shows ids, names and roles; `revoke` removes one.
//! A running service follows the file: an added or revoked token takes effect within a second,
//! without a restart.

use std::path::PathBuf;

use anyhow::Context;
use gpuledger_auth::{Role, TokenFile};
use gpuledger_model::AccountId;

#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Issue a token and print it (once); the file keeps its hash.
    Add {
        /// The token file (created, mode 0600, when missing).
        #[arg(long, env = "GPULEDGER_TOKENS")]
        file: PathBuf,
        /// node, tenant, finance, operator or metrics (scrapes /metrics only, for Prometheus).
        #[arg(long)]
        role: Role,
        /// Who holds it, e.g. `prometheus`, `gpu017`, `team-a lead`.
        #[arg(long)]
        name: String,
        /// The tenant's account (tenant tokens).
        #[arg(long)]
        account: Option<AccountId>,
        /// The node it pushes as (node tokens).
        #[arg(long)]
        node: Option<String>,
    },
    /// List the tokens: id, role, account or node, name, created.
    List {
        #[arg(long, env = "GPULEDGER_TOKENS")]
        file: PathBuf,
    },
    /// Remove the token with this id, or every token with this name.
    Revoke {
        #[arg(long, env = "GPULEDGER_TOKENS")]
        file: PathBuf,
        id_or_name: String,
    },
}

pub fn run(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Add {
            file,
            role,
            name,
            account,
            node,
        } => {
            let mut tokens = TokenFile::load(&file)?;
            let token = tokens.issue(role, &name, account, node, chrono::Utc::now())?;
            tokens
                .save(&file)
                .with_context(|| format!("writing {}", file.display()))?;
            println!("{token}");
            eprintln!(
                "issued a {role} token for `{name}`; it is shown only now, {} keeps its hash",
                file.display()
            );
            Ok(())
        }
        TokenCommand::List { file } => {
            let tokens = TokenFile::load(&file)?;
            let rows: Vec<Vec<String>> = tokens
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        t.role.to_string(),
                        t.account
                            .as_ref()
                            .map(ToString::to_string)
                            .or_else(|| t.node.clone())
                            .unwrap_or_else(|| "-".into()),
                        t.name.clone(),
                        t.created.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                crate::table::render(&["id", "role", "account/node", "name", "created"], &rows)
            );
            Ok(())
        }
        TokenCommand::Revoke { file, id_or_name } => {
            let mut tokens = TokenFile::load(&file)?;
            let gone = tokens.revoke(&id_or_name)?;
            tokens
                .save(&file)
                .with_context(|| format!("writing {}", file.display()))?;
            for t in gone {
                println!("revoked {} ({} `{}`)", t.id, t.role, t.name);
            }
            Ok(())
        }
    }
}
