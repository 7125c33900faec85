//! Advance reservations in the live service: placed by the scheduler, kept in the state, and
//! written for billing ([`gpuledger_model::billed_reservations`]).

use super::*;

use gpuledger_model::{GpuModel, NodeId};
use gpuledger_scheduler::reservation::shown_name;

/// How far before now a reservation may say it starts: a client's clock, or the time its
/// request took.
const START_SLACK_S: i64 = 60;

impl Service {
    pub fn reservations(&self) -> Vec<ReservationEntry> {
        self.lock().state.reservations.clone()
    }

    /// Adds an advance reservation and writes the reservations billing reads. Its window may
    /// not lie in the past: billing charges the owner for the reserved GPU-hours nobody used
    /// from `start` on, and before now nothing was held for it.
    pub fn reserve(&self, entry: ReservationEntry) -> Result<ReservationEntry> {
        let now = self.now_s();
        let refuse = |field: &str, message: String| Error::Invalid {
            field: field.into(),
            message,
        };
        if entry.end.timestamp() <= now {
            return Err(refuse("end", format!("{} is not after now", entry.end)));
        }
        if entry.start.timestamp() < now - START_SLACK_S {
            return Err(refuse(
                "start",
                format!(
                    "{} is in the past: a window starts now or later (nothing was held before)",
                    entry.start
                ),
            ));
        }
        let mut inner = self.lock();
        let placed = inner.sched.add_reservation(entry.to_request()?)?;
        let mut entry = entry;
        entry.nodes = None;
        entry.node_names = placed
            .nodes
            .iter()
            .map(|n| inner.sched.cluster().node_spec(*n).id.clone())
            .collect();
        inner.state.reservations.push(entry.clone());
        let change = reservations_change(&inner);
        let ticket = self.record_undoable(&mut inner, change);
        drop(inner);
        let name = shown_name(&entry.name);
        self.commit_or_undo(
            &ticket,
            || format!("reservation `{name}` not made"),
            |_| {
                let mut inner = self.lock();
                inner.sched.remove_reservation(&entry.name);
                inner.state.reservations.retain(|r| r.name != entry.name);
                // Queued: written with the next record or held by the next state.json.
                self.record_reservations(&mut inner);
            },
        )?;
        self.write_billing_reservations_or_later(&mut self.lock());
        Ok(entry)
    }

    pub fn unreserve(&self, name: &str) -> Result<bool> {
        let mut inner = self.lock();
        let removed = inner.sched.remove_reservation(name).is_some();
        if !removed {
            return Ok(false);
        }
        inner.state.reservations.retain(|r| r.name != name);
        let ticket = self.record_reservations(&mut inner);
        drop(inner);
        self.commit(&ticket, || {
            format!(
                "reservation `{}` removed until the scheduler restarts",
                shown_name(name)
            )
        })?;
        self.write_billing_reservations_or_later(&mut self.lock());
        Ok(true)
    }

    fn record_reservations(&self, inner: &mut Inner) -> journal::Ticket {
        let change = reservations_change(inner);
        self.record(inner, change)
    }

    /// The reservations are saved in the state: a failed write of billing's copy is tried
    /// again at every cycle until it succeeds.
    pub(crate) fn write_billing_reservations_or_later(&self, inner: &mut Inner) {
        if let Err(error) = self.write_billing_reservations(inner) {
            tracing::warn!(%error, "billing's reservations file not written; trying again next cycle");
        }
    }

    /// Billing charges the owner of a reservation for its reserved-but-unused GPU-hours; it
    /// reads them from this file.
    /// Written after the state that holds the same reservations (and again at the next
    /// cycle, and at every start, if it fails), so billing never has one the scheduler lost.
    pub(crate) fn write_billing_reservations(&self, inner: &mut Inner) -> Result<()> {
        inner.billing_file_stale = true;
        let Some(path) = &self.config.billing_reservations else {
            inner.billing_file_stale = false;
            return Ok(());
        };
        let mut billed = BilledReservations::default();
        let specs = self.cluster.nodes();
        for r in &inner.state.reservations {
            let Some(owner) = r.accounts.first() else {
                continue;
            };
            // One entry per GPU model, each priced at its own.
            let mut by_model: BTreeMap<GpuModel, (u32, Vec<NodeId>)> = BTreeMap::new();
            for name in &r.node_names {
                if let Some(spec) = specs.iter().find(|n| &n.id == name) {
                    let entry = by_model.entry(spec.gpu_model).or_default();
                    entry.0 += spec.gpus;
                    entry.1.push(name.clone());
                }
            }
            for (gpu_model, (gpus, nodes)) in by_model {
                billed.reservations.push(BilledReservation {
                    id: r.name.clone(),
                    account: owner.clone(),
                    project: None,
                    gpu_model,
                    gpus,
                    nodes,
                    start: r.start,
                    end: r.end,
                });
            }
        }
        let out = billed.to_toml();
        let write = |path: &Path, text: &str| {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            gpuledger_model::durable::replace_file(path, text.as_bytes()).map_err(|source| {
                Error::Io {
                    path: path.to_owned(),
                    source,
                }
            })
        };
        write(path, &out)?;
        write(
            &self.config.dir.join("reservations.toml"),
            &reservations_toml(&inner.state.reservations),
        )?;
        inner.billing_file_stale = false;
        Ok(())
    }
}

/// A change holding every reservation as they are now.
fn reservations_change(inner: &Inner) -> Change {
    Change {
        reservations: Some(inner.state.reservations.clone()),
        ..Change::default()
    }
}
