//! Where a month's usage comes from. The charge engine prices a [`BillingInput`]; [`gather`]
//! builds one from a [`UsageSource`] (the aggregator's tables implement it), and owns the
//! policy between the two: how telemetry meets allocations ([`Metering`]), which MFU a job is
//! billed at (its own FLOP/s report over the measured tensor-activity proxy), how usage by
//! allocation and coverage gaps take a job's measured MFU, and the checks on every row before
//! it is priced.

use std::collections::{BTreeMap, HashMap};

use gpuledger_model::job::JobEvent;
use gpuledger_model::{AccountId, GpuModel, JobId, NodeId, ProjectId};

use crate::allocation::{allocation_hours, held_runs};
use crate::reconcile::{as_labelled, reconcile, Reconciled};
pub use crate::rows::{GpuHour, IdleGpuHour, MeteredHour, ReportedFlops};
use crate::{
    BillingInput, Error, FlagNote, IdleHour, Period, Reservation, Result, StorageScan, UsageHour,
};

/// What GPU usage is measured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metering {
    /// The exporters' samples billed as labelled: the nodes are trusted for which job ran
    /// (clusters with no allocation source, such as dcgm-exporter on Kubernetes).
    Telemetry,
    /// The exporters' samples reconciled with the jobs' allocations from their events
    /// ([`crate::reconcile`]): a job pays for what it measured on GPUs it held; GPUs it held
    /// that measured nothing are coverage gaps; runs still going are held up to `now_ms`.
    Reconciled { now_ms: i64 },
    /// The jobs' runs as their events tell them (Slurm's and Kubernetes' way): every GPU a run
    /// holds from its start to its end; a run still going counts up to `now_ms`. MFU comes from
    /// the job's report or, where its nodes run exporters, its telemetry.
    Allocation { now_ms: i64 },
}

impl Metering {
    /// How a cluster's telemetry is billed by default: reconciled with the job events where
    /// they are its allocation source, as labelled where it has none.
    pub fn for_cluster(telemetry: &gpuledger_model::config::TelemetryConfig, now_ms: i64) -> Self {
        match telemetry.allocations {
            gpuledger_model::config::AllocationSource::Events => Metering::Reconciled { now_ms },
            gpuledger_model::config::AllocationSource::None => Metering::Telemetry,
        }
    }
}

/// A store of usage. Times are Unix milliseconds, windows `[from_ms, to_ms)`.
pub trait UsageSource {
    type Error: std::fmt::Display;
    /// What each GPU measured per UTC hour and label, idle GPUs included.
    fn gpu_hours(&self, from_ms: i64, to_ms: i64) -> Result<Vec<GpuHour>, Self::Error>;
    /// Every job event before `to_ms` (runs that began before the window count in it).
    fn job_events(&self, to_ms: i64) -> Result<Vec<JobEvent>, Self::Error>;
    /// Every job's FLOP/s report.
    fn reported_flops(&self) -> Result<Vec<ReportedFlops>, Self::Error>;
}

fn source_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Input(format!("reading {what}: {e}"))
}

/// Each node's GPU model from the cluster config, for usage no exporter measured.
#[derive(Clone, Debug, Default)]
pub struct NodeModels {
    by_node: HashMap<String, GpuModel>,
    only: Option<GpuModel>,
}

impl NodeModels {
    pub fn from_config(config: &gpuledger_model::ClusterConfig) -> Self {
        let mut models: Vec<GpuModel> = config.node_pools.iter().map(|p| p.gpu_model).collect();
        models.sort();
        models.dedup();
        NodeModels {
            by_node: config
                .nodes()
                .into_iter()
                .map(|n| (n.id.to_string(), n.gpu_model))
                .collect(),
            only: (models.len() == 1).then(|| models[0]),
        }
    }

    /// The node's model, or the cluster's only model.
    pub fn model_of(&self, node: &str) -> Option<GpuModel> {
        self.by_node.get(node).copied().or(self.only)
    }

    /// The cluster's model where it has one only (runs whose events name no node).
    pub fn only_model(&self) -> Option<GpuModel> {
        self.only
    }
}

