//! What the service reads and sends on its own schedule: the storage scans, the usage feed,
//! and the job events for the aggregator.

use super::*;

use gpuledger_model::event_json::{set_aside, EventBatch};

use crate::aggregator::{PostError, EVENT_SOURCE};

impl Service {
    /// Bytes per account (project `None`: the account's total) and project in the newest scan
    /// of the storage-scan file.
    pub(crate) fn latest_storage_scan_if_due(
        &self,
        inner: &Inner,
        now: UnixSeconds,
    ) -> Option<Vec<(AccountId, Option<ProjectId>, u64)>> {
        let path = self.config.storage_scans.as_ref()?;
        if now.saturating_sub(inner.last_storage_s) < self.config.usage_every.as_secs() as i64 {
            return None;
        }
        let text = std::fs::read_to_string(path).ok()?;
        match parse_scans(&text, &path.display().to_string()) {
            Ok(lines) => Some(latest_scan(&lines)),
            Err(error) => {
                tracing::warn!(%error, "storage scans unreadable; keeping the last figures");
                None
            }
        }
    }

    pub(crate) fn fetch_usage_if_due(&self, now: UnixSeconds) -> Option<BTreeMap<String, f64>> {
        let aggregator = self.aggregator.as_ref()?;
        let last = self.lock().last_usage_s;
        if now.saturating_sub(last) < self.config.usage_every.as_secs() as i64 {
            return None;
        }
        match aggregator.usage() {
            Ok(feed) => Some(
                feed.accounts
                    .into_iter()
                    .map(|(account, usage)| (account, usage.decayed_gpu_hours))
                    .collect(),
            ),
            Err(error) => {
                tracing::warn!(%error, "usage feed unavailable; keeping the last figures");
                None
            }
        }
    }

    /// Sends the batch `seq`; it stays in `sending` until the aggregator acknowledges it, and
    /// is sent again, unchanged, at the next tick.
    pub(crate) fn send_events(&self, events: &[JobEvent], seq: u64) {
        let Some(aggregator) = &self.aggregator else {
            return;
        };
        let sent = aggregator.post_events(seq, events);
        let set_aside = match &sent {
            Err(PostError::Refused { status, answer }) => {
                Some(self.set_aside_events(seq, events, *status, answer))
            }
            _ => None,
        };
        let mut inner = self.lock();
        match (sent, set_aside) {
            (Ok(()), _) | (Err(PostError::Refused { .. }), Some(true))
                if inner.state.event_seq == seq =>
            {
                inner.state.sending.clear();
                inner.state.event_seq = seq + 1;
                inner.touched_events();
            }
            (Err(e), _) => {
                tracing::warn!(error = %e, seq, events = events.len(), "job events not delivered; will retry");
            }
            _ => {}
        }
        if matches!(set_aside, Some(true)) {
            inner.counters.event_batches_refused += 1;
        }
    }

    /// Keeps a batch the aggregator refused for good in `refused-events/<seq>.json` beside the
    /// state, so the batches after it go out; whether it was written (if not, it is sent again).
    fn set_aside_events(&self, seq: u64, events: &[JobEvent], status: u16, answer: &str) -> bool {
        let dir = self.config.dir.join("refused-events");
        let batch = EventBatch::of(EVENT_SOURCE, seq, events);
        match set_aside(&dir, &batch, status, answer) {
            Ok(path) => {
                tracing::error!(seq, events = events.len(), status, %answer, path = %path.display(), "the aggregator refused a batch of job events; it is set aside (mend it or the cluster config and post it again)");
                true
            }
            Err(error) => {
                tracing::error!(seq, %error, "a refused batch of job events could not be set aside; sending it again");
                false
            }
        }
    }

    /// Puts the oldest events of the outbox into the next numbered batch, unless one is still
    /// unacknowledged. Without an aggregator nobody reads them: they are dropped.
    pub(crate) fn batch_events(&self, inner: &mut Inner) {
        if self.aggregator.is_none() {
            if !inner.state.outbox.is_empty() {
                inner.state.outbox.clear();
                inner.touched_events();
            }
            return;
        }
        if inner.state.sending.is_empty() && !inner.state.outbox.is_empty() {
            let n = inner.state.outbox.len().min(MAX_EVENTS_PER_BATCH);
            inner.state.sending = inner.state.outbox.drain(..n).collect();
            inner.touched_events();
        }
    }
}

/// The most events in one batch: about 3 MB of JSON, far under the aggregator's body limit
/// however long it was away.
const MAX_EVENTS_PER_BATCH: usize = 10_000;
