//! Variants of a trace, and the cluster size that gives a trace an offered load: a scheduling
//! change is judged on traces it was not tuned on, at several loads (issue 22), so it is
//! checked on variants of the one trace at hand before it is kept (`gpuledger bench
//! fairness`):
//!
//! - [`Variant::Shift`]: each account's submissions moved by one offset drawn for that account,
//!   uniform within [`SHIFT_MAX_S`] either way, and within a [`SHIFT_SPAN_PART`]th of the
//!   trace's span on a shorter trace: the same tenants and jobs, their busy weeks meeting
//!   differently;
//! - [`Variant::Drop`]: each job left out with probability [`DROP_FRACTION`]: less load, other
//!   arrivals.
//!
//! Deterministic for a seed (the project's own [`SplitMix64`], so on every machine).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use gpuledger_model::rng::SplitMix64;
use gpuledger_scheduler::SimJob;

/// How far [`Variant::Shift`] moves an account's submissions, either way, at most.
pub const SHIFT_MAX_S: i64 = 3 * 86_400;

/// ... and at most this part of the trace's span (first to last submission), so that a trace
/// of a day moves its tenants by an hour or so, not out of its own span.
pub const SHIFT_SPAN_PART: i64 = 16;

/// The share of the jobs [`Variant::Drop`] leaves out, on average.
pub const DROP_FRACTION: f64 = 0.1;

/// A variant of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The trace itself.
    AsIs,
    Shift {
        seed: u64,
    },
    Drop {
        seed: u64,
    },
}

impl FromStr for Variant {
    type Err = String;

    /// `as-is`, `shift:SEED` or `drop:SEED`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "as-is" {
            return Ok(Variant::AsIs);
        }
        let (kind, seed) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: use as-is, shift:SEED or drop:SEED"))?;
        let seed: u64 = seed
            .parse()
            .map_err(|_| format!("`{s}`: the seed `{seed}` is not a whole number"))?;
        match kind {
            "shift" => Ok(Variant::Shift { seed }),
            "drop" => Ok(Variant::Drop { seed }),
            _ => Err(format!("`{s}`: `{kind}` is not a variant (shift, drop)")),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variant::AsIs => write!(f, "as-is"),
            Variant::Shift { seed } => write!(f, "shift:{seed}"),
            Variant::Drop { seed } => write!(f, "drop:{seed}"),
        }
    }
}

/// `jobs` as `variant` makes them, in submission order (ties in the order given).
pub fn vary(jobs: &[SimJob], variant: Variant) -> Vec<SimJob> {
    let mut out: Vec<SimJob> = match variant {
        Variant::AsIs => jobs.to_vec(),
        Variant::Drop { seed } => {
            let mut rng = SplitMix64::new(seed);
            jobs.iter()
                .filter(|_| rng.next_f64() >= DROP_FRACTION)
                .cloned()
                .collect()
        }
        Variant::Shift { seed } => {
            let mut rng = SplitMix64::new(seed);
            let mut offsets = HashMap::new();
            let first = jobs.iter().map(|job| job.spec.submit_s).min().unwrap_or(0);
            let last = jobs.iter().map(|job| job.spec.submit_s).max().unwrap_or(0);
            let most = SHIFT_MAX_S.min((last - first) / SHIFT_SPAN_PART);
            jobs.iter()
                .map(|job| {
                    let offset = *offsets.entry(job.spec.account.clone()).or_insert_with(|| {
                        let span = (2 * most) as f64;
                        (rng.next_f64() * span) as i64 - most
                    });
                    let mut job = job.clone();
                    job.spec.submit_s += offset;
                    job
                })
                .collect()
        }
    };
    out.sort_by_key(|job| job.spec.submit_s);
    out
}

/// GPU-seconds the jobs would run at their full sizes (a part of a GPU as its fraction).
pub fn offered_gpu_seconds(jobs: &[SimJob]) -> f64 {
    jobs.iter()
        .map(|job| job.run_time_s as f64 * job.spec.gpu_equivalent())
        .sum()
}