/// What a window's telemetry became: usage by job, gaps, idle capacity and flagged seconds.
pub fn metered(
    source: &impl UsageSource,
    from: i64,
    to: i64,
    metering: Metering,
    nodes: &NodeModels,
) -> Result<Reconciled> {
    let telemetry = || {
        source
            .gpu_hours(from, to)
            .map_err(|e| source_error("usage by telemetry", e))
    };
    let runs = |now_ms: i64| {
        source
            .job_events(to)
            .map(|events| held_runs(&events, now_ms))
            .map_err(|e| source_error("job events", e))
    };
    let model_of = |n: &str| nodes.model_of(n);
    Ok(match metering {
        Metering::Telemetry => as_labelled(&telemetry()?, from, to),
        Metering::Reconciled { now_ms } => reconcile(
            &telemetry()?,
            &runs(now_ms)?,
            from,
            to,
            &model_of,
            nodes.only_model(),
        )?,
        Metering::Allocation { now_ms } => {
            let measured = as_labelled(&telemetry()?, from, to);
            let mut billed =
                allocation_hours(&runs(now_ms)?, from, to, &model_of, nodes.only_model())?;
            with_measured_mfu(&mut billed, &measured.billed);
            Reconciled {
                billed,
                idle: measured.idle,
                ..Reconciled::default()
            }
        }
    })
}

