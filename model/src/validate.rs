//! Per-row validation of a sample batch. A refusal names every bad row and field (up to a
//! limit) so an exporter's operator can see what is wrong, and says which rows are bad: the
//! aggregator stores the others (one bad GPU's row never costs a node its other GPUs' interval).

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    Float32Type, Float64Type, TimestampMillisecondType, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;
use serde::Serialize;

use crate::config::UnknownTenants;
use crate::inventory::{check_mig_instance, Inventory, NodeFacts, PLATFORM_ACCOUNT};
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
    /// What exists: the node, its GPUs and model, the accounts and projects.
    pub inventory: &'a Inventory,
    pub now_ms: UnixMillis,
    /// How far in the future a sample may start (clock skew).
    pub future_tolerance_ms: i64,
    /// How old a sample may be (raw retention).
    pub max_age_ms: i64,
}

/// The bad values of a batch and which rows hold them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The first bad values (at most [`MAX_REPORTED_ERRORS`]).
    pub errors: Vec<RowError>,
    /// How many bad values there were.
    pub total: usize,
    /// Whether each row holds one; empty when the batch as a whole is bad (its schema).
    pub bad_rows: Vec<bool>,
}

impl Refusal {
    /// A refusal of the batch as a whole.
    pub fn whole(error: RowError) -> Self {
        Refusal {
            errors: vec![error],
            total: 1,
            bad_rows: Vec::new(),
        }
    }

    /// Whether no row of the batch may be stored.
    pub fn refuses_every_row(&self) -> bool {
        !self.bad_rows.iter().any(|bad| !bad)
    }

    /// How many rows are bad (every row where the batch as a whole is).
    pub fn bad_row_count(&self, rows: usize) -> usize {
        if self.bad_rows.is_empty() {
            rows
        } else {
            self.bad_rows.iter().filter(|bad| **bad).count()
        }
    }

    /// The batch without its bad rows.
    pub fn good_rows_of(
        &self,
        batch: &RecordBatch,
    ) -> Result<RecordBatch, arrow::error::ArrowError> {
        let keep: arrow::array::BooleanArray = self.bad_rows.iter().map(|bad| Some(!bad)).collect();
        arrow::compute::filter_record_batch(batch, &keep)
    }
}

struct Collector {
    errors: Vec<RowError>,
    total: usize,
    bad_rows: Vec<bool>,
}

