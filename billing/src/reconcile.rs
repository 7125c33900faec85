//! Telemetry against allocations: what a job is billed is what its GPUs measured while it held
//! them. A node's token proves which node pushed a row, not that the job it names held that GPU
//! then; the job events (the scheduler's, the Slurm follower's) say what each job held.
//!
//! Per GPU, hour and quarter of the hour, a job is billed the smaller of what was measured for
//! it and what it held (GPU-seconds). What was measured beyond that is *flagged* (per node and
//! reason: the job is unknown, it did not hold that GPU then, or the row names another account
//! than the job's) and billed to nobody; what was held beyond what was measured is a *coverage
//! gap* (node down, exporter missing), billed or not as the price book's `coverage` says.
//! A run whose events name no GPUs (only a count) is matched against its job's rows on any GPU
//! no other run of it names, hour by hour. Idle capacity is what GPUs measured with no job,
//! never more than a node's measured GPUs leave after what was billed and flagged.
//!
//! A GPU held in parts (`node:3@250m`: time-sliced, or MIG instances) is measured as one GPU,
//! its samples labelled with one of its jobs: what it measured in an hour is split among the
//! jobs holding parts of it then, each its part (a quarter of the GPU's measured seconds for a
//! 250m share), and each part is billed against what that job held.
//!
//! Where no allocation source exists ([`as_labelled`]), rows are billed as labelled: the node
//! is trusted for which job ran, and the ingest checks (node, GPU, account, bounds) still hold.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use gpuledger_model::time::{quarter_split, UnixMillis};
use gpuledger_model::{GpuModel, SHARE_UNITS_PER_GPU};
use serde::{Deserialize, Serialize};

use crate::allocation::{for_each_hour, HeldRun, ModelOf, UNALLOCATED_NODE};
use crate::engine::split_largest_remainder;
use crate::rows::{GpuHour, IdleGpuHour, MeteredHour};
use crate::{Error, Result};

/// Why measured GPU-seconds were billed to nobody.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlagReason {
    /// No job event names the job.
    UnknownJob,
    /// The job did not hold this GPU at this time (or held fewer GPU-seconds than measured).
    NotHeld,
    /// The row names another account than the job's events.
    AccountMismatch,
}

impl FlagReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FlagReason::UnknownJob => "unknown_job",
            FlagReason::NotHeld => "not_held",
            FlagReason::AccountMismatch => "account_mismatch",
        }
    }
}

/// Measured GPU-seconds billed to nobody, per node, hour, reason and the labels they carried.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FlaggedHour {
    pub node: String,
    pub hour_ms: i64,
    pub reason: FlagReason,
    pub job_id: String,
    pub account: String,
    pub gpu_seconds: i64,
}

/// What reconciliation made of a window's telemetry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reconciled {
    /// Measured on GPUs the job held: booked to the job's account and project (its events').
    pub billed: Vec<MeteredHour>,
    /// Held but not measured, per job, node and hour (no MFU sums).
    pub gaps: Vec<MeteredHour>,
    pub idle: Vec<IdleGpuHour>,
    pub flagged: Vec<FlaggedHour>,
}

impl Reconciled {
    /// GPU-seconds flagged, per node and reason.
    pub fn flagged_by_node(&self) -> BTreeMap<(String, FlagReason), i64> {
        let mut out = BTreeMap::new();
        for f in &self.flagged {
            *out.entry((f.node.clone(), f.reason)).or_default() += f.gpu_seconds;
        }
        out
    }
}

/// GPU-seconds with, where known, the part in each quarter of the hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Amount {
    total: i64,
    quarters: Option<[i64; 4]>,
}

impl Default for Amount {
    fn default() -> Self {
        Amount {
            total: 0,
            quarters: Some([0; 4]),
        }
    }
}

impl Amount {
    fn of(total: i64, quarters: Option<[i64; 4]>) -> Self {
        Amount {
            total,
            quarters: quarters.filter(|q| q.iter().sum::<i64>() == total),
        }
    }

    fn add(&mut self, other: Amount) {
        self.total += other.total;
        self.quarters = match (self.quarters, other.quarters) {
            (Some(a), Some(b)) => Some(std::array::from_fn(|q| a[q] + b[q])),
            _ => None,
        };
    }

