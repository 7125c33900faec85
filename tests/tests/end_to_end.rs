//! The foundation's promise: what the scheduler allocated is exactly what the invoice bills,
//! with the telemetry going through real Arrow batches, the aggregator's ingest path, real
//! Parquet files and DataFusion in between.

use std::collections::BTreeMap;

use anyhow::Result;
use gpuledger_model::config::parse_toml;
use gpuledger_model::ClusterConfig;
use gpuledger_scheduler::SchedulerOptions;
use gpuledger_sim::demo::{self as pipeline, DemoSpec, Quiet};
use gpuledger_tests::{small_cluster_toml, SMALL_DAY_TOML};

fn run_small(dir: &std::path::Path, policy: &str) -> Result<pipeline::RunOutput> {
    let config = ClusterConfig::from_toml_str(&small_cluster_toml(2), "small.toml")?;
    let spec: DemoSpec = parse_toml(SMALL_DAY_TOML, "small-day.toml")?;
    let options = SchedulerOptions::parse(policy).expect("known policy");
    // The seed price book: time-of-use bands, idle capacity on the platform's invoice.
    let prices = gpuledger_sim::seed::load_price_book(None)?;
    Ok(pipeline::run(
        &config, &spec, options, &prices, dir, &Quiet,
    )?)
}

#[test]
fn invoice_bills_exactly_the_gpu_seconds_the_scheduler_allocated() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = run_small(dir.path(), "fairshare+backfill")?;
    let horizon = out.sim.horizon_s;

    // Per account: GPUs x run time (cut at the end of the day) from the scheduler's records.
    let mut allocated: BTreeMap<String, i64> = BTreeMap::new();
    for r in &out.sim.records {
        let secs = r.gpu_seconds_until(horizon);
        if secs > 0 {
            *allocated.entry(r.spec.account.to_string()).or_default() += secs;
        }
    }
    let billed: BTreeMap<String, i64> = out
        .invoices
        .iter()
        .filter(|i| i.account.as_str() != gpuledger_billing::pricebook::PLATFORM_ACCOUNT)
        .map(|i| (i.account.to_string(), i.gpu_seconds()))
        .collect();
    assert!(
        allocated.len() >= 2,
        "the workload ran jobs of several accounts: {allocated:?}"
    );
    assert_eq!(
        billed, allocated,
        "invoice GPU-seconds per account equal the scheduler's allocations"
    );

    // The workload queued (2 nodes are not enough for it), so the check covered waiting jobs,
    // a job running past midnight, and failed jobs.
    assert!(
        out.sim
            .records
            .iter()
            .any(|r| r.queue_wait_s().unwrap_or(0) > 0),
        "some job waited"
    );
    assert!(
        out.sim
            .records
            .iter()
            .any(|r| r.start_s.is_some() && r.end_s.is_none()),
        "a job runs past the horizon"
    );
    // Every GPU is sampled for the whole day, idle or not: at least 16 GPUs x 8,640 intervals.
    assert!(out.samples >= 16 * 8_640, "{} samples", out.samples);
    // Utilization measured from telemetry is exactly the scheduler's allocations over the
    // cluster's GPU-seconds for the day (2 nodes x 8 GPUs x 86,400 s).
    let allocated_total: i64 = allocated.values().sum();
    let measured = out.measured_utilization.expect("telemetry was stored");
    assert!(
        (measured - allocated_total as f64 / (16.0 * 86_400.0)).abs() < 1e-12,
        "{measured}"
    );
    let sampled: i64 = out.indicators.iter().map(|i| i.gpu_seconds).sum();
    assert_eq!(
        sampled,
        allocated.values().sum::<i64>(),
        "labelled GPU-seconds in storage"
    );
    Ok(())
}

