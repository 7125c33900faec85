//! Per-row validation of a sample batch. A batch is accepted or refused whole; a refusal names
//! every bad row and field (up to a limit) so an exporter's operator can see what is wrong.

use std::collections::HashSet;
use std::fmt;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    Float32Type, Float64Type, TimestampMillisecondType, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;
use serde::Serialize;

use crate::sample::{col, is_sample_schema};
use crate::time::UnixMillis;
use crate::{AccountId, GpuModel, JobId, ProjectId};

/// Errors reported per batch at most; the count says how many there were.
pub const MAX_REPORTED_ERRORS: usize = 100;

/// One bad value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RowError {
    /// Row in the batch, or `None` for the batch as a whole (wrong schema).
    pub row: Option<usize>,
    pub field: String,
    pub message: String,
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.row {
            Some(r) => write!(f, "row {r}: `{}`: {}", self.field, self.message),
            None => write!(f, "`{}`: {}", self.field, self.message),
        }
    }
}

/// What a batch is checked against.
#[derive(Clone, Debug)]
pub struct Rules<'a> {
    /// The node that pushed the batch: every row must be its own.
    pub node: &'a str,
    /// Nodes the aggregator knows; empty means any.
    pub known_nodes: &'a HashSet<String>,
    pub now_ms: UnixMillis,
    /// How far in the future a sample may start (clock skew).
    pub future_tolerance_ms: i64,
    /// How old a sample may be (raw retention).
    pub max_age_ms: i64,
}

struct Collector {
    errors: Vec<RowError>,
    total: usize,
}

impl Collector {
    fn push(&mut self, row: usize, field: &str, message: String) {
        self.total += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(RowError {
                row: Some(row),
                field: field.to_owned(),
                message,
            });
        }
    }
}

fn check_unit_range(c: &mut Collector, batch: &RecordBatch, name: &str, max: f32) {
    let Some(a) = batch
        .column_by_name(name)
        .and_then(|a| a.as_primitive_opt::<Float32Type>())
    else {
        return;
    };
    if a.null_count() == 0 && a.values().iter().all(|v| (0.0..=max).contains(v)) {
        return; // the common case, checked without branching per row
    }
    for (row, v) in a.iter().enumerate() {
        if let Some(v) = v {
            if v.is_nan() || !(0.0..=max).contains(&v) {
                c.push(row, name, format!("{v} is outside 0-{max}"));
            }
        }
    }
}

