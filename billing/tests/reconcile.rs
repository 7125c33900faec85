//! Reconciliation against a per-second reference: for random allocations (jobs' runs on GPUs
//! of two nodes) and random sample streams (honest rows, some lost, and forged rows naming any
//! job on any GPU at any time), a job is never billed more GPU-seconds than it held, is billed
//! exactly what it held where telemetry covers its allocation, and what it held is billed or a
//! coverage gap to the second.

use std::collections::{BTreeMap, HashMap};

use gpuledger_billing::allocation::held_runs;
use gpuledger_billing::reconcile::{reconcile, FlagReason};
use gpuledger_billing::rows::GpuHour;
use gpuledger_model::job::{JobEvent, JobEventKind};
use gpuledger_model::time::{hour_start_ms, quarter_split};
use gpuledger_model::{AccountId, GpuModel, JobId};
use proptest::prelude::*;

const T0: i64 = 1_780_272_000_000; // 2026-06-01T00:00:00Z
const SPAN_S: i64 = 3 * 3600;
const NODES: [&str; 2] = ["n1", "n2"];
const GPUS: u16 = 4;

/// A candidate run: job, node, first GPU, GPU count, start and length in seconds.
type Candidate = (usize, usize, u16, u16, i64, i64);

fn account_of(job: usize) -> &'static str {
    ["alpha", "beta", "gamma"][job % 3]
}

/// Runs that a scheduler could have made from the candidates: a GPU holds one job at a time,
/// a job runs once at a time.
fn feasible(candidates: &[Candidate]) -> Vec<Candidate> {
    let mut gpu_busy: HashMap<(usize, u16), Vec<(i64, i64)>> = HashMap::new();
    let mut job_busy: HashMap<usize, Vec<(i64, i64)>> = HashMap::new();
    let overlaps = |v: &Vec<(i64, i64)>, s: i64, e: i64| v.iter().any(|(a, b)| s < *b && *a < e);
    let mut out = Vec::new();
    for &(job, node, first, count, start, len) in candidates {
        let (s, e) = (start, (start + len).min(SPAN_S));
        let gpus: Vec<u16> = (first..(first + count).min(GPUS)).collect();
        if e <= s
            || overlaps(job_busy.entry(job).or_default(), s, e)
            || gpus
                .iter()
                .any(|g| overlaps(gpu_busy.entry((node, *g)).or_default(), s, e))
        {
            continue;
        }
        job_busy.entry(job).or_default().push((s, e));
        for g in &gpus {
            gpu_busy.entry((node, *g)).or_default().push((s, e));
        }
        out.push((job, node, first, gpus.len() as u16, s, e - s));
    }
    out
}

fn events(runs: &[Candidate]) -> Vec<JobEvent> {
    let mut by_job: BTreeMap<usize, Vec<&Candidate>> = BTreeMap::new();
    for r in runs {
        by_job.entry(r.0).or_default().push(r);
    }
    let mut out = Vec::new();
    for (job, mut runs) in by_job {
        runs.sort_by_key(|r| r.4);
        let n = runs.len();
        for (i, &&(_, node, first, count, s, len)) in runs.iter().enumerate() {
            let ev = |t: i64, kind| {
                JobEvent::new(
                    T0 + t * 1000,
                    JobId::new(job.to_string()).unwrap(),
                    AccountId::new(account_of(job)).unwrap(),
                    None,
                    kind,
                )
            };
            let mut start = ev(s, JobEventKind::Started);
            start.gpus = Some(u32::from(count));
            start.allocation = Some(
                format!("{}:{}-{}", NODES[node], first, first + count - 1)
                    .parse()
                    .unwrap(),
            );
            out.push(start);
            let kind = if i + 1 == n {
                JobEventKind::Finished
            } else {
                JobEventKind::Preempted
            };
            out.push(ev(s + len, kind));
        }
    }
    out
}

