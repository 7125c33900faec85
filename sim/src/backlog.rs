//! Why a job waited: its own account's earlier work, served at the account's fair share.
//!
//! A tenant that submits more than its share buys it for months can only be served by taking
//! other tenants' shares, so a fair scheduler must leave its latest jobs waiting. To tell that
//! wait from one the policy caused, each job gets its *own backlog*: the work its account
//! submitted before it (in submission order) and had not yet done when it was submitted,
//! measured in how long the account's fair share (the split of [`crate::fairness`], from the
//! demand of the run itself) took to deliver that many GPU-seconds from the job's submission
//! on. A job that waited longer than its own backlog waited for other tenants' work, or for
//! the policy; the rest of its wait only more than its account's share could have shortened.
//!
//! The measure takes the run as it went (the demand, the runs held and their lengths, redone
//! work included) and reads submission order as the order within an account: it explains one
//! run, it is not a bound on every schedule.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use gpuledger_scheduler::SimResult;

use crate::fairness::{account_index, refused, sweep, Stretches};

/// One job's own backlog.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OwnBacklog {
    /// Seconds from its submission until its account's fair share had delivered the work
    /// ahead of it (zero when nothing was ahead).
    Served(i64),
    /// The fair share had not delivered it by the horizon.
    BeyondHorizon,
}

impl OwnBacklog {
    /// Whether the backlog was longer than `seconds`; one beyond the horizon is when the
    /// horizon is more than `seconds` after `submit_s`.
    pub fn longer_than(self, seconds: i64, submit_s: i64, horizon_s: i64) -> bool {
        match self {
            OwnBacklog::Served(s) => s > seconds,
            OwnBacklog::BeyondHorizon => horizon_s - submit_s > seconds,
        }
    }
}

/// Each record's own backlog, in `result.records`' order; `None` for a job refused at
/// submission or whose account is not in `weights` (account id to fair-share weight).
pub fn own_backlogs(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
) -> Vec<Option<OwnBacklog>> {
    let work = Work::of(result, weights);
    let mut service = Service::new(result, &work, 1.0, Ahead::AfterRunHeld);
    sweep(result, weights, &mut [&mut service]);
    service.finish()
}

/// For each record, the shortest wait any schedule could have given it while every other
/// account kept `others_keep` (0 to 1) of its fair share at every moment: its account served
/// from the run's start at its share plus what the others give up, never more than it asks
/// for, its jobs in submission order, a job starting once that service covers the work the
/// account submitted before it. Over 7 days at 0.5 says the job could not have started within
/// a week without some tenant held below half its share (issue 22's weekly floor); first in,
/// first out within an account gives no job a longer wait than any other order would give its
/// latest job, so some job of the account waits that long under every order. Demand and work are
/// the run's own, so this bounds schedules like the run, not every schedule.
pub fn shortest_waits(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
    others_keep: f64,
) -> Vec<Option<OwnBacklog>> {
    let work = Work::of(result, weights);
    let mut service = Service::new(result, &work, others_keep, Ahead::FromStart);
    sweep(result, weights, &mut [&mut service]);
    service.finish()
}

/// What a job waits to be served: the work ahead of it at its submission after what the run
/// had held by then ([`own_backlogs`]), or the work submitted before it, served from the run's
/// start ([`shortest_waits`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ahead {
    AfterRunHeld,
    FromStart,
}

/// Each record's account (`None`: refused, or not in the weights) and its account's work before
/// its submission: what every [`Service`] of one run starts from.
pub(crate) struct Work {
    accounts: Vec<Option<usize>>,
    before: Vec<WorkBefore>,
    n: usize,
}

impl Work {
    pub(crate) fn of(result: &SimResult, weights: &BTreeMap<String, u32>) -> Work {
        let index = account_index(weights);
        let refused = refused(result);
        let accounts: Vec<Option<usize>> = result
            .records
            .iter()
            .map(|r| {
                if refused.contains(r.spec.id.as_str()) {
                    None
                } else {
                    index.get(r.spec.account.as_str()).copied()
                }
            })
            .collect();
        let before = work_before(result, &accounts, weights.len());
        Work {
            accounts,
            before,
            n: weights.len(),
        }
    }
}

