//! What one pass of the steering loop changes in Slurm, from what Slurm shows (its queue and
//! each pending job's site factor), gpuledger's usage feed, the cluster config and what the
//! loop did before. Pure: no command runs here, and the time is an argument.

use std::collections::{BTreeMap, BTreeSet};

use gpuledger_adapters::slurm::jobs::{AccountMap, State};
use gpuledger_adapters::slurm::queue::QueuedJob;
use gpuledger_model::config::{ClusterConfig, FairShareConfig, FairShareFormula, SchedulerConfig};
use gpuledger_model::quota::Quota;
use gpuledger_model::tenant::Account;
use gpuledger_model::usage::{UsageFeed, WindowGpuSeconds};
use gpuledger_model::AccountId;
use gpuledger_scheduler::fairshare::{account_factors, relief_factor, water_fill, Standing};
use gpuledger_scheduler::windows::{day_of, gpu_hours_verdict, DaySpread, DAY_S};
use gpuledger_scheduler::PendingReason;

use super::state::{HeldJob, Phase, SteerState};

/// Where the fair-share factor goes in Slurm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// `scontrol update JobId=N SiteFactor=V`: one term of priority/multifactor's sum, beside
    /// Slurm's own age, fair-share, size, partition and QOS terms.
    SiteFactor,
    /// `scontrol update JobId=N Priority=V`: the job's whole priority, fixed (Slurm stops
    /// computing it).
    Priority,
}

/// How the pass decides.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub target: Target,
    /// The value a factor of 1 becomes (Slurm's priority weights are integers).
    pub weight: u32,
    pub fair_share: bool,
    pub quotas: bool,
}

/// One change to make in Slurm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Set a pending job's site factor or priority.
    Set {
        job: String,
        account: String,
        value: i64,
        was: Option<i64>,
    },
    /// Hold a pending job whose account or project is over a GPU-hour quota, with the reason
    /// in its comment; `comment` is the job's own, put back on release.
    Hold {
        job: String,
        account: String,
        reason: &'static str,
        comment: String,
    },
    /// Release a job this loop held, its own comment put back.
    Release { job: String, comment: String },
    /// A job this loop held was released by someone else: leave it alone from now on.
    Overridden {
        job: String,
        comment: Option<String>,
    },
}

/// The prefix of the comment on a job this loop holds.
pub const COMMENT_PREFIX: &str = "gpuledger: ";

/// The accounts a pass steers, with their weights and quotas, and how it ranks them.
#[derive(Clone, Debug)]
pub struct Policy {
    pub accounts: Vec<Account>,
    pub fair_share: FairShareConfig,
    /// The cluster's GPUs, where accounts holding less than their share of them now rank
    /// first (`[scheduler] below_share_first`, as gpuledger's scheduler ranks them); `None`
    /// ranks by usage alone, unless `below_share_of_slurm_gpus`.
    pub below_share_of_gpus: Option<u64>,
    /// No config: accounts below their share now of the GPUs Slurm's nodes have (`sinfo`, each
    /// pass) rank first, the default of gpuledger's scheduler.
    pub below_share_of_slurm_gpus: bool,
    /// The relief (`[scheduler] relief`, as gpuledger's scheduler lifts jobs): a job pending
    /// for `Priority` or `Resources` and eligible this long gets the lifted factor, where
    /// accounts are ranked by standing (the GPUs above, or Slurm's).
    pub relief: Option<Relief>,
}

/// The relief's settings: how long a job waits, and the floor (percent of an account's share)
/// below which an account still ranks above the lifted jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relief {
    pub after_s: i64,
    pub floor_percent: u32,
}

impl Relief {
    fn of(config: &SchedulerConfig) -> Option<Relief> {
        config.relief.then(|| Relief {
            after_s: config.relief_after.as_secs() as i64,
            floor_percent: config.relief_floor_percent,
        })
    }
}

impl Policy {
    /// The cluster config's accounts and fair share, and its GPUs when it ranks accounts
    /// below their share first.
    pub fn from_config(config: &ClusterConfig) -> Policy {
        Policy {
            accounts: config.accounts.clone(),
            fair_share: config.fair_share.clone(),
            below_share_of_gpus: Some(config.total_gpus())
                .filter(|gpus| config.scheduler.below_share_first && *gpus > 0),
            below_share_of_slurm_gpus: false,
            relief: Relief::of(&config.scheduler),
        }
    }

    /// No config: every Slurm account weighs 1 and has no quota; the default formula, with
    /// the accounts below their share of the GPUs Slurm's nodes have ranked first.
    pub fn without_config() -> Policy {
        Policy {
            accounts: Vec::new(),
            fair_share: FairShareConfig::default(),
            below_share_of_gpus: None,
            below_share_of_slurm_gpus: SchedulerConfig::default().below_share_first,
            relief: Relief::of(&SchedulerConfig::default()),
        }
    }

