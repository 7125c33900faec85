//! `SUM`'s grouped accumulator for Float64, Int64 and UInt64: each run of one group's rows is
//! summed as a slice, in registers, eight lanes at a time (which the compiler vectorizes), and
//! the run's total added to the group once. Batches whose runs are short, or that carry nulls
//! or a filter, take a per-row loop like DataFusion's.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, ArrowNativeTypeOp, AsArray, BooleanArray, PrimitiveArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float64Type, Int64Type, UInt64Type};
use datafusion::common::Result;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};

use super::{counted_rows, RunGroups};

impl RunGroups for Sum {
    fn has_run_groups(&self, args: &AccumulatorArgs) -> bool {
        !args.is_distinct
            && matches!(
                args.return_field.data_type(),
                DataType::Float64 | DataType::Int64 | DataType::UInt64
            )
    }

    fn run_groups(&self, args: &AccumulatorArgs) -> Option<Box<dyn GroupsAccumulator>> {
        if !self.has_run_groups(args) {
            return None;
        }
        let data_type = args.return_field.data_type().clone();
        Some(match data_type {
            DataType::Float64 => Box::new(RunSumAccumulator::<Float64Type>::new(data_type)),
            DataType::Int64 => Box::new(RunSumAccumulator::<Int64Type>::new(data_type)),
            _ => Box::new(RunSumAccumulator::<UInt64Type>::new(data_type)),
        })
    }
}

/// Below this average run length a batch is summed row by row: a slice sum per run of one
/// or two rows costs more than it saves.
const MIN_AVERAGE_RUN: usize = 8;

/// Per-group sums of one primitive type, and whether each group has seen a value (a group
/// that saw only nulls or filtered rows sums to null, as in SQL).
#[derive(Debug)]
struct RunSumAccumulator<T: ArrowPrimitiveType> {
    sums: Vec<T::Native>,
    seen: Vec<bool>,
    data_type: DataType,
}

impl<T: ArrowPrimitiveType> RunSumAccumulator<T> {
    fn new(data_type: DataType) -> Self {
        RunSumAccumulator {
            sums: Vec::new(),
            seen: Vec::new(),
            data_type,
        }
    }

    fn add(
        &mut self,
        group_indices: &[usize],
        values: &PrimitiveArray<T>,
        filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) {
        self.sums.resize(total_num_groups, T::Native::ZERO);
        self.seen.resize(total_num_groups, false);
        let data = values.values();
        match counted_rows(values.nulls(), filter) {
            None => self.add_runs(group_indices, data),
            Some(valid) => {
                let rows = group_indices.iter().zip(data.iter()).enumerate();
                for (row, (&group, &value)) in rows {
                    if valid.is_valid(row) {
                        self.add_one(group, value);
                    }
                }
            }
        }
    }

    fn add_one(&mut self, group: usize, value: T::Native) {
        self.sums[group] = self.sums[group].add_wrapping(value);
        self.seen[group] = true;
    }

    /// Adds each run of rows of one group as a slice; once the runs so far average fewer than
    /// `MIN_AVERAGE_RUN` rows, the rest of the batch row by row.
    fn add_runs(&mut self, group_indices: &[usize], data: &[T::Native]) {
        let mut start = 0;
        let mut runs = 0;
        while let Some(&group) = group_indices.get(start) {
            if runs * MIN_AVERAGE_RUN > start + RUN_PROBE_ROWS {
                for (&group, &value) in group_indices[start..].iter().zip(&data[start..]) {
                    self.add_one(group, value);
                }
                return;
            }
            let len = run_length(&group_indices[start..], group);
            self.add_one(group, slice_sum(&data[start..start + len]));
            start += len;
            runs += 1;
        }
    }
}

/// Rows summed run by run before the average run length decides the rest of a batch.
const RUN_PROBE_ROWS: usize = 256;

/// How many of the leading indices are `group`: sixteen at a time while whole chunks match
/// (a comparison the compiler vectorizes), then one at a time.
fn run_length(group_indices: &[usize], group: usize) -> usize {
    const CHUNK: usize = 16;
    let whole = group_indices
        .chunks_exact(CHUNK)
        .take_while(|chunk| chunk.iter().fold(true, |same, &g| same & (g == group)))
        .count()
        * CHUNK;
    whole
        + group_indices[whole..]
            .iter()
            .position(|&g| g != group)
            .unwrap_or(group_indices.len() - whole)
}

