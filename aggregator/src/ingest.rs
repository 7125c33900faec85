//! The one ingest path: the HTTP endpoints and the demo both call [`Ingestor`]. A batch is
//! validated row by row (its bad rows refused, named, and the others kept), de-duplicated on
//! (source, sequence number), written to the write-ahead log (when there is one) and applied
//! to the store; it is acknowledged once the log is fsync'd. [`Ingestor::flush`] persists the store to Parquet and checkpoints the log.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use gpuledger_model::event_json::EventRows;
use gpuledger_model::job::{job_events_from_batch, job_events_to_batch, JobEvent};
use gpuledger_model::time::Clock;

use gpuledger_model::config::UnknownTenants;
use gpuledger_model::inventory::PLATFORM_ACCOUNT;
use gpuledger_model::validate::rebook_unknown_tenants;
use gpuledger_model::{AccountId, Inventory};

use crate::coverage::Coverage;
use crate::store::{FlushStats, Store};
use crate::validate::{validate_samples, Refusal, RowError, Rules};
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
    /// What exists (nodes, their GPUs, accounts and projects): every row is checked against it.
    pub inventory: Arc<Inventory>,
    /// How far ahead of the aggregator's clock a sample may start.
    pub future_tolerance_ms: i64,
    /// Raw samples older than this are refused (and later deleted).
    pub raw_retention_days: u32,
}

impl IngestorConfig {
    /// The default rules over `inventory`.
    pub fn new(inventory: Inventory) -> Self {
        IngestorConfig {
            inventory: Arc::new(inventory),
            future_tolerance_ms: 5 * 60 * 1000,
            raw_retention_days: 90,
        }
    }

    fn max_age_ms(&self) -> i64 {
        i64::from(self.raw_retention_days) * 86_400_000
    }
}

/// Events checked against the aggregator's clock and the cluster config, each refusal naming
/// its row and field; the batch is refused whole, as a sample batch is. A time before 1970, or
/// further ahead than a sample may start, is no event's (a job finished years ahead would be
/// billed years of GPUs); a job holds no more GPUs than the cluster has, and only GPUs of its
/// nodes. An account (or a project of it) the config does not define is refused, or under
/// `unknown_tenants = "platform"` booked to the platform account as a sample row is: the
/// events to store, and how many were rebooked.
fn check_events<'a>(
    events: &'a [JobEvent],
    now_ms: i64,
    future_tolerance_ms: i64,
    inventory: &Inventory,
) -> Result<CheckedEvents<'a>> {
    let latest = now_ms.saturating_add(future_tolerance_ms);
    let refuse_tenants = inventory.unknown_tenants() == UnknownTenants::Refuse;
    let cluster_gpus = inventory.cluster_gpus();
    let mut errors = Vec::new();
    let mut total = 0;
    let mut bad_rows = vec![false; events.len()];
    let mut error = |row: usize, field: &str, message: String| {
        total += 1;
        bad_rows[row] = true;
        if errors.len() < gpuledger_model::validate::MAX_REPORTED_ERRORS {
            errors.push(RowError {
                row: Some(row),
                field: field.into(),
                message,
            })
        }
    };
    for (row, event) in events.iter().enumerate() {
        if event.time_ms < 0 {
            error(row, "time_ms", format!("{} is before 1970", event.time_ms));
        } else if event.time_ms > latest {
            let ahead = (event.time_ms - now_ms) / 1000;
            error(
                row,
                "time_ms",
                format!(
                    "{} is {ahead} s ahead of the aggregator's clock",
                    event.time_ms
                ),
            );
        }
        let account = event.account.as_str();
        if refuse_tenants && !inventory.has_account(account) {
            error(
                row,
                "account",
                format!("`{account}` is not an account of this cluster's config"),
            );
        } else if let Some(p) = event.project.as_ref().map(|p| p.as_str()) {
            if refuse_tenants && !inventory.has_project(account, p) {
                error(
                    row,
                    "project",
                    format!("`{p}` is not a project of account `{account}`"),
                );
            }
        }
        if let Some(gpus) = event.gpus.filter(|g| u64::from(*g) > cluster_gpus) {
            error(
                row,
                "gpus",
                format!("{gpus} GPUs; the cluster has {cluster_gpus}"),
            );
        }
        for held in event.allocation.iter().flat_map(|a| &a.0) {
            let node = held.node.as_str();
            match inventory.cluster_node(node) {
                None => error(
                    row,
                    "allocation",
                    format!("node `{node}` is not a node of the cluster config"),
                ),
                Some(facts) => {
                    if let Some(gpu) = held.gpus.iter().find(|g| **g >= facts.gpus) {
                        error(
                            row,
                            "allocation",
                            format!(
                                "node `{node}` has {} GPUs; {gpu} is none of them",
                                facts.gpus
                            ),
                        );
                    }
                }
            }
        }
    }
    let (events, refused): (Cow<'a, [JobEvent]>, _) = if total == 0 {
        (Cow::Borrowed(events), None)
    } else {
        let refusal = Refusal {
            errors,
            total,
            bad_rows,
        };
        if refusal.refuses_every_row() {
            return Err(Error::Invalid(refusal.errors));
        }
        let good = events
            .iter()
            .zip(&refusal.bad_rows)
            .filter(|(_, bad)| !**bad)
            .map(|(e, _)| e.clone())
            .collect();
        (Cow::Owned(good), Some(refusal))
    };
    let unknown = |e: &JobEvent| {
        !inventory.has_account(e.account.as_str())
            || e.project
                .as_ref()
                .is_some_and(|p| !inventory.has_project(e.account.as_str(), p.as_str()))
    };
    let rebooked = events.iter().filter(|e| unknown(e)).count();
    if rebooked == 0 {
        return Ok(CheckedEvents {
            events,
            rebooked,
            refused,
        });
    }
    let platform = AccountId::new(PLATFORM_ACCOUNT).map_err(|e| {
        Error::Invalid(vec![RowError {
            row: None,
            field: "account".into(),
            message: e.to_string(),
        }])
    })?;
    let moved = events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if !inventory.has_account(e.account.as_str()) {
                e.account = platform.clone();
                e.project = None;
            } else if unknown(&e) {
                e.project = None;
            }
            e
        })
        .collect();
    Ok(CheckedEvents {
        events: Cow::Owned(moved),
        rebooked,
        refused,
    })
}

