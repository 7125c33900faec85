//! Hourly rollups: per job x GPU x hour, exact sums. GPU-seconds are the sum of the samples'
//! interval seconds, so billing from rollups equals billing from raw samples to the second.
//! Each metric carries the seconds it was measured for, so "not measured" never counts as 0.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
    UInt16Array,
};
use arrow::datatypes::{
    DataType, Field, Float32Type, Float64Type, Schema, SchemaRef, TimeUnit,
    TimestampMillisecondType, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use chrono::NaiveDate;

use gpuledger_model::sample::col;
use gpuledger_model::time::{date_of_ms, hour_start_ms, UnixMillis};
use gpuledger_model::GpuModel;

/// Version of the rollup schema.
pub const ROLLUP_SCHEMA_VERSION: &str = "2";

/// The rollup columns holding a key's GPU-seconds in each quarter of its hour (schema 2), so
/// billing cuts an hour exactly where a time-of-use band or a price-book version changes in a
/// zone off UTC by a half or a quarter hour. Files of schema 1 lack them (read as null).
pub const QUARTER_COLUMNS: [&str; 4] = ["q0_seconds", "q1_seconds", "q2_seconds", "q3_seconds"];

pub use gpuledger_model::time::quarter_split;

/// The key of one rollup row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RollupKey {
    pub hour_ms: UnixMillis,
    pub node: String,
    pub gpu_index: u16,
    pub gpu_model: String,
    pub job_id: Option<String>,
    pub account: Option<String>,
    pub project: Option<String>,
}

/// Exact sums over the samples of one key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RollupSums {
    pub gpu_seconds: i64,
    pub samples: i64,
    pub util_pct_sum: f64,
    pub util_seconds: i64,
    pub sm_active_sum: f64,
    pub sm_seconds: i64,
    pub tensor_active_sum: f64,
    pub tensor_seconds: i64,
    /// Tensor activity scaled by SM clock over the clock the peak is rated at.
    pub mfu_proxy_sum: f64,
    pub mfu_seconds: i64,
    pub dram_active_sum: f64,
    pub dram_seconds: i64,
    pub mem_used_byte_seconds: i64,
    pub mem_total_byte_seconds: i64,
    pub energy_j: f64,
    /// GPU-seconds in each quarter of the hour ([`quarter_split`]).
    pub quarter_seconds: [i64; 4],
}

/// Open rows of one batch, at most: past this they are merged and the search starts over, so
/// a batch with thousands of keys costs a bounded search per row.
const MAX_OPEN_ROWS: usize = 64;

/// A rollup key whose strings are still in the batch.
#[derive(Clone, Copy, PartialEq)]
struct BorrowedKey<'a> {
    hour_ms: UnixMillis,
    gpu_index: u16,
    node: &'a str,
    gpu_model: &'a str,
    job_id: Option<&'a str>,
    account: Option<&'a str>,
    project: Option<&'a str>,
}

impl BorrowedKey<'_> {
    fn to_owned(self) -> RollupKey {
        RollupKey {
            hour_ms: self.hour_ms,
            node: self.node.to_owned(),
            gpu_index: self.gpu_index,
            gpu_model: self.gpu_model.to_owned(),
            job_id: self.job_id.map(str::to_owned),
            account: self.account.map(str::to_owned),
            project: self.project.map(str::to_owned),
        }
    }
}

/// One key's sums over the rows of a batch so far, and its GPU model's rated SM clock.
struct OpenRow<'a> {
    key: BorrowedKey<'a>,
    rated: f64,
    sums: RollupSums,
}

impl<'a> OpenRow<'a> {
    fn new(key: BorrowedKey<'a>) -> Self {
        let rated = key
            .gpu_model
            .parse::<GpuModel>()
            .map_or(f64::NAN, |m| f64::from(m.rated_sm_clock_mhz()));
        OpenRow {
            key,
            rated,
            sums: RollupSums::default(),
        }
    }
}

/// Accumulates rollups from sample batches.
#[derive(Debug, Default)]
pub struct RollupAccumulator {
    rows: HashMap<RollupKey, RollupSums>,
}

fn opt_str(a: &StringArray, i: usize) -> Option<&str> {
    a.is_valid(i).then(|| a.value(i))
}

