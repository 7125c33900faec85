//! Parquet writers for the data directory. A file is written under a temporary name and
//! renamed when complete, so a reader never sees half a file. Samples go to one open file per
//! UTC day until it reaches its row bound; rollups and job events are written on flush.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow::array::{AsArray, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use chrono::NaiveDate;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use gpuledger_model::job::{job_events_to_batch, JobEvent};
use gpuledger_model::sample::sample_schema;
use gpuledger_model::time::{date_of_ms, MS_PER_DAY};

use crate::layout::{Layout, Table};
use crate::rollup::{rollup_schema, RollupAccumulator};
use crate::{io_err, Error, Result};

/// How the store writes.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Names this writer's files, so several aggregators can share a directory.
    pub writer_id: String,
    /// A samples file is closed and a new one opened past this many rows.
    pub max_rows_per_file: usize,
    pub row_group_rows: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            writer_id: "agg0".into(),
            max_rows_per_file: 8 << 20,
            row_group_rows: 1 << 20,
        }
    }
}

struct OpenFile {
    writer: ArrowWriter<File>,
    tmp: PathBuf,
    path: PathBuf,
    rows: usize,
}

/// What a flush wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushStats {
    pub sample_files: usize,
    pub rollup_files: usize,
    pub rollup_rows: usize,
}

/// The writer side of the data directory.
pub struct Store {
    layout: Layout,
    options: StoreOptions,
    run_tag: String,
    file_seq: AtomicU64,
    samples: Mutex<HashMap<NaiveDate, Arc<Mutex<Option<OpenFile>>>>>,
    rollups: Mutex<RollupAccumulator>,
    closed_sample_files: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.layout.root())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn writer_props(row_group_rows: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_max_row_group_row_count(Some(row_group_rows))
        .build()
}

impl Store {
    /// Opens (creating) the data directory.
    pub fn open(root: impl Into<PathBuf>, options: StoreOptions) -> Result<Self> {
        let layout = Layout::new(root);
        for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
            let dir = layout.table_dir(table);
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        let run_tag = format!("{:x}", chrono::Utc::now().timestamp_millis());
        Ok(Store {
            layout,
            options,
            run_tag,
            file_seq: AtomicU64::new(0),
            samples: Mutex::new(HashMap::new()),
            rollups: Mutex::new(RollupAccumulator::default()),
            closed_sample_files: AtomicU64::new(0),
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn new_file(&self, table: Table, date: NaiveDate, schema: SchemaRef) -> Result<OpenFile> {
        let dir = self.layout.partition_dir(table, date);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let seq = self.file_seq.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "part-{}-{}-{seq:05}.parquet",
            self.options.writer_id, self.run_tag
        );
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let writer = ArrowWriter::try_new(
            file,
            schema,
            Some(writer_props(self.options.row_group_rows)),
        )?;
        Ok(OpenFile {
            writer,
            tmp,
            path,
            rows: 0,
        })
    }

    fn close_file(file: OpenFile) -> Result<()> {
        let f = file.writer.into_inner()?;
        f.sync_all().map_err(io_err(&file.tmp))?;
        fs::rename(&file.tmp, &file.path).map_err(io_err(&file.path))?;
        Ok(())
    }

    /// Appends validated samples: to the day's open Parquet file and to the rollups.
    pub fn append_samples(&self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mut local = RollupAccumulator::default();
        local.add(batch);
        for (date, part) in split_by_date(batch)? {
            let slot = Arc::clone(lock(&self.samples).entry(date).or_default());
            let mut slot = lock(&slot);
            if slot.is_none() {
                *slot = Some(self.new_file(Table::Samples, date, sample_schema())?);
            }
            let Some(open) = slot.as_mut() else { continue };
            open.writer.write(&part)?;
            open.rows += part.num_rows();
            if open.rows >= self.options.max_rows_per_file {
                if let Some(full) = slot.take() {
                    Self::close_file(full)?;
                    self.closed_sample_files.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        lock(&self.rollups).absorb(local);
        Ok(())
    }

    /// Writes job events, one file per UTC day they fall on.
    pub fn append_job_events(&self, events: &[JobEvent]) -> Result<()> {
        let mut by_date: HashMap<NaiveDate, Vec<JobEvent>> = HashMap::new();
        for e in events {
            by_date
                .entry(date_of_ms(e.time_ms))
                .or_default()
                .push(e.clone());
        }
        let mut dates: Vec<_> = by_date.into_iter().collect();
        dates.sort_by_key(|(d, _)| *d);
        for (date, events) in dates {
            let batch = job_events_to_batch(&events)?;
            let mut file = self.new_file(Table::Jobs, date, batch.schema())?;
            file.writer.write(&batch)?;
            Self::close_file(file)?;
        }
        Ok(())
    }

    /// Closes every open samples file and writes the accumulated rollups.
    pub fn flush(&self) -> Result<FlushStats> {
        let slots: Vec<_> = lock(&self.samples).drain().map(|(_, s)| s).collect();
        let mut stats = FlushStats {
            sample_files: self.closed_sample_files.swap(0, Ordering::Relaxed) as usize,
            ..FlushStats::default()
        };
        for slot in slots {
            if let Some(open) = lock(&slot).take() {
                Self::close_file(open)?;
                stats.sample_files += 1;
            }
        }
        let drained = lock(&self.rollups).drain_by_date()?;
        for (date, batch) in drained {
            stats.rollup_rows += batch.num_rows();
            let mut file = self.new_file(Table::RollupsHourly, date, rollup_schema())?;
            file.writer.write(&batch)?;
            Self::close_file(file)?;
            stats.rollup_files += 1;
        }
        Ok(stats)
    }
}

/// Splits a sample batch into one batch per UTC day of its `time` column.
fn split_by_date(batch: &RecordBatch) -> Result<Vec<(NaiveDate, RecordBatch)>> {
    let time = batch
        .column(0)
        .as_primitive_opt::<TimestampMillisecondType>()
        .ok_or_else(|| Error::Corrupt("time column is not a millisecond timestamp".into()))?;
    let day = |ms: i64| ms.div_euclid(MS_PER_DAY);
    let first = day(time.value(0));
    if time.values().iter().all(|t| day(*t) == first) {
        return Ok(vec![(date_of_ms(time.value(0)), batch.clone())]);
    }
    let mut days: Vec<i64> = time.values().iter().map(|t| day(*t)).collect();
    days.sort_unstable();
    days.dedup();
    days.into_iter()
        .map(|d| {
            let mask = BooleanArray::from_iter(time.values().iter().map(|t| Some(day(*t) == d)));
            Ok((
                date_of_ms(d * MS_PER_DAY),
                filter_record_batch(batch, &mask)?,
            ))
        })
        .collect()
}
