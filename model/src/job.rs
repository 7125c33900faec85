//! Job lifecycle events (submitted, started with its GPUs, checkpointed, preempted, resumed,
//! finished with its outcome) and job-reported achieved FLOP/s, with their Arrow schema. The
//! scheduler emits them; the aggregator stores them beside the samples.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Builder, Int32Builder, StringBuilder,
    TimestampMillisecondBuilder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::{
    DataType, Field, Float64Type, Int32Type, Schema, SchemaRef, TimeUnit, TimestampMillisecondType,
    UInt32Type, UInt64Type,
};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::ids::{AccountId, JobId, ProjectId};
use crate::sample::versioned_metadata;
use crate::time::UnixMillis;

/// Version of the job-event schema.
pub const JOB_EVENT_SCHEMA_VERSION: &str = "1";

/// What happened to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobEventKind {
    Submitted,
    Started,
    Checkpointed,
    Preempted,
    Resumed,
    Finished,
    /// A job-reported figure of achieved FLOP/s (whole job), for MFU.
    FlopsReported,
}

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// Failed with processes killed at its memory limit (Slurm's `OUT_OF_MEMORY`); a failure
    /// wherever successes are counted.
    OutOfMemory,
}

macro_rules! text_enum {
    ($ty:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $text),* }
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($ty::$variant),)*
                    other => Err(format!("unknown {} `{}`; known: {}", stringify!($ty), other, [$($text),*].join(", "))),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(JobEventKind {
    Submitted => "submitted",
    Started => "started",
    Checkpointed => "checkpointed",
    Preempted => "preempted",
    Resumed => "resumed",
    Finished => "finished",
    FlopsReported => "flops_reported",
});

text_enum!(Outcome {
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    Timeout => "timeout",
    NodeFail => "node_fail",
    OutOfMemory => "out_of_memory",
});

/// One job event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    pub time_ms: UnixMillis,
    pub job_id: JobId,
    pub account: AccountId,
    pub project: Option<ProjectId>,
    pub kind: JobEventKind,
    pub partition: Option<String>,
    /// GPUs asked for (submitted) or held (started, resumed).
    pub gpus: Option<u32>,
    /// The GPUs held, for started and resumed.
    pub allocation: Option<Allocation>,
    pub time_limit_s: Option<u64>,
    pub outcome: Option<Outcome>,
    pub exit_code: Option<i32>,
    /// Whole-job achieved FLOP/s, for flops_reported.
    pub achieved_flops: Option<f64>,
}

impl JobEvent {
    /// An event with only the always-present fields set.
    pub fn new(
        time_ms: UnixMillis,
        job_id: JobId,
        account: AccountId,
        project: Option<ProjectId>,
        kind: JobEventKind,
    ) -> Self {
        JobEvent {
            time_ms,
            job_id,
            account,
            project,
            kind,
            partition: None,
            gpus: None,
            allocation: None,
            time_limit_s: None,
            outcome: None,
            exit_code: None,
            achieved_flops: None,
        }
    }
}

/// The Arrow schema of a job-event batch.
pub fn job_event_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
            let fields = vec![
                Field::new("time", ts, false),
                Field::new("job_id", DataType::Utf8, false),
                Field::new("account", DataType::Utf8, false),
                Field::new("project", DataType::Utf8, true),
                Field::new("kind", DataType::Utf8, false),
                Field::new("partition", DataType::Utf8, true),
                Field::new("gpus", DataType::UInt32, true),
                Field::new("allocation", DataType::Utf8, true),
                Field::new("time_limit_s", DataType::UInt64, true),
                Field::new("outcome", DataType::Utf8, true),
                Field::new("exit_code", DataType::Int32, true),
                Field::new("achieved_flops", DataType::Float64, true),
            ];
            Arc::new(Schema::new_with_metadata(
                fields,
                versioned_metadata("job_event", JOB_EVENT_SCHEMA_VERSION),
            ))
        })
        .clone()
}

/// Builds a job-event batch.
pub fn job_events_to_batch(events: &[JobEvent]) -> Result<RecordBatch, ArrowError> {
    let n = events.len();
    let mut time = TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut job_id = StringBuilder::new();
    let mut account = StringBuilder::new();
    let mut project = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut partition = StringBuilder::new();
    let mut gpus = UInt32Builder::with_capacity(n);
    let mut allocation = StringBuilder::new();
    let mut time_limit = UInt64Builder::with_capacity(n);
    let mut outcome = StringBuilder::new();
    let mut exit_code = Int32Builder::with_capacity(n);
    let mut flops = Float64Builder::with_capacity(n);
    for e in events {
        time.append_value(e.time_ms);
        job_id.append_value(e.job_id.as_str());
        account.append_value(e.account.as_str());
        project.append_option(e.project.as_ref().map(|p| p.as_str()));
        kind.append_value(e.kind.as_str());
        partition.append_option(e.partition.as_deref());
        gpus.append_option(e.gpus);
        allocation.append_option(e.allocation.as_ref().map(|a| a.to_string()));
        time_limit.append_option(e.time_limit_s);
        outcome.append_option(e.outcome.map(|o| o.as_str()));
        exit_code.append_option(e.exit_code);
        flops.append_option(e.achieved_flops);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(time.finish()),
        Arc::new(job_id.finish()),
        Arc::new(account.finish()),
        Arc::new(project.finish()),
        Arc::new(kind.finish()),
        Arc::new(partition.finish()),
        Arc::new(gpus.finish()),
        Arc::new(allocation.finish()),
        Arc::new(time_limit.finish()),
        Arc::new(outcome.finish()),
        Arc::new(exit_code.finish()),
        Arc::new(flops.finish()),
    ];
    RecordBatch::try_new(job_event_schema(), columns)
}

