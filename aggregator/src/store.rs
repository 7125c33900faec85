//! Parquet writers for the data directory. A file is written under a temporary name and
//! renamed when complete, so a reader never sees half a file. Samples go to one open file per
//! UTC day until it reaches its row bound; rollups and job events are written on flush.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow::array::{AsArray, BooleanArray};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use chrono::NaiveDate;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use gpuledger_model::job::{job_events_to_batch, JobEvent};
use gpuledger_model::sample::{col, sample_schema};
use gpuledger_model::time::{date_of_ms, MS_PER_DAY};

use crate::layout::{Layout, Table};
use crate::objects::{Entry, Objects};
use crate::rollup::{rollup_schema, RollupAccumulator};
use crate::{io_err, Error, Result};

/// What a compaction merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactStats {
    pub inputs: usize,
    pub rows: usize,
}

const JOURNAL_PREFIX: &str = ".compaction-";

/// A compaction whose output may be in place: delete its inputs, then the journal.
#[derive(serde::Serialize, serde::Deserialize)]
struct CompactionJournal {
    output: String,
    inputs: Vec<String>,
}

/// Finishes the compaction a journal describes: when its output is in place the inputs are
/// deleted; when it is not, nothing was changed. Returns the files deleted.
fn finish_compaction(objects: &Objects, journal: &str) -> Result<usize> {
    let dir = parent_key(journal);
    let Some(bytes) = objects.get(journal)? else {
        return Ok(0);
    };
    let record: CompactionJournal =
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("{journal}: {e}")))?;
    let mut removed = 0;
    if objects.exists(&format!("{dir}/{}", record.output))? {
        for input in &record.inputs {
            if objects.delete(&format!("{dir}/{input}"))? {
                removed += 1;
            }
        }
        objects.sync_dir(dir)?;
    }
    objects.delete(journal)?;
    objects.sync_dir(dir)?;
    Ok(removed)
}

/// The directory part of a key.
fn parent_key(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// The file-name part of a key.
fn file_name(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// Marks a file name's log-segment tag.
const SEGMENT_TAG: &str = "s";

/// How the store writes.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Names this writer's files, so several aggregators can share a directory.
    pub writer_id: String,
    /// A samples file is closed and a new one opened past this many rows. `None` keeps files
    /// open until the next flush: with a write-ahead log, a file must not become visible
    /// before the checkpoint that trims its records from the log.
    pub max_rows_per_file: Option<usize>,
    pub row_group_rows: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            writer_id: "agg0".into(),
            max_rows_per_file: Some(8 << 20),
            row_group_rows: 1 << 20,
        }
    }
}

struct OpenFile {
    writer: ArrowWriter<File>,
    /// The partition's key.
    dir: String,
    seq: u64,
    tmp: PathBuf,
    rows: usize,
    /// Small batches waiting to be written as one: a write costs about the same for 80 rows
    /// as for thousands (every column's writer runs), and a node's push holds a few seconds.
    pending: Vec<RecordBatch>,
    pending_rows: usize,
}

/// Rows gathered before a write to an open file.
const COALESCE_ROWS: usize = 8192;

impl OpenFile {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.pending.is_empty() && batch.num_rows() >= COALESCE_ROWS {
            self.writer.write(batch)?;
            return Ok(());
        }
        self.pending.push(batch.clone());
        self.pending_rows += batch.num_rows();
        if self.pending_rows >= COALESCE_ROWS {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> Result<()> {
        let Some(first) = self.pending.first() else {
            return Ok(());
        };
        let batch = concat_batches(&first.schema(), &self.pending)?;
        self.pending.clear();
        self.pending_rows = 0;
        self.writer.write(&batch)?;
        Ok(())
    }
}

/// What a flush wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushStats {
    pub sample_files: usize,
    pub rollup_files: usize,
    pub rollup_rows: usize,
    pub job_event_files: usize,
}

/// The writer side of the data directory.
pub struct Store {
    layout: Layout,
    options: StoreOptions,
    run_tag: String,
    file_seq: AtomicU64,
    samples: Mutex<HashMap<NaiveDate, Arc<Mutex<Option<OpenFile>>>>>,
    rollups: Mutex<RollupAccumulator>,
    job_events: Mutex<Vec<JobEvent>>,
    closed_sample_files: AtomicU64,
    pending_rows: AtomicU64,
}

