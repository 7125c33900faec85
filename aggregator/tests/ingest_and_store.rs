//! Ingest over real files: a batch survives the Parquet round trip unchanged, a bad batch is
//! refused whole with its rows and fields named, a re-sent batch is stored once.

use std::fs::File;
use std::sync::Arc;

use arrow::compute::concat_batches;
use arrow::record_batch::RecordBatch;
use gpuledger_aggregator::layout::Table;
use gpuledger_aggregator::store::StoreOptions;
use gpuledger_aggregator::{Accepted, Error, IngestOutcome, Ingestor, IngestorConfig, Store};
use gpuledger_model::sample::{sample_schema, SampleBatchBuilder, SampleRow};
use gpuledger_model::time::ManualClock;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const T0: i64 = 1_780_272_000_000; // 2026-06-01T00:00:00Z

fn row(i: usize) -> SampleRow {
    let busy = !i.is_multiple_of(3);
    SampleRow {
        time_ms: T0 + (i as i64 / 8) * 10_000,
        interval_s: 10,
        node: "node001".into(),
        gpu_index: (i % 8) as u16,
        gpu_uuid: format!("GPU-{i:08x}"),
        gpu_model: "h100-sxm".into(),
        mig_instance: i.is_multiple_of(5).then(|| "1g.10gb/7".to_owned()),
        job_id: busy.then(|| format!("{}", 1000 + i % 4)),
        account: busy.then(|| "team-a".to_owned()),
        project: (busy && i.is_multiple_of(2)).then(|| "pretrain".to_owned()),
        gpu_util_pct: Some((i % 101) as f32),
        sm_active: Some(0.5),
        tensor_active: if i.is_multiple_of(7) {
            None
        } else {
            Some(0.25)
        },
        dram_active: Some(0.125),
        sm_clock_mhz: Some(1830),
        mem_used_bytes: Some(1 << 30),
        mem_total_bytes: Some(80 << 30),
        power_w: Some(512.5),
        energy_j: Some(5125.0),
        xid: (i == 13).then_some(79),
    }
}

fn batch(rows: impl Iterator<Item = SampleRow>) -> RecordBatch {
    let mut b = SampleBatchBuilder::with_capacity(64);
    for r in rows {
        b.push(&r);
    }
    b.finish().unwrap()
}

/// Two nodes of eight H100; account team-a with project pretrain.
const CLUSTER: &str = r#"version = 1
[cluster]
name = "t"
[[node_pools]]
name = "p"
prefix = "node"
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
gpu_hour = { h100-sxm = "10.00" }
[[accounts]]
id = "team-a"
name = "A"
weight = 1
projects = [{ id = "pretrain" }]
"#;

fn ingestor(dir: &std::path::Path) -> Ingestor {
    let store = Arc::new(Store::open(dir, StoreOptions::default()).unwrap());
    let config = gpuledger_model::ClusterConfig::from_toml_str(CLUSTER, "t.toml").unwrap();
    Ingestor::new(
        store,
        IngestorConfig::new(gpuledger_model::Inventory::from_config(&config)),
        Arc::new(ManualClock::new(T0 + 3_600_000)),
    )
}

fn accepted(rows: usize) -> IngestOutcome {
    IngestOutcome::Accepted(Accepted {
        rows,
        ..Accepted::default()
    })
}

fn stored_rows_in(dir: &std::path::Path) -> usize {
    read_table(dir, Table::Samples)
        .iter()
        .map(RecordBatch::num_rows)
        .sum()
}

fn read_table(dir: &std::path::Path, table: Table) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut files: Vec<_> = walk(&dir.join(table.dir()));
    files.sort();
    for f in files {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&f).unwrap())
            .unwrap()
            .build()
            .unwrap();
        out.extend(reader.map(|b| b.unwrap()));
    }
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_sample_batch_survives_the_parquet_round_trip_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    let sent = batch((0..200).map(row));
    assert_eq!(
        ing.ingest_samples("node001", 0, &sent).unwrap(),
        accepted(200)
    );
    ing.store().flush().unwrap();
    let stored = read_table(dir.path(), Table::Samples);
    let stored = concat_batches(&sample_schema(), &stored).unwrap();
    assert_eq!(stored, sent);
    assert_eq!(stored.schema().metadata()["gpuledger.schema_version"], "1");
}

