//! Where things live under the data directory (DESIGN.md, "Storage layout"). Any Parquet engine
//! can read this hive layout. The tables may be in an object store ([`Objects`]); the rest
//! (the write-ahead log, invoices, storage scans, reservations) is always on a local disk: the
//! data directory itself when it is a path, the state directory when it is a URL.

use std::path::{Path, PathBuf};

use chrono::NaiveDate;

use crate::objects::Objects;

/// The data directory's layout: where the tables are and the local directory beside them.
#[derive(Clone, Debug)]
pub struct Layout {
    tables: Objects,
    root: PathBuf,
}

/// The tables the aggregator writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    Samples,
    RollupsHourly,
    Jobs,
}

impl Table {
    pub fn dir(self) -> &'static str {
        match self {
            Table::Samples => "samples",
            Table::RollupsHourly => "rollups/hourly",
            Table::Jobs => "jobs",
        }
    }

    pub fn sql_name(self) -> &'static str {
        match self {
            Table::Samples => "samples",
            Table::RollupsHourly => "rollups_hourly",
            Table::Jobs => "jobs",
        }
    }
}

impl Layout {
    /// A local data directory: tables and everything else under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Layout {
            tables: Objects::Local(root.clone()),
            root,
        }
    }

    /// Tables in `tables`, the local files under `local`.
    pub fn with_tables(tables: Objects, local: impl Into<PathBuf>) -> Self {
        Layout {
            tables,
            root: local.into(),
        }
    }

    /// The local directory: the write-ahead log, invoices, storage scans, reservations.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the tables' files are.
    pub fn tables(&self) -> &Objects {
        &self.tables
    }

    /// What to print for the data directory.
    pub fn display(&self) -> String {
        self.tables.display()
    }

    /// The key of a table's `date=` partition (`samples/date=2026-06-01`).
    pub fn partition_key(table: Table, date: NaiveDate) -> String {
        format!("{}/date={}", table.dir(), date.format("%Y-%m-%d"))
    }

    /// Where every month's invoices are (`<month>/<account>/rN.*`).
    pub fn invoices_root(&self) -> PathBuf {
        self.root.join("invoices")
    }

    pub fn invoices_dir(&self, month: &str) -> PathBuf {
        self.invoices_root().join(month)
    }
}