/// What a flush takes out of the store at one instant; written by [`Detached::write`].
#[must_use]
pub struct Detached<'a> {
    store: &'a Store,
    segment: Option<u64>,
    files: Vec<OpenFile>,
    closed_sample_files: usize,
    rollups: RollupAccumulator,
    job_events: Vec<JobEvent>,
}

impl std::fmt::Debug for Detached<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("files", &self.files.len())
            .field("job_events", &self.job_events.len())
            .finish()
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("tables", &self.layout.display())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sample columns that almost never repeat a value within a row group: a dictionary page for
/// them fills up and falls back to plain pages anyway, after interning every value (a fifth
/// of the aggregator's CPU under load), and readers then decode both kinds of page.
const PLAIN_SAMPLE_COLUMNS: [&str; 7] = [
    col::GPU_UTIL_PCT,
    col::SM_ACTIVE,
    col::TENSOR_ACTIVE,
    col::DRAM_ACTIVE,
    col::MEM_USED_BYTES,
    col::POWER_W,
    col::ENERGY_J,
];

fn writer_props(row_group_rows: usize) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_max_row_group_row_count(Some(row_group_rows));
    for column in PLAIN_SAMPLE_COLUMNS {
        props = props.set_column_dictionary_enabled(ColumnPath::from(column), false);
    }
    // Each GPU's times are a run of equal steps: deltas pack them into a few bits.
    props
        .set_column_dictionary_enabled(ColumnPath::from(col::TIME), false)
        .set_column_encoding(ColumnPath::from(col::TIME), Encoding::DELTA_BINARY_PACKED)
        .build()
}

impl Store {
    /// Opens (creating) a local data directory.
    pub fn open(root: impl Into<PathBuf>, options: StoreOptions) -> Result<Self> {
        let root = root.into();
        Self::open_at(Layout::with_tables(Objects::local(&root)?, root), options)
    }