impl Collector {
    fn push(&mut self, row: usize, field: &str, message: String) {
        self.total += 1;
        self.bad_rows[row] = true;
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

/// Checks a batch; `Err` names the bad values (at most [`MAX_REPORTED_ERRORS`]), counts them
/// and says which rows hold them.
pub fn validate_samples(batch: &RecordBatch, rules: &Rules<'_>) -> Result<(), Refusal> {
    if !is_sample_schema(batch.schema_ref()) {
        let got: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        return Err(Refusal::whole(RowError {
            row: None,
            field: "schema".into(),
            message: format!(
                "not the sample schema (version {}); got [{}]",
                crate::sample::SAMPLE_SCHEMA_VERSION,
                got.join(", ")
            ),
        }));
    }
    let mut c = Collector {
        errors: Vec::new(),
        total: 0,
        bad_rows: vec![false; batch.num_rows()],
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
    let facts = rules.inventory.node(rules.node);
    for (row, n) in node.iter().enumerate() {
        let n = n.unwrap_or_default();
        if n != rules.node {
            c.push(
                row,
                col::NODE,
                format!("`{n}` is not the pushing node `{}`", rules.node),
            );
        } else if facts.is_none() {
            c.push(
                row,
                col::NODE,
                format!("`{n}` is not a node of this cluster's config"),
            );
        }
    }
    if let Some(facts) = facts {
        check_against_node(&mut c, batch, rules.node, facts);
    }
    check_text(&mut c, batch, col::MIG_INSTANCE, check_mig_instance);
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
    if rules.inventory.unknown_tenants() == UnknownTenants::Refuse {
        check_tenants(&mut c, batch, rules.inventory);
    }
    if c.total == 0 {
        Ok(())
    } else {
        Err(Refusal {
            errors: c.errors,
            total: c.total,
            bad_rows: c.bad_rows,
        })
    }
}

/// Every row's GPU is one the node has: its index below the node's GPU count, its model the
/// node pool's.
fn check_against_node(c: &mut Collector, batch: &RecordBatch, node: &str, facts: NodeFacts) {
    let index = batch.column(3).as_primitive::<UInt16Type>();
    if index.values().iter().any(|i| u32::from(*i) >= facts.gpus) {
        for (row, i) in index.values().iter().enumerate() {
            if u32::from(*i) >= facts.gpus {
                c.push(
                    row,
                    col::GPU_INDEX,
                    format!(
                        "node `{node}` has {} GPUs (0-{}); {i} is none of them",
                        facts.gpus,
                        facts.gpus - 1
                    ),
                );
            }
        }
    }
    let models = batch.column(5).as_string::<i32>();
    let mut last_ok: Option<&str> = None;
    for (row, name) in models.iter().enumerate() {
        let Some(name) = name else { continue };
        if last_ok == Some(name) {
            continue;
        }
        match name.parse::<GpuModel>() {
            Ok(m) if m == facts.gpu_model => last_ok = Some(name),
            Ok(m) => c.push(
                row,
                col::GPU_MODEL,
                format!("node `{node}` has {} GPUs, not {}", facts.gpu_model, m),
            ),
            // Named by the gpu_model check.
            Err(_) => {}
        }
    }
}

/// Every labelled row's account is one the config defines, and its project one of that
/// account's.
fn check_tenants(c: &mut Collector, batch: &RecordBatch, inventory: &Inventory) {
    let account = batch.column(8).as_string::<i32>();
    let project = batch.column(9).as_string::<i32>();
    let mut last_ok: Option<(&str, Option<&str>)> = None;
    for row in 0..batch.num_rows() {
        if !account.is_valid(row) {
            continue;
        }
        let a = account.value(row);
        let p = project.is_valid(row).then(|| project.value(row));
        if last_ok == Some((a, p)) {
            continue;
        }
        if !inventory.has_account(a) {
            c.push(
                row,
                col::ACCOUNT,
                format!("`{a}` is not an account of this cluster's config"),
            );
        } else if let Some(p) = p.filter(|p| !inventory.has_project(a, p)) {
            c.push(
                row,
                col::PROJECT,
                format!("`{p}` is not a project of account `{a}`"),
            );
        } else {
            last_ok = Some((a, p));
        }
    }
}

/// Under [`UnknownTenants::Platform`], the batch with every row of an unknown account booked to
/// [`PLATFORM_ACCOUNT`] (its project dropped) and every unknown project of a known account
/// dropped; `None` where no row needed it. The count is of rows changed.
pub fn rebook_unknown_tenants(
    batch: &RecordBatch,
    inventory: &Inventory,
) -> Result<Option<(RecordBatch, usize)>, arrow::error::ArrowError> {
    if inventory.unknown_tenants() != UnknownTenants::Platform {
        return Ok(None);
    }
    let account = batch.column(8).as_string::<i32>();
    let project = batch.column(9).as_string::<i32>();
    let mut changed = 0;
    let mut accounts = arrow::array::StringBuilder::with_capacity(batch.num_rows(), 0);
    let mut projects = arrow::array::StringBuilder::with_capacity(batch.num_rows(), 0);
    for row in 0..batch.num_rows() {
        let a = account.is_valid(row).then(|| account.value(row));
        let p = project.is_valid(row).then(|| project.value(row));
        let (a2, p2) = match (a, p) {
            (Some(a), _) if !inventory.has_account(a) => (Some(PLATFORM_ACCOUNT), None),
            (Some(a), Some(p)) if !inventory.has_project(a, p) => (Some(a), None),
            other => other,
        };
        if (a2, p2) != (a, p) {
            changed += 1;
        }
        accounts.append_option(a2);
        projects.append_option(p2);
    }
    if changed == 0 {
        return Ok(None);
    }
    let mut columns = batch.columns().to_vec();
    columns[8] = Arc::new(accounts.finish());
    columns[9] = Arc::new(projects.finish());
    RecordBatch::try_new(batch.schema(), columns).map(|b| Some((b, changed)))
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
        errors_under(&batch, &inventory(UnknownTenants::Refuse))
    }

    /// gpu001-gpu002 with 8 H100 each; accounts team-a (project llm) and team-b (no projects).
    fn inventory(unknown: UnknownTenants) -> Inventory {
        let toml = format!(
            r#"version = 1
[cluster]
name = "t"
[[node_pools]]
name = "p"
prefix = "gpu"
count = 2
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = {{ h100-sxm = "10.00" }}
[[accounts]]
id = "team-a"
name = "A"
weight = 1
projects = [{{ id = "llm" }}]
[[accounts]]
id = "team-b"
name = "B"
weight = 1
[telemetry]
unknown_tenants = "{}"
"#,
            match unknown {
                UnknownTenants::Refuse => "refuse",
                UnknownTenants::Platform => "platform",
            }
        );
        Inventory::from_config(&crate::ClusterConfig::from_toml_str(&toml, "t.toml").unwrap())
    }

    fn errors_under(batch: &RecordBatch, inventory: &Inventory) -> Vec<(Option<usize>, String)> {
        let rules = Rules {
            node: "gpu001",
            inventory,
            now_ms: NOW_MS,
            future_tolerance_ms: 300_000,
            max_age_ms: 90 * 86_400_000,
        };
        match validate_samples(batch, &rules) {
            Ok(()) => Vec::new(),
            Err(refusal) => {
                let flagged: Vec<usize> = refusal.errors.iter().filter_map(|e| e.row).collect();
                for (row, bad) in refusal.bad_rows.iter().enumerate() {
                    assert_eq!(
                        *bad,
                        flagged.contains(&row),
                        "row {row}: bad_rows agrees with errors"
                    );
                }
                refusal
                    .errors
                    .into_iter()
                    .map(|e| (e.row, e.field))
                    .collect()
            }
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

    fn batch_of(rows: &[SampleRow]) -> RecordBatch {
        let mut b = SampleBatchBuilder::with_capacity(rows.len());
        for r in rows {
            b.push(r);
        }
        b.finish().unwrap()
    }

    #[test]
    fn a_gpu_the_node_does_not_have_is_refused() {
        let mut past = row(0);
        past.gpu_index = 8;
        let mut far = row(1);
        far.gpu_index = u16::MAX;
        let mut a100 = row(2);
        a100.gpu_model = "a100".into();
        a100.sm_clock_mhz = Some(1400);
        let mut mig = row(3);
        mig.mig_instance = Some("1g.10gb/99".into());
        let got = errors_of(&[past, far, a100, mig, row(5)]);
        assert_eq!(
            got,
            [
                (Some(0), col::GPU_INDEX.to_owned()),
                (Some(1), col::GPU_INDEX.to_owned()),
                (Some(2), col::GPU_MODEL.to_owned()),
                (Some(3), col::MIG_INSTANCE.to_owned()),
            ]
        );
        let mut b = SampleBatchBuilder::with_capacity(1);
        let mut other = row(0);
        other.node = "gpu009".into();
        b.push(&other);
        let rules_node = Rules {
            node: "gpu009",
            inventory: &inventory(UnknownTenants::Refuse),
            now_ms: NOW_MS,
            future_tolerance_ms: 300_000,
            max_age_ms: 90 * 86_400_000,
        };
        let errors = validate_samples(&b.finish().unwrap(), &rules_node)
            .unwrap_err()
            .errors;
        assert_eq!(errors[0].field, col::NODE);
        assert!(errors[0].message.contains("not a node"), "{errors:?}");
    }

    #[test]
    fn tenants_the_config_does_not_define_are_refused_or_booked_to_the_platform() {
        let mut stranger = row(0);
        stranger.account = Some("team-zz".into());
        let mut project = row(1);
        project.account = Some("team-a".into());
        project.project = Some("nope".into());
        let mut known = row(2);
        known.account = Some("team-a".into());
        known.project = Some("llm".into());
        let rows = [stranger, project, known, row(3)];
        assert_eq!(
            errors_of(&rows),
            [
                (Some(0), col::ACCOUNT.to_owned()),
                (Some(1), col::PROJECT.to_owned()),
            ]
        );
        let batch = batch_of(&rows);
        let platform = inventory(UnknownTenants::Platform);
        assert_eq!(errors_under(&batch, &platform), []);
        let (rebooked, changed) = rebook_unknown_tenants(&batch, &platform).unwrap().unwrap();
        assert_eq!(changed, 2);
        let accounts = rebooked.column(8).as_string::<i32>();
        let projects = rebooked.column(9).as_string::<i32>();
        let got: Vec<(Option<&str>, Option<&str>)> = (0..4)
            .map(|i| {
                (
                    accounts.is_valid(i).then(|| accounts.value(i)),
                    projects.is_valid(i).then(|| projects.value(i)),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some(PLATFORM_ACCOUNT), None),
                (Some("team-a"), None),
                (Some("team-a"), Some("llm")),
                (Some("team-b"), None),
            ]
        );
        let refuse = inventory(UnknownTenants::Refuse);
        assert!(rebook_unknown_tenants(&batch, &refuse).unwrap().is_none());
    }
}
