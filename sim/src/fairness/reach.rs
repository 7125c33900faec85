//! How much of the weeks' shortfall against the fair share only preemption could have avoided.
//!
//! A job started while no other job waited took GPUs nobody else asked for: a scheduler that
//! keeps GPUs busy starts it, and one that never preempts leaves it running until it ends,
//! however the accounts that ask later rank. Call those jobs *settled*. Through a week, every
//! account keeps what its settled jobs hold; everything else (the cluster less what all
//! settled jobs hold) could have gone to any account, each up to what it asked for beyond its
//! own settled jobs. Whether every account with demand could have had 0.8 (or half) of its fair
//! share that week is then a flow problem: each account needs what its settled jobs leave short
//! of that target, and each moment's free capacity goes to the accounts asking at that moment.
//! The part of the needs no flow can carry is *out of reach*: no schedule that makes the same
//! settled starts and preempts nothing could have delivered it, whatever it started once work
//! waited. Node boundaries are ignored (any GPU may go to any job), which only makes more
//! reachable, so what is out of reach here is out of reach on the real nodes too. What the week
//! actually fell short by is never less than what was out of reach.

use std::collections::{BTreeMap, BTreeSet};

use gpuledger_model::SHARE_UNITS_PER_GPU;
use gpuledger_scheduler::SimResult;

use super::{account_index, refused, waits, AccountWeek, WEEK_S};

/// One week's shortfall against a fraction of the fair shares.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WeekShortfall {
    /// Weeks since the first submission.
    pub week: usize,
    /// GPU-seconds the accounts' counted weeks ([`AccountWeek::counts`]) received short of the
    /// fraction of their fair shares, summed over the accounts below it.
    pub short_gpu_s: f64,
    /// Of the GPU-seconds the fraction asked beyond the accounts' settled jobs, those no
    /// schedule that preempts nothing could have delivered: at most `short_gpu_s`.
    pub out_of_reach_gpu_s: f64,
}

/// Per week with a shortfall, [`WeekShortfall`] against `fraction` of the fair shares in `weeks`
/// (from [`super::weekly_shares`] of the same run and `weights`).
pub fn shortfalls(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
    weeks: &[AccountWeek],
    fraction: f64,
) -> Vec<WeekShortfall> {
    shortfalls_at(result, weights, weeks, &[fraction])
        .pop()
        .unwrap_or_default()
}

/// [`shortfalls`] against each of `fractions`, in their order, from one sweep over the run.
pub fn shortfalls_at(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
    weeks: &[AccountWeek],
    fractions: &[f64],
) -> Vec<Vec<WeekShortfall>> {
    let index = account_index(weights);
    // Per fraction, each week's shortfall and targets (account, GPU-seconds).
    type Targets = BTreeMap<usize, (f64, Vec<(usize, f64)>)>;
    let by_fraction: Vec<Targets> = fractions
        .iter()
        .map(|&fraction| {
            let mut by_week: Targets = BTreeMap::new();
            for w in weeks.iter().filter(|w| w.counts()) {
                let (short, targets) = by_week.entry(w.week).or_default();
                *short += (fraction * w.fair_gpu_s - w.received_gpu_s).max(0.0);
                if let Some(&a) = index.get(w.account.as_str()) {
                    targets.push((a, fraction * w.fair_gpu_s));
                }
            }
            by_week.retain(|_, (short, _)| *short > 0.0);
            by_week
        })
        .collect();
    let mut out: Vec<BTreeMap<usize, WeekShortfall>> = vec![BTreeMap::new(); fractions.len()];
    let wanted: BTreeSet<usize> = by_fraction.iter().flat_map(|b| b.keys().copied()).collect();
    if !wanted.is_empty() {
        for_each_settled_week(result, weights, &wanted, &mut |week, settled_week| {
            for (by_week, out) in by_fraction.iter().zip(&mut out) {
                if let Some((short, targets)) = by_week.get(&week) {
                    out.insert(week, out_of_reach(week, *short, targets, &settled_week));
                }
            }
        });
    }
    // A week the sweep never reached (past the horizon) had nothing free.
    let nothing = SettledWeek::default();
    by_fraction
        .iter()
        .zip(out)
        .map(|(by_week, mut out)| {
            for (week, (short, targets)) in by_week {
                out.entry(*week)
                    .or_insert_with(|| out_of_reach(*week, *short, targets, &nothing));
            }
            out.into_values().collect()
        })
        .collect()
}

