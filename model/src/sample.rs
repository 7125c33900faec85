//! The telemetry sample: one GPU over one interval, with the job and tenant it worked for, and
//! its Arrow schema. Exporters build batches of these; the aggregator validates and stores
//! them. A missing measurement is null ("not measured"), never 0.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    ArrayRef, Float32Builder, Float64Builder, StringBuilder, TimestampMillisecondBuilder,
    UInt16Builder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

use crate::time::UnixMillis;

/// Version of the sample schema, stored in the schema metadata of every batch and file.
pub const SAMPLE_SCHEMA_VERSION: &str = "1";
/// Schema metadata key of the record kind.
pub const META_KIND: &str = "gpuledger.kind";
/// Schema metadata key of the schema version.
pub const META_VERSION: &str = "gpuledger.schema_version";

/// Column names, so no other crate spells them.
pub mod col {
    pub const TIME: &str = "time";
    pub const INTERVAL_S: &str = "interval_s";
    pub const NODE: &str = "node";
    pub const GPU_INDEX: &str = "gpu_index";
    pub const GPU_UUID: &str = "gpu_uuid";
    pub const GPU_MODEL: &str = "gpu_model";
    pub const MIG_INSTANCE: &str = "mig_instance";
    pub const JOB_ID: &str = "job_id";
    pub const ACCOUNT: &str = "account";
    pub const PROJECT: &str = "project";
    pub const GPU_UTIL_PCT: &str = "gpu_util_pct";
    pub const SM_ACTIVE: &str = "sm_active";
    pub const TENSOR_ACTIVE: &str = "tensor_active";
    pub const DRAM_ACTIVE: &str = "dram_active";
    pub const SM_CLOCK_MHZ: &str = "sm_clock_mhz";
    pub const MEM_USED_BYTES: &str = "mem_used_bytes";
    pub const MEM_TOTAL_BYTES: &str = "mem_total_bytes";
    pub const POWER_W: &str = "power_w";
    pub const ENERGY_J: &str = "energy_j";
    pub const XID: &str = "xid";
}

/// The Arrow schema of a sample batch. `time` is the start of the interval the sample covers,
/// `[time, time + interval_s)`; `energy_j` is the energy used in that interval.
pub fn sample_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
            let fields = vec![
                Field::new(col::TIME, ts, false),
                Field::new(col::INTERVAL_S, DataType::UInt32, false),
                Field::new(col::NODE, DataType::Utf8, false),
                Field::new(col::GPU_INDEX, DataType::UInt16, false),
                Field::new(col::GPU_UUID, DataType::Utf8, false),
                Field::new(col::GPU_MODEL, DataType::Utf8, false),
                Field::new(col::MIG_INSTANCE, DataType::Utf8, true),
                Field::new(col::JOB_ID, DataType::Utf8, true),
                Field::new(col::ACCOUNT, DataType::Utf8, true),
                Field::new(col::PROJECT, DataType::Utf8, true),
                Field::new(col::GPU_UTIL_PCT, DataType::Float32, true),
                Field::new(col::SM_ACTIVE, DataType::Float32, true),
                Field::new(col::TENSOR_ACTIVE, DataType::Float32, true),
                Field::new(col::DRAM_ACTIVE, DataType::Float32, true),
                Field::new(col::SM_CLOCK_MHZ, DataType::UInt32, true),
                Field::new(col::MEM_USED_BYTES, DataType::UInt64, true),
                Field::new(col::MEM_TOTAL_BYTES, DataType::UInt64, true),
                Field::new(col::POWER_W, DataType::Float32, true),
                Field::new(col::ENERGY_J, DataType::Float64, true),
                Field::new(col::XID, DataType::UInt32, true),
            ];
            Arc::new(Schema::new_with_metadata(
                fields,
                versioned_metadata("sample", SAMPLE_SCHEMA_VERSION),
            ))
        })
        .clone()
}