/// The answer to a batch of `sent` rows whose good rows were stored and whose bad ones were
/// not.
pub(crate) fn rows_refused(refusal: Refusal, sent: usize) -> Error {
    let refused_rows = refusal.bad_row_count(sent);
    Error::RowsRefused {
        refusal,
        refused_rows,
        stored_rows: sent - refused_rows,
    }
}

/// Errors about parsed events (`kept[i]` is the i-th one's row), by their rows in the batch.
fn in_batch(errors: Vec<RowError>, kept: &[usize]) -> impl Iterator<Item = RowError> + '_ {
    errors.into_iter().map(|mut e| {
        e.row = e.row.and_then(|r| kept.get(r).copied());
        e
    })
}

/// The bad rows of an event batch of `sent` rows: those that did not parse (all but `kept`,
/// with their errors and count) and those of the parsed events the checks refused.
fn refused_in_batch(
    sent: usize,
    kept: &[usize],
    (errors, total): (Vec<RowError>, usize),
    checked: Option<Refusal>,
) -> Option<Refusal> {
    if total == 0 && checked.is_none() {
        return None;
    }
    let mut refusal = Refusal {
        errors,
        total,
        bad_rows: vec![true; sent],
    };
    for &row in kept {
        refusal.bad_rows[row] = false;
    }
    if let Some(checked) = checked {
        for (i, bad) in checked.bad_rows.iter().enumerate() {
            if *bad {
                refusal.bad_rows[kept[i]] = true;
            }
        }
        refusal.errors.extend(in_batch(checked.errors, kept));
        refusal.total += checked.total;
    }
    refusal.errors.sort_by_key(|e| e.row);
    refusal
        .errors
        .truncate(gpuledger_model::validate::MAX_REPORTED_ERRORS);
    Some(refusal)
}

/// What [`Ingestor::ingest_job_events`] did, and the bad rows it refused (for a batch sent
/// again too: the first answer may have been lost).
#[derive(Debug)]
pub struct EventsIngested {
    pub outcome: IngestOutcome,
    pub refused: Option<Refusal>,
    /// Events in the batch as sent.
    pub sent: usize,
}

