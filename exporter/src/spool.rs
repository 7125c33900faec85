//! The on-disk outbox of sample batches. Every batch is written here (fsync'd) before it is
//! pushed and deleted once the aggregator acknowledged it, so a batch survives both an
//! unreachable aggregator and a `kill -9` of the exporter. Batches are files named by their
//! sequence number, replayed oldest first. The spool is bounded: past the bound the oldest
//! batches are dropped, counted and logged loudly. The next sequence number is kept in a
//! file of its own, so it survives a restart even with an empty spool.
//!
//! A spool takes a random epoch when it is created (file `epoch`) and sends it with every
//! batch: the aggregator knows a batch by (node, epoch, sequence number), so a node reimaged
//! with a fresh spool, numbering from 0 again, is a new sender instead of a run of
//! duplicates.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Spool errors.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spool state {path} is not a sequence number: {text:?}")]
    BadState { path: PathBuf, text: String },
    #[error("spool epoch {path}: {message}")]
    BadEpoch { path: PathBuf, message: String },
}

pub type Result<T, E = SpoolError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// How many refused batches `rejected/` keeps, the newest.
pub const KEEP_REJECTED: usize = 1000;
const ANSWER_SUFFIX: &str = ".answer.json";

const NEXT_SEQ: &str = "next-seq";
const EPOCH: &str = "epoch";
const SUFFIX: &str = ".arrows";

/// The spool directory.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    epoch: String,
    next_seq: u64,
    /// Sequence numbers and sizes of the spooled batches, oldest first.
    queued: std::collections::VecDeque<(u64, u64)>,
    dropped: u64,
    lost: u64,
}

impl SpoolError {
    /// The disk (or the quota) is full: dropping older batches makes room.
    pub fn is_disk_full(&self) -> bool {
        match self {
            SpoolError::Io { source, .. } => {
                source.kind() == std::io::ErrorKind::StorageFull
                    || source.kind() == std::io::ErrorKind::QuotaExceeded
                    // ENOSPC, EDQUOT on Linux
                    || matches!(source.raw_os_error(), Some(28 | 122))
            }
            SpoolError::BadState { .. } | SpoolError::BadEpoch { .. } => false,
        }
    }
}

fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        // Half a file helps nobody and holds space a retry needs.
        let _ = fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