/// Each record's wait for its account's service, `others_keep` of their shares left to the
/// other accounts, to cover the work ahead of it as `ahead_is` counts it: a reader of one
/// [`sweep`] ([`Service::finish`] gives the waits).
pub(crate) struct Service<'a> {
    result: &'a SimResult,
    accounts: &'a [Option<usize>],
    ahead: Vec<f64>,
    ahead_is: Ahead,
    given_up: f64,
    /// Jobs with work ahead, by submission, and the next of them to queue.
    asking: Vec<usize>,
    next_asking: usize,
    /// Each account's service so far, and its jobs waiting for it in a heap, lowest target
    /// first, for the service integrated over the account to reach the target.
    delivered: Vec<f64>,
    waiting: Vec<BinaryHeap<Target>>,
    rates: Vec<f64>,
    out: Vec<Option<OwnBacklog>>,
}

impl<'a> Service<'a> {
    pub(crate) fn new(
        result: &'a SimResult,
        work: &'a Work,
        others_keep: f64,
        ahead_is: Ahead,
    ) -> Self {
        let ahead: Vec<f64> = work
            .before
            .iter()
            .map(|w| match ahead_is {
                Ahead::AfterRunHeld => w.ahead(),
                Ahead::FromStart => w.submitted,
            })
            .collect();
        let out = work
            .accounts
            .iter()
            .zip(&ahead)
            .map(|(a, w)| a.map(|_| served_at_once(*w)))
            .collect();
        let mut asking: Vec<usize> = (0..result.records.len())
            .filter(|&i| work.accounts[i].is_some() && ahead[i] > 0.0)
            .collect();
        asking.sort_by_key(|&i| (result.records[i].spec.submit_s, i));
        Service {
            result,
            accounts: &work.accounts,
            ahead,
            ahead_is,
            given_up: 1.0 - others_keep.clamp(0.0, 1.0),
            asking,
            next_asking: 0,
            delivered: vec![0.0; work.n],
            waiting: vec![BinaryHeap::new(); work.n],
            rates: vec![0.0; work.n],
            out,
        }
    }

    /// The waits; what is still waiting, or was submitted after the last change, stays
    /// beyond the horizon.
    pub(crate) fn finish(self) -> Vec<Option<OwnBacklog>> {
        self.out
    }
}

impl Stretches for Service<'_> {
    fn stretch(&mut self, from: i64, to: i64, shares: &[f64], asked: &[f64]) {
        let all: f64 = shares.iter().sum();
        for ((rate, share), asked) in self.rates.iter_mut().zip(shares).zip(asked) {
            *rate = (share + self.given_up * (all - share)).min(*asked);
        }
        let records = &self.result.records;
        while let Some(&i) = self.asking.get(self.next_asking) {
            let submit = records[i].spec.submit_s;
            if submit >= to {
                break;
            }
            self.next_asking += 1;
            let Some(a) = self.accounts[i] else { continue };
            let gpu_s = match self.ahead_is {
                Ahead::AfterRunHeld => {
                    self.delivered[a]
                        + self.rates[a] * (submit.max(from) - from) as f64
                        + self.ahead[i]
                }
                Ahead::FromStart => self.ahead[i],
            };
            self.waiting[a].push(Target { gpu_s, record: i });
        }
        for (a, heap) in self.waiting.iter_mut().enumerate() {
            let rate = self.rates[a];
            if rate <= 0.0 {
                continue;
            }
            let delivered = &mut self.delivered[a];
            let at_end = *delivered + rate * (to - from) as f64;
            while heap.peek().is_some_and(|t| t.gpu_s <= at_end) {
                let Some(t) = heap.pop() else { break };
                // Rounded up to the second, a hair of float error aside.
                let reached = from + ((t.gpu_s - *delivered) / rate - 1e-9).ceil().max(0.0) as i64;
                let submit = records[t.record].spec.submit_s;
                self.out[t.record] = Some(OwnBacklog::Served((reached - submit).max(0)));
            }
            *delivered = at_end;
        }
    }
}