/// One second of one GPU for a label.
type Second = (usize, u16, i64, Option<usize>, Option<&'static str>);

/// node, GPU, hour, job, account.
type HourKey = (usize, u16, i64, Option<usize>, Option<&'static str>);

/// Per-second rows summed as a rollup would: per GPU, hour and label, with quarters.
fn gpu_hours(seconds: &[Second]) -> Vec<GpuHour> {
    let mut sums: BTreeMap<HourKey, (i64, [i64; 4])> = BTreeMap::new();
    for &(node, gpu, t, job, account) in seconds {
        let ms = T0 + t * 1000;
        let hour = hour_start_ms(ms);
        let e = sums.entry((node, gpu, hour, job, account)).or_default();
        e.0 += 1;
        for (q, add) in e.1.iter_mut().zip(quarter_split(ms - hour, 1)) {
            *q += add;
        }
    }
    sums.into_iter()
        .map(
            |((node, gpu, hour, job, account), (secs, quarters))| GpuHour {
                node: NODES[node].into(),
                gpu_index: gpu,
                gpu_model: "h100-sxm".into(),
                hour_ms: hour,
                job_id: job.map(|j| j.to_string()),
                account: account.map(str::to_owned),
                project: None,
                gpu_seconds: secs,
                quarter_seconds: Some(quarters),
                mfu_proxy_sum: 0.0,
                mfu_seconds: 0,
            },
        )
        .collect()
}

fn candidate() -> impl Strategy<Value = Candidate> {
    (
        0usize..6,
        0usize..2,
        0u16..GPUS,
        1u16..3,
        0i64..SPAN_S,
        1i64..5000,
    )
}

fn forged() -> impl Strategy<Value = (usize, u16, i64, i64, usize, bool)> {
    // node, GPU, start, length (s), job named (6-7 are jobs nobody ran), with the wrong account
    (
        0usize..2,
        0u16..GPUS,
        0i64..SPAN_S,
        1i64..900,
        0usize..8,
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_job_is_billed_what_it_held_where_measured_and_never_more(
        candidates in prop::collection::vec(candidate(), 1..14),
        lost in prop::collection::vec((0usize..2, 0u16..GPUS, 0i64..SPAN_S, 1i64..1200), 0..4),
        forgeries in prop::collection::vec(forged(), 0..6),
    ) {
        let runs = feasible(&candidates);
        let events = events(&runs);
        // The truth, per second: which job each GPU held.
        let mut holder: HashMap<(usize, u16, i64), usize> = HashMap::new();
        let mut held: BTreeMap<usize, i64> = BTreeMap::new();
        for &(job, node, first, count, s, len) in &runs {
            for g in first..first + count {
                for t in s..s + len {
                    holder.insert((node, g, t), job);
                }
            }
            *held.entry(job).or_default() += i64::from(count) * len;
        }
        let is_lost = |node: usize, g: u16, t: i64| {
            lost.iter().any(|&(n, lg, s, len)| n == node && lg == g && t >= s && t < s + len)
        };
        let mut seconds: Vec<Second> = Vec::new();
        // What each job's GPUs measured of what it held, where no row was lost.
        let mut covered: BTreeMap<usize, i64> = BTreeMap::new();
        for node in 0..2 {
            for g in 0..GPUS {
                for t in 0..SPAN_S {
                    if is_lost(node, g, t) {
                        continue;
                    }
                    let job = holder.get(&(node, g, t)).copied();
                    if let Some(j) = job {
                        *covered.entry(j).or_default() += 1;
                    }
                    seconds.push((node, g, t, job, job.map(account_of)));
                }
            }
        }
        // Forged rows: any job, any GPU, any time, sometimes under another account.
        for &(node, g, s, len, job, wrong_account) in &forgeries {
            for t in s..(s + len).min(SPAN_S) {
                let account = if wrong_account { "zeta" } else { account_of(job) };
                seconds.push((node, g, t, Some(job), Some(account)));
            }
        }
        let telemetry = gpu_hours(&seconds);
        let h100 = |_: &str| Some(GpuModel::H100Sxm);
        let out = reconcile(
            &telemetry,
            &held_runs(&events, T0 + SPAN_S * 1000),
            T0,
            T0 + SPAN_S * 1000,
            &h100,
            Some(GpuModel::H100Sxm),
        )
        .unwrap();
        let sum_by_job = |rows: &[gpuledger_billing::source::MeteredHour]| {
            let mut m: BTreeMap<usize, i64> = BTreeMap::new();
            for r in rows {
                *m.entry(r.job_id.as_deref().unwrap().parse().unwrap()).or_default() += r.gpu_seconds;
            }
            m
        };
        let billed = sum_by_job(&out.billed);
        let gaps = sum_by_job(&out.gaps);
        for (job, secs) in &billed {
            let h = held.get(job).copied().unwrap_or(0);
            prop_assert!(*secs <= h, "job {job} billed {secs} > held {h}");
        }
        for (job, h) in &held {
            let b = billed.get(job).copied().unwrap_or(0);
            let g = gaps.get(job).copied().unwrap_or(0);
            prop_assert_eq!(b + g, *h, "job {}: billed + gap = held", job);
            // Forged rows may fill what was lost (to the allocation, never past it): billed is
            // at least what honest rows covered.
            prop_assert!(b >= covered.get(job).copied().unwrap_or(0), "job {}", job);
            if lost.is_empty() {
                prop_assert_eq!(b, *h, "job {}: covered, billed exactly what it held", job);
            }
        }
        for f in &out.flagged {
            let job: usize = f.job_id.parse().unwrap();
            if job >= 6 {
                prop_assert_eq!(f.reason, FlagReason::UnknownJob);
            }
        }
        // Every job's rows with its own account are billed or flagged, never lost.
        let labelled: i64 = telemetry.iter().filter(|r| r.job_id.is_some()).map(|r| r.gpu_seconds).sum();
        let flagged: i64 = out.flagged.iter().map(|f| f.gpu_seconds).sum();
        prop_assert_eq!(billed.values().sum::<i64>() + flagged, labelled);
    }
}

/// A job of `account` holding `allocation` over `[0, secs)` of the first hour.
fn held_for(job: &str, account: &str, allocation: &str, secs: i64) -> Vec<JobEvent> {
    let ev = |t: i64, kind| {
        JobEvent::new(
            T0 + t * 1000,
            JobId::new(job).unwrap(),
            AccountId::new(account).unwrap(),
            None,
            kind,
        )
    };
    let mut start = ev(0, JobEventKind::Started);
    start.gpus = Some(1);
    start.allocation = Some(allocation.parse().unwrap());
    vec![start, ev(secs, JobEventKind::Finished)]
}

#[test]
fn a_gpu_held_in_parts_is_billed_to_each_job_for_its_part() {
    // GPU 0 of n1 is shared for the whole hour by a half (job 1) and a quarter (job 2); its
    // exporter labels every sample with job 1. GPU 1 holds 3g + 3g of MIG (jobs 3 and 4) for
    // half the hour; its samples name job 4.
    let mut events = held_for("1", "alpha", "n1:0@500m", 3600);
    events.extend(held_for("2", "beta", "n1:0@250m", 3600));
    events.extend(held_for("3", "gamma", "n1:1@3g", 1800));
    events.extend(held_for("4", "alpha", "n1:1@3g", 1800));
    let mut seconds: Vec<Second> = (0..3600)
        .map(|t| (0, 0, t, Some(1), Some("alpha")))
        .collect();
    seconds.extend((0..1800).map(|t| (0, 1, t, Some(4), Some("alpha"))));
    let runs = held_runs(&events, T0 + SPAN_S * 1000);
    let out = reconcile(
        &gpu_hours(&seconds),
        &runs,
        T0,
        T0 + SPAN_S * 1000,
        &|_| Some(GpuModel::H100Sxm),
        None,
    )
    .unwrap();
    let billed: BTreeMap<&str, i64> = out
        .billed
        .iter()
        .map(|m| (m.job_id.as_deref().unwrap(), m.gpu_seconds))
        .collect();
    // Three sevenths of the first two quarters of the hour (900 s each): 385.71 s each,
    // rounded down per quarter, 770 s.
    assert_eq!(
        billed,
        BTreeMap::from([("1", 1800), ("2", 900), ("3", 770), ("4", 770)])
    );
    // Each is billed to its own account, though the samples name job 1 or 4.
    let beta: i64 = out
        .billed
        .iter()
        .filter(|m| m.account == "beta")
        .map(|m| m.gpu_seconds)
        .sum();
    assert_eq!(beta, 900);
    // What the parts held was measured: no gap, nothing flagged.
    assert!(
        out.gaps.iter().all(|g| g.gpu_seconds <= 3),
        "{:?}",
        out.gaps
    );
    assert!(out.flagged.is_empty(), "{:?}", out.flagged);
}
