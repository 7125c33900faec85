//! Wires billing to storage: reads a month's usage (rollups), idle capacity, reported MFU,
//! storage scans and reservations into the billing crate's input, and writes each account's
//! invoice revisions, the FOCUS export and the model comparison under
//! `DATA/invoices/YYYY-MM/`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::query::Query;
use gpuledger_billing::render::{
    focus_csv, invoice_csv, invoice_from_json, invoice_html, invoice_json, Comparison,
};
use gpuledger_billing::{
    charge, revise, BillingInput, BillingModel, IdleHour, Invoice, Period, PriceBook, Reservation,
    StorageScan, UsageHour,
};
use gpuledger_model::{AccountId, GpuModel, JobId, NodeId, ProjectId};
use serde::Deserialize;

/// The reservations file: `[[reservations]]` with RFC 3339 start and end.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservationsFile {
    #[serde(default)]
    reservations: Vec<ReservationEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservationEntry {
    id: String,
    account: AccountId,
    #[serde(default)]
    project: Option<ProjectId>,
    gpu_model: GpuModel,
    gpus: u32,
    #[serde(default)]
    nodes: Vec<NodeId>,
    start: chrono::DateTime<chrono::Utc>,
    end: chrono::DateTime<chrono::Utc>,
}

/// Reads a reservations file; errors name the file, line and field.
pub fn read_reservations(path: &Path) -> anyhow::Result<Vec<Reservation>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let origin = path.display().to_string();
    let file: ReservationsFile = gpuledger_model::config::parse_toml(&text, &origin)?;
    file.reservations
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            anyhow::ensure!(
                r.end > r.start,
                "{origin}: `reservations[{i}].end` must be after its start"
            );
            Ok(Reservation {
                id: r.id,
                account: r.account,
                project: r.project,
                gpu_model: r.gpu_model,
                gpus: r.gpus,
                nodes: r.nodes,
                start: r.start.timestamp(),
                end: r.end.timestamp(),
            })
        })
        .collect()
}

/// The reservations of a data directory (`DATA/reservations.toml`), none if it has no file.
pub fn default_reservations(layout: &Layout) -> anyhow::Result<Vec<Reservation>> {
    let path = layout.root().join("reservations.toml");
    if path.exists() {
        read_reservations(&path)
    } else {
        Ok(Vec::new())
    }
}

const SCAN_HEADER: &str = "time,account,project,bytes,files";

fn storage_dir(layout: &Layout) -> PathBuf {
    layout.root().join("storage")
}

/// One directory's figure from a storage scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanRow {
    pub account: AccountId,
    pub project: Option<ProjectId>,
    pub bytes: u64,
    pub files: u64,
}

/// Walks `root/<account>/[<project>/]...`: bytes (apparent size) and files per account and
/// project. Files directly under an account's directory count for the account without a
/// project. Symbolic links are not followed and a file with several hard links counts once.
/// Directories that are not accounts of `accounts` are returned apart, to be reported.
pub fn scan_tenant_dirs(
    root: &Path,
    accounts: &[AccountId],
) -> anyhow::Result<(Vec<ScanRow>, Vec<String>)> {
    let mut rows = Vec::new();
    let mut unknown = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut entries: Vec<_> = std::fs::read_dir(root)
        .with_context(|| format!("reading {}", root.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Some(account) = accounts.iter().find(|a| a.as_str() == name) else {
            unknown.push(name);
            continue;
        };
        let mut by_project: std::collections::BTreeMap<Option<ProjectId>, (u64, u64)> =
            Default::default();
        let mut subs: Vec<_> = std::fs::read_dir(entry.path())?.collect::<Result<_, _>>()?;
        subs.sort_by_key(|e| e.file_name());
        for sub in subs {
            let ft = sub.file_type()?;
            let (project, totals) = if ft.is_dir() {
                let project = ProjectId::new(sub.file_name().to_string_lossy()).ok();
                (project, tree_size(&sub.path(), &mut seen)?)
            } else if ft.is_file() {
                (None, file_size(&sub, &mut seen)?)
            } else {
                continue;
            };
            let e = by_project.entry(project).or_default();
            e.0 += totals.0;
            e.1 += totals.1;
        }
        if by_project.is_empty() {
            by_project.insert(None, (0, 0));
        }
        for (project, (bytes, files)) in by_project {
            rows.push(ScanRow {
                account: account.clone(),
                project,
                bytes,
                files,
            });
        }
    }
    Ok((rows, unknown))
}

fn file_size(
    entry: &std::fs::DirEntry,
    seen: &mut std::collections::HashSet<(u64, u64)>,
) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = entry.metadata()?;
    if meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
        return Ok((0, 0));
    }
    Ok((meta.len(), 1))
}

