//! `SUM` for the query sessions: DataFusion's, except that a grouped sum adds each run of
//! consecutive rows of one group as a slice.
//!
//! Why: the stored tables are sorted by node, GPU and time, so consecutive rows nearly always
//! belong to the same account, job and hour (a day of samples has runs of about 5,700 rows).
//! DataFusion's grouped `SUM` adds every row into its group's slot in memory, so each addition
//! waits for the store of the one before: in the monthly report, 45% of the samples of the
//! hottest function sat on that one store. Here each run's values are summed in registers,
//! eight lanes at a time (which the compiler vectorizes), and the run's total is added to the
//! group once. Batches whose runs are short, or that carry nulls or a filter, take a per-row
//! loop like DataFusion's.
//!
//! Everything else (name, signature and coercions, return types, the partial state, null
//! semantics, the ungrouped and window accumulators, other input types) is DataFusion's `Sum`,
//! which this wraps, and DataFusion supports overriding a built-in function by registering one
//! of the same name. Integer sums are exactly DataFusion's (wrapping on overflow, as there);
//! float sums can differ in the last bits, since additions happen in another order, as they
//! already do between DataFusion runs with different partitioning.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, ArrowNativeTypeOp, AsArray, BooleanArray, PrimitiveArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, FieldRef, Float64Type, Int64Type, UInt64Type,
};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::expr::{
    AggregateFunction, AggregateFunctionParams, WindowFunctionParams,
};
use datafusion::logical_expr::function::{
    AccumulatorArgs, AggregateFunctionSimplification, StateFieldsArgs,
};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, Expr, GroupsAccumulator,
    Operator, ReversedUDAF, SetMonotonicity, Signature, StatisticsArgs,
};

/// The `sum` to register in a session (`SessionContext::register_udaf`), replacing the
/// built-in one.
pub fn sum_udaf() -> AggregateUDF {
    AggregateUDF::new_from_impl(RunSum::default())
}

/// DataFusion's `Sum` with a run-aware grouped accumulator.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct RunSum {
    inner: Sum,
}

