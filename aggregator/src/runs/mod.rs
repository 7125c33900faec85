//! Aggregates for the query sessions that add up runs: DataFusion's `SUM` and `COUNT`, except
//! for their grouped accumulators, which take each run of consecutive rows of one group (and,
//! for `COUNT(DISTINCT)`, one value) at once.
//!
//! Why: the stored tables are sorted by node, GPU and time, so consecutive rows nearly always
//! belong to the same account, job and hour (a day of samples has runs of about 5,700 rows).
//! DataFusion's grouped `SUM` adds every row into its group's slot in memory, so each addition
//! waits for the store of the one before (in the monthly report, 45% of the samples of the
//! hottest function sat on that one store), and its grouped `COUNT(DISTINCT)` over strings
//! gathers each group's rows and hashes every one. See `sum` and `count_distinct`.
//!
//! Everything else (name, signature and coercions, return types, the partial state, null
//! semantics, the ungrouped and window accumulators, other input types) is DataFusion's, which
//! [`RunAware`] wraps, and DataFusion supports overriding a built-in function by registering one
//! of the same name. Results equal DataFusion's, except that float sums can differ in the last
//! bits (additions happen in another order, as they already do between DataFusion runs with
//! different partitioning).

mod count_distinct;
mod sum;

use arrow::array::{Array, BooleanArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::expr::{
    AggregateFunction, AggregateFunctionParams, WindowFunctionParams,
};
use datafusion::logical_expr::function::{
    AccumulatorArgs, AggregateFunctionSimplification, StateFieldsArgs,
};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Expr, GroupsAccumulator, Operator,
    ReversedUDAF, SetMonotonicity, Signature, StatisticsArgs,
};
use datafusion::prelude::SessionContext;

/// Registers `sum` and `count` in a session, replacing the built-in ones.
pub fn register(ctx: &SessionContext) {
    ctx.register_udaf(AggregateUDF::new_from_impl(RunAware::<Sum>::default()));
    ctx.register_udaf(AggregateUDF::new_from_impl(RunAware::<Count>::default()));
}

/// A built-in aggregate's run-aware grouped accumulator, for the arguments it has one for.
pub trait RunGroups {
    fn has_run_groups(&self, args: &AccumulatorArgs) -> bool;
    fn run_groups(&self, args: &AccumulatorArgs) -> Option<Box<dyn GroupsAccumulator>>;
}

/// A built-in aggregate, with its run-aware grouped accumulator where it has one.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct RunAware<F> {
    inner: F,
}

impl<F> AggregateUDFImpl for RunAware<F>
where
    F: AggregateUDFImpl + RunGroups + PartialEq + Eq + std::hash::Hash,
{
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
        self.inner.has_run_groups(&args) || self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        match self.inner.run_groups(&args) {
            Some(accumulator) => Ok(accumulator),
            None => self.inner.create_groups_accumulator(args),
        }
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

/// A filter as validity: rows whose filter value is false or null do not count.
fn filter_mask(filter: &BooleanArray) -> NullBuffer {
    match filter.nulls() {
        Some(nulls) => NullBuffer::new(nulls.inner() & filter.values()),
        None => NullBuffer::new(filter.values().clone()),
    }
}

/// Rows that count: valid in the input and passed by the filter (`None`: all).
fn counted_rows(nulls: Option<&NullBuffer>, filter: Option<&BooleanArray>) -> Option<NullBuffer> {
    let filter = filter.map(filter_mask);
    NullBuffer::union(nulls, filter.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The same SQL in a session with these aggregates and in one with DataFusion's gives the
    /// same rows: grouped with runs and without, with nulls, FILTER, DISTINCT, types they
    /// delegate, no GROUP BY, a window.
    #[tokio::test]
    async fn sql_answers_equal_datafusions() {
        use arrow::array::{
            Decimal128Array, Float32Array, Int32Array, StringArray, StringViewArray, UInt32Array,
        };
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
            Field::new("job", DataType::Utf8View, true),
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
        let job = StringViewArray::from_iter(
            (0..n)
                .map(|r| (r % 89 != 0).then(|| format!("job-with-a-long-name-{}", (r / 40) % 37))),
        );
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(account),
                Arc::new(i),
                Arc::new(u),
                Arc::new(f),
                Arc::new(d),
                Arc::new(job),
            ],
        )
        .unwrap();
        let queries = [
            "SELECT account, SUM(i), SUM(u), SUM(f), SUM(d), SUM(f * u), COUNT(*) FROM t GROUP BY account ORDER BY account",
            "SELECT u, SUM(i), SUM(f) FROM t GROUP BY u ORDER BY u",
            "SELECT account, SUM(i) FILTER (WHERE u > 10), SUM(DISTINCT u), SUM(CASE WHEN f IS NOT NULL THEN u END) FROM t GROUP BY account ORDER BY account",
            "SELECT SUM(i), SUM(f), SUM(d) FROM t",
            "SELECT account, COUNT(DISTINCT job), COUNT(job), COUNT(*), SUM(u) FROM t GROUP BY account ORDER BY account",
            "SELECT u, COUNT(DISTINCT job) FILTER (WHERE i > 0), COUNT(DISTINCT account) FROM t GROUP BY u ORDER BY u",
            "SELECT COUNT(DISTINCT job) FROM t",
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
        register(&ours);
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
