//! The state directory of `gpuledger up` and what its first start writes there:
//!
//! ```text
//! STATE/cluster.toml      the stack's cluster config (kept: edit it and start again)
//! STATE/tokens.toml       the token file every service checks (hashes only)
//! STATE/secrets/NAME      one token per client, 0600: scheduler, node-gpu001, ..., prometheus, workload
//! STATE/data/             the aggregator's tables and the scheduler's state
//! STATE/spool/NODE/       each exporter's spool
//! STATE/prometheus/       Prometheus's config, rules and time series
//! STATE/logs/NAME.log     each service's output
//! STATE/up.lock           held while the stack runs: one stack per directory
//! ```
//!
//! The jobs' directories are the scheduler's, under `STATE/data/`, unless [`crate::jobs_dir`]
//! puts them elsewhere.

use std::fs::File;
use std::path::{Path, PathBuf};

use gpuledger_auth::{Role, TokenFile};
use gpuledger_model::config::ClusterConfig;
use gpuledger_model::GpuModel;

use crate::{Error, Result, UpOptions};

/// One node the stack runs an exporter for.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub gpus: u32,
    pub model: GpuModel,
}

#[derive(Debug)]
pub struct Layout {
    root: PathBuf,
    nodes: Vec<Node>,
    first_start: bool,
    /// The operator's token, when this start issued it (it is never written down).
    operator_token: Option<String>,
    jobs_dir: Option<crate::jobs_dir::JobsDir>,
    _lock: nix::fcntl::Flock<File>,
}