    /// This policy with the cluster's GPUs as Slurm counts them, where it asks for them.
    pub fn with_slurm_gpus(&self, gpus: u64) -> Policy {
        let mut policy = self.clone();
        if policy.below_share_of_slurm_gpus && gpus > 0 {
            policy.below_share_of_gpus = Some(gpus);
        }
        policy
    }

    /// The policy's accounts and, after them, each Slurm account of `jobs` it does not name as
    /// an account of weight 1 without quotas (Slurm's default `Fairshare=1`). A Slurm account
    /// whose name is no valid gpuledger id is left out (its jobs are left alone).
    fn with_slurm_accounts(&self, jobs: &[QueuedJob], map: &AccountMap) -> Vec<Account> {
        let mut accounts = self.accounts.clone();
        for job in jobs {
            let (name, _) = map.resolve(&job.account);
            if accounts.iter().any(|a| a.id.as_str() == name) {
                continue;
            }
            if let Ok(id) = AccountId::new(&name) {
                accounts.push(Account {
                    id,
                    name,
                    weight: 1,
                    quota: Quota::default(),
                    projects: Vec::new(),
                    run_as: None,
                });
            }
        }
        accounts
    }
}

/// Which gpuledger account and project a Slurm job books to; `None` for an account not
/// steered.
fn owner<'c>(
    job: &QueuedJob,
    map: &AccountMap,
    accounts: &'c [Account],
) -> Option<(&'c Account, Option<String>)> {
    let (account, project) = map.resolve(&job.account);
    let a = accounts.iter().find(|a| a.id.as_str() == account)?;
    Some((a, project))
}

/// What a pass knows besides Slurm: measured usage, the account map and the policy.
#[derive(Clone, Copy, Debug)]
pub struct Known<'a> {
    pub feed: &'a UsageFeed,
    pub map: &'a AccountMap,
    pub policy: &'a Policy,
}

/// Each account's fair-share factor from the feed, with demand as Slurm shows it, and the
/// factor a job of it lifted by the relief takes (`None`: the relief is off, or the accounts
/// are not ranked by standing).
fn factors(
    jobs: &[QueuedJob],
    known: &Known,
    accounts: &[Account],
) -> BTreeMap<String, (f64, Option<f64>)> {
    let Known {
        feed, map, policy, ..
    } = *known;
    let busy: BTreeSet<String> = jobs
        .iter()
        .filter(|j| matches!(j.state, State::Pending | State::Running))
        .filter_map(|j| owner(j, map, accounts).map(|(a, _)| a.id.to_string()))
        .collect();
    let ids: Vec<String> = accounts.iter().map(|a| a.id.to_string()).collect();
    let weights: Vec<f64> = accounts.iter().map(|a| f64::from(a.weight)).collect();
    let usage: Vec<f64> = ids
        .iter()
        .map(|id| feed.accounts.get(id).map_or(0.0, |u| u.decayed_gpu_hours))
        .collect();
    let demand: Vec<bool> = ids.iter().map(|id| busy.contains(id)).collect();
    let floor = policy.relief.map(|r| r.floor_percent);
    let standings = policy
        .below_share_of_gpus
        .map(|gpus| standings_now(jobs, map, accounts, gpus, floor))
        .unwrap_or_default();
    let f = account_factors(
        policy.fair_share.formula,
        policy.fair_share.usage_factor_gpu_hours as f64,
        &weights,
        &usage,
        &demand,
        &standings,
    );
    let relieves = floor.is_some()
        && !standings.is_empty()
        && policy.fair_share.formula == FairShareFormula::FairTree;
    ids.into_iter()
        .zip(f)
        .map(|(id, f)| (id, (f, relieves.then(|| relief_factor(&standings, f)))))
        .collect()
}

/// Where each account stands against its fair share of the cluster's `gpus` now, from the
/// GPUs its running jobs hold: split by weight among the accounts with running or pending
/// jobs, none given more than those ask for ([`water_fill`], as gpuledger's scheduler splits
/// it); `floor_percent` is the relief's floor.
fn standings_now(
    jobs: &[QueuedJob],
    map: &AccountMap,
    accounts: &[Account],
    gpus: u64,
    floor_percent: Option<u32>,
) -> Vec<Standing> {
    let mut held = vec![0u64; accounts.len()];
    let mut asks = vec![0u64; accounts.len()];
    for job in jobs.iter().filter(|j| !j.is_held()) {
        let (name, _) = map.resolve(&job.account);
        let Some(i) = accounts.iter().position(|a| a.id.as_str() == name) else {
            continue;
        };
        let job_gpus = u64::from(job.gpus);
        match job.state {
            State::Running => {
                held[i] += job_gpus;
                asks[i] += job_gpus;
            }
            State::Pending => asks[i] += job_gpus,
            _ => {}
        }
    }
    let claims: Vec<(f64, f64)> = accounts
        .iter()
        .zip(&asks)
        .map(|(a, asks)| (f64::from(a.weight), *asks as f64))
        .collect();
    water_fill(gpus as f64, &claims)
        .into_iter()
        .zip(held)
        .map(|(share, held)| {
            let held = i64::try_from(held).unwrap_or(i64::MAX);
            Standing::of(share.floor() as i64, held, floor_percent)
        })
        .collect()
}

