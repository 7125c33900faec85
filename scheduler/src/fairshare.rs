//! Fair share from each account's GPU-hours with exponential decay (a half-life, 7 days by
//! default as in Slurm). The default factor follows entitlement ([`fair_tree_factors`]): among
//! the accounts with work, each one's normalised share over its normalised usage ranks it, so
//! an account under its share always ranks above one over it, whatever their sizes. The design's
//! `weight / (1 + usage / factor)` and Slurm's classic `2^(-usage/share)` are alternatives.

use std::collections::HashMap;

use gpuledger_model::config::FairShareFormula;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::AccountId;

/// How usage decays and how much it counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FairShareParams {
    pub half_life_s: f64,
    /// Decayed GPU-hours that halve an account's priority.
    pub factor_gpu_hours: f64,
}

impl FairShareParams {
    fn decay(&self, elapsed_s: i64) -> f64 {
        gpuledger_model::usage::decay_factor(elapsed_s as f64, self.half_life_s)
    }
}

/// The design's formula: weight divided by one plus usage over factor.
pub fn weighted_priority(weight: f64, usage_gpu_hours: f64, factor_gpu_hours: f64) -> f64 {
    weight / (1.0 + usage_gpu_hours / factor_gpu_hours)
}

/// Slurm's classic fair-share factor: `2^(-usage_share / normalised_share)`, in (0, 1].
pub fn slurm_classic_factor(usage_share: f64, normalised_share: f64) -> f64 {
    if normalised_share <= 0.0 {
        return 0.0;
    }
    (-usage_share / normalised_share).exp2()
}

/// Where an account stands against its fair share of the cluster now (the split `report.md`
/// measures: the cluster split by weight among the accounts with work, none given more than
/// it asks for), as Fair Tree's ranking groups accounts: lower standings rank first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    /// Holds less than the relief's floor of its share (only when the relief is on).
    BelowFloor,
    /// Holds less than its share.
    BelowShare,
    /// Holds its share or more, or the ranking does not look at shares.
    #[default]
    AtShare,
}

impl Standing {
    /// From what an account holds against its share (any one unit); `floor_percent` is the
    /// relief's floor, `None` when the relief is off (no account is then below the floor).
    pub fn of(share: i64, held: i64, floor_percent: Option<u32>) -> Standing {
        let floor = |p: u32| i128::from(held) * 100 < i128::from(share) * i128::from(p);
        if held >= share {
            Standing::AtShare
        } else if floor_percent.is_some_and(floor) {
            Standing::BelowFloor
        } else {
            Standing::BelowShare
        }
    }
}

/// The fair-share factor of a job the relief lifts, whose account has `account_factor` among
/// accounts standing as `standings` ([`fair_tree_factors`]): above every account not below the
/// floor and below every one that is, with the lifted jobs of different accounts in their
/// accounts' order. The ranks are `1/n` apart: the accounts below the floor hold the top `k`,
/// so the lifted jobs take the middle half of the gap between the `k`-th and the next.
pub fn relief_factor(standings: &[Standing], account_factor: f64) -> f64 {
    let n = standings.len().max(1) as f64;
    let below_floor = standings
        .iter()
        .filter(|s| **s == Standing::BelowFloor)
        .count() as f64;
    (n - below_floor + 0.25 + 0.5 * account_factor.clamp(0.0, 1.0)) / n
}

/// Each account's fair-share factor in [0, 1] under `formula`, from its weight, its decayed
/// GPU-hours and whether it has running or waiting work (all in the same order): Fair Tree's
/// rank ([`fair_tree_factors`]), the design's `weight / (1 + usage / factor)` over the largest
/// weight, or Slurm's classic `2^(-usage share / normalised share)`. Under `fair_tree`, the
/// accounts standing below their share (`standings`; empty: all at it) rank above all others.
/// gpuledger's scheduler and `gpuledger slurm steer` both rank accounts with this one function.
pub fn account_factors(
    formula: FairShareFormula,
    factor_gpu_hours: f64,
    weights: &[f64],
    usage: &[f64],
    has_demand: &[bool],
    standings: &[Standing],
) -> Vec<f64> {
    match formula {
        FairShareFormula::FairTree => fair_tree_factors(weights, usage, has_demand, standings),
        FairShareFormula::Weighted => {
            let max_weight = weights.iter().copied().fold(1.0, f64::max);
            weights
                .iter()
                .zip(usage)
                .map(|(w, u)| weighted_priority(*w, *u, factor_gpu_hours) / max_weight)
                .collect()
        }
        FairShareFormula::SlurmClassic => {
            let total_usage: f64 = usage.iter().sum();
            let total_weight: f64 = weights.iter().sum();
            usage
                .iter()
                .zip(weights)
                .map(|(u, w)| {
                    let usage_share = if total_usage > 0.0 {
                        u / total_usage
                    } else {
                        0.0
                    };
                    slurm_classic_factor(usage_share, w / total_weight.max(1.0))
                })
                .collect()
        }
    }
}

