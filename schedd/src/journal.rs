//! The journal (`journal.jsonl`): a request's change (a submission, a cancel, a drain, a
//! reservation) is appended and flushed before the request is answered, so `kill -9` or a power
//! loss right after the answer keeps it; a cycle's changes are one record at its end.
//! `state.json` is written whole once the journal has grown to half its size, saying the last
//! record it holds, and written beside the service rather than under its lock: the records up to
//! then stay in `journal.jsonl`, later ones go to `journal.next.jsonl` while a copy of the state
//! is written on a thread of its own, and once that is on disk the newer file replaces the older
//! one. After a failed write (a change kept in memory that only a `state.json` can hold) the
//! state is written under the lock and the journal emptied. On start the records after the last
//! one the state holds, in either file, are applied to the state read back.
//!
//! A record holds the objects the request changed as they are after it, so applying it again
//! changes nothing. Requests that arrive while the journal is being flushed are flushed together
//! by the next write (group commit): a submission costs one small append whatever the size of the
//! state.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use gpuledger_model::job::JobEvent;
use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, JobId};
use gpuledger_scheduler::reservation::ReservationEntry;

use crate::state::{Drained, JobInfo, State};
use crate::{Error, Result};

pub(crate) const JOURNAL_FILE: &str = "journal.jsonl";
/// The records made while a `state.json` is written beside the service; it replaces
/// `journal.jsonl` once that state is on disk (or a state written under the lock holds both).
pub(crate) const NEXT_JOURNAL_FILE: &str = "journal.next.jsonl";

/// One request's change: what it changed, as it is after the change.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Change {
    /// Set by the journal: records are applied in this order, those the state holds skipped.
    #[serde(default)]
    pub seq: u64,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::state::shared::list"
    )]
    pub jobs: Vec<Arc<JobInfo>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_job_number: Option<(AccountId, u64)>,
    /// Events the change queued for the aggregator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<JobEvent>,
    /// Nodes drained (`Some`) or resumed (`None`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<(String, Option<Drained>)>,
    /// Every reservation, when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<Vec<ReservationEntry>>,
    /// Ended jobs past the job history, dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<JobId>,
    /// Waiting jobs' waits for GPUs (`JobInfo::gpu_wait_from_s`) that started or stopped: the
    /// field alone, where a whole job would be a hundred times its size (a quota letting go of
    /// thousands of jobs at midnight).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<(JobId, Option<UnixSeconds>)>,
    /// The events not yet delivered, as they are after a cycle (put in a batch, acknowledged),
    /// after `events` are queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undelivered: Option<Undelivered>,
}

/// The job events the aggregator has not acknowledged: the outbox, the batch being sent and
/// its number (`State::outbox`, `sending`, `event_seq`).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Undelivered {
    pub outbox: Vec<JobEvent>,
    pub sending: Vec<JobEvent>,
    pub event_seq: u64,
}

impl Change {
    fn apply(self, state: &mut State) {
        for job in self.jobs {
            state.jobs.insert(job.id.clone(), job);
        }
        if let Some((account, next)) = self.next_job_number {
            let kept = state.next_job_number.entry(account).or_insert(next);
            *kept = (*kept).max(next);
        }
        state.outbox.extend(self.events);
        for (node, drained) in self.drained {
            match drained {
                Some(d) => state.drained.insert(node, d),
                None => state.drained.remove(&node),
            };
        }
        if let Some(reservations) = self.reservations {
            state.reservations = reservations;
        }
        for id in &self.forgotten {
            state.jobs.remove(id);
        }
        for (id, from) in self.waits {
            if let Some(job) = state.jobs.get_mut(&id).map(Arc::make_mut) {
                job.gpu_wait_from_s = from;
            }
        }
        if let Some(events) = self.undelivered {
            state.outbox = events.outbox;
            state.sending = events.sending;
            state.event_seq = events.event_seq;
        }
    }
}

