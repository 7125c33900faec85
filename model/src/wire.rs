//! Telemetry on the wire: a sample batch travels from exporter to aggregator (and sits in the
//! write-ahead log) as one Arrow IPC stream. The aggregator decodes a body with
//! [`decode_ipc`] and checks it with [`crate::validate::validate_samples`]; both take any
//! bytes a client sends, so both are fuzzed (`fuzz/`).

use arrow::error::ArrowError;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::ipc::{root_as_message, MessageHeader, Precision, TimeUnit, Type};
use arrow::record_batch::RecordBatch;

/// The route a node pushes its batches to (`POST`).
pub const INGEST_PATH: &str = "/api/v1/ingest";
/// The content type of a pushed batch: one Arrow IPC stream.
pub const INGEST_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";
/// Header naming the node that pushed a batch.
pub const NODE_HEADER: &str = "x-gpuledger-node";
/// Header carrying the node's batch sequence number.
pub const SEQ_HEADER: &str = "x-gpuledger-seq";
/// Optional header: the node will never send a sequence number below this again.
pub const LOW_SEQ_HEADER: &str = "x-gpuledger-low-seq";
/// Optional header: the node's clock when it sent the batch (Unix ms), to measure its offset.
pub const SENT_AT_HEADER: &str = "x-gpuledger-sent-at";
/// Optional header: the sender's epoch, a random id its spool took when it was created. A
/// batch is known by (node, epoch, sequence number), so a node reimaged with a fresh spool,
/// numbering from 0 again, is a new sender, not a run of duplicates.
pub const EPOCH_HEADER: &str = "x-gpuledger-epoch";
/// How far above the highest sequence number stored from a sender (or above 0 for a new
/// one) a batch's number may be: an honest spool counts up by one a batch.
pub const MAX_SEQ_AHEAD: u64 = 1 << 32;

/// Checks an epoch: 1 to 64 letters, digits, `-` or `_`.
pub fn check_epoch(epoch: &str) -> Result<(), String> {
    if (1..=64).contains(&epoch.len())
        && epoch
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    {
        Ok(())
    } else {
        Err("must be 1 to 64 letters, digits, '-' or '_'".into())
    }
}

const CONTINUATION: u32 = 0xFFFF_FFFF;

