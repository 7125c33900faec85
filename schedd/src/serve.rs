//! The scheduler service (`gpuledger scheduler serve`): the HTTP API on the shared accept loop,
//! a scheduling cycle every `--cycle`, and at SIGTERM or Ctrl-C one last cycle that saves the
//! state. Jobs keep running across a restart: the next start adopts them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::time::{Clock, SystemClock};
use gpuledger_model::units::DurationSpecMs;
use gpuledger_model::DurationSpec;
use gpuledger_scheduler::SchedulerOptions;
use gpuledger_service::{announce, AccessArgs, ClientTlsArgs, HttpLimits, TlsArgs};

use crate::executor::{ExecutorOptions, LocalExecutor};
use crate::{http, Error, Result, Service, ServiceConfig};

/// Options of the scheduler service.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:9500")]
    pub listen: SocketAddr,
    #[arg(long, default_value = "./gpuledger-data", env = "GPULEDGER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Where each job's directory (its working directory, `HOME`, `TMPDIR` and output) is made
    /// (default: `DATA_DIR/scheduler/jobs`). Put it on another filesystem than the data
    /// directory: a job that fills the filesystem it writes to must not stop the scheduler
    /// saving what it acknowledges.
    #[arg(long, env = "GPULEDGER_JOBS_DIR")]
    pub jobs_dir: Option<PathBuf>,
    /// Cluster config (default: the embedded seed cluster).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// fifo or fairshare, optionally +backfill or +conservative.
    #[arg(long, default_value = "fairshare+backfill")]
    pub policy: String,
    /// The aggregator's URL: job events go there and fair-share usage comes from its feed.
    /// Without it, the scheduler counts its own allocations.
    #[arg(long)]
    pub aggregator: Option<String>,
    /// A file holding an operator token for the aggregator, when it runs with --tokens.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    pub aggregator_token_file: Option<PathBuf>,
    /// Time between scheduling cycles.
    #[arg(long, default_value = "1s")]
    pub cycle: DurationSpecMs,
    /// How often the usage feed is read.
    #[arg(long, default_value = "60s")]
    pub usage_every: DurationSpec,
    /// Which cgroups contain jobs: `auto` (v2 where writable, else v1 freezer and pids, else
    /// process groups with a warning), `v2`, `v1` (refuse to start without), `off`.
    #[arg(long, value_enum, default_value = "auto")]
    pub cgroup: crate::cgroup::CgroupMode,
    /// How long a job's processes may outlive SIGKILL before its nodes are drained (Slurm's
    /// UnkillableStepTimeout).
    #[arg(long, default_value = "60s")]
    pub unkillable_timeout: DurationSpec,
    /// Memory each job may use per GPU it holds (`64GiB`; a part of a GPU gets that part),
    /// without swap beyond it: past it the kernel ends the job's processes, not the node's
    /// others (Slurm's DefMemPerGPU with ConstrainRAMSpace). Unlimited when not given.
    #[arg(long, env = "GPULEDGER_JOB_MEMORY_PER_GPU", value_parser = crate::cgroup::parse_memory_per_gpu)]
    pub job_memory_per_gpu: Option<gpuledger_model::ByteSize>,
    /// CPUs' time each job may use per GPU it holds (`8`, `2.5`), however many threads it runs
    /// (a CFS quota, as Slurm's DefCpuPerGPU). Unlimited when not given.
    #[arg(long, env = "GPULEDGER_JOB_CPUS_PER_GPU")]
    pub job_cpus_per_gpu: Option<crate::cgroup::CpuCount>,
    /// Processes and threads each job may run at once (`pids.max`, as systemd's TasksMax=):
    /// past it the job's `fork` fails, and a fork bomb takes no process id from the node.
    /// Unlimited when not given.
    #[arg(long, env = "GPULEDGER_JOB_TASKS_MAX", value_parser = clap::value_parser!(u32).range(crate::cgroup::MIN_TASKS as i64..))]
    pub job_tasks_max: Option<u32>,
    /// Whether each job gets a `/tmp` and `/dev/shm` of its own (a mount namespace, as Slurm's
    /// job_container/tmpfs): `auto` (where the host allows, else shared with a warning),
    /// `private` (refuse to start without), `shared`.
    #[arg(long, value_enum, env = "GPULEDGER_JOB_TMP", default_value = "auto")]
    pub job_tmp: crate::job_tmp::JobTmp,
    /// `cores`: bind each job to whole cores of its own, its `--job-cpus-per-gpu` times its
    /// GPUs rounded up (a cpuset, as Slurm's ConstrainCores with --cpu-bind=cores), so that its
    /// thread pools size to what it has; `none`: any core, within its CPU quota.
    #[arg(
        long,
        value_enum,
        env = "GPULEDGER_JOB_CPU_BIND",
        default_value = "none"
    )]
    pub job_cpu_bind: CpuBind,
    // With a token file, tenants submit and see their own jobs, nodes read their own GPUs of
    // the allocation feed, operators do the rest.
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub limits: HttpLimits,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub client_tls: ClientTlsArgs,
}