    /// The smaller of two amounts, quarter by quarter where both know their quarters.
    /// `units` share units' part of the amount ([`SHARE_UNITS_PER_GPU`] being all of it),
    /// rounded down quarter by quarter.
    fn part(self, units: u32) -> Amount {
        let of = |v: i64| v * i64::from(units) / i64::from(SHARE_UNITS_PER_GPU);
        match self.quarters {
            Some(q) => {
                let q = q.map(of);
                Amount {
                    total: q.iter().sum(),
                    quarters: Some(q),
                }
            }
            None => Amount {
                total: of(self.total),
                quarters: None,
            },
        }
    }

    fn min(self, other: Amount) -> Amount {
        match (self.quarters, other.quarters) {
            (Some(a), Some(b)) => {
                let q: [i64; 4] = std::array::from_fn(|i| a[i].min(b[i]));
                Amount {
                    total: q.iter().sum(),
                    quarters: Some(q),
                }
            }
            _ => Amount {
                total: self.total.min(other.total),
                quarters: None,
            },
        }
    }

    fn minus(self, other: Amount) -> Amount {
        match (self.quarters, other.quarters) {
            (Some(a), Some(b)) => {
                let q: [i64; 4] = std::array::from_fn(|i| (a[i] - b[i]).max(0));
                Amount {
                    total: q.iter().sum(),
                    quarters: Some(q),
                }
            }
            _ => Amount {
                total: (self.total - other.total).max(0),
                quarters: None,
            },
        }
    }

    /// Splits this amount over `parts` in proportion to them, quarter by quarter where all
    /// know their quarters (largest remainder: the parts sum exactly).
    fn split_over(self, parts: &[Amount]) -> Vec<Amount> {
        let known = self.quarters.is_some() && parts.iter().all(|p| p.quarters.is_some());
        if known {
            let mut out = vec![[0i64; 4]; parts.len()];
            for q in 0..4 {
                let weights: Vec<i128> = parts
                    .iter()
                    .map(|p| i128::from(p.quarters.map_or(0, |x| x[q])))
                    .collect();
                let total = i128::from(self.quarters.map_or(0, |x| x[q]));
                for (slot, v) in out.iter_mut().zip(split_largest_remainder(total, &weights)) {
                    slot[q] = v as i64;
                }
            }
            out.into_iter()
                .map(|q| Amount {
                    total: q.iter().sum(),
                    quarters: Some(q),
                })
                .collect()
        } else {
            let weights: Vec<i128> = parts.iter().map(|p| i128::from(p.total)).collect();
            split_largest_remainder(i128::from(self.total), &weights)
                .into_iter()
                .map(|v| Amount {
                    total: v as i64,
                    quarters: None,
                })
                .collect()
        }
    }
}

/// What a job's usage is compared with: one GPU it held, or (for runs whose events name no
/// GPUs) the job as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Slot {
    Gpu(String, u16),
    Job,
}

/// job, slot, hour.
type SlotHour = (String, Slot, i64);

/// The account and project a job's events book it to.
#[derive(Clone, Debug)]
struct Owner {
    account: String,
    project: Option<String>,
}

