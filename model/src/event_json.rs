//! Job events as JSON, checked field by field so a refusal names the row and the field; and
//! the batch a scheduler or follower posts them in ([`EventBatch`], `POST` to
//! [`EVENTS_PATH`]), which the aggregator reads.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::job::{JobEvent, JobEventKind};

use crate::validate::{RowError, MAX_REPORTED_ERRORS};

/// The route job events are posted to.
pub const EVENTS_PATH: &str = "/api/v1/events";

/// One post of job events: who sent them, the sender's batch number (the aggregator drops a
/// batch it has taken before), and the events, each checked by [`parse_events`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub events: Vec<Value>,
}

impl EventBatch {
    /// The batch `seq` of `source`'s events.
    pub fn of(source: &str, seq: u64, events: &[JobEvent]) -> Self {
        EventBatch {
            source: source.to_owned(),
            seq: Some(seq),
            events: events.iter().map(event_json).collect(),
        }
    }
}

/// The longest `source` a batch may name.
pub const MAX_SOURCE_CHARS: usize = 64;

/// Checks a batch's `source` (the sender's name, the key of its numbered batches): 1 to
/// [`MAX_SOURCE_CHARS`] letters, digits, `.`, `_` or `-`.
pub fn check_source(source: &str) -> Result<(), String> {
    if source.is_empty() || source.chars().count() > MAX_SOURCE_CHARS {
        return Err(format!(
            "must have 1 to {MAX_SOURCE_CHARS} characters, not {}",
            source.chars().count()
        ));
    }
    match source
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!("has {c:?}; use letters, digits, '.', '_' or '-'")),
        None => Ok(()),
    }
}

/// Whether the aggregator's answer `status` to a batch refuses the batch itself (it is not
/// JSON, too large, or names what the cluster config does not have): sending it again cannot
/// succeed. Any other failure (unreachable, a token not yet known, a full disk) is retried.
pub fn refusal_is_final(status: u16) -> bool {
    matches!(status, 400 | 413 | 422)
}

/// Writes a batch the aggregator refused for good as `dir/<seq>.json`, with its answer, so the
/// sender can go on with the next one and nothing is lost: an operator mends the file's
/// `batch` (or the cluster config) and posts it again. Where the aggregator stored the batch's
/// good rows and refused the others (its answer lists them as `refused_rows`), `batch` holds
/// only the refused events, without the sequence number (which is stored): posting it again
/// stores them once. The path written.
pub fn set_aside(
    dir: &std::path::Path,
    batch: &EventBatch,
    status: u16,
    answer: &str,
) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", batch.seq.unwrap_or_default()));
    let answer: Value =
        serde_json::from_str(answer).unwrap_or_else(|_| Value::String(answer.to_owned()));
    let refused_rows: Option<Vec<usize>> = answer
        .get("refused_rows")
        .and_then(|rows| serde_json::from_value(rows.clone()).ok());
    let left = refused_rows.map(|rows| EventBatch {
        source: batch.source.clone(),
        seq: None,
        events: rows
            .iter()
            .filter_map(|row| batch.events.get(*row).cloned())
            .collect(),
    });
    let text = serde_json::to_vec_pretty(&serde_json::json!({
        "status": status,
        "answer": answer,
        "sent_seq": batch.seq,
        "batch": left.as_ref().unwrap_or(batch),
    }))
    .map_err(std::io::Error::other)?;
    crate::durable::replace_file_with_mode(&path, &text, Some(0o600))?;
    Ok(path)
}

/// An event as the API takes it: absent fields left out.
pub fn event_json(ev: &JobEvent) -> Value {
    let mut v = serde_json::to_value(ev).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.retain(|_, value| !value.is_null());
    }
    v
}

const FIELDS: [&str; 12] = [
    "time_ms",
    "job_id",
    "account",
    "project",
    "kind",
    "partition",
    "gpus",
    "allocation",
    "time_limit_s",
    "outcome",
    "exit_code",
    "achieved_flops",
];