/// Encodes a batch as an Arrow IPC stream.
pub fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() / 2 + 1024);
    let mut w = StreamWriter::try_new(&mut out, &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

/// Decodes an Arrow IPC stream into one batch (several are concatenated). Buffers are
/// validated as they are read, so a hostile body is an error, never a bad batch.
pub fn decode_ipc(bytes: &[u8]) -> Result<RecordBatch, ArrowError> {
    check_messages(bytes)?;
    let reader = StreamReader::try_new(bytes, None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    arrow::compute::concat_batches(&schema, &batches)
}

/// Refuses what Arrow's stream reader would panic on rather than report (arrow-ipc 59; found
/// by the `ingest_samples` fuzz target, regressions in `fuzz/regressions/ingest_samples/`): a
/// buffer outside its message's body or not holding whole elements, a validity bitmap shorter
/// than its column, and a schema whose column types it cannot convert. gpuledger
/// sends flat columns only, so a schema is checked against that short list instead of against
/// every way a nested or exotic type can be malformed. The framing follows the reader's: an
/// optional continuation marker, the metadata length, the flatbuffer `Message`, then
/// `bodyLength` bytes. Whatever else is wrong with a stream is left for the reader to report.
fn check_messages(bytes: &[u8]) -> Result<(), ArrowError> {
    let mut rest = bytes;
    let mut index = 0;
    let mut columns: Vec<Layout> = Vec::new();
    loop {
        let Some(mut len) = take_u32(&mut rest) else {
            return Ok(());
        };
        if len == CONTINUATION {
            let Some(l) = take_u32(&mut rest) else {
                return Ok(());
            };
            len = l;
        }
        // The reader allocates what a length declares before reading it: a body of a few
        // bytes must not make it allocate gigabytes.
        let len = usize::try_from(len as i32)
            .ok()
            .filter(|&l| l <= rest.len())
            .ok_or_else(|| {
                ArrowError::IpcError(format!(
                    "message {index}: {} bytes of metadata where {} remain",
                    len as i32,
                    rest.len()
                ))
            })?;
        if len == 0 {
            return Ok(());
        }
        let (metadata, after) = rest.split_at(len);
        let message = root_as_message(metadata)
            .map_err(|e| ArrowError::IpcError(format!("message {index}: not a message: {e}")))?;
        let body = usize::try_from(message.bodyLength())
            .ok()
            .filter(|&b| b <= after.len())
            .ok_or_else(|| {
                ArrowError::IpcError(format!(
                    "message {index}: a body of {} bytes where {} remain",
                    message.bodyLength(),
                    after.len()
                ))
            })?;
        let refuse = |e: String| ArrowError::IpcError(format!("message {index}: {e}"));
        if let Some(schema) = message.header_as_schema() {
            columns = check_schema(schema).map_err(refuse)?;
        }
        let batch = match message.header_type() {
            MessageHeader::RecordBatch => message.header_as_record_batch(),
            MessageHeader::DictionaryBatch => {
                message.header_as_dictionary_batch().and_then(|d| d.data())
            }
            _ => None,
        };
        for (i, buffer) in batch
            .and_then(|b| b.buffers())
            .into_iter()
            .flatten()
            .enumerate()
        {
            let end = u64::try_from(buffer.offset())
                .ok()
                .zip(u64::try_from(buffer.length()).ok())
                .and_then(|(offset, length)| offset.checked_add(length));
            if end.is_none_or(|end| end > body as u64) {
                return Err(ArrowError::IpcError(format!(
                    "message {index}: buffer {i} (offset {}, length {}) lies outside the body of {body} bytes",
                    buffer.offset(),
                    buffer.length()
                )));
            }
        }
        if let Some(batch) = message.header_as_record_batch() {
            check_buffers(batch, &columns).map_err(refuse)?;
        }
        rest = &after[body..];
        index += 1;
    }
}

/// How a column lies in a record batch's buffers: how many buffers it has, and which of them
/// holds fixed-width elements (values or offsets) of how many bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    buffers: usize,
    elements: Option<(usize, i64)>,
}

impl Layout {
    const fn new(buffers: usize, elements: Option<(usize, i64)>) -> Self {
        Layout { buffers, elements }
    }
}

/// Flat columns of the types gpuledger writes (and their close kin), each fully described;
/// the columns' layouts.
fn check_schema(schema: arrow::ipc::Schema<'_>) -> Result<Vec<Layout>, String> {
    let fields = schema.fields().ok_or("a schema without fields")?;
    let mut columns = Vec::with_capacity(fields.len());
    for (i, field) in fields.iter().enumerate() {
        let name = field.name().unwrap_or_default();
        let refuse = |why: &str| Err(format!("column {i} `{name}`: {why}"));
        if field.dictionary().is_some() {
            return refuse("dictionary-encoded columns are not taken");
        }
        if field.children().is_some_and(|c| !c.is_empty()) {
            return refuse("nested columns are not taken");
        }
        let layout = match field.type_type() {
            Type::Null => Some(Layout::new(0, None)),
            Type::Bool => Some(Layout::new(2, None)),
            Type::Utf8 | Type::Binary => Some(Layout::new(3, Some((1, 4)))),
            Type::LargeUtf8 | Type::LargeBinary => Some(Layout::new(3, Some((1, 8)))),
            Type::Int => field
                .type_as_int()
                .filter(|t| matches!(t.bitWidth(), 8 | 16 | 32 | 64))
                .map(|t| Layout::new(2, Some((1, i64::from(t.bitWidth() / 8))))),
            Type::FloatingPoint => field
                .type_as_floating_point()
                .and_then(|t| match t.precision() {
                    Precision::HALF => Some(2),
                    Precision::SINGLE => Some(4),
                    Precision::DOUBLE => Some(8),
                    _ => None,
                })
                .map(|width| Layout::new(2, Some((1, width)))),
            Type::Timestamp => field
                .type_as_timestamp()
                .filter(|t| (TimeUnit::SECOND.0..=TimeUnit::NANOSECOND.0).contains(&t.unit().0))
                .map(|_| Layout::new(2, Some((1, 8)))),
            other => return refuse(&format!("type {other:?} is not taken (flat columns only)")),
        };
        let Some(layout) = layout else {
            return refuse(&format!("a malformed {:?} type", field.type_type()));
        };
        columns.push(layout);
    }
    Ok(columns)
}

/// A column with nulls needs a validity bitmap as long as the column, and a buffer of values
/// or offsets must hold whole elements: Arrow's reader builds the bitmap before it validates
/// the array and panics on a short one, and it views an offsets buffer as `i32`s with an
/// assertion. Lengths and null counts must not be negative (the reader casts them to `usize`).
fn check_buffers(batch: arrow::ipc::RecordBatch<'_>, columns: &[Layout]) -> Result<(), String> {
    if batch.length() < 0 {
        return Err(format!("a batch of {} rows", batch.length()));
    }
    let (Some(nodes), Some(buffers)) = (batch.nodes(), batch.buffers()) else {
        return Ok(()); // the reader reports what is missing
    };
    let mut first_buffer = 0;
    for (i, (node, layout)) in nodes.iter().zip(columns).enumerate() {
        if node.length() < 0 || node.null_count() < 0 || node.null_count() > node.length() {
            return Err(format!(
                "column {i}: {} nulls in {} rows",
                node.null_count(),
                node.length()
            ));
        }
        if layout.buffers > 0 && node.null_count() > 0 {
            let Some(validity) = buffers.iter().nth(first_buffer) else {
                return Ok(()); // the reader reports the missing buffer
            };
            let needed = (node.length() as u64).div_ceil(8);
            if (validity.length().max(0) as u64) < needed {
                return Err(format!(
                    "column {i}: a validity bitmap of {} bytes for {} rows",
                    validity.length(),
                    node.length()
                ));
            }
        }
        if let Some((index, width)) = layout.elements {
            let Some(buffer) = buffers.iter().nth(first_buffer + index) else {
                return Ok(());
            };
            if buffer.length() % width != 0 {
                return Err(format!(
                    "column {i}: a buffer of {} bytes holding {width}-byte elements",
                    buffer.length()
                ));
            }
        }
        first_buffer += layout.buffers;
    }
    Ok(())
}

fn take_u32(rest: &mut &[u8]) -> Option<u32> {
    let (head, tail) = rest.split_first_chunk::<4>()?;
    *rest = tail;
    Some(u32::from_le_bytes(*head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{SampleBatchBuilder, SampleRow};

    fn body() -> Vec<u8> {
        let mut b = SampleBatchBuilder::with_capacity(1);
        b.push(&SampleRow {
            time_ms: 1_761_951_600_000,
            interval_s: 1,
            node: "node000".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            gpu_model: "h100-sxm".into(),
            ..SampleRow::default()
        });
        encode_ipc(&b.finish().unwrap()).unwrap()
    }

    #[test]
    fn a_batch_comes_back_as_it_was_sent() {
        let bytes = body();
        let batch = decode_ipc(&bytes).unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert_eq!(encode_ipc(&batch).unwrap(), bytes);
    }

    /// Each file is an input on which arrow-ipc panicked; the error says why it is refused.
    #[test]
    fn the_fuzzers_findings_are_errors_not_panics() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/regressions/ingest_samples"
        );
        for (file, why) in [
            ("buffer-past-body", "lies outside the body"),
            ("int-of-width-zero", "a malformed Int type"),
            ("null-count-past-length", "nulls in 1 rows"),
            ("metadata-of-2-gb", "bytes of metadata where"),
            ("offsets-of-odd-length", "holding 4-byte elements"),
        ] {
            let bytes = std::fs::read(format!("{dir}/{file}")).unwrap();
            let e = decode_ipc(&bytes).unwrap_err().to_string();
            assert!(e.contains(why), "{file}: {e}");
        }
    }
}
