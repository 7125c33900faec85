//! The stretches of time each GPU (each MIG instance on its own) of each node already has
//! samples stored for, so that one (node, GPU, time) is stored once whatever sequence number
//! or sender epoch a batch comes under: a re-sent interval is a duplicate, not new usage.
//!
//! A row `[time, time + interval)` is compared with what its GPU has:
//! - overlapping it by at most a jitter tolerance (a tenth of the row, at most 1 s: a sampler
//!   woken a few milliseconds early) it is new and kept whole;
//! - covered but for that tolerance, it is a duplicate and dropped;
//! - in between (a clock stepped back, a batch re-sent after its times were corrected by
//!   another offset) it is cut to the longest part not yet covered, in whole seconds, its
//!   energy in proportion.
//!
//! Stretches closer than 1 s are merged (an honest sampler's rows follow each other with
//! millisecond gaps, so a GPU has one stretch per outage), at most [`MAX_RANGES_PER_GPU`] are
//! kept per GPU (past that the two closest merge, which only a node sending scattered rows
//! ever reaches), and those older than raw retention are forgotten, since such rows are
//! refused anyway.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, BooleanArray, Float64Array, TimestampMillisecondArray, UInt32Array,
};
use arrow::datatypes::{Float64Type, TimestampMillisecondType, UInt16Type, UInt32Type};
use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use gpuledger_model::sample::col;
use gpuledger_model::time::UnixMillis;

use crate::{Error, Result};

/// Stretches closer than this are one.
pub const MERGE_GAP_MS: i64 = 1_000;
/// Stretches kept per GPU at most.
pub const MAX_RANGES_PER_GPU: usize = 4_096;
/// The largest overlap that still counts as sampling jitter.
const MAX_JITTER_MS: i64 = 1_000;

/// Disjoint `[start, end)` stretches, by start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<[i64; 2]>", into = "Vec<[i64; 2]>")]
struct Ranges(BTreeMap<i64, i64>);

impl From<Vec<[i64; 2]>> for Ranges {
    fn from(v: Vec<[i64; 2]>) -> Self {
        let mut r = Ranges::default();
        for [s, e] in v {
            r.insert(s, e);
        }
        r
    }
}

impl From<Ranges> for Vec<[i64; 2]> {
    fn from(r: Ranges) -> Self {
        r.0.into_iter().map(|(s, e)| [s, e]).collect()
    }
}

impl Ranges {
    /// The stretches that touch `[s, e)`, clipped to it.
    fn overlaps(&self, s: i64, e: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        let first = self
            .0
            .range(..=s)
            .next_back()
            .map(|(k, _)| *k)
            .unwrap_or(i64::MIN);
        self.0
            .range(first..e)
            .filter(move |(_, end)| **end > s)
            .map(move |(start, end)| ((*start).max(s), (*end).min(e)))
    }

    fn covered_ms(&self, s: i64, e: i64) -> i64 {
        // The common case: a sampler's next row, after everything stored.
        if self.0.last_key_value().is_none_or(|(_, end)| *end <= s) {
            return 0;
        }
        self.overlaps(s, e).map(|(a, b)| b - a).sum()
    }

    /// The longest part of `[s, e)` no stretch covers (the earliest of equals).
    fn longest_gap(&self, s: i64, e: i64) -> (i64, i64) {
        let mut best = (s, s);
        let mut at = s;
        for (a, b) in self.overlaps(s, e).collect::<Vec<_>>() {
            if a - at > best.1 - best.0 {
                best = (at, a);
            }
            at = at.max(b);
        }
        if e - at > best.1 - best.0 {
            best = (at, e);
        }
        best
    }

