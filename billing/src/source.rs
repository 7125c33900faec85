//! Where a month's usage comes from. The charge engine prices a [`BillingInput`]; [`gather`]
//! builds one from a [`UsageSource`] (the aggregator's tables implement it), and owns the
//! policy between the two: which MFU a job is billed at (its own FLOP/s report over the
//! measured tensor-activity proxy), how usage by allocation takes a job's measured MFU, and the
//! checks on every row before it is priced.

use std::collections::HashMap;

use gpuledger_model::{AccountId, GpuModel, JobId, NodeId, ProjectId};
use serde::Serialize;

use crate::{BillingInput, Error, IdleHour, Period, Reservation, Result, StorageScan, UsageHour};

/// GPU-seconds per job x node x UTC hour, with the sums its MFU comes from, as a store
/// reports them (text not yet checked).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeteredHour {
    pub account: String,
    pub project: Option<String>,
    pub job_id: Option<String>,
    pub node: String,
    pub gpu_model: String,
    /// Start of the UTC hour, Unix milliseconds.
    pub hour_ms: i64,
    pub gpu_seconds: i64,
    /// Sum over the hour's seconds of the tensor-activity MFU proxy.
    pub mfu_proxy_sum: f64,
    /// Seconds the proxy was measured over.
    pub mfu_seconds: i64,
}

/// GPU-seconds sampled on GPUs that ran no job, per node, model and UTC hour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdleGpuHour {
    pub node: String,
    pub gpu_model: String,
    /// Start of the UTC hour, Unix milliseconds.
    pub hour_ms: i64,
    pub gpu_seconds: i64,
}

/// A job's own report of what it achieved: FLOP/s over its GPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReportedFlops {
    pub job_id: String,
    pub achieved_flops: f64,
    pub gpus: i64,
}

/// What GPU usage is measured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metering {
    /// The exporters' samples: what the GPUs did for each job.
    Telemetry,
    /// The jobs' runs as their events tell them (Slurm's and Kubernetes' way): every GPU a run
    /// holds from its start to its end; a run still going counts up to `now_ms`. MFU comes from
    /// the job's report or, where its nodes run exporters, its telemetry.
    Allocation { now_ms: i64 },
}

/// A store of usage. Times are Unix milliseconds, windows `[from_ms, to_ms)`.
pub trait UsageSource {
    type Error: std::fmt::Display;
    /// Usage measured by telemetry.
    fn telemetry_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<MeteredHour>, Self::Error>;
    /// Usage by allocation, runs still going counted up to `now_ms` (no MFU sums).
    fn allocation_hours(
        &self,
        from_ms: i64,
        to_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<MeteredHour>, Self::Error>;
    /// Capacity that ran no job.
    fn idle_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<IdleGpuHour>, Self::Error>;
    /// Every job's FLOP/s report.
    fn reported_flops(&self) -> Result<Vec<ReportedFlops>, Self::Error>;
}

fn source_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Input(format!("reading {what}: {e}"))
}

/// Everything `period` is billed from: usage metered as `metering` says, idle capacity,
/// `storage` and `reservations`.
pub fn gather<S: UsageSource>(
    source: &S,
    period: &Period,
    metering: Metering,
    storage: Vec<StorageScan>,
    reservations: Vec<Reservation>,
) -> Result<BillingInput> {
    let (from, to) = (period.start * 1000, period.end * 1000);
    let reported: HashMap<String, (f64, i64)> = source
        .reported_flops()
        .map_err(|e| source_error("reported FLOP/s", e))?
        .into_iter()
        .map(|r| (r.job_id, (r.achieved_flops, r.gpus)))
        .collect();
    let telemetry = || {
        source
            .telemetry_hours(from, to)
            .map_err(|e| source_error("usage by telemetry", e))
    };
    let rows = match metering {
        Metering::Telemetry => telemetry()?,
        Metering::Allocation { now_ms } => {
            let mut rows = source
                .allocation_hours(from, to, now_ms)
                .map_err(|e| source_error("usage by allocation", e))?;
            with_measured_mfu(&mut rows, &telemetry()?);
            rows
        }
    };
    let usage = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| usage_hour(i, r, &reported))
        .collect::<Result<_>>()?;
    let idle = source
        .idle_hours(from, to)
        .map_err(|e| source_error("idle capacity", e))?
        .into_iter()
        .enumerate()
        .map(|(i, r)| idle_hour(i, r))
        .collect::<Result<_>>()?;
    Ok(BillingInput {
        usage,
        idle,
        storage,
        reservations,
    })
}

