//! The write-ahead log: an acknowledged batch is in this log, fsync'd, before the answer goes
//! out. The log is a run of segment files; a flush rotates to a new segment, persists what the
//! older ones hold to Parquet, writes a checkpoint naming the last segment it covers, and only
//! then deletes those segments. Recovery replays the segments after the checkpoint.
//!
//! A record is `[len u32][crc32 u32][payload]`, little-endian; the payload is
//! `[kind u8][seq u64][source len u16][source][Arrow IPC stream]`.
//!
//! A full disk must not cost an acknowledged record: an append that fails part-way (ENOSPC)
//! is cut back off the segment before the error is returned, so the next record follows the
//! last whole one (where the cut itself fails, the log moves on to a new segment). On recovery
//! a torn tail, of any segment (a crash mid-write, never acknowledged), is set aside under
//! `torn/` with a report and cut off; it never stops a start.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use arrow::record_batch::RecordBatch;

use crate::{io_err, Error, Result};

const HEADER: usize = 8;
/// A record larger than this is corrupt (the HTTP body limit is far below it).
const MAX_RECORD: usize = 1 << 30;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    Samples = 1,
    JobEvents = 2,
}

impl RecordKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(RecordKind::Samples),
            2 => Some(RecordKind::JobEvents),
            _ => None,
        }
    }
}

/// One logged batch.
#[derive(Clone, Debug)]
pub struct WalRecord {
    pub kind: RecordKind,
    /// The pushing node (samples) or event source (job events).
    pub source: String,
    pub seq: u64,
    pub batch: RecordBatch,
}

pub use gpuledger_model::wire::{decode_ipc, encode_ipc};

