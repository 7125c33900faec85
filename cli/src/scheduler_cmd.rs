//! `gpuledger scheduler`: the live service (`serve`) and its command-line client (`submit`,
//! `cancel`, `queue`, `share`, `reserve`, `unreserve`, `nodes`, `drain`, `resume`), which speak
//! its HTTP API as `sbatch`, `scancel`, `squeue`, `sshare`, `scontrol create reservation`,
//! `sinfo` and `scontrol update nodename=... state=drain|resume` would.

use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use gpuledger_schedd::http::{NodesReply, QueueReply, ShareReply};
use gpuledger_schedd::serve::ServeOptions;
use gpuledger_schedd::state::JobState;

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
        #[arg(long, default_value = DEFAULT_URL, env = "GPULEDGER_SCHEDULER")]
        url: String,
    },
    /// Fair share per account (as sshare).
    Share {
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
        SchedulerCommand::Queue { url } => queue(&url),
        SchedulerCommand::Share { url } => share(&url),
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
                format!("{}/{}", n.allocated_gpus, n.gpus),
                time(n.since_s),
                n.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(&["NODE", "STATE", "GPUS(A/T)", "SINCE", "REASON"], &rows)
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
    if let Some(min) = args.min_gpus {
        body["min_gpus"] = json!(min);
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

fn queue(url: &str) -> anyhow::Result<()> {
    let reply: QueueReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/queue"), None)?)
            .context("the scheduler's queue reply")?;
    let rows: Vec<Vec<String>> = reply
        .jobs
        .iter()
        .map(|j| {
            let pending = j.state == JobState::Pending;
            let or_dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
            vec![
                j.id.to_string(),
                or_dash(j.request.partition.as_deref()),
                j.request.account.to_string(),
                j.state.as_str().to_owned(),
                j.request.gpus.to_string(),
                time(j.start_s),
                if pending {
                    time(j.estimated_start_s)
                } else {
                    "-".into()
                },
                if pending {
                    or_dash(j.reason.as_deref())
                } else {
                    or_dash(j.allocation.as_deref())
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "JOBID",
                "PARTITION",
                "ACCOUNT",
                "STATE",
                "GPUS",
                "START",
                "EST_START",
                "NODELIST(REASON)"
            ],
            &rows
        )
    );
    Ok(())
}

fn share(url: &str) -> anyhow::Result<()> {
    let reply: ShareReply =
        serde_json::from_value(request("GET", &format!("{url}/api/v1/share"), None)?)
            .context("the scheduler's share reply")?;
    let rows: Vec<Vec<String>> = reply
        .accounts
        .iter()
        .map(|a| {
            vec![
                a.account.clone(),
                a.weight.to_string(),
                format!("{:.3}", a.norm_shares),
                format!("{:.1}", a.decayed_gpu_hours),
                format!("{:.3}", a.fair_share),
                a.running_gpus.to_string(),
                a.pending_jobs.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "ACCOUNT",
                "WEIGHT",
                "NORMSHARES",
                "GPU-HOURS",
                "FAIRSHARE",
                "RUNNING",
                "PENDING"
            ],
            &rows
        )
    );
    Ok(())
}