#[test]
fn rollups_hold_exactly_the_samples_gpu_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    ing.ingest_samples("node001", 0, &batch((0..400).map(row)))
        .unwrap();
    let stats = ing.store().flush().unwrap();
    assert!(stats.rollup_rows > 0);
    let rollups = read_table(dir.path(), Table::RollupsHourly);
    let total: i64 = rollups
        .iter()
        .map(|b| {
            arrow::compute::sum(
                b.column_by_name("gpu_seconds")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .unwrap(),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(total, 400 * 10);
}

#[test]
fn a_batchs_bad_rows_are_refused_naming_rows_and_fields_and_its_good_rows_stored() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    let mut rows: Vec<SampleRow> = (0..20).map(row).collect();
    rows[3].gpu_util_pct = Some(140.0);
    rows[5].tensor_active = Some(f32::NAN);
    rows[8].mem_used_bytes = Some(100 << 30);
    rows[9].time_ms = T0 + 86_400_000; // a day ahead of the aggregator's clock
    rows[11].node = "node002".into();
    rows[13].account = None; // a job without its account
    let bad = [3, 5, 8, 9, 11, 13];
    let err = ing
        .ingest_samples("node001", 0, &batch(rows.into_iter()))
        .unwrap_err();
    let Error::RowsRefused {
        refusal,
        refused_rows,
        stored_rows,
    } = err
    else {
        panic!("expected RowsRefused, got {err}")
    };
    assert_eq!((refused_rows, stored_rows), (6, 14));
    let named: Vec<(Option<usize>, &str)> = refusal
        .errors
        .iter()
        .map(|e| (e.row, e.field.as_str()))
        .collect();
    for expected in [
        (Some(3), "gpu_util_pct"),
        (Some(5), "tensor_active"),
        (Some(8), "mem_used_bytes"),
        (Some(9), "time"),
        (Some(11), "node"),
        (Some(13), "account"),
    ] {
        assert!(named.contains(&expected), "{expected:?} not in {named:?}");
    }
    ing.store().flush().unwrap();
    assert_eq!(stored_rows_in(dir.path()), 14);
    // The refused rows, corrected, go under a new number; the batch's own is taken.
    let again = batch((0..20).map(row));
    assert!(matches!(
        ing.ingest_samples("node001", 0, &again),
        Err(Error::Conflict { .. })
    ));
    let mended = batch(bad.into_iter().map(row));
    assert_eq!(
        ing.ingest_samples("node001", 1, &mended).unwrap(),
        accepted(6)
    );
    ing.store().flush().unwrap();
    assert_eq!(stored_rows_in(dir.path()), 20);
}

#[test]
fn a_batch_with_no_good_row_is_refused_whole_and_its_number_may_be_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    let mut rows: Vec<SampleRow> = (0..2).map(row).collect();
    rows[0].gpu_util_pct = Some(140.0);
    rows[1].node = "node002".into();
    let err = ing
        .ingest_samples("node001", 0, &batch(rows.into_iter()))
        .unwrap_err();
    assert!(
        matches!(err, Error::Invalid(ref errors) if errors.len() == 2),
        "{err}"
    );
    ing.store().flush().unwrap();
    assert!(read_table(dir.path(), Table::Samples).is_empty());
    let ok = batch((0..2).map(row));
    assert_eq!(ing.ingest_samples("node001", 0, &ok).unwrap(), accepted(2));
}

#[test]
fn a_batch_of_the_wrong_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    let other = RecordBatch::try_from_iter([(
        "x",
        Arc::new(arrow::array::Int32Array::from(vec![1])) as arrow::array::ArrayRef,
    )])
    .unwrap();
    let Err(Error::Invalid(errors)) = ing.ingest_samples("node001", 0, &other) else {
        panic!("expected Invalid")
    };
    assert_eq!(errors[0].field, "schema");
    assert_eq!(errors[0].row, None);
}

#[test]
fn a_re_sent_batch_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let ing = ingestor(dir.path());
    let b = batch((0..50).map(row));
    assert_eq!(ing.ingest_samples("node001", 7, &b).unwrap(), accepted(50));
    assert_eq!(
        ing.ingest_samples("node001", 7, &b).unwrap(),
        IngestOutcome::Duplicate
    );
    ing.store().flush().unwrap();
    let rows: usize = read_table(dir.path(), Table::Samples)
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 50);
}