impl RollupAccumulator {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Adds a validated sample batch. Samples never straddle an hour in gpuledger's exporters
    /// (they cut intervals at the hour); one that did would be counted in its start hour.
    pub fn add(&mut self, batch: &RecordBatch) {
        let time = batch.column(0).as_primitive::<TimestampMillisecondType>();
        let interval = batch.column(1).as_primitive::<UInt32Type>();
        let node = batch.column(2).as_string::<i32>();
        let gpu = batch.column(3).as_primitive::<UInt16Type>();
        let model = batch.column(5).as_string::<i32>();
        let job = batch.column(7).as_string::<i32>();
        let account = batch.column(8).as_string::<i32>();
        let project = batch.column(9).as_string::<i32>();
        let f32col = |name: &str| {
            batch
                .column_by_name(name)
                .map(|a| a.as_primitive::<Float32Type>().clone())
        };
        let (Some(util), Some(sm), Some(tensor), Some(dram)) = (
            f32col(col::GPU_UTIL_PCT),
            f32col(col::SM_ACTIVE),
            f32col(col::TENSOR_ACTIVE),
            f32col(col::DRAM_ACTIVE),
        ) else {
            return;
        };
        let clock = batch.column(14).as_primitive::<UInt32Type>();
        let used = batch.column(15).as_primitive::<UInt64Type>();
        let total = batch.column(16).as_primitive::<UInt64Type>();
        let energy = batch.column(18).as_primitive::<Float64Type>();

        // Batches come time-major (every GPU of a node at one time, then the next time), so
        // consecutive rows belong to different keys: each key of the batch is summed in an
        // open row, found by a short search, and the key's strings are copied once per batch.
        let mut open: Vec<OpenRow<'_>> = Vec::new();
        let mut last = 0;
        for i in 0..batch.num_rows() {
            let key = BorrowedKey {
                hour_ms: hour_start_ms(time.value(i)),
                gpu_index: gpu.value(i),
                node: node.value(i),
                gpu_model: model.value(i),
                job_id: opt_str(job, i),
                account: opt_str(account, i),
                project: opt_str(project, i),
            };
            let found = match open.get(last) {
                Some(row) if row.key == key => Some(last),
                _ => open.iter().position(|row| row.key == key),
            };
            last = match found {
                Some(slot) => slot,
                None => {
                    if open.len() == MAX_OPEN_ROWS {
                        for row in open.drain(..) {
                            self.merge(row.key.to_owned(), row.sums);
                        }
                    }
                    open.push(OpenRow::new(key));
                    open.len() - 1
                }
            };
            let OpenRow { rated, sums, .. } = &mut open[last];
            let rated = *rated;
            let secs = i64::from(interval.value(i));
            let s = secs as f64;
            sums.gpu_seconds += secs;
            let quarters = quarter_split(time.value(i) - hour_start_ms(time.value(i)), secs);
            for (q, add) in sums.quarter_seconds.iter_mut().zip(quarters) {
                *q += add;
            }
            sums.samples += 1;
            if util.is_valid(i) {
                sums.util_pct_sum += f64::from(util.value(i)) * s;
                sums.util_seconds += secs;
            }
            if sm.is_valid(i) {
                sums.sm_active_sum += f64::from(sm.value(i)) * s;
                sums.sm_seconds += secs;
            }
            if tensor.is_valid(i) {
                let t = f64::from(tensor.value(i));
                sums.tensor_active_sum += t * s;
                sums.tensor_seconds += secs;
                if clock.is_valid(i) && rated.is_finite() {
                    sums.mfu_proxy_sum += t * f64::from(clock.value(i)) / rated * s;
                    sums.mfu_seconds += secs;
                }
            }
            if dram.is_valid(i) {
                sums.dram_active_sum += f64::from(dram.value(i)) * s;
                sums.dram_seconds += secs;
            }
            if used.is_valid(i) && total.is_valid(i) {
                sums.mem_used_byte_seconds += used.value(i) as i64 * secs;
                sums.mem_total_byte_seconds += total.value(i) as i64 * secs;
            }
            if energy.is_valid(i) {
                sums.energy_j += energy.value(i);
            }
        }
        for row in open {
            self.merge(row.key.to_owned(), row.sums);
        }
    }

