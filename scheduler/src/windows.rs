//! GPU-seconds allocated per UTC day, per account and per project, for the quota's
//! `gpu_hours_per_day` and `gpu_hours_per_week` (the last seven UTC days, today included).
//! Integers: kept in share-unit-seconds (a part of a GPU counts as its part, exactly) and read
//! as whole GPU-seconds.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuledger_model::quota::{Quota, QuotaDimension};
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, ProjectId, SHARE_UNITS_PER_GPU};

pub const DAY_S: i64 = 86_400;

/// GPU-seconds used in the UTC day of now and in the seven UTC days ending with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowUse {
    pub day_gpu_s: i64,
    pub week_gpu_s: i64,
}

/// The GPU-hour window a job would pass by starting now (`GpuHoursPerDay`, then
/// `GpuHoursPerWeek`; the pending reason is `PendingReason::of_quota`'s): what was used
/// (`used`), what running jobs may still use today up to their time limits (`committed_s`)
/// and what this job would use today (`need_s`), against `quota`'s day and week. Later days
/// are checked as later jobs start. gpuledger's scheduler and `gpuledger slurm steer` both
/// decide with this one function.
pub fn gpu_hours_verdict(
    quota: &Quota,
    used: WindowUse,
    committed_s: i64,
    need_s: i64,
) -> Option<QuotaDimension> {
    let over = |limit: u64, used: i64| {
        used.saturating_add(committed_s).saturating_add(need_s)
            > i64::try_from(limit.saturating_mul(3600)).unwrap_or(i64::MAX)
    };
    if quota
        .gpu_hours_per_day
        .is_some_and(|l| over(l, used.day_gpu_s))
    {
        return Some(QuotaDimension::GpuHoursPerDay);
    }
    if quota
        .gpu_hours_per_week
        .is_some_and(|l| over(l, used.week_gpu_s))
    {
        return Some(QuotaDimension::GpuHoursPerWeek);
    }
    None
}

/// GPU-seconds `gpus` held from `now` until `end` use in the UTC day of `now`.
pub fn today_part(gpus: u32, now: UnixSeconds, end: UnixSeconds) -> i64 {
    let day_end = (day_of(now) + 1) * DAY_S;
    i64::from(gpus) * (end.min(day_end) - now).max(0)
}

/// The UTC day of a time, as days since the epoch.
pub fn day_of(t: UnixSeconds) -> i64 {
    t.div_euclid(DAY_S)
}

/// Who a figure is for: an account as a whole, or one of its projects.
pub type WindowKey = (AccountId, Option<ProjectId>);

/// Only accounts with a GPU-hour quota (on themselves or a project) are tracked: the others
/// never need the figures, and a simulator accrues usage at every event.
#[derive(Clone, Debug, Default)]
pub struct UsageWindows {
    tracked: HashSet<AccountId>,
    days: HashMap<WindowKey, BTreeMap<i64, i64>>,
    pruned_through: i64,
}

impl UsageWindows {
    pub fn tracking(accounts: impl IntoIterator<Item = AccountId>) -> Self {
        UsageWindows {
            tracked: accounts.into_iter().collect(),
            days: HashMap::new(),
            pruned_through: i64::MIN,
        }
    }

    /// Adds `units` share units held over `[from, to)` to the account and, when named, the
    /// project.
    pub fn record(
        &mut self,
        account: &AccountId,
        project: Option<&ProjectId>,
        units: u64,
        from: UnixSeconds,
        to: UnixSeconds,
    ) {
        if !self.tracked.contains(account) {
            return;
        }
        let mut t = from;
        while t < to {
            let day = day_of(t);
            let until = to.min((day + 1) * DAY_S);
            let unit_s = units as i64 * (until - t);
            *self
                .days
                .entry((account.clone(), None))
                .or_default()
                .entry(day)
                .or_default() += unit_s;
            if let Some(p) = project {
                *self
                    .days
                    .entry((account.clone(), Some(p.clone())))
                    .or_default()
                    .entry(day)
                    .or_default() += unit_s;
            }
            t = until;
        }
    }