/// Whether the relief lifts a pending job now: Slurm says it waits for GPUs (`Priority`,
/// `Resources`), not for a limit, and has counted it eligible (`eligible_time`) for `after_s`
/// or more, and no pass has seen it waiting for a limit of its own since then
/// (`limited_seen`). A hold (this loop's for a quota) makes Slurm count again from the
/// release, and a limit seen makes this loop count again, so waiting out a quota earns
/// nothing, as in gpuledger's scheduler.
fn relieved(
    job: &QueuedJob,
    relief: Option<Relief>,
    limited_seen: Option<i64>,
    now_s: i64,
) -> bool {
    let waits_for_gpus = matches!(job.reason.as_str(), "Priority" | "Resources");
    relief.is_some_and(|r| {
        waits_for_gpus
            && job.eligible_s.is_some_and(|eligible| {
                let from = limited_seen.map_or(eligible, |seen| seen.max(eligible));
                now_s.saturating_sub(from) >= r.after_s
            })
    })
}

/// Whether Slurm says a pending job waits for a limit of its own account or QOS (`AssocGrp*`,
/// `AssocMax*`, `QOSGrp*`, `QOSMax*`, ...) rather than for GPUs.
fn waits_for_own_limit(job: &QueuedJob) -> bool {
    job.state == State::Pending
        && (job.reason.starts_with("Assoc") || job.reason.starts_with("QOS"))
}

/// Notes the pending jobs this pass sees waiting for a limit of their own, for the relief
/// ([`relieved`]): a pass every few minutes sees a limit that held a job for longer.
pub fn note_limits(state: &mut SteerState, jobs: &[QueuedJob], now_s: i64) {
    for job in jobs.iter().filter(|j| waits_for_own_limit(j)) {
        state.limited_seen.insert(job.job_id.clone(), now_s);
    }
}

/// The quota scopes a job falls under: its account's, and its project's when it has one.
fn scopes<'c>(account: &'c Account, project: Option<&str>) -> Vec<(Option<String>, &'c Quota)> {
    let mut out = vec![(None, &account.quota)];
    if let Some(p) = project.and_then(|p| account.projects.iter().find(|q| q.id.as_str() == p)) {
        out.push((Some(p.id.to_string()), &p.quota));
    }
    out
}

/// The quota a pending job would pass by starting now, as Slurm's reason name.
fn over_quota(
    job: &QueuedJob,
    jobs: &[QueuedJob],
    known: &Known,
    accounts: &[Account],
    now_s: i64,
) -> Option<&'static str> {
    let Known { feed, map, .. } = *known;
    let (account, project) = owner(job, map, accounts)?;
    let day_end = (day_of(now_s) + 1) * DAY_S;
    // A job without a time limit counts to the end of today: its end is unknown.
    let end_of = |j: &QueuedJob, from: i64| match j.time_limit_s {
        Some(limit) => from.saturating_add(limit as i64),
        None => day_end.max(from),
    };
    for (scope_project, quota) in scopes(account, project.as_deref()) {
        if quota.gpu_hours_per_day.is_none() && quota.gpu_hours_per_week.is_none() {
            continue;
        }
        let usage = feed.accounts.get(account.id.as_str());
        let window: WindowGpuSeconds = match &scope_project {
            None => usage.map(|u| u.window).unwrap_or_default(),
            Some(p) => usage
                .and_then(|u| u.project_windows.get(p).copied())
                .unwrap_or_default(),
        };
        // Running jobs of the scope count for what they may still use, up to their limits.
        let mut committed = DaySpread::default();
        for j in jobs
            .iter()
            .filter(|j| j.state == State::Running)
            .filter(|j| {
                owner(j, map, accounts).is_some_and(|(a, p)| {
                    a.id == account.id && (scope_project.is_none() || p == scope_project)
                })
            })
        {
            let start = j.start_s.unwrap_or(now_s);
            committed.add_gpus(j.gpus, now_s, end_of(j, start));
        }
        let mut need = DaySpread::default();
        need.add_gpus(job.gpus, now_s, end_of(job, now_s));
        // The feed gives today's use and the week's; the six days before today are taken as
        // all used yesterday, which keeps them in later windows at least as long as they
        // really are (stricter, never looser).
        let today = day_of(now_s);
        let used = |day: i64| match day - today {
            0 => window.day_gpu_s,
            -1 => window.week_gpu_s.saturating_sub(window.day_gpu_s),
            _ => 0,
        };
        if let Some(reason) =
            gpu_hours_verdict(quota, used, &committed, &need).and_then(PendingReason::of_quota)
        {
            return Some(reason.as_str());
        }
    }
    None
}

