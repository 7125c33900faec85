//! The one ingest path: the HTTP endpoints and the demo both call [`Ingestor`]. A batch is
//! validated whole, de-duplicated on (source, sequence number), written to the write-ahead
//! log (when there is one) and applied to the store; it is acknowledged once the log is
//! fsync'd. [`Ingestor::flush`] persists the store to Parquet and checkpoints the log.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use gpuledger_model::job::{job_events_from_batch, job_events_to_batch, JobEvent};
use gpuledger_model::time::Clock;

use crate::store::{FlushStats, Store};
use crate::validate::{validate_samples, RowError, Rules};
use crate::wal::{sync_dir, RecordKind, Wal};
use crate::{io_err, Error, Result};

/// A batch to log and store, with the Arrow IPC stream it arrived as where it is unchanged.
#[derive(Clone, Copy)]
struct Record<'a> {
    batch: &'a RecordBatch,
    ipc: Option<&'a [u8]>,
}

impl Record<'_> {
    fn append_to(self, wal: &Wal, kind: RecordKind, source: &str, seq: u64) -> Result<u64> {
        match self.ipc {
            Some(ipc) => wal.append_ipc(kind, source, seq, ipc),
            None => wal.append(kind, source, seq, self.batch),
        }
    }
}

/// Ingest rules.
#[derive(Clone, Debug)]
pub struct IngestorConfig {
    /// Nodes allowed to push; empty allows any.
    pub known_nodes: HashSet<String>,
    /// How far ahead of the aggregator's clock a sample may start.
    pub future_tolerance_ms: i64,
    /// Raw samples older than this are refused (and later deleted).
    pub raw_retention_days: u32,
}

impl Default for IngestorConfig {
    fn default() -> Self {
        IngestorConfig {
            known_nodes: HashSet::new(),
            future_tolerance_ms: 5 * 60 * 1000,
            raw_retention_days: 90,
        }
    }
}

/// What happened to a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestOutcome {
    Accepted {
        rows: usize,
    },
    /// This (source, sequence) was already stored; nothing was written.
    Duplicate,
}

/// Sequence numbers stored from one node (all up to `contiguous`, and some above it) and
/// those being stored right now.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SeqWindow {
    contiguous: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    above: BTreeSet<u64>,
    #[serde(skip)]
    in_flight: BTreeSet<u64>,
}

impl SeqWindow {
    fn contains(&self, seq: u64) -> bool {
        self.contiguous.is_some_and(|c| seq <= c) || self.above.contains(&seq)
    }

    /// Claims `seq` for a write; false if it is stored or being stored.
    fn claim(&mut self, seq: u64) -> bool {
        !self.contains(seq) && self.in_flight.insert(seq)
    }

    /// Ends a claim: the batch was stored (`stored`) or refused.
    fn settle(&mut self, seq: u64, stored: bool) {
        self.in_flight.remove(&seq);
        if stored {
            self.insert(seq);
        }
    }

    /// The sender promises never to send a number below `low` again (each was acknowledged
    /// or dropped from its spool): the gap below closes, so a spool overflow does not leave
    /// every later number in `above` for good.
    fn advance_to(&mut self, low: u64) {
        let Some(floor) = low.checked_sub(1) else {
            return;
        };
        if self.contiguous.is_none_or(|c| c < floor) {
            self.contiguous = Some(floor);
        }
        self.above.retain(|s| *s > floor);
        self.extend_contiguous();
    }

    fn insert(&mut self, seq: u64) {
        self.above.insert(seq);
        self.extend_contiguous();
    }

    fn extend_contiguous(&mut self) {
        loop {
            let next = self.contiguous.map(|c| c + 1).unwrap_or(0);
            if self.above.remove(&next) {
                self.contiguous = Some(next);
            } else {
                break;
            }
        }
    }
}

type WindowKey = (RecordKind, String);

/// The log's checkpoint: the last segment persisted to Parquet and the sequence numbers
/// stored up to it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    through_segment: Option<u64>,
    samples: HashMap<String, SeqWindow>,
    job_events: HashMap<String, SeqWindow>,
}