pub(crate) fn versioned_metadata(kind: &str, version: &str) -> HashMap<String, String> {
    HashMap::from([
        (META_KIND.to_owned(), kind.to_owned()),
        (META_VERSION.to_owned(), version.to_owned()),
    ])
}

/// One sample as a plain struct, for sources that read one GPU at a time and for tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleRow {
    pub time_ms: UnixMillis,
    pub interval_s: u32,
    pub node: String,
    pub gpu_index: u16,
    pub gpu_uuid: String,
    pub gpu_model: String,
    pub mig_instance: Option<String>,
    pub job_id: Option<String>,
    pub account: Option<String>,
    pub project: Option<String>,
    pub gpu_util_pct: Option<f32>,
    pub sm_active: Option<f32>,
    pub tensor_active: Option<f32>,
    pub dram_active: Option<f32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_w: Option<f32>,
    pub energy_j: Option<f64>,
    pub xid: Option<u32>,
}

/// A sample whose text fields are borrowed, so bulk producers allocate nothing per row.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleRef<'a> {
    pub time_ms: UnixMillis,
    pub interval_s: u32,
    pub node: &'a str,
    pub gpu_index: u16,
    pub gpu_uuid: &'a str,
    pub gpu_model: &'a str,
    pub mig_instance: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub account: Option<&'a str>,
    pub project: Option<&'a str>,
    pub gpu_util_pct: Option<f32>,
    pub sm_active: Option<f32>,
    pub tensor_active: Option<f32>,
    pub dram_active: Option<f32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_w: Option<f32>,
    pub energy_j: Option<f64>,
    pub xid: Option<u32>,
}

impl SampleRow {
    pub fn as_ref(&self) -> SampleRef<'_> {
        SampleRef {
            time_ms: self.time_ms,
            interval_s: self.interval_s,
            node: &self.node,
            gpu_index: self.gpu_index,
            gpu_uuid: &self.gpu_uuid,
            gpu_model: &self.gpu_model,
            mig_instance: self.mig_instance.as_deref(),
            job_id: self.job_id.as_deref(),
            account: self.account.as_deref(),
            project: self.project.as_deref(),
            gpu_util_pct: self.gpu_util_pct,
            sm_active: self.sm_active,
            tensor_active: self.tensor_active,
            dram_active: self.dram_active,
            sm_clock_mhz: self.sm_clock_mhz,
            mem_used_bytes: self.mem_used_bytes,
            mem_total_bytes: self.mem_total_bytes,
            power_w: self.power_w,
            energy_j: self.energy_j,
            xid: self.xid,
        }
    }
}

/// Builds a sample [`RecordBatch`] row by row.
#[derive(Debug)]
pub struct SampleBatchBuilder {
    time: TimestampMillisecondBuilder,
    interval_s: UInt32Builder,
    node: StringBuilder,
    gpu_index: UInt16Builder,
    gpu_uuid: StringBuilder,
    gpu_model: StringBuilder,
    mig_instance: StringBuilder,
    job_id: StringBuilder,
    account: StringBuilder,
    project: StringBuilder,
    gpu_util_pct: Float32Builder,
    sm_active: Float32Builder,
    tensor_active: Float32Builder,
    dram_active: Float32Builder,
    sm_clock_mhz: UInt32Builder,
    mem_used_bytes: UInt64Builder,
    mem_total_bytes: UInt64Builder,
    power_w: Float32Builder,
    energy_j: Float64Builder,
    xid: UInt32Builder,
    rows: usize,
}