/// The changes one pass makes. `current` holds each pending job's site factor as `sprio`
/// shows it (absent for held jobs); with [`Target::Priority`] the job's priority is compared.
pub fn decide(
    jobs: &[QueuedJob],
    current: &BTreeMap<String, i64>,
    known: &Known,
    state: &SteerState,
    settings: Settings,
    now_s: i64,
) -> Vec<Action> {
    let map = known.map;
    let accounts = known.policy.with_slurm_accounts(jobs, map);
    let factors = factors(jobs, known, &accounts);
    let mut actions = Vec::new();
    for job in jobs.iter().filter(|j| j.state == State::Pending) {
        let Some((account, _)) = owner(job, map, &accounts) else {
            continue;
        };
        let ours = state.holds.get(&job.job_id);
        let over = if settings.quotas {
            over_quota(job, jobs, known, &accounts, now_s)
        } else {
            None
        };
        let mut schedulable = !job.is_held();
        match ours {
            Some(held) if held.phase == Phase::Held && !job.is_held() => {
                // Someone released what this loop held: theirs to decide from now on.
                actions.push(Action::Overridden {
                    job: job.job_id.clone(),
                    comment: job
                        .comment
                        .starts_with(COMMENT_PREFIX)
                        .then(|| held.comment.clone()),
                });
                continue;
            }
            Some(held) if over.is_none() || held.phase == Phase::Releasing => {
                actions.push(Action::Release {
                    job: job.job_id.clone(),
                    comment: held.comment.clone(),
                });
                schedulable = true;
            }
            Some(held) => {
                // Still over (or a hold interrupted before it was made): hold, with the
                // reason of now.
                let reason = over.unwrap_or(held.reason.as_str());
                if held.phase == Phase::Holding
                    || !job.is_held()
                    || job.comment != format!("{COMMENT_PREFIX}{reason}")
                {
                    actions.push(Action::Hold {
                        job: job.job_id.clone(),
                        account: account.id.to_string(),
                        reason: static_reason(reason),
                        comment: held.comment.clone(),
                    });
                }
                continue;
            }
            None if schedulable && !state.overridden.contains(&job.job_id) => {
                if let Some(reason) = over {
                    actions.push(Action::Hold {
                        job: job.job_id.clone(),
                        account: account.id.to_string(),
                        reason,
                        comment: job.comment.clone(),
                    });
                    continue;
                }
            }
            None => {}
        }
        if !settings.fair_share || !schedulable {
            continue;
        }
        let (factor, lifted) = factors
            .get(account.id.as_str())
            .copied()
            .unwrap_or((0.0, None));
        let factor = match lifted {
            Some(l)
                if l > factor
                    && relieved(
                        job,
                        known.policy.relief,
                        state.limited_seen.get(&job.job_id).copied(),
                        now_s,
                    ) =>
            {
                l
            }
            _ => factor,
        };
        let scaled = (factor * f64::from(settings.weight)).round() as i64;
        let (value, was) = match settings.target {
            Target::SiteFactor => (scaled, current.get(&job.job_id).copied()),
            // Priority 0 is a hold: the lowest steered priority is 1.
            Target::Priority => (scaled.max(1), Some(job.priority as i64)),
        };
        // A job just released shows no factor yet: set it.
        if was != Some(value) || job.is_held() {
            actions.push(Action::Set {
                job: job.job_id.clone(),
                account: account.id.to_string(),
                value,
                was,
            });
        }
    }
    actions
}

/// The reason names are the scheduler's own `&'static str`s; a reason read back from the
/// state file is matched to one of them.
fn static_reason(reason: &str) -> &'static str {
    use PendingReason as R;
    [R::AssocGrpGpuHoursDay, R::AssocGrpGpuHoursWeek]
        .into_iter()
        .map(R::as_str)
        .find(|r| *r == reason)
        .unwrap_or("AssocGrpGPUHoursPerDay")
}

