//! `gpuledger bench submit`: submissions to a real scheduler process over loopback, each
//! answered only once the journal holding it is written and flushed. Every node is drained
//! first, so the queue only grows (the worst case of a sweep script); with `--busy` every node
//! runs an 8-GPU `sleep` job instead, so the waiting jobs get planned starts at those jobs'
//! time limits, as on a full cluster (the jobs are cancelled at the end). Reports submissions per
//! second and latency percentiles over the whole run and over its last tenth, the scheduler's
//! CPU share meanwhile, and the state file's size at the end.
//!
//! With `--waiting N` that many jobs are queued first (not measured), and with `--pace` each
//! client waits between its submissions: the scheduling cycles then run beside a steady trickle
//! of requests against a deep queue, and whatever a cycle holds the service's lock for shows in
//! the tail.
//!
//! `--binary` measures another build's scheduler (one from before a change) in the same run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpuledger_model::stats::percentile;

use gpuledger_schedd::state::{JobInfo, JobState};

use crate::process::{cpu_seconds_of, spawn, stop};

/// What `bench submit` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct SubmitArgs {
    /// Jobs submitted in all.
    #[arg(long, default_value_t = 2000)]
    pub jobs: usize,
    /// Clients submitting at once, each one after another.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// The gpuledger binary whose scheduler is measured (default: this one).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Jobs queued before the measured submissions, as fast as eight clients go.
    #[arg(long, default_value_t = 0)]
    pub waiting: usize,
    /// Each client's wait between two measured submissions (`50ms`; none by default).
    #[arg(long)]
    pub pace: Option<gpuledger_model::units::DurationSpecMs>,
    /// Fill every node with a running 8-GPU `sleep` job instead of draining it.
    #[arg(long)]
    pub busy: bool,
}

const NODES: usize = 16;

fn cluster_config() -> String {
    // A scheduler running as root runs an account's jobs only as a user it is told.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    let run_as = if root {
        "run_as = { user = \"root\" }\n"
    } else {
        ""
    };
    format!(
        "version = 1\n[cluster]\nname = \"bench\"\n[[node_pools]]\nname = \"p\"\nprefix = \"gpu\"\n\
         count = {NODES}\ngpus_per_node = 8\ngpu_model = \"h100-sxm\"\n[[partitions]]\n\
         name = \"train\"\npriority_tier = 20\ndefault = true\n[scheduler]\n\
         max_submit_jobs = 1000000\n[prices]\nversion = \"v\"\n\
         effective_from = \"2026-01-01\"\ncurrency = \"USD\"\ngpu_hour = {{ h100-sxm = \"1\" }}\n\
         [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\n{run_as}"
    )
}

/// Posts `body` as JSON; the reply's body.
fn post(agent: &ureq::Agent, url: &str, body: &str) -> anyhow::Result<String> {
    let reply = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body.as_bytes())?;
    reply_text(url, reply)
}

fn reply_text(url: &str, mut reply: ureq::http::Response<ureq::Body>) -> anyhow::Result<String> {
    let status = reply.status().as_u16();
    let text = reply.body_mut().read_to_string().unwrap_or_default();
    if !(200..300).contains(&status) {
        bail!("{url}: {status} {text}");
    }
    Ok(text)
}

fn drain_every_node(agent: &ureq::Agent, url: &str) -> anyhow::Result<()> {
    for n in 1..=NODES {
        post(
            agent,
            &format!("{url}/api/v1/nodes/gpu{n:03}/drain"),
            "{\"reason\": \"bench\"}",
        )?;
    }
    Ok(())
}

/// One 8-GPU `sleep` job per node, running once this returns: their ids.
fn fill_every_node(agent: &ureq::Agent, url: &str) -> anyhow::Result<Vec<String>> {
    const HOLDER: &str = "{\"command\": \"sleep 100000\", \"account\": \"team-a\", \
                          \"gpus\": 8, \"time_limit\": \"2d\"}";
    let mut ids = Vec::new();
    for _ in 0..NODES {
        let reply: serde_json::Value =
            serde_json::from_str(&post(agent, &format!("{url}/api/v1/jobs"), HOLDER)?)?;
        let id = reply["job_id"]
            .as_str()
            .context("a submission's reply names its job")?;
        ids.push(id.to_owned());
    }
    wait_for_each(agent, url, &ids, "start", |s| s == JobState::Running)?;
    Ok(ids)
}