/// Nodes of `gpus_per_node` on which `jobs` offer `load` of the capacity between the first and
/// the last submission (at least one node).
pub fn nodes_for_load(jobs: &[SimJob], gpus_per_node: u32, load: f64) -> u32 {
    let first = jobs.iter().map(|job| job.spec.submit_s).min().unwrap_or(0);
    let last = jobs.iter().map(|job| job.spec.submit_s).max().unwrap_or(0);
    let window = (last - first).max(1) as f64;
    let nodes = offered_gpu_seconds(jobs) / (window * f64::from(gpus_per_node.max(1)) * load);
    if nodes.is_finite() {
        (nodes.round() as u32).max(1)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::job::Outcome;
    use gpuledger_scheduler::JobSpec;

    fn job(id: usize, account: &str, gpus: u32, submit_s: i64, run_time_s: u64) -> SimJob {
        SimJob {
            spec: JobSpec::new(
                format!("j{id}").parse().unwrap(),
                account.parse().unwrap(),
                gpus,
                run_time_s,
                submit_s,
            ),
            run_time_s,
            outcome: Outcome::Completed,
            checkpoint_save_s: None,
        }
    }

    fn trace() -> Vec<SimJob> {
        (0..3000)
            .map(|i| {
                let account = ["a", "b", "c", "d"][i % 4];
                job(i, account, 1 + (i % 8) as u32, i as i64 * 1800, 3600)
            })
            .collect()
    }

    #[test]
    fn a_shift_moves_each_account_by_one_offset_within_three_days() {
        let jobs = trace();
        let shifted = vary(&jobs, Variant::Shift { seed: 7 });
        assert_eq!(shifted.len(), jobs.len());
        assert!(shifted
            .windows(2)
            .all(|w| w[0].spec.submit_s <= w[1].spec.submit_s));
        let submit_of: HashMap<_, _> = jobs
            .iter()
            .map(|j| (j.spec.id.clone(), j.spec.submit_s))
            .collect();
        let mut offsets: HashMap<String, i64> = HashMap::new();
        for j in &shifted {
            let offset = j.spec.submit_s - submit_of[&j.spec.id];
            // 62 days of submissions: the 3-day bound is the one that holds.
            assert!(offset.abs() <= SHIFT_MAX_S, "{offset}");
            let first = *offsets.entry(j.spec.account.to_string()).or_insert(offset);
            assert_eq!(first, offset, "{} moved by two offsets", j.spec.account);
        }
        let distinct: std::collections::HashSet<i64> = offsets.values().copied().collect();
        assert_eq!(distinct.len(), 4, "{offsets:?}");
        assert_eq!(shifted, vary(&jobs, Variant::Shift { seed: 7 }));
        assert_ne!(shifted, vary(&jobs, Variant::Shift { seed: 8 }));
    }

    #[test]
    fn a_short_trace_is_shifted_within_a_sixteenth_of_its_span() {
        // A day of submissions: tenants move by 90 minutes at most, not 3 days.
        let jobs: Vec<SimJob> = (0..1440)
            .map(|i| job(i, ["a", "b", "c"][i % 3], 1, i as i64 * 60, 600))
            .collect();
        let most = 1439 * 60 / SHIFT_SPAN_PART;
        for seed in 0..20 {
            let shifted = vary(&jobs, Variant::Shift { seed });
            let first = shifted.iter().map(|j| j.spec.submit_s).min().unwrap();
            let last = shifted.iter().map(|j| j.spec.submit_s).max().unwrap();
            assert!(first >= -most && last <= 1439 * 60 + most, "{first} {last}");
        }
    }

    #[test]
    fn a_drop_leaves_out_about_a_tenth_and_keeps_the_rest_as_they_were() {
        let jobs = trace();
        let kept = vary(&jobs, Variant::Drop { seed: 3 });
        let left_out = jobs.len() - kept.len();
        assert!(
            (240..=360).contains(&left_out),
            "{left_out} of 3000 left out"
        );
        let original: HashMap<_, _> = jobs.iter().map(|j| (j.spec.id.clone(), j)).collect();
        assert!(kept.iter().all(|j| original[&j.spec.id] == j));
        assert_eq!(kept, vary(&jobs, Variant::Drop { seed: 3 }));
        assert_eq!(vary(&jobs, Variant::AsIs), jobs);
    }

    #[test]
    fn the_nodes_for_a_load_carry_the_offered_gpu_seconds_at_that_share() {
        // 3000 jobs of 4.5 GPUs on average for an hour, over 3000 x 1800 s less one step.
        let jobs = trace();
        let offered = offered_gpu_seconds(&jobs);
        assert_eq!(offered, 3000.0 * 4.5 * 3600.0);
        let window = 2999.0 * 1800.0;
        for load in [0.5, 0.85, 1.0] {
            let nodes = nodes_for_load(&jobs, 8, load);
            let expected = offered / (window * 8.0 * load);
            assert!(
                (f64::from(nodes) - expected).abs() <= 0.5,
                "{nodes} {expected}"
            );
        }
        assert_eq!(nodes_for_load(&[], 8, 0.85), 1);
        assert_eq!(nodes_for_load(&jobs, 8, 1e9), 1);
    }

    #[test]
    fn a_variant_is_named_as_it_is_written() {
        for name in ["as-is", "shift:1", "drop:42"] {
            assert_eq!(name.parse::<Variant>().unwrap().to_string(), name);
        }
        for bad in ["shift", "shift:x", "swap:1", ""] {
            assert!(bad.parse::<Variant>().is_err(), "{bad}");
        }
    }
}