/// Fair Tree's factors (Slurm's `PriorityFlags` default since 19.05, for a flat tree of
/// accounts): each account's level fair share is its normalised share `S` over its normalised
/// usage `U`, both taken among the accounts with demand (running or waiting work; an account
/// without any is taken as if it joined them). Accounts are ranked by it, highest first, and the
/// `r`-th of `n` (from 0, ties sharing the rank of the first) gets `(n - r) / n`: under its
/// share (`S/U > 1`) always above over it (`S/U < 1`). No usage at all ranks first.
///
/// Accounts standing below their share (`standings`; an empty slice puts all at it) rank above
/// every one at it, those below the relief's floor first, by level within each group. The
/// scheduler works out the standings from what each account holds now, so that an account
/// that used much last week but holds little today is not passed over by one that used little
/// but holds several times its share today: usage decides the order within each group, and
/// who gets what the shares leave.
pub fn fair_tree_factors(
    weights: &[f64],
    usage: &[f64],
    has_demand: &[bool],
    standings: &[Standing],
) -> Vec<f64> {
    let n = weights.len();
    let sum_over = |values: &[f64]| -> f64 {
        values
            .iter()
            .zip(has_demand)
            .filter(|(_, d)| **d)
            .map(|(v, _)| *v)
            .sum()
    };
    let (weight_with_demand, usage_with_demand) = (sum_over(weights), sum_over(usage));
    let level: Vec<f64> = (0..n)
        .map(|i| {
            let joins = if has_demand[i] { 0.0 } else { 1.0 };
            let share =
                weights[i] / (weight_with_demand + joins * weights[i]).max(f64::MIN_POSITIVE);
            let total_usage = usage_with_demand + joins * usage[i];
            if usage[i] <= 0.0 || total_usage <= 0.0 {
                f64::INFINITY
            } else {
                share / (usage[i] / total_usage)
            }
        })
        .collect();
    // Below the floor, then below the share, then the rest; by level within each group.
    let standing = |i: usize| standings.get(i).copied().unwrap_or_default();
    let rank_order = |a: usize, b: usize| {
        standing(a)
            .cmp(&standing(b))
            .then_with(|| level[b].total_cmp(&level[a]))
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| rank_order(a, b));
    let mut factors = vec![0.0; n];
    let mut rank = 0;
    for (k, &i) in order.iter().enumerate() {
        let prev = k.checked_sub(1).map(|p| order[p]);
        if prev.is_some_and(|p| rank_order(p, i) != std::cmp::Ordering::Equal) {
            rank = k;
        }
        factors[i] = (n - rank) as f64 / n as f64;
    }
    factors
}

/// Each claimant's share of `capacity`: proportional to its weight, none above its demand, what
/// a capped one leaves split among the others the same way. `claims` are `(weight, demand)`.
pub fn water_fill(capacity: f64, claims: &[(f64, f64)]) -> Vec<f64> {
    WaterFill::default().fill(capacity, claims).to_vec()
}

/// [`water_fill`] with its buffers kept, for a caller that splits a capacity many times over
/// (a replay's analysis does at every change of demand).
#[derive(Clone, Debug, Default)]
pub struct WaterFill {
    order: Vec<usize>,
    shares: Vec<f64>,
}