/// Until the sweep says otherwise: nothing ahead is served at once, anything else is beyond the
/// horizon.
fn served_at_once(ahead: f64) -> OwnBacklog {
    if ahead > 0.0 {
        OwnBacklog::BeyondHorizon
    } else {
        OwnBacklog::Served(0)
    }
}

/// The work of a job's account before its submission, in GPU-seconds.
#[derive(Clone, Copy, Default)]
struct WorkBefore {
    /// The work of the account's earlier jobs (by submission, then record order).
    submitted: f64,
    /// What the account had held up to the submission (only earlier jobs can have run).
    held: f64,
}

impl WorkBefore {
    /// What the account still had to do of it; below a GPU-second is rounding, not work.
    fn ahead(self) -> f64 {
        let ahead = (self.submitted - self.held).max(0.0);
        if ahead < 1.0 {
            0.0
        } else {
            ahead
        }
    }
}

/// For each record, its account's work before its submission ([`WorkBefore`]). Work is
/// GPU-seconds held to the horizon, redone work included; a job that never ran adds none.
fn work_before(result: &SimResult, accounts: &[Option<usize>], n: usize) -> Vec<WorkBefore> {
    let horizon = result.horizon_s;
    let mut by_account: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, a) in accounts.iter().enumerate() {
        if let Some(a) = a {
            by_account[*a].push(i);
        }
    }
    let mut before = vec![WorkBefore::default(); result.records.len()];
    for jobs in &mut by_account {
        jobs.sort_by_key(|&i| (result.records[i].spec.submit_s, i));
        // Holding changes: (time, GPUs), to integrate what was held up to each submission.
        let mut changes: Vec<(i64, f64)> = Vec::new();
        let mut work = vec![0.0f64; jobs.len()];
        for (k, &i) in jobs.iter().enumerate() {
            for run in &result.records[i].runs {
                let end = run.end_s.unwrap_or(horizon).min(horizon);
                if end > run.start_s {
                    let gpus = run.gpu_equivalent();
                    changes.push((run.start_s, gpus));
                    changes.push((end, -gpus));
                    work[k] += gpus * (end - run.start_s) as f64;
                }
            }
        }
        changes.sort_by_key(|x| x.0);
        // `at`: the time of the last change of rate taken in; none before the first.
        let (mut held, mut rate, mut at, mut c) = (0.0f64, 0.0f64, None::<i64>, 0);
        let mut submitted = 0.0f64;
        for (k, &i) in jobs.iter().enumerate() {
            let submit = result.records[i].spec.submit_s;
            while c < changes.len() && changes[c].0 <= submit {
                if let Some(at) = at {
                    held += rate * (changes[c].0 - at) as f64;
                }
                at = Some(changes[c].0);
                rate += changes[c].1;
                c += 1;
            }
            before[i] = WorkBefore {
                submitted,
                held: at.map_or(0.0, |at| held + rate * (submit - at) as f64),
            };
            submitted += work[k];
        }
    }
    before
}

/// A job waiting for its account's delivered fair share to reach `gpu_s`; the heap's top is the
/// lowest.
#[derive(Clone, Copy, Debug)]
struct Target {
    gpu_s: f64,
    record: usize,
}

impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Target {}

