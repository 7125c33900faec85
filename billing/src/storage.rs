//! Storage on disk: walking the tenant directories (`gpuledger storage-scan`), appending each
//! scan to the data directory's scans file (its format is [`gpuledger_model::storage_scan`]'s),
//! and reading the scans back for billing in TB-days.

use std::collections::{BTreeMap, HashSet};
use std::fs::DirEntry;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpuledger_model::storage_scan::{format_scan, parse_scans, ScanLine, SCANS_FILE};
use gpuledger_model::{AccountId, ProjectId};

use crate::{Error, Result, StorageScan};

/// One directory's figure from a storage scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanRow {
    pub account: AccountId,
    pub project: Option<ProjectId>,
    pub bytes: u64,
    pub files: u64,
}

/// Files already counted, by device and inode: a file with several hard links counts once.
type Seen = HashSet<(u64, u64)>;

/// Walks `root/<account>/[<project>/]...`: bytes (apparent size) and files per account and
/// project. Files directly under an account's directory count for the account without a
/// project. Symbolic links are not followed and a file with several hard links counts once.
/// Directories that are not accounts of `accounts` are returned apart, to be reported.
pub fn scan_tenant_dirs(
    root: &Path,
    accounts: &[AccountId],
) -> Result<(Vec<ScanRow>, Vec<String>)> {
    let mut rows = Vec::new();
    let mut unknown = Vec::new();
    let mut seen = Seen::new();
    for entry in sorted_entries(root)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type().map_err(Error::io(entry.path()))?.is_dir() {
            continue;
        }
        let Some(account) = accounts.iter().find(|a| a.as_str() == name) else {
            unknown.push(name);
            continue;
        };
        let mut by_project: BTreeMap<Option<ProjectId>, (u64, u64)> = BTreeMap::new();
        for sub in sorted_entries(&entry.path())? {
            let ft = sub.file_type().map_err(Error::io(sub.path()))?;
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

fn sorted_entries(dir: &Path) -> Result<Vec<DirEntry>> {
    let mut entries: Vec<DirEntry> = std::fs::read_dir(dir)
        .and_then(|d| d.collect::<std::io::Result<_>>())
        .map_err(Error::io(dir))?;
    entries.sort_by_key(DirEntry::file_name);
    Ok(entries)
}

fn file_size(entry: &DirEntry, seen: &mut Seen) -> Result<(u64, u64)> {
    let meta = entry.metadata().map_err(Error::io(entry.path()))?;
    if meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
        return Ok((0, 0));
    }
    Ok((meta.len(), 1))
}

fn tree_size(dir: &Path, seen: &mut Seen) -> Result<(u64, u64)> {
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(Error::io(dir))? {
        let entry = entry.map_err(Error::io(dir))?;
        let ft = entry.file_type().map_err(Error::io(entry.path()))?;
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

/// Appends one scan's rows to the scans file under `data_root` and syncs it; its path.
pub fn record_scan(data_root: &Path, time: i64, rows: &[ScanRow]) -> Result<PathBuf> {
    let path = data_root.join(SCANS_FILE);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    }
    let new = !path.exists();
    let lines: Vec<ScanLine> = rows
        .iter()
        .map(|r| ScanLine {
            time,
            account: r.account.clone(),
            project: r.project.clone(),
            bytes: r.bytes,
            files: r.files,
        })
        .collect();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| {
            f.write_all(format_scan(&lines, new).as_bytes())?;
            f.sync_all()?;
            gpuledger_model::durable::sync_parent(&path)
        })
        .map_err(Error::io(&path))?;
    Ok(path)
}

/// Every storage scan recorded under `data_root`; a bad row names file, line and field.
pub fn read_storage_scans(data_root: &Path) -> Result<Vec<StorageScan>> {
    let path = data_root.join(SCANS_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
    let lines =
        parse_scans(&text, &path.display().to_string()).map_err(|e| Error::Input(e.to_string()))?;
    Ok(lines
        .into_iter()
        .map(|l| StorageScan {
            time: l.time,
            account: l.account,
            project: l.project,
            bytes: l.bytes,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_counts_each_tenant_directory_once_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tenants");
        let llm = root.join("team-a").join("llm");
        std::fs::create_dir_all(&llm).unwrap();
        std::fs::create_dir_all(root.join("stranger")).unwrap();
        std::fs::write(llm.join("ckpt"), vec![0u8; 1000]).unwrap();
        std::fs::hard_link(llm.join("ckpt"), llm.join("ckpt-link")).unwrap();
        std::fs::write(root.join("team-a").join("notes"), b"abc").unwrap();
        let accounts = [
            AccountId::new("team-a").unwrap(),
            AccountId::new("team-b").unwrap(),
        ];
        let (rows, unknown) = scan_tenant_dirs(&root, &accounts).unwrap();
        assert_eq!(unknown, ["stranger"]);
        let figures: Vec<(Option<&str>, u64, u64)> = rows
            .iter()
            .map(|r| (r.project.as_ref().map(|p| p.as_str()), r.bytes, r.files))
            .collect();
        assert_eq!(figures, [(None, 3, 1), (Some("llm"), 1000, 1)]);

        let data = dir.path().join("data");
        record_scan(&data, 100, &rows).unwrap();
        record_scan(&data, 200, &rows[..1]).unwrap();
        let scans = read_storage_scans(&data).unwrap();
        assert_eq!(scans.len(), 3);
        assert_eq!((scans[2].time, scans[2].bytes), (200, 3));
        std::fs::write(
            data.join(SCANS_FILE),
            "time,account,project,bytes,files\n1,team-a,,x,1\n",
        )
        .unwrap();
        let err = read_storage_scans(&data).unwrap_err().to_string();
        assert!(err.contains("scans.csv:2: field `bytes`"), "{err}");
    }
}