/// How a queued record's write ended: nothing yet, written (or saved in `state.json`), or the
/// error (kind and message; `io::Error` cannot be cloned for every waiter).
type Outcome = Arc<OnceLock<Result<(), (io::ErrorKind, String)>>>;

/// A change queued for the journal; [`Journal::commit`] returns once it is on disk.
#[derive(Debug)]
pub(crate) struct Ticket {
    seq: u64,
    outcome: Outcome,
}

#[derive(Debug)]
struct Queued {
    next_seq: u64,
    records: Vec<Record>,
}

/// A change queued for writing: its number, its line, how its write ended, and whether its
/// request undoes the change when the write fails (a submission withdrawn, a reservation
/// removed) rather than keep it (a cancel, a drain: the next `state.json` holds them).
#[derive(Debug)]
struct Record {
    seq: u64,
    line: Vec<u8>,
    outcome: Outcome,
    undone_on_failure: bool,
}

#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    next_path: PathBuf,
    /// Held while records are written and flushed; later requests queue meanwhile.
    file: Mutex<Appending>,
    queued: Mutex<Queued>,
    /// Records undone on failure whose write failed and whose requests have not yet undone
    /// their change: `state.json` is not written meanwhile, lest it hold a refused change.
    unsettled: Mutex<BTreeSet<u64>>,
    /// The journal's length, and whether a write failed since `state.json` was last written
    /// (a change kept in memory that only the next `state.json` can hold).
    written: Mutex<Written>,
    /// The `state.json` being written beside the service: the size written, once it and the
    /// journal's replacement by the next file are on disk.
    saving: Mutex<Option<JoinHandle<Result<u64>>>>,
}

/// The file records are appended to: `journal.jsonl`, or the next file while a `state.json`
/// written beside the service is not known to be on disk.
#[derive(Debug)]
struct Appending {
    file: File,
    path: PathBuf,
}