/// Why a batch could not be read back as job events.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("row {row}: field `{field}`: {message}")]
pub struct JobEventDecodeError {
    pub row: usize,
    pub field: &'static str,
    pub message: String,
}

/// Reads job events back from a batch of [`job_event_schema`] (by column name, so a projection
/// with the same names works too).
pub fn job_events_from_batch(batch: &RecordBatch) -> Result<Vec<JobEvent>, JobEventDecodeError> {
    let missing = |field: &'static str| JobEventDecodeError {
        row: 0,
        field,
        message: "column missing or of the wrong type".into(),
    };
    let col = |name: &'static str| batch.column_by_name(name).ok_or_else(|| missing(name));
    let time = col("time")?
        .as_primitive_opt::<TimestampMillisecondType>()
        .ok_or_else(|| missing("time"))?;
    let text = |name: &'static str| {
        col(name).and_then(|c| c.as_string_opt::<i32>().ok_or_else(|| missing(name)))
    };
    let job_id = text("job_id")?;
    let account = text("account")?;
    let project = text("project")?;
    let kind = text("kind")?;
    let partition = text("partition")?;
    let allocation = text("allocation")?;
    let outcome = text("outcome")?;
    let gpus = col("gpus")?
        .as_primitive_opt::<UInt32Type>()
        .ok_or_else(|| missing("gpus"))?;
    let time_limit = col("time_limit_s")?
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| missing("time_limit_s"))?;
    let exit_code = col("exit_code")?
        .as_primitive_opt::<Int32Type>()
        .ok_or_else(|| missing("exit_code"))?;
    let flops = col("achieved_flops")?
        .as_primitive_opt::<Float64Type>()
        .ok_or_else(|| missing("achieved_flops"))?;

    let opt_str =
        |a: &arrow::array::StringArray, i: usize| (!a.is_null(i)).then(|| a.value(i).to_owned());
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let bad = |field: &'static str, message: String| JobEventDecodeError {
            row,
            field,
            message,
        };
        let event = JobEvent {
            time_ms: time.value(row),
            job_id: JobId::new(job_id.value(row)).map_err(|e| bad("job_id", e.to_string()))?,
            account: AccountId::new(account.value(row))
                .map_err(|e| bad("account", e.to_string()))?,
            project: opt_str(project, row)
                .map(ProjectId::new)
                .transpose()
                .map_err(|e| bad("project", e.to_string()))?,
            kind: kind.value(row).parse().map_err(|e| bad("kind", e))?,
            partition: opt_str(partition, row),
            gpus: (!gpus.is_null(row)).then(|| gpus.value(row)),
            allocation: opt_str(allocation, row)
                .map(|s| s.parse::<Allocation>())
                .transpose()
                .map_err(|e| bad("allocation", e.to_string()))?,
            time_limit_s: (!time_limit.is_null(row)).then(|| time_limit.value(row)),
            outcome: opt_str(outcome, row)
                .map(|s| s.parse::<Outcome>())
                .transpose()
                .map_err(|e| bad("outcome", e))?,
            exit_code: (!exit_code.is_null(row)).then(|| exit_code.value(row)),
            achieved_flops: (!flops.is_null(row)).then(|| flops.value(row)),
        };
        out.push(event);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_arrow() {
        let mut started = JobEvent::new(
            1_000,
            JobId::new("42").unwrap(),
            AccountId::new("team-a").unwrap(),
            Some(ProjectId::new("pretrain").unwrap()),
            JobEventKind::Started,
        );
        started.gpus = Some(16);
        started.allocation = Some("gpu001:0-7;gpu002:0-7".parse().unwrap());
        let mut finished = JobEvent::new(
            9_000,
            JobId::new("42").unwrap(),
            AccountId::new("team-a").unwrap(),
            None,
            JobEventKind::Finished,
        );
        finished.outcome = Some(Outcome::Failed);
        finished.exit_code = Some(137);
        let events = vec![started, finished];
        let batch = job_events_to_batch(&events).unwrap();
        assert_eq!(job_events_from_batch(&batch).unwrap(), events);
    }
}
