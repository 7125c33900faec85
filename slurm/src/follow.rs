//! Following a Slurm cluster (`gpuledger slurm follow`): it and posts its jobs' lifecycle to the
//! aggregator as job events (submitted, started with its GPUs, preempted or requeued, finished
//! with its outcome), so queue wait, success rate and allocation billing work on a cluster
//! that Slurm schedules.
//!
//! Each poll reads what is asked for: `squeue` and `scontrol -d -o show job` (pending and
//! running jobs, and ended ones for `MinJobAge`, with their GPUs and GPU indices), the new
//! lines of the `jobcomp/filetxt` log, and `sacct --parsable2` where slurmdbd runs. The
//! readings are merged per job and turned into events by `gpuledger_adapters`' tracker, which
//! remembers what it sent. The state file holds the tracker, the log offset and an outbox of
//! numbered batches: a batch is saved before it is posted and posted again, with the same
//! number, until the aggregator takes it, so a crash neither loses nor doubles an event. A
//! batch the aggregator refuses for good (events naming what its cluster config lacks) is set
//! aside in `STATE_FILE.refused/<seq>.json` with the answer, and the next one goes out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpuledger_adapters::slurm::jobs::{
    merge_readings, parse_jobcomp, parse_sacct, parse_scontrol, parse_squeue, AccountMap, SlurmJob,
    Tracker, SQUEUE_FORMAT,
};
use gpuledger_adapters::slurm::Zone;
use gpuledger_model::job::JobEvent;
use serde::{Deserialize, Serialize};

use gpuledger_model::event_json::{refusal_is_final, set_aside, EventBatch, EVENTS_PATH};
use gpuledger_model::units::DurationSpecMs;

use crate::{Error, Result};

/// Options of the follower.
#[derive(clap::Args, Debug, Clone)]
pub struct FollowOptions {
    /// The aggregator's base URL.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_URL")]
    pub aggregator: String,
    /// A file holding an operator token for the aggregator, when it runs with --tokens.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    pub aggregator_token_file: Option<PathBuf>,
    /// Read `squeue` and `scontrol -d -o show job` each poll (GPU counts and indices; ended
    /// jobs stay visible for slurm.conf's MinJobAge, 300 s by default: poll more often).
    #[arg(long)]
    pub squeue: bool,
    /// Read the new lines of this job-completion log (`JobCompType=jobcomp/filetxt`,
    /// `JobCompLoc=`) each poll.
    #[arg(long)]
    pub jobcomp: Option<PathBuf>,
    /// Read `sacct --parsable2` each poll (needs slurmdbd; GPUs come from AllocTRES when
    /// AccountingStorageTRES has gres/gpu), jobs of the last `--sacct-window`.
    #[arg(long)]
    pub sacct: bool,
    #[arg(long, default_value = "2d")]
    pub sacct_window: gpuledger_model::units::DurationSpec,
    /// Which gpuledger account and project each Slurm account books to (from `gpuledger
    /// import slurm-assoc --account-map`); other Slurm accounts are accounts of their own.
    #[arg(long)]
    pub account_map: Option<PathBuf>,
    /// Where the follower keeps what it sent (created when missing).
    #[arg(long, default_value = "./gpuledger-slurm-state.json")]
    pub state_file: PathBuf,
    /// The source name events carry (one per Slurm cluster).
    #[arg(long, default_value = "slurm", value_parser = parse_source)]
    pub source: String,
    /// Time between polls.
    #[arg(long, default_value = "10s")]
    pub interval: DurationSpecMs,
    /// Poll once, post, and exit.
    #[arg(long)]
    pub once: bool,
    /// The zone Slurm writes times in: `local` (the host's, Slurm's default) or `utc`.
    #[arg(long, default_value = "local", value_parser = ["local", "utc"])]
    pub slurm_time_zone: String,
    #[command(flatten)]
    pub client_tls: gpuledger_service::ClientTlsArgs,
}

/// What the follower keeps between polls and restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct FollowState {
    tracker: Tracker,
    /// Byte offset read so far in the jobcomp log, and its size then (a smaller file was
    /// rotated: start again from 0).
    jobcomp_offset: u64,
    /// The next batch number.
    next_seq: u64,
    /// Batches saved but not yet taken by the aggregator.
    outbox: Vec<(u64, Vec<JobEvent>)>,
}

fn load_state(path: &Path) -> Result<FollowState> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| Error::State(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FollowState::default()),
        Err(e) => Err(Error::io(format!("reading {}", path.display()))(e)),
    }
}

