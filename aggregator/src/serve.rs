//! The aggregator service: opens the data directory, recovers the write-ahead log, serves the
//! HTTP API, flushes to Parquet on a row count or a timer, compacts, applies raw-sample
//! retention, and on SIGTERM or Ctrl-C stops accepting, flushes and returns. A flush that
//! fails ends the process ([`FLUSH_FAILED_EXIT`]) so that the restart replays the log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuledger_model::time::{date_of_ms, Clock, SystemClock};
use gpuledger_model::units::DurationSpec;
use gpuledger_model::ClusterConfig;
use gpuledger_service::{announce, AccessArgs, HttpLimits, TlsArgs};

use crate::http::{router, Service};
use crate::layout::Layout;
use crate::metrics::Metrics;
use crate::objects::Objects;
use crate::query::Query;
use crate::store::{Store, StoreOptions};
use crate::{Error, Ingestor, IngestorConfig, Result};

/// The default data directory of every command.
pub const DEFAULT_DATA_DIR: &str = "./gpuledger-data";

/// Options of the aggregator service (`gpuledger aggregator`).
#[derive(clap::Args, Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:9400", env = "GPULEDGER_LISTEN")]
    pub listen: SocketAddr,
    /// Data directory: a path, or an object-store URL for the tables (`s3://bucket/prefix`,
    /// settings from the `AWS_*` variables; `file:///path` through the same code) with the
    /// write-ahead log under --state-dir.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "GPULEDGER_DATA_DIR")]
    pub data_dir: String,
    /// Local directory for the write-ahead log and upload staging when --data-dir is a URL
    /// (with a path they are under the data directory).
    #[arg(long, env = "GPULEDGER_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Cluster config: accounts, projects, prices, fair-share half-life (default: the embedded
    /// seed cluster, examples/seed-cluster.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Names this aggregator's files, so several can write one data directory.
    #[arg(long, default_value = "agg0")]
    pub writer_id: String,
    /// Flush to Parquet at least this often (e.g. `60s`, `5m`).
    #[arg(long, default_value = "60s")]
    pub flush_interval: DurationSpec,
    /// Flush once this many sample rows are waiting.
    #[arg(long, default_value_t = 8 << 20)]
    pub flush_rows: u64,
    /// Merge small Parquet files this often: past days to one file per table, today's once it
    /// has 32.
    #[arg(long, default_value = "1h")]
    pub compact_interval: DurationSpec,
    /// Days of raw samples kept (and accepted); rollups are kept for good.
    #[arg(long, default_value_t = 90)]
    pub raw_retention_days: u32,
    /// How far in the future a sample may start (clock skew between nodes), e.g. `5m`.
    #[arg(long, default_value = "5m")]
    pub future_tolerance: DurationSpec,
    /// Accept batches only from these nodes of the cluster config (repeat, or comma-separated);
    /// default every node the config's pools define.
    #[arg(long, value_delimiter = ',')]
    pub node: Vec<String>,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub limits: HttpLimits,
    #[command(flatten)]
    pub sql: crate::sql_api::SqlLimits,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The data directory given as a path or a URL. With a URL the tables are in the object
/// store and the local files (write-ahead log, staging) under `state_dir`, which a writer must
/// be given; a reader needs none.
pub fn open_layout(data_dir: &str, state_dir: Option<&Path>, writer: bool) -> Result<Layout> {
    if !crate::objects::is_url(data_dir) {
        return Ok(Layout::new(data_dir));
    }
    let (state, staging) = match state_dir {
        Some(dir) => (dir.to_path_buf(), dir.join("staging")),
        None if writer => {
            return Err(Error::Config(format!(
                "data directory {data_dir} is a URL: what is written beside the tables (the write-ahead log, invoices) stays on a local disk; give --state-dir DIR"
            )))
        }
        // A reader writes no file of its own: nothing is staged.
        None => (std::env::temp_dir(), std::env::temp_dir()),
    };
    let objects = Objects::remote(data_dir, staging)
        .map_err(|e| e.context(format!("opening data directory {data_dir}")))?;
    Ok(Layout::with_tables(objects, state))
}

/// How long a sign-in to the status page lasts.
const SESSION_LIFETIME_S: u32 = 12 * 3600;

