//! Nodes whose clocks are off. Each push says when the node sent it (`x-gpuledger-sent-at`, the
//! node's clock); the difference from the aggregator's clock at receipt is the node's offset
//! (plus the network's delay, milliseconds on a cluster network). A node a few seconds or
//! minutes off has its samples moved back onto the aggregator's time line, whole seconds, so
//! every node's hour is the same hour and the bill lands in the right band; a node off by more
//! than [`REFUSE_ABOVE_MS`] is refused with the reason, for its operator to fix its time
//! sync. Either way the offset is in `/metrics` per node.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, TimestampMillisecondArray};
use arrow::datatypes::TimestampMillisecondType;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

use gpuledger_model::sample::col;
use gpuledger_model::time::UnixMillis;

/// Offsets up to this are network delay and clock jitter: left alone.
pub const CORRECT_ABOVE_MS: i64 = 2_000;
/// Offsets past this are refused: a node an hour off needs its clock fixed, not its data moved.
pub const REFUSE_ABOVE_MS: i64 = 3_600_000;

/// What to do with a batch from a node `offset_s` ahead (negative: behind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skew {
    InSync { offset_s: i64 },
    Corrected { offset_s: i64 },
    Refused { offset_s: i64 },
}

impl Skew {
    pub fn offset_s(self) -> i64 {
        match self {
            Skew::InSync { offset_s }
            | Skew::Corrected { offset_s }
            | Skew::Refused { offset_s } => offset_s,
        }
    }
}

/// The node's offset, from when it sent and when the aggregator received.
pub fn assess(sent_at_ms: UnixMillis, received_ms: UnixMillis) -> Skew {
    let offset_ms = sent_at_ms - received_ms;
    // Whole seconds: samples are on whole-second intervals, and so are their times.
    let offset_s = (offset_ms as f64 / 1000.0).round() as i64;
    match offset_ms.abs() {
        d if d <= CORRECT_ABOVE_MS => Skew::InSync { offset_s },
        d if d <= REFUSE_ABOVE_MS => Skew::Corrected { offset_s },
        _ => Skew::Refused { offset_s },
    }
}

/// The batch with every sample time moved by `by_ms`.
pub fn shift_times(batch: &RecordBatch, by_ms: i64) -> Result<RecordBatch, ArrowError> {
    let Some(index) = batch.schema().index_of(col::TIME).ok() else {
        return Err(ArrowError::SchemaError("no `time` column".into()));
    };
    let times = batch
        .column(index)
        .as_primitive_opt::<TimestampMillisecondType>()
        .ok_or_else(|| ArrowError::SchemaError("`time` is not a millisecond timestamp".into()))?;
    let shifted: TimestampMillisecondArray = times
        .iter()
        .map(|t| t.map(|t| t + by_ms))
        .collect::<TimestampMillisecondArray>()
        .with_timezone_opt(times.timezone());
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = Arc::new(shifted);
    RecordBatch::try_new(batch.schema(), columns)
}

/// How a skewed node is described to its operator.
pub fn describe(offset_s: i64) -> String {
    let (n, way) = if offset_s >= 0 {
        (offset_s, "ahead of")
    } else {
        (-offset_s, "behind")
    };
    format!("the node's clock is {n} s {way} the aggregator's")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_offsets_are_left_larger_ones_corrected_huge_ones_refused() {
        assert_eq!(assess(1_500, 0), Skew::InSync { offset_s: 2 });
        assert_eq!(assess(180_400, 0), Skew::Corrected { offset_s: 180 });
        assert_eq!(assess(0, 300_000), Skew::Corrected { offset_s: -300 });
        assert_eq!(assess(7_200_000, 0), Skew::Refused { offset_s: 7200 });
        assert_eq!(
            describe(-300),
            "the node's clock is 300 s behind the aggregator's"
        );
    }
}
