//! Fair share as received, week by week: at every moment the cluster's GPUs are split by weight
//! among the accounts with demand (running or waiting work), none given more than it asks for
//! (weighted max-min, "water filling"); integrated over a week that is the account's fair share
//! of the week, set against the GPU-hours it actually held. A whole-run share hides a tenant
//! starved for a week and served later; this does not. The split is the scheduler's own
//! ([`water_fill`]), the one its plans and fair-share preemption aim at. Beside it ([`reach`])
//! how much of a week's shortfall only preemption could have avoided, to tell a week the policy
//! left short from one no scheduler that never preempts could have lifted.

use std::collections::{BTreeMap, HashSet};

use gpuledger_scheduler::fairshare::WaterFill;
use gpuledger_scheduler::{JobRecord, SimResult};

pub mod reach;

/// One week.
pub const WEEK_S: i64 = 7 * 86_400;

/// Account-weeks whose fair share is below this many GPU-seconds (one GPU for a day) are
/// counted apart: a small job waiting across a week's end owes its week almost nothing, and
/// its ratio says nothing of fairness.
pub const MIN_FAIR_GPU_S: f64 = 86_400.0;

/// One account in one week.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountWeek {
    pub account: String,
    /// Weeks since the first submission.
    pub week: usize,
    /// GPU-seconds its fair share came to while it had demand.
    pub fair_gpu_s: f64,
    /// GPU-seconds it held.
    pub received_gpu_s: f64,
}

impl AccountWeek {
    /// Received over fair; `None` when it had no demand that week.
    pub fn ratio(&self) -> Option<f64> {
        (self.fair_gpu_s > 0.0).then(|| self.received_gpu_s / self.fair_gpu_s)
    }

    /// Whether the week enters the weekly goals (its fair share is at least
    /// [`MIN_FAIR_GPU_S`]).
    pub fn counts(&self) -> bool {
        self.fair_gpu_s >= MIN_FAIR_GPU_S
    }
}

/// Every account-week from the first submission to the horizon, for the accounts in `weights`
/// (account id to fair-share weight), in account then week order.
pub fn weekly_shares(result: &SimResult, weights: &BTreeMap<String, u32>) -> Vec<AccountWeek> {
    let mut weekly = WeeklyFair::new(result, weights);
    sweep(result, weights, &mut [&mut weekly]);
    weekly.finish()
}

/// [`weekly_shares`] as a reader of one [`sweep`]: what each account held is counted when it
/// is made, its fair share stretch by stretch.
pub(crate) struct WeeklyFair<'a> {
    accounts: Vec<&'a str>,
    start: i64,
    fair: Vec<Vec<f64>>,
    received: Vec<Vec<f64>>,
}

impl<'a> WeeklyFair<'a> {
    pub(crate) fn new(result: &SimResult, weights: &'a BTreeMap<String, u32>) -> Self {
        let index = account_index(weights);
        let start = result.start_s;
        let weeks =
            usize::try_from((result.horizon_s - start).max(1).div_euclid(WEEK_S) + 1).unwrap_or(1);
        let n = weights.len();
        let mut received = vec![vec![0.0f64; weeks]; n];
        for r in &result.records {
            let Some(&a) = index.get(r.spec.account.as_str()) else {
                continue;
            };
            for run in &r.runs {
                let run_end = run.end_s.unwrap_or(result.horizon_s).min(result.horizon_s);
                spread(
                    start,
                    run.start_s,
                    run_end,
                    run.gpu_equivalent(),
                    &mut received[a],
                );
            }
        }
        WeeklyFair {
            accounts: weights.keys().map(String::as_str).collect(),
            start,
            fair: vec![vec![0.0f64; weeks]; n],
            received,
        }
    }

    pub(crate) fn finish(self) -> Vec<AccountWeek> {
        let mut out = Vec::new();
        for ((account, fair), received) in self.accounts.iter().zip(self.fair).zip(self.received) {
            for (week, (fair_gpu_s, received_gpu_s)) in fair.into_iter().zip(received).enumerate() {
                out.push(AccountWeek {
                    account: (*account).to_owned(),
                    week,
                    fair_gpu_s,
                    received_gpu_s,
                });
            }
        }
        out
    }
}

impl Stretches for WeeklyFair<'_> {
    fn stretch(&mut self, from: i64, to: i64, shares: &[f64], _asked: &[f64]) {
        for (a, share) in shares.iter().enumerate() {
            if *share > 0.0 {
                spread(self.start, from, to, *share, &mut self.fair[a]);
            }
        }
    }
}

/// Each account's position in `weights` (the order of the shares [`sweep`] gives).
pub(crate) fn account_index(weights: &BTreeMap<String, u32>) -> BTreeMap<&str, usize> {
    weights
        .keys()
        .enumerate()
        .map(|(i, a)| (a.as_str(), i))
        .collect()
}

/// The jobs the scheduler refused at submission: they never wait and are no one's demand.
pub(crate) fn refused(result: &SimResult) -> HashSet<&str> {
    result
        .refused
        .iter()
        .map(|(spec, _)| spec.id.as_str())
        .collect()
}

/// A reader of the fair split through a run, stretch by stretch in time order ([`sweep`]).
pub(crate) trait Stretches {
    /// `[from, to)` with each account's GPUs owed and asked for (in `weights`' order).
    fn stretch(&mut self, from: i64, to: i64, shares: &[f64], asked: &[f64]);
}