/// Checks a batch; `Err` holds the bad rows (at most [`MAX_REPORTED_ERRORS`]) and their count.
pub fn validate_samples(
    batch: &RecordBatch,
    rules: &Rules<'_>,
) -> Result<(), (Vec<RowError>, usize)> {
    if !is_sample_schema(batch.schema_ref()) {
        let got: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        return Err((
            vec![RowError {
                row: None,
                field: "schema".into(),
                message: format!(
                    "not the sample schema (version {}); got [{}]",
                    crate::sample::SAMPLE_SCHEMA_VERSION,
                    got.join(", ")
                ),
            }],
            1,
        ));
    }
    let mut c = Collector {
        errors: Vec::new(),
        total: 0,
    };
    let time = batch.column(0).as_primitive::<TimestampMillisecondType>();
    let interval = batch.column(1).as_primitive::<UInt32Type>();
    for row in 0..batch.num_rows() {
        let t = time.value(row);
        if t > rules.now_ms + rules.future_tolerance_ms {
            c.push(
                row,
                col::TIME,
                format!(
                    "{t} ms is {} s in the future (tolerance {} s); check the node's clock",
                    (t - rules.now_ms) / 1000,
                    rules.future_tolerance_ms / 1000
                ),
            );
        } else if t < rules.now_ms - rules.max_age_ms {
            c.push(
                row,
                col::TIME,
                format!(
                    "{t} ms is older than the raw retention of {} days",
                    rules.max_age_ms / 86_400_000
                ),
            );
        }
        let i = interval.value(row);
        if !(1..=3600).contains(&i) {
            c.push(
                row,
                col::INTERVAL_S,
                format!("{i} is outside 1-3600 seconds"),
            );
        }
    }
    let node = batch.column(2).as_string::<i32>();
    for (row, n) in node.iter().enumerate() {
        let n = n.unwrap_or_default();
        if n != rules.node {
            c.push(
                row,
                col::NODE,
                format!("`{n}` is not the pushing node `{}`", rules.node),
            );
        } else if !rules.known_nodes.is_empty() && !rules.known_nodes.contains(n) {
            c.push(
                row,
                col::NODE,
                format!("`{n}` is not a node of this cluster"),
            );
        }
    }
    check_text(&mut c, batch, col::GPU_MODEL, |s| {
        s.parse::<GpuModel>().map(|_| ()).map_err(|e| e.to_string())
    });
    check_text(&mut c, batch, col::JOB_ID, |s| {
        JobId::new(s).map(|_| ()).map_err(|e| e.to_string())
    });
    check_text(&mut c, batch, col::ACCOUNT, |s| {
        AccountId::new(s).map(|_| ()).map_err(|e| e.to_string())
    });
    check_text(&mut c, batch, col::PROJECT, |s| {
        ProjectId::new(s).map(|_| ()).map_err(|e| e.to_string())
    });
    let job = batch
        .column_by_name(col::JOB_ID)
        .map(|a| a.as_string::<i32>());
    let account = batch
        .column_by_name(col::ACCOUNT)
        .map(|a| a.as_string::<i32>());
    if let (Some(job), Some(account)) = (job, account) {
        for row in 0..batch.num_rows() {
            if job.is_valid(row) != account.is_valid(row) {
                c.push(
                    row,
                    col::ACCOUNT,
                    "a job label needs both job_id and account".into(),
                );
            }
        }
    }
    check_unit_range(&mut c, batch, col::GPU_UTIL_PCT, 100.0);
    check_unit_range(&mut c, batch, col::SM_ACTIVE, 1.0);
    check_unit_range(&mut c, batch, col::TENSOR_ACTIVE, 1.0);
    check_unit_range(&mut c, batch, col::DRAM_ACTIVE, 1.0);
    check_unit_range(&mut c, batch, col::POWER_W, 10_000.0);
    let used = batch
        .column_by_name(col::MEM_USED_BYTES)
        .map(|a| a.as_primitive::<UInt64Type>());
    let total = batch
        .column_by_name(col::MEM_TOTAL_BYTES)
        .map(|a| a.as_primitive::<UInt64Type>());
    if let (Some(used), Some(total)) = (used, total) {
        for row in 0..batch.num_rows() {
            if used.is_valid(row) && total.is_valid(row) && used.value(row) > total.value(row) {
                c.push(
                    row,
                    col::MEM_USED_BYTES,
                    format!(
                        "{} exceeds mem_total_bytes {}",
                        used.value(row),
                        total.value(row)
                    ),
                );
            }
        }
    }
    if let Some(energy) = batch
        .column_by_name(col::ENERGY_J)
        .map(|a| a.as_primitive::<Float64Type>())
    {
        for (row, e) in energy.iter().enumerate() {
            if let Some(e) = e {
                if !e.is_finite() || e < 0.0 {
                    c.push(
                        row,
                        col::ENERGY_J,
                        format!("{e} is not a non-negative energy"),
                    );
                }
            }
        }
    }
    check_against_model(&mut c, batch);
    if c.total == 0 {
        Ok(())
    } else {
        Err((c.errors, c.total))
    }
}

/// What the row's GPU model can report: its SM clock up to the maximum boost, its memory up
/// to the device's (with 2% for drivers that count it differently).
fn check_against_model(c: &mut Collector, batch: &RecordBatch) {
    let Some(models) = batch
        .column_by_name(col::GPU_MODEL)
        .map(|a| a.as_string::<i32>())
    else {
        return;
    };
    let clock = batch
        .column_by_name(col::SM_CLOCK_MHZ)
        .map(|a| a.as_primitive::<UInt32Type>());
    let memory: Vec<(&str, &arrow::array::UInt64Array)> =
        [col::MEM_USED_BYTES, col::MEM_TOTAL_BYTES]
            .into_iter()
            .filter_map(|name| {
                batch
                    .column_by_name(name)
                    .map(|a| (name, a.as_primitive::<UInt64Type>()))
            })
            .collect();
    let mut last: Option<(&str, GpuModel)> = None;
    for row in 0..batch.num_rows() {
        if !models.is_valid(row) {
            continue;
        }
        let name = models.value(row);
        let model = match last {
            Some((n, m)) if n == name => m,
            _ => match name.parse::<GpuModel>() {
                Ok(m) => {
                    last = Some((name, m));
                    m
                }
                // Named by the gpu_model check already.
                Err(_) => continue,
            },
        };
        if let Some(clock) = clock {
            if clock.is_valid(row) && clock.value(row) > model.max_sm_clock_mhz() {
                c.push(
                    row,
                    col::SM_CLOCK_MHZ,
                    format!(
                        "{} MHz is above the {name}'s maximum of {} MHz",
                        clock.value(row),
                        model.max_sm_clock_mhz()
                    ),
                );
            }
        }
        let limit = model.memory_bytes() + model.memory_bytes() / 50;
        for (field, values) in &memory {
            if values.is_valid(row) && values.value(row) > limit {
                c.push(
                    row,
                    field,
                    format!(
                        "{} bytes is more than the {name}'s memory ({} bytes)",
                        values.value(row),
                        model.memory_bytes()
                    ),
                );
            }
        }
    }
}