/// How jobs are bound to cores (`--job-cpu-bind`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuBind {
    /// Any core, within the job's CPU quota.
    #[default]
    None,
    /// Whole cores of its own.
    Cores,
}

fn invalid(field: &str, message: impl std::fmt::Display) -> Error {
    Error::Invalid {
        field: field.into(),
        message: message.to_string(),
    }
}

/// Creates both directories, and warns when they are on one filesystem: a job that fills it
/// (a runaway log, a checkpoint too large) makes every request that must be saved fail.
fn warn_if_jobs_share_the_state_filesystem(state: &Path, jobs: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let device = |dir: &Path| {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::metadata(dir))
            .map(|m| m.dev())
            .map_err(|source| Error::Io {
                path: dir.to_owned(),
                source,
            })
    };
    if device(state)? == device(jobs)? {
        tracing::warn!(
            state = %state.display(),
            jobs = %jobs.display(),
            "job directories are on the filesystem of the scheduler's state: a job that fills it makes every submission, cancel and drain fail (503) until space is freed; give --jobs-dir on another filesystem"
        );
    }
    Ok(())
}

/// The accounts whose jobs would run as one Unix user, by that user's id (`resolve` gives a
/// user name's id on this host; names that do not resolve are left out: a submission names
/// them). Projects' own users count for their account. Jobs of one user can signal, trace and
/// read each other's processes and files: tenants sharing a user are not kept apart.
pub fn accounts_sharing_users(
    cluster: &ClusterConfig,
    resolve: impl Fn(&str) -> Option<u32>,
) -> Vec<(u32, Vec<String>)> {
    let mut by_user: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for account in &cluster.accounts {
        let users = account
            .run_as
            .iter()
            .chain(account.projects.iter().filter_map(|p| p.run_as.as_ref()))
            .filter_map(|run_as| resolve(&run_as.user));
        for uid in users {
            let accounts = by_user.entry(uid).or_default();
            if !accounts.contains(&account.id.to_string()) {
                accounts.push(account.id.to_string());
            }
        }
    }
    by_user.into_iter().filter(|(_, a)| a.len() > 1).collect()
}

/// Warns, for a scheduler running as root, of accounts whose jobs run as one user.
fn warn_of_accounts_sharing_users(cluster: &ClusterConfig) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let resolve = |name: &str| {
        nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
    };
    for (uid, accounts) in accounts_sharing_users(cluster, resolve) {
        tracing::warn!(
            uid,
            accounts = %accounts.join(", "),
            "these accounts' jobs run as one Unix user: each can signal, trace and read the others' jobs and files; give each account a user of its own (run_as)"
        );
    }
}

/// Runs the service under `cluster` until SIGTERM or Ctrl-C.
pub fn run(options: ServeOptions, cluster: ClusterConfig) -> Result<()> {
    let guard = options.access.guard("scheduler", options.listen)?;
    let policy = SchedulerOptions::parse(&options.policy).ok_or_else(|| {
        invalid(
            "--policy",
            format!(
                "unknown `{}`: fifo or fairshare, optionally +backfill or +conservative",
                options.policy
            ),
        )
    })?;
    // Absolute: jobs run in their own directories and write their exit status by this path.
    let data_dir = std::path::absolute(&options.data_dir).map_err(|source| Error::Io {
        path: options.data_dir.clone(),
        source,
    })?;
    let dir = data_dir.join("scheduler");
    let config = ServiceConfig {
        options: policy,
        dir: dir.clone(),
        billing_reservations: Some(data_dir.join("reservations.toml")),
        aggregator: options
            .aggregator
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_owned()),
        aggregator_token: options
            .aggregator_token_file
            .as_deref()
            .map(gpuledger_service::read_token_file)
            .transpose()?,
        usage_every: Duration::from_secs(options.usage_every.as_secs().max(1)),
        storage_scans: Some(data_dir.join("storage").join("scans.csv")),
        tls: options.client_tls.config()?,
    };
    let jobs_dir = match &options.jobs_dir {
        Some(jobs) => std::path::absolute(jobs).map_err(|source| Error::Io {
            path: jobs.clone(),
            source,
        })?,
        None => dir.join("jobs"),
    };
    warn_if_jobs_share_the_state_filesystem(&dir, &jobs_dir)?;
    warn_of_accounts_sharing_users(&cluster);
    let executor = LocalExecutor::with_options(
        jobs_dir,
        ExecutorOptions {
            cgroups: options.cgroup,
            unkillable_after: Duration::from_secs(options.unkillable_timeout.as_secs().max(1)),
            limits: crate::cgroup::JobLimits {
                memory_per_gpu: options.job_memory_per_gpu,
                cpus_per_gpu: options.job_cpus_per_gpu,
                tasks_max: options.job_tasks_max,
                bind_cores: options.job_cpu_bind == CpuBind::Cores,
            },
            tmp: options.job_tmp,
            ..ExecutorOptions::default()
        },
    )
    .map_err(|e| {
        // The executor's errors about a limit or /tmp start with the flag they are about.
        let message = e.to_string();
        match message.split_once(": ") {
            Some((flag, rest)) if flag.starts_with("--") => invalid(flag, rest),
            _ => invalid("--cgroup", message),
        }
    })?;
    let executor = Box::new(executor);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let service = Arc::new(Service::open(cluster, config, executor, clock)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            path: "the runtime".into(),
            source,
        })?;
    let tls = options.tls.acceptor()?;
    runtime.block_on(serve(options, service, guard, tls, dir))
}