impl SampleBatchBuilder {
    pub fn with_capacity(rows: usize) -> Self {
        SampleBatchBuilder {
            time: TimestampMillisecondBuilder::with_capacity(rows).with_timezone("UTC"),
            interval_s: UInt32Builder::with_capacity(rows),
            node: StringBuilder::with_capacity(rows, rows * 8),
            gpu_index: UInt16Builder::with_capacity(rows),
            gpu_uuid: StringBuilder::with_capacity(rows, rows * 40),
            gpu_model: StringBuilder::with_capacity(rows, rows * 8),
            mig_instance: StringBuilder::new(),
            job_id: StringBuilder::with_capacity(rows, rows * 8),
            account: StringBuilder::with_capacity(rows, rows * 8),
            project: StringBuilder::with_capacity(rows, rows * 8),
            gpu_util_pct: Float32Builder::with_capacity(rows),
            sm_active: Float32Builder::with_capacity(rows),
            tensor_active: Float32Builder::with_capacity(rows),
            dram_active: Float32Builder::with_capacity(rows),
            sm_clock_mhz: UInt32Builder::with_capacity(rows),
            mem_used_bytes: UInt64Builder::with_capacity(rows),
            mem_total_bytes: UInt64Builder::with_capacity(rows),
            power_w: Float32Builder::with_capacity(rows),
            energy_j: Float64Builder::with_capacity(rows),
            xid: UInt32Builder::with_capacity(rows),
            rows: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn push(&mut self, r: &SampleRow) {
        self.push_ref(&r.as_ref());
    }

    pub fn push_ref(&mut self, r: &SampleRef<'_>) {
        self.time.append_value(r.time_ms);
        self.interval_s.append_value(r.interval_s);
        self.node.append_value(r.node);
        self.gpu_index.append_value(r.gpu_index);
        self.gpu_uuid.append_value(r.gpu_uuid);
        self.gpu_model.append_value(r.gpu_model);
        self.mig_instance.append_option(r.mig_instance);
        self.job_id.append_option(r.job_id);
        self.account.append_option(r.account);
        self.project.append_option(r.project);
        self.gpu_util_pct.append_option(r.gpu_util_pct);
        self.sm_active.append_option(r.sm_active);
        self.tensor_active.append_option(r.tensor_active);
        self.dram_active.append_option(r.dram_active);
        self.sm_clock_mhz.append_option(r.sm_clock_mhz);
        self.mem_used_bytes.append_option(r.mem_used_bytes);
        self.mem_total_bytes.append_option(r.mem_total_bytes);
        self.power_w.append_option(r.power_w);
        self.energy_j.append_option(r.energy_j);
        self.xid.append_option(r.xid);
        self.rows += 1;
    }

    /// Finishes the batch and resets the builder.
    pub fn finish(&mut self) -> Result<RecordBatch, ArrowError> {
        self.rows = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.time.finish()),
            Arc::new(self.interval_s.finish()),
            Arc::new(self.node.finish()),
            Arc::new(self.gpu_index.finish()),
            Arc::new(self.gpu_uuid.finish()),
            Arc::new(self.gpu_model.finish()),
            Arc::new(self.mig_instance.finish()),
            Arc::new(self.job_id.finish()),
            Arc::new(self.account.finish()),
            Arc::new(self.project.finish()),
            Arc::new(self.gpu_util_pct.finish()),
            Arc::new(self.sm_active.finish()),
            Arc::new(self.tensor_active.finish()),
            Arc::new(self.dram_active.finish()),
            Arc::new(self.sm_clock_mhz.finish()),
            Arc::new(self.mem_used_bytes.finish()),
            Arc::new(self.mem_total_bytes.finish()),
            Arc::new(self.power_w.finish()),
            Arc::new(self.energy_j.finish()),
            Arc::new(self.xid.finish()),
        ];
        RecordBatch::try_new(sample_schema(), columns)
    }
}

/// True when `schema` has the sample schema's fields (names, types, nullability), whatever its
/// metadata says. Readers use this to refuse a batch of the wrong shape.
pub fn is_sample_schema(schema: &Schema) -> bool {
    let expected = sample_schema();
    schema.fields().len() == expected.fields().len()
        && schema.fields().iter().zip(expected.fields()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && (b.is_nullable() || !a.is_nullable())
        })
}
