//! Where a replay's idle GPUs sit while jobs wait: on nodes where the smallest waiting job
//! would fit in what is free there, or on nodes too full for every waiting job. The second is
//! a queue of wide jobs beside partly used nodes: under fair share the small jobs start at
//! once and the whole-node jobs are what waits (docs/benchmarks.md, session 37), so a policy
//! can lose utilization there with nothing a backfill could start.

use std::collections::{BTreeMap, HashMap};

use gpuledger_model::{ClusterConfig, NodeId, SHARE_UNITS_PER_GPU};
use gpuledger_scheduler::SimResult;

/// GPU-seconds free while some job waited, by whether the smallest waiting job fits on the
/// node they are free on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IdleWhileWaiting {
    pub fits_gpu_s: f64,
    pub too_full_gpu_s: f64,
}

/// What changes at an instant: a node's held share units, or a waiting job of a size.
enum Change {
    Held { node: usize, units: i64 },
    Waiting { units: u64, count: i64 },
}

/// [`IdleWhileWaiting`] over `[from, to)` of a replay on `config`'s nodes. A job waits from
/// its submission to its first start and between a run that ended and the next that did not
/// start at once (a preemption); refused jobs do not wait. A job fits a node when the node has
/// its smallest size free, or the whole node for a job larger than any node; its GPUs per
/// node and GPU types are not looked at.
pub fn idle_while_waiting(
    config: &ClusterConfig,
    result: &SimResult,
    from: i64,
    to: i64,
) -> IdleWhileWaiting {
    let unit = u64::from(SHARE_UNITS_PER_GPU);
    let nodes = config.nodes();
    let index: HashMap<&NodeId, usize> =
        nodes.iter().enumerate().map(|(i, n)| (&n.id, i)).collect();
    let capacity: Vec<u64> = nodes.iter().map(|n| u64::from(n.gpus) * unit).collect();
    let refused = crate::fairness::refused(result);
    let mut changes: Vec<(i64, Change)> = Vec::new();
    for record in &result.records {
        if refused.contains(record.spec.id.as_str()) {
            continue;
        }
        let needs = record.spec.share_units_of(record.spec.min_size());
        for (start, end) in crate::fairness::waits(record, result.horizon_s) {
            changes.push((
                start,
                Change::Waiting {
                    units: needs,
                    count: 1,
                },
            ));
            changes.push((
                end,
                Change::Waiting {
                    units: needs,
                    count: -1,
                },
            ));
        }
        for run in &record.runs {
            let end = run.end_s.unwrap_or(result.horizon_s);
            for part in &run.allocation.0 {
                let Some(&node) = index.get(&part.node) else {
                    continue;
                };
                let units = part.share_units() as i64;
                changes.push((run.start_s, Change::Held { node, units }));
                changes.push((
                    end,
                    Change::Held {
                        node,
                        units: -units,
                    },
                ));
            }
        }
    }
    changes.sort_by_key(|(t, _)| *t);
    let mut held = vec![0i64; nodes.len()];
    let mut waiting: BTreeMap<u64, i64> = BTreeMap::new();
    let mut idle = IdleWhileWaiting::default();
    let mut k = 0;
    while k < changes.len() {
        let now = changes[k].0;
        while k < changes.len() && changes[k].0 == now {
            match changes[k].1 {
                Change::Held { node, units } => held[node] += units,
                Change::Waiting { units, count } => {
                    let n = waiting.entry(units).or_insert(0);
                    *n += count;
                    if *n == 0 {
                        waiting.remove(&units);
                    }
                }
            }
            k += 1;
        }
        let next = changes.get(k).map_or(result.horizon_s, |(t, _)| *t);
        let span = (next.min(to) - now.max(from)).max(0) as f64;
        let Some((&smallest, _)) = waiting.iter().find(|(_, n)| **n > 0) else {
            continue;
        };
        if span == 0.0 {
            continue;
        }
        for (node, cap) in capacity.iter().enumerate() {
            let free = (*cap as i64 - held[node]).max(0) as u64;
            let gpu_s = free as f64 / unit as f64 * span;
            if free >= smallest.min(*cap) {
                idle.fits_gpu_s += gpu_s;
            } else {
                idle.too_full_gpu_s += gpu_s;
            }
        }
    }
    idle
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::trace_cluster;
    use crate::test_records::{record, replay};
    use gpuledger_model::AccountId;
    use gpuledger_scheduler::JobRecord;

    fn on(mut r: JobRecord, allocations: &[&str]) -> JobRecord {
        for (run, a) in r.runs.iter_mut().zip(allocations) {
            run.allocation = a.parse().unwrap();
        }
        r
    }

    #[test]
    fn idle_gpus_count_where_the_smallest_waiting_job_fits_or_nowhere() {
        let weights = [(AccountId::new("a").unwrap(), 1)].into_iter().collect();
        let config = trace_cluster(2, &weights).unwrap();
        let records = vec![
            on(record("six", "a", 6, 0, &[(0, 100)]), &["node001:0-5"]),
            on(record("eight", "a", 8, 0, &[(0, 200)]), &["node002:0-7"]),
            // Waits 0-100 for 4 GPUs while node001 has 2 free: too full.
            on(record("four", "a", 4, 0, &[(100, 200)]), &["node001:0-3"]),
            // Waits 150-160 for 1 GPU while node001 has 4 free: it fits.
            on(record("one", "a", 1, 150, &[(160, 200)]), &["node001:4"]),
            // Preempted at 170, back at 180: waits 170-180 for 2 GPUs beside 3 free.
            on(
                record("two", "a", 2, 165, &[(165, 170), (180, 200)]),
                &["node001:5-6", "node001:5-6"],
            ),
        ];
        let mut result = replay(records, Vec::new(), 16, 200);
        for r in &mut result.records {
            r.outcome = Some(gpuledger_model::job::Outcome::Completed);
        }
        let idle = idle_while_waiting(&config, &result, 0, 200);
        assert_eq!(
            idle,
            IdleWhileWaiting {
                fits_gpu_s: 4.0 * 10.0 + 3.0 * 10.0,
                too_full_gpu_s: 2.0 * 100.0,
            }
        );
        // Only the window counts.
        let idle = idle_while_waiting(&config, &result, 50, 155);
        assert_eq!(idle.too_full_gpu_s, 2.0 * 50.0);
        assert_eq!(idle.fits_gpu_s, 4.0 * 5.0);
        // A job still waiting at the horizon waits to it.
        let mut never = replay(
            vec![
                on(record("eight", "a", 8, 0, &[(0, 200)]), &["node002:0-7"]),
                record("wide", "a", 16, 50, &[]),
            ],
            Vec::new(),
            16,
            200,
        );
        never.records[0].outcome = Some(gpuledger_model::job::Outcome::Completed);
        let idle = idle_while_waiting(&config, &never, 0, 200);
        assert_eq!(
            idle.fits_gpu_s,
            8.0 * 150.0,
            "a job wider than any node fits a wholly free one"
        );
        assert_eq!(idle.too_full_gpu_s, 0.0);
    }
}