impl WaterFill {
    /// Each claimant's share, as [`water_fill`] gives it.
    pub fn fill(&mut self, capacity: f64, claims: &[(f64, f64)]) -> &[f64] {
        let order = &mut self.order;
        order.clear();
        order.extend((0..claims.len()).filter(|&i| claims[i].0 > 0.0 && claims[i].1 > 0.0));
        // Smallest demand per unit of weight first: those are the ones capped at their demand.
        order.sort_by(|&a, &b| (claims[a].1 / claims[a].0).total_cmp(&(claims[b].1 / claims[b].0)));
        let shares = &mut self.shares;
        shares.clear();
        shares.resize(claims.len(), 0.0);
        let mut left = capacity.max(0.0);
        let mut weight: f64 = order.iter().map(|&i| claims[i].0).sum();
        for (k, &i) in order.iter().enumerate() {
            let (w, demand) = claims[i];
            let level = left / weight;
            if demand <= level * w {
                shares[i] = demand;
                left -= demand;
                weight -= w;
            } else {
                for &j in &order[k..] {
                    shares[j] = level * claims[j].0;
                }
                break;
            }
        }
        shares
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Decayed {
    gpu_seconds: f64,
    as_of: UnixSeconds,
}

/// Decayed usage per account. Fed either by the aggregator's usage feed (live) or by the
/// scheduler's own allocations (simulation); the arithmetic is the same.
///
/// Each account has a slot, so that what records usage at every simulated event for every
/// running job (`record_in`) looks nothing up.
#[derive(Clone, Debug)]
pub struct UsageLedger {
    params: FairShareParams,
    slots: HashMap<AccountId, usize>,
    usage: Vec<Decayed>,
}

impl UsageLedger {
    pub fn new(params: FairShareParams) -> Self {
        UsageLedger {
            params,
            slots: HashMap::new(),
            usage: Vec::new(),
        }
    }

    /// The account's slot, made (with no usage) on first use.
    pub fn slot(&mut self, account: &AccountId) -> usize {
        if let Some(&slot) = self.slots.get(account) {
            return slot;
        }
        self.usage.push(Decayed::default());
        self.slots.insert(account.clone(), self.usage.len() - 1);
        self.usage.len() - 1
    }

    pub fn params(&self) -> FairShareParams {
        self.params
    }

    /// Adds usage that happened at `at`.
    pub fn record(&mut self, account: &AccountId, gpu_seconds: f64, at: UnixSeconds) {
        let slot = self.slot(account);
        self.record_in(slot, gpu_seconds, at);
    }

    /// `record` for the account of `slot` (from [`UsageLedger::slot`]).
    pub fn record_in(&mut self, slot: usize, gpu_seconds: f64, at: UnixSeconds) {
        let Some(entry) = self.usage.get_mut(slot) else {
            return;
        };
        let decayed = entry.gpu_seconds * self.params.decay(at - entry.as_of);
        *entry = Decayed {
            gpu_seconds: decayed + gpu_seconds,
            as_of: at.max(entry.as_of),
        };
    }

    /// Replaces an account's usage with a figure measured elsewhere (the usage feed).
    pub fn set(&mut self, account: &AccountId, gpu_hours: f64, as_of: UnixSeconds) {
        let slot = self.slot(account);
        self.usage[slot] = Decayed {
            gpu_seconds: gpu_hours * 3600.0,
            as_of,
        };
    }

    /// Decayed GPU-hours of an account as of `now`.
    pub fn gpu_hours(&self, account: &AccountId, now: UnixSeconds) -> f64 {
        self.slots
            .get(account)
            .and_then(|&slot| self.usage.get(slot))
            .map(|d| d.gpu_seconds * self.params.decay(now - d.as_of) / 3600.0)
            .unwrap_or(0.0)
    }

    /// The account's fair-share priority as of `now`.
    pub fn priority(&self, account: &AccountId, weight: f64, now: UnixSeconds) -> f64 {
        weighted_priority(
            weight,
            self.gpu_hours(account, now),
            self.params.factor_gpu_hours,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn heavy_past_use_ranks_lower() {
        // The design's example: team A with 5000 GPU-hours ranks below team B with 100.
        let a = weighted_priority(10.0, 5000.0, 1000.0);
        let b = weighted_priority(10.0, 100.0, 1000.0);
        assert!(b > a);
        assert!((a - 10.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn accounts_below_their_share_now_rank_above_the_others_then_by_level() {
        // a used much (level 0.3), b and c little (levels 4 and 2), d least (level 8).
        let (weights, usage, demand) = ([1.0; 4], [30.0, 2.5, 5.0, 1.25], [true; 4]);
        let by_usage = fair_tree_factors(&weights, &usage, &demand, &[]);
        assert_eq!(by_usage, vec![0.25, 0.75, 0.5, 1.0]);
        // a and c hold less than their share now, b and d their share or more: c, then a
        // (by level), then d and b.
        use Standing::*;
        let f = fair_tree_factors(
            &weights,
            &usage,
            &demand,
            &[BelowShare, AtShare, BelowShare, AtShare],
        );
        assert_eq!(f, vec![0.75, 0.25, 1.0, 0.5]);
        // Equal levels either side of the line do not share a rank.
        let f = fair_tree_factors(
            &[1.0, 1.0],
            &[1.0, 1.0],
            &[true, true],
            &[AtShare, BelowShare],
        );
        assert_eq!(f, vec![0.5, 1.0]);
        // With the relief's floor: a, below it, goes before c, below its share only.
        let f = fair_tree_factors(
            &weights,
            &usage,
            &demand,
            &[BelowFloor, AtShare, BelowShare, AtShare],
        );
        assert_eq!(f, vec![1.0, 0.25, 0.75, 0.5]);
    }

    #[test]
    fn standings_split_at_the_share_and_at_the_floor() {
        use Standing::*;
        assert_eq!(Standing::of(100, 100, Some(80)), AtShare);
        assert_eq!(Standing::of(100, 130, Some(80)), AtShare);
        assert_eq!(Standing::of(100, 80, Some(80)), BelowShare);
        assert_eq!(Standing::of(100, 79, Some(80)), BelowFloor);
        assert_eq!(Standing::of(100, 79, None), BelowShare);
        assert_eq!(Standing::of(100, 0, Some(0)), BelowShare);
        assert_eq!(Standing::of(0, 0, Some(80)), AtShare);
        assert_eq!(Standing::of(i64::MAX, 0, Some(100)), BelowFloor);
    }

    #[test]
    fn lifted_jobs_rank_between_the_accounts_below_the_floor_and_the_rest() {
        use Standing::*;
        let (weights, usage, demand) = ([1.0; 4], [30.0, 2.5, 5.0, 1.25], [true; 4]);
        let standings = [BelowFloor, AtShare, BelowShare, AtShare];
        let f = fair_tree_factors(&weights, &usage, &demand, &standings);
        let lifted: Vec<f64> = f.iter().map(|a| relief_factor(&standings, *a)).collect();
        let below_floor = f[0];
        let top_of_the_rest = f[1].max(f[2]).max(f[3]);
        for l in &lifted {
            assert!(*l < below_floor && *l > top_of_the_rest, "{l} in {f:?}");
        }
        // Among lifted jobs their accounts' order holds: c (0.75), d (0.5), b (0.25).
        assert!(lifted[2] > lifted[3] && lifted[3] > lifted[1], "{lifted:?}");
        // Nobody below the floor: lifted jobs rank above every account.
        let standings = [BelowShare, AtShare];
        let f = fair_tree_factors(&[1.0, 1.0], &[1.0, 2.0], &[true, true], &standings);
        assert!(relief_factor(&standings, f[1]) > f[0], "{f:?}");
    }

    #[test]
    fn usage_halves_every_half_life() {
        let params = FairShareParams {
            half_life_s: 7.0 * 86_400.0,
            factor_gpu_hours: 1000.0,
        };
        let mut ledger = UsageLedger::new(params);
        let a = AccountId::new("a").unwrap();
        ledger.record(&a, 3600.0 * 800.0, 0);
        assert!((ledger.gpu_hours(&a, 7 * 86_400) - 400.0).abs() < 1e-6);
        assert!((ledger.gpu_hours(&a, 14 * 86_400) - 200.0).abs() < 1e-6);
    }

    #[test]
    fn under_its_share_ranks_above_over_it_whatever_the_sizes() {
        // A weight-64 account that used 3 cluster-days and a weight-16 one that used a little
        // more than its share: the big one is under its share (64/80 of the weight, 3/4 of the
        // usage), the small one over (16/80, 1/4).
        let factors = fair_tree_factors(
            &[64.0, 16.0, 4.0],
            &[72.0, 24.0, 500.0],
            &[true, true, false],
            &[],
        );
        assert!(factors[0] > factors[1], "{factors:?}");
        // Swap the usage: now the small one is under.
        let factors = fair_tree_factors(&[64.0, 16.0], &[90.0, 2.0], &[true, true], &[]);
        assert!(factors[1] > factors[0], "{factors:?}");
        assert_eq!(factors, vec![0.5, 1.0]);
        // No usage ranks first; equal standing shares a rank.
        assert_eq!(
            fair_tree_factors(&[2.0, 1.0, 1.0], &[0.0, 4.0, 4.0], &[true, true, true], &[]),
            vec![1.0, 2.0 / 3.0, 2.0 / 3.0]
        );
    }

    #[test]
    fn classic_factor_is_one_half_at_fair_use() {
        assert!((slurm_classic_factor(0.2, 0.2) - 0.5).abs() < 1e-12);
        assert_eq!(slurm_classic_factor(0.0, 0.2), 1.0);
    }

    #[test]
    fn capped_claimants_leave_their_rest_to_the_others_by_weight() {
        // 100 GPUs; weights 1, 1, 2; the first asks for 10 only.
        let shares = water_fill(100.0, &[(1.0, 10.0), (1.0, 500.0), (2.0, 500.0)]);
        assert_eq!(shares, vec![10.0, 30.0, 60.0]);
        // Nobody asks for more than there is: each gets its demand.
        assert_eq!(
            water_fill(100.0, &[(5.0, 20.0), (1.0, 30.0)]),
            vec![20.0, 30.0]
        );
        // No demand, no share.
        assert_eq!(
            water_fill(100.0, &[(5.0, 0.0), (1.0, 300.0)]),
            vec![0.0, 100.0]
        );
    }

    /// The reference: raise every uncapped claimant's share in small equal steps per unit of
    /// weight until the capacity or every demand is used up.
    fn reference(capacity: f64, claims: &[(f64, f64)]) -> Vec<f64> {
        let mut shares = vec![0.0; claims.len()];
        let step = 1e-3;
        let mut used = 0.0;
        loop {
            let open: Vec<usize> = (0..claims.len())
                .filter(|&i| claims[i].1 - shares[i] > 1e-9)
                .collect();
            let want: f64 = open.iter().map(|&i| claims[i].0 * step).sum();
            if open.is_empty() || used + want > capacity {
                break;
            }
            for &i in &open {
                let add = (claims[i].0 * step).min(claims[i].1 - shares[i]);
                shares[i] += add;
                used += add;
            }
        }
        shares
    }

    #[test]
    fn a_kept_water_fill_splits_each_time_as_a_fresh_one() {
        // Its buffers hold the last split: a longer, then shorter, then empty claim list.
        let mut kept = WaterFill::default();
        for claims in [
            vec![(1.0, 10.0), (1.0, 500.0), (2.0, 500.0)],
            vec![(5.0, 20.0), (1.0, 30.0), (3.0, 0.0), (1.0, 7.5)],
            vec![(1.0, 300.0)],
            vec![],
        ] {
            assert_eq!(
                kept.fill(100.0, &claims),
                water_fill(100.0, &claims).as_slice()
            );
            assert_eq!(kept.fill(100.0, &claims).len(), claims.len());
        }
    }

    proptest! {
        #[test]
        fn water_filling_matches_the_step_by_step_reference(
            capacity in 1u32..64,
            claims in prop::collection::vec((1u32..5, 0u32..40), 1..5),
        ) {
            let claims: Vec<(f64, f64)> =
                claims.iter().map(|(w, d)| (f64::from(*w), f64::from(*d))).collect();
            let fast = water_fill(f64::from(capacity), &claims);
            let slow = reference(f64::from(capacity), &claims);
            let total_demand: f64 = claims.iter().map(|c| c.1).sum();
            let given: f64 = fast.iter().sum();
            prop_assert!((given - total_demand.min(f64::from(capacity))).abs() < 1e-6);
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                prop_assert!(*f <= claims[i].1 + 1e-9, "above demand");
                // The reference stops one step short of the exact level.
                prop_assert!((f - s).abs() <= 0.01 * claims[i].0 + 1e-6, "{fast:?} against {slow:?}");
            }
        }
    }
}
