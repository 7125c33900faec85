//! Where things live under the data directory (DESIGN.md, "Storage layout"). Any Parquet engine
//! can read this hive layout.

use std::path::{Path, PathBuf};

use chrono::NaiveDate;

/// The data directory's layout.
#[derive(Clone, Debug)]
pub struct Layout {
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
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn table_dir(&self, table: Table) -> PathBuf {
        self.root.join(table.dir())
    }

    pub fn partition_dir(&self, table: Table, date: NaiveDate) -> PathBuf {
        self.table_dir(table)
            .join(format!("date={}", date.format("%Y-%m-%d")))
    }

    pub fn invoices_dir(&self, month: &str) -> PathBuf {
        self.root.join("invoices").join(month)
    }
}