/// Waits up to a minute for every job of `ids` to be in a state `reached` holds for.
fn wait_for_each(
    agent: &ureq::Agent,
    url: &str,
    ids: &[String],
    what: &str,
    reached: impl Fn(JobState) -> bool,
) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(60);
    for id in ids {
        while !reached(job_state(agent, url, id)?) {
            if Instant::now() > until {
                bail!("job {id} did not {what} within a minute");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn job_state(agent: &ureq::Agent, url: &str, id: &str) -> anyhow::Result<JobState> {
    let url = format!("{url}/api/v1/jobs/{id}");
    let info: JobInfo = serde_json::from_str(&reply_text(&url, agent.get(&url).call()?)?)?;
    Ok(info.state)
}

/// Drains every node (the waiting jobs must not start) and ends the `sleep` jobs.
fn end_holders(agent: &ureq::Agent, url: &str, ids: &[String]) -> anyhow::Result<()> {
    drain_every_node(agent, url)?;
    for id in ids {
        let cancel = format!("{url}/api/v1/jobs/{id}?now=true");
        reply_text(&cancel, agent.delete(&cancel).call()?)?;
    }
    wait_for_each(agent, url, ids, "end after its cancel", JobState::is_done)
}

/// Runs the measurement; the report.
pub fn run(args: &SubmitArgs) -> anyhow::Result<String> {
    if args.jobs == 0 || args.clients == 0 {
        bail!("--jobs and --clients must be at least 1");
    }
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, cluster_config())?;
    let data = dir.path().join("data");
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe()?,
    };
    let service = spawn(
        &binary,
        &[
            "scheduler",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().context("a UTF-8 temporary path")?,
            "--config",
            config.to_str().context("a UTF-8 temporary path")?,
        ],
    )?;
    let url = service.url.clone();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let holders = if args.busy {
        fill_every_node(&agent, &url)?
    } else {
        drain_every_node(&agent, &url)?;
        Vec::new()
    };
    queue_waiting(&agent, &url, args.waiting)?;
    let pid = service.child.id();
    let cpu_before = cpu_seconds_of(pid).unwrap_or(0.0);
    let pace = args.pace.map(|p| p.0);
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.jobs)));
    let began = Instant::now();
    let per_client = args.jobs.div_ceil(args.clients);
    let workers: Vec<_> = (0..args.clients)
        .map(|c| {
            let (agent, url, latencies) = (agent.clone(), url.clone(), Arc::clone(&latencies));
            let count = per_client.min(args.jobs.saturating_sub(c * per_client));
            std::thread::spawn(move || -> anyhow::Result<()> {
                for _ in 0..count {
                    if let Some(pace) = pace {
                        std::thread::sleep(pace);
                    }
                    let sent = Instant::now();
                    post(&agent, &format!("{url}/api/v1/jobs"), JOB)?;
                    let took = sent.elapsed();
                    latencies
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((sent.duration_since(began), took));
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let elapsed = began.elapsed();
    let cpu = cpu_seconds_of(pid).unwrap_or(0.0) - cpu_before;
    if !holders.is_empty() {
        end_holders(&agent, &url, &holders)?;
    }
    stop(service)?;
    let state_bytes = state_size(&data)?;
    let mut all = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    all.sort_by_key(|(sent, _)| *sent);
    let last_tenth: Vec<Duration> = all[all.len() - all.len().div_ceil(10)..]
        .iter()
        .map(|(_, t)| *t)
        .collect();
    let whole: Vec<Duration> = all.iter().map(|(_, t)| *t).collect();
    Ok(format!(
        "{} submissions from {} client(s) in {:.2} s with {} jobs queued before: {:.0} per second\n\
         latency ms, all: {}\nlatency ms, last tenth: {}\n\
         the scheduler's CPU meanwhile: {:.1}% of one core\nstate.json at the end: {:.1} MB\n",
        all.len(),
        args.clients,
        elapsed.as_secs_f64(),
        args.waiting,
        all.len() as f64 / elapsed.as_secs_f64(),
        summary(&whole),
        summary(&last_tenth),
        100.0 * cpu / elapsed.as_secs_f64(),
        state_bytes as f64 / 1e6,
    ))
}

/// Every submission's body: a one-GPU job (the nodes are drained or full, so it only waits).
const JOB: &str =
    "{\"command\": \"true\", \"account\": \"team-a\", \"gpus\": 1, \"time_limit\": \"1h\"}";

/// Queues `count` jobs from eight clients, not measured.
fn queue_waiting(agent: &ureq::Agent, url: &str, count: usize) -> anyhow::Result<()> {
    let clients = 8;
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            let (agent, url) = (agent.clone(), url.to_owned());
            let n = count / clients + usize::from(c < count % clients);
            std::thread::spawn(move || -> anyhow::Result<()> {
                for _ in 0..n {
                    post(&agent, &format!("{url}/api/v1/jobs"), JOB)?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    Ok(())
}

fn summary(latencies: &[Duration]) -> String {
    let mut us: Vec<i64> = latencies.iter().map(|d| d.as_micros() as i64).collect();
    us.sort_unstable();
    let ms = |p: f64| percentile(&us, p).unwrap_or(0) as f64 / 1000.0;
    format!(
        "p50 {:.2}  p99 {:.2}  max {:.2}",
        ms(50.0),
        ms(99.0),
        ms(100.0)
    )
}

fn state_size(data: &Path) -> anyhow::Result<u64> {
    let path = data.join("scheduler").join("state.json");
    Ok(std::fs::metadata(&path)
        .with_context(|| path.display().to_string())?
        .len())
}
