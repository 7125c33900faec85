//! What the steering loop remembers between passes and restarts: the jobs it held (with each
//! one's own comment, to put back), where each hold or release stands, and the jobs an operator
//! released from its hold (never held again). Saved atomically before and after each change,
//! so a crash between the two finishes the change after a restart instead of doubling it or
//! taking someone else's hold for its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Saved before `scontrol hold`: after a crash the hold may or may not have been made.
    Holding,
    Held,
    /// Saved before `scontrol release`.
    Releasing,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldJob {
    /// Slurm's reason name of the quota (`AssocGrpGPUHoursPerDay`, ...).
    pub reason: String,
    /// The job's comment before the hold.
    pub comment: String,
    pub phase: Phase,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteerState {
    #[serde(default)]
    pub holds: BTreeMap<String, HeldJob>,
    #[serde(default)]
    pub overridden: BTreeSet<String>,
    /// Pending jobs last seen waiting for a limit of their own (Slurm's reason `Assoc*` or
    /// `QOS*`), and when: the relief counts a job's wait from then, whatever Slurm's
    /// `eligible_time` says (a hold sets it again at release; a limit may not).
    #[serde(default)]
    pub limited_seen: BTreeMap<String, i64>,
}

impl SteerState {
    /// The state file, or an empty state when there is none yet.
    pub fn load(path: &Path) -> Result<SteerState> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| Error::State(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SteerState::default()),
            Err(e) => Err(Error::io(format!("reading {}", path.display()))(e)),
        }
    }

    /// Replaces the file atomically (written, synced, renamed).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::State(format!("{}: {e}", path.display())))?;
        gpuledger_model::durable::replace_file(path, &text)
            .map_err(Error::io(format!("writing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_reads_back_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steer.json");
        assert_eq!(SteerState::load(&path).unwrap(), SteerState::default());
        let mut s = SteerState::default();
        s.holds.insert(
            "12".into(),
            HeldJob {
                reason: "AssocGrpGPUHoursPerDay".into(),
                comment: "a: b".into(),
                phase: Phase::Holding,
            },
        );
        s.overridden.insert("9".into());
        s.limited_seen.insert("10".into(), 1_700_000_000);
        s.save(&path).unwrap();
        assert_eq!(SteerState::load(&path).unwrap(), s);
        // A state written before `limited_seen` existed reads as having seen no limit.
        std::fs::write(&path, "{\"holds\": {}, \"overridden\": [\"9\"]}").unwrap();
        let older = SteerState::load(&path).unwrap();
        assert!(older.limited_seen.is_empty() && older.overridden.contains("9"));
        std::fs::write(&path, "{\"holds\": 3}").unwrap();
        let e = SteerState::load(&path).unwrap_err().to_string();
        assert!(e.contains("steer.json"), "{e}");
    }
}