/// The week's shortfall `short` (GPU-seconds) and what of `targets` (account, GPU-seconds) no
/// flow over its slices could carry beyond the accounts' settled jobs.
fn out_of_reach(
    week: usize,
    short: f64,
    targets: &[(usize, f64)],
    SettledWeek { settled, slices }: &SettledWeek,
) -> WeekShortfall {
    let unit = f64::from(SHARE_UNITS_PER_GPU);
    // Each account's need beyond its settled jobs, in share-unit-seconds.
    let needs: Vec<(usize, i64)> = targets
        .iter()
        .map(|&(a, target)| {
            let held = settled.get(a).copied().unwrap_or(0);
            (a, (target * unit - held as f64).ceil() as i64)
        })
        .filter(|(_, need)| *need > 0)
        .collect();
    let asked: i64 = needs.iter().map(|(_, need)| need).sum();
    let carried = max_flow(&needs, slices);
    WeekShortfall {
        week,
        short_gpu_s: short,
        out_of_reach_gpu_s: (asked - carried) as f64 / unit,
    }
}

/// A moment's free capacity and what each account asked for beyond its settled jobs, both in
/// share-unit-seconds over the stretch.
struct Slice {
    free: i64,
    asks: Vec<(usize, i64)>,
}

/// One week: what each account's settled jobs held (share-unit-seconds, in `weights`' order)
/// and the slices between changes of demand or settled jobs.
#[derive(Default)]
struct SettledWeek {
    settled: Vec<i64>,
    slices: Vec<Slice>,
}

/// [`SettledWeek`] of each of `wanted` to `visit`, in week order, from one sweep over the run
/// (one week's slices held at a time).
fn for_each_settled_week(
    result: &SimResult,
    weights: &BTreeMap<String, u32>,
    wanted: &BTreeSet<usize>,
    visit: &mut impl FnMut(usize, SettledWeek),
) {
    let index = account_index(weights);
    let refused = refused(result);
    let horizon = result.horizon_s;
    let n = weights.len();
    let kept = || {
        result
            .records
            .iter()
            .filter(|r| !refused.contains(r.spec.id.as_str()))
    };
    let waiting = merged(kept().flat_map(|r| waits(r, horizon)).collect());
    // (time, account or none, change of settled units, change of demanded units)
    let mut changes: Vec<(i64, Option<usize>, i64, i64)> = Vec::new();
    for r in kept() {
        let account = index.get(r.spec.account.as_str()).copied();
        for run in r.runs.iter().filter(|run| !within(&waiting, run.start_s)) {
            let end = run.end_s.unwrap_or(horizon).min(horizon);
            let units = run.share_units() as i64;
            if end > run.start_s {
                changes.push((run.start_s, account, units, 0));
                changes.push((end, account, -units, 0));
            }
        }
        let end = r.end_s.unwrap_or(horizon).min(horizon);
        if account.is_some() && end > r.spec.submit_s {
            let units = r.spec.share_units_of(r.spec.gpus) as i64;
            changes.push((r.spec.submit_s, account, 0, units));
            changes.push((end, account, 0, -units));
        }
    }
    // Week boundaries cut the stretches too.
    for week in wanted {
        for edge in [*week as i64, *week as i64 + 1] {
            changes.push((result.start_s + edge * WEEK_S, None, 0, 0));
        }
    }
    changes.sort_unstable_by_key(|c| c.0);
    let capacity = i64::from(result.total_gpus) * i64::from(SHARE_UNITS_PER_GPU);
    let (mut all, mut settled, mut demand) = (0i64, vec![0i64; n], vec![0i64; n]);
    let mut current: Option<(usize, SettledWeek)> = None;
    let mut k = 0;
    while k < changes.len() {
        let t = changes[k].0;
        while k < changes.len() && changes[k].0 == t {
            let (_, account, settles, asks) = changes[k];
            all += settles;
            if let Some(a) = account {
                settled[a] += settles;
                demand[a] += asks;
            }
            k += 1;
        }
        let next = changes.get(k).map_or(horizon, |c| c.0).min(horizon);
        let span = next - t;
        let Ok(week) = usize::try_from((t - result.start_s).div_euclid(WEEK_S)) else {
            continue;
        };
        if span <= 0 || !wanted.contains(&week) {
            continue;
        }
        if current.as_ref().is_some_and(|(w, _)| *w != week) {
            if let Some((done, settled_week)) = current.take() {
                visit(done, settled_week);
            }
        }
        let (_, this) = current.get_or_insert_with(|| {
            (
                week,
                SettledWeek {
                    settled: vec![0; n],
                    slices: Vec::new(),
                },
            )
        });
        for (total, held) in this.settled.iter_mut().zip(&settled) {
            *total += held * span;
        }
        let asks: Vec<(usize, i64)> = demand
            .iter()
            .zip(&settled)
            .enumerate()
            .map(|(a, (asked, held))| (a, (asked - held).max(0) * span))
            .filter(|(_, ask)| *ask > 0)
            .collect();
        let free = (capacity - all).max(0) * span;
        if free > 0 && !asks.is_empty() {
            this.slices.push(Slice { free, asks });
        }
    }
    if let Some((done, settled_week)) = current {
        visit(done, settled_week);
    }
}