/// The sum of a slice in eight independent lanes, so that additions do not wait on each other.
fn slice_sum<N: ArrowNativeTypeOp>(values: &[N]) -> N {
    const LANES: usize = 8;
    let mut lanes = [N::ZERO; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane = lane.add_wrapping(value);
        }
    }
    let total = lanes.into_iter().fold(N::ZERO, |a, b| a.add_wrapping(b));
    rest.iter().fold(total, |a, &b| a.add_wrapping(b))
}

impl<T: ArrowPrimitiveType + Send> GroupsAccumulator for RunSumAccumulator<T> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.add(
            group_indices,
            values[0].as_primitive::<T>(),
            opt_filter,
            total_num_groups,
        );
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let sums = emit_to.take_needed(&mut self.sums);
        let seen = emit_to.take_needed(&mut self.seen);
        let nulls = (!seen.iter().all(|&s| s)).then(|| NullBuffer::from(seen));
        Ok(Arc::new(
            PrimitiveArray::<T>::new(sums.into(), nulls).with_data_type(self.data_type.clone()),
        ))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(emit_to)?])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        // A partial sum is a sum: merging adds them like input values.
        self.add(
            group_indices,
            values[0].as_primitive::<T>(),
            None,
            total_num_groups,
        );
        Ok(())
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let values = values[0].as_primitive::<T>();
        // Each row's state is the sum of that one row: zero plus the value (so -0.0 becomes
        // 0.0, as when it is added to a group), null where the row does not count.
        let sums: PrimitiveArray<T> = values.unary(|v| T::Native::ZERO.add_wrapping(v));
        let nulls = counted_rows(values.nulls(), opt_filter);
        let (_, buffer, _) = sums.into_parts();
        Ok(vec![Arc::new(
            PrimitiveArray::<T>::new(buffer, nulls).with_data_type(self.data_type.clone()),
        )])
    }

    fn size(&self) -> usize {
        self.sums.capacity() * size_of::<T::Native>() + self.seen.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, UInt64Array};
    use proptest::prelude::*;

    /// One input row: its group, its value (None: null) and its filter value (None: no
    /// filter on this batch is decided per batch; Some(None) a null filter value).
    #[derive(Clone, Debug)]
    struct Row {
        group: usize,
        value: Option<i64>,
        filter: Option<bool>,
    }

    /// Rows in runs of one group, as the sorted tables give them, long and short (so that
    /// both the run path and the switch to the row path are taken).
    fn batch(groups: usize) -> impl Strategy<Value = Vec<Row>> {
        let run = (
            0..groups,
            prop_oneof![1usize..3, 1usize..40],
            prop::option::weighted(0.9, -1000i64..1000),
            prop::option::weighted(0.9, any::<bool>()),
        );
        prop::collection::vec(run, 0..120).prop_map(|runs| {
            runs.into_iter()
                .flat_map(|(group, len, value, filter)| {
                    (0..len).map(move |i| Row {
                        group,
                        value: value.map(|v| v + i as i64),
                        filter,
                    })
                })
                .collect()
        })
    }

    /// The reference: each group's wrapping sum of its counted values, null if none counted.
    fn reference(batches: &[(Vec<Row>, bool)], groups: usize) -> Vec<Option<i64>> {
        let mut sums = vec![None; groups];
        for (rows, filtered) in batches {
            for row in rows {
                let counted = !*filtered || row.filter == Some(true);
                if let (Some(v), true) = (row.value, counted) {
                    let sum: &mut Option<i64> = &mut sums[row.group];
                    *sum = Some(sum.unwrap_or(0).wrapping_add(v));
                }
            }
        }
        sums
    }

    fn run<T: ArrowPrimitiveType + Send>(
        batches: &[(Vec<Row>, bool)],
        groups: usize,
        data_type: DataType,
        to_native: impl Fn(i64) -> T::Native,
        emit_first: usize,
    ) -> Vec<Option<T::Native>> {
        // Half the batches go through a second accumulator whose state is merged, as the
        // final phase of a partitioned aggregation does.
        let mut acc = RunSumAccumulator::<T>::new(data_type.clone());
        let mut partial = RunSumAccumulator::<T>::new(data_type);
        for (i, (rows, filtered)) in batches.iter().enumerate() {
            let indices: Vec<usize> = rows.iter().map(|r| r.group).collect();
            let values: PrimitiveArray<T> = rows.iter().map(|r| r.value.map(&to_native)).collect();
            let filter: Option<BooleanArray> =
                filtered.then(|| rows.iter().map(|r| r.filter).collect());
            let target = if i % 2 == 0 { &mut acc } else { &mut partial };
            target
                .update_batch(&[Arc::new(values)], &indices, filter.as_ref(), groups)
                .unwrap();
        }
        let state = partial.state(EmitTo::All).unwrap();
        let state_groups: Vec<usize> = (0..state[0].len()).collect();
        acc.merge_batch(&state, &state_groups, groups).unwrap();
        let first = emit_first.min(groups);
        let mut out: Vec<Option<T::Native>> = Vec::new();
        for emit in [EmitTo::First(first), EmitTo::All] {
            let array = acc.evaluate(emit).unwrap();
            out.extend(array.as_primitive::<T>().iter());
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn equals_the_reference_for_every_type(
            batches in prop::collection::vec((batch(6), any::<bool>()), 1..6),
            emit_first in 0usize..7,
        ) {
            let groups = 6;
            let expected = reference(&batches, groups);
            let ints = run::<Int64Type>(&batches, groups, DataType::Int64, |v| v, emit_first);
            prop_assert_eq!(&ints, &expected);
            // Integer-valued floats sum exactly in any order, so the comparison is exact.
            let floats = run::<Float64Type>(&batches, groups, DataType::Float64, |v| v as f64, emit_first);
            prop_assert_eq!(floats, expected.iter().map(|s| s.map(|v| v as f64)).collect::<Vec<_>>());
            let unsigned = run::<UInt64Type>(&batches, groups, DataType::UInt64, |v| v as u64, emit_first);
            prop_assert_eq!(unsigned, expected.iter().map(|s| s.map(|v| v as u64)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn long_runs_take_the_slice_path_and_wrap_like_datafusion() {
        let groups: Vec<usize> = [0; 100].into_iter().chain([1; 100]).collect();
        assert_eq!(run_length(&groups, 0), 100);
        assert_eq!(run_length(&groups[100..], 1), 100);
        assert_eq!(run_length(&groups[3..], 0), 97);
        let mut values = vec![1i64; 200];
        values[0] = i64::MAX;
        let mut acc = RunSumAccumulator::<Int64Type>::new(DataType::Int64);
        acc.update_batch(&[Arc::new(Int64Array::from(values))], &groups, None, 3)
            .unwrap();
        let sums = acc.evaluate(EmitTo::All).unwrap();
        let sums = sums.as_primitive::<Int64Type>();
        assert_eq!(sums.value(0), i64::MAX.wrapping_add(99));
        assert_eq!(sums.value(1), 100);
        assert!(sums.is_null(2), "a group with no rows sums to null");
    }

    #[test]
    fn short_runs_switch_to_the_row_path() {
        let groups: Vec<usize> = (0..1000).map(|i| i % 2).collect();
        let mut acc = RunSumAccumulator::<UInt64Type>::new(DataType::UInt64);
        let values = UInt64Array::from((0..1000).map(|i| i as u64).collect::<Vec<_>>());
        acc.update_batch(&[Arc::new(values)], &groups, None, 2)
            .unwrap();
        let sums = acc.evaluate(EmitTo::All).unwrap();
        let sums = sums.as_primitive::<UInt64Type>();
        let expected = [
            (0..1000).step_by(2).sum::<u64>(),
            (1..1000).step_by(2).sum(),
        ];
        assert_eq!(sums.values().to_vec(), expected);
    }

    #[test]
    fn special_floats_behave_as_in_sql() {
        let groups = vec![0usize; 20];
        let mut values = vec![1.0f64; 20];
        values[3] = f64::NAN;
        let mut acc = RunSumAccumulator::<Float64Type>::new(DataType::Float64);
        acc.update_batch(&[Arc::new(Float64Array::from(values))], &groups, None, 2)
            .unwrap();
        acc.update_batch(&[Arc::new(Float64Array::from(vec![-0.0]))], &[1], None, 2)
            .unwrap();
        let sums = acc.evaluate(EmitTo::All).unwrap();
        let sums = sums.as_primitive::<Float64Type>();
        assert!(sums.value(0).is_nan());
        assert!(
            sums.value(1) == 0.0 && sums.value(1).is_sign_positive(),
            "0 + -0.0 is 0.0"
        );
        let state = acc
            .convert_to_state(
                &[Arc::new(Float64Array::from(vec![
                    Some(-0.0),
                    None,
                    Some(2.5),
                ]))],
                Some(&BooleanArray::from(vec![Some(true), Some(true), None])),
            )
            .unwrap();
        let state = state[0].as_primitive::<Float64Type>();
        assert!(state.value(0).is_sign_positive());
        assert!(
            state.is_null(1) && state.is_null(2),
            "null values and rows the filter drops do not count"
        );
    }
}