/// Gives each allocation row its job's mean measured MFU proxy (weighted over the job's
/// measured seconds), where the job has telemetry.
fn with_measured_mfu(rows: &mut [MeteredHour], telemetry: &[MeteredHour]) {
    let mut measured: HashMap<&str, (f64, i64)> = HashMap::new();
    for t in telemetry {
        if let Some(job) = &t.job_id {
            let e = measured.entry(job).or_default();
            e.0 += t.mfu_proxy_sum;
            e.1 += t.mfu_seconds;
        }
    }
    for r in rows {
        if let Some((sum, secs)) = r.job_id.as_deref().and_then(|j| measured.get(j)) {
            if *secs > 0 {
                r.mfu_seconds = r.gpu_seconds;
                r.mfu_proxy_sum = sum / *secs as f64 * r.gpu_seconds as f64;
            }
        }
    }
}

/// The MFU a row is billed at: the job's report where it made one, else the measured proxy;
/// `None` where neither exists.
fn billed_mfu(
    r: &MeteredHour,
    model: GpuModel,
    reported: &HashMap<String, (f64, i64)>,
) -> Option<f64> {
    match r.job_id.as_ref().and_then(|j| reported.get(j)) {
        Some((flops, gpus)) if *gpus > 0 => {
            Some(flops / (*gpus as f64 * model.peak_dense_bf16_flops()))
        }
        _ => (r.mfu_seconds > 0).then(|| r.mfu_proxy_sum / r.mfu_seconds as f64),
    }
}

fn usage_hour(
    i: usize,
    r: MeteredHour,
    reported: &HashMap<String, (f64, i64)>,
) -> Result<UsageHour> {
    let at = |field: &str, e: &dyn std::fmt::Display| {
        Error::Input(format!("usage row {i}: {field}: {e}"))
    };
    let gpu_model: GpuModel = r.gpu_model.parse().map_err(|e| at("gpu_model", &e))?;
    let mfu = billed_mfu(&r, gpu_model, reported);
    Ok(UsageHour {
        account: AccountId::new(&r.account).map_err(|e| at("account", &e))?,
        project: r
            .project
            .as_deref()
            .map(ProjectId::new)
            .transpose()
            .map_err(|e| at("project", &e))?,
        job_id: r
            .job_id
            .as_deref()
            .map(JobId::new)
            .transpose()
            .map_err(|e| at("job_id", &e))?,
        node: NodeId::new(&r.node).map_err(|e| at("node", &e))?,
        gpu_model,
        hour_start: r.hour_ms.div_euclid(1000),
        gpu_seconds: r.gpu_seconds,
        // A measurement, not money: rounded once to basis points.
        mfu_bp: mfu
            .filter(|m| m.is_finite())
            .map(|m| (m.clamp(0.0, 1.0) * 10_000.0).round() as u32),
    })
}

