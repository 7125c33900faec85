//! Corrupt Parquet files: found, moved aside, reported, and the rest served. A file that does
//! not read (a torn copy, a disk error, a hand edit) would make every query over its table
//! fail; instead it goes to `DATA/quarantine/<table>/date=.../` with a note of why, queries
//! read the others, and `/metrics` and the logs say what was set aside, so an operator can
//! restore it from a backup (or re-ingest what the exporters still hold).

use std::fs;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::layout::{Layout, Table};
use crate::{io_err, Result};

/// One file moved aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub table: &'static str,
    pub from: PathBuf,
    pub to: PathBuf,
    pub reason: String,
}

/// How deep a check reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// The footer (schema, row groups, statistics): fast, catches a torn or garbled file.
    Footer,
    /// Every value of every row group as well: for when a query failed on a file whose footer
    /// reads.
    Full,
}

/// Why a Parquet file does not read at `depth`, if it does not.
pub fn check_file(path: &Path, depth: Depth) -> Option<String> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        // Gone meanwhile (compacted, retained away): nothing to check.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(e.to_string()),
    };
    let reader = match SerializedFileReader::new(file) {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    if depth == Depth::Footer {
        return None;
    }
    for i in 0..reader.num_row_groups() {
        let group = match reader.get_row_group(i) {
            Ok(g) => g,
            Err(e) => return Some(format!("row group {i}: {e}")),
        };
        for row in match group.get_row_iter(None) {
            Ok(r) => r,
            Err(e) => return Some(format!("row group {i}: {e}")),
        } {
            if let Err(e) = row {
                return Some(format!("row group {i}: {e}"));
            }
        }
    }
    None
}

fn parquet_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let path = entry.map_err(io_err(dir))?.path();
        if path.is_dir() {
            parquet_files(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "parquet") {
            out.push(path);
        }
    }
    Ok(())
}

/// Checks every Parquet file of the data directory and moves the ones that do not read to
/// `quarantine/`, beside a `.reason` note.
pub fn quarantine_corrupt(layout: &Layout, depth: Depth) -> Result<Vec<Quarantined>> {
    let mut out = Vec::new();
    for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
        let dir = layout.table_dir(table);
        let mut files = Vec::new();
        parquet_files(&dir, &mut files)?;
        files.sort();
        for path in files {
            let Some(reason) = check_file(&path, depth) else {
                continue;
            };
            let relative = path.strip_prefix(&dir).unwrap_or(&path);
            let to = layout
                .root()
                .join("quarantine")
                .join(table.dir())
                .join(relative);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(io_err(parent))?;
            }
            fs::rename(&path, &to).map_err(io_err(&path))?;
            let note = to.with_extension("parquet.reason");
            fs::write(&note, format!("{reason}\n")).map_err(io_err(&note))?;
            tracing::error!(
                table = table.sql_name(),
                file = %path.display(),
                quarantined_to = %to.display(),
                reason = %reason,
                "corrupt Parquet file set aside; queries read the rest"
            );
            out.push(Quarantined {
                table: table.sql_name(),
                from: path,
                to,
                reason,
            });
        }
    }
    Ok(out)
}

/// Files in quarantine now (what an operator still has to deal with).
pub fn quarantined_files(layout: &Layout) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    parquet_files(&layout.root().join("quarantine"), &mut files)?;
    files.sort();
    Ok(files)
}