fn save_state(path: &Path, state: &FollowState) -> Result<()> {
    let text = serde_json::to_vec_pretty(state)
        .map_err(|e| Error::State(format!("{}: {e}", path.display())))?;
    gpuledger_model::durable::replace_file(path, &text)
        .map_err(Error::io(format!("writing {}", path.display())))
}

/// Runs one of Slurm's commands; its standard output.
pub fn run_command(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(format!(
            "running {program}: is Slurm's client installed and on PATH?"
        )))?;
    if !out.status.success() {
        return Err(Error::Slurm(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The new complete lines of the jobcomp log since `offset`; the offset after them.
fn read_new_lines(path: &Path, offset: u64) -> Result<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let reading = || Error::io(format!("reading {}", path.display()));
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), 0)),
        Err(e) => return Err(reading()(e)),
    };
    let len = f.metadata().map_err(reading())?.len();
    let start = if len < offset { 0 } else { offset };
    f.seek(SeekFrom::Start(start)).map_err(reading())?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(reading())?;
    // A line still being written waits for the next poll.
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    text.truncate(complete);
    Ok((text, start + complete as u64))
}

/// One poll: the readings asked for, merged.
fn poll(args: &FollowOptions, state: &mut FollowState) -> Result<Vec<SlurmJob>> {
    let zone = if args.slurm_time_zone == "utc" {
        Zone::Utc
    } else {
        Zone::Local
    };
    let mut readings = Vec::new();
    if args.squeue {
        // squeue's fields hold no text of the job's owner, so its reading goes first and
        // scontrol's (whose lines carry the job's name and paths) only adds what squeue lacks:
        // the GPU indices on each node.
        let text = run_command(
            "squeue",
            &[
                "--noheader",
                "--states=all",
                &format!("--format={SQUEUE_FORMAT}"),
            ],
        )?;
        readings.push(parse_squeue(&text, "squeue", zone)?);
        let text = run_command("scontrol", &["-d", "-o", "show", "job"])?;
        readings.push(parse_scontrol(&text, "scontrol -d -o show job", zone)?);
    }
    if args.sacct {
        let since =
            chrono::Utc::now() - chrono::Duration::seconds(args.sacct_window.as_secs() as i64);
        let text = run_command(
            "sacct",
            &[
                "--parsable2",
                "--allocations",
                "--allusers",
                &format!("--starttime={}", since.format("%Y-%m-%dT%H:%M:%S")),
                "--format=JobID,Account,User,Partition,Submit,Start,End,State,ExitCode,AllocTRES,NodeList,Timelimit",
            ],
        )?;
        readings.push(parse_sacct(&text, "sacct", zone)?);
    }
    if let Some(path) = &args.jobcomp {
        let (text, offset) = read_new_lines(path, state.jobcomp_offset)?;
        readings.push(parse_jobcomp(&text, &path.display().to_string(), zone)?);
        state.jobcomp_offset = offset;
    }
    Ok(merge_readings(&readings))
}

fn parse_source(text: &str) -> std::result::Result<String, String> {
    gpuledger_model::event_json::check_source(text).map(|()| text.to_owned())
}

/// What became of a posted batch.
enum Posted {
    Stored,
    /// Refused for good ([`refusal_is_final`]): the status and the answer.
    Refused(u16, String),
}

fn post(
    agent: &ureq::Agent,
    args: &FollowOptions,
    token: Option<&str>,
    batch: &EventBatch,
) -> Result<Posted> {
    let body = serde_json::to_string(batch)
        .map_err(|e| Error::Aggregator(format!("encoding events: {e}")))?;
    let url = format!("{}{EVENTS_PATH}", args.aggregator.trim_end_matches('/'));
    let mut request = agent.post(&url).header("content-type", "application/json");
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let mut response = request
        .send(body.as_bytes())
        .map_err(|e| Error::Aggregator(format!("{url}: {e}")))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    match status {
        200..=299 => Ok(Posted::Stored),
        _ if refusal_is_final(status) => Ok(Posted::Refused(status, text)),
        _ => Err(Error::Aggregator(format!(
            "the aggregator answered {status}: {text}"
        ))),
    }
}

/// Where batches the aggregator refused for good are kept: beside the state file.
fn refused_dir(state_file: &Path) -> PathBuf {
    let mut name = state_file.as_os_str().to_owned();
    name.push(".refused");
    PathBuf::from(name)
}

