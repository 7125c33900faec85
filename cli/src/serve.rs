//! `gpuledger aggregator`: the aggregator service. Opens the data directory, recovers the
//! write-ahead log, serves the HTTP API, flushes to Parquet on a row count or a timer, applies
//! raw-sample retention, and on SIGTERM or Ctrl-C stops accepting, flushes and exits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpuledger_aggregator::http::{router, Service};
use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::metrics::Metrics;
use gpuledger_aggregator::objects::Objects;
use gpuledger_aggregator::query::Query;
use gpuledger_aggregator::store::{Store, StoreOptions};
use gpuledger_aggregator::{Ingestor, IngestorConfig};
use gpuledger_model::time::{date_of_ms, Clock, SystemClock};
use gpuledger_model::units::DurationSpec;

use crate::defaults::{load_cluster, DEFAULT_DATA_DIR};

/// Options of `gpuledger aggregator`.
#[derive(clap::Args, Debug, Clone)]
pub struct AggregatorArgs {
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
    /// Accept batches only from these nodes (repeat, or comma-separated); default any.
    #[arg(long, value_delimiter = ',')]
    pub node: Vec<String>,
    /// Token file (`gpuledger token add`): every route then wants a bearer token of a role
    /// allowed to use it. Without it authentication is off (a warning is logged), which is
    /// allowed on a loopback address only, unless --allow-unauthenticated.
    #[arg(long, env = "GPULEDGER_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Serve without --tokens on an address other hosts can reach (every request then acts as
    /// an operator): for a network you trust entirely.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Open routes to requests without a token, with --tokens: `metrics` (for a Prometheus
    /// without a token), `status` (the status page, every account on it).
    #[arg(long, value_delimiter = ',')]
    pub public: Vec<gpuledger_auth::Public>,
    #[command(flatten)]
    pub limits: crate::http_server::HttpLimits,
    #[command(flatten)]
    pub tls: crate::http_server::TlsArgs,
}

/// Who a service's listener lets in without a token.
#[derive(Clone, Copy, Debug)]
pub struct Exposure {
    pub listen: SocketAddr,
    /// `--allow-unauthenticated`: no tokens even where other hosts can connect.
    pub allow_unauthenticated: bool,
}

/// The guard of a service from its `--tokens` and `--public` options. Without tokens a service
/// listens on loopback only, unless the operator says otherwise (as Redis's protected mode):
/// a forgotten `--tokens` must not open every account's data to the network.
pub fn guard(
    service: &str,
    tokens: Option<&Path>,
    public: &[gpuledger_auth::Public],
    exposure: Exposure,
) -> anyhow::Result<gpuledger_auth::Guard> {
    match tokens {
        Some(path) => {
            if !path.exists() {
                bail!(
                    "token file {} does not exist; make one with `gpuledger token add --file {} --role operator --name admin`",
                    path.display(),
                    path.display()
                );
            }
            let guard = gpuledger_auth::Guard::follow(path, public.iter().copied())?;
            tracing::info!(service, file = %path.display(), public = ?public, "authentication on; the token file is followed");
            Ok(guard)
        }
        None => {
            if !public.is_empty() {
                bail!("--public opens routes of a service that has --tokens; without --tokens everything is open");
            }
            if !exposure.listen.ip().is_loopback() && !exposure.allow_unauthenticated {
                bail!(
                    "{service}: refusing to listen on {} without authentication, where other hosts can reach it; give --tokens FILE (`gpuledger token add`), listen on 127.0.0.1, or pass --allow-unauthenticated",
                    exposure.listen
                );
            }
            tracing::warn!(
                service,
                "authentication is off: every request acts as an operator (give --tokens FILE)"
            );
            Ok(gpuledger_auth::Guard::off())
        }
    }
}

/// The data directory given as a path or a URL. With a URL the tables are in the object
/// store and the local files (write-ahead log, staging) under `state_dir`, which a writer must
/// be given; a reader needs none.
pub fn open_layout(
    data_dir: &str,
    state_dir: Option<&Path>,
    writer: bool,
) -> anyhow::Result<Layout> {
    if !gpuledger_aggregator::objects::is_url(data_dir) {
        return Ok(Layout::new(data_dir));
    }
    let (state, staging) = match state_dir {
        Some(dir) => (dir.to_path_buf(), dir.join("staging")),
        None if writer => bail!(
            "data directory {data_dir} is a URL: what is written beside the tables (the write-ahead log, invoices) stays on a local disk; give --state-dir DIR"
        ),
        // A reader writes no file of its own: nothing is staged.
        None => (std::env::temp_dir(), std::env::temp_dir()),
    };
    let objects = Objects::remote(data_dir, staging)
        .with_context(|| format!("opening data directory {data_dir}"))?;
    Ok(Layout::with_tables(objects, state))
}

