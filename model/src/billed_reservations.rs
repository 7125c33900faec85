//! The reservations billing charges for, `DATA/reservations.toml`: the live scheduler writes
//! one entry per advance reservation it holds (its owner pays for the reserved GPU-hours left
//! unused), and `gpuledger invoice` reads them. One type for both sides.

use serde::{Deserialize, Serialize};

use crate::config::{locate_lines, parse_toml, ConfigError, FieldError};
use crate::gpu::GpuModel;
use crate::ids::{AccountId, NodeId, ProjectId};

/// The file under a data directory.
pub const BILLED_RESERVATIONS_FILE: &str = "reservations.toml";

/// The file: `[[reservations]]` with RFC 3339 start and end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BilledReservations {
    #[serde(default)]
    pub reservations: Vec<BilledReservation>,
}

/// One reservation: who pays, for how many GPUs of which model, over which window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BilledReservation {
    pub id: String,
    pub account: AccountId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectId>,
    pub gpu_model: GpuModel,
    pub gpus: u32,
    #[serde(default)]
    pub nodes: Vec<NodeId>,
    pub start: chrono::DateTime<chrono::Utc>,
    pub end: chrono::DateTime<chrono::Utc>,
}

impl BilledReservations {
    /// Reads the file; errors name the origin, line and field.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let file: BilledReservations = parse_toml(text, origin)?;
        let mut errors = Vec::new();
        for (i, r) in file.reservations.iter().enumerate() {
            let mut wrong = |field: &str, message: String| {
                errors.push(FieldError {
                    field: format!("reservations[{i}].{field}"),
                    line: None,
                    message,
                })
            };
            if r.end <= r.start {
                wrong("end", "must be after its start".into());
            }
            // A node named twice would be charged twice for the same GPUs.
            let mut seen = std::collections::BTreeSet::new();
            if let Some(twice) = r.nodes.iter().find(|n| !seen.insert(*n)) {
                wrong("nodes", format!("`{twice}` is named twice"));
            }
        }
        if errors.is_empty() {
            return Ok(file);
        }
        locate_lines(text, &mut errors);
        Err(ConfigError::Invalid {
            origin: origin.to_owned(),
            errors,
        })
    }

    /// The file's text, as the scheduler writes it.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!("# Written by `gpuledger scheduler`; billing reads it.\n{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_back_as_written_and_a_window_must_be_forward() {
        let text = "[[reservations]]\nid = \"maint\"\naccount = \"team-b\"\ngpu_model = \"h100-sxm\"\n\
                    gpus = 8\nnodes = [\"gpu001\"]\nstart = \"2026-06-03T00:00:00Z\"\nend = \"2026-06-04T00:00:00Z\"\n";
        let file = BilledReservations::from_toml_str(text, "r.toml").unwrap();
        assert_eq!(file.reservations[0].gpus, 8);
        let again = BilledReservations::from_toml_str(&file.to_toml(), "again").unwrap();
        assert_eq!(again, file);
        let backwards = text.replace("2026-06-04", "2026-06-02");
        let err = BilledReservations::from_toml_str(&backwards, "r.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("reservations[0].end"), "{err}");
        let twice = text.replace("[\"gpu001\"]", "[\"gpu001\", \"gpu001\"]");
        let err = BilledReservations::from_toml_str(&twice, "r.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("reservations[0].nodes") && err.contains("named twice"),
            "{err}"
        );
        let unknown = text.replace("gpus = 8", "gpuz = 8");
        let err = BilledReservations::from_toml_str(&unknown, "r.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("r.toml:5"), "{err}");
    }
}