    /// Adds `[s, e)`, merging what lies within [`MERGE_GAP_MS`] of it.
    fn insert(&mut self, mut s: i64, mut e: i64) {
        if e <= s {
            return;
        }
        // The fast path: a sampler's next row after the last stretch.
        if let Some((&ls, le)) = self.0.iter_mut().next_back() {
            if s >= ls && s <= *le + MERGE_GAP_MS {
                *le = (*le).max(e);
                return;
            }
        }
        let touching: Vec<(i64, i64)> = self
            .0
            .range(..e + MERGE_GAP_MS)
            .rev()
            .take_while(|(_, end)| **end + MERGE_GAP_MS >= s)
            .map(|(a, b)| (*a, *b))
            .collect();
        for (a, b) in touching {
            self.0.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.0.insert(s, e);
        if self.0.len() > MAX_RANGES_PER_GPU {
            self.merge_closest();
        }
    }

    fn merge_closest(&mut self) {
        let closest = self
            .0
            .iter()
            .zip(self.0.iter().skip(1))
            .min_by_key(|((_, e1), (s2, _))| **s2 - **e1)
            .map(|((s1, _), (s2, e2))| (*s1, *s2, *e2));
        if let Some((s1, s2, e2)) = closest {
            self.0.remove(&s2);
            self.0.insert(s1, e2);
        }
    }

    /// Takes `[s, e)` out again (a claim whose batch was not stored).
    fn remove(&mut self, s: i64, e: i64) {
        let hit: Vec<(i64, i64)> = self
            .0
            .range(..e)
            .rev()
            .take_while(|(_, end)| **end > s)
            .map(|(a, b)| (*a, *b))
            .collect();
        for (a, b) in hit {
            self.0.remove(&a);
            if a < s {
                self.0.insert(a, s);
            }
            if b > e {
                self.0.insert(e, b);
            }
        }
    }

    fn forget_before(&mut self, ms: i64) {
        self.0.retain(|_, end| *end >= ms);
    }
}

/// One node's GPUs: whole GPUs by index, MIG instances by index and instance. Written with
/// keys `3` and `3/1g.10gb/2` in the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "BTreeMap<String, Ranges>",
    into = "BTreeMap<String, Ranges>"
)]
struct NodeGpus {
    whole: Vec<Ranges>,
    mig: BTreeMap<(u16, String), Ranges>,
}

impl TryFrom<BTreeMap<String, Ranges>> for NodeGpus {
    type Error = String;
    fn try_from(flat: BTreeMap<String, Ranges>) -> Result<Self, String> {
        let mut gpus = NodeGpus::default();
        for (key, ranges) in flat {
            let (index, mig) = key.split_once('/').unwrap_or((&key, ""));
            let index: u16 = index
                .parse()
                .map_err(|_| format!("`{key}` is not a GPU of a node"))?;
            *gpus.ranges(index, (!mig.is_empty()).then_some(mig)) = ranges;
        }
        Ok(gpus)
    }
}

impl From<NodeGpus> for BTreeMap<String, Ranges> {
    fn from(gpus: NodeGpus) -> Self {
        let mut flat = BTreeMap::new();
        for (index, ranges) in gpus.whole.into_iter().enumerate() {
            if !ranges.0.is_empty() {
                flat.insert(index.to_string(), ranges);
            }
        }
        for ((index, mig), ranges) in gpus.mig {
            flat.insert(format!("{index}/{mig}"), ranges);
        }
        flat
    }
}

impl NodeGpus {
    /// The stretches of a GPU (indices are below the node's GPU count: checked before).
    fn ranges(&mut self, index: u16, mig: Option<&str>) -> &mut Ranges {
        match mig {
            None => {
                let i = usize::from(index);
                if self.whole.len() <= i {
                    self.whole.resize_with(i + 1, Ranges::default);
                }
                &mut self.whole[i]
            }
            Some(m) => self.mig.entry((index, m.to_owned())).or_default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.whole.iter().all(|r| r.0.is_empty()) && self.mig.is_empty()
    }

    fn forget_before(&mut self, ms: i64) {
        for r in &mut self.whole {
            r.forget_before(ms);
        }
        for r in self.mig.values_mut() {
            r.forget_before(ms);
        }
        self.mig.retain(|_, r| !r.0.is_empty());
    }
}

/// What each node's GPUs have stored, persisted in the log's checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    nodes: HashMap<String, NodeGpus>,
}

/// What the comparison did to a batch.
#[derive(Debug)]
pub struct Claimed {
    /// The rows to store: the batch itself where no row changed.
    pub batch: RecordBatch,
    /// Rows dropped as already stored.
    pub duplicate_rows: usize,
    /// Rows cut to the part not yet stored.
    pub trimmed_rows: usize,
    /// The stretches this batch added, to give back if it is not stored.
    pub claim: Claim,
}

