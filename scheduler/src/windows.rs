//! GPU-seconds allocated per UTC day, per account and per project, for the quota's
//! `gpu_hours_per_day` and `gpu_hours_per_week` (the last seven UTC days, today included).
//! Integers: usage stays whole GPU-seconds until it is priced.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, ProjectId};

pub const DAY_S: i64 = 86_400;

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

    /// Adds `gpus` held over `[from, to)` to the account and, when named, the project.
    pub fn record(
        &mut self,
        account: &AccountId,
        project: Option<&ProjectId>,
        gpus: u32,
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
            let gpu_s = i64::from(gpus) * (until - t);
            *self
                .days
                .entry((account.clone(), None))
                .or_default()
                .entry(day)
                .or_default() += gpu_s;
            if let Some(p) = project {
                *self
                    .days
                    .entry((account.clone(), Some(p.clone())))
                    .or_default()
                    .entry(day)
                    .or_default() += gpu_s;
            }
            t = until;
        }
    }

    /// GPU-seconds of the UTC day `day`.
    pub fn day(&self, key: &WindowKey, day: i64) -> i64 {
        self.days
            .get(key)
            .and_then(|d| d.get(&day))
            .copied()
            .unwrap_or(0)
    }

    /// GPU-seconds of the seven UTC days ending with `day`.
    pub fn week(&self, key: &WindowKey, day: i64) -> i64 {
        self.days
            .get(key)
            .map(|d| d.range(day - 6..=day).map(|(_, v)| *v).sum())
            .unwrap_or(0)
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
    fn usage_is_split_at_midnight_and_summed_over_seven_days() {
        let a = AccountId::new("a").unwrap();
        let p = ProjectId::new("p").unwrap();
        let mut w = UsageWindows::tracking([a.clone()]);
        // 8 GPUs from 23:00 on day 10 to 01:00 on day 11.
        w.record(&a, Some(&p), 8, 11 * DAY_S - 3600, 11 * DAY_S + 3600);
        assert_eq!(w.day(&(a.clone(), None), 10), 8 * 3600);
        assert_eq!(w.day(&(a.clone(), Some(p.clone())), 11), 8 * 3600);
        assert_eq!(w.week(&(a.clone(), None), 16), 16 * 3600);
        assert_eq!(
            w.week(&(a.clone(), None), 17),
            8 * 3600,
            "day 10 has left the week"
        );
        w.prune(18);
        assert_eq!(w.week(&(a, None), 17), 0);
    }
}