/// Everything `period` is billed from: usage metered as `metering` says, idle capacity,
/// `storage` and `reservations`.
pub fn gather<S: UsageSource>(
    source: &S,
    period: &Period,
    metering: Metering,
    nodes: &NodeModels,
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
    let mut metered = metered(source, from, to, metering, nodes)?;
    with_measured_mfu(&mut metered.gaps, &metered.billed);
    let usage = metered
        .billed
        .into_iter()
        .enumerate()
        .map(|(i, r)| usage_hour(i, r, &reported))
        .collect::<Result<_>>()?;
    let gaps = metered
        .gaps
        .into_iter()
        .enumerate()
        .map(|(i, r)| usage_hour(i, r, &reported))
        .collect::<Result<_>>()?;
    let idle = metered
        .idle
        .into_iter()
        .enumerate()
        .map(|(i, r)| idle_hour(i, r))
        .collect::<Result<_>>()?;
    let mut flagged: BTreeMap<(NodeId, String), i64> = BTreeMap::new();
    for f in metered.flagged {
        let node =
            NodeId::new(&f.node).map_err(|e| Error::Input(format!("flagged row: node: {e}")))?;
        *flagged
            .entry((node, f.reason.as_str().to_owned()))
            .or_default() += f.gpu_seconds;
    }
    Ok(BillingInput {
        usage,
        gaps,
        idle,
        storage,
        reservations,
        flagged: flagged
            .into_iter()
            .map(|((node, reason), gpu_seconds)| FlagNote {
                node,
                reason,
                gpu_seconds,
            })
            .collect(),
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
        quarter_seconds: r.quarter_seconds,
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
        quarter_seconds: r.quarter_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::job::JobEventKind;

    /// A store held in memory.
    #[derive(Default)]
    struct Rows {
        telemetry: Vec<GpuHour>,
        events: Vec<JobEvent>,
        reported: Vec<ReportedFlops>,
    }

    impl UsageSource for Rows {
        type Error = String;
        fn gpu_hours(&self, _: i64, _: i64) -> Result<Vec<GpuHour>, String> {
            Ok(self.telemetry.clone())
        }
        fn job_events(&self, _: i64) -> Result<Vec<JobEvent>, String> {
            Ok(self.events.clone())
        }
        fn reported_flops(&self) -> Result<Vec<ReportedFlops>, String> {
            Ok(self.reported.clone())
        }
    }

    const HOUR: i64 = 1_780_272_000_000 + 3_600_000; // 2026-06-01T01:00:00Z

    fn hour(job: &str, gpu_seconds: i64, proxy_sum: f64, mfu_seconds: i64) -> GpuHour {
        GpuHour {
            node: "gpu001".into(),
            gpu_index: job.parse().unwrap_or(0),
            gpu_model: "h100-sxm".into(),
            hour_ms: HOUR,
            job_id: Some(job.into()),
            account: Some("team-a".into()),
            project: Some("llm".into()),
            gpu_seconds,
            quarter_seconds: None,
            mfu_proxy_sum: proxy_sum,
            mfu_seconds,
        }
    }

    /// What June's telemetry in `source` gathers to, with no allocations or reservations.
    fn gather_june(source: &Rows) -> Result<BillingInput> {
        gather(
            source,
            &june(),
            Metering::Telemetry,
            &nodes(),
            vec![],
            vec![],
        )
    }

    fn june() -> Period {
        Period::month("2026-06").unwrap()
    }

    fn nodes() -> NodeModels {
        NodeModels {
            only: Some(GpuModel::H100Sxm),
            ..NodeModels::default()
        }
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
        let input = gather_june(&source).unwrap();
        let mfu: Vec<Option<u32>> = input.usage.iter().map(|u| u.mfu_bp).collect();
        assert_eq!(mfu, [Some(5000), Some(2500), None]);
        assert_eq!(input.usage[0].hour_start * 1000, HOUR);
    }

    fn started(job: &str, at: i64, gpus: u32, allocation: Option<&str>) -> JobEvent {
        let mut e = JobEvent::new(
            at,
            JobId::new(job).unwrap(),
            AccountId::new("team-a").unwrap(),
            Some(ProjectId::new("llm").unwrap()),
            JobEventKind::Started,
        );
        e.gpus = Some(gpus);
        e.allocation = allocation.map(|a| a.parse().unwrap());
        e
    }

    #[test]
    fn usage_by_allocation_takes_the_jobs_measured_mfu_where_it_has_telemetry() {
        let source = Rows {
            // Job 1 measured at 0.4 over 100 s; its allocation holds 2 GPUs for the hour.
            telemetry: vec![hour("1", 100, 40.0, 100)],
            events: vec![started("1", HOUR, 2, None), started("9", HOUR, 1, None)],
            ..Rows::default()
        };
        let input = gather(
            &source,
            &june(),
            Metering::Allocation {
                now_ms: HOUR + 3_600_000,
            },
            &nodes(),
            vec![],
            vec![],
        )
        .unwrap();
        assert_eq!(input.usage[0].gpu_seconds, 7200);
        assert_eq!(input.usage[0].mfu_bp, Some(4000));
        assert_eq!(input.usage[1].mfu_bp, None, "no telemetry, no MFU");
    }

    #[test]
    fn reconciled_a_gap_takes_the_jobs_measured_mfu_and_forged_rows_are_flagged() {
        let mut forged = hour("7", 3600, 3600.0, 3600);
        forged.gpu_index = 5;
        let source = Rows {
            // Job 1 held GPU 1 for the hour; 1,800 s of it were measured, at 0.5.
            telemetry: vec![hour("1", 1800, 900.0, 1800), forged],
            events: vec![started("1", HOUR, 1, Some("gpu001:1"))],
            ..Rows::default()
        };
        let input = gather(
            &source,
            &june(),
            Metering::Reconciled {
                now_ms: HOUR + 3_600_000,
            },
            &nodes(),
            vec![],
            vec![],
        )
        .unwrap();
        assert_eq!(input.usage.len(), 1);
        assert_eq!(
            (input.usage[0].gpu_seconds, input.usage[0].mfu_bp),
            (1800, Some(5000))
        );
        assert_eq!(input.gaps.len(), 1);
        assert_eq!(
            (input.gaps[0].gpu_seconds, input.gaps[0].mfu_bp),
            (1800, Some(5000))
        );
        assert_eq!(
            input.flagged,
            [FlagNote {
                node: NodeId::new("gpu001").unwrap(),
                reason: "unknown_job".into(),
                gpu_seconds: 3600
            }]
        );
    }

    #[test]
    fn a_row_that_names_nothing_real_is_refused_with_its_row_and_field() {
        let mut bad = hour("1", 3600, 0.0, 0);
        bad.account = Some("../x".into());
        bad.gpu_index = 4;
        let source = Rows {
            telemetry: vec![hour("1", 3600, 0.0, 0), bad],
            ..Rows::default()
        };
        let err = gather_june(&source).unwrap_err();
        assert!(
            err.to_string().starts_with("usage row 0: account:"),
            "{err}"
        );
        let mut idle = hour("1", 1, 0.0, 0);
        (idle.job_id, idle.account, idle.project) = (None, None, None);
        idle.gpu_model = "v100".into();
        let source = Rows {
            telemetry: vec![idle],
            ..Rows::default()
        };
        let err = gather_june(&source).unwrap_err();
        assert!(
            err.to_string().starts_with("idle row 0: gpu_model:"),
            "{err}"
        );
    }
}