fn encode_record(kind: RecordKind, source: &str, seq: u64, ipc: &[u8]) -> Result<Vec<u8>> {
    let source_len = u16::try_from(source.len())
        .map_err(|_| Error::Corrupt(format!("source name of {} bytes", source.len())))?;
    let payload_len = 1 + 8 + 2 + source.len() + ipc.len();
    let mut out = Vec::with_capacity(HEADER + payload_len);
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]); // the payload's CRC, below
    out.push(kind as u8);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&source_len.to_le_bytes());
    out.extend_from_slice(source.as_bytes());
    out.extend_from_slice(ipc);
    let crc = crc32fast::hash(&out[HEADER..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// A record as it lies in a segment: kind, source, sequence number, Arrow IPC bytes.
type RawRecord<'a> = (RecordKind, String, u64, &'a [u8]);

/// Parses the records of a segment; returns them and the length of the valid prefix.
fn parse_segment(bytes: &[u8]) -> (Vec<RawRecord<'_>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap_or_default());
        if len > MAX_RECORD || bytes.len() - at - HEADER < len {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if crc32fast::hash(payload) != crc || payload.len() < 11 {
            break;
        }
        let Some(kind) = RecordKind::from_u8(payload[0]) else {
            break;
        };
        let seq = u64::from_le_bytes(payload[1..9].try_into().unwrap_or_default());
        let source_len = u16::from_le_bytes([payload[9], payload[10]]) as usize;
        if payload.len() < 11 + source_len {
            break;
        }
        let Ok(source) = std::str::from_utf8(&payload[11..11 + source_len]) else {
            break;
        };
        out.push((kind, source.to_owned(), seq, &payload[11 + source_len..]));
        at += HEADER + len;
    }
    (out, at)
}

struct Active {
    id: u64,
    file: File,
    written: u64,
    /// Set when a failed append could not be cut back: nothing more goes into this segment.
    torn: bool,
}

/// The log of one aggregator.
pub struct Wal {
    dir: PathBuf,
    active: Mutex<Active>,
    /// Bytes known to be on disk, counted over the aggregator's life; a sync covers all
    /// bytes written before it started.
    synced: Mutex<u64>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("dir", &self.dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn segment_name(id: u64) -> String {
    format!("{id:020}.wal")
}

/// Segment ids in `dir`, ascending.
fn segment_ids(dir: &Path) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(id) = name.strip_suffix(".wal").and_then(|s| s.parse().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Makes a rename or a new file in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovered {
    pub records: Vec<WalRecord>,
    /// Bytes of torn records cut off the ends of segments (set aside under `torn/`).
    pub truncated_bytes: u64,
    /// Each torn tail: the segment, the byte it starts at, and where its bytes were put.
    pub set_aside: Vec<TornTail>,
}

/// A torn tail found on recovery and set aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub segment: u64,
    pub offset: u64,
    pub bytes: u64,
    /// The copy of its bytes, when it could be written.
    pub copy: Option<PathBuf>,
}

/// Copies a torn tail to `dir/torn/` (best effort: the report stands without it).
fn set_aside(dir: &Path, id: u64, offset: usize, tail: &[u8]) -> Option<PathBuf> {
    let torn = dir.join("torn");
    let path = torn.join(format!("{}.{offset}.torn", segment_name(id)));
    let written = fs::create_dir_all(&torn)
        .and_then(|()| fs::write(&path, tail))
        .and_then(|()| File::open(&path)?.sync_all());
    match written {
        Ok(()) => Some(path),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "could not keep a copy of a torn record");
            None
        }
    }
}

impl Wal {
    /// Opens the log in `dir`, returning the records of the segments after
    /// `checkpointed_through` (earlier ones are deleted), and starts a fresh segment.
    pub fn open(
        dir: impl Into<PathBuf>,
        checkpointed_through: Option<u64>,
    ) -> Result<(Self, Recovered)> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let ids = segment_ids(&dir)?;
        let mut recovered = Recovered::default();
        for (i, &id) in ids.iter().enumerate() {
            let path = dir.join(segment_name(id));
            if checkpointed_through.is_some_and(|c| id <= c) {
                fs::remove_file(&path).map_err(io_err(&path))?;
                continue;
            }
            let mut bytes = Vec::new();
            File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io_err(&path))?;
            let (records, valid) = parse_segment(&bytes);
            if valid < bytes.len() {
                let cut = (bytes.len() - valid) as u64;
                let copy = set_aside(&dir, id, valid, &bytes[valid..]);
                tracing::warn!(
                    path = %path.display(),
                    last_segment = i + 1 == ids.len(),
                    valid_bytes = valid,
                    cut_bytes = cut,
                    copy = ?copy,
                    "a torn record set aside and cut off the log"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                f.set_len(valid as u64)
                    .and_then(|()| f.sync_all())
                    .map_err(io_err(&path))?;
                recovered.truncated_bytes += cut;
                recovered.set_aside.push(TornTail {
                    segment: id,
                    offset: valid as u64,
                    bytes: cut,
                    copy,
                });
            }
            for (kind, source, seq, ipc) in records {
                recovered.records.push(WalRecord {
                    kind,
                    source,
                    seq,
                    batch: decode_ipc(ipc)?,
                });
            }
        }
        let next = ids
            .last()
            .map_or(0, |l| l + 1)
            .max(checkpointed_through.map_or(0, |c| c + 1));
        let file = Self::create_segment(&dir, next)?;
        let wal = Wal {
            dir,
            active: Mutex::new(Active {
                id: next,
                file,
                written: 0,
                torn: false,
            }),
            synced: Mutex::new(0),
        };
        Ok((wal, recovered))
    }

    fn create_segment(dir: &Path, id: u64) -> Result<File> {
        let path = dir.join(segment_name(id));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        sync_dir(dir)?;
        Ok(file)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a record (not yet durable); returns the log position to [`Wal::sync`] to.
    pub fn append(
        &self,
        kind: RecordKind,
        source: &str,
        seq: u64,
        batch: &RecordBatch,
    ) -> Result<u64> {
        self.append_ipc(kind, source, seq, &encode_ipc(batch)?)
    }

    /// [`Wal::append`] of a batch already encoded as an Arrow IPC stream (the request body it
    /// was decoded from, which replay decodes the same way), so it is not encoded again.
    pub fn append_ipc(&self, kind: RecordKind, source: &str, seq: u64, ipc: &[u8]) -> Result<u64> {
        let record = encode_record(kind, source, seq, ipc)?;
        let mut active = lock(&self.active);
        if active.torn {
            self.move_on(&mut active)?;
        }
        let path = self.dir.join(segment_name(active.id));
        if let Err(error) = active.file.write_all(&record) {
            self.cut_back(&mut active);
            return Err(io_err(&path)(error));
        }
        active.written += record.len() as u64;
        Ok(self.position(&active))
    }

    /// After a failed append: the segment back to its last whole record, so that what is
    /// appended next (and acknowledged) follows it. Where the cut fails the segment is marked
    /// torn and the next append starts a new one; recovery sets the tail aside.
    fn cut_back(&self, active: &mut Active) {
        let path = self.dir.join(segment_name(active.id));
        match active.file.set_len(active.written) {
            Ok(()) => {
                tracing::warn!(path = %path.display(), at = active.written, "a failed append cut back off the log")
            }
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "a failed append could not be cut back; the next record goes to a new segment");
                active.torn = true;
            }
        }
    }

    /// Leaves a torn segment for a new one. Its whole records were written before the tear and
    /// are synced by the next [`Wal::sync`] as usual (`sync` syncs the old file first).
    fn move_on(&self, active: &mut Active) -> Result<()> {
        let old = self.dir.join(segment_name(active.id));
        active.file.sync_data().map_err(io_err(&old))?;
        let next = active.id + 1;
        active.file = Self::create_segment(&self.dir, next)?;
        active.id = next;
        active.written = 0;
        active.torn = false;
        Ok(())
    }

    fn position(&self, active: &Active) -> u64 {
        // Positions grow across segments: the segment id in the high bits.
        (active.id << 40) | active.written
    }

    /// Makes everything up to `position` durable. Concurrent callers share one fsync
    /// (group commit): whoever syncs covers all that was written before it started. Locks
    /// `synced`, then `active`, as [`Wal::rotate`] does.
    pub fn sync(&self, position: u64) -> Result<()> {
        let mut synced = lock(&self.synced);
        if *synced >= position {
            return Ok(());
        }
        let (file, upto, id) = {
            let active = lock(&self.active);
            let file = active.file.try_clone();
            (file, self.position(&active), active.id)
        };
        let path = self.dir.join(segment_name(id));
        file.and_then(|f| f.sync_data()).map_err(io_err(&path))?;
        *synced = upto;
        Ok(())
    }

    /// Makes everything written so far durable.
    pub fn sync_all(&self) -> Result<()> {
        let upto = self.position(&lock(&self.active));
        self.sync(upto)
    }

    /// Starts a new segment; returns the id of the one closed, which holds (with those before
    /// it) every record appended so far.
    pub fn rotate(&self) -> Result<u64> {
        // The same order as `sync`: `synced`, then `active`. The other order deadlocks with a
        // push waiting in `sync` (found by the soak).
        let mut synced = lock(&self.synced);
        let mut active = lock(&self.active);
        let closed = active.id;
        let path = self.dir.join(segment_name(closed));
        active.file.sync_data().map_err(io_err(&path))?;
        let next = closed + 1;
        active.file = Self::create_segment(&self.dir, next)?;
        active.id = next;
        active.written = 0;
        active.torn = false;
        *synced = next << 40;
        Ok(closed)
    }

    /// Deletes the segments up to and including `through` (their data is in Parquet).
    pub fn trim(&self, through: u64) -> Result<()> {
        for id in segment_ids(&self.dir)? {
            if id <= through {
                let path = self.dir.join(segment_name(id));
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        sync_dir(&self.dir)
    }

    /// Bytes in the log's segments now.
    pub fn size_bytes(&self) -> u64 {
        segment_ids(&self.dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|id| fs::metadata(self.dir.join(segment_name(id))).ok())
            .map(|m| m.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::job::{job_events_to_batch, JobEvent, JobEventKind};

    fn events_batch(n: usize) -> RecordBatch {
        let events: Vec<JobEvent> = (0..n)
            .map(|i| {
                JobEvent::new(
                    i as i64 * 1000,
                    format!("j{i}").parse().unwrap(),
                    "team-a".parse().unwrap(),
                    None,
                    JobEventKind::Submitted,
                )
            })
            .collect();
        job_events_to_batch(&events).unwrap()
    }

    /// Found by the 30-minute soak (docs/benchmarks.md): a flush's rotate and a push's group
    /// commit took the log's two locks in opposite orders and stopped every ingest for good.
    /// Pushes sync while a flusher rotates; all must finish (a deadlock fails at the deadline
    /// instead of hanging the suite).
    #[test]
    fn rotating_while_pushes_commit_never_deadlocks() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None).unwrap();
        let wal = std::sync::Arc::new(wal);
        let batch = events_batch(1);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for pusher in 0..4u64 {
            let (wal, batch, done) = (std::sync::Arc::clone(&wal), batch.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for seq in 0..300 {
                    let source = format!("node{pusher}");
                    let pos = wal
                        .append(RecordKind::Samples, &source, seq, &batch)
                        .unwrap();
                    wal.sync(pos).unwrap();
                }
                done.send("pusher").unwrap();
            });
        }
        {
            let (wal, done) = (std::sync::Arc::clone(&wal), done_tx.clone());
            std::thread::spawn(move || {
                for _ in 0..100 {
                    wal.rotate().unwrap();
                }
                done.send("flusher").unwrap();
            });
        }
        drop(done_tx);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for _ in 0..5 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            done_rx
                .recv_timeout(left)
                .expect("a push or the flusher never finished: the log deadlocked");
        }
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, rec) = Wal::open(dir.path(), None).unwrap();
        assert!(rec.records.is_empty());
        for seq in 0..3 {
            let pos = wal
                .append(RecordKind::JobEvents, "sched", seq, &events_batch(2))
                .unwrap();
            wal.sync(pos).unwrap();
        }
        let active = dir.path().join(segment_name(0));
        drop(wal);
        // A crash in the middle of a fourth record.
        let mut f = OpenOptions::new().append(true).open(&active).unwrap();
        f.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
        drop(f);
        let (_wal, rec) = Wal::open(dir.path(), None).unwrap();
        assert_eq!(rec.records.len(), 3);
        assert_eq!(rec.truncated_bytes, 7);
        assert_eq!(
            rec.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(rec.records[2].batch, events_batch(2));
    }

    #[test]
    fn checkpointed_segments_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None).unwrap();
        wal.append(RecordKind::JobEvents, "s", 0, &events_batch(1))
            .unwrap();
        let closed = wal.rotate().unwrap();
        let pos = wal
            .append(RecordKind::JobEvents, "s", 1, &events_batch(1))
            .unwrap();
        wal.sync(pos).unwrap();
        drop(wal);
        let (_wal, rec) = Wal::open(dir.path(), Some(closed)).unwrap();
        assert_eq!(
            rec.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1]
        );
        assert!(!dir.path().join(segment_name(closed)).exists());
    }

    #[test]
    fn a_flipped_bit_stops_replay_there() {
        let payload = encode_record(RecordKind::Samples, "n1", 7, b"xyz").unwrap();
        let mut bytes = payload.clone();
        bytes.extend_from_slice(&payload);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let (records, valid) = parse_segment(&bytes);
        assert_eq!(records.len(), 1);
        assert_eq!(valid, payload.len());
    }

    #[test]
    fn a_torn_tail_in_a_segment_that_is_not_the_last_is_set_aside_and_the_rest_replays() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), None).unwrap();
        let pos = wal
            .append(RecordKind::JobEvents, "s", 0, &events_batch(1))
            .unwrap();
        wal.sync(pos).unwrap();
        let closed = wal.rotate().unwrap();
        let pos = wal
            .append(RecordKind::JobEvents, "s", 1, &events_batch(1))
            .unwrap();
        wal.sync(pos).unwrap();
        drop(wal);
        // The older segment ends in half a record.
        let older = dir.path().join(segment_name(closed));
        let mut f = OpenOptions::new().append(true).open(&older).unwrap();
        f.write_all(&[90, 0, 0, 0, 9, 9]).unwrap();
        drop(f);
        let (_wal, rec) = Wal::open(dir.path(), None).unwrap();
        assert_eq!(
            rec.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(rec.set_aside.len(), 1);
        let torn = &rec.set_aside[0];
        assert_eq!((torn.segment, torn.bytes), (closed, 6));
        let copy = torn.copy.as_ref().expect("a copy of the torn bytes");
        assert_eq!(fs::read(copy).unwrap(), [90, 0, 0, 0, 9, 9]);
        assert_eq!(
            fs::metadata(&older).unwrap().len(),
            torn.offset,
            "the segment is cut back to its whole records"
        );
    }

    use gpuledger_testkit::Tmpfs;

    #[test]
    fn appends_that_hit_a_full_disk_leave_no_partial_record_behind_the_next_ones() {
        let disk = Tmpfs::mount("256k");
        let dir = disk.path().join("wal");
        let (wal, _) = Wal::open(&dir, None).unwrap();
        // Most of the disk taken by something else, freed later.
        let filler = disk.path().join("filler");
        fs::write(&filler, vec![0u8; 200 << 10]).unwrap();
        let batch = events_batch(40);
        let mut acknowledged = Vec::new();
        let mut refused = 0;
        for seq in 0..200u64 {
            let written = wal
                .append(RecordKind::JobEvents, "s", seq, &batch)
                .and_then(|pos| wal.sync(pos));
            match written {
                Ok(()) => acknowledged.push(seq),
                Err(_) => refused += 1,
            }
            if seq == 100 {
                fs::remove_file(&filler).unwrap();
            }
        }
        assert!(refused > 0, "the disk filled up");
        assert!(
            acknowledged.iter().any(|&s| s > 100),
            "records were acknowledged again once space returned"
        );
        drop(wal);
        let (_wal, rec) = Wal::open(&dir, None).unwrap();
        let replayed: Vec<u64> = rec.records.iter().map(|r| r.seq).collect();
        assert_eq!(
            replayed, acknowledged,
            "every acknowledged record replays, nothing else"
        );
        assert!(rec.set_aside.is_empty(), "{:?}", rec.set_aside);
    }
}