    /// GPU-seconds of the UTC day `day` (rounded down).
    pub fn day(&self, key: &WindowKey, day: i64) -> i64 {
        self.days
            .get(key)
            .and_then(|d| d.get(&day))
            .copied()
            .unwrap_or(0)
            / i64::from(SHARE_UNITS_PER_GPU)
    }

    /// GPU-seconds of the seven UTC days ending with `day` (rounded down).
    pub fn week(&self, key: &WindowKey, day: i64) -> i64 {
        self.days
            .get(key)
            .map(|d| d.range(day - 6..=day).map(|(_, v)| *v).sum::<i64>())
            .unwrap_or(0)
            / i64::from(SHARE_UNITS_PER_GPU)
    }

    /// Forgets days no week window can reach any more.
    pub fn prune(&mut self, today: i64) {
        if today <= self.pruned_through {
            return;
        }
        self.pruned_through = today;
        for d in self.days.values_mut() {
            *d = d.split_off(&(today - 6));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_counts_used_committed_and_needed_against_day_then_week() {
        let quota = Quota {
            gpu_hours_per_day: Some(10),
            gpu_hours_per_week: Some(50),
            ..Quota::default()
        };
        let used = WindowUse {
            day_gpu_s: 8 * 3600,
            week_gpu_s: 40 * 3600,
        };
        assert_eq!(
            gpu_hours_verdict(&quota, used, 3600, 3600),
            None,
            "exactly 10"
        );
        assert_eq!(
            gpu_hours_verdict(&quota, used, 3600, 3601),
            Some(QuotaDimension::GpuHoursPerDay)
        );
        let week_bound = WindowUse {
            day_gpu_s: 0,
            week_gpu_s: 49 * 3600,
        };
        assert_eq!(
            gpu_hours_verdict(&quota, week_bound, 0, 3601),
            Some(QuotaDimension::GpuHoursPerWeek)
        );
        assert_eq!(
            gpu_hours_verdict(&Quota::default(), week_bound, i64::MAX, i64::MAX),
            None,
            "no quota, no hold, no overflow"
        );
        assert_eq!(
            today_part(8, DAY_S - 600, DAY_S + 3600),
            8 * 600,
            "cut at midnight"
        );
        assert_eq!(today_part(8, 100, 50), 0);
    }

    #[test]
    fn usage_is_split_at_midnight_and_summed_over_seven_days() {
        let a = AccountId::new("a").unwrap();
        let p = ProjectId::new("p").unwrap();
        let mut w = UsageWindows::tracking([a.clone()]);
        // 8 GPUs from 23:00 on day 10 to 01:00 on day 11.
        let gpus = |n: u64| n * u64::from(SHARE_UNITS_PER_GPU);
        w.record(&a, Some(&p), gpus(8), 11 * DAY_S - 3600, 11 * DAY_S + 3600);
        assert_eq!(w.day(&(a.clone(), None), 10), 8 * 3600);
        assert_eq!(w.day(&(a.clone(), Some(p.clone())), 11), 8 * 3600);
        assert_eq!(w.week(&(a.clone(), None), 16), 16 * 3600);
        assert_eq!(
            w.week(&(a.clone(), None), 17),
            8 * 3600,
            "day 10 has left the week"
        );
        w.prune(18);
        assert_eq!(w.week(&(a.clone(), None), 17), 0);
        // A quarter of a GPU (1,750 units) for an hour is 900 GPU-seconds, and two sevenths
        // for 7 seconds exactly 2.
        w.record(&a, None, 1750, 20 * DAY_S, 20 * DAY_S + 3600);
        assert_eq!(w.day(&(a.clone(), None), 20), 900);
        w.record(&a, None, 2000, 21 * DAY_S, 21 * DAY_S + 7);
        assert_eq!(w.day(&(a, None), 21), 2);
    }
}
