//! `gpuledger invoice` and `gpuledger storage-scan`: the month's invoices from stored usage,
//! and the storage figures they bill.

use std::path::PathBuf;

use anyhow::Context;
use gpuledger_aggregator::query::Query;
use gpuledger_billing::Period;

use gpuledger_aggregator::billing_source::TablesUsage;
use gpuledger_billing::invoices::{bill_month, read_reservations, reservations_in};
use gpuledger_billing::source::{gather, Metering, NodeModels};
use gpuledger_billing::storage::{read_storage_scans, record_scan, scan_tenant_dirs};

use crate::table;
use gpuledger_aggregator::serve::DEFAULT_DATA_DIR;
use gpuledger_sim::seed::{load_cluster, load_price_book};

#[derive(clap::Args, Debug)]
pub struct InvoiceArgs {
    /// The month, YYYY-MM (UTC).
    #[arg(long)]
    pub month: String,
    /// Revise only this account's invoice (the FOCUS file and the comparison still cover all).
    #[arg(long)]
    pub account: Option<String>,
    /// Data directory: a path, or the tables' object-store URL (as the aggregator's) with the
    /// invoices, storage scans and reservations under --state-dir.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "GPULEDGER_DATA_DIR")]
    pub data_dir: String,
    /// Local directory for invoices, storage scans and `reservations.toml` when --data-dir
    /// is a URL.
    #[arg(long, env = "GPULEDGER_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Price book (default: the embedded seed price book, examples/seed-prices.toml).
    #[arg(long)]
    pub price_book: Option<PathBuf>,
    /// Reservations (`[[reservations]]`: id, account, project, gpu_model, gpus, nodes, start,
    /// end); default: DATA/reservations.toml when it exists.
    #[arg(long)]
    pub reservations: Option<PathBuf>,
    /// Cluster config; its name is the FOCUS provider and issuer (default: the seed cluster).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// What usage is measured by: `telemetry` (the exporters' samples: what the GPUs did for
    /// each job, reconciled with the jobs' allocations unless the config's
    /// `telemetry.allocations` is `none`) or `allocation` (each job run's GPUs from start to
    /// end, from its job events, as Slurm accounts: for clusters without exporters).
    #[arg(long, default_value = "telemetry", value_parser = ["telemetry", "allocation"])]
    pub usage: String,
}

/// Prices a month and writes its invoice revisions, FOCUS file and model comparison.
pub fn invoice(args: InvoiceArgs) -> anyhow::Result<()> {
    let config = load_cluster(args.config.as_deref())?;
    let book = load_price_book(args.price_book.as_deref())?;
    let period = Period::month(&args.month).context("--month")?;
    let layout =
        gpuledger_aggregator::serve::open_layout(&args.data_dir, args.state_dir.as_deref(), true)?;
    let reservations = match &args.reservations {
        Some(path) => read_reservations(path)?,
        None => reservations_in(layout.root())?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let query = runtime.block_on(Query::open(&layout))?;
    // A run with no end event is held up to where the store's samples reach, not to the wall
    // clock: the store knows nothing of the time after.
    let now_ms = match runtime.block_on(query.data_through_ms())? {
        Some(through) => through.min(chrono::Utc::now().timestamp_millis()),
        None => chrono::Utc::now().timestamp_millis(),
    };
    let metering = match args.usage.as_str() {
        "allocation" => Metering::Allocation { now_ms },
        _ => Metering::for_cluster(&config.telemetry, now_ms),
    };
    let source = TablesUsage::new(&query, &runtime);
    let storage = read_storage_scans(layout.root())?;
    let nodes = NodeModels::from_config(&config);
    let input = gather(&source, &period, metering, &nodes, storage, reservations)?;
    for f in gpuledger_aggregator::quarantine::quarantined_files(&layout)? {
        eprintln!(
            "warning: {} is in quarantine ({}): this invoice lacks what it held; restore the file to its table and run again",
            layout.root().join(&f.key).display(),
            f.reason
        );
    }
    if input.usage.is_empty() && input.storage.is_empty() && input.reservations.is_empty() {
        println!("no usage in {} under {}", args.month, args.data_dir);
        return Ok(());
    }
    let out = bill_month(
        &layout.invoices_dir(&period.name),
        &period,
        &input,
        &book,
        args.account.as_deref(),
        &config.cluster.name,
    )?;
    let rows: Vec<Vec<String>> = out
        .invoices
        .iter()
        .filter(|i| {
            args.account
                .as_ref()
                .is_none_or(|a| a == i.account.as_str())
        })
        .map(|i| {
            vec![
                i.invoice_id.clone(),
                i.account.to_string(),
                i.billing_model
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "-".into()),
                format!("{:.1}", i.gpu_seconds() as f64 / 3600.0),
                i.total().to_string(),
                i.currency.to_string(),
                if out.revised.contains(&i.account.to_string()) {
                    "new".into()
                } else {
                    "unchanged".into()
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "invoice",
                "account",
                "model",
                "GPU-hours",
                "total",
                "currency",
                "revision"
            ],
            &rows
        )
    );
    println!();
    print!("{}", out.comparison.markdown());
    println!();
    for f in &out.files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct StorageScanArgs {
    /// The directory holding one directory per account (`ROOT/<account>/<project>/...`).
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "GPULEDGER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Cluster config with the tenant tree (default: the seed cluster).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Record the scan at this instant (RFC 3339) instead of now; for back-filling.
    #[arg(long)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Walks the tenant directories and appends their sizes to `DATA/storage/scans.csv`.
pub fn storage_scan(args: StorageScanArgs) -> anyhow::Result<()> {
    let config = load_cluster(args.config.as_deref())?;
    let accounts: Vec<_> = config.accounts.iter().map(|a| a.id.clone()).collect();
    let time = args.at.unwrap_or_else(chrono::Utc::now).timestamp();
    let (rows, unknown) = scan_tenant_dirs(&args.root, &accounts)?;
    for name in &unknown {
        tracing::warn!(directory = %name, root = %args.root.display(), "not an account of the tenant tree; not recorded");
    }
    let path = record_scan(&args.data_dir, time, &rows)?;
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.account.to_string(),
                r.project
                    .as_ref()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                r.bytes.to_string(),
                r.files.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(&["account", "project", "bytes", "files"], &table_rows)
    );
    println!(
        "recorded {} directories at {} in {}{}",
        rows.len(),
        gpuledger_model::time::rfc3339(time),
        path.display(),
        if unknown.is_empty() {
            String::new()
        } else {
            format!("; skipped (not accounts): {}", unknown.join(", "))
        }
    );
    Ok(())
}