#[derive(Debug, Default)]
struct Written {
    bytes: u64,
    failed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Journal {
    /// Opens `dir/journal.jsonl` and applies to `state` the records after those it holds, then
    /// those of `journal.next.jsonl` where a crash came while a `state.json` was written beside
    /// the service (records then go on to that file). A last record cut short (a crash while it
    /// was written: never acknowledged) is cut off; a bad record before the last stops the
    /// start, naming its file and line.
    pub(crate) fn open(dir: &Path, state: &mut State) -> Result<Journal> {
        let path = dir.join(JOURNAL_FILE);
        let next_path = dir.join(NEXT_JOURNAL_FILE);
        let journal = read_if_present(&path)?;
        let next = read_if_present(&next_path)?;
        let mut whole = apply(&path, journal.as_deref().unwrap_or_default(), state)?;
        let mut len = journal.map_or(0, |bytes| bytes.len());
        let mut active = path.clone();
        if let Some(next) = next {
            whole = apply(&next_path, &next, state)?;
            len = next.len();
            active = next_path.clone();
        }
        let io_error = |source| Error::Io {
            path: active.clone(),
            source,
        };
        if whole < len {
            tracing::warn!(path = %active.display(), bytes = len - whole, "a journal record cut short by a crash is dropped (it was never acknowledged)");
        }
        let file = open_for_appends(&active, false).map_err(io_error)?;
        file.set_len(whole as u64).map_err(io_error)?;
        gpuledger_model::durable::sync_parent(&active).map_err(io_error)?;
        Ok(Journal {
            path,
            next_path,
            file: Mutex::new(Appending { file, path: active }),
            queued: Mutex::new(Queued {
                next_seq: state.journal_seq + 1,
                records: Vec::new(),
            }),
            unsettled: Mutex::new(BTreeSet::new()),
            written: Mutex::new(Written {
                bytes: whole as u64,
                failed: false,
            }),
            saving: Mutex::new(None),
        })
    }

    /// The file records are appended to now.
    pub(crate) fn path(&self) -> PathBuf {
        lock(&self.file).path.clone()
    }

    /// Queues `change` as the next record. Called with the service's state locked, so the
    /// records' order is the changes' order. A change `undone_on_failure` must be committed
    /// and then settled ([`Journal::settle`]) once undone where its write failed.
    pub(crate) fn push(&self, mut change: Change, undone_on_failure: bool) -> Ticket {
        let mut queued = lock(&self.queued);
        change.seq = queued.next_seq;
        queued.next_seq += 1;
        let outcome = Outcome::default();
        // A change of plain data always serializes; were it not to, its write fails.
        let line = serde_json::to_vec(&change).unwrap_or_default();
        queued.records.push(Record {
            seq: change.seq,
            line,
            outcome: Arc::clone(&outcome),
            undone_on_failure,
        });
        Ticket {
            seq: change.seq,
            outcome,
        }
    }

    /// The last record queued: a `state.json` written now holds every change up to it.
    pub(crate) fn last_seq(&self) -> u64 {
        lock(&self.queued).next_seq - 1
    }

    /// Returns once `ticket`'s record is on disk, writing it and every record queued with it.
    /// A record undone on failure that could not be written stays unsettled (no `state.json`
    /// is written) until its request has undone its change and calls [`Journal::settle`].
    pub(crate) fn commit(&self, ticket: &Ticket) -> io::Result<()> {
        let mut file = lock(&self.file);
        if ticket.outcome.get().is_none() {
            // The error reaches the caller through its ticket's outcome.
            let _ = self.write_queued(&mut file.file);
        }
        match ticket.outcome.get() {
            Some(Err((kind, message))) => Err(io::Error::new(*kind, message.clone())),
            _ => Ok(()),
        }
    }

    /// Writes and flushes every record queued (the journal's file locked), and sets each one's
    /// outcome: a failure leaves those undone on failure unsettled, and `state.json` due.
    fn write_queued(&self, file: &mut File) -> io::Result<()> {
        let records = std::mem::take(&mut lock(&self.queued).records);
        let result = write_records(file, &records);
        let mut written = lock(&self.written);
        match &result {
            Ok(bytes) => written.bytes += bytes,
            Err(_) => written.failed = true,
        }
        drop(written);
        if result.is_err() {
            let undone = records.iter().filter(|r| r.undone_on_failure);
            lock(&self.unsettled).extend(undone.map(|r| r.seq));
        }
        for Record { outcome, .. } in &records {
            let _ = outcome.set(
                result
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| (e.kind(), e.to_string())),
            );
        }
        result.map(|_| ())
    }

    /// Whether a write failed since `state.json` was last written: a change kept in memory is
    /// on disk nowhere else, so the next `state.json` is due now and written under the lock.
    pub(crate) fn write_failed(&self) -> bool {
        lock(&self.written).failed
    }

    /// The bytes appended since the journal last started again empty (or a `state.json`
    /// began to be written beside the service).
    pub(crate) fn bytes(&self) -> u64 {
        lock(&self.written).bytes
    }

    /// The request of a record that could not be written has undone its change (a withdrawn
    /// submission, a removed reservation): the state may be saved again.
    pub(crate) fn settle(&self, ticket: &Ticket) {
        lock(&self.unsettled).remove(&ticket.seq);
    }