/// Runs the service until SIGTERM or Ctrl-C.
pub fn run(args: AggregatorArgs) -> anyhow::Result<()> {
    let config = load_cluster(args.config.as_deref())?;
    let exposure = Exposure {
        listen: args.listen,
        allow_unauthenticated: args.allow_unauthenticated,
    };
    let guard = guard("aggregator", args.tokens.as_deref(), &args.public, exposure)?;
    let tls = args.tls.acceptor()?;
    let layout = open_layout(&args.data_dir, args.state_dir.as_deref(), true)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(
        Store::open_at(
            layout.clone(),
            StoreOptions {
                writer_id: args.writer_id.clone(),
                max_rows_per_file: None,
                ..StoreOptions::default()
            },
        )
        .with_context(|| format!("opening data directory {}", layout.display()))?,
    );
    let ingest_config = IngestorConfig {
        known_nodes: args.node.iter().cloned().collect(),
        future_tolerance_ms: i64::try_from(args.future_tolerance.as_secs() * 1000)?,
        raw_retention_days: args.raw_retention_days,
    };
    let started = Instant::now();
    let (ingestor, recovery) = Ingestor::open_durable(store, ingest_config, Arc::clone(&clock))
        .context("recovering the write-ahead log")?;
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
        .build()?;
    let ingestor = Arc::new(ingestor);
    if recovery.replayed_batches > 0 {
        // Replayed job events reach the tables only through a flush; the jobs still waiting
        // or running are rebuilt from the tables below.
        ingestor.flush().context("flushing what the log replayed")?;
    }
    runtime.block_on(serve(args, config, ingestor, clock, layout, guard, tls))
}

async fn serve(
    args: AggregatorArgs,
    config: gpuledger_model::ClusterConfig,
    ingestor: Arc<Ingestor>,
    clock: Arc<dyn Clock>,
    layout: Layout,
    guard: gpuledger_auth::Guard,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> anyhow::Result<()> {
    let query = Query::open(&layout).await?;
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
        metrics,
        config,
        clock: Arc::clone(&clock),
        guard,
    });
    let shutdown = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to find the port.
    println!(
        "gpuledger aggregator listening on {}://{addr} data-dir {}",
        crate::http_server::scheme(tls.as_ref()),
        layout.display()
    );
    let flusher = tokio::spawn(flush_loop(Arc::clone(&service), args.clone()));
    crate::http_server::serve(
        listener,
        router(Arc::clone(&service)),
        args.limits,
        tls,
        shutdown,
    )
    .await?;
    flusher.abort();
    let stats = tokio::task::spawn_blocking(move || ingestor.flush()).await??;
    service.metrics.count_flush(clock.now_ms());
    tracing::info!(
        sample_files = stats.sample_files,
        rollup_rows = stats.rollup_rows,
        "flushed at shutdown"
    );
    announce("gpuledger aggregator stopped; all acknowledged data flushed");
    Ok(())
}

/// A line on stdout for whoever started the service; a closed stdout is not an error for a
/// daemon (a supervisor may have stopped reading), so failures are ignored.
pub fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

async fn flush_loop(service: Arc<Service>, args: AggregatorArgs) {
    let interval = Duration::from_secs(args.flush_interval.as_secs().max(1));
    let mut last = Instant::now();
    let mut last_compaction = Instant::now();
    let compact_every = Duration::from_secs(args.compact_interval.as_secs().max(1));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        if last_compaction.elapsed() >= compact_every {
            last_compaction = Instant::now();
            let s = Arc::clone(&service);
            let result = tokio::task::spawn_blocking(move || {
                s.ingestor.compact(date_of_ms(s.clock.now_ms()), 32)
            })
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
        let due = last.elapsed() >= interval
            || service.ingestor.store().pending_rows() >= args.flush_rows;
        if !due {
            continue;
        }
        last = Instant::now();
        let s = Arc::clone(&service);
        let retention_days = i64::from(args.raw_retention_days);
        let result = tokio::task::spawn_blocking(move || {
            let stats = s.ingestor.flush()?;
            s.metrics.count_flush(s.clock.now_ms());
            let keep_from = date_of_ms(s.clock.now_ms() - retention_days * 86_400_000);
            Ok::<_, gpuledger_aggregator::Error>((
                stats,
                s.ingestor.store().apply_retention(keep_from),
            ))
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
                    // Stored data is safe; the next flush tries again.
                    Err(error) => tracing::error!(%error, "retention failed"),
                }
            }
            Ok(Err(error)) => exit_after_failed_flush(&error),
            Err(error) => exit_after_failed_flush(&error),
        }
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

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on
/// either. Installing before the service announces itself matters: a signal that arrived
/// in between would otherwise take the default action and kill the process unflushed.
/// Must be called inside the runtime.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async move {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// For a service without a runtime of its own: a flag that turns true on SIGTERM or SIGINT.
/// The handlers are installed before this returns.
pub fn stop_flag() -> anyhow::Result<Arc<std::sync::atomic::AtomicBool>> {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let set = Arc::clone(&flag);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            runtime.block_on(async move {
                match shutdown_signal() {
                    Ok(signal) => {
                        let _ = ready_tx.send(Ok(()));
                        signal.await;
                        set.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
    ready_rx.recv().context("the signal thread ended")??;
    Ok(flag)
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
        let err = format!(
            "{:#}",
            open_layout("gopher://host/x", Some(&state), true).unwrap_err()
        );
        assert!(err.contains("gopher://") && err.contains("s3://"), "{err}");
    }

    #[test]
    fn without_tokens_a_service_listens_on_loopback_only_unless_told() {
        let exposure = |listen: &str, allow_unauthenticated| Exposure {
            listen: listen.parse().unwrap(),
            allow_unauthenticated,
        };
        for loopback in ["127.0.0.1:9400", "[::1]:9400"] {
            assert!(guard("aggregator", None, &[], exposure(loopback, false)).is_ok());
        }
        for open in ["0.0.0.0:9400", "10.1.2.3:9400", "[::]:9400"] {
            let err = guard("aggregator", None, &[], exposure(open, false))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("refusing to listen on") && err.contains("--tokens"),
                "{err}"
            );
            assert!(guard("aggregator", None, &[], exposure(open, true)).is_ok());
        }
    }
}