fn idle_hour(i: usize, r: IdleGpuHour) -> Result<IdleHour> {
    let at = |field: &str, e: &dyn std::fmt::Display| {
        Error::Input(format!("idle row {i}: {field}: {e}"))
    };
    Ok(IdleHour {
        node: NodeId::new(&r.node).map_err(|e| at("node", &e))?,
        gpu_model: r.gpu_model.parse().map_err(|e| at("gpu_model", &e))?,
        hour_start: r.hour_ms.div_euclid(1000),
        gpu_seconds: r.gpu_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store held in memory.
    #[derive(Default)]
    struct Rows {
        telemetry: Vec<MeteredHour>,
        allocation: Vec<MeteredHour>,
        idle: Vec<IdleGpuHour>,
        reported: Vec<ReportedFlops>,
    }

    impl UsageSource for Rows {
        type Error = String;
        fn telemetry_hours(&self, _: i64, _: i64) -> Result<Vec<MeteredHour>, String> {
            Ok(self.telemetry.clone())
        }
        fn allocation_hours(&self, _: i64, _: i64, _: i64) -> Result<Vec<MeteredHour>, String> {
            Ok(self.allocation.clone())
        }
        fn idle_hours(&self, _: i64, _: i64) -> Result<Vec<IdleGpuHour>, String> {
            Ok(self.idle.clone())
        }
        fn reported_flops(&self) -> Result<Vec<ReportedFlops>, String> {
            Ok(self.reported.clone())
        }
    }

    fn hour(job: &str, gpu_seconds: i64, proxy_sum: f64, mfu_seconds: i64) -> MeteredHour {
        MeteredHour {
            account: "team-a".into(),
            project: Some("llm".into()),
            job_id: Some(job.into()),
            node: "gpu001".into(),
            gpu_model: "h100-sxm".into(),
            hour_ms: 1_780_000_000_000 / 3_600_000 * 3_600_000,
            gpu_seconds,
            mfu_proxy_sum: proxy_sum,
            mfu_seconds,
        }
    }

    fn june() -> Period {
        Period::month("2026-06").unwrap()
    }

    #[test]
    fn a_jobs_own_report_wins_over_the_proxy_and_no_measure_is_no_mfu() {
        let source = Rows {
            telemetry: vec![
                hour("1", 3600, 1800.0, 3600),
                hour("2", 3600, 1440.0, 3600),
                hour("3", 3600, 0.0, 0),
            ],
            reported: vec![ReportedFlops {
                job_id: "2".into(),
                achieved_flops: 0.25 * GpuModel::H100Sxm.peak_dense_bf16_flops() * 8.0,
                gpus: 8,
            }],
            ..Rows::default()
        };
        let input = gather(&source, &june(), Metering::Telemetry, vec![], vec![]).unwrap();
        let mfu: Vec<Option<u32>> = input.usage.iter().map(|u| u.mfu_bp).collect();
        assert_eq!(mfu, [Some(5000), Some(2500), None]);
        assert_eq!(
            input.usage[0].hour_start * 1000,
            source.telemetry[0].hour_ms
        );
    }

    #[test]
    fn usage_by_allocation_takes_the_jobs_measured_mfu_where_it_has_telemetry() {
        let source = Rows {
            // Job 1 measured at 0.4 over 100 s; the allocation billed 7,200 GPU-seconds.
            telemetry: vec![hour("1", 100, 40.0, 100)],
            allocation: vec![hour("1", 7200, 0.0, 0), hour("9", 3600, 0.0, 0)],
            ..Rows::default()
        };
        let input = gather(
            &source,
            &june(),
            Metering::Allocation { now_ms: 0 },
            vec![],
            vec![],
        )
        .unwrap();
        assert_eq!(input.usage[0].gpu_seconds, 7200);
        assert_eq!(input.usage[0].mfu_bp, Some(4000));
        assert_eq!(input.usage[1].mfu_bp, None, "no telemetry, no MFU");
    }

    #[test]
    fn a_row_that_names_nothing_real_is_refused_with_its_row_and_field() {
        let mut bad = hour("1", 3600, 0.0, 0);
        bad.account = "../x".into();
        let source = Rows {
            telemetry: vec![hour("1", 3600, 0.0, 0), bad],
            ..Rows::default()
        };
        let err = gather(&source, &june(), Metering::Telemetry, vec![], vec![]).unwrap_err();
        assert!(
            err.to_string().starts_with("usage row 1: account:"),
            "{err}"
        );
        let source = Rows {
            idle: vec![IdleGpuHour {
                node: "gpu001".into(),
                gpu_model: "v100".into(),
                hour_ms: 0,
                gpu_seconds: 1,
            }],
            ..Rows::default()
        };
        let err = gather(&source, &june(), Metering::Telemetry, vec![], vec![]).unwrap_err();
        assert!(
            err.to_string().starts_with("idle row 0: gpu_model:"),
            "{err}"
        );
    }
}