impl EventsIngested {
    /// The outcome, or [`Error::RowsRefused`] where rows were refused.
    pub fn into_result(self) -> Result<IngestOutcome> {
        match self.refused {
            None => Ok(self.outcome),
            Some(refusal) => Err(rows_refused(refusal, self.sent)),
        }
    }

    /// Whether `row` of the batch as sent was refused.
    pub fn refused_row(&self, row: usize) -> bool {
        self.refused
            .as_ref()
            .is_some_and(|r| r.bad_rows.get(row).copied().unwrap_or(true))
    }
}

/// An event batch's events to store (rebooked where the config says so), and its bad rows.
#[derive(Debug)]
struct CheckedEvents<'a> {
    events: Cow<'a, [JobEvent]>,
    rebooked: usize,
    refused: Option<Refusal>,
}

/// What happened to a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestOutcome {
    Accepted(Accepted),
    /// This (sender, sequence) was already stored, or every row's interval was: nothing was
    /// written.
    Duplicate,
}

/// What a batch that was stored became.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Rows stored.
    pub rows: usize,
    /// Rows dropped because their GPU's interval was stored already.
    pub duplicate_rows: usize,
    /// Rows cut to the part of their interval not stored yet.
    pub trimmed_rows: usize,
    /// Rows of tenants the config does not define, booked to the platform account.
    pub rebooked_rows: usize,
}

impl IngestOutcome {
    fn rows(rows: usize) -> Self {
        IngestOutcome::Accepted(Accepted {
            rows,
            ..Accepted::default()
        })
    }

    /// Rows stored.
    pub fn stored_rows(&self) -> usize {
        match self {
            IngestOutcome::Accepted(a) => a.rows,
            IngestOutcome::Duplicate => 0,
        }
    }
}

/// What [`Ingestor::ingest_push`] did, and the rows it stored (as stored: cut, rebooked).
#[derive(Debug)]
pub struct Ingested {
    pub outcome: IngestOutcome,
    pub stored: Option<RecordBatch>,
    /// Rows dropped because their GPU's interval was stored already (for a batch whose every
    /// row was, answered as a duplicate under a new number, as for one partly stored).
    pub duplicate_rows: usize,
    /// The batch's bad rows, refused while the others were stored (or were already).
    pub refused: Option<Refusal>,
}

impl Ingested {
    fn duplicate(duplicate_rows: usize, refused: Option<Refusal>) -> Self {
        Ingested {
            outcome: IngestOutcome::Duplicate,
            stored: None,
            duplicate_rows,
            refused,
        }
    }
}

/// The good rows of a batch that has bad ones too; what is not stored, and why.
#[derive(Debug)]
struct Checked {
    batch: RecordBatch,
    rebooked_rows: usize,
    refused: Option<Refusal>,
}

/// One pushed batch of samples and who sent it.
#[derive(Clone, Copy, Debug)]
pub struct SamplePush<'a> {
    pub node: &'a str,
    /// The sender's epoch ([`gpuledger_model::wire::EPOCH_HEADER`]), where it sends one.
    pub epoch: Option<&'a str>,
    pub seq: u64,
    /// The sender will never send a number below this again (at most `seq`).
    pub low: Option<u64>,
    pub batch: &'a RecordBatch,
    /// The body as it was sent: a re-send is known by it. `batch` is exactly its decoding
    /// when `batch_is_body`, and the log then keeps these bytes instead of encoding again.
    pub body: Option<&'a [u8]>,
    pub batch_is_body: bool,
}

impl<'a> SamplePush<'a> {
    /// A batch from an in-process producer (the demo, tests): no epoch, no body.
    pub fn new(node: &'a str, seq: u64, batch: &'a RecordBatch) -> Self {
        SamplePush {
            node,
            epoch: None,
            seq,
            low: None,
            batch,
            body: None,
            batch_is_body: false,
        }
    }
}

/// The latest digests kept per sender, to tell a re-send from a batch with other content.
const DIGESTS_KEPT: usize = 64;
/// Epochs followed per node at most; the one heard from longest ago is forgotten first.
const EPOCHS_PER_NODE: usize = 8;

