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
        let files: Vec<Entry> = objects
            .list(table.dir())?
            .into_iter()
            .filter(|entry| entry.key.ends_with(".parquet"))
            .collect();
        let reasons = check_files(objects, &files, depth);
        for (entry, reason) in files.into_iter().zip(reasons) {
            let Some(reason) = reason else {
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

/// Files checked at once: against an object store each footer check is two ranged GETs, and
/// one file after another a bucket of a few thousand files would take minutes to open.
const CHECKERS: usize = 8;

/// [`check_file`] for each of `files`, in order, on up to `CHECKERS` threads.
fn check_files(objects: &Objects, files: &[Entry], depth: Depth) -> Vec<Option<String>> {
    let per_thread = files.len().div_ceil(CHECKERS).max(1);
    let check = |part: &[Entry]| -> Vec<Option<String>> {
        part.iter()
            .map(|entry| check_file(objects, entry, depth))
            .collect()
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = files
            .chunks(per_thread)
            .map(|part| scope.spawn(move || check(part)))
            .collect();
        threads
            .into_iter()
            .flat_map(|t| {
                t.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
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

    fn good_parquet() -> Vec<u8> {
        use arrow::array::{ArrayRef, Int32Array};
        let column: ArrayRef = std::sync::Arc::new(Int32Array::from(vec![1, 2, 3]));
        let batch = arrow::record_batch::RecordBatch::try_from_iter([("x", column)]).unwrap();
        let mut bytes = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        bytes
    }

    #[test]
    fn torn_files_are_set_aside_with_their_reasons_on_a_path_and_in_a_store() {
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
            // Twenty files, checked on several threads: the two torn ones (the end of a
            // Parquet file without its start: the footer's magic, no footer) are set aside,
            // the good ones stay.
            let key = |i: usize| format!("samples/date=2026-06-01/part-agg0-1-{i:05}.parquet");
            let torn = [5, 13];
            for i in 0..20 {
                let bytes = if torn.contains(&i) {
                    b"torn copy PAR1".to_vec()
                } else {
                    good_parquet()
                };
                objects.put(&key(i), bytes).unwrap();
            }
            objects
                .put("samples/date=2026-06-01/notes.txt", b"not parquet".to_vec())
                .unwrap();
            let mut moved = quarantine_corrupt(&layout, Depth::Footer).unwrap();
            moved.sort_by(|a, b| a.from.cmp(&b.from));
            let from: Vec<String> = moved.iter().map(|m| m.from.clone()).collect();
            assert_eq!(from, torn.map(key), "{layout:?}");
            for i in 0..20 {
                assert_eq!(
                    objects.exists(&key(i)).unwrap(),
                    !torn.contains(&i),
                    "{}",
                    key(i)
                );
            }
            let mut listed = quarantined_files(&layout).unwrap();
            listed.sort_by(|a, b| a.key.cmp(&b.key));
            assert_eq!(listed.len(), 2);
            for (set_aside, moved) in listed.iter().zip(&moved) {
                assert_eq!(moved.to, format!("quarantine/{}", moved.from));
                assert_eq!(set_aside.key, moved.to);
                assert_eq!(set_aside.reason, moved.reason);
                assert!(!set_aside.reason.is_empty());
            }
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