/// Reconciles `telemetry` of `[from_ms, to_ms)` with the jobs' `runs`.
pub fn reconcile(
    telemetry: &[GpuHour],
    runs: &[HeldRun],
    from_ms: UnixMillis,
    to_ms: UnixMillis,
    model_of: ModelOf<'_>,
    default_model: Option<GpuModel>,
) -> Result<Reconciled> {
    let mut owners: HashMap<&str, Owner> = HashMap::new();
    let mut gpu_slots: HashSet<(&str, &str, u16)> = HashSet::new();
    let mut job_slots: HashSet<&str> = HashSet::new();
    let mut held: BTreeMap<SlotHour, Amount> = BTreeMap::new();
    // The jobs holding parts of each GPU in each hour, with their parts in share units.
    let mut parts: HashMap<(String, u16, i64), BTreeMap<String, u32>> = HashMap::new();
    for run in runs {
        owners.entry(run.job_id.as_str()).or_insert_with(|| Owner {
            account: run.account.clone(),
            project: run.project.clone(),
        });
        let (s, t) = (run.start_ms.max(from_ms), run.end_ms.min(to_ms));
        // `units`: share units held ([`SHARE_UNITS_PER_GPU`] to a GPU); a part of a GPU is
        // held for its part of each second, rounded down per hour piece.
        let mut add = |slot: Slot, units: i64| {
            let per_gpu = i64::from(SHARE_UNITS_PER_GPU);
            for_each_hour(s, t, |hour, offset, ms| {
                let secs = ms / 1000;
                let q = quarter_split(offset, secs).map(|v| v * units / per_gpu);
                held.entry((run.job_id.clone(), slot.clone(), hour))
                    .or_default()
                    .add(Amount::of(secs * units / per_gpu, Some(q)));
            });
        };
        match run.nodes() {
            Some(nodes) => {
                for n in nodes {
                    for g in &n.gpus {
                        let Ok(g) = u16::try_from(*g) else { continue };
                        gpu_slots.insert((run.job_id.as_str(), n.node.as_str(), g));
                        if t > s {
                            let units = n.share.map_or(SHARE_UNITS_PER_GPU, |sh| sh.units());
                            add(Slot::Gpu(n.node.to_string(), g), i64::from(units));
                            if n.share.is_some() {
                                for_each_hour(s, t, |hour, _, _| {
                                    let part = parts
                                        .entry((n.node.to_string(), g, hour))
                                        .or_default()
                                        .entry(run.job_id.clone())
                                        .or_default();
                                    *part = (*part).max(units);
                                });
                            }
                        }
                    }
                }
            }
            None if run.gpus > 0 => {
                job_slots.insert(run.job_id.as_str());
                if t > s {
                    add(
                        Slot::Job,
                        i64::from(run.gpus) * i64::from(SHARE_UNITS_PER_GPU),
                    );
                }
            }
            None => {}
        }
    }

    let mut out = Reconciled::default();
    // Measured, per slot and hour: the rows (by index), their amounts and the part of the row
    // each amount is (share units; a whole GPU's row is all of it).
    let mut measured: BTreeMap<SlotHour, Vec<(usize, Amount, u32)>> = BTreeMap::new();
    let mut idle: BTreeMap<(&str, &str, i64), Amount> = BTreeMap::new();
    let mut node_gpus: HashMap<(&str, i64), BTreeSet<u16>> = HashMap::new();
    let mut used: HashMap<(&str, i64), i64> = HashMap::new();
    let mut flagged: BTreeMap<(String, i64, FlagReason, String, String), i64> = BTreeMap::new();
    let mut flag = |r: &GpuHour, reason: FlagReason, secs: i64| {
        if secs > 0 {
            let key = (
                r.node.clone(),
                r.hour_ms,
                reason,
                r.job_id.clone().unwrap_or_default(),
                r.account.clone().unwrap_or_default(),
            );
            *flagged.entry(key).or_default() += secs;
        }
    };
    for (i, r) in telemetry.iter().enumerate() {
        if r.hour_ms < from_ms || r.hour_ms >= to_ms {
            continue;
        }
        node_gpus
            .entry((r.node.as_str(), r.hour_ms))
            .or_default()
            .insert(r.gpu_index);
        let amount = Amount::of(r.gpu_seconds, r.quarter_seconds);
        let Some(job) = r.job_id.as_deref() else {
            idle.entry((r.node.as_str(), r.gpu_model.as_str(), r.hour_ms))
                .or_default()
                .add(amount);
            continue;
        };
        // Billed or flagged, these seconds are not idle.
        *used.entry((r.node.as_str(), r.hour_ms)).or_default() += r.gpu_seconds;
        let Some(owner) = owners.get(job) else {
            flag(r, FlagReason::UnknownJob, r.gpu_seconds);
            continue;
        };
        if r.account.as_deref() != Some(owner.account.as_str()) {
            flag(r, FlagReason::AccountMismatch, r.gpu_seconds);
            continue;
        }
        // (Most months have no parts: no key built per row then.)
        let sharers = (!parts.is_empty())
            .then(|| parts.get(&(r.node.clone(), r.gpu_index, r.hour_ms)))
            .flatten();
        if let Some(sharers) = sharers.filter(|s| s.contains_key(job)) {
            for (sharer, units) in sharers {
                measured
                    .entry((
                        sharer.clone(),
                        Slot::Gpu(r.node.clone(), r.gpu_index),
                        r.hour_ms,
                    ))
                    .or_default()
                    .push((i, amount.part(*units), *units));
            }
            continue;
        }
        let slot = if gpu_slots.contains(&(job, r.node.as_str(), r.gpu_index)) {
            Slot::Gpu(r.node.clone(), r.gpu_index)
        } else if job_slots.contains(job) {
            Slot::Job
        } else {
            flag(r, FlagReason::NotHeld, r.gpu_seconds);
            continue;
        };
        measured
            .entry((job.to_owned(), slot, r.hour_ms))
            .or_default()
            .push((i, amount, SHARE_UNITS_PER_GPU));
    }

    // Billed: the smaller of measured and held, spread back over the rows that measured it.
    let mut billed: BTreeMap<MeteredKey, (Amount, f64, i64)> = BTreeMap::new();
    for (key, rows) in &measured {
        let (job, _, hour) = key;
        let owner = &owners[job.as_str()];
        let total = rows.iter().fold(Amount::default(), |mut acc, (_, a, _)| {
            acc.add(*a);
            acc
        });
        let allowed = held
            .get(key)
            .copied()
            .unwrap_or_else(|| Amount::of(0, None));
        let take = total.min(allowed);
        let amounts: Vec<Amount> = rows.iter().map(|(_, a, _)| *a).collect();
        for ((i, measured_row, units), got) in rows.iter().zip(take.split_over(&amounts)) {
            let r = &telemetry[*i];
            flag(r, FlagReason::NotHeld, measured_row.total - got.total);
            if got.total == 0 {
                continue;
            }
            // The part of the telemetry row billed here: of this job's part of the row, what
            // it held.
            let part = f64::from(*units) / f64::from(SHARE_UNITS_PER_GPU);
            let share = got.total as f64 / measured_row.total as f64 * part;
            let e = billed
                .entry((
                    owner.account.clone(),
                    owner.project.clone(),
                    Some(job.clone()),
                    r.node.clone(),
                    r.gpu_model.clone(),
                    *hour,
                ))
                .or_insert((Amount::default(), 0.0, 0));
            e.0.add(got);
            e.1 += r.mfu_proxy_sum * share;
            e.2 += if got.total == measured_row.total && *units == SHARE_UNITS_PER_GPU {
                r.mfu_seconds
            } else {
                let whole = i128::from(measured_row.total) * i128::from(SHARE_UNITS_PER_GPU);
                (i128::from(r.mfu_seconds) * i128::from(got.total) * i128::from(*units) / whole)
                    as i64
            };
        }
        // What was held and not measured.
        let gap = allowed.minus(take);
        if gap.total > 0 {
            let (node, model) = match &key.1 {
                Slot::Gpu(node, _) => (
                    node.clone(),
                    model_of(node).or(default_model).or_else(|| {
                        rows.first()
                            .and_then(|(i, _, _)| telemetry[*i].gpu_model.parse().ok())
                    }),
                ),
                Slot::Job => (UNALLOCATED_NODE.to_owned(), default_model),
            };
            push_gap(&mut out.gaps, owner, job, node, model, *hour, gap)?;
        }
    }
    // Held where nothing at all was measured.
    for (key, allowed) in &held {
        if measured.contains_key(key) || allowed.total == 0 {
            continue;
        }
        let (job, slot, hour) = key;
        let owner = &owners[job.as_str()];
        let (node, model) = match slot {
            Slot::Gpu(node, _) => (node.clone(), model_of(node).or(default_model)),
            Slot::Job => (UNALLOCATED_NODE.to_owned(), default_model),
        };
        push_gap(&mut out.gaps, owner, job, node, model, *hour, *allowed)?;
    }
    out.gaps = merge_hours(std::mem::take(&mut out.gaps));
    out.billed = billed
        .into_iter()
        .map(|(key, (a, mfu_sum, mfu_secs))| metered_hour(key, a, mfu_sum, mfu_secs))
        .collect();
    out.flagged = flagged
        .into_iter()
        .map(
            |((node, hour_ms, reason, job_id, account), gpu_seconds)| FlaggedHour {
                node,
                hour_ms,
                reason,
                job_id,
                account,
                gpu_seconds,
            },
        )
        .collect();
    // Idle: never more than the node's measured GPUs leave after billed and flagged seconds.
    out.idle = idle
        .into_iter()
        .map(|((node, model, hour), a)| {
            let capacity = 3600 * node_gpus.get(&(node, hour)).map_or(0, |g| g.len() as i64);
            let room = (capacity - used.get(&(node, hour)).copied().unwrap_or(0)).max(0);
            let a = if a.total > room {
                Amount::of(room, None)
            } else {
                a
            };
            IdleGpuHour {
                node: node.to_owned(),
                gpu_model: model.to_owned(),
                hour_ms: hour,
                gpu_seconds: a.total,
                quarter_seconds: a.quarters,
            }
        })
        .filter(|i| i.gpu_seconds > 0)
        .collect();
    Ok(out)
}