    /// Opens a data directory whose tables may be in an object store.
    pub fn open_at(layout: Layout, options: StoreOptions) -> Result<Self> {
        std::fs::create_dir_all(layout.root()).map_err(io_err(layout.root()))?;
        if let Some(root) = layout.tables().local_root() {
            for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
                let dir = root.join(table.dir());
                std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            }
        }
        let run_tag = format!("{:x}", chrono::Utc::now().timestamp_millis());
        Ok(Store {
            layout,
            options,
            run_tag,
            file_seq: AtomicU64::new(0),
            samples: Mutex::new(HashMap::new()),
            rollups: Mutex::new(RollupAccumulator::default()),
            job_events: Mutex::new(Vec::new()),
            closed_sample_files: AtomicU64::new(0),
            pending_rows: AtomicU64::new(0),
        })
    }

    /// The name this store's files carry (`--writer-id`).
    pub fn writer_id(&self) -> &str {
        &self.options.writer_id
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn objects(&self) -> &Objects {
        self.layout.tables()
    }

    fn new_file(&self, table: Table, date: NaiveDate, schema: SchemaRef) -> Result<OpenFile> {
        let dir = Layout::partition_key(table, date);
        let seq = self.file_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.objects().staging_path(&format!(
            "{dir}/part-{}-{}-{seq:05}.parquet",
            self.options.writer_id, self.run_tag
        ))?;
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let writer = ArrowWriter::try_new(
            file,
            schema,
            Some(writer_props(self.options.row_group_rows)),
        )?;
        Ok(OpenFile {
            writer,
            dir,
            seq,
            tmp,
            rows: 0,
            pending: Vec::new(),
            pending_rows: 0,
        })
    }

    /// Finishes a file and renames it into place. `segment` names the last write-ahead-log
    /// segment whose rows it may hold, so recovery can tell files of an unfinished flush.
    fn close_file(&self, file: OpenFile, segment: Option<u64>) -> Result<()> {
        let name = self.final_name(&file, segment);
        self.close_file_as(file, &name)
    }

    /// `part-<writer>-s<segment>-<run>-<n>.parquet`, or without the segment for files written
    /// without a log. The run tag keeps names from two runs of the aggregator apart.
    fn final_name(&self, file: &OpenFile, segment: Option<u64>) -> String {
        let tag = match segment {
            Some(s) => format!("{SEGMENT_TAG}{s:020}-{}", self.run_tag),
            None => self.run_tag.clone(),
        };
        format!(
            "part-{}-{tag}-{:05}.parquet",
            self.options.writer_id, file.seq
        )
    }

    fn close_file_as(&self, mut file: OpenFile, name: &str) -> Result<()> {
        file.write_pending()?;
        drop(file.writer.into_inner()?);
        self.objects()
            .publish(&file.tmp, &format!("{}/{name}", file.dir))
    }

    /// The log segment a file of this writer was flushed for, if it was.
    fn file_segment(&self, name: &str) -> Option<u64> {
        let prefix = format!("part-{}-{SEGMENT_TAG}", self.options.writer_id);
        name.strip_prefix(&prefix)?.get(..20)?.parse().ok()
    }

    /// Deletes this writer's files flushed for log segments after `checkpointed` (all of them
    /// when nothing was checkpointed): a flush wrote them but died before its checkpoint, so
    /// their rows are still in the log and will be replayed.
    pub fn remove_unchecked_files(&self, checkpointed: Option<u64>) -> Result<usize> {
        let mut removed = 0;
        let own_tmp = format!(".part-{}-", self.options.writer_id);
        let own_journal = format!("{JOURNAL_PREFIX}part-{}-", self.options.writer_id);
        for entry in self.table_files()? {
            if file_name(&entry.key).starts_with(&own_journal) {
                removed += finish_compaction(self.objects(), &entry.key)?;
            }
        }
        for entry in self.table_files()? {
            let name = file_name(&entry.key);
            let unchecked = self
                .file_segment(name)
                .is_some_and(|s| checkpointed.is_none_or(|c| s > c));
            // Only this writer's: another aggregator may be writing its own right now.
            let temporary = name.starts_with(&own_tmp) && name.ends_with(".tmp");
            if (unchecked || temporary) && self.objects().delete(&entry.key)? {
                removed += 1;
            }
        }
        removed += self
            .objects()
            .remove_staged(&format!("part-{}-", self.options.writer_id))?;
        Ok(removed)
    }

    /// This writer's finished files of one partition, by key.
    fn partition_files(&self, dir: &str) -> Result<Vec<Entry>> {
        let prefix = format!("part-{}-", self.options.writer_id);
        Ok(self
            .objects()
            .list(dir)?
            .into_iter()
            .filter(|e| {
                parent_key(&e.key) == dir && {
                    let name = file_name(&e.key);
                    name.starts_with(&prefix) && name.ends_with(".parquet")
                }
            })
            .collect())
    }

    /// Merges this writer's files of one table partition into one when there are at least
    /// `min_files`. Crash-safe: a journal naming the output and the inputs is written before
    /// the output is renamed into place and removed after the inputs are deleted; recovery
    /// ([`Store::remove_unchecked_files`]) finishes or forgets a compaction it finds. Must not
    /// run while a flush writes (the ingestor holds its flush lock around it).
    pub fn compact_partition(
        &self,
        table: Table,
        date: NaiveDate,
        min_files: usize,
    ) -> Result<Option<CompactStats>> {
        let dir = Layout::partition_key(table, date);
        let inputs = self.partition_files(&dir)?;
        if inputs.len() < min_files.max(2) {
            return Ok(None);
        }
        let names: Vec<String> = inputs
            .iter()
            .map(|e| file_name(&e.key).to_owned())
            .collect();
        let segment = names.iter().filter_map(|n| self.file_segment(n)).max();
        let mut out: Option<OpenFile> = None;
        let mut rows = 0;
        for input in &inputs {
            let file = self.objects().reader(input)?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
            for batch in reader {
                let mut batch = batch?;
                if table == Table::RollupsHourly {
                    // Files of an older rollup schema join the current one.
                    batch = crate::rollup::to_current_schema(&batch)?;
                }
                if out.is_none() {
                    out = Some(self.new_file(table, date, batch.schema())?);
                }
                if let Some(out) = out.as_mut() {
                    out.write(&batch)?;
                }
                rows += batch.num_rows();
            }
        }
        let Some(out) = out else {
            return Ok(None);
        };
        let output = self.final_name(&out, segment);
        let journal = format!("{dir}/{JOURNAL_PREFIX}{output}.json");
        let record = serde_json::to_vec(&CompactionJournal {
            output: output.clone(),
            inputs: names.clone(),
        })
        .map_err(|e| Error::Corrupt(format!("compaction journal: {e}")))?;
        self.objects().put(&journal, record)?;
        self.close_file_as(out, &output)?;
        finish_compaction(self.objects(), &journal)?;
        Ok(Some(CompactStats {
            inputs: names.len(),
            rows,
        }))
    }

    /// Compacts every partition of every table: days before `today` down to one file per
    /// writer, `today` once it has `today_min_files`.
    pub fn compact_all(
        &self,
        today: NaiveDate,
        today_min_files: usize,
    ) -> Result<Vec<CompactStats>> {
        let mut done = Vec::new();
        for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
            for date in self.partitions(table)? {
                let min = if date < today { 2 } else { today_min_files };
                done.extend(self.compact_partition(table, date, min)?);
            }
        }
        Ok(done)
    }

    /// Every file of the three tables.
    fn table_files(&self) -> Result<Vec<Entry>> {
        let mut files = Vec::new();
        for table in [Table::Samples, Table::RollupsHourly, Table::Jobs] {
            files.extend(self.objects().list(table.dir())?);
        }
        Ok(files)
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
            open.write(&part)?;
            open.rows += part.num_rows();
            if self
                .options
                .max_rows_per_file
                .is_some_and(|max| open.rows >= max)
            {
                if let Some(full) = slot.take() {
                    self.close_file(full, None)?;
                    self.closed_sample_files.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        lock(&self.rollups).absorb(local);
        self.pending_rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sample rows appended since the last flush.
    pub fn pending_rows(&self) -> u64 {
        self.pending_rows.load(Ordering::Relaxed)
    }

    /// Buffers job events; the next flush writes them, one file per UTC day.
    pub fn append_job_events(&self, events: &[JobEvent]) {
        lock(&self.job_events).extend_from_slice(events);
    }

    /// Closes every open samples file, writes the accumulated rollups and job events.
    pub fn flush(&self) -> Result<FlushStats> {
        self.detach(None).write()
    }

    /// Takes out, at one instant, everything appended so far; appends after this go to new
    /// files. Cheap: the writing happens in [`Detached::write`].
    pub fn detach(&self, segment: Option<u64>) -> Detached<'_> {
        let slots: Vec<_> = lock(&self.samples).drain().map(|(_, s)| s).collect();
        let files = slots.iter().filter_map(|slot| lock(slot).take()).collect();
        self.pending_rows.store(0, Ordering::Relaxed);
        Detached {
            store: self,
            segment,
            files,
            closed_sample_files: self.closed_sample_files.swap(0, Ordering::Relaxed) as usize,
            rollups: std::mem::take(&mut *lock(&self.rollups)),
            job_events: std::mem::take(&mut *lock(&self.job_events)),
        }
    }

    fn write_job_events(&self, events: Vec<JobEvent>, segment: Option<u64>) -> Result<usize> {
        let mut by_date: HashMap<NaiveDate, Vec<JobEvent>> = HashMap::new();
        for e in events {
            by_date.entry(date_of_ms(e.time_ms)).or_default().push(e);
        }
        let mut dates: Vec<_> = by_date.into_iter().collect();
        dates.sort_by_key(|(d, _)| *d);
        let files = dates.len();
        for (date, events) in dates {
            let batch = job_events_to_batch(&events)?;
            let mut file = self.new_file(Table::Jobs, date, batch.schema())?;
            file.write(&batch)?;
            self.close_file(file, segment)?;
        }
        Ok(files)
    }

    /// The `date=` partitions of a table that hold a file.
    fn partitions(&self, table: Table) -> Result<Vec<NaiveDate>> {
        let mut dates: Vec<NaiveDate> = self
            .objects()
            .list(table.dir())?
            .iter()
            .filter_map(|e| {
                let rest = e.key.strip_prefix(table.dir())?.strip_prefix('/')?;
                let (part, _) = rest.split_once('/')?;
                NaiveDate::parse_from_str(part.strip_prefix("date=")?, "%Y-%m-%d").ok()
            })
            .collect();
        dates.dedup();
        Ok(dates)
    }

    /// Deletes raw-sample partitions of days before `keep_from` (rollups are kept). Returns
    /// the days deleted.
    pub fn apply_retention(&self, keep_from: NaiveDate) -> Result<Vec<NaiveDate>> {
        let mut deleted = Vec::new();
        for date in self.partitions(Table::Samples)? {
            if date < keep_from {
                self.objects()
                    .delete_dir(&Layout::partition_key(Table::Samples, date))?;
                deleted.push(date);
            }
        }
        Ok(deleted)
    }
}

impl Detached<'_> {
    /// Writes what was detached: closes the samples files (renaming them into place), writes
    /// rollups and job events, each file synced before its rename.
    pub fn write(self) -> Result<FlushStats> {
        let mut stats = FlushStats {
            sample_files: self.closed_sample_files,
            ..FlushStats::default()
        };
        for open in self.files {
            self.store.close_file(open, self.segment)?;
            stats.sample_files += 1;
        }
        let mut rollups = self.rollups;
        for (date, batch) in rollups.drain_by_date()? {
            stats.rollup_rows += batch.num_rows();
            let mut file = self
                .store
                .new_file(Table::RollupsHourly, date, rollup_schema())?;
            file.write(&batch)?;
            self.store.close_file(file, self.segment)?;
            stats.rollup_files += 1;
        }
        stats.job_event_files = self.store.write_job_events(self.job_events, self.segment)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};
    use std::path::Path;

    const T0: i64 = 1_780_272_000_000; // 2026-06-01T00:00:00Z

    fn batch(from: usize, rows: usize) -> RecordBatch {
        let mut b = SampleBatchBuilder::with_capacity(rows);
        for i in from..from + rows {
            b.push(&SampleRow {
                time_ms: T0 + i as i64 * 1000,
                interval_s: 1,
                node: "n1".into(),
                gpu_index: 0,
                gpu_uuid: "GPU-0".into(),
                gpu_model: "h100-sxm".into(),
                mig_instance: None,
                job_id: Some("1".into()),
                account: Some("a".into()),
                project: None,
                gpu_util_pct: Some(50.0),
                sm_active: None,
                tensor_active: None,
                dram_active: None,
                sm_clock_mhz: None,
                mem_used_bytes: None,
                mem_total_bytes: None,
                power_w: None,
                energy_j: None,
                xid: None,
            });
        }
        b.finish().unwrap()
    }

    fn rows_in(store: &Store, table: Table) -> (usize, usize) {
        let dir = Layout::partition_key(table, date_of_ms(T0));
        let files = store.partition_files(&dir).unwrap();
        let rows = files
            .iter()
            .map(|f| {
                ParquetRecordBatchReaderBuilder::try_new(store.objects().reader(f).unwrap())
                    .unwrap()
                    .build()
                    .unwrap()
                    .map(|b| b.unwrap().num_rows())
                    .sum::<usize>()
            })
            .sum();
        (files.len(), rows)
    }

    /// Both kinds of data directory: a path, and the same directory as a `file://` URL
    /// through `object_store` (the code a bucket runs).
    fn layouts(dir: &Path) -> Vec<Layout> {
        let tables = dir.join("tables");
        std::fs::create_dir_all(&tables).unwrap();
        let url = format!("file://{}", tables.canonicalize().unwrap().display());
        vec![
            Layout::new(dir.join("plain")),
            Layout::with_tables(
                Objects::remote(&url, dir.join("state/staging")).unwrap(),
                dir.join("state"),
            ),
        ]
    }

    fn three_flushes(layout: Layout) -> Store {
        let store = Store::open_at(
            layout,
            StoreOptions {
                max_rows_per_file: None,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        for (segment, from) in [(0, 0), (1, 100), (2, 200)] {
            store.append_samples(&batch(from, 100)).unwrap();
            store.detach(Some(segment)).write().unwrap();
        }
        store
    }

    #[test]
    fn compaction_merges_a_partition_into_one_file_with_the_same_rows() {
        let dir = tempfile::tempdir().unwrap();
        for layout in layouts(dir.path()) {
            let store = three_flushes(layout);
            assert_eq!(rows_in(&store, Table::Samples), (3, 300));
            let stats = store
                .compact_partition(Table::Samples, date_of_ms(T0), 2)
                .unwrap()
                .unwrap();
            assert_eq!(
                stats,
                CompactStats {
                    inputs: 3,
                    rows: 300
                }
            );
            assert_eq!(rows_in(&store, Table::Samples), (1, 300));
            assert_eq!(
                store.remove_unchecked_files(Some(2)).unwrap(),
                0,
                "the output keeps a checkpointed segment tag"
            );
            assert_eq!(rows_in(&store, Table::Samples), (1, 300));
        }
    }

    #[test]
    fn retention_deletes_raw_days_before_the_bound_and_keeps_rollups() {
        let dir = tempfile::tempdir().unwrap();
        for layout in layouts(dir.path()) {
            let store = three_flushes(layout);
            let day = date_of_ms(T0);
            assert!(store.apply_retention(day).unwrap().is_empty());
            assert_eq!(rows_in(&store, Table::Samples), (3, 300));
            let next = day.succ_opt().unwrap();
            assert_eq!(store.apply_retention(next).unwrap(), vec![day]);
            assert_eq!(rows_in(&store, Table::Samples), (0, 0));
            assert_eq!(
                rows_in(&store, Table::RollupsHourly).0,
                3,
                "rollups are kept"
            );
        }
    }

    #[test]
    fn files_of_an_unfinished_flush_and_staged_leftovers_are_removed_on_recovery() {
        let dir = tempfile::tempdir().unwrap();
        for layout in layouts(dir.path()) {
            let store = three_flushes(layout);
            // A crash while writing: a staging file of this writer is left behind.
            let staged = store
                .objects()
                .staging_path("samples/date=2026-06-01/part-agg0-x-00099.parquet")
                .unwrap();
            std::fs::write(&staged, b"half a file").unwrap();
            // Segment 2 was never checkpointed: its files go, their rows are in the log.
            assert_eq!(store.remove_unchecked_files(Some(1)).unwrap(), 3);
            assert!(!staged.exists());
            assert_eq!(rows_in(&store, Table::Samples), (2, 200));
            assert_eq!(rows_in(&store, Table::RollupsHourly).0, 2);
        }
    }

    #[test]
    fn a_compaction_cut_short_is_finished_or_forgotten_on_recovery() {
        for output_in_place in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            for layout in layouts(dir.path()) {
                let store = three_flushes(layout);
                let objects = store.objects().clone();
                let part = Layout::partition_key(Table::Samples, date_of_ms(T0));
                let inputs = store.partition_files(&part).unwrap();
                let saved: Vec<(String, Vec<u8>)> = inputs
                    .iter()
                    .map(|e| (e.key.clone(), objects.get(&e.key).unwrap().unwrap()))
                    .collect();
                store
                    .compact_partition(Table::Samples, date_of_ms(T0), 2)
                    .unwrap();
                let output = store.partition_files(&part).unwrap().remove(0);
                // The crash: inputs still there, journal still there.
                for (key, bytes) in &saved {
                    objects.put(key, bytes.clone()).unwrap();
                }
                let journal = CompactionJournal {
                    output: file_name(&output.key).to_owned(),
                    inputs: saved.iter().map(|(k, _)| file_name(k).to_owned()).collect(),
                };
                let journal_key = format!("{part}/{JOURNAL_PREFIX}{}.json", journal.output);
                objects
                    .put(&journal_key, serde_json::to_vec(&journal).unwrap())
                    .unwrap();
                if !output_in_place {
                    objects.delete(&output.key).unwrap();
                }
                store.remove_unchecked_files(Some(2)).unwrap();
                let expected_files = if output_in_place { 1 } else { 3 };
                assert_eq!(rows_in(&store, Table::Samples), (expected_files, 300));
                assert!(!objects.exists(&journal_key).unwrap());
            }
        }
    }
}