/// The state after `actions` are all applied (what is saved once they are).
pub fn apply(state: &mut SteerState, actions: &[Action], jobs: &[QueuedJob]) {
    for a in actions {
        match a {
            Action::Hold {
                job,
                reason,
                comment,
                ..
            } => {
                state.holds.insert(
                    job.clone(),
                    HeldJob {
                        reason: (*reason).to_owned(),
                        comment: comment.clone(),
                        phase: Phase::Held,
                    },
                );
            }
            Action::Release { job, .. } => {
                state.holds.remove(job);
            }
            Action::Overridden { job, .. } => {
                state.holds.remove(job);
                state.overridden.insert(job.clone());
            }
            Action::Set { .. } => {}
        }
    }
    // Jobs Slurm no longer shows have ended: nothing to remember of them.
    let known: BTreeSet<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
    state.holds.retain(|id, _| known.contains(id.as_str()));
    state.overridden.retain(|id| known.contains(id.as_str()));
    state
        .limited_seen
        .retain(|id, _| known.contains(id.as_str()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::usage::AccountUsage;

    const CONFIG: &str = r#"version = 1
[cluster]
name = "t"
[[node_pools]]
name = "p"
prefix = "n"
count = 1
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 10
[prices]
version = "v"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "1" }
[[accounts]]
id = "heavy"
name = "H"
weight = 1
[[accounts]]
id = "light"
name = "L"
weight = 1
quota = { gpu_hours_per_day = 10 }
projects = [{ id = "small", quota = { gpu_hours_per_day = 2 } }]
"#;

    const NOW: i64 = 20 * DAY_S + 3600;

    fn job(id: &str, account: &str, state: State, gpus: u32) -> QueuedJob {
        QueuedJob {
            job_id: id.into(),
            account: account.into(),
            user: "u".into(),
            partition: "train".into(),
            state,
            reason: if state == State::Pending {
                "Priority".into()
            } else {
                "None".into()
            },
            priority: 1,
            comment: String::new(),
            gpus,
            time_limit_s: Some(3600),
            start_s: (state == State::Running).then_some(NOW - 60),
            submit_s: Some(NOW - 120),
            eligible_s: (state == State::Pending).then_some(NOW - 120),
        }
    }

    fn held(mut j: QueuedJob, comment: &str) -> QueuedJob {
        j.priority = 0;
        j.reason = "JobHeldAdmin".into();
        j.comment = comment.into();
        j
    }

    fn feed(heavy_hours: f64, light_day_s: i64) -> UsageFeed {
        let mut f = UsageFeed::default();
        f.accounts.insert(
            "heavy".into(),
            AccountUsage {
                decayed_gpu_hours: heavy_hours,
                ..AccountUsage::default()
            },
        );
        f.accounts.insert(
            "light".into(),
            AccountUsage {
                decayed_gpu_hours: 1.0,
                window: WindowGpuSeconds {
                    day_gpu_s: light_day_s,
                    week_gpu_s: light_day_s,
                },
                ..AccountUsage::default()
            },
        );
        f
    }

    fn settings() -> Settings {
        Settings {
            target: Target::SiteFactor,
            weight: 10_000,
            fair_share: true,
            quotas: true,
        }
    }

    fn config() -> ClusterConfig {
        ClusterConfig::from_toml_str(CONFIG, "t").unwrap()
    }

    fn map() -> AccountMap {
        AccountMap::parse("small light small\n", "map").unwrap()
    }

    /// One pass of [`decide`] with the test's account map.
    fn run(
        jobs: &[QueuedJob],
        current: &BTreeMap<String, i64>,
        feed: &UsageFeed,
        policy: &Policy,
        state: &SteerState,
        settings: Settings,
        now: i64,
    ) -> Vec<Action> {
        let map = map();
        decide(
            jobs,
            current,
            &Known {
                feed,
                map: &map,
                policy,
            },
            state,
            settings,
            now,
        )
    }

    /// The values one pass from no state sets, by job, with heavy's 500 GPU-hours.
    fn set_values(jobs: &[QueuedJob], policy: &Policy) -> BTreeMap<String, i64> {
        set_values_in(jobs, policy, &SteerState::default())
    }

    /// [`set_values`] from `state`.
    fn set_values_in(
        jobs: &[QueuedJob],
        policy: &Policy,
        state: &SteerState,
    ) -> BTreeMap<String, i64> {
        run(
            jobs,
            &BTreeMap::new(),
            &feed(500.0, 0),
            policy,
            state,
            settings(),
            NOW,
        )
        .into_iter()
        .filter_map(|a| match a {
            Action::Set { job, value, .. } => Some((job, value)),
            _ => None,
        })
        .collect()
    }

    #[test]
    fn the_lighter_account_gets_the_larger_site_factor_and_unchanged_values_are_left() {
        let jobs = vec![
            job("1", "heavy", State::Pending, 8),
            job("2", "light", State::Pending, 8),
            job("3", "stranger", State::Pending, 8),
            job("4", "Not An Id!", State::Pending, 8),
        ];
        let config = config();
        let state = SteerState::default();
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(500.0, 0),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        let set: BTreeMap<&str, i64> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Set { job, value, .. } => Some((job.as_str(), *value)),
                _ => None,
            })
            .collect();
        assert_eq!(
            set,
            [("1", 3_333), ("2", 6_667), ("3", 10_000)].into(),
            "fair tree: a Slurm account the config lacks weighs 1 and has used nothing, so it \
             ranks 1st of 3, light 2nd, heavy 3rd; a name that is no account id is left alone"
        );
        let current: BTreeMap<String, i64> = set.iter().map(|(k, v)| ((*k).into(), *v)).collect();
        let again = run(
            &jobs,
            &current,
            &feed(500.0, 0),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(again.is_empty(), "nothing moved: {again:?}");
    }

    #[test]
    fn an_account_holding_less_than_its_share_now_ranks_first_as_the_scheduler_ranks_it() {
        // heavy used much but holds nothing; other (a Slurm account the config lacks: weight
        // 1, no usage) holds the one node. Each asks for a node more: their shares of the 8
        // GPUs are 4 each. light has no jobs.
        let jobs = vec![
            job("1", "heavy", State::Pending, 8),
            job("2", "other", State::Running, 8),
            job("3", "other", State::Pending, 8),
        ];
        let values = |policy: &Policy| set_values(&jobs, policy);
        let config = config();
        let policy = Policy::from_config(&config);
        assert_eq!(policy.below_share_of_gpus, Some(8));
        assert_eq!(
            values(&policy),
            [("1".into(), 10_000), ("3".into(), 6_667)].into()
        );
        let by_usage = Policy {
            below_share_of_gpus: None,
            ..policy.clone()
        };
        assert_eq!(
            values(&by_usage),
            [("1".into(), 3_333), ("3".into(), 10_000)].into()
        );
        let off = ClusterConfig::from_toml_str(
            &format!("{CONFIG}[scheduler]\nbelow_share_first = false\n"),
            "t",
        )
        .unwrap();
        assert_eq!(Policy::from_config(&off).below_share_of_gpus, None);
        // Without a config the cluster's size is what Slurm's nodes have; a config's stands.
        let slurm = Policy::without_config().with_slurm_gpus(8);
        assert_eq!(slurm.below_share_of_gpus, Some(8));
        assert_eq!(
            Policy::without_config()
                .with_slurm_gpus(0)
                .below_share_of_gpus,
            None
        );
        assert_eq!(policy.with_slurm_gpus(100).below_share_of_gpus, Some(8));
        assert_eq!(
            Policy::from_config(&off)
                .with_slurm_gpus(8)
                .below_share_of_gpus,
            None
        );
    }

    #[test]
    fn a_job_waiting_past_relief_after_is_lifted_as_the_scheduler_lifts_it() {
        // 100 GPUs. heavy holds 45 of its 50 (below its share, above the 80% floor), other
        // (a Slurm account the config lacks) holds 55 of its 50, with an old job and a fresh
        // one waiting; light has no jobs.
        let mut old = job("3", "other", State::Pending, 8);
        old.submit_s = Some(NOW - 4 * DAY_S);
        old.eligible_s = old.submit_s;
        let jobs = |heavy_holds: u32, old: &QueuedJob| {
            vec![
                job("1", "heavy", State::Pending, 8),
                job("2", "heavy", State::Running, heavy_holds),
                old.clone(),
                job("4", "other", State::Pending, 8),
                job("5", "other", State::Running, 55),
            ]
        };

        let policy = Policy {
            below_share_of_gpus: Some(100),
            ..Policy::from_config(&config())
        };
        assert_eq!(
            policy.relief,
            Some(Relief {
                after_s: 3 * DAY_S,
                floor_percent: 80
            })
        );
        // heavy ranks 1st of 3 (below its share), other 2nd (no usage), light 3rd; other's
        // old job goes above everyone: nobody is below the floor.
        assert_eq!(
            set_values(&jobs(45, &old), &policy),
            [
                ("1".into(), 10_000),
                ("3".into(), 11_944),
                ("4".into(), 6_667)
            ]
            .into()
        );
        // heavy below the floor (30 of 50): the old job goes just under it.
        assert_eq!(
            set_values(&jobs(30, &old), &policy),
            [
                ("1".into(), 10_000),
                ("3".into(), 8_611),
                ("4".into(), 6_667)
            ]
            .into()
        );
        // Not lifted: without the relief, or pending for a limit rather than for GPUs.
        let off = Policy {
            relief: None,
            ..policy.clone()
        };
        assert_eq!(set_values(&jobs(45, &old), &off)["3"], 6_667);
        let mut limited = old.clone();
        limited.reason = "AssocGrpGRES".into();
        assert_eq!(set_values(&jobs(45, &limited), &policy)["3"], 6_667);
        let mut young = old.clone();
        young.eligible_s = Some(NOW - 3 * DAY_S + 1);
        assert_eq!(set_values(&jobs(45, &young), &policy)["3"], 6_667);
        // Submitted 4 days ago, eligible for 2 (held for its quota until then): not yet.
        let mut was_held = old.clone();
        was_held.eligible_s = Some(NOW - 2 * DAY_S);
        assert_eq!(set_values(&jobs(45, &was_held), &policy)["3"], 6_667);
        // Eligible for 4 days, but a pass saw it waiting for its association's limit a day
        // ago: the count starts there, whether or not Slurm set `eligible_time` again.
        let mut state = SteerState::default();
        note_limits(&mut state, &jobs(45, &limited), NOW - DAY_S);
        assert_eq!(state.limited_seen.get("3"), Some(&(NOW - DAY_S)));
        assert_eq!(state.limited_seen.len(), 1, "only the limited job is noted");
        let value_of_3 = |state: &SteerState| {
            set_values_in(&jobs(45, &old), &policy, state)
                .get("3")
                .copied()
        };
        assert_eq!(value_of_3(&state), Some(6_667));
        state.limited_seen.insert("3".into(), NOW - 3 * DAY_S);
        assert_eq!(value_of_3(&state), Some(11_944));
        // Once the job is gone there is nothing to remember of it.
        apply(&mut state, &[], &jobs(45, &old)[..2]);
        assert!(state.limited_seen.is_empty());
    }

    #[test]
    fn as_the_whole_priority_the_factor_is_compared_with_the_jobs_priority_and_never_0() {
        let config = config();
        let mut jobs = vec![
            job("1", "heavy", State::Pending, 8),
            job("2", "light", State::Pending, 8),
        ];
        jobs[1].priority = 100;
        let by_priority = Settings {
            target: Target::Priority,
            weight: 100,
            ..settings()
        };
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(500.0, 0),
            &Policy::from_config(&config),
            &SteerState::default(),
            by_priority,
            NOW,
        );
        assert_eq!(
            actions,
            vec![Action::Set {
                job: "1".into(),
                account: "heavy".into(),
                value: 50,
                was: Some(1)
            }],
            "light's job already has 100"
        );
        // Weighted with a large factor: a factor rounding to 0 is set to 1, not a hold.
        let mut weighted = Policy::from_config(&config);
        weighted.fair_share.formula = FairShareFormula::Weighted;
        weighted.fair_share.usage_factor_gpu_hours = 1;
        jobs[0].priority = 7;
        let actions = run(
            &jobs[..1],
            &BTreeMap::new(),
            &feed(1e9, 0),
            &weighted,
            &SteerState::default(),
            by_priority,
            NOW,
        );
        assert!(
            matches!(&actions[..], [Action::Set { value: 1, .. }]),
            "{actions:?}"
        );
    }

    #[test]
    fn a_job_over_a_gpu_hour_quota_is_held_then_released_when_the_window_has_room() {
        let config = config();
        let mut state = SteerState::default();
        // 9 of light's 10 GPU-hours used today; a 1-hour 2-GPU job would pass them.
        let jobs = vec![job("7", "light", State::Pending, 2)];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 9 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert_eq!(
            actions,
            vec![Action::Hold {
                job: "7".into(),
                account: "light".into(),
                reason: "AssocGrpGPUHoursPerDay",
                comment: String::new(),
            }]
        );
        apply(&mut state, &actions, &jobs);
        let jobs = vec![held(jobs[0].clone(), "gpuledger: AssocGrpGPUHoursPerDay")];
        // Still over: nothing to do.
        let same = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 9 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(same.is_empty(), "{same:?}");
        // The next UTC day: the window is empty, the job is released and steered.
        let tomorrow = 21 * DAY_S + 60;
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 0),
            &Policy::from_config(&config),
            &state,
            settings(),
            tomorrow,
        );
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert_eq!(
            actions[0],
            Action::Release {
                job: "7".into(),
                comment: String::new()
            }
        );
        assert!(matches!(actions[1], Action::Set { .. }));
        apply(&mut state, &actions, &jobs);
        assert!(state.holds.is_empty());
    }

    #[test]
    fn running_jobs_count_for_what_they_may_still_use_and_projects_have_their_own_window() {
        let config = config();
        let state = SteerState::default();
        // 8 GPUs running for another hour (limit 1 h, started a minute ago): 8 GPU-hours
        // committed; a 2-GPU hour more passes 10 with 1 used.
        let jobs = vec![
            job("1", "light", State::Running, 8),
            job("2", "light", State::Pending, 2),
        ];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Hold { job, .. } if job == "2")),
            "{actions:?}"
        );
        // The project `small` (Slurm account `small`) has 2 GPU-hours a day: a 3-GPU hour
        // passes it, though the account has room.
        let jobs = vec![job("3", "small", State::Pending, 3)];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 0),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Hold { job, .. } if job == "3")),
            "{actions:?}"
        );
    }

    #[test]
    fn a_job_started_late_in_the_day_counts_against_tomorrow_too() {
        let config = config();
        let state = SteerState::default();
        // 23:00: light used nothing today. A running 2-GPU job ends at 04:00 tomorrow (8
        // GPU-hours tomorrow); a pending 2-GPU job of three hours would add 2 tonight and 4
        // tomorrow: 12 of tomorrow's 10. Counting today alone (4) let it start.
        let late = 21 * DAY_S - 3600;
        let mut running = job("1", "light", State::Running, 2);
        running.time_limit_s = Some(5 * 3600);
        running.start_s = Some(late);
        let mut pending = job("2", "light", State::Pending, 2);
        pending.time_limit_s = Some(3 * 3600);
        let jobs = vec![running, pending];
        let verdict = |jobs: &[QueuedJob]| {
            run(
                jobs,
                &BTreeMap::new(),
                &feed(0.0, 0),
                &Policy::from_config(&config),
                &state,
                settings(),
                late,
            )
        };
        assert!(
            verdict(&jobs)
                .iter()
                .any(|a| matches!(a, Action::Hold { job, reason: "AssocGrpGPUHoursPerDay", .. } if job == "2")),
            "held for tomorrow's window"
        );
        // One hour instead of three ends at midnight: room enough.
        let mut short = jobs.clone();
        short[1].time_limit_s = Some(3600);
        assert!(
            !verdict(&short)
                .iter()
                .any(|a| matches!(a, Action::Hold { .. })),
            "a job inside today is not held"
        );
    }

    #[test]
    fn jobs_held_by_others_are_never_touched_and_a_release_by_others_is_respected() {
        let config = config();
        let mut state = SteerState::default();
        let theirs = held(job("5", "light", State::Pending, 2), "mine");
        let actions = run(
            std::slice::from_ref(&theirs),
            &BTreeMap::new(),
            &feed(0.0, 0),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(actions.is_empty(), "a job someone else held: {actions:?}");
        // A job this loop held that an operator released: forgotten, its comment restored,
        // never held again.
        state.holds.insert(
            "6".into(),
            HeldJob {
                reason: "AssocGrpGPUHoursPerDay".into(),
                comment: "theirs".into(),
                phase: Phase::Held,
            },
        );
        let mut released = job("6", "light", State::Pending, 2);
        released.comment = "gpuledger: AssocGrpGPUHoursPerDay".into();
        let jobs = vec![released];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 10 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert_eq!(
            actions,
            vec![Action::Overridden {
                job: "6".into(),
                comment: Some("theirs".into())
            }]
        );
        apply(&mut state, &actions, &jobs);
        let later = run(
            &jobs,
            &[("6".to_owned(), 10_000)].into(),
            &feed(0.0, 10 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(
            !later.iter().any(|a| matches!(a, Action::Hold { .. })),
            "{later:?}"
        );
        // Once Slurm forgets the job, so does the state.
        apply(&mut state, &[], &[]);
        assert!(state.overridden.is_empty());
    }

    #[test]
    fn an_interrupted_hold_or_release_is_finished_after_a_restart() {
        let config = config();
        let mut state = SteerState::default();
        state.holds.insert(
            "8".into(),
            HeldJob {
                reason: "AssocGrpGPUHoursPerDay".into(),
                comment: "c".into(),
                phase: Phase::Holding,
            },
        );
        // The crash came before `scontrol hold`: the job is not held, still over quota.
        let jobs = vec![job("8", "light", State::Pending, 2)];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 10 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(
            matches!(&actions[..], [Action::Hold { job, comment, .. }] if job == "8" && comment == "c"),
            "{actions:?}"
        );
        state.holds.get_mut("8").unwrap().phase = Phase::Releasing;
        let jobs = vec![held(jobs[0].clone(), "gpuledger: AssocGrpGPUHoursPerDay")];
        let actions = run(
            &jobs,
            &BTreeMap::new(),
            &feed(0.0, 10 * 3600),
            &Policy::from_config(&config),
            &state,
            settings(),
            NOW,
        );
        assert!(
            matches!(&actions[0], Action::Release { job, comment } if job == "8" && comment == "c"),
            "{actions:?}"
        );
    }
}
