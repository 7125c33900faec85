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

/// The feed's answer: decayed GPU-hours per account as of `at_ms`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageFeed {
    pub at_ms: UnixMillis,
    pub half_life_s: u64,
    /// Decayed GPU-hours per account, and per project below it.
    pub accounts: BTreeMap<String, AccountUsage>,
}

/// One account's decayed GPU-hours, in total and per project.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountUsage {
    pub decayed_gpu_hours: f64,
    #[serde(default)]
    pub projects: BTreeMap<String, f64>,
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
            },
        );
        let text = serde_json::to_string(&feed).unwrap();
        assert_eq!(serde_json::from_str::<UsageFeed>(&text).unwrap(), feed);
    }
}
