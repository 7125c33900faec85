//! `gpuledger slurm steer`: measured usage steers Slurm. Each pass reads Slurm's queue
//! (`squeue --json`) and each pending job's site factor (`sprio`), gpuledger's usage feed (an
//! operator token), and then, for the jobs of the config's accounts:
//!
//! - sets each pending job's fair-share factor, computed from the feed's decayed GPU-hours
//!   with the very function gpuledger's scheduler ranks accounts with (the accounts below their
//!   share of the cluster now first: of the config's GPUs, or without one of the GPUs `sinfo`
//!   shows), as its `SiteFactor` (or, with `--target priority`, its whole `Priority`), where
//!   it moved;
//! - holds (`scontrol hold`, reason in the job's comment) a pending job whose account or
//!   project would pass its GPU-hours per day or week by starting, decided as gpuledger's
//!   scheduler decides (used + what running jobs may still use today + the job's today), and
//!   releases it, its comment put back, once the window has room.
//!
//! It never touches a job it did not hold, and a job it held that an operator released stays
//! released. The state file makes a crash between saying and doing safe ([`state`]). The
//! decisions are pure ([`decide`]); this module runs the commands.

pub mod decide;
pub mod state;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gpuledger_adapters::slurm::jobs::AccountMap;
use gpuledger_adapters::slurm::queue::{parse_squeue_json, QueuedJob};
use gpuledger_adapters::slurm::{cluster_gpus, SINFO_GPUS_ARGS};
use gpuledger_model::config::ClusterConfig;
use gpuledger_model::units::DurationSpecMs;
use gpuledger_model::usage::{UsageFeed, USAGE_PATH};

use self::decide::{Action, Policy, Settings, Target, COMMENT_PREFIX};
use self::state::{HeldJob, Phase, SteerState};
use crate::follow::run_command;
use crate::{Error, Result};

/// Options of the steering loop.
#[derive(clap::Args, Debug, Clone)]
pub struct SteerOptions {
    /// The aggregator's base URL (its usage feed).
    #[arg(long, env = "GPULEDGER_AGGREGATOR_URL")]
    pub aggregator: String,
    /// A file holding an operator token for the aggregator, when it runs with --tokens (the
    /// feed of every account needs an operator).
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    pub aggregator_token_file: Option<PathBuf>,
    /// The cluster config: accounts, weights, quotas, the fair-share formula and the cluster's
    /// GPUs. Slurm accounts it does not name (all of them, without it) are steered with weight 1
    /// and no quota; without it the cluster's GPUs are those `sinfo` shows.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Which gpuledger account and project each Slurm account books to (from `gpuledger
    /// import slurm-assoc --account-map`); other Slurm accounts are accounts of their own.
    #[arg(long)]
    pub account_map: Option<PathBuf>,
    /// Where the loop keeps the jobs it held (created when missing).
    #[arg(long, default_value = "./gpuledger-steer-state.json")]
    pub state_file: PathBuf,
    /// Time between passes.
    #[arg(long, default_value = "30s")]
    pub interval: DurationSpecMs,
    /// One pass, then exit.
    #[arg(long)]
    pub once: bool,
    /// Print what one pass would change, change nothing (the state file included).
    #[arg(long)]
    pub dry_run: bool,
    /// Decide as of this time (RFC 3339 or Unix seconds) instead of now: what a pass would do
    /// after midnight, say. Only with --once or --dry-run.
    #[arg(long)]
    pub at: Option<String>,
    /// Where the fair-share factor goes: `site-factor` (PriorityType=priority/multifactor adds
    /// it to Slurm's own terms) or `priority` (replaces the job's priority).
    #[arg(long, value_enum, default_value = "site-factor")]
    pub target: Target,
    /// What a factor of 1 becomes: set it beside your PriorityWeight* values.
    #[arg(long, default_value = "10000", value_parser = clap::value_parser!(u32).range(1..=1_000_000_000))]
    pub weight: u32,
    /// Leave priorities alone (quotas only).
    #[arg(long)]
    pub no_fair_share: bool,
    /// Leave GPU-hour quotas alone (priorities only).
    #[arg(long)]
    pub no_quotas: bool,
    #[command(flatten)]
    pub client_tls: gpuledger_service::ClientTlsArgs,
}

/// The time `--at` names, in Unix seconds.
fn parse_at(text: &str) -> Result<i64> {
    gpuledger_model::time::parse_instant_s(text).map_err(|e| Error::Usage(format!("--at {e}")))
}

fn load_config(path: &std::path::Path) -> Result<ClusterConfig> {
    let text =
        std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    ClusterConfig::from_toml_str(&text, &path.display().to_string())
        .map_err(|e| Error::Usage(e.to_string()))
}

