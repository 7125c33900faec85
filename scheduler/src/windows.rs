//! GPU-seconds allocated per UTC day, per account and per project, for the quota's
//! `gpu_hours_per_day` and `gpu_hours_per_week` (the last seven UTC days, today included).
//! Integers: kept in share-unit-seconds (a part of a GPU counts as its part, exactly) and read
//! as whole GPU-seconds.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuledger_model::quota::{Quota, QuotaDimension};
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, ProjectId, SHARE_UNITS_PER_GPU};

pub const DAY_S: i64 = 86_400;

/// GPU-seconds by UTC day still to come: what running jobs may use up to their time limits,
/// or what a job would use from now to its limit. Kept in share-unit-seconds, read as whole
/// GPU-seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaySpread {
    by_day: BTreeMap<i64, i64>,
}

impl DaySpread {
    /// Adds `units` share units held over `[from, to)`, split at UTC midnights.
    pub fn add(&mut self, units: u64, from: UnixSeconds, to: UnixSeconds) {
        for_each_day(from, to, |day, secs| {
            *self.by_day.entry(day).or_default() += units as i64 * secs;
        });
    }

    /// Adds `gpus` whole GPUs held over `[from, to)`.
    pub fn add_gpus(&mut self, gpus: u32, from: UnixSeconds, to: UnixSeconds) {
        self.add(u64::from(gpus) * u64::from(SHARE_UNITS_PER_GPU), from, to);
    }

    /// GPU-seconds on UTC day `day` (rounded down).
    pub fn on(&self, day: i64) -> i64 {
        self.by_day.get(&day).copied().unwrap_or(0) / i64::from(SHARE_UNITS_PER_GPU)
    }

    /// The first and last days with any use.
    pub fn span(&self) -> Option<(i64, i64)> {
        let first = self.by_day.iter().find(|(_, v)| **v > 0)?.0;
        let last = self.by_day.iter().rev().find(|(_, v)| **v > 0)?.0;
        Some((*first, *last))
    }
}

/// The GPU-hour window a job would break by starting now (`GpuHoursPerDay`, then
/// `GpuHoursPerWeek`; the pending reason is `PendingReason::of_quota`'s), checked on every
/// UTC day it would run into and every seven-day window holding one of them: what was used
/// (`used`, GPU-seconds of a day so far), what running jobs may still use up to their time
/// limits (`committed`) and what this job would use (`need`). A job started before midnight
/// counts against tomorrow too, so no day goes over because yesterday's jobs ran into it.
/// gpuledger's scheduler and `gpuledger slurm steer` both decide with this one function.
pub fn gpu_hours_verdict(
    quota: &Quota,
    used: impl Fn(i64) -> i64,
    committed: &DaySpread,
    need: &DaySpread,
) -> Option<QuotaDimension> {
    let (first, last) = need.span()?;
    // Each day's total is worked out once: a week is checked ending on each day from the
    // first to six after the last, and reaches six days back.
    let (from, to) = if quota.gpu_hours_per_week.is_some() {
        (first - 6, last + 6)
    } else {
        (first, last)
    };
    let totals: Vec<i64> = (from..=to)
        .map(|day| {
            used(day)
                .saturating_add(committed.on(day))
                .saturating_add(need.on(day))
        })
        .collect();
    let total = |day: i64| {
        usize::try_from(day - from)
            .ok()
            .and_then(|i| totals.get(i))
            .copied()
            .unwrap_or(0)
    };
    let over = |limit: u64, gpu_s: i64| {
        gpu_s > i64::try_from(limit.saturating_mul(3600)).unwrap_or(i64::MAX)
    };
    if let Some(limit) = quota.gpu_hours_per_day {
        if (first..=last).any(|day| over(limit, total(day))) {
            return Some(QuotaDimension::GpuHoursPerDay);
        }
    }
    if let Some(limit) = quota.gpu_hours_per_week {
        let week = |end: i64| (end - 6..=end).map(total).fold(0i64, i64::saturating_add);
        if (first..=last + 6).any(|end| over(limit, week(end))) {
            return Some(QuotaDimension::GpuHoursPerWeek);
        }
    }
    None
}

