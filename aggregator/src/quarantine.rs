//! Corrupt Parquet files: found, moved aside, reported, and the rest served. A file that does
//! not read (a torn copy, a disk error, a hand edit) would make every query over its table
//! fail; instead it goes to `DATA/quarantine/<table>/date=.../` with a note of why, queries
//! read the others, and `/metrics` and the logs say what was set aside, so an operator can
//! restore it from a backup (or re-ingest what the exporters still hold).

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::layout::{Layout, Table};
use crate::objects::{Entry, Objects};
use crate::Result;

/// One file moved aside; `from` and `to` are keys under the data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub table: &'static str,
    pub from: String,
    pub to: String,
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
pub fn check_file(objects: &Objects, entry: &Entry, depth: Depth) -> Option<String> {
    let file = match objects.reader(entry) {
        Ok(f) => f,
        // Gone meanwhile (compacted, retained away): nothing to check.
        Err(crate::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return None
        }
        Err(e) => return Some(e.to_string()),
    };
    let reader = match SerializedFileReader::new(file) {
        Ok(r) => r,
        Err(e) if gone(&e) => return None,
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

/// A store's "not found" under the Parquet reader: the file went between list and read.
fn gone(e: &parquet::errors::ParquetError) -> bool {
    match e {
        parquet::errors::ParquetError::External(inner) => matches!(
            inner.downcast_ref::<crate::Error>(),
            Some(crate::Error::ObjectStore {
                source: object_store::Error::NotFound { .. },
                ..
            })
        ),
        _ => false,
    }
}

const QUARANTINE: &str = "quarantine";
const REASON_SUFFIX: &str = ".reason";

/// Checks every Parquet file of the data directory and moves the ones that do not read to
/// `quarantine/`, beside a `.reason` note.
pub fn quarantine_corrupt(layout: &Layout, depth: Depth) -> Result<Vec<Quarantined>> {
    let objects = layout.tables();
    let mut out = Vec::new();
    for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
        for entry in objects.list(table.dir())? {
            if !entry.key.ends_with(".parquet") {
                continue;
            }
            let Some(reason) = check_file(objects, &entry, depth) else {
                continue;
            };
            let to = format!("{QUARANTINE}/{}", entry.key);
            objects.rename(&entry.key, &to)?;
            objects.put(
                &format!("{to}{REASON_SUFFIX}"),
                format!("{reason}\n").into_bytes(),
            )?;
            tracing::error!(
                table = table.sql_name(),
                file = %entry.key,
                data_dir = %layout.display(),
                quarantined_to = %to,
                reason = %reason,
                "corrupt Parquet file set aside; queries read the rest"
            );
            out.push(Quarantined {
                table: table.sql_name(),
                from: entry.key,
                to,
                reason,
            });
        }
    }
    Ok(out)
}

/// A file in quarantine: its key and the reason noted beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    pub key: String,
    pub reason: String,
}

/// Files in quarantine now (what an operator still has to deal with).
pub fn quarantined_files(layout: &Layout) -> Result<Vec<SetAside>> {
    let objects = layout.tables();
    let mut out = Vec::new();
    for entry in objects.list(QUARANTINE)? {
        if !entry.key.ends_with(".parquet") {
            continue;
        }
        let reason = objects
            .get(&format!("{}{REASON_SUFFIX}", entry.key))?
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .unwrap_or_default();
        out.push(SetAside {
            key: entry.key,
            reason,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_file_is_set_aside_with_its_reason_on_a_path_and_in_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let tables = dir.path().join("remote");
        std::fs::create_dir_all(&tables).unwrap();
        let url = format!("file://{}", tables.display());
        for layout in [
            Layout::new(dir.path().join("local")),
            Layout::with_tables(
                Objects::remote(&url, dir.path().join("staging")).unwrap(),
                dir.path().join("state"),
            ),
        ] {
            let objects = layout.tables();
            let key = "samples/date=2026-06-01/part-agg0-1-00000.parquet";
            // The end of a Parquet file without its start: the footer's magic, no footer.
            objects.put(key, b"torn copy PAR1".to_vec()).unwrap();
            objects
                .put("samples/date=2026-06-01/notes.txt", b"not parquet".to_vec())
                .unwrap();
            let moved = quarantine_corrupt(&layout, Depth::Footer).unwrap();
            assert_eq!(moved.len(), 1, "{layout:?}");
            assert_eq!(moved[0].from, key);
            assert_eq!(moved[0].to, format!("quarantine/{key}"));
            assert!(!objects.exists(key).unwrap());
            let listed = quarantined_files(&layout).unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].key, moved[0].to);
            assert_eq!(listed[0].reason, moved[0].reason);
            assert!(!listed[0].reason.is_empty());
            assert!(
                objects.exists("samples/date=2026-06-01/notes.txt").unwrap(),
                "only Parquet files are checked"
            );
            assert!(quarantine_corrupt(&layout, Depth::Footer)
                .unwrap()
                .is_empty());
        }
    }
}