/// The fair split through the run, worked out once for every reader in `readers`: each stretch
/// between two changes of demand, in time order, with each account's GPUs owed and asked for
/// (in `weights`' order). Demand is a job's GPUs from its submission to its final end (the
/// horizon when it has none); a refused job is none.
pub(crate) fn sweep(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
    readers: &mut [&mut dyn Stretches],
) {
    let index = account_index(weights);
    let refused = refused(result);
    let mut changes: Vec<(i64, usize, f64)> = Vec::new();
    for r in &result.records {
        let Some(&a) = index.get(r.spec.account.as_str()) else {
            continue;
        };
        if refused.contains(r.spec.id.as_str()) {
            continue;
        }
        let end = r.end_s.unwrap_or(result.horizon_s).min(result.horizon_s);
        if end > r.spec.submit_s {
            let gpus = r.spec.gpu_equivalent();
            changes.push((r.spec.submit_s, a, gpus));
            changes.push((end, a, -gpus));
        }
    }
    // Stable: changes at one time are summed in record order, as they always were.
    changes.sort_by_key(|c| c.0);
    let mut claims: Vec<(f64, f64)> = weights.values().map(|w| (f64::from(*w), 0.0)).collect();
    let capacity = f64::from(result.total_gpus);
    let mut demand = vec![0.0f64; weights.len()];
    let mut asked = vec![0.0f64; weights.len()];
    let mut filling = WaterFill::default();
    let mut k = 0;
    while k < changes.len() {
        let t = changes[k].0;
        while k < changes.len() && changes[k].0 == t {
            demand[changes[k].1] += changes[k].2;
            k += 1;
        }
        let Some(&(next, _, _)) = changes.get(k) else {
            break;
        };
        for ((asks, claim), d) in asked.iter_mut().zip(&mut claims).zip(&demand) {
            *asks = d.max(0.0);
            claim.1 = *asks;
        }
        let shares = filling.fill(capacity, &claims);
        for reader in readers.iter_mut() {
            reader.stretch(t, next, shares, &asked);
        }
    }
}

/// Adds `rate` GPUs held over `[from, to)` to the weeks they fall in.
pub(crate) fn spread(start: i64, from: i64, to: i64, rate: f64, weeks: &mut [f64]) {
    let mut t = from.max(start);
    while t < to {
        let week = usize::try_from((t - start).div_euclid(WEEK_S)).unwrap_or(0);
        let week_end = start + (week as i64 + 1) * WEEK_S;
        let until = to.min(week_end);
        if let Some(slot) = weeks.get_mut(week) {
            *slot += rate * (until - t) as f64;
        }
        t = until;
    }
}

/// The stretches a job waited for GPUs, up to the horizon.
pub(crate) fn waits(record: &JobRecord, horizon_s: i64) -> Vec<(i64, i64)> {
    let mut waits = Vec::new();
    let mut since = Some(record.spec.submit_s);
    for run in &record.runs {
        if let Some(s) = since.take() {
            if run.start_s > s {
                waits.push((s, run.start_s));
            }
        }
        since = run.end_s;
    }
    if let (Some(s), None) = (since, record.outcome) {
        if s < horizon_s {
            waits.push((s, horizon_s));
        }
    }
    waits
}

/// What the weekly goals look at, per account.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeeklySummary {
    /// Weeks with a fair share of at least [`MIN_FAIR_GPU_S`].
    pub weeks: usize,
    /// Weeks with demand below that.
    pub small_weeks: usize,
    pub below_half: usize,
    pub below_0_8: usize,
    /// The lowest ratio of a counted week, and which week.
    pub worst: Option<(usize, f64)>,
}

/// [`WeeklySummary`] per account, from [`weekly_shares`].
pub fn summarize(weeks: &[AccountWeek]) -> BTreeMap<String, WeeklySummary> {
    let mut out: BTreeMap<String, WeeklySummary> = BTreeMap::new();
    for w in weeks {
        let s = out.entry(w.account.clone()).or_default();
        let Some(ratio) = w.ratio() else {
            continue;
        };
        if !w.counts() {
            s.small_weeks += 1;
            continue;
        }
        s.weeks += 1;
        s.below_half += usize::from(ratio < 0.5);
        s.below_0_8 += usize::from(ratio < 0.8);
        if s.worst.is_none_or(|(_, r)| ratio < r) {
            s.worst = Some((w.week, ratio));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_records::{record, replay};
    use gpuledger_scheduler::Refusal;

    #[test]
    fn a_job_refused_at_submission_is_no_one_s_demand() {
        // a holds the whole cluster for its week; b's only job was refused (larger than the
        // cluster): b is owed nothing and a all of it.
        let records = vec![
            record("a1", "a", 8, 0, &[(0, WEEK_S)]),
            record("b1", "b", 16, 0, &[]),
        ];
        let refused = vec![(
            records[1].spec.clone(),
            Refusal::LargerThanCluster {
                asked: 16,
                capacity: 8,
            },
        )];
        let result = replay(records, refused, 8, WEEK_S);
        let weights: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 1)].into();
        let weeks = weekly_shares(&result, &weights);
        let a = weeks
            .iter()
            .find(|w| w.account == "a" && w.week == 0)
            .unwrap();
        let b = weeks
            .iter()
            .find(|w| w.account == "b" && w.week == 0)
            .unwrap();
        assert_eq!(a.fair_gpu_s, 8.0 * WEEK_S as f64);
        assert_eq!(a.ratio(), Some(1.0));
        assert_eq!(b.fair_gpu_s, 0.0);
        assert_eq!(crate::backlog::own_backlogs(&result, &weights)[1], None);
    }
}