/// What opening a durable ingestor found in its log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub replayed_batches: usize,
    pub replayed_rows: usize,
    pub truncated_bytes: u64,
    pub removed_files: usize,
}

/// Validates, de-duplicates, logs and stores batches.
pub struct Ingestor {
    store: Arc<Store>,
    config: IngestorConfig,
    clock: Arc<dyn Clock>,
    seen: Mutex<HashMap<WindowKey, SeqWindow>>,
    wal: Option<Wal>,
    /// Appends (log and store together) share it; a flush takes it alone for the instant it
    /// rotates the log and detaches the store, so both cut at the same record.
    gate: RwLock<()>,
    flushing: Mutex<()>,
    /// Set when the log and the store may disagree (a failed write after logging): from
    /// then on every batch is refused until a restart recovers from the log.
    failed: AtomicBool,
}

impl std::fmt::Debug for Ingestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingestor")
            .field("store", &self.store)
            .field("wal", &self.wal)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ingestor {
    /// An ingestor without a log, for batch jobs that can be re-run (the demo).
    pub fn new(store: Arc<Store>, config: IngestorConfig, clock: Arc<dyn Clock>) -> Self {
        Ingestor {
            store,
            config,
            clock,
            seen: Mutex::new(HashMap::new()),
            wal: None,
            gate: RwLock::new(()),
            flushing: Mutex::new(()),
            failed: AtomicBool::new(false),
        }
    }

    /// An ingestor with a write-ahead log under `<data dir>/wal/<writer id>`: removes files of a flush
    /// that did not finish, replays the log into the store, and flushes it.
    pub fn open_durable(
        store: Arc<Store>,
        config: IngestorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, RecoveryReport)> {
        // Each writer has its own log, so several aggregators can share one data directory.
        let wal_dir = store.layout().root().join("wal").join(store.writer_id());
        fs::create_dir_all(&wal_dir).map_err(io_err(&wal_dir))?;
        let checkpoint = read_checkpoint(&wal_dir.join(CHECKPOINT))?;
        let removed_files = store.remove_unchecked_files(checkpoint.through_segment)?;
        let (wal, recovered) = Wal::open(&wal_dir, checkpoint.through_segment)?;
        let mut seen: HashMap<WindowKey, SeqWindow> = HashMap::new();
        for (kind, windows) in [
            (RecordKind::Samples, checkpoint.samples),
            (RecordKind::JobEvents, checkpoint.job_events),
        ] {
            seen.extend(windows.into_iter().map(|(source, w)| ((kind, source), w)));
        }
        let mut report = RecoveryReport {
            truncated_bytes: recovered.truncated_bytes,
            removed_files,
            ..RecoveryReport::default()
        };
        for record in recovered.records {
            match record.kind {
                RecordKind::Samples => store.append_samples(&record.batch)?,
                RecordKind::JobEvents => {
                    let events = job_events_from_batch(&record.batch)
                        .map_err(|e| Error::Corrupt(format!("job events in the log: {e}")))?;
                    store.append_job_events(&events);
                }
            }
            report.replayed_batches += 1;
            report.replayed_rows += record.batch.num_rows();
            seen.entry((record.kind, record.source))
                .or_default()
                .insert(record.seq);
        }
        let ingestor = Ingestor {
            seen: Mutex::new(seen),
            wal: Some(wal),
            ..Ingestor::new(store, config, clock)
        };
        ingestor.flush()?;
        Ok((ingestor, report))
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn config(&self) -> &IngestorConfig {
        &self.config
    }

    /// The log, when this ingestor has one.
    pub fn wal(&self) -> Option<&Wal> {
        self.wal.as_ref()
    }

    /// Whether a failed write stopped ingest until restart.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Ingests one batch of samples pushed by `node` with sequence number `seq`.
    pub fn ingest_samples(
        &self,
        node: &str,
        seq: u64,
        batch: &RecordBatch,
    ) -> Result<IngestOutcome> {
        self.ingest_samples_from(node, seq, None, batch, None)
    }

    /// [`Ingestor::ingest_samples`] with the sender's low watermark (it will never send a
    /// number below `low` again, at most `seq`) and, where `batch` is exactly what it sent, the
    /// Arrow IPC stream it came as, which the log then keeps instead of encoding it again.
    pub fn ingest_samples_from(
        &self,
        node: &str,
        seq: u64,
        low: Option<u64>,
        batch: &RecordBatch,
        sent_ipc: Option<&[u8]>,
    ) -> Result<IngestOutcome> {
        let outcome = self.ingest_samples_once(node, seq, batch, sent_ipc)?;
        if let Some(low) = low {
            if let Some(window) = lock(&self.seen).get_mut(&(RecordKind::Samples, node.to_owned()))
            {
                window.advance_to(low.min(seq));
            }
        }
        Ok(outcome)
    }

    fn ingest_samples_once(
        &self,
        node: &str,
        seq: u64,
        batch: &RecordBatch,
        sent_ipc: Option<&[u8]>,
    ) -> Result<IngestOutcome> {
        let rules = Rules {
            node,
            known_nodes: &self.config.known_nodes,
            now_ms: self.clock.now_ms(),
            future_tolerance_ms: self.config.future_tolerance_ms,
            max_age_ms: i64::from(self.config.raw_retention_days) * 86_400_000,
        };
        let record = Record {
            batch,
            ipc: sent_ipc,
        };
        self.ingest(RecordKind::Samples, node, Some(seq), record, |batch| {
            validate_samples(batch, &rules)
                .map_err(|(errors, _total): (Vec<RowError>, usize)| Error::Invalid(errors))
        })
    }

    /// Ingests job lifecycle events sent by `source`; with a sequence number, a re-sent
    /// batch is recognised and stored once.
    pub fn ingest_job_events(
        &self,
        source: &str,
        seq: Option<u64>,
        events: &[JobEvent],
    ) -> Result<IngestOutcome> {
        if events.is_empty() {
            return Ok(IngestOutcome::Accepted { rows: 0 });
        }
        let batch = job_events_to_batch(events)?;
        let record = Record {
            batch: &batch,
            ipc: None,
        };
        self.ingest(RecordKind::JobEvents, source, seq, record, |_| Ok(()))
    }

    fn ingest(
        &self,
        kind: RecordKind,
        source: &str,
        seq: Option<u64>,
        record: Record<'_>,
        validate: impl FnOnce(&RecordBatch) -> Result<()>,
    ) -> Result<IngestOutcome> {
        let batch = record.batch;
        if self.has_failed() {
            return Err(Error::Unavailable(
                "an earlier write failed; restart the aggregator to recover from its log".into(),
            ));
        }
        let key = (kind, source.to_owned());
        if let Some(seq) = seq {
            // Claimed before the write so a concurrent re-send of the same batch is a duplicate.
            if !lock(&self.seen).entry(key.clone()).or_default().claim(seq) {
                // The first copy may still be on its way to disk; answer once it is there.
                if let Some(wal) = &self.wal {
                    wal.sync_all()?;
                }
                return Ok(IngestOutcome::Duplicate);
            }
        }
        let settle = |stored: bool| {
            if let (Some(seq), Some(window)) = (seq, lock(&self.seen).get_mut(&key)) {
                window.settle(seq, stored);
            }
        };
        if let Err(e) = validate(batch) {
            settle(false);
            return Err(e);
        }
        let position = {
            let _gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let position = match &self.wal {
                Some(wal) => match record.append_to(wal, kind, source, seq.unwrap_or(0)) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        settle(false);
                        return Err(e);
                    }
                },
                None => None,
            };
            if let Err(e) = self.apply(kind, batch) {
                self.fail(&e);
                return Err(e);
            }
            // Marked stored inside the gate, so a flush's checkpoint always lists the
            // sequence numbers of the records it trims from the log.
            settle(true);
            position
        };
        if let (Some(wal), Some(position)) = (&self.wal, position) {
            wal.sync(position).inspect_err(|e| self.fail(e))?;
        }
        Ok(IngestOutcome::Accepted {
            rows: batch.num_rows(),
        })
    }

    fn apply(&self, kind: RecordKind, batch: &RecordBatch) -> Result<()> {
        match kind {
            RecordKind::Samples => self.store.append_samples(batch),
            RecordKind::JobEvents => {
                let events = job_events_from_batch(batch)
                    .map_err(|e| Error::Corrupt(format!("job events: {e}")))?;
                self.store.append_job_events(&events);
                Ok(())
            }
        }
    }

    fn fail(&self, error: &Error) {
        tracing::error!(%error, "write failed; refusing batches until restart");
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Persists everything stored so far to Parquet; with a log, checkpoints and trims it.
    pub fn flush(&self) -> Result<FlushStats> {
        let _one_at_a_time = lock(&self.flushing);
        let (detached, segment, checkpoint) = {
            let _gate = self.gate.write().unwrap_or_else(|p| p.into_inner());
            let segment = self.wal.as_ref().map(Wal::rotate).transpose()?;
            let checkpoint = self.checkpoint(segment);
            (self.store.detach(segment), segment, checkpoint)
        };
        let stats = detached.write().inspect_err(|e| self.fail(e))?;
        if let (Some(wal), Some(segment)) = (&self.wal, segment) {
            write_checkpoint(&wal.dir().join(CHECKPOINT), &checkpoint)
                .inspect_err(|e| self.fail(e))?;
            wal.trim(segment)?;
        }
        Ok(stats)
    }

    /// Compacts small files (see [`Store::compact_all`]), never while a flush writes.
    pub fn compact(
        &self,
        today: chrono::NaiveDate,
        today_min_files: usize,
    ) -> Result<Vec<crate::store::CompactStats>> {
        let _no_flush_meanwhile = lock(&self.flushing);
        self.store.compact_all(today, today_min_files)
    }

    fn checkpoint(&self, through_segment: Option<u64>) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            through_segment,
            ..Checkpoint::default()
        };
        for ((kind, source), window) in lock(&self.seen).iter() {
            let target = match kind {
                RecordKind::Samples => &mut checkpoint.samples,
                RecordKind::JobEvents => &mut checkpoint.job_events,
            };
            target.insert(source.clone(), window.clone());
        }
        checkpoint
    }
}

