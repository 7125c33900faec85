//! The fair-share usage feed: what the aggregator's `GET /api/v1/usage` answers and every
//! scheduler reads (gpuledger's own, the Slurm steering), and the one exponential decay that
//! both the feed and the scheduler's own ledger apply.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::UnixMillis;

/// The route of the feed (`GET`, with optional `at` and `half_life` query parameters).
pub const USAGE_PATH: &str = "/api/v1/usage";

/// What usage that happened `elapsed_s` ago still counts for under `half_life_s`: 1 now (and
/// for anything dated later), a half one half-life ago.
pub fn decay_factor(elapsed_s: f64, half_life_s: f64) -> f64 {
    if elapsed_s <= 0.0 {
        1.0
    } else {
        (-elapsed_s / half_life_s).exp2()
    }
}

/// The feed's answer: decayed GPU-hours per account as of `at_ms`, and the GPU-seconds of the
/// quota windows (the UTC day of `at_ms` and the seven UTC days ending with it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageFeed {
    pub at_ms: UnixMillis,
    pub half_life_s: u64,
    /// Decayed GPU-hours per account, and per project below it.
    pub accounts: BTreeMap<String, AccountUsage>,
}

/// One account's decayed GPU-hours, in total and per project, and its quota windows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountUsage {
    pub decayed_gpu_hours: f64,
    #[serde(default)]
    pub projects: BTreeMap<String, f64>,
    #[serde(default)]
    pub window: WindowGpuSeconds,
    #[serde(default)]
    pub project_windows: BTreeMap<String, WindowGpuSeconds>,
}

/// Measured GPU-seconds in the UTC day of the feed's `at_ms` (its hours that began that day)
/// and in the seven UTC days ending with it: what `gpu_hours_per_day` and
/// `gpu_hours_per_week` count. Whole GPU-seconds, not decayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowGpuSeconds {
    pub day_gpu_s: i64,
    pub week_gpu_s: i64,
}

impl WindowGpuSeconds {
    /// Adds an hour's GPU-seconds that began at `hour_ms` as seen at `at_ms`.
    pub fn add_hour(&mut self, hour_ms: UnixMillis, at_ms: UnixMillis, gpu_seconds: i64) {
        const DAY_MS: i64 = 86_400_000;
        let (day, today) = (hour_ms.div_euclid(DAY_MS), at_ms.div_euclid(DAY_MS));
        if day == today {
            self.day_gpu_s += gpu_seconds;
        }
        if (today - 6..=today).contains(&day) {
            self.week_gpu_s += gpu_seconds;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_halves_each_half_life_and_never_grows() {
        assert_eq!(decay_factor(0.0, 3600.0), 1.0);
        assert_eq!(decay_factor(-5.0, 3600.0), 1.0);
        assert!((decay_factor(3600.0, 3600.0) - 0.5).abs() < 1e-15);
        assert!((decay_factor(7200.0, 3600.0) - 0.25).abs() < 1e-15);
    }

    #[test]
    fn an_hour_counts_in_its_utc_day_and_the_week_ending_today() {
        let day = 86_400_000;
        let at = 20 * day + 5 * 3_600_000;
        let mut w = WindowGpuSeconds::default();
        w.add_hour(20 * day, at, 100);
        w.add_hour(20 * day - 3_600_000, at, 10);
        w.add_hour(14 * day, at, 1);
        w.add_hour(13 * day + 23 * 3_600_000, at, 1000);
        assert_eq!(
            w,
            WindowGpuSeconds {
                day_gpu_s: 100,
                week_gpu_s: 111
            }
        );
    }

    #[test]
    fn the_feed_reads_back_what_it_wrote() {
        let mut feed = UsageFeed {
            at_ms: 1_700_000_000_000,
            half_life_s: 604_800,
            ..UsageFeed::default()
        };
        feed.accounts.insert(
            "team-a".into(),
            AccountUsage {
                decayed_gpu_hours: 12.5,
                projects: [("llm".to_owned(), 10.0)].into(),
                window: WindowGpuSeconds {
                    day_gpu_s: 7200,
                    week_gpu_s: 36_000,
                },
                project_windows: BTreeMap::new(),
            },
        );
        let text = serde_json::to_string(&feed).unwrap();
        assert_eq!(serde_json::from_str::<UsageFeed>(&text).unwrap(), feed);
    }
}