/// Runs the service under `cluster` until SIGTERM or Ctrl-C.
pub fn run(options: ServeOptions, cluster: ClusterConfig) -> Result<()> {
    let guard = options.access.guard("aggregator", options.listen)?;
    let tls = options.tls.acceptor()?;
    let layout = open_layout(&options.data_dir, options.state_dir.as_deref(), true)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(
        Store::open_at(
            layout.clone(),
            StoreOptions {
                writer_id: options.writer_id.clone(),
                max_rows_per_file: None,
                ..StoreOptions::default()
            },
        )
        .map_err(|e| e.context(format!("opening data directory {}", layout.display())))?,
    );
    let future_tolerance_ms = i64::try_from(options.future_tolerance.as_secs() * 1000)
        .map_err(|_| Error::Config("--future-tolerance is too long".into()))?;
    let inventory = gpuledger_model::Inventory::from_config(&cluster)
        .only_nodes(&options.node)
        .map_err(|e| Error::Config(format!("--node: {e}")))?;
    let ingest_config = IngestorConfig {
        future_tolerance_ms,
        raw_retention_days: options.raw_retention_days,
        ..IngestorConfig::new(inventory)
    };
    let started = Instant::now();
    let (ingestor, recovery) = Ingestor::open_durable(store, ingest_config, Arc::clone(&clock))
        .map_err(|e| e.context("recovering the write-ahead log"))?;
    tracing::info!(
        replayed_batches = recovery.replayed_batches,
        replayed_rows = recovery.replayed_rows,
        truncated_bytes = recovery.truncated_bytes,
        removed_files = recovery.removed_files,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "recovered"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Unavailable(format!("starting the runtime: {e}")))?;
    let ingestor = Arc::new(ingestor);
    if recovery.replayed_batches > 0 {
        // Replayed job events reach the tables only through a flush; the jobs still waiting
        // or running are rebuilt from the tables below.
        ingestor
            .flush()
            .map_err(|e| e.context("flushing what the log replayed"))?;
    }
    runtime.block_on(serve(options, cluster, ingestor, clock, layout, guard, tls))
}

async fn serve(
    options: ServeOptions,
    config: ClusterConfig,
    ingestor: Arc<Ingestor>,
    clock: Arc<dyn Clock>,
    layout: Layout,
    guard: gpuledger_auth::Guard,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<()> {
    let query = Query::open(&layout).await?;
    let sql = crate::sql_api::SqlApi::open(&layout, options.sql).await?;
    let metrics = Metrics::new(&config);
    let unfinished = query.unfinished_job_events().await?;
    let ended = query
        .jobs_finished_since(clock.now_ms() - 30 * 86_400_000)
        .await?;
    metrics.restore_live(&unfinished, &ended);
    tracing::info!(
        events = unfinished.len(),
        jobs = metrics.live_jobs().len(),
        "jobs waiting or running restored"
    );
    let service = Arc::new(Service {
        ingestor: Arc::clone(&ingestor),
        query,
        sql,
        metrics,
        config,
        clock: Arc::clone(&clock),
        guard,
        body_budget: gpuledger_service::BodyBudget::new(
            options.limits.max_buffered_bytes,
            crate::http::MAX_BODY_BYTES as u64,
        ),
        sessions: gpuledger_auth::Sessions::new(SESSION_LIFETIME_S, tls.is_some()),
        ready: std::sync::atomic::AtomicBool::new(false),
        invoices_root: layout.invoices_root(),
    });
    let shutdown = gpuledger_service::shutdown_signal()?;
    let listener = gpuledger_service::bind(options.listen).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Unavailable(format!("the listener's address: {e}")))?;
    // Tests and scripts read this line to find the port.
    announce(&format!(
        "gpuledger aggregator listening on {}://{addr} data-dir {}",
        gpuledger_service::scheme(tls.as_ref()),
        layout.display()
    ));
    let flusher = tokio::spawn(flush_loop(Arc::clone(&service), options.clone()));
    gpuledger_service::serve(
        listener,
        router(Arc::clone(&service)),
        options.limits,
        tls,
        shutdown,
    )
    .await
    .map_err(|e| Error::Unavailable(format!("serving: {e}")))?;
    flusher.abort();
    let stats = tokio::task::spawn_blocking(move || ingestor.flush())
        .await
        .map_err(|e| Error::Unavailable(format!("the last flush: {e}")))??;
    service.metrics.count_flush(clock.now_ms());
    tracing::info!(
        sample_files = stats.sample_files,
        rollup_rows = stats.rollup_rows,
        "flushed at shutdown"
    );
    announce("gpuledger aggregator stopped; all acknowledged data flushed");
    Ok(())
}