fn push_gap(
    gaps: &mut Vec<MeteredHour>,
    owner: &Owner,
    job: &str,
    node: String,
    model: Option<GpuModel>,
    hour: i64,
    gap: Amount,
) -> Result<()> {
    let model = model.ok_or_else(|| {
        Error::Input(format!(
            "job {job}: no GPU model for node `{node}` (name it in a node pool, or keep one GPU model)"
        ))
    })?;
    gaps.push(MeteredHour {
        account: owner.account.clone(),
        project: owner.project.clone(),
        job_id: Some(job.to_owned()),
        node,
        gpu_model: model.key().to_owned(),
        hour_ms: hour,
        gpu_seconds: gap.total,
        quarter_seconds: gap.quarters,
        mfu_proxy_sum: 0.0,
        mfu_seconds: 0,
    });
    Ok(())
}

/// account, project, job, node, GPU model, hour.
type MeteredKey = (String, Option<String>, Option<String>, String, String, i64);

/// Rows of one job, node and hour (one per GPU) merged into one.
fn merge_hours(rows: Vec<MeteredHour>) -> Vec<MeteredHour> {
    let mut merged: BTreeMap<MeteredKey, Amount> = BTreeMap::new();
    for r in rows {
        merged
            .entry((
                r.account,
                r.project,
                r.job_id,
                r.node,
                r.gpu_model,
                r.hour_ms,
            ))
            .or_default()
            .add(Amount::of(r.gpu_seconds, r.quarter_seconds));
    }
    merged
        .into_iter()
        .map(|(key, a)| metered_hour(key, a, 0.0, 0))
        .collect()
}