/// Calls `f(day, seconds)` for each UTC day `[from, to)` reaches.
fn for_each_day(from: UnixSeconds, to: UnixSeconds, mut f: impl FnMut(i64, i64)) {
    let mut t = from;
    while t < to {
        let day = day_of(t);
        let until = to.min((day + 1) * DAY_S);
        f(day, until - t);
        t = until;
    }
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

    /// Whether any account has a GPU-hour quota to track.
    pub fn is_tracking(&self) -> bool {
        !self.tracked.is_empty()
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
        if self.tracked.is_empty() || !self.tracked.contains(account) {
            return;
        }
        for_each_day(from, to, |day, secs| {
            let unit_s = units as i64 * secs;
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
        });
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
        let today = 20;
        let noon = today * DAY_S + DAY_S / 2;
        // 8 GPU-hours used today, 32 more over the six days before.
        let used = |day: i64| match day {
            20 => 8 * 3600,
            14..=19 => 32 * 3600 / 6,
            _ => 0,
        };
        let spread = |gpus: u32, from: i64, secs: i64| {
            let mut s = DaySpread::default();
            s.add_gpus(gpus, from, from + secs);
            s
        };
        let committed = spread(1, noon, 3600);
        assert_eq!(
            gpu_hours_verdict(&quota, used, &committed, &spread(1, noon, 3600)),
            None,
            "exactly 10"
        );
        assert_eq!(
            gpu_hours_verdict(&quota, used, &committed, &spread(1, noon, 3601)),
            Some(QuotaDimension::GpuHoursPerDay)
        );
        let week_bound = |day: i64| if day == 19 { 49 * 3600 } else { 0 };
        assert_eq!(
            gpu_hours_verdict(
                &quota,
                week_bound,
                &DaySpread::default(),
                &spread(1, noon, 3601)
            ),
            Some(QuotaDimension::GpuHoursPerWeek)
        );
        assert_eq!(
            gpu_hours_verdict(
                &Quota::default(),
                |_| i64::MAX,
                &spread(u32::MAX, 0, 1 << 40),
                &spread(u32::MAX, 0, 1 << 40)
            ),
            None,
            "no quota, no hold, no overflow"
        );
        // A job started before midnight counts against tomorrow: 4 GPUs from 22:00 for 4
        // hours are 8 GPU-hours today and 8 tomorrow, where a job already running will use 3.
        let late = (today + 1) * DAY_S - 2 * 3600;
        let tomorrow = spread(3, (today + 1) * DAY_S, 3600);
        assert_eq!(
            gpu_hours_verdict(&quota, |_| 0, &tomorrow, &spread(4, late, 4 * 3600)),
            Some(QuotaDimension::GpuHoursPerDay),
            "tomorrow would hold 11"
        );
        assert_eq!(
            gpu_hours_verdict(&quota, |_| 0, &tomorrow, &spread(4, late, 3 * 3600 + 1800)),
            None
        );
        // And against every week that holds a day it runs in, not only the one ending today.
        let mut busy_week = DaySpread::default();
        busy_week.add_gpus(1, (today + 2) * DAY_S, (today + 2) * DAY_S + 45 * 3600);
        assert_eq!(
            gpu_hours_verdict(&quota, |_| 0, &busy_week, &spread(1, noon, 6 * 3600)),
            Some(QuotaDimension::GpuHoursPerWeek),
            "45 committed later this week and 6 now"
        );
        assert_eq!(DaySpread::default().on(3), 0);
    }

    /// The verdict as first written: every day's total (used, committed and needed) worked
    /// out where it is read, for a job running from day `first` to day `last`.
    fn verdict_by_reference(
        quota: &Quota,
        total: impl Fn(i64) -> i64,
        (first, last): (i64, i64),
    ) -> Option<QuotaDimension> {
        let over = |limit: u64, gpu_s: i64| gpu_s > (limit * 3600) as i64;
        let day_over = |limit| (first..=last).any(|day| over(limit, total(day)));
        let week = |end: i64| (end - 6..=end).map(&total).sum::<i64>();
        let week_over = |limit| (first..=last + 6).any(|end| over(limit, week(end)));
        if quota.gpu_hours_per_day.is_some_and(day_over) {
            Some(QuotaDimension::GpuHoursPerDay)
        } else if quota.gpu_hours_per_week.is_some_and(week_over) {
            Some(QuotaDimension::GpuHoursPerWeek)
        } else {
            None
        }
    }

    proptest::proptest! {
        // Cheap cases, and a day at the edge of a window decides only a few of them.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]
        #[test]
        fn the_verdict_is_the_references(
            day_limit in proptest::option::of(1u64..100),
            week_limit in proptest::option::of(50u64..300),
            used in proptest::collection::vec(0i64..40 * 3600, 30),
            running in proptest::collection::vec((1u32..9, 0i64..20 * DAY_S, 1i64..4 * DAY_S), 0..4),
            job in (1u32..9, 0i64..20 * DAY_S, 1i64..9 * DAY_S),
        ) {
            let quota = Quota {
                gpu_hours_per_day: day_limit,
                gpu_hours_per_week: week_limit,
                ..Quota::default()
            };
            let used_on = |day: i64| usize::try_from(day).ok().and_then(|d| used.get(d)).copied().unwrap_or(0);
            let mut committed = DaySpread::default();
            for (gpus, from, secs) in running {
                committed.add_gpus(gpus, from, from + secs);
            }
            let mut need = DaySpread::default();
            need.add_gpus(job.0, job.1, job.1 + job.2);
            let total = |day: i64| used_on(day) + committed.on(day) + need.on(day);
            let days = need.span().expect("a job of at least one GPU-second");
            proptest::prop_assert_eq!(
                gpu_hours_verdict(&quota, used_on, &committed, &need),
                verdict_by_reference(&quota, total, days)
            );
        }
    }

    #[test]
    fn usage_is_split_at_midnight_and_summed_over_seven_days() {
        let a = AccountId::new("a").unwrap();
        let p = ProjectId::new("p").unwrap();
        let mut w = UsageWindows::tracking([a.clone()]);
        // The seven days ending with `day`, as the quota verdict reads them.
        let week = |w: &UsageWindows, day: i64| {
            (day - 6..=day)
                .map(|d| w.day(&(a.clone(), None), d))
                .sum::<i64>()
        };
        // 8 GPUs from 23:00 on day 10 to 01:00 on day 11.
        let gpus = |n: u64| n * u64::from(SHARE_UNITS_PER_GPU);
        w.record(&a, Some(&p), gpus(8), 11 * DAY_S - 3600, 11 * DAY_S + 3600);
        assert_eq!(w.day(&(a.clone(), None), 10), 8 * 3600);
        assert_eq!(w.day(&(a.clone(), Some(p.clone())), 11), 8 * 3600);
        assert_eq!(week(&w, 16), 16 * 3600);
        assert_eq!(week(&w, 17), 8 * 3600, "day 10 has left the week");
        w.prune(18);
        assert_eq!(week(&w, 17), 0);
        // A quarter of a GPU (1,750 units) for an hour is 900 GPU-seconds, and two sevenths
        // for 7 seconds exactly 2.
        w.record(&a, None, 1750, 20 * DAY_S, 20 * DAY_S + 3600);
        assert_eq!(w.day(&(a.clone(), None), 20), 900);
        w.record(&a, None, 2000, 21 * DAY_S, 21 * DAY_S + 7);
        assert_eq!(w.day(&(a, None), 21), 2);
    }
}