impl PartialOrd for Target {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Target {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .gpu_s
            .total_cmp(&self.gpu_s)
            .then(other.record.cmp(&self.record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_records::{record, replay};
    use gpuledger_scheduler::fairshare::water_fill;
    use gpuledger_scheduler::JobRecord;
    use proptest::prelude::*;

    fn result(records: Vec<JobRecord>, total_gpus: u32, horizon_s: i64) -> SimResult {
        replay(records, Vec::new(), total_gpus, horizon_s)
    }

    fn weights(accounts: &[&str]) -> BTreeMap<String, u32> {
        accounts.iter().map(|a| (a.to_string(), 1)).collect()
    }

    #[test]
    fn an_account_s_own_queue_explains_its_waits_and_the_other_s_wait_is_beyond_its_backlog() {
        // 8 GPUs, a and b weighted alike: a queues four whole-cluster jobs at once, b one.
        // While both wait each is owed 4 GPUs; once b is done a is owed all 8.
        let run = result(
            vec![
                record("a1", "a", 8, 0, &[(0, 100)]),
                record("b1", "b", 8, 0, &[(100, 200)]),
                record("a2", "a", 8, 0, &[(200, 300)]),
                record("a3", "a", 8, 0, &[(300, 400)]),
                record("a4", "a", 8, 0, &[(400, 500)]),
            ],
            8,
            500,
        );
        let backlogs = own_backlogs(&run, &weights(&["a", "b"]));
        let served = |s| Some(OwnBacklog::Served(s));
        // a2 waits for a1's 800 GPU-s at 4 GPUs; a3 for 1,600 (800 by 200, then 8 GPUs);
        // b1 has nothing of its own ahead, so its 100 s wait is all beyond its backlog.
        assert_eq!(
            backlogs,
            vec![served(0), served(0), served(200), served(300), served(400)]
        );
        // Were b held to half its share, a would be served 6 GPUs while b waits: a2 waits for
        // 800 GPU-s at 6 (134 s, rounded up); a3 has 1,200 of its 1,600 by 200, then 8 GPUs.
        let backlogs = shortest_waits(&run, &weights(&["a", "b"]), 0.5);
        assert_eq!(
            backlogs,
            vec![served(0), served(0), served(134), served(250), served(350)]
        );
    }

    #[test]
    fn work_done_before_a_submission_is_not_ahead_of_it_and_an_unserved_backlog_is_beyond_the_horizon(
    ) {
        // a1 holds all 8 GPUs over [0, 100); a2 comes at 50 with 400 GPU-s of a1 left. Alone, a is
        // owed 8 GPUs: served at 100. With b waiting all along, a is owed 4: not by the horizon.
        let alone = result(
            vec![
                record("a1", "a", 8, 0, &[(0, 100)]),
                record("a2", "a", 8, 50, &[]),
            ],
            8,
            100,
        );
        let backlogs = own_backlogs(&alone, &weights(&["a", "b"]));
        assert_eq!(backlogs[1], Some(OwnBacklog::Served(50)));

        let mut shared = alone.clone();
        shared.records.push(record("b1", "b", 8, 0, &[]));
        let backlogs = own_backlogs(&shared, &weights(&["a", "b"]));
        assert_eq!(backlogs[1], Some(OwnBacklog::BeyondHorizon));
        let beyond = OwnBacklog::BeyondHorizon;
        assert!(beyond.longer_than(49, 50, 100));
        assert!(!beyond.longer_than(50, 50, 100));
        // An account without a weight is not measured.
        assert_eq!(own_backlogs(&shared, &weights(&["a"]))[2], None);
    }

    /// The same measures second by second, straight from their definitions: the own backlog
    /// (`others_keep` 1, not `from_start`) and the shortest waits (`from_start`).
    fn reference(
        run: &SimResult,
        weights: &BTreeMap<String, u32>,
        others_keep: f64,
        from_start: bool,
    ) -> Vec<Option<OwnBacklog>> {
        let accounts: Vec<&String> = weights.keys().collect();
        let of = |r: &JobRecord| accounts.iter().position(|a| **a == r.spec.account.as_str());
        let held = |r: &JobRecord, t: i64| {
            r.runs
                .iter()
                .filter(|x| x.start_s <= t && t < x.end_s.unwrap_or(run.horizon_s))
                .map(|x| f64::from(x.gpus))
                .sum::<f64>()
        };
        // What each account is served at in second t: its share plus what the others give up,
        // up to what it asks for.
        let rate_at = |t: i64| {
            let claims: Vec<(f64, f64)> = accounts
                .iter()
                .enumerate()
                .map(|(a, _)| {
                    let demand: f64 = run
                        .records
                        .iter()
                        .filter(|r| of(r) == Some(a))
                        .filter(|r| r.spec.submit_s <= t && t < r.end_s.unwrap_or(run.horizon_s))
                        .map(|r| f64::from(r.spec.gpus))
                        .sum();
                    (1.0, demand)
                })
                .collect();
            let shares = water_fill(f64::from(run.total_gpus), &claims);
            (0..accounts.len())
                .map(|a| {
                    let others: f64 = (0..accounts.len())
                        .filter(|b| *b != a)
                        .map(|b| shares[b])
                        .sum();
                    (shares[a] + (1.0 - others_keep) * others).min(claims[a].1)
                })
                .collect::<Vec<f64>>()
        };
        let rates: Vec<Vec<f64>> = (0..run.horizon_s).map(rate_at).collect();
        let work = |r: &JobRecord| (0..run.horizon_s).map(|t| held(r, t)).sum::<f64>();
        run.records
            .iter()
            .enumerate()
            .map(|(j, job)| {
                let a = of(job)?;
                let s = job.spec.submit_s;
                let before =
                    |i: usize, r: &JobRecord| of(r) == Some(a) && (r.spec.submit_s, i) < (s, j);
                let submitted: f64 = run
                    .records
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| before(*i, r))
                    .map(|(_, r)| work(r))
                    .sum();
                let done: f64 = run
                    .records
                    .iter()
                    .filter(|r| of(r) == Some(a))
                    .map(|r| (0..s).map(|t| held(r, t)).sum::<f64>())
                    .sum();
                // Served from the submission after what the run held, or from the start.
                let (ahead, from) = if from_start {
                    (submitted, 0)
                } else {
                    (submitted - done, s)
                };
                if ahead < 1.0 {
                    return Some(OwnBacklog::Served(0));
                }
                let mut delivered = 0.0;
                for t in from..run.horizon_s {
                    delivered += rates[t as usize][a];
                    if delivered >= ahead - 1e-9 {
                        return Some(OwnBacklog::Served((t + 1 - s).max(0)));
                    }
                }
                Some(OwnBacklog::BeyondHorizon)
            })
            .collect()
    }

    fn job() -> impl Strategy<Value = (u8, u32, i64, Option<(i64, i64)>)> {
        (
            0u8..3,
            1u32..=8,
            0i64..60,
            prop::option::of((0i64..60, 1i64..40)),
        )
    }

    proptest! {
        #[test]
        fn agrees_with_a_second_by_second_reference(
            jobs in prop::collection::vec(job(), 1..10),
            others_keep in prop::sample::select(vec![1.0, 0.75, 0.5, 0.0]),
        ) {
            let horizon = 120;
            let records: Vec<JobRecord> = jobs
                .iter()
                .enumerate()
                .map(|(i, (a, gpus, submit, run))| {
                    let account = ["a", "b", "c"][usize::from(*a)];
                    let runs: Vec<(i64, i64)> = run
                        .map(|(after, len)| {
                            let start = (submit + after).min(horizon - 1);
                            (start, (start + len).min(horizon))
                        })
                        .into_iter()
                        .collect();
                    record(&format!("j{i}"), account, *gpus, *submit, &runs)
                })
                .collect();
            let run = result(records, 8, horizon);
            let weights = weights(&["a", "b"]);
            prop_assert_eq!(own_backlogs(&run, &weights), reference(&run, &weights, 1.0, false));
            prop_assert_eq!(
                shortest_waits(&run, &weights, others_keep),
                reference(&run, &weights, others_keep, true)
            );
        }
    }
}