/// Sequence numbers stored from one sender (all up to `contiguous`, and some above it), those
/// being stored right now, and digests of the latest bodies.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SeqWindow {
    contiguous: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    above: BTreeSet<u64>,
    #[serde(skip)]
    in_flight: BTreeSet<u64>,
    /// Sequence number -> the digest of the body as sent ([`digest_of`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    digests: BTreeMap<u64, u64>,
    #[serde(default)]
    last_seen_ms: i64,
}

/// What a sequence number is to its sender's window.
enum SeqState {
    /// New: claimed for this write.
    Claimed,
    /// Another request is storing it right now.
    InFlight,
    /// Stored, with the digest of its body where one is kept.
    Stored(Option<u64>),
}

impl SeqWindow {
    fn contains(&self, seq: u64) -> bool {
        self.contiguous.is_some_and(|c| seq <= c) || self.above.contains(&seq)
    }

    fn highest(&self) -> Option<u64> {
        self.above.last().copied().max(self.contiguous)
    }

    /// Claims `seq` for a write, unless it is stored or being stored.
    fn claim(&mut self, seq: u64) -> SeqState {
        if self.contains(seq) {
            SeqState::Stored(self.digests.get(&seq).copied())
        } else if self.in_flight.insert(seq) {
            SeqState::Claimed
        } else {
            SeqState::InFlight
        }
    }