fn tree_size(
    dir: &Path,
    seen: &mut std::collections::HashSet<(u64, u64)>,
) -> anyhow::Result<(u64, u64)> {
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let ft = entry.file_type()?;
        let (b, f) = if ft.is_dir() {
            tree_size(&entry.path(), seen)?
        } else if ft.is_file() {
            file_size(&entry, seen)?
        } else {
            (0, 0)
        };
        total.0 += b;
        total.1 += f;
    }
    Ok(total)
}

/// Appends one scan's rows to `DATA/storage/scans.csv` and syncs it.
pub fn record_scan(layout: &Layout, time: i64, rows: &[ScanRow]) -> anyhow::Result<PathBuf> {
    let dir = storage_dir(layout);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("scans.csv");
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut text = String::new();
    if new {
        text.push_str(SCAN_HEADER);
        text.push('\n');
    }
    for r in rows {
        let project = r.project.as_ref().map(|p| p.as_str()).unwrap_or("");
        text.push_str(&format!(
            "{time},{},{project},{},{}\n",
            r.account, r.bytes, r.files
        ));
    }
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(path)
}

/// Every storage scan recorded under the data directory; a bad row names file, line and field.
pub fn read_storage_scans(layout: &Layout) -> anyhow::Result<Vec<StorageScan>> {
    let path = storage_dir(layout).join("scans.csv");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let at = |field: &str| format!("{}:{}: field `{field}`", path.display(), i + 1);
        let f: Vec<&str> = line.split(',').collect();
        anyhow::ensure!(
            f.len() == 5,
            "{}:{}: expected 5 fields ({SCAN_HEADER})",
            path.display(),
            i + 1
        );
        out.push(StorageScan {
            time: f[0].parse().with_context(|| at("time"))?,
            account: AccountId::new(f[1]).with_context(|| at("account"))?,
            project: (!f[2].is_empty())
                .then(|| ProjectId::new(f[2]))
                .transpose()
                .with_context(|| at("project"))?,
            bytes: f[3].parse().with_context(|| at("bytes"))?,
        });
    }
    Ok(out)
}

/// What a month's GPU usage is measured by.
#[derive(Clone, Copy, Debug)]
pub enum UsageSource<'a> {
    /// The exporters' samples, through the hourly rollups: what the GPUs did for each job.
    Telemetry,
    /// The jobs' runs as their events tell them (Slurm's and Kubernetes' way): every GPU a
    /// run holds, from its start to its end; a run still going counts up to `now_ms`. MFU comes
    /// from the job's report or, where the nodes run exporters, its telemetry.
    Allocation {
        config: &'a gpuledger_model::ClusterConfig,
        now_ms: i64,
    },
}

/// GPU-hours of `[from, to)` by allocation, with each job's telemetry MFU where there is some.
async fn allocated_hours(
    query: &Query,
    from: i64,
    to: i64,
    config: &gpuledger_model::ClusterConfig,
    now_ms: i64,
) -> anyhow::Result<Vec<gpuledger_aggregator::query::BillableHour>> {
    let nodes: HashMap<String, GpuModel> = config
        .nodes()
        .into_iter()
        .map(|n| (n.id.to_string(), n.gpu_model))
        .collect();
    let mut models: Vec<GpuModel> = config.node_pools.iter().map(|p| p.gpu_model).collect();
    models.dedup();
    let only_model = (models.len() == 1).then(|| models[0]);
    let events = query.job_events_before(to).await?;
    let mut rows = gpuledger_aggregator::allocation::allocation_hours(
        &events,
        from,
        to,
        now_ms,
        &|n| nodes.get(n).copied(),
        only_model,
    )?;
    let mut measured: HashMap<String, (f64, i64)> = HashMap::new();
    for t in query.billable_hours(from, to).await? {
        if let Some(job) = t.job_id {
            let e = measured.entry(job).or_default();
            e.0 += t.mfu_proxy_sum;
            e.1 += t.mfu_seconds;
        }
    }
    for r in &mut rows {
        if let Some((sum, secs)) = r.job_id.as_ref().and_then(|j| measured.get(j)) {
            if *secs > 0 {
                // The job's mean proxy, weighted over the run's seconds.
                r.mfu_seconds = r.gpu_seconds;
                r.mfu_proxy_sum = sum / *secs as f64 * r.gpu_seconds as f64;
            }
        }
    }
    Ok(rows)
}