#[test]
fn the_same_input_gives_the_same_invoices() -> Result<()> {
    let a = tempfile::tempdir()?;
    let b = tempfile::tempdir()?;
    let out_a = run_small(a.path(), "fairshare")?;
    let out_b = run_small(b.path(), "fairshare")?;
    assert!(!out_a.invoice_files.is_empty());
    for (fa, fb) in out_a.invoice_files.iter().zip(&out_b.invoice_files) {
        assert_eq!(
            std::fs::read(fa)?,
            std::fs::read(fb)?,
            "{} differs between runs",
            fa.display()
        );
    }
    Ok(())
}

#[test]
fn refused_jobs_are_not_billed() -> Result<()> {
    // gamma may use at most 4 GPUs a job: its 8-GPU jobs are refused at submission.
    let dir = tempfile::tempdir()?;
    let out = run_small(dir.path(), "fifo")?;
    let refused: Vec<_> = out
        .sim
        .refused
        .iter()
        .filter(|(s, _)| s.account.as_str() == "gamma")
        .collect();
    assert!(!refused.is_empty());
    assert!(refused
        .iter()
        .all(|(s, reason)| s.gpus == 8 && reason.to_string().contains("max_gpus_per_job")));
    let gamma_billed = out
        .invoices
        .iter()
        .find(|i| i.account.as_str() == "gamma")
        .map(|i| i.gpu_seconds())
        .unwrap_or(0);
    let gamma_allocated: i64 = out
        .sim
        .records
        .iter()
        .filter(|r| r.spec.account.as_str() == "gamma")
        .map(|r| r.gpu_seconds_until(out.sim.horizon_s))
        .sum();
    assert_eq!(gamma_billed, gamma_allocated);
    Ok(())
}

#[test]
fn a_tenant_that_reports_its_flops_is_billed_at_its_reported_mfu() -> Result<()> {
    use gpuledger_aggregator::billing_source::TablesUsage;
    use gpuledger_aggregator::layout::Layout;
    use gpuledger_aggregator::query::Query;
    use gpuledger_billing::source::{gather, Metering, NodeModels};
    use gpuledger_billing::Period;

    let dir = tempfile::tempdir()?;
    let config = ClusterConfig::from_toml_str(&small_cluster_toml(2), "small.toml")?;
    let mut spec: DemoSpec = parse_toml(SMALL_DAY_TOML, "small-day.toml")?;
    let mut beta = gpuledger_exporter::synthetic::TelemetryProfile::generic("beta".parse()?);
    beta.reported_mfu = Some(0.37);
    spec.telemetry.push(beta);
    let options = SchedulerOptions::parse("fairshare+backfill").expect("known policy");
    let prices = gpuledger_sim::seed::load_price_book(None)?;
    let out = pipeline::run(&config, &spec, options, &prices, dir.path(), &Quiet)?;
    let ran = out
        .sim
        .records
        .iter()
        .filter(|r| r.spec.account.as_str() == "beta" && r.start_s.is_some())
        .count();
    assert!(ran > 0, "beta's jobs ran");

    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let query = runtime.block_on(Query::open(&Layout::new(dir.path())))?;
    let june = Period::month("2026-06")?;
    let input = gather(
        &TablesUsage::new(&query, &runtime),
        &june,
        Metering::for_cluster(&config.telemetry, june.end * 1000),
        &NodeModels::from_config(&config),
        Vec::new(),
        Vec::new(),
    )?;
    let mfu_of = |account: &str| -> Vec<Option<u32>> {
        input
            .usage
            .iter()
            .filter(|u| u.account.as_str() == account && u.job_id.is_some())
            .map(|u| u.mfu_bp)
            .collect()
    };
    let beta_mfu = mfu_of("beta");
    assert!(!beta_mfu.is_empty());
    assert!(
        beta_mfu.iter().all(|m| *m == Some(3700)),
        "every beta hour at the reported 0.37: {beta_mfu:?}"
    );
    // A tenant that reports nothing is billed at its measured proxy.
    let alpha_mfu = mfu_of("alpha");
    assert!(
        alpha_mfu.iter().all(|m| m.is_some() && *m != Some(3700)),
        "{alpha_mfu:?}"
    );
    Ok(())
}