const CHECKPOINT: &str = "checkpoint.json";

fn read_checkpoint(path: &std::path::Path) -> Result<Checkpoint> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::Corrupt(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn write_checkpoint(path: &std::path::Path, checkpoint: &Checkpoint) -> Result<()> {
    let tmp: PathBuf = path.with_extension("json.tmp");
    let bytes =
        serde_json::to_vec(checkpoint).map_err(|e| Error::Corrupt(format!("checkpoint: {e}")))?;
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, &bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    };
    write().map_err(io_err(path))?;
    sync_dir(path.parent().unwrap_or(std::path::Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_window_tracks_out_of_order_arrivals() {
        let mut w = SeqWindow::default();
        for s in [0, 1, 3, 2, 5] {
            assert!(w.claim(s));
            assert!(!w.claim(s), "in flight");
            w.settle(s, true);
        }
        assert!(w.claim(4));
        w.settle(4, false);
        assert!(!w.contains(4), "a refused batch may be sent again");
        assert_eq!(w.contiguous, Some(3));
        assert!(w.contains(2) && w.contains(5) && !w.contains(4));
    }

    #[test]
    fn a_low_watermark_closes_gaps_the_sender_gave_up() {
        let mut w = SeqWindow::default();
        for s in [0, 1, 5, 6, 9] {
            assert!(w.claim(s));
            w.settle(s, true);
        }
        assert_eq!(w.above.len(), 3);
        w.advance_to(6);
        assert_eq!(
            (w.contiguous, w.above.len()),
            (Some(6), 1),
            "5 and 6 folded in, 9 kept"
        );
        assert!(w.contains(3), "given up: never sent again");
        assert!(!w.contains(7) && !w.contains(8) && w.contains(9));
        w.advance_to(0);
        assert_eq!(w.contiguous, Some(6), "a watermark never moves back");
    }
}