/// Checks each distinct text value of a column once (label columns repeat a few values).
fn check_text(
    c: &mut Collector,
    batch: &RecordBatch,
    name: &str,
    check: impl Fn(&str) -> Result<(), String>,
) {
    let Some(a) = batch.column_by_name(name).map(|a| a.as_string::<i32>()) else {
        return;
    };
    let mut last_ok: Option<&str> = None;
    for (row, v) in a.iter().enumerate() {
        let Some(v) = v else { continue };
        if last_ok == Some(v) {
            continue;
        }
        match check(v) {
            Ok(()) => last_ok = Some(v),
            Err(message) => c.push(row, name, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{SampleBatchBuilder, SampleRow};

    const NOW_MS: i64 = 1_780_000_000_000;

    fn row(gpu_index: u16) -> SampleRow {
        SampleRow {
            time_ms: NOW_MS - 60_000,
            interval_s: 10,
            node: "gpu001".into(),
            gpu_index,
            gpu_uuid: format!("GPU-{gpu_index}"),
            gpu_model: "h100-sxm".into(),
            mig_instance: None,
            job_id: Some("1".into()),
            account: Some("team-b".into()),
            project: None,
            gpu_util_pct: Some(90.0),
            sm_active: None,
            tensor_active: Some(0.4),
            dram_active: None,
            sm_clock_mhz: Some(1755),
            mem_used_bytes: Some(40 << 30),
            mem_total_bytes: Some(81_559 << 20),
            power_w: Some(650.0),
            energy_j: Some(1.0e6),
            xid: None,
        }
    }

    fn errors_of(rows: &[SampleRow]) -> Vec<(Option<usize>, String)> {
        let mut b = SampleBatchBuilder::with_capacity(rows.len());
        for r in rows {
            b.push(r);
        }
        let batch = b.finish().unwrap();
        let nodes = HashSet::new();
        let rules = Rules {
            node: "gpu001",
            known_nodes: &nodes,
            now_ms: NOW_MS,
            future_tolerance_ms: 300_000,
            max_age_ms: 90 * 86_400_000,
        };
        match validate_samples(&batch, &rules) {
            Ok(()) => Vec::new(),
            Err((errors, _)) => errors.into_iter().map(|e| (e.row, e.field)).collect(),
        }
    }

    #[test]
    fn an_honest_row_passes() {
        assert_eq!(errors_of(&[row(0), row(1)]), []);
    }

    #[test]
    fn readings_no_gpu_of_the_model_can_give_are_refused_by_row_and_field() {
        let mut clock = row(1);
        clock.sm_clock_mhz = Some(4_000_000_000);
        let mut energy = row(2);
        energy.energy_j = Some(f64::INFINITY);
        let mut used = row(3);
        used.mem_used_bytes = Some((1 << 63) + 5);
        used.mem_total_bytes = Some(u64::MAX);
        let mut power = row(4);
        power.power_w = Some(f32::INFINITY);
        let got = errors_of(&[row(0), clock, energy, used, power]);
        for want in [
            (Some(1), col::SM_CLOCK_MHZ),
            (Some(2), col::ENERGY_J),
            (Some(3), col::MEM_USED_BYTES),
            (Some(3), col::MEM_TOTAL_BYTES),
            (Some(4), col::POWER_W),
        ] {
            assert!(
                got.contains(&(want.0, want.1.to_owned())),
                "{want:?} not in {got:?}"
            );
        }
        assert!(got.iter().all(|(r, _)| *r != Some(0)), "{got:?}");
    }

    #[test]
    fn an_id_that_would_leave_its_directory_is_refused() {
        let mut dots = row(0);
        dots.account = Some("..".into());
        let mut hidden = row(1);
        hidden.project = Some(".x".into());
        let got = errors_of(&[dots, hidden]);
        assert!(got.contains(&(Some(0), col::ACCOUNT.to_owned())), "{got:?}");
        assert!(got.contains(&(Some(1), col::PROJECT.to_owned())), "{got:?}");
    }
}