/// Everything one pass reads.
struct Reading {
    jobs: Vec<QueuedJob>,
    site_factors: BTreeMap<String, i64>,
    feed: UsageFeed,
    /// The GPUs of Slurm's nodes, read where the policy asks for them.
    cluster_gpus: Option<u64>,
}

struct Steer {
    options: SteerOptions,
    policy: Policy,
    map: AccountMap,
    token: Option<String>,
    agent: ureq::Agent,
    settings: Settings,
}

impl Steer {
    fn feed(&self, at_s: i64) -> Result<UsageFeed> {
        let url = format!(
            "{}{USAGE_PATH}?at={}&half_life={}s",
            self.options.aggregator.trim_end_matches('/'),
            at_s * 1000,
            self.policy.fair_share.half_life.as_secs()
        );
        let mut request = self.agent.get(&url);
        if let Some(t) = &self.token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let mut response = request
            .call()
            .map_err(|e| Error::Aggregator(format!("{url}: {e}")))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            return Err(Error::Aggregator(format!(
                "the usage feed answered {status}: {text}"
            )));
        }
        serde_json::from_str(&text)
            .map_err(|e| Error::Aggregator(format!("the usage feed's answer: {e}")))
    }

    fn read(&self, at_s: i64) -> Result<Reading> {
        let text = run_command("squeue", &["--json"])?;
        let jobs = parse_squeue_json(&text, "squeue --json")?;
        let site_factors = if self.settings.fair_share && self.settings.target == Target::SiteFactor
        {
            let text = run_command("sprio", &["--noheader", "--format=%i %S"]).map_err(|e| {
                Error::Slurm(format!(
                    "{e} (steering by site factor needs PriorityType=priority/multifactor)"
                ))
            })?;
            parse_sprio(&text)?
        } else {
            BTreeMap::new()
        };
        let cluster_gpus = if self.settings.fair_share && self.policy.below_share_of_slurm_gpus {
            let text = run_command("sinfo", &SINFO_GPUS_ARGS)?;
            Some(cluster_gpus(&text, "sinfo").map_err(Error::Slurm)?)
        } else {
            None
        };
        Ok(Reading {
            jobs,
            site_factors,
            feed: self.feed(at_s)?,
            cluster_gpus,
        })
    }

    /// Runs one action; the state is saved before a hold or release starts and after it ends.
    fn act(&self, action: &Action, state: &mut SteerState) -> Result<()> {
        let path = &self.options.state_file;
        let update = |job: &str, field: &str, value: &str| {
            run_command(
                "scontrol",
                &[
                    "update",
                    &format!("JobId={job}"),
                    &format!("{field}={value}"),
                ],
            )
        };
        match action {
            Action::Set { job, value, .. } => {
                let field = match self.settings.target {
                    Target::SiteFactor => "SiteFactor",
                    Target::Priority => "Priority",
                };
                update(job, field, &value.to_string())?;
            }
            Action::Hold {
                job,
                reason,
                comment,
                ..
            } => {
                let mut held = HeldJob {
                    reason: (*reason).to_owned(),
                    comment: comment.clone(),
                    phase: Phase::Holding,
                };
                state.holds.insert(job.clone(), held.clone());
                state.save(path)?;
                run_command("scontrol", &["hold", job])?;
                update(job, "Comment", &format!("{COMMENT_PREFIX}{reason}"))?;
                held.phase = Phase::Held;
                state.holds.insert(job.clone(), held);
                state.save(path)?;
            }
            Action::Release { job, comment } => {
                if let Some(h) = state.holds.get_mut(job) {
                    h.phase = Phase::Releasing;
                }
                state.save(path)?;
                update(job, "Comment", comment)?;
                run_command("scontrol", &["release", job])?;
                state.holds.remove(job);
                state.save(path)?;
            }
            Action::Overridden { job, comment } => {
                if let Some(c) = comment {
                    update(job, "Comment", c)?;
                }
                state.holds.remove(job);
                state.overridden.insert(job.clone());
                state.save(path)?;
            }
        }
        Ok(())
    }

    /// One pass: read, decide, act (or print, in a dry run).
    fn pass(&self, state: &mut SteerState, now_s: i64) -> Result<Vec<Action>> {
        let reading = self.read(now_s)?;
        let policy = match reading.cluster_gpus {
            Some(gpus) => std::borrow::Cow::Owned(self.policy.with_slurm_gpus(gpus)),
            None => std::borrow::Cow::Borrowed(&self.policy),
        };
        decide::note_limits(state, &reading.jobs, now_s);
        let actions = decide::decide(
            &reading.jobs,
            &reading.site_factors,
            &decide::Known {
                feed: &reading.feed,
                map: &self.map,
                policy: &policy,
            },
            state,
            self.settings,
            now_s,
        );
        if self.options.dry_run {
            for a in &actions {
                gpuledger_service::announce(&describe(a, self.settings.target));
            }
            return Ok(actions);
        }
        for a in &actions {
            match self.act(a, state) {
                Ok(()) => tracing::info!(action = %describe(a, self.settings.target), "steered"),
                Err(error) => {
                    // A job that ended meanwhile, say: the next pass sees what is left.
                    tracing::warn!(action = %describe(a, self.settings.target), %error, "not done")
                }
            }
        }
        decide::apply(state, &[], &reading.jobs);
        state.save(&self.options.state_file)?;
        Ok(actions)
    }
}

