//! Advance reservations in the live service: placed by the scheduler, kept in the state, and
//! written for billing ([`gpuledger_model::billed_reservations`]).

use super::*;

impl Service {
    pub fn reservations(&self) -> Vec<ReservationEntry> {
        self.lock().state.reservations.clone()
    }

    /// Adds an advance reservation and writes the reservations billing reads.
    pub fn reserve(&self, entry: ReservationEntry) -> Result<ReservationEntry> {
        let mut inner = self.lock();
        let placed = inner.sched.add_reservation(entry.to_request())?;
        let mut entry = entry;
        entry.nodes = None;
        entry.node_names = placed
            .nodes
            .iter()
            .map(|n| inner.sched.cluster().node_spec(*n).id.clone())
            .collect();
        inner.state.reservations.push(entry.clone());
        inner.dirty = true;
        self.write_billing_reservations(&inner)?;
        Ok(entry)
    }

    pub fn unreserve(&self, name: &str) -> Result<bool> {
        let mut inner = self.lock();
        let removed = inner.sched.remove_reservation(name).is_some();
        inner.state.reservations.retain(|r| r.name != name);
        inner.dirty = true;
        self.write_billing_reservations(&inner)?;
        Ok(removed)
    }

    /// Billing charges the owner of a reservation for its reserved-but-unused GPU-hours; it
    /// reads them from this file.
    pub(crate) fn write_billing_reservations(&self, inner: &Inner) -> Result<()> {
        let Some(path) = &self.config.billing_reservations else {
            return Ok(());
        };
        let mut billed = BilledReservations::default();
        for r in &inner.state.reservations {
            let (Some(first), Some(owner)) = (r.node_names.first(), r.accounts.first()) else {
                continue;
            };
            let Some(spec) = self.cluster.nodes().into_iter().find(|n| &n.id == first) else {
                continue;
            };
            billed.reservations.push(BilledReservation {
                id: r.name.clone(),
                account: owner.clone(),
                project: None,
                gpu_model: spec.gpu_model,
                gpus: r.node_names.len() as u32 * spec.gpus,
                nodes: r.node_names.clone(),
                start: r.start,
                end: r.end,
            });
        }
        let out = billed.to_toml();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(path, out).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        std::fs::write(
            self.config.dir.join("reservations.toml"),
            reservations_toml(&inner.state.reservations),
        )
        .map_err(|source| Error::Io {
            path: self.config.dir.join("reservations.toml"),
            source,
        })
    }
}