    /// Adds everything another accumulator holds.
    pub fn absorb(&mut self, other: RollupAccumulator) {
        for (key, sums) in other.rows {
            self.merge(key, sums);
        }
    }

    fn merge(&mut self, key: RollupKey, add: RollupSums) {
        let e = self.rows.entry(key).or_default();
        e.gpu_seconds += add.gpu_seconds;
        e.samples += add.samples;
        e.util_pct_sum += add.util_pct_sum;
        e.util_seconds += add.util_seconds;
        e.sm_active_sum += add.sm_active_sum;
        e.sm_seconds += add.sm_seconds;
        e.tensor_active_sum += add.tensor_active_sum;
        e.tensor_seconds += add.tensor_seconds;
        e.mfu_proxy_sum += add.mfu_proxy_sum;
        e.mfu_seconds += add.mfu_seconds;
        e.dram_active_sum += add.dram_active_sum;
        e.dram_seconds += add.dram_seconds;
        e.mem_used_byte_seconds += add.mem_used_byte_seconds;
        e.mem_total_byte_seconds += add.mem_total_byte_seconds;
        e.energy_j += add.energy_j;
        for (q, add) in e.quarter_seconds.iter_mut().zip(add.quarter_seconds) {
            *q += add;
        }
    }

    /// Takes everything accumulated, as one sorted batch per UTC day.
    pub fn drain_by_date(&mut self) -> Result<Vec<(NaiveDate, RecordBatch)>, ArrowError> {
        let mut rows: Vec<(RollupKey, RollupSums)> = self.rows.drain().collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        let mut start = 0;
        while start < rows.len() {
            let date = date_of_ms(rows[start].0.hour_ms);
            let end = start + rows[start..].partition_point(|(k, _)| date_of_ms(k.hour_ms) == date);
            out.push((date, rollup_batch(&rows[start..end])?));
            start = end;
        }
        Ok(out)
    }
}

/// The Arrow schema of the hourly rollup table.
pub fn rollup_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
            let mut fields = vec![
                Field::new("hour", ts, false),
                Field::new("node", DataType::Utf8, false),
                Field::new("gpu_index", DataType::UInt16, false),
                Field::new("gpu_model", DataType::Utf8, false),
                Field::new("job_id", DataType::Utf8, true),
                Field::new("account", DataType::Utf8, true),
                Field::new("project", DataType::Utf8, true),
            ];
            for name in ["gpu_seconds", "samples"] {
                fields.push(Field::new(name, DataType::Int64, false));
            }
            for (sum, secs) in [
                ("util_pct_sum", "util_seconds"),
                ("sm_active_sum", "sm_seconds"),
                ("tensor_active_sum", "tensor_seconds"),
                ("mfu_proxy_sum", "mfu_seconds"),
                ("dram_active_sum", "dram_seconds"),
            ] {
                fields.push(Field::new(sum, DataType::Float64, false));
                fields.push(Field::new(secs, DataType::Int64, false));
            }
            fields.push(Field::new("mem_used_byte_seconds", DataType::Int64, false));
            fields.push(Field::new("mem_total_byte_seconds", DataType::Int64, false));
            fields.push(Field::new("energy_j", DataType::Float64, false));
            for name in QUARTER_COLUMNS {
                fields.push(Field::new(name, DataType::Int64, true));
            }
            let meta = [
                ("gpuledger.kind".to_owned(), "rollup_hourly".to_owned()),
                (
                    "gpuledger.schema_version".to_owned(),
                    ROLLUP_SCHEMA_VERSION.to_owned(),
                ),
            ]
            .into();
            Arc::new(Schema::new_with_metadata(fields, meta))
        })
        .clone()
}