    /// Ends a claim: the batch was stored (`stored`, with its body's digest) or refused.
    fn settle(&mut self, seq: u64, stored: Option<Option<u64>>) {
        self.in_flight.remove(&seq);
        if let Some(digest) = stored {
            self.insert(seq);
            if let Some(d) = digest {
                self.digests.insert(seq, d);
                while self.digests.len() > DIGESTS_KEPT {
                    self.digests.pop_first();
                }
            }
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

/// The window key of a node's samples: the node, with its epoch where it sends one (node ids
/// never hold '@').
fn sender_key(node: &str, epoch: Option<&str>) -> String {
    match epoch {
        Some(e) => format!("{node}@{e}"),
        None => node.to_owned(),
    }
}

/// What tells a re-send (the same bytes from the spool) from another body under the same key:
/// the body's length and CRC-32. A collision could only make a node's own differing batch a
/// "duplicate" of its own earlier one, which gains it nothing (the per-GPU intervals decide
/// what is stored); a cryptographic hash cost 7% of ingest's CPU for no more safety.
fn digest_of(body: &[u8]) -> u64 {
    ((body.len() as u64) << 32) | u64::from(crc32fast::hash(body))
}

/// The log's checkpoint: the last segment persisted to Parquet, the sequence numbers stored
/// up to it, and what each GPU has stored.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    through_segment: Option<u64>,
    samples: HashMap<String, SeqWindow>,
    job_events: HashMap<String, SeqWindow>,
    #[serde(default)]
    coverage: Coverage,
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
    coverage: Mutex<Coverage>,
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
            coverage: Mutex::new(Coverage::default()),
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
        let mut coverage = checkpoint.coverage;
        let mut report = RecoveryReport {
            truncated_bytes: recovered.truncated_bytes,
            removed_files,
            ..RecoveryReport::default()
        };
        for record in recovered.records {
            match record.kind {
                RecordKind::Samples => {
                    store.append_samples(&record.batch)?;
                    coverage.add(node_of(&record.source), &record.batch);
                }
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
            coverage: Mutex::new(coverage),
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

    fn check_available(&self) -> Result<()> {
        if self.has_failed() {
            return Err(Error::Unavailable(
                "an earlier write failed; restart the aggregator to recover from its log".into(),
            ));
        }
        Ok(())
    }

    /// Ingests one batch of samples pushed by `node` with sequence number `seq` (no epoch).
    pub fn ingest_samples(
        &self,
        node: &str,
        seq: u64,
        batch: &RecordBatch,
    ) -> Result<IngestOutcome> {
        let ingested = self.ingest_push(SamplePush::new(node, seq, batch))?;
        match ingested.refused {
            None => Ok(ingested.outcome),
            Some(refusal) => Err(rows_refused(refusal, batch.num_rows())),
        }
    }

    /// Ingests a pushed batch: known by (node, epoch, seq), a re-send of the same body is a
    /// duplicate and another body under that key a conflict; checked row by row against the
    /// rules and the inventory; rows whose interval their GPU has stored already are dropped
    /// (or cut to what is new); logged, stored, and acknowledged once the log is on disk.
    pub fn ingest_push(&self, push: SamplePush<'_>) -> Result<Ingested> {
        self.check_available()?;
        let key = (RecordKind::Samples, sender_key(push.node, push.epoch));
        let digest = push.body.map(digest_of);
        let now_ms = self.clock.now_ms();
        match self.claim_seq(&key, push.node, push.seq, now_ms)? {
            SeqState::Claimed => {}
            SeqState::InFlight => {
                return Err(Error::Unavailable(format!(
                "batch {} of this sender is being stored by another request; send it again shortly",
                push.seq
            )))
            }
            SeqState::Stored(kept) => {
                self.known_again(&push, kept, digest)?;
                // The first copy's bad rows, told again: its answer may have been lost.
                let refused = self
                    .check_samples(push.node, push.batch, now_ms)
                    .ok()
                    .and_then(|c| c.refused);
                return Ok(Ingested::duplicate(0, refused));
            }
        }
        let settle = |stored: Option<Option<u64>>| {
            if let Some(window) = lock(&self.seen).get_mut(&key) {
                window.settle(push.seq, stored);
            }
        };
        let checked = self.check_samples(push.node, push.batch, now_ms);
        let Checked {
            batch,
            rebooked_rows,
            refused,
        } = match checked {
            Ok(c) => c,
            Err(e) => {
                settle(None);
                return Err(e);
            }
        };
        let ipc = (push.batch_is_body && rebooked_rows == 0 && refused.is_none())
            .then_some(push.body)
            .flatten();
        let stored = {
            let _gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let claimed = match lock(&self.coverage).claim(push.node, &batch) {
                Ok(c) => c,
                Err(e) => {
                    settle(None);
                    return Err(e);
                }
            };
            if claimed.batch.num_rows() == 0 && batch.num_rows() > 0 {
                // Every row's interval is stored: nothing new under a new number.
                settle(Some(digest));
                Err(claimed.duplicate_rows)
            } else {
                let unchanged = claimed.duplicate_rows + claimed.trimmed_rows == 0;
                let record = Record {
                    batch: &claimed.batch,
                    ipc: if unchanged { ipc } else { None },
                };
                let position = match self.log(record, RecordKind::Samples, &key.1, push.seq) {
                    Ok(p) => p,
                    Err(e) => {
                        lock(&self.coverage).release(&claimed.claim);
                        settle(None);
                        return Err(e);
                    }
                };
                if let Err(e) = self.apply(RecordKind::Samples, &claimed.batch) {
                    self.fail(&e);
                    return Err(e);
                }
                // Marked stored inside the gate, so a flush's checkpoint always lists the
                // sequence numbers of the records it trims from the log.
                settle(Some(digest));
                Ok((claimed, position))
            }
        };
        if let Some(low) = push.low {
            if let Some(window) = lock(&self.seen).get_mut(&key) {
                window.advance_to(low.min(push.seq));
            }
        }
        let (claimed, position) = match stored {
            Ok(stored) => stored,
            Err(duplicate_rows) => return Ok(Ingested::duplicate(duplicate_rows, refused)),
        };
        if let (Some(wal), Some(position)) = (&self.wal, position) {
            wal.sync(position).inspect_err(|e| self.fail(e))?;
        }
        Ok(Ingested {
            outcome: IngestOutcome::Accepted(Accepted {
                rows: claimed.batch.num_rows(),
                duplicate_rows: claimed.duplicate_rows,
                trimmed_rows: claimed.trimmed_rows,
                rebooked_rows,
            }),
            duplicate_rows: claimed.duplicate_rows,
            stored: Some(claimed.batch),
            refused,
        })
    }

    /// Claims `seq` in its sender's window, refusing a number too far above what the sender
    /// has sent; a node's oldest epoch is forgotten past [`EPOCHS_PER_NODE`].
    fn claim_seq(&self, key: &WindowKey, node: &str, seq: u64, now_ms: i64) -> Result<SeqState> {
        let mut seen = lock(&self.seen);
        if !seen.contains_key(key) {
            forget_oldest_epoch(&mut seen, node);
        }
        let window = seen.entry(key.clone()).or_default();
        let limit = window
            .highest()
            .unwrap_or(0)
            .saturating_add(gpuledger_model::wire::MAX_SEQ_AHEAD);
        if seq > limit {
            return Err(Error::BadRequest {
                field: gpuledger_model::wire::SEQ_HEADER.into(),
                message: format!(
                    "{seq} is more than {} above the highest number stored from this sender ({}); a spool counts up by one a batch",
                    gpuledger_model::wire::MAX_SEQ_AHEAD,
                    window.highest().map_or("none".into(), |h| h.to_string())
                ),
            });
        }
        window.last_seen_ms = now_ms;
        Ok(window.claim(seq))
    }

    /// A batch under a key stored already: the same body is a duplicate (answered once the
    /// first copy is on disk); another body is a conflict, refused and logged. Where the
    /// digest is no longer kept, a batch whose every interval is stored is the duplicate.
    fn known_again(
        &self,
        push: &SamplePush<'_>,
        kept: Option<u64>,
        digest: Option<u64>,
    ) -> Result<()> {
        let same = match (kept, digest) {
            (Some(k), Some(d)) => k == d,
            _ => {
                let now_ms = self.clock.now_ms();
                let checked = self.check_samples(push.node, push.batch, now_ms)?;
                lock(&self.coverage).is_stored(push.node, &checked.batch)?
            }
        };
        if !same {
            tracing::error!(
                node = push.node,
                epoch = push.epoch.unwrap_or(""),
                seq = push.seq,
                "a batch under a sequence number already stored, with other content: refused"
            );
            return Err(Error::Conflict {
                field: gpuledger_model::wire::SEQ_HEADER.into(),
                message: format!(
                    "batch {} of this sender is stored already with other content; nothing was stored (a sender numbers each batch once: a fresh spool must send a new {} header)",
                    push.seq,
                    gpuledger_model::wire::EPOCH_HEADER
                ),
            });
        }
        // The first copy may still be on its way to disk; answer once it is there.
        if let Some(wal) = &self.wal {
            wal.sync_all()?;
        }
        Ok(())
    }

    /// The batch checked against the rules and the inventory: its good rows, with those of
    /// unknown tenants booked to the platform where the config says so (and how many), and
    /// its bad rows refused. A batch with no good row is an error.
    fn check_samples(&self, node: &str, batch: &RecordBatch, now_ms: i64) -> Result<Checked> {
        let rules = Rules {
            node,
            inventory: &self.config.inventory,
            now_ms,
            future_tolerance_ms: self.config.future_tolerance_ms,
            max_age_ms: self.config.max_age_ms(),
        };
        let (good, refused) = match validate_samples(batch, &rules) {
            Ok(()) => (Cow::Borrowed(batch), None),
            Err(refusal) if refusal.refuses_every_row() => {
                return Err(Error::Invalid(refusal.errors))
            }
            Err(refusal) => (Cow::Owned(refusal.good_rows_of(batch)?), Some(refusal)),
        };
        let (batch, rebooked_rows) = match rebook_unknown_tenants(&good, &self.config.inventory)? {
            Some((rebooked, rows)) => (rebooked, rows),
            None => (good.into_owned(), 0),
        };
        Ok(Checked {
            batch,
            rebooked_rows,
            refused,
        })
    }

    fn log(
        &self,
        record: Record<'_>,
        kind: RecordKind,
        source: &str,
        seq: u64,
    ) -> Result<Option<u64>> {
        match &self.wal {
            Some(wal) => record.append_to(wal, kind, source, seq).map(Some),
            None => Ok(None),
        }
    }

    /// Ingests job lifecycle events sent by `source`; with a sequence number, a re-sent
    /// batch is recognised and stored once. Bad rows are refused and the others stored (a
    /// batch with no good row is [`Error::Invalid`]).
    pub fn ingest_job_events(
        &self,
        source: &str,
        seq: Option<u64>,
        events: &[JobEvent],
    ) -> Result<EventsIngested> {
        let rows = EventRows {
            events: events.iter().cloned().map(Some).collect(),
            errors: Vec::new(),
            total: 0,
        };
        self.ingest_event_rows(source, seq, rows)
    }

    /// [`Ingestor::ingest_job_events`] for a batch as parsed row by row: rows that did not
    /// parse are refused with the rows the checks refuse, by their numbers in the batch.
    pub fn ingest_event_rows(
        &self,
        source: &str,
        seq: Option<u64>,
        rows: EventRows,
    ) -> Result<EventsIngested> {
        let sent = rows.events.len();
        if sent == 0 {
            return Ok(EventsIngested {
                outcome: IngestOutcome::rows(0),
                refused: None,
                sent: 0,
            });
        }
        let kept: Vec<usize> = (rows.events.iter().enumerate())
            .filter(|(_, e)| e.is_some())
            .map(|(row, _)| row)
            .collect();
        let parsed: Vec<JobEvent> = rows.events.into_iter().flatten().collect();
        if parsed.is_empty() {
            return Err(Error::Invalid(rows.errors));
        }
        self.check_available()?;
        let checked = check_events(
            &parsed,
            self.clock.now_ms(),
            self.config.future_tolerance_ms,
            &self.config.inventory,
        );
        let CheckedEvents {
            events,
            rebooked,
            refused,
        } = match checked {
            Ok(c) => c,
            Err(Error::Invalid(errors)) => {
                let mut errors: Vec<RowError> = (rows.errors.into_iter())
                    .chain(in_batch(errors, &kept))
                    .collect();
                errors.sort_by_key(|e| e.row);
                return Err(Error::Invalid(errors));
            }
            Err(e) => return Err(e),
        };
        let refused = refused_in_batch(sent, &kept, (rows.errors, rows.total), refused);
        let told = |outcome: IngestOutcome| {
            Ok(EventsIngested {
                outcome,
                refused: refused.clone(),
                sent,
            })
        };
        if rebooked > 0 {
            tracing::warn!(
                source,
                rebooked,
                "job events of tenants the config does not define booked to the platform account"
            );
        }
        let batch = job_events_to_batch(&events)?;
        let key = (RecordKind::JobEvents, source.to_owned());
        if let Some(seq) = seq {
            match lock(&self.seen).entry(key.clone()).or_default().claim(seq) {
                SeqState::Claimed => {}
                SeqState::InFlight | SeqState::Stored(_) => {
                    // The first copy may still be on its way to disk; answer once it is there.
                    if let Some(wal) = &self.wal {
                        wal.sync_all()?;
                    }
                    return told(IngestOutcome::Duplicate);
                }
            }
        }
        let settle = |stored: bool| {
            if let (Some(seq), Some(window)) = (seq, lock(&self.seen).get_mut(&key)) {
                window.settle(seq, stored.then_some(None));
            }
        };
        let record = Record {
            batch: &batch,
            ipc: None,
        };
        let position = {
            let _gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let position = match self.log(record, RecordKind::JobEvents, source, seq.unwrap_or(0)) {
                Ok(p) => p,
                Err(e) => {
                    settle(false);
                    return Err(e);
                }
            };
            if let Err(e) = self.apply(RecordKind::JobEvents, &batch) {
                self.fail(&e);
                return Err(e);
            }
            settle(true);
            position
        };
        if let (Some(wal), Some(position)) = (&self.wal, position) {
            wal.sync(position).inspect_err(|e| self.fail(e))?;
        }
        told(IngestOutcome::rows(batch.num_rows()))
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
        let mut coverage = lock(&self.coverage);
        // Rows older than raw retention are refused: their stretches need not be kept.
        coverage.forget_before(self.clock.now_ms() - self.config.max_age_ms() - 86_400_000);
        checkpoint.coverage = coverage.clone();
        checkpoint
    }
}

/// The node of a samples window key (`node` or `node@epoch`).
fn node_of(source: &str) -> &str {
    source.split_once('@').map_or(source, |(node, _)| node)
}

/// Before a node's new epoch is followed, forgets its epoch heard from longest ago once it
/// has [`EPOCHS_PER_NODE`].
fn forget_oldest_epoch(seen: &mut HashMap<WindowKey, SeqWindow>, node: &str) {
    let of_node: Vec<(&WindowKey, i64)> = seen
        .iter()
        .filter(|((kind, source), _)| *kind == RecordKind::Samples && node_of(source) == node)
        .map(|(k, w)| (k, w.last_seen_ms))
        .collect();
    if of_node.len() < EPOCHS_PER_NODE {
        return;
    }
    if let Some(oldest) = of_node
        .iter()
        .min_by_key(|(_, t)| *t)
        .map(|(k, _)| (*k).clone())
    {
        seen.remove(&oldest);
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
    fn under_platform_events_of_unknown_tenants_are_rebooked_and_the_rest_checked_as_ever() {
        use gpuledger_model::inventory::NodeFacts;
        use gpuledger_model::job::JobEventKind;
        let inventory = Inventory::new(
            [(
                "node001".to_owned(),
                NodeFacts {
                    gpus: 8,
                    gpu_model: gpuledger_model::GpuModel::H100Sxm,
                },
            )],
            [("alpha".to_owned(), vec!["train".to_owned()])],
            UnknownTenants::Platform,
        );
        let event = |account: &str, project: Option<&str>| {
            JobEvent::new(
                1_000,
                gpuledger_model::JobId::new("1").unwrap(),
                AccountId::new(account).unwrap(),
                project.map(|p| gpuledger_model::ProjectId::new(p).unwrap()),
                JobEventKind::Submitted,
            )
        };
        let events = [
            event("alpha", Some("train")),
            event("nosuch", Some("x")),
            event("alpha", Some("nosuch")),
        ];
        let checked = check_events(&events, 1_000, 0, &inventory).unwrap();
        let rebooked = checked.rebooked;
        let tenants: Vec<(&str, Option<&str>)> = checked
            .events
            .iter()
            .map(|e| (e.account.as_str(), e.project.as_ref().map(|p| p.as_str())))
            .collect();
        assert_eq!(
            (tenants, rebooked),
            (
                vec![
                    ("alpha", Some("train")),
                    ("platform", None),
                    ("alpha", None)
                ],
                2
            )
        );
        let mut greedy = event("alpha", None);
        greedy.gpus = Some(9);
        let Err(Error::Invalid(errors)) = check_events(&[greedy], 1_000, 0, &inventory) else {
            panic!("9 GPUs on an 8-GPU cluster");
        };
        assert_eq!(errors[0].field, "gpus");
        assert!(check_events(&events, 1_000, 0, &inventory).is_ok());
        assert!(matches!(
            check_events(&events[..1], 1_000, 0, &inventory),
            Ok(CheckedEvents {
                events: Cow::Borrowed(_),
                rebooked: 0,
                refused: None
            })
        ));
        // A bad row among good ones: the good ones are kept, the bad one named.
        let mut mixed = events.to_vec();
        let mut greedy = event("alpha", None);
        greedy.gpus = Some(9);
        mixed.insert(1, greedy);
        let checked = check_events(&mixed, 1_000, 0, &inventory).unwrap();
        assert_eq!(checked.events.len(), 3);
        let refused = checked.refused.unwrap();
        assert_eq!(refused.bad_rows, [false, true, false, false]);
        assert_eq!(
            (refused.errors[0].row, refused.errors[0].field.as_str()),
            (Some(1), "gpus")
        );
    }

    #[test]
    fn sequence_window_tracks_out_of_order_arrivals() {
        let mut w = SeqWindow::default();
        for s in [0, 1, 3, 2, 5] {
            assert!(matches!(w.claim(s), SeqState::Claimed));
            assert!(matches!(w.claim(s), SeqState::InFlight));
            w.settle(s, Some(Some(s + 100)));
        }
        assert!(matches!(w.claim(2), SeqState::Stored(Some(102))));
        assert!(matches!(w.claim(4), SeqState::Claimed));
        w.settle(4, None);
        assert!(!w.contains(4), "a refused batch may be sent again");
        assert_eq!(w.contiguous, Some(3));
        assert!(w.contains(2) && w.contains(5) && !w.contains(4));
    }

    #[test]
    fn a_low_watermark_closes_gaps_the_sender_gave_up() {
        let mut w = SeqWindow::default();
        for s in [0, 1, 5, 6, 9] {
            assert!(matches!(w.claim(s), SeqState::Claimed));
            w.settle(s, Some(None));
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
