//! What the service reads and sends on its own schedule: the storage scans, the usage feed,
//! and the job events for the aggregator.

use super::*;

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

    /// Sends events; on failure they go back to the outbox and are sent again next tick.
    pub(crate) fn send_events(&self, events: Vec<JobEvent>, seq: u64) -> Result<()> {
        let Some(aggregator) = &self.aggregator else {
            return Ok(());
        };
        let sent = aggregator.post_events(seq, &events);
        let mut inner = self.lock();
        match sent {
            Ok(_) => {
                inner.state.event_seq = seq + 1;
                inner.dirty = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, events = events.len(), "job events not delivered; will retry");
                let mut back = events;
                back.append(&mut inner.state.outbox);
                inner.state.outbox = back;
            }
        }
        Ok(())
    }
}
