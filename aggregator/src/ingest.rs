//! The one ingest path: the HTTP endpoint and the demo both call [`Ingestor`]. A batch is
//! validated whole, de-duplicated on (node, sequence number), then stored.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arrow::record_batch::RecordBatch;

use gpuledger_model::job::JobEvent;
use gpuledger_model::time::Clock;

use crate::store::Store;
use crate::validate::{validate_samples, RowError, Rules};
use crate::{Error, Result};

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
    /// This (node, sequence) was already stored; nothing was written.
    Duplicate,
}

/// Sequence numbers stored from one node (all up to `contiguous`, and some above it) and
/// those being stored right now.
#[derive(Debug, Default)]
struct SeqWindow {
    contiguous: Option<u64>,
    above: BTreeSet<u64>,
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

    fn insert(&mut self, seq: u64) {
        self.above.insert(seq);
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

/// Validates, de-duplicates and stores batches.
pub struct Ingestor {
    store: Arc<Store>,
    config: IngestorConfig,
    clock: Arc<dyn Clock>,
    seen: Mutex<HashMap<String, SeqWindow>>,
}

impl std::fmt::Debug for Ingestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingestor")
            .field("store", &self.store)
            .finish()
    }
}

impl Ingestor {
    pub fn new(store: Arc<Store>, config: IngestorConfig, clock: Arc<dyn Clock>) -> Self {
        Ingestor {
            store,
            config,
            clock,
            seen: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Ingests one batch of samples pushed by `node` with sequence number `seq`.
    pub fn ingest_samples(
        &self,
        node: &str,
        seq: u64,
        batch: &RecordBatch,
    ) -> Result<IngestOutcome> {
        // Claimed before the write so a concurrent re-send of the same batch is a duplicate.
        if !self
            .windows()
            .entry(node.to_owned())
            .or_default()
            .claim(seq)
        {
            return Ok(IngestOutcome::Duplicate);
        }
        let result = self.validate_and_store(node, batch);
        if let Some(window) = self.windows().get_mut(node) {
            window.settle(seq, result.is_ok());
        }
        result.map(|rows| IngestOutcome::Accepted { rows })
    }

    fn windows(&self) -> std::sync::MutexGuard<'_, HashMap<String, SeqWindow>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn validate_and_store(&self, node: &str, batch: &RecordBatch) -> Result<usize> {
        let rules = Rules {
            node,
            known_nodes: &self.config.known_nodes,
            now_ms: self.clock.now_ms(),
            future_tolerance_ms: self.config.future_tolerance_ms,
            max_age_ms: i64::from(self.config.raw_retention_days) * 86_400_000,
        };
        validate_samples(batch, &rules)
            .map_err(|(errors, _total): (Vec<RowError>, usize)| Error::Invalid(errors))?;
        self.store.append_samples(batch)?;
        Ok(batch.num_rows())
    }

    /// Ingests job lifecycle events.
    pub fn ingest_job_events(&self, events: &[JobEvent]) -> Result<()> {
        self.store.append_job_events(events)
    }
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
}