/// Stretches claimed by one batch of one node.
#[derive(Debug, Default)]
pub struct Claim {
    node: String,
    /// GPU index, MIG instance, stretch.
    pieces: Vec<(u16, Option<String>, i64, i64)>,
}

struct Columns<'a> {
    time: &'a TimestampMillisecondArray,
    interval: &'a UInt32Array,
    gpu: &'a arrow::array::UInt16Array,
    mig: &'a arrow::array::StringArray,
    energy: &'a Float64Array,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a RecordBatch) -> Columns<'a> {
        Columns {
            time: batch.column(0).as_primitive::<TimestampMillisecondType>(),
            interval: batch.column(1).as_primitive::<UInt32Type>(),
            gpu: batch.column(3).as_primitive::<UInt16Type>(),
            mig: batch.column(6).as_string::<i32>(),
            energy: batch
                .column_by_name(col::ENERGY_J)
                .expect("a validated sample batch")
                .as_primitive::<Float64Type>(),
        }
    }

    fn mig(&self, row: usize) -> Option<&'a str> {
        self.mig.is_valid(row).then(|| self.mig.value(row))
    }
}

impl Coverage {
    /// Compares a validated batch of `node` with what is stored, claims what it adds, and gives
    /// the rows to store.
    pub fn claim(&mut self, node: &str, batch: &RecordBatch) -> Result<Claimed> {
        let c = Columns::of(batch);
        let gpus = self.nodes.entry(node.to_owned()).or_default();
        let mut claim = Claim {
            node: node.to_owned(),
            pieces: Vec::new(),
        };
        // Per row: None kept whole, Some(None) dropped, Some(Some((start, secs))) cut.
        let mut changes: Vec<(usize, Option<(i64, u32)>)> = Vec::new();
        for row in 0..batch.num_rows() {
            let (index, mig) = (c.gpu.value(row), c.mig(row));
            let ranges = gpus.ranges(index, mig);
            let s = c.time.value(row);
            let len = i64::from(c.interval.value(row)) * 1000;
            let e = s + len;
            let covered = ranges.covered_ms(s, e);
            let tolerance = (len / 10).min(MAX_JITTER_MS);
            let piece = if covered <= tolerance {
                Some((s, e))
            } else if covered >= len - tolerance {
                changes.push((row, None));
                None
            } else {
                let (a, b) = ranges.longest_gap(s, e);
                let secs = (b - a) / 1000;
                if secs == 0 {
                    changes.push((row, None));
                    None
                } else {
                    changes.push((row, Some((a, secs as u32))));
                    Some((a, a + secs * 1000))
                }
            };
            if let Some((a, b)) = piece {
                ranges.insert(a, b);
                claim.pieces.push((index, mig.map(str::to_owned), a, b));
            }
        }
        let duplicate_rows = changes.iter().filter(|(_, c)| c.is_none()).count();
        let trimmed_rows = changes.len() - duplicate_rows;
        let batch = if changes.is_empty() {
            batch.clone()
        } else {
            apply_changes(batch, &c, &changes)?
        };
        Ok(Claimed {
            batch,
            duplicate_rows,
            trimmed_rows,
            claim,
        })
    }

    /// Whether every row of a validated batch is stored already (what [`Coverage::claim`]
    /// would drop whole), without claiming anything.
    pub fn is_stored(&mut self, node: &str, batch: &RecordBatch) -> Result<bool> {
        let c = Columns::of(batch);
        let Some(gpus) = self.nodes.get_mut(node) else {
            return Ok(batch.num_rows() == 0);
        };
        Ok((0..batch.num_rows()).all(|row| {
            let s = c.time.value(row);
            let len = i64::from(c.interval.value(row)) * 1000;
            let tolerance = (len / 10).min(MAX_JITTER_MS);
            gpus.ranges(c.gpu.value(row), c.mig(row))
                .covered_ms(s, s + len)
                >= len - tolerance
        }))
    }

    /// Gives back what a batch claimed (it was not stored).
    pub fn release(&mut self, claim: &Claim) {
        if let Some(gpus) = self.nodes.get_mut(&claim.node) {
            for (index, mig, s, e) in &claim.pieces {
                gpus.ranges(*index, mig.as_deref()).remove(*s, *e);
            }
        }
    }