    /// Writes `state.json` with `save` holding every record up to `seq` (the last one queued,
    /// the state being locked): those still queued are done, and the journal starts again
    /// empty. Not while a record that could not be written is unsettled (its change may yet be
    /// undone): then nothing is written and `Ok(false)` is returned. The journal is held
    /// meanwhile, so no write can fail between that check and the save. A `state.json` being
    /// written beside the service is waited for first, lest it land after this one.
    pub(crate) fn save_through<E>(
        &self,
        seq: u64,
        save: impl FnOnce() -> Result<(), E>,
    ) -> Result<bool, E> {
        if let Some(Err(error)) = self.saved_beside(true) {
            tracing::warn!(%error, "the state file written beside the service failed; it is written whole now");
        }
        let mut file = lock(&self.file);
        if !lock(&self.unsettled).is_empty() {
            return Ok(false);
        }
        save()?;
        lock(&self.queued).records.retain(|r| {
            if r.seq <= seq {
                let _ = r.outcome.set(Ok(()));
            }
            r.seq > seq
        });
        if file.path == self.next_path {
            // Both files' records are in the state: the next file becomes the journal, emptied
            // below. Were the rename lost, both files' records are skipped at start.
            match std::fs::rename(&self.next_path, &self.path) {
                Ok(()) => file.path = self.path.clone(),
                Err(error) => {
                    tracing::warn!(%error, path = %self.next_path.display(), "the next journal could not replace the journal; records go on to it");
                }
            }
        }
        // Not flushed: were the emptying lost, the records are ones the state holds, skipped.
        let mut written = lock(&self.written);
        written.failed = false;
        match file.file.set_len(0) {
            Ok(()) => written.bytes = 0,
            Err(error) => {
                tracing::warn!(%error, "the journal could not be emptied; its records are skipped at start");
            }
        }
        Ok(true)
    }

    /// Starts writing `state.json` at `state_path` beside the service, on a thread of its own:
    /// `copy` is the state holding every record up to `seq` (the last one queued, the
    /// service's state being locked). The records queued are written first, to the journal,
    /// and later ones go to the next file, which replaces the journal once the state is on
    /// disk. `Ok(false)` where it does not start (one is being written, a write failed since
    /// the last `state.json`, the next file cannot be made): the caller commits as usual. An
    /// error is the queued records' write, which their tickets say too.
    pub(crate) fn save_beside(
        &self,
        seq: u64,
        copy: impl FnOnce() -> State,
        state_path: PathBuf,
    ) -> io::Result<bool> {
        let mut saving = lock(&self.saving);
        let failed = || lock(&self.written).failed || !lock(&self.unsettled).is_empty();
        if saving.is_some() || failed() {
            return Ok(false);
        }
        // Copied before the file is locked: requests committing meanwhile do not wait for it.
        let mut state = copy();
        state.journal_seq = seq;
        let mut file = lock(&self.file);
        if failed() || file.path == self.next_path {
            return Ok(false);
        }
        self.write_queued(&mut file.file)?;
        let next = match open_for_appends(&self.next_path, true)
            .and_then(|next| gpuledger_model::durable::sync_parent(&self.next_path).map(|()| next))
        {
            Ok(next) => next,
            Err(error) => {
                tracing::warn!(%error, path = %self.next_path.display(), "the next journal could not be made; the journal grows on");
                return Ok(false);
            }
        };
        *file = Appending {
            file: next,
            path: self.next_path.clone(),
        };
        lock(&self.written).bytes = 0;
        let (journal, next_path) = (self.path.clone(), self.next_path.clone());
        let write = move || -> Result<u64> {
            let bytes = state.save(&state_path)?;
            drop(state);
            let io_error = |source| Error::Io {
                path: journal.clone(),
                source,
            };
            std::fs::rename(&next_path, &journal).map_err(io_error)?;
            gpuledger_model::durable::sync_parent(&journal).map_err(io_error)?;
            Ok(bytes)
        };
        match std::thread::Builder::new()
            .name("state-file".into())
            .spawn(write)
        {
            Ok(handle) => *saving = Some(handle),
            Err(error) => {
                // The next cycle writes it under the lock.
                tracing::warn!(%error, "no thread for the state file");
                lock(&self.written).failed = true;
            }
        }
        Ok(true)
    }