/// Follows the cluster until SIGTERM or Ctrl-C (or one poll with `--once`).
pub fn follow(args: FollowOptions) -> Result<()> {
    if !args.squeue && !args.sacct && args.jobcomp.is_none() {
        return Err(Error::Usage(
            "nothing to follow: give --squeue, --sacct and/or --jobcomp FILE".into(),
        ));
    }
    let token = args
        .aggregator_token_file
        .as_deref()
        .map(gpuledger_service::read_token_file)
        .transpose()?;
    let accounts = match &args.account_map {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(Error::io(format!("reading {}", p.display())))?;
            AccountMap::parse(&text, &p.display().to_string())?
        }
        None => AccountMap::default(),
    };
    let mut state = load_state(&args.state_file)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(args.client_tls.config()?)
        .build()
        .into();
    let stop = gpuledger_service::stop_flag()?;
    gpuledger_service::announce(&format!(
        "gpuledger slurm follow: posting to {} as source `{}`",
        args.aggregator, args.source
    ));
    loop {
        match poll(&args, &mut state) {
            Ok(jobs) => {
                let now_ms = chrono::Utc::now().timestamp_millis();
                let mut events = Vec::new();
                for job in &jobs {
                    match state.tracker.update(job, &accounts, now_ms) {
                        Ok(mut e) => {
                            if e.iter().any(|e| {
                                e.gpus == Some(0)
                                    && e.kind == gpuledger_model::job::JobEventKind::Started
                            }) {
                                tracing::warn!(job = %job.job_id, "job ran but no reading gave its GPUs (poll faster than MinJobAge, or set AccountingStorageTRES=gres/gpu for sacct): booked without GPUs");
                            }
                            events.append(&mut e);
                        }
                        Err(skipped) => {
                            tracing::warn!(job = %skipped.job_id, why = %skipped.why, "job skipped")
                        }
                    }
                }
                if !events.is_empty() {
                    let seq = state.next_seq;
                    state.next_seq += 1;
                    state.outbox.push((seq, events));
                }
                let shown: std::collections::BTreeSet<String> =
                    jobs.iter().map(|j| j.job_id.clone()).collect();
                state.tracker.forget_finished_except(&shown);
                // Saved before posting: a crash now re-posts the same numbered batches.
                save_state(&args.state_file, &state)?;
            }
            Err(error) => {
                tracing::error!(%error, "poll failed; trying again next time")
            }
        }
        while let Some((seq, events)) = state.outbox.first().cloned() {
            let batch = EventBatch::of(&args.source, seq, &events);
            match post(&agent, &args, token.as_deref(), &batch) {
                Ok(Posted::Stored) => {
                    tracing::info!(seq, events = events.len(), "events delivered");
                }
                Ok(Posted::Refused(status, answer)) => {
                    // Sending it again cannot succeed; holding it would hold every later batch.
                    let path = set_aside(&refused_dir(&args.state_file), &batch, status, &answer)
                        .map_err(Error::io("setting a refused batch aside"))?;
                    tracing::error!(seq, events = events.len(), status, %answer, path = %path.display(), "the aggregator refused a batch of job events; it is set aside (mend it or the cluster config and post it again)");
                }
                Err(error) => {
                    tracing::warn!(seq, %error, "events not delivered; will retry");
                    break;
                }
            }
            state.outbox.remove(0);
            save_state(&args.state_file, &state)?;
        }
        if args.once {
            if !state.outbox.is_empty() {
                return Err(Error::Aggregator(format!(
                    "{} batch(es) not delivered; they stay in {}",
                    state.outbox.len(),
                    args.state_file.display()
                )));
            }
            return Ok(());
        }
        let until = std::time::Instant::now() + args.interval.0;
        while std::time::Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                gpuledger_service::announce("gpuledger slurm follow stopped; state saved");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobcomp_log_is_read_a_complete_line_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("jobcomp.txt");
        std::fs::write(&log, "JobId=1 JobState=COMPLETED\nJobId=2 Job").unwrap();
        let (text, offset) = read_new_lines(&log, 0).unwrap();
        assert_eq!(text, "JobId=1 JobState=COMPLETED\n");
        std::fs::write(
            &log,
            "JobId=1 JobState=COMPLETED\nJobId=2 JobState=FAILED\n",
        )
        .unwrap();
        let (text, offset) = read_new_lines(&log, offset).unwrap();
        assert_eq!(text, "JobId=2 JobState=FAILED\n");
        std::fs::write(&log, "JobId=3 JobState=FAILED\n").unwrap();
        let (text, _) = read_new_lines(&log, offset).unwrap();
        assert_eq!(
            text, "JobId=3 JobState=FAILED\n",
            "a rotated log starts again"
        );
    }
}