    /// Adds a batch that is stored already (replayed from the log).
    pub fn add(&mut self, node: &str, batch: &RecordBatch) {
        let c = Columns::of(batch);
        let gpus = self.nodes.entry(node.to_owned()).or_default();
        for row in 0..batch.num_rows() {
            let s = c.time.value(row);
            let e = s + i64::from(c.interval.value(row)) * 1000;
            gpus.ranges(c.gpu.value(row), c.mig(row)).insert(s, e);
        }
    }

    /// Forgets stretches that ended before `ms`.
    pub fn forget_before(&mut self, ms: UnixMillis) {
        for gpus in self.nodes.values_mut() {
            gpus.forget_before(ms);
        }
        self.nodes.retain(|_, gpus| !gpus.is_empty());
    }
}

/// The batch with rows dropped or cut as `changes` (by row, in order) say.
fn apply_changes(
    batch: &RecordBatch,
    c: &Columns<'_>,
    changes: &[(usize, Option<(i64, u32)>)],
) -> Result<RecordBatch> {
    let mut time: Vec<i64> = c.time.values().to_vec();
    let mut interval: Vec<u32> = c.interval.values().to_vec();
    let mut energy: Vec<Option<f64>> = c.energy.iter().collect();
    let mut keep = vec![true; batch.num_rows()];
    for (row, change) in changes {
        match change {
            None => keep[*row] = false,
            Some((start, secs)) => {
                let was = interval[*row];
                time[*row] = *start;
                interval[*row] = *secs;
                if let Some(j) = energy[*row].as_mut() {
                    *j *= f64::from(*secs) / f64::from(was);
                }
            }
        }
    }
    let mut columns = batch.columns().to_vec();
    columns[0] = Arc::new(TimestampMillisecondArray::from(time).with_timezone("UTC"));
    columns[1] = Arc::new(UInt32Array::from(interval));
    let energy_at = batch
        .schema()
        .index_of(col::ENERGY_J)
        .map_err(|e| Error::Corrupt(format!("sample batch: {e}")))?;
    columns[energy_at] = Arc::new(Float64Array::from(energy));
    let changed = RecordBatch::try_new(batch.schema(), columns)
        .map_err(|e| Error::Corrupt(format!("cutting rows: {e}")))?;
    arrow::compute::filter_record_batch(&changed, &BooleanArray::from(keep))
        .map_err(|e| Error::Corrupt(format!("dropping rows: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_model::sample::{SampleBatchBuilder, SampleRow};

    const T0: i64 = 1_780_272_000_000;

    fn row(gpu: u16, time_ms: i64, interval_s: u32) -> SampleRow {
        SampleRow {
            time_ms,
            interval_s,
            node: "node001".into(),
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{gpu}"),
            gpu_model: "h100-sxm".into(),
            energy_j: Some(f64::from(interval_s) * 100.0),
            ..SampleRow::default()
        }
    }

    fn batch(rows: &[SampleRow]) -> RecordBatch {
        let mut b = SampleBatchBuilder::with_capacity(rows.len());
        for r in rows {
            b.push(r);
        }
        b.finish().unwrap()
    }

    fn times(b: &RecordBatch) -> Vec<(i64, u32, Option<f64>)> {
        let c = Columns::of(b);
        (0..b.num_rows())
            .map(|i| {
                (
                    c.time.value(i),
                    c.interval.value(i),
                    c.energy.is_valid(i).then(|| c.energy.value(i)),
                )
            })
            .collect()
    }

    #[test]
    fn the_same_intervals_again_are_duplicates_whatever_they_come_under() {
        let mut cov = Coverage::default();
        let rows: Vec<SampleRow> = (0..16)
            .map(|i| row(i % 8, T0 + i64::from(i / 8) * 10_000, 10))
            .collect();
        let first = cov.claim("node001", &batch(&rows)).unwrap();
        assert_eq!((first.batch.num_rows(), first.duplicate_rows), (16, 0));
        let again = cov.claim("node001", &batch(&rows)).unwrap();
        assert_eq!((again.batch.num_rows(), again.duplicate_rows), (0, 16));
        let other_node = cov.claim("node002", &batch(&rows)).unwrap();
        assert_eq!(
            other_node.duplicate_rows, 0,
            "another node's GPUs are its own"
        );
        let mut within = rows.clone();
        within.push(row(0, T0 + 20_000, 10));
        within.push(row(0, T0 + 20_000, 10));
        let twice_in_one = cov.claim("node003", &batch(&within)).unwrap();
        assert_eq!(
            twice_in_one.duplicate_rows, 1,
            "a row repeated inside one batch"
        );
    }

    #[test]
    fn a_jittering_sampler_keeps_every_row_whole_in_one_stretch() {
        let mut cov = Coverage::default();
        let mut t = T0;
        let mut rows = Vec::new();
        for i in 0..360 {
            rows.push(row(0, t, 10));
            // Woken a few milliseconds late, sometimes early.
            t += 10_000 + [3, -2, 7, 0, -4][i % 5];
        }
        let got = cov.claim("node001", &batch(&rows)).unwrap();
        assert_eq!((got.duplicate_rows, got.trimmed_rows), (0, 0));
        assert_eq!(got.batch.num_rows(), 360);
        let gpus = &cov.nodes["node001"].whole[0];
        assert_eq!(gpus.0.len(), 1, "{gpus:?}");
    }

    #[test]
    fn a_row_partly_stored_is_cut_to_the_rest_with_its_energy() {
        let mut cov = Coverage::default();
        cov.claim("node001", &batch(&[row(0, T0, 10)])).unwrap();
        // The node's clock stepped back 4 s: 6 s of this row are new.
        let got = cov
            .claim("node001", &batch(&[row(0, T0 + 6_000, 10)]))
            .unwrap();
        assert_eq!(got.trimmed_rows, 1);
        assert_eq!(times(&got.batch), [(T0 + 10_000, 6, Some(600.0))]);
        // A row over a gap is cut to the longest part not covered: 10-13 s, not 23-25 s.
        let mut cov = Coverage::default();
        cov.claim(
            "node001",
            &batch(&[row(1, T0, 10), row(1, T0 + 13_000, 10)]),
        )
        .unwrap();
        let got = cov
            .claim("node001", &batch(&[row(1, T0 + 5_000, 20)]))
            .unwrap();
        assert_eq!(times(&got.batch), [(T0 + 10_000, 3, Some(300.0))]);
    }

    #[test]
    fn what_a_refused_batch_claimed_is_given_back() {
        let mut cov = Coverage::default();
        cov.claim("node001", &batch(&[row(0, T0, 10)])).unwrap();
        let second = cov
            .claim("node001", &batch(&[row(0, T0 + 10_000, 10)]))
            .unwrap();
        cov.release(&second.claim);
        let again = cov
            .claim("node001", &batch(&[row(0, T0 + 10_000, 10)]))
            .unwrap();
        assert_eq!((again.batch.num_rows(), again.duplicate_rows), (1, 0));
        let first_again = cov.claim("node001", &batch(&[row(0, T0, 10)])).unwrap();
        assert_eq!(
            first_again.duplicate_rows, 1,
            "the first batch's claim stays"
        );
    }

    #[test]
    fn mig_instances_are_gpus_of_their_own_and_survive_the_checkpoint() {
        let mut cov = Coverage::default();
        let mut mig = row(0, T0, 10);
        mig.mig_instance = Some("1g.10gb/3".into());
        let got = cov
            .claim("node001", &batch(&[row(0, T0, 10), mig.clone()]))
            .unwrap();
        assert_eq!(got.batch.num_rows(), 2);
        let json = serde_json::to_string(&cov).unwrap();
        assert!(json.contains("\"0/1g.10gb/3\""), "{json}");
        let mut back: Coverage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cov);
        assert_eq!(
            back.claim("node001", &batch(&[mig]))
                .unwrap()
                .duplicate_rows,
            1
        );
        back.forget_before(T0 + 20_000);
        assert_eq!(back, Coverage::default());
    }

    #[test]
    fn scattered_rows_keep_a_bounded_number_of_stretches() {
        let mut cov = Coverage::default();
        let rows: Vec<SampleRow> = (0..(MAX_RANGES_PER_GPU as i64 + 500))
            .map(|i| row(0, T0 + i * 3_000, 1))
            .collect();
        let got = cov.claim("node001", &batch(&rows)).unwrap();
        assert_eq!(got.duplicate_rows, 0);
        assert_eq!(cov.nodes["node001"].whole[0].0.len(), MAX_RANGES_PER_GPU);
    }
}