impl Spool {
    /// Opens (creating) the spool in `dir`, bounded to `max_bytes` of batches.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut queued = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                // A batch half-written when the exporter died: never pushed, never acknowledged.
                fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
            } else if let Some(seq) = name.strip_suffix(SUFFIX).and_then(|s| s.parse().ok()) {
                let size = entry.metadata().map_err(io(&entry.path()))?.len();
                queued.push((seq, size));
            }
        }
        queued.sort_unstable();
        let state = dir.join(NEXT_SEQ);
        let stored = match fs::read_to_string(&state) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|_| SpoolError::BadState {
                    path: state.clone(),
                    text,
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io(&state)(e)),
        };
        let after_queued = queued.last().map_or(0, |(s, _)| s + 1);
        let epoch = read_or_make_epoch(&dir)?;
        Ok(Spool {
            dir,
            max_bytes,
            epoch,
            next_seq: stored.max(after_queued),
            queued: queued.into(),
            dropped: 0,
            lost: 0,
        })
    }

    /// Spools a batch (Arrow IPC stream bytes) under the next sequence number, durably;
    /// returns that number. Drops the oldest batches when the bound is passed, and when the
    /// disk is full (the newest data is what is kept); a batch that cannot be written even
    /// with nothing older left is lost and counted ([`Self::lost`]).
    pub fn push(&mut self, ipc: &[u8]) -> Result<u64> {
        let seq = loop {
            match self.write_next(ipc) {
                Ok(seq) => break seq,
                Err(e) if e.is_disk_full() && !self.queued.is_empty() => {
                    let Some((old, size)) = self.queued.front().copied() else {
                        continue;
                    };
                    self.remove(old)?;
                    self.dropped += 1;
                    tracing::error!(
                        seq = old,
                        bytes = size,
                        error = %e,
                        "spool disk full: dropped the oldest batch to keep the newest; those samples are lost"
                    );
                }
                Err(e) => {
                    self.lost += 1;
                    return Err(e);
                }
            }
        };
        self.queued.push_back((seq, ipc.len() as u64));
        while self.bytes() > self.max_bytes && self.queued.len() > 1 {
            let Some((old, size)) = self.queued.front().copied() else {
                break;
            };
            self.remove(old)?;
            self.dropped += 1;
            tracing::error!(
                seq = old,
                bytes = size,
                spool_max_bytes = self.max_bytes,
                "spool full: dropped the oldest batch; these samples are lost"
            );
        }
        Ok(seq)
    }

    /// Writes the batch under the next number. The number is taken first and never given
    /// again, even when the batch itself fails to write (the aggregator closes such gaps).
    fn write_next(&mut self, ipc: &[u8]) -> Result<u64> {
        let seq = self.next_seq;
        write_durably(&self.dir, NEXT_SEQ, (seq + 1).to_string().as_bytes())?;
        self.next_seq = seq + 1;
        write_durably(&self.dir, &Self::name(seq), ipc)?;
        Ok(seq)
    }

    fn name(seq: u64) -> String {
        format!("{seq:020}{SUFFIX}")
    }

    /// The oldest spooled batch: its sequence number and bytes.
    pub fn oldest(&self) -> Result<Option<(u64, Vec<u8>)>> {
        let Some((seq, _)) = self.queued.front().copied() else {
            return Ok(None);
        };
        let path = self.dir.join(Self::name(seq));
        let bytes = fs::read(&path).map_err(io(&path))?;
        Ok(Some((seq, bytes)))
    }

    /// Deletes a batch (acknowledged, or dropped).
    pub fn remove(&mut self, seq: u64) -> Result<()> {
        let path = self.dir.join(Self::name(seq));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
        self.queued.retain(|(s, _)| *s != seq);
        Ok(())
    }

    /// Moves a batch the aggregator refused for good aside (`rejected/`), for an operator, with
    /// the aggregator's answer beside it (`<seq>.answer.json`: the rows refused and why, and how
    /// many of the batch's other rows were stored). The newest [`KEEP_REJECTED`] batches are
    /// kept: a GPU whose every reading is refused must not fill the node's disk with them.
    pub fn reject(&mut self, seq: u64, answer: &str) -> Result<()> {
        let rejected = self.dir.join("rejected");
        fs::create_dir_all(&rejected).map_err(io(&rejected))?;
        let told = rejected.join(format!("{seq:020}{ANSWER_SUFFIX}"));
        fs::write(&told, answer).map_err(io(&told))?;
        let from = self.dir.join(Self::name(seq));
        let to = rejected.join(Self::name(seq));
        fs::rename(&from, &to).map_err(io(&to))?;
        self.queued.retain(|(s, _)| *s != seq);
        prune_rejected(&rejected, KEEP_REJECTED)
    }

    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Bytes of spooled batches.
    pub fn bytes(&self) -> u64 {
        self.queued.iter().map(|(_, b)| b).sum()
    }

    /// Batches dropped because the spool was full (its bound or its disk), since it was
    /// opened.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Batches that could not be spooled at all (the disk full with nothing older to drop,
    /// or another write error), since it was opened.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The epoch this spool took when it was created.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }
}

/// The spool's epoch: read from its file, or 16 random hex digits written durably when the
/// spool has none (a new spool, or one from before epochs).
fn read_or_make_epoch(dir: &Path) -> Result<String> {
    let path = dir.join(EPOCH);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let epoch = text.trim().to_owned();
            gpuledger_model::wire::check_epoch(&epoch).map_err(|message| SpoolError::BadEpoch {
                path: path.clone(),
                message: format!("{epoch:?} {message}"),
            })?;
            Ok(epoch)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes).map_err(|e| SpoolError::BadEpoch {
                path: path.clone(),
                message: format!("no random source for a new epoch: {e}"),
            })?;
            let epoch: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_durably(dir, EPOCH, epoch.as_bytes())?;
            Ok(epoch)
        }
        Err(e) => Err(io(&path)(e)),
    }
}