struct Row<'a> {
    index: usize,
    object: &'a Map<String, Value>,
    found: &'a mut Found,
    /// Whether this row has a bad field.
    bad: bool,
}

/// The bad values found so far: the first ones, and how many.
#[derive(Debug, Default)]
struct Found {
    errors: Vec<RowError>,
    total: usize,
}

impl Found {
    fn push(&mut self, error: RowError) {
        self.total += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(error);
        }
    }
}

impl Row<'_> {
    fn error(&mut self, field: &str, message: String) {
        self.bad = true;
        self.found.push(RowError {
            row: Some(self.index),
            field: field.to_owned(),
            message,
        });
    }

    fn optional<T: DeserializeOwned>(&mut self, field: &str) -> Option<T> {
        let value = self.object.get(field).filter(|v| !v.is_null())?;
        match T::deserialize(value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.error(field, format!("{e} (got {value})"));
                None
            }
        }
    }

    fn required<T: DeserializeOwned>(&mut self, field: &str) -> Option<T> {
        if self.object.get(field).is_none_or(Value::is_null) {
            self.error(field, "missing".into());
            return None;
        }
        self.optional(field)
    }
}

/// The events of a batch, row by row: each one parsed, or `None` where the row is bad.
#[derive(Debug)]
pub struct EventRows {
    pub events: Vec<Option<JobEvent>>,
    /// The first bad values (at most [`MAX_REPORTED_ERRORS`]), by row and field.
    pub errors: Vec<RowError>,
    /// How many bad values there were.
    pub total: usize,
}

/// Parses every event, each row on its own: a bad one is named and left out.
pub fn parse_event_rows(values: &[Value]) -> EventRows {
    let mut found = Found::default();
    let events = values
        .iter()
        .enumerate()
        .map(|(index, value)| {
            let Some(object) = value.as_object() else {
                found.push(RowError {
                    row: Some(index),
                    field: String::new(),
                    message: format!("an event is a JSON object, got {value}"),
                });
                return None;
            };
            parse_event(&mut Row {
                index,
                object,
                found: &mut found,
                bad: false,
            })
        })
        .collect();
    EventRows {
        events,
        errors: found.errors,
        total: found.total,
    }
}

/// Parses every event; on any error returns the errors found (up to the reporting limit).
pub fn parse_events(values: &[Value]) -> Result<Vec<JobEvent>, Vec<RowError>> {
    let rows = parse_event_rows(values);
    if rows.total == 0 {
        Ok(rows.events.into_iter().flatten().collect())
    } else {
        Err(rows.errors)
    }
}