/// The row of one key: its GPU-seconds (and quarters) and the MFU proxy's sums.
fn metered_hour(key: MeteredKey, a: Amount, mfu_proxy_sum: f64, mfu_seconds: i64) -> MeteredHour {
    let (account, project, job_id, node, gpu_model, hour_ms) = key;
    MeteredHour {
        account,
        project,
        job_id,
        node,
        gpu_model,
        hour_ms,
        gpu_seconds: a.total,
        quarter_seconds: a.quarters,
        mfu_proxy_sum,
        mfu_seconds,
    }
}

/// Telemetry billed as labelled, for clusters without an allocation source: per job (account,
/// project), node and hour, and idle capacity per node.
pub fn as_labelled(telemetry: &[GpuHour], from_ms: UnixMillis, to_ms: UnixMillis) -> Reconciled {
    let mut billed: BTreeMap<MeteredKey, (Amount, f64, i64)> = BTreeMap::new();
    let mut idle: BTreeMap<(String, String, i64), Amount> = BTreeMap::new();
    for r in telemetry
        .iter()
        .filter(|r| r.hour_ms >= from_ms && r.hour_ms < to_ms)
    {
        let amount = Amount::of(r.gpu_seconds, r.quarter_seconds);
        match &r.account {
            Some(account) => {
                let e = billed
                    .entry((
                        account.clone(),
                        r.project.clone(),
                        r.job_id.clone(),
                        r.node.clone(),
                        r.gpu_model.clone(),
                        r.hour_ms,
                    ))
                    .or_insert((Amount::default(), 0.0, 0));
                e.0.add(amount);
                e.1 += r.mfu_proxy_sum;
                e.2 += r.mfu_seconds;
            }
            None => idle
                .entry((r.node.clone(), r.gpu_model.clone(), r.hour_ms))
                .or_default()
                .add(amount),
        }
    }
    Reconciled {
        billed: billed
            .into_iter()
            .map(|(key, (a, sum, secs))| metered_hour(key, a, sum, secs))
            .collect(),
        idle: idle
            .into_iter()
            .map(|((node, gpu_model, hour_ms), a)| IdleGpuHour {
                node,
                gpu_model,
                hour_ms,
                gpu_seconds: a.total,
                quarter_seconds: a.quarters,
            })
            .collect(),
        ..Reconciled::default()
    }
}