async fn flush_loop(service: Arc<Service>, options: ServeOptions) {
    let interval = Duration::from_secs(options.flush_interval.as_secs().max(1));
    let mut last = Instant::now();
    let mut last_compaction = Instant::now();
    let compact_every = Duration::from_secs(options.compact_interval.as_secs().max(1));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_ledger: Option<Instant> = None;
    // The first flush at once: ready means what the log replayed is in the tables.
    flush_and_retain(&service, options.raw_retention_days).await;
    if !service.ingestor.has_failed() {
        service
            .ready
            .store(true, std::sync::atomic::Ordering::Release);
    }
    loop {
        tick.tick().await;
        if last_compaction.elapsed() >= compact_every {
            last_compaction = Instant::now();
            compact(&service).await;
        }
        let due = last.elapsed() >= interval
            || service.ingestor.store().pending_rows() >= options.flush_rows;
        if !due {
            continue;
        }
        last = Instant::now();
        flush_and_retain(&service, options.raw_retention_days).await;
        if last_ledger.is_none_or(|t| t.elapsed() >= LEDGER_EVERY) {
            last_ledger = Some(Instant::now());
            update_ledger(&service).await;
        }
    }
}

/// How often the month-to-date ledger figures of `/metrics` are recomputed (after a flush).
const LEDGER_EVERY: Duration = Duration::from_secs(300);

/// Reconciles the month so far and sets its flagged and gap figures on `/metrics`.
async fn update_ledger(service: &Arc<Service>) {
    let now = service.clock.now_ms();
    let from = crate::status::month_start_ms(now);
    match crate::ledger::reconciled(&service.query, &service.config, from, now + 1, now).await {
        Ok(ledger) => service.metrics.set_ledger(&ledger),
        Err(error) => tracing::warn!(%error, "month-to-date ledger not computed"),
    }
}

async fn compact(service: &Arc<Service>) {
    let s = Arc::clone(service);
    let result =
        tokio::task::spawn_blocking(move || s.ingestor.compact(date_of_ms(s.clock.now_ms()), 32))
            .await;
    match result {
        Ok(Ok(done)) => tracing::info!(
            partitions = done.len(),
            files_merged = done.iter().map(|c| c.inputs).sum::<usize>(),
            "compacted"
        ),
        Ok(Err(error)) => tracing::error!(%error, "compaction failed"),
        Err(error) => tracing::error!(%error, "compaction task failed"),
    }
}

/// One flush, then retention. A failed flush ends the process; failed retention is only
/// logged (stored data is safe, and the next flush tries again).
async fn flush_and_retain(service: &Arc<Service>, raw_retention_days: u32) {
    let s = Arc::clone(service);
    let retention_days = i64::from(raw_retention_days);
    let result = tokio::task::spawn_blocking(move || {
        let stats = s.ingestor.flush()?;
        s.metrics.count_flush(s.clock.now_ms());
        let keep_from = date_of_ms(s.clock.now_ms() - retention_days * 86_400_000);
        Ok::<_, Error>((stats, s.ingestor.store().apply_retention(keep_from)))
    })
    .await;
    match result {
        Ok(Ok((stats, retention))) => {
            tracing::debug!(
                sample_files = stats.sample_files,
                rollup_rows = stats.rollup_rows,
                job_event_files = stats.job_event_files,
                "flushed"
            );
            match retention {
                Ok(deleted) if !deleted.is_empty() => {
                    tracing::info!(days = deleted.len(), "raw samples past retention deleted")
                }
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "retention failed"),
            }
        }
        Ok(Err(error)) => exit_after_failed_flush(&error),
        Err(error) => exit_after_failed_flush(&error),
    }
}

/// The exit status after a failed flush (EX_TEMPFAIL).
pub const FLUSH_FAILED_EXIT: i32 = 75;

/// A flush that failed (a full disk, an object store away past its retries) has taken rows
/// out of memory that only the write-ahead log still holds, so this process can store nothing
/// more. It exits, as a crash would, and the supervisor's restart replays the log: the
/// recovery that `kill -9` is tested against. Meanwhile exporters keep their batches.
fn exit_after_failed_flush(error: &dyn std::fmt::Display) -> ! {
    tracing::error!(error = %error, exit_status = FLUSH_FAILED_EXIT, "flush failed; exiting so that a restart replays the write-ahead log");
    std::process::exit(FLUSH_FAILED_EXIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_url_wants_a_state_dir_to_write_and_names_what_it_cannot_open() {
        let dir = tempfile::tempdir().unwrap();
        let plain = open_layout("/tmp/x", None, true).unwrap();
        assert_eq!(plain.root(), Path::new("/tmp/x"));
        let url = format!("file://{}", dir.path().display());
        let err = open_layout(&url, None, true).unwrap_err().to_string();
        assert!(err.contains("--state-dir"), "{err}");
        let state = dir.path().join("state");
        let remote = open_layout(&url, Some(&state), true).unwrap();
        assert_eq!(remote.root(), state.as_path());
        assert!(remote.tables().local_root().is_none());
        let err = open_layout("gopher://host/x", Some(&state), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("gopher://") && err.contains("s3://"), "{err}");
    }
}