impl AggregateUDFImpl for RunSum {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.inner.accumulator(acc_args)
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, params: &AggregateFunctionParams) -> Result<String> {
        self.inner.schema_name(params)
    }

    fn human_display(&self, params: &AggregateFunctionParams) -> Result<String> {
        self.inner.human_display(params)
    }

    fn window_function_schema_name(&self, params: &WindowFunctionParams) -> Result<String> {
        self.inner.window_function_schema_name(params)
    }

    fn display_name(&self, params: &AggregateFunctionParams) -> Result<String> {
        self.inner.display_name(params)
    }

    fn window_function_display_name(&self, params: &WindowFunctionParams) -> Result<String> {
        self.inner.window_function_display_name(params)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        if args.is_distinct {
            return self.inner.create_groups_accumulator(args);
        }
        let data_type = args.return_field.data_type().clone();
        Ok(match data_type {
            DataType::Float64 => Box::new(RunSumAccumulator::<Float64Type>::new(data_type)),
            DataType::Int64 => Box::new(RunSumAccumulator::<Int64Type>::new(data_type)),
            DataType::UInt64 => Box::new(RunSumAccumulator::<UInt64Type>::new(data_type)),
            _ => return self.inner.create_groups_accumulator(args),
        })
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.order_sensitivity()
    }

    fn simplify(&self) -> Option<AggregateFunctionSimplification> {
        self.inner.simplify()
    }

    fn simplify_expr_op_literal(
        &self,
        agg_function: &AggregateFunction,
        arg: &Expr,
        op: Operator,
        lit: &Expr,
        arg_is_left: bool,
    ) -> Result<Option<Expr>> {
        self.inner
            .simplify_expr_op_literal(agg_function, arg, op, lit, arg_is_left)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_expr()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn is_nullable(&self) -> bool {
        self.inner.is_nullable()
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    fn value_from_stats(&self, statistics_args: &StatisticsArgs) -> Option<ScalarValue> {
        self.inner.value_from_stats(statistics_args)
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.inner.default_value(data_type)
    }

    fn supports_null_handling_clause(&self) -> bool {
        self.inner.supports_null_handling_clause()
    }

    fn supports_within_group_clause(&self) -> bool {
        self.inner.supports_within_group_clause()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.inner.set_monotonicity(data_type)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
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
        let filter = filter.map(filter_mask);
        match NullBuffer::union(values.nulls(), filter.as_ref()) {
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

/// A filter as validity: rows whose filter value is false or null do not count.
fn filter_mask(filter: &BooleanArray) -> NullBuffer {
    match filter.nulls() {
        Some(nulls) => NullBuffer::new(nulls.inner() & filter.values()),
        None => NullBuffer::new(filter.values().clone()),
    }
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
        let filter = opt_filter.map(filter_mask);
        let nulls = NullBuffer::union(values.nulls(), filter.as_ref());
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

    /// The same SQL in a session with this `sum` and in one with DataFusion's gives the same
    /// rows: grouped with runs and without, with nulls, FILTER, DISTINCT, types it delegates,
    /// no GROUP BY, a window.
    #[tokio::test]
    async fn sql_answers_equal_datafusions() {
        use arrow::array::{Decimal128Array, Float32Array, Int32Array, StringArray, UInt32Array};
        use arrow::datatypes::{Field, Schema};
        use arrow::record_batch::RecordBatch;
        use datafusion::arrow::util::pretty::pretty_format_batches;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionContext;

        let n = 5000;
        let schema = Arc::new(Schema::new(vec![
            Field::new("account", DataType::Utf8, true),
            Field::new("i", DataType::Int32, true),
            Field::new("u", DataType::UInt32, false),
            Field::new("f", DataType::Float32, true),
            Field::new("d", DataType::Decimal128(10, 2), false),
        ]));
        let account = StringArray::from_iter(
            (0..n).map(|r| (r % 997 != 0).then(|| format!("team-{}", (r / 300) % 4))),
        );
        let i = Int32Array::from_iter((0..n).map(|r| (r % 13 != 0).then_some(r - 2000)));
        let u = UInt32Array::from_iter_values((0..n).map(|r| (r % 50) as u32));
        let f = Float32Array::from_iter((0..n).map(|r| (r % 17 != 0).then_some((r % 100) as f32)));
        let d = Decimal128Array::from_iter_values((0..n).map(|r| r as i128))
            .with_precision_and_scale(10, 2)
            .unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(account),
                Arc::new(i),
                Arc::new(u),
                Arc::new(f),
                Arc::new(d),
            ],
        )
        .unwrap();
        let queries = [
            "SELECT account, SUM(i), SUM(u), SUM(f), SUM(d), SUM(f * u), COUNT(*) FROM t GROUP BY account ORDER BY account",
            "SELECT u, SUM(i), SUM(f) FROM t GROUP BY u ORDER BY u",
            "SELECT account, SUM(i) FILTER (WHERE u > 10), SUM(DISTINCT u), SUM(CASE WHEN f IS NOT NULL THEN u END) FROM t GROUP BY account ORDER BY account",
            "SELECT SUM(i), SUM(f), SUM(d) FROM t",
            "SELECT u, SUM(i) OVER (ORDER BY u, i ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) FROM t ORDER BY u, i LIMIT 50",
        ];
        let slices = |batch: &RecordBatch, rows: usize| -> Vec<RecordBatch> {
            (0..batch.num_rows())
                .step_by(rows)
                .map(|offset| batch.slice(offset, rows.min(batch.num_rows() - offset)))
                .collect()
        };
        let theirs = SessionContext::new();
        let ours = SessionContext::new();
        ours.register_udaf(sum_udaf());
        for ctx in [&theirs, &ours] {
            let table = MemTable::try_new(
                schema.clone(),
                vec![slices(&batch, 700), slices(&batch, 1100)],
            )
            .unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
        }
        for sql in queries {
            let expected = theirs.sql(sql).await.unwrap().collect().await.unwrap();
            let got = ours.sql(sql).await.unwrap().collect().await.unwrap();
            assert_eq!(
                pretty_format_batches(&got).unwrap().to_string(),
                pretty_format_batches(&expected).unwrap().to_string(),
                "{sql}"
            );
        }
    }
}