async fn serve(
    options: ServeOptions,
    service: Arc<Service>,
    guard: gpuledger_auth::Guard,
    tls: Option<tokio_rustls::TlsAcceptor>,
    dir: PathBuf,
) -> Result<()> {
    let shutdown = gpuledger_service::shutdown_signal()?;
    let listener = gpuledger_service::bind(options.listen).await?;
    let addr = listener.local_addr().map_err(|source| Error::Io {
        path: "the listener".into(),
        source,
    })?;
    // Tests and scripts read this line to find the port.
    announce(&format!(
        "gpuledger scheduler listening on {}://{addr} state {}",
        gpuledger_service::scheme(tls.as_ref()),
        dir.display()
    ));
    let every = options.cycle.0.max(Duration::from_millis(50));
    let cycles = tokio::spawn(cycle_loop(Arc::clone(&service), every));
    let budget =
        gpuledger_service::BodyBudget::new(options.limits.max_buffered_bytes, http::MAX_BODY_BYTES);
    let app = http::router_with(Arc::clone(&service), guard, budget);
    let served = gpuledger_service::serve(listener, app, options.limits, tls, shutdown).await;
    cycles.abort();
    served.map_err(|source| Error::Io {
        path: addr.to_string().into(),
        source,
    })?;
    // Jobs keep running: a restarted scheduler adopts them from its state file.
    let s = Arc::clone(&service);
    tokio::task::spawn_blocking(move || {
        let cycle = s.tick();
        s.finish_state_file();
        cycle
    })
    .await
    .map_err(|e| invalid("shutdown", format!("the last cycle panicked: {e}")))??;
    announce("gpuledger scheduler stopped; state saved, jobs left running");
    Ok(())
}

/// One scheduling cycle every `every`, each on a blocking thread (it runs processes and writes
/// the state file); a failed cycle is logged and the next one tries again.
async fn cycle_loop(service: Arc<Service>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let s = Arc::clone(&service);
        match tokio::task::spawn_blocking(move || s.tick()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::error!(%error, "scheduling cycle failed"),
            Err(error) => tracing::error!(%error, "scheduling cycle panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_whose_jobs_run_as_one_user_are_named_together() {
        let toml = "version = 1\n[cluster]\nname = \"one\"\n[[node_pools]]\nname = \"p\"\n\
            prefix = \"gpu\"\ncount = 1\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
            [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
            [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
            gpu_hour = { h100-sxm = \"1\" }\n\
            [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nrun_as = { user = \"alice\" }\n\
            [[accounts]]\nid = \"team-b\"\nname = \"B\"\nweight = 1\nrun_as = { user = \"nobody\" }\n\
            [[accounts]]\nid = \"team-c\"\nname = \"C\"\nweight = 1\nrun_as = { user = \"nobody\" }\n\
            [[accounts]]\nid = \"team-d\"\nname = \"D\"\nweight = 1\nrun_as = { user = \"dora\" }\n\
            projects = [{ id = \"vision\", run_as = { user = \"alice\" } }, { id = \"nlp\", run_as = { user = \"dora\" } }]\n\
            [[accounts]]\nid = \"team-e\"\nname = \"E\"\nweight = 1\nrun_as = { user = \"gone\" }\n";
        let cluster = ClusterConfig::from_toml_str(toml, "one.toml").unwrap();
        let uid = |name: &str| match name {
            "alice" => Some(1001),
            "dora" => Some(1002),
            "nobody" => Some(65534),
            _ => None,
        };
        assert_eq!(
            accounts_sharing_users(&cluster, uid),
            vec![
                (1001, vec!["team-a".to_owned(), "team-d".to_owned()]),
                (65534, vec!["team-b".to_owned(), "team-c".to_owned()]),
            ],
            "team-d's own user twice is one account; team-e's user does not resolve"
        );
    }
}