fn parse_event(row: &mut Row<'_>) -> Option<JobEvent> {
    for key in row.object.keys() {
        if !FIELDS.contains(&key.as_str()) {
            let message = format!("unknown field; known: {}", FIELDS.join(", "));
            row.error(key, message);
        }
    }
    let event = JobEvent {
        time_ms: row.required("time_ms")?,
        job_id: row.required("job_id")?,
        account: row.required("account")?,
        project: row.optional("project"),
        kind: row.required("kind")?,
        partition: row.optional("partition"),
        gpus: row.optional("gpus"),
        allocation: row.optional("allocation"),
        time_limit_s: row.optional("time_limit_s"),
        outcome: row.optional("outcome"),
        exit_code: row.optional("exit_code"),
        achieved_flops: row.optional("achieved_flops"),
    };
    let needs = |kind: JobEventKind| event.kind == kind;
    if needs(JobEventKind::Finished) && event.outcome.is_none() {
        row.error("outcome", "a finished event needs its outcome".into());
    }
    if (needs(JobEventKind::Started) || needs(JobEventKind::Resumed)) && event.gpus.is_none() {
        row.error(
            "gpus",
            "a started or resumed event needs the GPUs it holds".into(),
        );
    }
    match (event.kind, event.achieved_flops) {
        (JobEventKind::FlopsReported, None) => {
            row.error(
                "achieved_flops",
                "a flops_reported event needs its figure".into(),
            );
        }
        (_, Some(f)) if !f.is_finite() || f < 0.0 => {
            row.error("achieved_flops", format!("{f} is not a FLOP/s figure"));
        }
        _ => {}
    }
    if let (Some(gpus), Some(alloc)) = (event.gpus, &event.allocation) {
        if alloc.gpu_count() != gpus {
            row.error(
                "allocation",
                format!("holds {} GPUs but `gpus` says {gpus}", alloc.gpu_count()),
            );
        }
    }
    (!row.bad).then_some(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_bad_field_is_named_with_its_row() {
        let values = vec![
            json!({"time_ms": 0, "job_id": "j1", "account": "team-a", "kind": "submitted", "gpus": 8}),
            json!({"time_ms": "soon", "job_id": "j2", "account": "team-a", "kind": "submitted"}),
            json!({"time_ms": 5, "job_id": "j3", "account": "team-a", "kind": "finished"}),
            json!({"time_ms": 5, "job_id": "j4", "account": "team-a", "kind": "started", "gpus": 2, "allocation": "gpu001:0-3"}),
            json!({"time_ms": 5, "job_id": "j5", "account": "team-a", "kind": "submitted", "colour": "red"}),
        ];
        let errors = parse_events(&values).unwrap_err();
        let named: Vec<(Option<usize>, &str)> =
            errors.iter().map(|e| (e.row, e.field.as_str())).collect();
        assert_eq!(
            named,
            vec![
                (Some(1), "time_ms"),
                (Some(2), "outcome"),
                (Some(3), "allocation"),
                (Some(4), "colour"),
            ]
        );
    }

    #[test]
    fn each_row_parses_on_its_own_and_the_errors_kept_are_bounded() {
        let mut values =
            vec![json!({"time_ms": 0, "job_id": "j1", "account": "team-a", "kind": "submitted"})];
        values.extend((0..500).map(|_| json!({"kind": "nonsense"})));
        values
            .push(json!({"time_ms": 9, "job_id": "j2", "account": "team-a", "kind": "submitted"}));
        let rows = parse_event_rows(&values);
        let parsed: Vec<usize> = (rows.events.iter().enumerate())
            .filter(|(_, e)| e.is_some())
            .map(|(row, _)| row)
            .collect();
        assert_eq!(
            parsed,
            [0, 501],
            "the good rows after many bad ones parse too"
        );
        assert_eq!(rows.errors.len(), MAX_REPORTED_ERRORS);
        assert!(rows.total >= 500, "{}", rows.total);
    }

    #[test]
    fn a_batch_partly_stored_is_set_aside_as_its_refused_events_without_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let batch = EventBatch {
            source: "slurm".into(),
            seq: Some(7),
            events: (0..4).map(|i| json!({"job_id": format!("j{i}")})).collect(),
        };
        let answer = r#"{"errors": [], "refused_rows": [1, 3], "stored_rows": 2}"#;
        let path = set_aside(dir.path(), &batch, 422, answer).unwrap();
        assert_eq!(path, dir.path().join("7.json"));
        let kept: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(kept["sent_seq"], 7);
        assert_eq!(
            kept["batch"],
            json!({"source": "slurm", "events": [{"job_id": "j1"}, {"job_id": "j3"}]})
        );
        // Refused whole: the batch as it was, number and all.
        let path = set_aside(dir.path(), &batch, 422, r#"{"errors": []}"#).unwrap();
        let kept: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(kept["batch"]["seq"], 7);
        assert_eq!(kept["batch"]["events"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn good_events_parse() {
        let values = vec![json!({"time_ms": 1000, "job_id": "j1", "account": "team-a",
            "project": "llm", "kind": "started", "gpus": 4, "allocation": "gpu001:0-3"})];
        let events = parse_events(&values).unwrap();
        assert_eq!(events[0].allocation.as_ref().unwrap().gpu_count(), 4);
        assert_eq!(events[0].kind, JobEventKind::Started);
    }
}