/// Reads everything `period` is billed from, usage from telemetry.
pub async fn billing_input(
    query: &Query,
    layout: &Layout,
    period: &Period,
    reservations: Vec<Reservation>,
) -> anyhow::Result<BillingInput> {
    billing_input_from(query, layout, period, reservations, UsageSource::Telemetry).await
}

/// Reads everything `period` is billed from, usage from `source`.
pub async fn billing_input_from(
    query: &Query,
    layout: &Layout,
    period: &Period,
    reservations: Vec<Reservation>,
    source: UsageSource<'_>,
) -> anyhow::Result<BillingInput> {
    let (from, to) = (period.start * 1000, period.end * 1000);
    let reported: HashMap<String, (f64, i64)> = query
        .reported_mfu()
        .await?
        .into_iter()
        .map(|r| (r.job_id, (r.achieved_flops, r.gpus)))
        .collect();
    let rows = match source {
        UsageSource::Telemetry => query.billable_hours(from, to).await?,
        UsageSource::Allocation { config, now_ms } => {
            allocated_hours(query, from, to, config, now_ms).await?
        }
    };
    let mut usage = Vec::new();
    for (i, r) in rows.into_iter().enumerate() {
        let at = |field: &str| format!("usage row {i}: {field}");
        let gpu_model: GpuModel = r.gpu_model.parse().with_context(|| at("gpu_model"))?;
        let mfu = match r.job_id.as_ref().and_then(|j| reported.get(j)) {
            Some((flops, gpus)) if *gpus > 0 => {
                Some(flops / (*gpus as f64 * gpu_model.peak_dense_bf16_flops()))
            }
            _ => (r.mfu_seconds > 0).then(|| r.mfu_proxy_sum / r.mfu_seconds as f64),
        };
        usage.push(UsageHour {
            account: AccountId::new(&r.account).with_context(|| at("account"))?,
            project: r
                .project
                .as_deref()
                .map(ProjectId::new)
                .transpose()
                .with_context(|| at("project"))?,
            job_id: r
                .job_id
                .as_deref()
                .map(JobId::new)
                .transpose()
                .with_context(|| at("job_id"))?,
            node: NodeId::new(&r.node).with_context(|| at("node"))?,
            gpu_model,
            hour_start: r.hour_ms.div_euclid(1000),
            gpu_seconds: r.gpu_seconds,
            // A measurement, not money: rounded once to basis points.
            mfu_bp: mfu
                .filter(|m| m.is_finite())
                .map(|m| (m.clamp(0.0, 1.0) * 10_000.0).round() as u32),
        });
    }
    let idle = query
        .idle_hours(from, to)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            Ok(IdleHour {
                node: NodeId::new(&r.node).with_context(|| format!("idle row {i}: node"))?,
                gpu_model: r
                    .gpu_model
                    .parse()
                    .with_context(|| format!("idle row {i}: gpu_model"))?,
                hour_start: r.hour_ms.div_euclid(1000),
                gpu_seconds: r.gpu_seconds,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(BillingInput {
        usage,
        idle,
        storage: read_storage_scans(layout)?,
        reservations,
    })
}

/// What one invoice run wrote.
#[derive(Debug)]
pub struct MonthOutput {
    /// The latest revision of every account's invoice for the month.
    pub invoices: Vec<Invoice>,
    /// Accounts whose invoice got a new revision in this run.
    pub revised: Vec<String>,
    pub files: Vec<PathBuf>,
    pub comparison: Comparison,
}

fn latest_revision(dir: &Path) -> anyhow::Result<Option<Invoice>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut latest: Option<(u32, PathBuf)> = None;
    for e in entries {
        let path = e?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let Some(n) = name
            .strip_prefix('r')
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if latest.as_ref().is_none_or(|(m, _)| n > *m) {
            latest = Some((n, path));
        }
    }
    let Some((_, path)) = latest else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)?;
    Ok(Some(
        invoice_from_json(&text).with_context(|| format!("reading {}", path.display()))?,
    ))
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<PathBuf> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Prices `input` under `book`, revises each account's invoice against its latest revision in
/// `DATA/invoices/YYYY-MM/<account>/rN.{json,csv,html}` (a new revision only when something
/// changed), and writes `focus-YYYY-MM.csv` and `compare-YYYY-MM.{csv,md}`. `only` limits the
/// revision to one account; the exports always cover every account's latest revision.
pub fn bill_month(
    layout: &Layout,
    period: &Period,
    input: &BillingInput,
    book: &PriceBook,
    only: Option<&str>,
    issuer: &str,
) -> anyhow::Result<MonthOutput> {
    let fresh = charge(period, input, book, None)?;
    let per_model: Vec<Vec<Invoice>> = BillingModel::ALL
        .iter()
        .map(|m| charge(period, input, book, Some(*m)))
        .collect::<Result<_, _>>()?;
    let month_dir = layout.invoices_dir(&period.name);
    std::fs::create_dir_all(&month_dir)
        .with_context(|| format!("creating {}", month_dir.display()))?;
    let mut accounts: std::collections::BTreeSet<String> =
        fresh.iter().map(|i| i.account.to_string()).collect();
    for e in std::fs::read_dir(&month_dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            accounts.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    let mut latest = Vec::new();
    let mut revised = Vec::new();
    let mut files = Vec::new();
    for account in accounts {
        let dir = month_dir.join(&account);
        let previous = latest_revision(&dir)?;
        if only.is_some_and(|o| o != account) {
            latest.extend(previous);
            continue;
        }
        let current = match fresh.iter().find(|i| i.account.as_str() == account) {
            Some(i) => i.clone(),
            None => empty_invoice(period, &account, book, previous.as_ref())?,
        };
        let before = previous.as_ref().map(|p| p.revision);
        let inv = revise(previous, current);
        if before != Some(inv.revision) {
            std::fs::create_dir_all(&dir)?;
            let stem = dir.join(format!("r{}", inv.revision));
            files.push(write_file(
                &stem.with_extension("json"),
                &invoice_json(&inv),
            )?);
            files.push(write_file(&stem.with_extension("csv"), &invoice_csv(&inv))?);
            files.push(write_file(
                &stem.with_extension("html"),
                &invoice_html(&inv),
            )?);
            revised.push(account);
        }
        latest.push(inv);
    }
    files.push(write_file(
        &month_dir.join(format!("focus-{}.csv", period.name)),
        &focus_csv(&latest, issuer),
    )?);
    let comparison = Comparison::new(&latest, [&per_model[0], &per_model[1], &per_model[2]]);
    files.push(write_file(
        &month_dir.join(format!("compare-{}.csv", period.name)),
        &comparison.csv(),
    )?);
    files.push(write_file(
        &month_dir.join(format!("compare-{}.md", period.name)),
        &comparison.markdown(),
    )?);
    Ok(MonthOutput {
        invoices: latest,
        revised,
        files,
        comparison,
    })
}

/// An invoice with no lines, for an account whose earlier revision billed usage that is gone.
fn empty_invoice(
    period: &Period,
    account: &str,
    book: &PriceBook,
    previous: Option<&Invoice>,
) -> anyhow::Result<Invoice> {
    let account = AccountId::new(account)?;
    Ok(Invoice {
        invoice_id: Invoice::id_for(&period.name, &account, 1),
        period: period.name.clone(),
        period_start: period.start,
        period_end: period.end,
        currency: book.currency(),
        billing_model: previous.and_then(|p| p.billing_model),
        revision: 1,
        lines: Vec::new(),
        daily_gpu_seconds: Vec::new(),
        account,
    })
}