    /// How the `state.json` written beside the service went, once it is done (with `wait`,
    /// waiting for it): the bytes written, or the error (the next cycle then writes it under
    /// the lock). `None` while none is being written, or this one is not done.
    pub(crate) fn saved_beside(&self, wait: bool) -> Option<Result<u64>> {
        let mut saving = lock(&self.saving);
        if !wait && !saving.as_ref()?.is_finished() {
            return None;
        }
        let outcome = saving.take()?.join().unwrap_or_else(|_| {
            Err(Error::State {
                path: self.path.clone(),
                message: "the thread writing the state file panicked".into(),
            })
        });
        match &outcome {
            Ok(_) => {
                let mut file = lock(&self.file);
                if file.path == self.next_path {
                    file.path = self.path.clone();
                }
            }
            Err(_) => lock(&self.written).failed = true,
        }
        Some(outcome)
    }
}

impl Drop for Journal {
    /// A `state.json` being written is finished: a service closed (a test's restart) never
    /// has an older state land after its successor's.
    fn drop(&mut self) {
        if let Some(Err(error)) = self.saved_beside(true) {
            tracing::warn!(%error, "the state file written beside the service failed");
        }
    }
}

/// Opens `path` for appends, readable by the service alone (tenants' commands and
/// environments, as `state.json`); `fresh` makes it anew, empty.
fn open_for_appends(path: &Path, fresh: bool) -> io::Result<File> {
    if fresh {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Debug builds: the state a restart reads from `dir`, `state.json` with the journals'
/// records after it. Read in this order, the next file first and the state last: a
/// `state.json` written beside the service meanwhile is on disk before the next file replaces
/// the journal, so whichever files are read, the records after the state read are among them.
#[cfg(debug_assertions)]
pub(crate) fn read_back(dir: &Path, state_file: &str) -> Result<State> {
    let (journal, next) = (dir.join(JOURNAL_FILE), dir.join(NEXT_JOURNAL_FILE));
    let next_bytes = read_if_present(&next)?;
    let journal_bytes = read_if_present(&journal)?;
    let mut state = State::load(&dir.join(state_file))?;
    apply(
        &journal,
        journal_bytes.as_deref().unwrap_or_default(),
        &mut state,
    )?;
    apply(&next, next_bytes.as_deref().unwrap_or_default(), &mut state)?;
    Ok(state)
}

/// The bytes of the file at `path`; `None` where there is none.
fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Applies to `state` the records of the journal `bytes` (read from `path`) after the last one
/// it holds; the length of its whole lines.
fn apply(path: &Path, bytes: &[u8], state: &mut State) -> Result<usize> {
    let (changes, whole) = parse(bytes).map_err(|(line, message)| Error::State {
        path: path.to_owned(),
        message: format!("line {line}: {message}"),
    })?;
    let mut last = state.journal_seq;
    for change in changes {
        if change.seq > state.journal_seq {
            last = last.max(change.seq);
            change.apply(state);
        }
    }
    state.journal_seq = last;
    Ok(whole)
}

/// Appends the records and flushes them; on an error the file is cut back to where it was, so
/// a later record never follows a torn one.
fn write_records(file: &mut File, records: &[Record]) -> io::Result<u64> {
    if records.is_empty() {
        return Ok(0);
    }
    let len = file.metadata()?.len();
    let mut bytes = Vec::new();
    for Record { line, .. } in records {
        if line.is_empty() {
            return Err(io::Error::other("a journal record could not be encoded"));
        }
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
    }
    let written = file.write_all(&bytes).and_then(|()| file.sync_data());
    if written.is_err() {
        let _ = file.set_len(len);
    }
    written.map(|()| bytes.len() as u64)
}

/// The records of a journal and the length of its whole lines; a last line without its newline
/// or unreadable is a torn write, left out. Any other bad line: its number and why.
fn parse(bytes: &[u8]) -> std::result::Result<(Vec<Change>, usize), (usize, String)> {
    let mut changes = Vec::new();
    let mut whole = 0;
    let lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let last = i + 1 == lines.len();
        let Some(text) = line.strip_suffix(b"\n") else {
            break;
        };
        match serde_json::from_slice::<Change>(text) {
            Ok(change) => changes.push(change),
            Err(_) if last => break,
            Err(e) => return Err((i + 1, e.to_string())),
        }
        whole += line.len();
    }
    Ok((changes, whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(node: &str, reason: &str) -> Change {
        Change {
            drained: vec![(
                node.into(),
                Some(Drained {
                    reason: reason.into(),
                    since_s: 0,
                    by: "op".into(),
                }),
            )],
            ..Change::default()
        }
    }

    #[test]
    fn records_after_the_state_are_applied_and_a_torn_last_one_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = State::default();
        let journal = Journal::open(dir.path(), &mut state).unwrap();
        let tickets: Vec<Ticket> = [("gpu001", "a"), ("gpu002", "b"), ("gpu003", "c")]
            .into_iter()
            .map(|(n, r)| journal.push(drain(n, r), false))
            .collect();
        journal.commit(&tickets[0]).unwrap();
        for t in &tickets {
            assert!(matches!(t.outcome.get(), Some(Ok(()))), "one write for all");
        }
        drop(journal);
        let path = dir.path().join(JOURNAL_FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"seq\": 4, \"drained\": [[\"gpu004\"");
        std::fs::write(&path, &text).unwrap();

        // A state saved after the first record: only the later two apply.
        let mut state = State {
            journal_seq: 1,
            ..State::default()
        };
        let journal = Journal::open(dir.path(), &mut state).unwrap();
        let drained: Vec<&str> = state.drained.keys().map(String::as_str).collect();
        assert_eq!(drained, ["gpu002", "gpu003"]);
        assert_eq!(state.journal_seq, 3);
        assert_eq!(journal.last_seq(), 3);
        let kept = std::fs::read_to_string(&path).unwrap();
        assert!(!kept.contains("gpu004") && kept.ends_with('\n'), "{kept}");

        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(journal.save_through(3, || Ok::<_, ()>(())).unwrap());
        assert_eq!(std::fs::read(&path).unwrap().len(), 0);
    }

    #[test]
    fn no_state_is_saved_while_a_record_that_could_not_be_written_is_unsettled() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), &mut State::default()).unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        // Writes fail: the journal's file open for reading only.
        let writable = std::mem::replace(&mut lock(&journal.file).file, File::open(&path).unwrap());
        let a = journal.push(drain("gpu001", "a"), true);
        let b = journal.push(drain("gpu002", "b"), true);
        // Kept on failure (a cancel, a drain): never holds the state back.
        let kept = journal.push(drain("gpu004", "d"), false);
        assert!(journal.commit(&a).is_err());
        lock(&journal.file).file = writable;
        // B was written (and failed) with A: its own commit says so, and it is unsettled too;
        // the kept record failed with them and holds nothing back.
        assert!(journal.commit(&b).is_err());
        let saves = std::cell::Cell::new(0);
        let save = || {
            saves.set(saves.get() + 1);
            Ok::<_, ()>(())
        };
        journal.settle(&a);
        assert_eq!(journal.save_through(2, save), Ok(false));
        assert_eq!(saves.get(), 0, "B's change may yet be undone");
        journal.settle(&b);
        assert!(journal.commit(&kept).is_err());
        let c = journal.push(drain("gpu003", "c"), false);
        journal.commit(&c).unwrap();
        assert_eq!(journal.save_through(4, save), Ok(true));
        assert_eq!(saves.get(), 1);
        assert_eq!(std::fs::read(&path).unwrap().len(), 0);
    }

    /// The nodes drained in the state a restart would read from `dir`: in place (as the
    /// service's debug check reads it) and from a copy opened anew.
    fn drained_on_disk(dir: &Path) -> Vec<String> {
        let in_place = read_back(dir, "state.json").unwrap();
        let copy = tempfile::tempdir().unwrap();
        for name in ["state.json", JOURNAL_FILE, NEXT_JOURNAL_FILE] {
            if dir.join(name).exists() {
                std::fs::copy(dir.join(name), copy.path().join(name)).unwrap();
            }
        }
        let mut state = State::load(&copy.path().join("state.json")).unwrap();
        Journal::open(copy.path(), &mut state).unwrap();
        assert_eq!(state.drained, in_place.drained);
        state.drained.into_keys().collect()
    }

    fn drained_state(nodes: &[&str]) -> State {
        let mut state = State::default();
        for node in nodes {
            drain(node, "r").apply(&mut state);
        }
        state
    }

    fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
    }

    #[test]
    fn a_state_file_written_beside_keeps_every_record_readable_whether_it_lands_or_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (state_path, path) = (dir.path().join("state.json"), dir.path().join(JOURNAL_FILE));
        let next = dir.path().join(NEXT_JOURNAL_FILE);
        let journal = Journal::open(dir.path(), &mut State::default()).unwrap();
        let nodes = ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006"];
        for node in &nodes[..2] {
            journal
                .commit(&journal.push(drain(node, "r"), false))
                .unwrap();
        }
        // Queued, not yet written: written before the journal gives way to the next file.
        let third = journal.push(drain(nodes[2], "r"), false);

        // The state file cannot be written (a directory where its temporary file goes).
        let blocker = dir.path().join(".state.json.tmp");
        std::fs::create_dir(&blocker).unwrap();
        let copy = || drained_state(&nodes[..3]);
        assert!(journal.save_beside(3, copy, state_path.clone()).unwrap());
        assert!(matches!(third.outcome.get(), Some(Ok(()))));
        assert!(
            !journal.save_beside(3, copy, state_path.clone()).unwrap(),
            "one at a time"
        );
        journal
            .commit(&journal.push(drain(nodes[3], "r"), false))
            .unwrap();
        assert_eq!((lines(&path), lines(&next)), (3, 1));
        assert_eq!(journal.path(), next);
        assert!(journal.saved_beside(true).unwrap().is_err());
        assert!(
            journal.write_failed(),
            "the next cycle writes it under the lock"
        );
        // A crash now: the records of both files are read back.
        assert_eq!(drained_on_disk(dir.path()), nodes[..4]);

        // Written under the lock: it holds both files' records, and the journal starts again.
        std::fs::remove_dir(&blocker).unwrap();
        let save = || drained_state(&nodes[..4]).save(&state_path).map(|_| ());
        assert!(journal.save_through(4, save).unwrap());
        assert!(!next.exists() && lines(&path) == 0 && !journal.write_failed());
        assert_eq!(journal.path(), path);
        assert_eq!(drained_on_disk(dir.path()), nodes[..4]);

        // Beside the service, landing: the next file, with the record made meanwhile, replaces
        // the journal once the state is on disk.
        journal
            .commit(&journal.push(drain(nodes[4], "r"), false))
            .unwrap();
        let copy = || drained_state(&nodes[..5]);
        assert!(journal.save_beside(5, copy, state_path.clone()).unwrap());
        journal
            .commit(&journal.push(drain(nodes[5], "r"), false))
            .unwrap();
        assert_eq!(drained_on_disk(dir.path()), nodes);
        let bytes = journal.saved_beside(true).unwrap().unwrap();
        assert_eq!(bytes, std::fs::metadata(&state_path).unwrap().len());
        assert!(
            !next.exists() && lines(&path) == 1,
            "the record after the state's"
        );
        assert_eq!(State::load(&state_path).unwrap().journal_seq, 5);
        assert_eq!(journal.path(), path);
        assert_eq!(drained_on_disk(dir.path()), nodes);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the next file was made the service's alone"
        );
    }

    #[test]
    fn a_bad_record_before_the_last_stops_the_start_naming_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let line = serde_json::to_string(&drain("gpu001", "a")).unwrap();
        std::fs::write(
            dir.path().join(JOURNAL_FILE),
            format!("{line}\n{{\"seq\": 2, \"colour\": 1}}\n{line}\n"),
        )
        .unwrap();
        let e = Journal::open(dir.path(), &mut State::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("journal.jsonl: state file unreadable: line 2: unknown field `colour`"),
            "{e}"
        );
    }
}