/// `sprio --noheader --format=%i %S`: each pending job's site factor.
fn parse_sprio(text: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        match cells.as_slice() {
            [] => {}
            [id, site] => {
                let v = site.parse::<i64>().map_err(|_| {
                    Error::Slurm(format!("sprio line {}: site factor `{site}`", i + 1))
                })?;
                out.insert((*id).to_owned(), v);
            }
            _ => {
                return Err(Error::Slurm(format!(
                    "sprio line {}: expected `JOBID SITE`, read `{line}`",
                    i + 1
                )))
            }
        }
    }
    Ok(out)
}

/// One action as a line for people.
pub fn describe(action: &Action, target: Target) -> String {
    let field = match target {
        Target::SiteFactor => "SiteFactor",
        Target::Priority => "Priority",
    };
    match action {
        Action::Set {
            job,
            account,
            value,
            was,
        } => match was {
            Some(w) => format!("job {job} ({account}): {field} {w} -> {value}"),
            None => format!("job {job} ({account}): {field} -> {value}"),
        },
        Action::Hold {
            job,
            account,
            reason,
            ..
        } => format!("job {job} ({account}): hold ({reason})"),
        Action::Release { job, .. } => format!("job {job}: release (the quota window has room)"),
        Action::Overridden { job, .. } => {
            format!("job {job}: released by someone else; left alone from now on")
        }
    }
}

/// Steers until SIGTERM or Ctrl-C (or for one pass with `--once` or `--dry-run`).
pub fn steer(options: SteerOptions) -> Result<()> {
    let at = options.at.as_deref().map(parse_at).transpose()?;
    if at.is_some() && !options.once && !options.dry_run {
        return Err(Error::Usage(
            "--at fixes the time: give it with --once or --dry-run".into(),
        ));
    }
    if options.no_fair_share && options.no_quotas {
        return Err(Error::Usage(
            "--no-fair-share and --no-quotas together leave nothing to do".into(),
        ));
    }
    let policy = match &options.config {
        Some(path) => Policy::from_config(&load_config(path)?),
        None => Policy::without_config(),
    };
    let map = match &options.account_map {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(Error::io(format!("reading {}", p.display())))?;
            AccountMap::parse(&text, &p.display().to_string())?
        }
        None => AccountMap::default(),
    };
    let token = options
        .aggregator_token_file
        .as_deref()
        .map(gpuledger_service::read_token_file)
        .transpose()?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(options.client_tls.config()?)
        .build()
        .into();
    let settings = Settings {
        target: options.target,
        weight: options.weight,
        fair_share: !options.no_fair_share,
        quotas: !options.no_quotas,
    };
    let steer = Steer {
        policy,
        map,
        token,
        agent,
        settings,
        options,
    };
    let mut state = SteerState::load(&steer.options.state_file)?;
    let now = || at.unwrap_or_else(|| chrono::Utc::now().timestamp());
    if steer.options.once || steer.options.dry_run {
        steer.pass(&mut state, now())?;
        return Ok(());
    }
    let stop = gpuledger_service::stop_flag()?;
    gpuledger_service::announce(&format!(
        "gpuledger slurm steer: usage from {}, every {:?}",
        steer.options.aggregator, steer.options.interval.0
    ));
    loop {
        if let Err(error) = steer.pass(&mut state, now()) {
            // Without a reading nothing is decided: no hold, no release on stale figures.
            tracing::error!(%error, "pass failed; trying again next time");
        }
        let until = std::time::Instant::now() + steer.options.interval.0;
        while std::time::Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                gpuledger_service::announce("gpuledger slurm steer stopped; state saved");
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
    fn sprio_lines_are_read_and_a_bad_one_is_named() {
        let f = parse_sprio("  12 5000\n13 0\n\n").unwrap();
        assert_eq!(f["12"], 5000);
        assert_eq!(f["13"], 0);
        let e = parse_sprio("12 x\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn at_takes_rfc3339_or_unix_seconds() {
        assert_eq!(parse_at("86400").unwrap(), 86_400);
        assert_eq!(parse_at("1970-01-02T00:00:00Z").unwrap(), 86_400);
        assert!(parse_at("tomorrow").is_err());
    }
}