fn rollup_batch(rows: &[(RollupKey, RollupSums)]) -> Result<RecordBatch, ArrowError> {
    let i64s = |f: fn(&RollupSums) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, s)| f(s))))
    };
    let f64s = |f: fn(&RollupSums) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|(_, s)| f(s)),
        ))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(
            TimestampMillisecondArray::from_iter_values(rows.iter().map(|(k, _)| k.hour_ms))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(k, _)| k.node.as_str()),
        )),
        Arc::new(UInt16Array::from_iter_values(
            rows.iter().map(|(k, _)| k.gpu_index),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(k, _)| k.gpu_model.as_str()),
        )),
        Arc::new(
            rows.iter()
                .map(|(k, _)| k.job_id.as_deref())
                .collect::<StringArray>(),
        ),
        Arc::new(
            rows.iter()
                .map(|(k, _)| k.account.as_deref())
                .collect::<StringArray>(),
        ),
        Arc::new(
            rows.iter()
                .map(|(k, _)| k.project.as_deref())
                .collect::<StringArray>(),
        ),
        i64s(|s| s.gpu_seconds),
        i64s(|s| s.samples),
        f64s(|s| s.util_pct_sum),
        i64s(|s| s.util_seconds),
        f64s(|s| s.sm_active_sum),
        i64s(|s| s.sm_seconds),
        f64s(|s| s.tensor_active_sum),
        i64s(|s| s.tensor_seconds),
        f64s(|s| s.mfu_proxy_sum),
        i64s(|s| s.mfu_seconds),
        f64s(|s| s.dram_active_sum),
        i64s(|s| s.dram_seconds),
        i64s(|s| s.mem_used_byte_seconds),
        i64s(|s| s.mem_total_byte_seconds),
        f64s(|s| s.energy_j),
        i64s(|s| s.quarter_seconds[0]),
        i64s(|s| s.quarter_seconds[1]),
        i64s(|s| s.quarter_seconds[2]),
        i64s(|s| s.quarter_seconds[3]),
    ];
    RecordBatch::try_new(rollup_schema(), columns)
}

/// A rollup batch of an older schema in the current one: columns it lacks (the quarters of
/// schema 1) are null.
pub fn to_current_schema(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let schema = rollup_schema();
    if batch.schema().fields() == schema.fields() {
        return Ok(batch.clone());
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => Ok(Arc::clone(c)),
            None if f.is_nullable() => Ok(arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
            None => Err(ArrowError::SchemaError(format!(
                "rollup file lacks column `{}`",
                f.name()
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};

    /// 100 GPUs (more than the open rows a batch keeps), sampled time-major over an hour
    /// boundary, two jobs and an idle GPU, in two batches: every key's sums equal a sum per
    /// key over the rows.
    #[test]
    fn sums_per_key_equal_the_rows_in_time_major_batches_with_many_keys() {
        let hour = 1_780_272_000_000; // 2026-06-01T00:00:00Z
        let row = |t: i64, gpu: u16| SampleRow {
            time_ms: hour - 20_000 + t * 10_000,
            interval_s: 10,
            node: "node001".into(),
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{gpu}"),
            gpu_model: "h100-sxm".into(),
            job_id: (gpu != 99).then(|| format!("{}", 1000 + gpu / 50)),
            account: (gpu != 99).then(|| "team-a".into()),
            gpu_util_pct: Some(f32::from(gpu) / 2.0 + t as f32),
            tensor_active: Some(0.5),
            sm_clock_mhz: Some(1830), // the H100 SXM's rated clock: the proxy is the activity
            ..SampleRow::default()
        };
        let mut expected: HashMap<(i64, u16), (i64, i64, f64)> = HashMap::new();
        let mut acc = RollupAccumulator::default();
        for times in [0..3, 3..5] {
            let mut builder = SampleBatchBuilder::with_capacity(500);
            for t in times {
                for gpu in 0..100 {
                    let r = row(t, gpu);
                    let e = expected.entry((hour_start_ms(r.time_ms), gpu)).or_default();
                    e.0 += 10;
                    e.1 += 1;
                    e.2 += f64::from(r.gpu_util_pct.unwrap_or_default()) * 10.0;
                    builder.push(&r);
                }
            }
            acc.add(&builder.finish().unwrap());
        }
        assert_eq!(acc.len(), expected.len(), "one rollup row per GPU and hour");
        for (key, sums) in &acc.rows {
            let (seconds, samples, util) = expected[&(key.hour_ms, key.gpu_index)];
            assert_eq!(
                (sums.gpu_seconds, sums.samples),
                (seconds, samples),
                "{key:?}"
            );
            assert!((sums.util_pct_sum - util).abs() < 1e-9, "{key:?}");
            assert_eq!(key.job_id.is_none(), key.gpu_index == 99);
            assert!(
                (sums.mfu_proxy_sum - 0.5 * seconds as f64).abs() < 1e-9,
                "{key:?}"
            );
        }
    }
}
