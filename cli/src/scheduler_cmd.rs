//! `gpuledger scheduler`: the live service (`serve`) and its command-line client (`submit`,
//! `cancel`, `queue`, `share`, `priority`, `reserve`, `unreserve`, `nodes`, `drain`, `resume`),
//! which speak its HTTP API as `sbatch`, `scancel`, `squeue`, `sshare`, `sprio`, `scontrol create
//! reservation`, `sinfo` and `scontrol update nodename=... state=drain|resume` would.

use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use gpuledger_schedd::http::{NodesReply, PriorityReply, QueueReply, ShareReply};
use gpuledger_schedd::serve::ServeOptions;
use gpuledger_schedd::state::{JobInfo, JobState};
use gpuledger_schedd::{PriorityRow, ShareRow};

use crate::table;
use gpuledger_sim::seed::load_cluster;

#[derive(clap::Subcommand, Debug)]
pub enum SchedulerCommand {
    /// Run the scheduler service: HTTP API, scheduling cycles, jobs run as local processes.
    Serve(ServeOptions),
    /// Submit a job; prints its id.
    Submit(SubmitArgs),
    /// Cancel a job (a running one gets its checkpoint signal, then SIGKILL after its grace).
    Cancel {
        job_id: String,
        /// SIGKILL at once, without the grace.
        #[arg(long)]
        now: bool,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Running and pending jobs with state, reason and estimated start (as squeue).
    Queue {
        /// Only jobs in these states: pending, running, preempting (comma-separated).
        #[arg(long, value_delimiter = ',')]
        state: Vec<String>,
        #[command(flatten)]
        list: ListOptions,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Jobs of every state, ended ones too, oldest first (as sacct).
    Jobs {
        /// Only jobs in these states: pending, running, preempting, completed, failed,
        /// cancelled, timeout (comma-separated).
        #[arg(long, value_delimiter = ',')]
        state: Vec<String>,
        /// Only jobs still running or waiting then or ended since: RFC 3339, a date, Unix
        /// seconds, or a time ago (`1d`, `12h`).
        #[arg(long)]
        since: Option<String>,
        /// At most this many, the newest (1 to 10,000).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[command(flatten)]
        list: ListOptions,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Fair share per account (as sshare).
    Share {
        #[command(flatten)]
        list: ListOptions,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Waiting jobs' priorities and their weighted parts, in the order a cycle now would take
    /// them (as sprio -l).
    Priority {
        #[command(flatten)]
        list: ListOptions,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Reserve nodes for accounts over a window.
    Reserve(ReserveArgs),
    /// Remove a reservation.
    Unreserve {
        name: String,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Nodes, their GPUs allocated and whether they are in service (as sinfo).
    Nodes {
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Take a node out of service: no new job starts on it, jobs on it run on.
    Drain {
        node: String,
        /// Why (shown by `nodes` and on /metrics).
        #[arg(long)]
        reason: String,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Put a drained node back in service.
    Resume {
        node: String,
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
}

const DEFAULT_URL: &str = "http://127.0.0.1:9500";

/// What the listing commands share: a filter by account and the output's shape.
#[derive(clap::Args, Debug)]
pub struct ListOptions {
    /// Only these accounts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    account: Vec<String>,
    /// The rows as JSON (the API's own objects) instead of a table.
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// The table's columns, comma-separated (as squeue -O); an unknown name lists them all.
    #[arg(long, value_delimiter = ',')]
    format: Vec<String>,
}

/// A column of a listing: its name for --format, its header, and its cell.
type Column<T> = (&'static str, &'static str, fn(&T) -> String);

/// The rows as a table of the columns `format` names (or `default`), or as JSON.
fn print_rows<T: serde::Serialize>(
    rows: &[&T],
    columns: &[Column<T>],
    default: &[&str],
    list: &ListOptions,
    key: &str,
) -> anyhow::Result<()> {
    if list.json {
        println!("{}", serde_json::to_string_pretty(&json!({ key: rows }))?);
        return Ok(());
    }
    let names: Vec<&str> = if list.format.is_empty() {
        default.to_vec()
    } else {
        list.format.iter().map(|s| s.trim()).collect()
    };
    let mut chosen = Vec::new();
    for name in names {
        let column = columns
            .iter()
            .find(|c| c.0 == name.to_ascii_lowercase())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--format: no column `{name}`; the columns are {}",
                    columns.iter().map(|c| c.0).collect::<Vec<_>>().join(", ")
                )
            })?;
        chosen.push(column);
    }
    let headers: Vec<&str> = chosen.iter().map(|c| c.1).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| chosen.iter().map(|c| (c.2)(r)).collect())
        .collect();
    print!("{}", table::render(&headers, &cells));
    Ok(())
}

fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_owned()
}

const JOB_COLUMNS: &[Column<JobInfo>] = &[
    ("jobid", "JOBID", |j| j.id.to_string()),
    ("partition", "PARTITION", |j| {
        or_dash(j.request.partition.as_deref())
    }),
    ("account", "ACCOUNT", |j| j.request.account.to_string()),
    ("project", "PROJECT", |j| {
        j.request
            .project
            .as_ref()
            .map_or("-".into(), ToString::to_string)
    }),
    ("state", "STATE", |j| j.state.as_str().to_owned()),
    ("gpus", "GPUS", |j| j.request.gpus.to_string()),
    ("submit", "SUBMIT", |j| time(Some(j.submit_s))),
    ("start", "START", |j| time(j.start_s)),
    ("end", "END", |j| time(j.end_s)),
    ("est_start", "EST_START", |j| {
        if j.state == JobState::Pending {
            time(j.estimated_start_s)
        } else {
            "-".into()
        }
    }),
    ("elapsed", "ELAPSED", |j| match j.start_s {
        Some(start) => {
            let end = j.end_s.unwrap_or_else(|| chrono::Utc::now().timestamp());
            gpuledger_model::units::DurationSpec::from_secs((end - start).max(0) as u64).to_string()
        }
        None => "-".into(),
    }),
    ("time_limit", "TIME_LIMIT", |j| {
        j.request.time_limit.to_string()
    }),
    ("exit_code", "EXIT", |j| {
        j.exit_code.map_or("-".into(), |c| c.to_string())
    }),
    ("reason", "REASON", |j| or_dash(j.reason.as_deref())),
    // The last run's, from its cgroup: sacct's TotalCPU and MaxRSS.
    ("totalcpu", "TOTALCPU", |j| {
        j.cpu_time_ms
            .map_or("-".into(), |ms| format!("{}.{:03}s", ms / 1000, ms % 1000))
    }),
    ("maxrss", "MAXRSS", |j| {
        j.peak_memory_bytes.map_or("-".into(), |b| {
            format!("{:.1}MiB", b as f64 / f64::from(1u32 << 20))
        })
    }),
    ("nodelist", "NODELIST", |j| or_dash(j.allocation.as_deref())),
    ("nodelist_reason", "NODELIST(REASON)", |j| {
        if j.state == JobState::Pending {
            or_dash(j.reason.as_deref())
        } else {
            or_dash(j.allocation.as_deref())
        }
    }),
    ("command", "COMMAND", |j| j.request.command.clone()),
];

const SHARE_COLUMNS: &[Column<ShareRow>] = &[
    ("account", "ACCOUNT", |a| a.account.clone()),
    ("weight", "WEIGHT", |a| a.weight.to_string()),
    ("normshares", "NORMSHARES", |a| {
        format!("{:.3}", a.norm_shares)
    }),
    ("gpu_hours", "GPU-HOURS", |a| {
        format!("{:.1}", a.decayed_gpu_hours)
    }),
    ("fairshare", "FAIRSHARE", |a| format!("{:.3}", a.fair_share)),
    ("running", "RUNNING", |a| a.running_gpus.to_string()),
    ("pending", "PENDING", |a| a.pending_jobs.to_string()),
];

const PRIORITY_COLUMNS: &[Column<PriorityRow>] = &[
    ("jobid", "JOBID", |p| p.job_id.clone()),
    ("account", "ACCOUNT", |p| p.account.clone()),
    ("partition", "PARTITION", |p| {
        or_dash(p.partition.as_deref())
    }),
    ("tier", "TIER", |p| p.tier.to_string()),
    ("priority", "PRIORITY", |p| format!("{:.1}", p.priority)),
    ("fairshare", "FAIRSHARE", |p| format!("{:.1}", p.fair_share)),
    ("age", "AGE", |p| format!("{:.1}", p.age)),
    ("jobsize", "JOBSIZE", |p| format!("{:.1}", p.job_size)),
    ("quota", "QUOTA", |p| format!("{:.1}", p.quota)),
    ("relief", "RELIEF", |p| {
        if p.relieved { "yes" } else { "no" }.into()
    }),
    ("standing", "STANDING", |p| or_dash(p.standing.as_deref())),
];

/// `--since`: RFC 3339, a date, Unix seconds, or a duration ago; Unix seconds.
fn since_seconds(text: &str, now_s: i64) -> anyhow::Result<i64> {
    if let Ok(s) = gpuledger_model::time::parse_instant_s(text) {
        return Ok(s);
    }
    let ago: gpuledger_model::units::DurationSpec = text.parse().map_err(|_| {
        anyhow::anyhow!("--since `{text}`: not RFC 3339, a date, Unix seconds nor a duration (1d)")
    })?;
    Ok(now_s - ago.as_secs() as i64)
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    #[arg(long)]
    account: String,
    #[arg(long)]
    project: Option<String>,
    #[arg(long)]
    partition: Option<String>,
    /// GPUs (the most an elastic job grows to).
    #[arg(long)]
    gpus: u32,
    /// Smallest size of an elastic job.
    #[arg(long)]
    min_gpus: Option<u32>,
    /// Exactly this many GPUs on each node (GPUs a multiple of it), as Slurm's --gpus-per-node.
    #[arg(long)]
    gpus_per_node: Option<u32>,
    /// At most this many nodes, as Slurm's --nodes.
    #[arg(long)]
    nodes: Option<u32>,
    /// Only GPUs of these types, e.g. `h100-sxm,h200`: models' keys, or the types node pools
    /// name (any when not given). `--gpu-model` is its older name.
    #[arg(long, value_delimiter = ',', alias = "gpu-model")]
    gpu_type: Vec<String>,
    /// A part of one GPU instead of whole GPUs (with --gpus 1): thousandths of its time
    /// (`250m`) or a MIG profile (`3g`, `3g.40gb`).
    #[arg(long)]
    gpu_share: Option<String>,
    /// Time limit, e.g. `2h`.
    #[arg(long)]
    time_limit: String,
    /// Grace between the checkpoint signal and SIGKILL, e.g. `5m`.
    #[arg(long)]
    grace: Option<String>,
    /// TERM (default), USR1, USR2 or INT.
    #[arg(long)]
    checkpoint_signal: Option<String>,
    /// How often the job checkpoints by itself.
    #[arg(long)]
    checkpoint_every: Option<String>,
    /// A variable for the job's environment, NAME=VALUE (repeat); the job sees no other
    /// variables of yours or of the service, only gpuledger's own.
    #[arg(long, value_name = "NAME=VALUE")]
    export: Vec<String>,
    #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
    url: String,
    /// The command, run with `sh -c`.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct ReserveArgs {
    #[arg(long)]
    name: String,
    /// RFC 3339, e.g. 2026-06-10T08:00:00Z.
    #[arg(long)]
    start: String,
    #[arg(long)]
    end: String,
    /// Accounts that may use it; the first is billed for what goes unused.
    #[arg(long, value_delimiter = ',', required = true)]
    accounts: Vec<String>,
    /// A number of nodes for the scheduler to choose.
    #[arg(long, conflicts_with = "node_names")]
    nodes: Option<u32>,
    /// The nodes by name (comma-separated).
    #[arg(long, value_delimiter = ',')]
    node_names: Vec<String>,
    #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
    url: String,
}

pub fn run(command: SchedulerCommand) -> anyhow::Result<()> {
    match command {
        SchedulerCommand::Serve(args) => serve(args),
        SchedulerCommand::Submit(args) => submit(args),
        SchedulerCommand::Cancel { job_id, now, url } => {
            let query = if now { "?now=true" } else { "" };
            let reply = request(
                "DELETE",
                &format!("{url}/api/v1/jobs/{job_id}{query}"),
                None,
            )?;
            println!("{job_id}: {}", reply["state"].as_str().unwrap_or("?"));
            Ok(())
        }
        SchedulerCommand::Queue { state, list, url } => queue(&url, &state, &list),
        SchedulerCommand::Jobs {
            state,
            since,
            limit,
            list,
            url,
        } => jobs(&url, &state, since.as_deref(), limit, &list),
        SchedulerCommand::Share { list, url } => share(&url, &list),
        SchedulerCommand::Priority { list, url } => priority(&url, &list),
        SchedulerCommand::Reserve(args) => {
            let mut body = json!({
                "name": args.name, "start": args.start, "end": args.end, "accounts": args.accounts,
            });
            if let Some(n) = args.nodes {
                body["nodes"] = json!(n);
            }
            if !args.node_names.is_empty() {
                body["node_names"] = json!(args.node_names);
            }
            let reply = request(
                "POST",
                &format!("{}/api/v1/reservations", args.url),
                Some(body),
            )?;
            println!(
                "reservation {}: {} .. {} on {}",
                reply["name"].as_str().unwrap_or("?"),
                reply["start"].as_str().unwrap_or("?"),
                reply["end"].as_str().unwrap_or("?"),
                reply["node_names"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(","))
                    .unwrap_or_default()
            );
            Ok(())
        }
        SchedulerCommand::Unreserve { name, url } => {
            request("DELETE", &format!("{url}/api/v1/reservations/{name}"), None)?;
            println!("reservation {name} removed");
            Ok(())
        }
        SchedulerCommand::Nodes { url } => nodes(&url),
        SchedulerCommand::Drain { node, reason, url } => {
            let body = json!({ "reason": reason });
            request(
                "POST",
                &format!("{url}/api/v1/nodes/{node}/drain"),
                Some(body),
            )?;
            println!("{node}: drained");
            Ok(())
        }
        SchedulerCommand::Resume { node, url } => {
            let reply = request("POST", &format!("{url}/api/v1/nodes/{node}/resume"), None)?;
            let was = reply["was_drained"].as_bool().unwrap_or(false);
            println!(
                "{node}: {}",
                if was { "resumed" } else { "was not drained" }
            );
            Ok(())
        }
    }
}

fn nodes(url: &str) -> anyhow::Result<()> {
    let reply: NodesReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/nodes"), None)?)
            .context("the scheduler's nodes reply")?;
    let rows: Vec<Vec<String>> = reply
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.node.clone(),
                n.state.clone(),
                n.gpu_type.clone(),
                format!("{}/{}/{}", n.allocated_gpus, n.planned_gpus, n.gpus),
                time(n.since_s),
                n.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["NODE", "STATE", "TYPE", "GPUS(A/P/T)", "SINCE", "REASON"],
            &rows
        )
    );
    Ok(())
}

fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let cluster = load_cluster(options.config.as_deref())?;
    Ok(gpuledger_schedd::serve::run(options, cluster)?)
}

/// The client's bearer token: `GPULEDGER_TOKEN`, or the file `GPULEDGER_TOKEN_FILE` names.
fn client_token() -> anyhow::Result<Option<String>> {
    if let Ok(t) = std::env::var("GPULEDGER_TOKEN") {
        return Ok(Some(t.trim().to_owned()));
    }
    std::env::var_os("GPULEDGER_TOKEN_FILE")
        .map(|p| gpuledger_service::read_token_file(std::path::Path::new(&p)))
        .transpose()
        .map_err(Into::into)
}

/// What the client trusts of an `https://` scheduler: the CAs in `GPULEDGER_CA_FILE`, or the
/// Mozilla roots.
fn client_tls() -> anyhow::Result<ureq::tls::TlsConfig> {
    Ok(gpuledger_service::ClientTlsArgs {
        ca_file: std::env::var_os("GPULEDGER_CA_FILE").map(Into::into),
    }
    .config()?)
}

/// One API call; a 4xx/5xx becomes an error carrying the service's message.
fn request(method: &str, url: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(client_tls()?)
        .build()
        .new_agent();
    let bearer = client_token()?.map(|t| format!("Bearer {t}"));
    let auth = |r: ureq::RequestBuilder<ureq::typestate::WithBody>| match &bearer {
        Some(b) => r.header("authorization", b),
        None => r,
    };
    let auth_get = |r: ureq::RequestBuilder<ureq::typestate::WithoutBody>| match &bearer {
        Some(b) => r.header("authorization", b),
        None => r,
    };
    let mut response = match (method, body) {
        ("POST", Some(body)) => auth(agent.post(url))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes()),
        ("POST", None) => auth(agent.post(url)).send_empty(),
        ("DELETE", _) => auth_get(agent.delete(url)).call(),
        _ => auth_get(agent.get(url)).call(),
    }
    .with_context(|| format!("{method} {url}: is `gpuledger scheduler serve` running?"))?;
    let status = response.status();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !status.is_success() {
        let field = value["error"]["field"].as_str();
        let message = value["error"]["message"].as_str().unwrap_or(&text);
        match field {
            Some(f) => anyhow::bail!("{status}: `{f}`: {message}"),
            None => anyhow::bail!("{status}: {message}"),
        }
    }
    Ok(value)
}

fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    let mut body = json!({
        "command": args.command.join(" "),
        "account": args.account,
        "gpus": args.gpus,
        "time_limit": args.time_limit,
    });
    for (key, value) in [
        ("project", args.project),
        ("partition", args.partition),
        ("grace", args.grace),
        ("checkpoint_signal", args.checkpoint_signal),
        ("checkpoint_every", args.checkpoint_every),
    ] {
        if let Some(v) = value {
            body[key] = json!(v);
        }
    }
    for (key, value) in [
        ("min_gpus", args.min_gpus),
        ("gpus_per_node", args.gpus_per_node),
        ("nodes", args.nodes),
    ] {
        if let Some(v) = value {
            body[key] = json!(v);
        }
    }
    if !args.gpu_type.is_empty() {
        body["gpu_types"] = json!(args.gpu_type);
    }
    if let Some(share) = &args.gpu_share {
        body["gpu_share"] = json!(share);
    }
    let mut env = serde_json::Map::new();
    for pair in &args.export {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--export `{pair}`: expected NAME=VALUE"))?;
        env.insert(name.to_owned(), json!(value));
    }
    if !env.is_empty() {
        body["env"] = Value::Object(env);
    }
    let reply = request("POST", &format!("{}/api/v1/jobs", args.url), Some(body))?;
    println!("Submitted job {}", reply["job_id"].as_str().unwrap_or("?"));
    Ok(())
}