/// Removes from `rejected/` all but the newest `keep` batches (and their answers).
fn prune_rejected(dir: &Path, keep: usize) -> Result<()> {
    let mut seqs: Vec<(u64, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let seq = name
            .strip_suffix(SUFFIX)
            .or_else(|| name.strip_suffix(ANSWER_SUFFIX))
            .and_then(|s| s.parse().ok());
        if let Some(seq) = seq {
            seqs.push((seq, entry.path()));
        }
    }
    let mut batches: Vec<u64> = seqs.iter().map(|(s, _)| *s).collect();
    batches.sort_unstable();
    batches.dedup();
    let Some(&oldest_kept) = batches.len().checked_sub(keep).and_then(|n| batches.get(n)) else {
        return Ok(());
    };
    for (_, path) in seqs.iter().filter(|(s, _)| *s < oldest_kept) {
        fs::remove_file(path).map_err(io(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_and_the_sequence_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.push(b"a").unwrap(), 0);
        assert_eq!(spool.push(b"bb").unwrap(), 1);
        spool.remove(0).unwrap();
        drop(spool);
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.oldest().unwrap(), Some((1, b"bb".to_vec())));
        spool.remove(1).unwrap();
        drop(spool);
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert!(spool.is_empty());
        assert_eq!(spool.push(b"c").unwrap(), 2, "numbers are never reused");
    }

    #[test]
    fn a_spool_keeps_its_epoch_and_a_fresh_one_takes_another() {
        let dir = tempfile::tempdir().unwrap();
        let epoch = Spool::open(dir.path(), 1 << 20).unwrap().epoch().to_owned();
        assert_eq!(epoch.len(), 16);
        assert_eq!(Spool::open(dir.path(), 1 << 20).unwrap().epoch(), epoch);
        let reimaged = tempfile::tempdir().unwrap();
        assert_ne!(
            Spool::open(reimaged.path(), 1 << 20).unwrap().epoch(),
            epoch
        );
        fs::write(dir.path().join(EPOCH), "../x").unwrap();
        let err = Spool::open(dir.path(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("epoch"), "{err}");
    }

    #[test]
    fn past_the_bound_the_oldest_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 10).unwrap();
        for _ in 0..5 {
            spool.push(b"1234").unwrap();
        }
        assert_eq!(spool.len(), 2);
        assert_eq!(spool.dropped(), 3);
        assert_eq!(spool.oldest().unwrap().unwrap().0, 3);
    }

    #[test]
    fn a_refused_batch_is_kept_aside_with_the_answer_that_names_its_bad_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let seq = spool.push(b"batch").unwrap();
        spool.push(b"next").unwrap();
        let answer = r#"{"refused_rows": [5], "stored_rows": 7}"#;
        spool.reject(seq, answer).unwrap();
        let rejected = dir.path().join("rejected");
        assert_eq!(fs::read(rejected.join(Spool::name(seq))).unwrap(), b"batch");
        assert_eq!(
            fs::read_to_string(rejected.join(format!("{seq:020}.answer.json"))).unwrap(),
            answer
        );
        assert_eq!(spool.oldest().unwrap(), Some((1, b"next".to_vec())));
    }

    #[test]
    fn only_the_newest_refused_batches_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for _ in 0..5 {
            let seq = spool.push(b"batch").unwrap();
            spool.reject(seq, "{}").unwrap();
        }
        prune_rejected(&dir.path().join("rejected"), 2).unwrap();
        let mut left: Vec<String> = fs::read_dir(dir.path().join("rejected"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "00000000000000000003.answer.json",
                "00000000000000000003.arrows",
                "00000000000000000004.answer.json",
                "00000000000000000004.arrows"
            ]
        );
    }
}