fn create_dir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(Error::io(format!("creating {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(Error::io(format!("setting the mode of {}", path.display())))
}

/// The seed cluster on `nodes` nodes; when the stack runs as root, each account's jobs run as
/// `nobody` (the scheduler refuses to run tenants' jobs as root unless told to).
pub fn seed_for_stack(seed: &str, nodes: u16, as_root: bool) -> Result<String> {
    let mut out = String::with_capacity(seed.len() + 1024);
    let mut in_pool = false;
    let mut counted = false;
    for line in seed.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            in_pool = t.starts_with("[[node_pools]]");
        }
        if in_pool && !counted && t.starts_with("count") && t.contains('=') {
            out.push_str(&format!("count = {nodes}\n"));
            counted = true;
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if as_root && t.starts_with("[[accounts]]") {
            out.push_str("run_as = { user = \"nobody\" }  # gpuledger up, as root\n");
        }
    }
    if !counted {
        return Err(Error::Config(
            "the seed cluster has no node pool `count` to set".into(),
        ));
    }
    Ok(out)
}

impl Layout {
    /// Opens (first start: creates) the state directory, locks it, and writes what is missing:
    /// the cluster config, the token file, each client's token.
    pub fn prepare(options: &UpOptions, seed: &str) -> Result<Layout> {
        let root = options.state_dir.clone();
        // Traversable, not listable: jobs run as their accounts' users and reach their own
        // directories below data/ (each 0700, theirs); everything else here is 0700.
        create_dir(&root, 0o711)?;
        let lock_path = root.join("up.lock");
        let lock_file = File::create(&lock_path)
            .map_err(Error::io(format!("creating {}", lock_path.display())))?;
        let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| {
                Error::Usage(format!(
                    "{} is in use by another gpuledger up (stop it first)",
                    root.display()
                ))
            })?;
        create_dir(&root.join("data"), 0o711)?;
        for sub in ["spool", "prometheus", "logs"] {
            create_dir(&root.join(sub), 0o700)?;
        }
        create_dir(&root.join("secrets"), 0o700)?;
        let config_path = root.join("cluster.toml");
        let first_start = !config_path.exists();
        if first_start {
            let text = match &options.config {
                Some(p) => std::fs::read_to_string(p)
                    .map_err(Error::io(format!("reading {}", p.display())))?,
                None => seed_for_stack(seed, options.exporters, nix::unistd::geteuid().is_root())?,
            };
            gpuledger_model::durable::replace_file(&config_path, text.as_bytes())
                .map_err(Error::io(format!("writing {}", config_path.display())))?;
        }
        let text = std::fs::read_to_string(&config_path)
            .map_err(Error::io(format!("reading {}", config_path.display())))?;
        let config = ClusterConfig::from_toml_str(&text, &config_path.display().to_string())
            .map_err(|e| Error::Config(e.to_string()))?;
        let all = config.nodes();
        if all.len() < usize::from(options.exporters) {
            return Err(Error::Usage(format!(
                "--exporters {}: {} names only {} nodes",
                options.exporters,
                config_path.display(),
                all.len()
            )));
        }
        let nodes: Vec<Node> = all
            .into_iter()
            .take(usize::from(options.exporters))
            .map(|n| Node {
                name: n.id.to_string(),
                gpus: n.gpus,
                model: n.gpu_model,
            })
            .collect();
        let jobs_dir = crate::jobs_dir::choose(
            &root,
            options.jobs_dir.as_deref(),
            nix::unistd::geteuid().is_root(),
        )?;
        let mut layout = Layout {
            root,
            nodes,
            first_start,
            operator_token: None,
            jobs_dir,
            _lock: lock,
        };
        layout.issue_missing_tokens()?;
        Ok(layout)
    }

    /// Issues every token the stack needs that is not there yet; the operator's is shown once
    /// and only its hash kept.
    fn issue_missing_tokens(&mut self) -> Result<()> {
        let path = self.tokens_path();
        let mut tokens = TokenFile::load(&path)?;
        let now = chrono::Utc::now();
        let has = |tokens: &TokenFile, name: &str| tokens.tokens.iter().any(|t| t.name == name);
        let mut clients: Vec<(String, Role, Option<String>)> = vec![
            ("scheduler".into(), Role::Operator, None),
            ("workload".into(), Role::Operator, None),
            ("prometheus".into(), Role::Metrics, None),
        ];
        for n in &self.nodes {
            clients.push((format!("node-{}", n.name), Role::Node, Some(n.name.clone())));
        }
        let mut changed = false;
        for (name, role, node) in clients {
            let secret = self.secret(&name);
            if has(&tokens, &name) && secret.exists() {
                continue;
            }
            // A secret lost or never written: a new token replaces the old one.
            tokens.revoke(&name).ok();
            let token = tokens.issue(role, &name, None, node, now)?;
            gpuledger_model::durable::replace_file_with_mode(
                &secret,
                format!("{token}\n").as_bytes(),
                Some(0o600),
            )
            .map_err(Error::io(format!("writing {}", secret.display())))?;
            changed = true;
        }
        if !has(&tokens, "admin") {
            self.operator_token = Some(tokens.issue(Role::Operator, "admin", None, None, now)?);
            changed = true;
        }
        if changed {
            tokens.save(&path)?;
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn first_start(&self) -> bool {
        self.first_start
    }
    pub fn operator_token(&self) -> Option<&str> {
        self.operator_token.as_deref()
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    pub fn config_path(&self) -> PathBuf {
        self.root.join("cluster.toml")
    }
    pub fn tokens_path(&self) -> PathBuf {
        self.root.join("tokens.toml")
    }
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }
    /// Where the jobs' directories go, when not the scheduler's default.
    pub fn jobs_dir(&self) -> Option<&crate::jobs_dir::JobsDir> {
        self.jobs_dir.as_ref()
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn prometheus(&self) -> PathBuf {
        self.root.join("prometheus")
    }
    pub fn spool(&self, node: &str) -> PathBuf {
        self.root.join("spool").join(node)
    }
    /// The file holding client `name`'s token.
    pub fn secret(&self, name: &str) -> PathBuf {
        self.root.join("secrets").join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "version = 1\n[cluster]\nname = \"s\"\n[[node_pools]]\nname = \"h\"\nprefix = \"gpu\"\ncount = 64  # nodes\ngpus_per_node = 8\n[[accounts]]\nid = \"a\"\n[accounts.quota]\ncount = 3\n";

    #[test]
    fn the_seed_shrinks_to_the_stacks_nodes_and_runs_jobs_as_nobody_under_root() {
        let text = seed_for_stack(SEED, 3, true).unwrap();
        assert!(text.contains("count = 3\ngpus_per_node"), "{text}");
        assert!(
            text.contains("[accounts.quota]\ncount = 3\n"),
            "only the pool's count: {text}"
        );
        assert!(
            text.contains("[[accounts]]\nrun_as = { user = \"nobody\" }"),
            "{text}"
        );
        assert!(!seed_for_stack(SEED, 3, false).unwrap().contains("run_as"));
        assert!(seed_for_stack("version = 1\n", 3, false).is_err());
    }
}