/// Stretches sorted and joined where they touch or overlap.
fn merged(mut stretches: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    stretches.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(stretches.len());
    for (from, to) in stretches {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

/// Whether `t` falls in one of the sorted, disjoint stretches `[from, to)`.
fn within(stretches: &[(i64, i64)], t: i64) -> bool {
    let after = stretches.partition_point(|(from, _)| *from <= t);
    after > 0 && t < stretches[after - 1].1
}

/// The most of `needs` (account, amount) the slices can carry, each slice giving at most its
/// free capacity, to each account at most what it asks in that slice (Dinic's algorithm on
/// source -> accounts -> slices -> sink).
fn max_flow(needs: &[(usize, i64)], slices: &[Slice]) -> i64 {
    let mut graph = Graph::new(2 + needs.len() + slices.len());
    let (source, sink) = (0, 1);
    let node_of: BTreeMap<usize, usize> = needs
        .iter()
        .enumerate()
        .map(|(i, (a, need))| {
            graph.edge(source, 2 + i, *need);
            (*a, 2 + i)
        })
        .collect();
    for (j, slice) in slices.iter().enumerate() {
        let node = 2 + needs.len() + j;
        let mut linked = false;
        for (a, ask) in &slice.asks {
            if let Some(&from) = node_of.get(a) {
                graph.edge(from, node, *ask);
                linked = true;
            }
        }
        if linked {
            graph.edge(node, sink, slice.free);
        }
    }
    graph.max_flow(source, sink)
}

/// A flow network: edges in pairs (forward, residual), each `(to, capacity left)`.
struct Graph {
    edges: Vec<(usize, i64)>,
    out: Vec<Vec<usize>>,
}

impl Graph {
    fn new(nodes: usize) -> Graph {
        Graph {
            edges: Vec::new(),
            out: vec![Vec::new(); nodes],
        }
    }

    fn edge(&mut self, from: usize, to: usize, capacity: i64) {
        self.out[from].push(self.edges.len());
        self.edges.push((to, capacity));
        self.out[to].push(self.edges.len());
        self.edges.push((from, 0));
    }

    fn max_flow(&mut self, source: usize, sink: usize) -> i64 {
        let mut flow = 0;
        loop {
            let Some(level) = self.levels(source, sink) else {
                return flow;
            };
            let mut next = vec![0usize; self.out.len()];
            loop {
                let pushed = self.push(source, sink, i64::MAX, &level, &mut next);
                if pushed == 0 {
                    break;
                }
                flow += pushed;
            }
        }
    }

    /// Each node's distance from the source over edges with capacity left, if the sink is
    /// reachable.
    fn levels(&self, source: usize, sink: usize) -> Option<Vec<u32>> {
        let mut level = vec![u32::MAX; self.out.len()];
        level[source] = 0;
        let mut queue = std::collections::VecDeque::from([source]);
        while let Some(v) = queue.pop_front() {
            for &e in &self.out[v] {
                let (to, left) = self.edges[e];
                if left > 0 && level[to] == u32::MAX {
                    level[to] = level[v] + 1;
                    queue.push_back(to);
                }
            }
        }
        (level[sink] != u32::MAX).then_some(level)
    }

    /// One augmenting path's flow along the level graph (the graph is three edges deep, so
    /// the recursion is too).
    fn push(
        &mut self,
        v: usize,
        sink: usize,
        limit: i64,
        level: &[u32],
        next: &mut [usize],
    ) -> i64 {
        if v == sink {
            return limit;
        }
        while next[v] < self.out[v].len() {
            let e = self.out[v][next[v]];
            let (to, left) = self.edges[e];
            if left > 0 && level[to] == level[v] + 1 {
                let pushed = self.push(to, sink, limit.min(left), level, next);
                if pushed > 0 {
                    self.edges[e].1 -= pushed;
                    self.edges[e ^ 1].1 += pushed;
                    return pushed;
                }
            }
            next[v] += 1;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairness::weekly_shares;
    use crate::test_records::{record, replay};
    use gpuledger_model::job::Outcome;
    use proptest::prelude::*;

    fn ended(mut r: gpuledger_scheduler::JobRecord) -> gpuledger_scheduler::JobRecord {
        r.outcome = Some(Outcome::Completed);
        r
    }

    fn weights(accounts: &[&str]) -> BTreeMap<String, u32> {
        accounts.iter().map(|a| (a.to_string(), 1)).collect()
    }

    fn week_of(result: &SimResult, w: &BTreeMap<String, u32>, fraction: f64) -> Vec<WeekShortfall> {
        shortfalls(result, w, &weekly_shares(result, w), fraction)
    }

    const DAY: i64 = 86_400;

    #[test]
    fn gpus_settled_while_nothing_waited_put_the_share_out_of_reach() {
        // a takes all 8 GPUs for two weeks while nothing waits; b's 8-GPU job, submitted on
        // day 1, starts when a's ends. b's fair share from day 1 is half the cluster: 0.8 of
        // it in week 0 is 3.2 GPUs for 6 days, none of it within reach.
        let records = vec![
            ended(record("a1", "a", 8, 0, &[(0, 2 * WEEK_S)])),
            ended(record("b1", "b", 8, DAY, &[(2 * WEEK_S, 3 * WEEK_S)])),
        ];
        let result = replay(records, Vec::new(), 8, 3 * WEEK_S);
        let got = week_of(&result, &weights(&["a", "b"]), 0.8);
        let want = 0.8 * 4.0 * (6 * DAY) as f64;
        assert_eq!(got[0].week, 0);
        assert!((got[0].short_gpu_s - want).abs() < 1.0, "{got:?}");
        assert!((got[0].out_of_reach_gpu_s - want).abs() < 1.0, "{got:?}");
    }

    #[test]
    fn gpus_started_while_a_job_waited_were_within_reach() {
        // b waits from day 1; on day 2 a's second job takes the GPUs a's first left. Those
        // GPUs could have been b's, so b's shortfall in week 0 is the policy's, not settled.
        let records = vec![
            ended(record("a1", "a", 8, 0, &[(0, 2 * DAY)])),
            ended(record("a2", "a", 8, DAY, &[(2 * DAY, WEEK_S)])),
            ended(record("b1", "b", 4, DAY, &[(WEEK_S, WEEK_S + DAY)])),
        ];
        let result = replay(records, Vec::new(), 8, 2 * WEEK_S);
        let got = week_of(&result, &weights(&["a", "b"]), 0.8);
        assert!(got[0].short_gpu_s > 0.0, "{got:?}");
        // Day 1 to 2 was settled by a1 (started with nothing waiting), but the five days
        // after were b's to take: 4 GPUs for 5 days is more than 0.8 of its 4 for 6.
        assert_eq!(got[0].out_of_reach_gpu_s, 0.0, "{got:?}");
    }

    #[test]
    fn one_moment_s_free_gpus_serve_one_account_or_the_other_not_both() {
        // Three accounts of one weight, 4 GPUs: c settles 2 of them for the week before anyone
        // else asks; a and b then ask for 4 each. Each account's fair share is 4/3 GPUs, 0.8 of
        // it 16/15: a alone or b alone could have had that from the 2 free GPUs, not both.
        let records = vec![
            ended(record("c1", "c", 2, 0, &[(0, WEEK_S)])),
            ended(record("a1", "a", 4, 1, &[(WEEK_S, WEEK_S + 1)])),
            ended(record("b1", "b", 4, 1, &[(WEEK_S, WEEK_S + 1)])),
        ];
        let result = replay(records, Vec::new(), 4, WEEK_S + 1);
        let w = weights(&["a", "b", "c"]);
        let weeks = weekly_shares(&result, &w);
        let fair_a = weeks
            .iter()
            .find(|x| x.account == "a" && x.week == 0)
            .unwrap();
        let got = shortfalls(&result, &w, &weeks, 0.8);
        // a and b need 0.8 of their shares each; only 2 GPUs of free capacity for both.
        let need = 2.0 * 0.8 * fair_a.fair_gpu_s;
        let free = 2.0 * (WEEK_S - 1) as f64;
        assert!(need > free, "the case needs more than is free");
        assert!(
            (got[0].out_of_reach_gpu_s - (need - free)).abs() < 2.0,
            "{got:?} need {need} free {free}"
        );
    }

    proptest! {
        /// Whatever the schedule, what was out of reach is at most what the week fell short by.
        #[test]
        fn out_of_reach_is_never_more_than_the_shortfall(
            jobs in prop::collection::vec(
                (0usize..3, 1u32..=4, 0i64..20, 0i64..20, 1i64..20),
                1..24,
            ),
            fraction in prop::sample::select(vec![0.5, 0.8, 1.0]),
        ) {
            // Jobs placed one after another on a 4-GPU cluster so that they never hold more
            // than it: each starts at or after its submission, when its GPUs are free.
            let hour = 3_600;
            let mut free_at = [0i64; 4];
            let mut records = Vec::new();
            for (i, (account, gpus, submit, delay, hours)) in jobs.into_iter().enumerate() {
                let submit = submit * 6 * hour;
                let mut slots: Vec<usize> = (0..4).collect();
                slots.sort_by_key(|s| free_at[*s]);
                let taken = &slots[..gpus as usize];
                let start = taken.iter().map(|s| free_at[*s]).max().unwrap().max(submit)
                    + delay * hour;
                let end = start + hours * hour;
                for s in taken {
                    free_at[*s] = end;
                }
                let name = ["a", "b", "c"][account];
                records.push(ended(record(&format!("j{i}"), name, gpus, submit, &[(start, end)])));
            }
            let horizon = free_at.iter().copied().max().unwrap();
            let result = replay(records, Vec::new(), 4, horizon);
            let w = weights(&["a", "b", "c"]);
            let alone = week_of(&result, &w, fraction);
            for week in &alone {
                prop_assert!(week.out_of_reach_gpu_s >= 0.0, "{week:?}");
                prop_assert!(week.out_of_reach_gpu_s <= week.short_gpu_s + 1.0, "{week:?}");
            }
            // One sweep for several fractions gives each what a sweep of its own does.
            let weeks = weekly_shares(&result, &w);
            let together = shortfalls_at(&result, &w, &weeks, &[0.5, fraction]);
            prop_assert_eq!(&together[1], &alone);
            prop_assert_eq!(&together[0], &shortfalls(&result, &w, &weeks, 0.5));
        }
    }
}