fn time(s: Option<i64>) -> String {
    s.and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

fn queue(url: &str, states: &[String], list: &ListOptions) -> anyhow::Result<()> {
    let reply: QueueReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/queue"), None)?)
            .context("the scheduler's queue reply")?;
    for s in states {
        if !["pending", "running", "preempting"].contains(&s.as_str()) {
            anyhow::bail!("--state `{s}`: the queue holds pending, running and preempting jobs (`jobs` lists the rest)");
        }
    }
    let rows: Vec<&JobInfo> = reply
        .jobs
        .iter()
        .filter(|j| {
            list.account.is_empty() || list.account.iter().any(|a| a == j.request.account.as_str())
        })
        .filter(|j| states.is_empty() || states.iter().any(|s| s == j.state.as_str()))
        .collect();
    print_rows(
        &rows,
        JOB_COLUMNS,
        &[
            "jobid",
            "partition",
            "account",
            "state",
            "gpus",
            "start",
            "est_start",
            "nodelist_reason",
        ],
        list,
        "jobs",
    )
}

fn jobs(
    url: &str,
    states: &[String],
    since: Option<&str>,
    limit: usize,
    list: &ListOptions,
) -> anyhow::Result<()> {
    let mut query = vec![format!("limit={limit}")];
    if !list.account.is_empty() {
        query.push(format!("account={}", list.account.join(",")));
    }
    if !states.is_empty() {
        query.push(format!("state={}", states.join(",")));
    }
    if let Some(s) = since {
        query.push(format!(
            "since={}",
            since_seconds(s, chrono::Utc::now().timestamp())?
        ));
    }
    let reply: QueueReply = serde_json::from_value(request(
        "GET",
        &format!("{url}/api/v1/jobs?{}", query.join("&")),
        None,
    )?)
    .context("the scheduler's jobs reply")?;
    let rows: Vec<&JobInfo> = reply.jobs.iter().collect();
    print_rows(
        &rows,
        JOB_COLUMNS,
        &[
            "jobid",
            "account",
            "partition",
            "state",
            "gpus",
            "submit",
            "start",
            "end",
            "elapsed",
            "exit_code",
        ],
        list,
        "jobs",
    )
}

fn priority(url: &str, list: &ListOptions) -> anyhow::Result<()> {
    let reply: PriorityReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/priority"), None)?)
            .context("the scheduler's priority reply")?;
    let rows: Vec<&PriorityRow> = reply
        .jobs
        .iter()
        .filter(|p| list.account.is_empty() || list.account.contains(&p.account))
        .collect();
    print_rows(
        &rows,
        PRIORITY_COLUMNS,
        &[
            "jobid",
            "account",
            "tier",
            "priority",
            "fairshare",
            "age",
            "jobsize",
            "quota",
            "relief",
            "standing",
        ],
        list,
        "jobs",
    )
}

fn share(url: &str, list: &ListOptions) -> anyhow::Result<()> {
    let reply: ShareReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/share"), None)?)
            .context("the scheduler's share reply")?;
    let rows: Vec<&ShareRow> = reply
        .accounts
        .iter()
        .filter(|a| list.account.is_empty() || list.account.contains(&a.account))
        .collect();
    print_rows(
        &rows,
        SHARE_COLUMNS,
        &[
            "account",
            "weight",
            "normshares",
            "gpu_hours",
            "fairshare",
            "running",
            "pending",
        ],
        list,
        "accounts",
    )
}
