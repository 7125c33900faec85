//! Scalar functions that refuse to build a value larger than the SQL API allows. DataFusion's
//! memory pool sees only operators that buffer rows; a function such as `repeat('x', 1e9)`
//! allocates its output outside it, so one short query could take gigabytes. Every scalar
//! function of the SQL API's session is wrapped: those that can multiply their input
//! (`repeat`, `lpad`, `rpad`, `replace`, `regexp_replace`, `array_repeat`) check the size their
//! arguments ask for before building anything, and every function checks the size of what it
//! built before handing it on, so no chain of calls grows past the bound either.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{ExprSchema, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, StructFieldMapping,
};
use datafusion::prelude::SessionContext;

use crate::Result;

/// Wraps every scalar function of `ctx` so that none builds a value (one call's output, over a
/// batch) of more than `max_bytes`.
pub fn bound_value_sizes(ctx: &SessionContext, max_bytes: usize) -> Result<()> {
    let functions: Vec<Arc<ScalarUDF>> = ctx
        .state()
        .scalar_functions()
        .iter()
        // The registry lists a function under each of its aliases too.
        .filter(|(name, udf)| *name == udf.name())
        .map(|(_, udf)| Arc::clone(udf))
        .collect();
    for udf in functions {
        ctx.register_udf(ScalarUDF::new_from_impl(Bounded::new(udf, max_bytes)));
    }
    Ok(())
}

/// What a call of a function that multiplies its input would build, from its arguments.
type Estimate = fn(&[ColumnarValue], usize) -> DfResult<u64>;

fn estimate_for(name: &str) -> Option<Estimate> {
    Some(match name {
        "repeat" => repeat_bytes,
        "lpad" | "rpad" => pad_bytes,
        "replace" => replace_bytes,
        "regexp_replace" => regexp_replace_bytes,
        "array_repeat" => array_repeat_bytes,
        _ => return None,
    })
}

#[derive(Debug)]
struct Bounded {
    inner: Arc<ScalarUDF>,
    /// Follows from `inner`'s name, so equality and hashing leave it out.
    estimate: Option<Estimate>,
    max_bytes: usize,
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.max_bytes == other.max_bytes
    }
}

impl Eq for Bounded {}

impl std::hash::Hash for Bounded {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
        self.max_bytes.hash(state);
    }
}

impl Bounded {
    fn new(inner: Arc<ScalarUDF>, max_bytes: usize) -> Self {
        Bounded {
            estimate: estimate_for(inner.name()),
            inner,
            max_bytes,
        }
    }

    /// What a function simplified itself into, held to the same bound: some fold constant
    /// arguments themselves (`concat` joins its literals) and call functions of their own,
    /// which are wrapped in turn.
    fn bound_all(&self, expr: Expr) -> DfResult<Expr> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        let bound = expr.transform_up(|e| match e {
            Expr::Literal(value, _) if value.size() > self.max_bytes => {
                Err(self.too_big(value.size() as u64, "folded its constants into"))
            }
            Expr::ScalarFunction(mut call)
                if (call.func.inner().as_ref() as &dyn std::any::Any)
                    .downcast_ref::<Bounded>()
                    .is_none() =>
            {
                call.func = Arc::new(ScalarUDF::new_from_impl(Bounded::new(
                    call.func,
                    self.max_bytes,
                )));
                Ok(Transformed::yes(Expr::ScalarFunction(call)))
            }
            other => Ok(Transformed::no(other)),
        })?;
        Ok(bound.data)
    }

    fn too_big(&self, bytes: u64, what: &str) -> DataFusionError {
        DataFusionError::Execution(format!(
            "{}() {what} {bytes} bytes, more than the {} one value may hold in the SQL API (a quarter of --sql-memory-limit)",
            self.inner.name(),
            gpuledger_model::units::ByteSize(self.max_bytes as u64)
        ))
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn display_name(&self, args: &[Expr]) -> DfResult<String> {
        #[expect(deprecated)]
        self.inner.inner().display_name(args)
    }

    fn schema_name(&self, args: &[Expr]) -> DfResult<String> {
        self.inner.inner().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.inner().return_type(arg_types)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Bounded::new(
            Arc::new(updated),
            self.max_bytes,
        )))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.inner().return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn ExprSchema) -> bool {
        #[expect(deprecated)]
        self.inner.inner().is_nullable(args, schema)
    }

    fn is_strict(&self) -> bool {
        self.inner.inner().is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        if let Some(estimate) = self.estimate {
            // All arguments constant: the function computes one value, not one per row.
            let rows = if args
                .args
                .iter()
                .all(|a| matches!(a, ColumnarValue::Scalar(_)))
            {
                1
            } else {
                args.number_rows
            };
            let bytes = estimate(&args.args, rows)?;
            if bytes > self.max_bytes as u64 {
                return Err(self.too_big(bytes, "would build"));
            }
        }
        let built = self.inner.inner().invoke_with_args(args)?;
        let bytes = match &built {
            ColumnarValue::Array(array) => array.get_array_memory_size(),
            ColumnarValue::Scalar(value) => value.size(),
        } as u64;
        if bytes > self.max_bytes as u64 {
            return Err(self.too_big(bytes, "built"));
        }
        Ok(built)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> DfResult<ExprSimplifyResult> {
        match self.inner.inner().simplify(args, info)? {
            ExprSimplifyResult::Simplified(expr) => {
                Ok(ExprSimplifyResult::Simplified(self.bound_all(expr)?))
            }
            original => Ok(original),
        }
    }

    fn preimage(
        &self,
        args: &[Expr],
        lit_expr: &Expr,
        info: &SimplifyContext,
    ) -> DfResult<PreimageResult> {
        self.inner.inner().preimage(args, lit_expr, info)
    }

    fn short_circuits(&self) -> bool {
        self.inner.inner().short_circuits()
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.inner().conditional_arguments(args)
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> DfResult<Interval> {
        self.inner.inner().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> DfResult<Option<Vec<Interval>>> {
        self.inner.inner().propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> DfResult<SortProperties> {
        self.inner.inner().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> DfResult<bool> {
        self.inner.inner().preserves_lex_ordering(inputs)
    }

    fn strictly_order_preserving(&self, inputs: &[ExprProperties]) -> DfResult<bool> {
        self.inner.inner().strictly_order_preserving(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.inner().coerce_types(arg_types)
    }

    fn struct_field_mapping(
        &self,
        literal_args: &[Option<ScalarValue>],
    ) -> Option<StructFieldMapping> {
        self.inner.inner().struct_field_mapping(literal_args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.inner().documentation()
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.inner.inner().placement(args)
    }
}

/// One argument's value per row: the same for every row, or one each.
enum PerRow {
    Same(u64),
    Each(Vec<u64>),
}

impl PerRow {
    fn at(&self, row: usize) -> u64 {
        match self {
            PerRow::Same(v) => *v,
            PerRow::Each(values) => values.get(row).copied().unwrap_or(0),
        }
    }
}

/// The byte length of a string (or binary) argument in each row; a null is 0.
fn lengths(arg: Option<&ColumnarValue>) -> PerRow {
    match arg {
        None => PerRow::Same(0),
        Some(ColumnarValue::Scalar(value)) => PerRow::Same(scalar_length(value)),
        Some(ColumnarValue::Array(array)) => PerRow::Each(array_lengths(array)),
    }
}

fn scalar_length(value: &ScalarValue) -> u64 {
    match value {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => s.len() as u64,
        ScalarValue::Binary(Some(b))
        | ScalarValue::LargeBinary(Some(b))
        | ScalarValue::BinaryView(Some(b)) => b.len() as u64,
        other => other.size() as u64,
    }
}

fn array_lengths(array: &ArrayRef) -> Vec<u64> {
    let len = |v: Option<&str>| v.map_or(0, |s| s.len() as u64);
    match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().map(len).collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().map(len).collect(),
        DataType::Utf8View => array.as_string_view().iter().map(len).collect(),
        // Anything else: its share of the array's memory, evenly.
        _ => {
            let rows = array.len().max(1);
            vec![(array.get_array_memory_size() / rows) as u64; array.len()]
        }
    }
}

/// A count argument in each row; negative and null are 0, one that is not an integer is 0.
fn counts(arg: Option<&ColumnarValue>) -> DfResult<PerRow> {
    Ok(match arg {
        None => PerRow::Same(0),
        Some(ColumnarValue::Scalar(value)) => {
            let n = value.cast_to(&DataType::Int64)?;
            match n {
                ScalarValue::Int64(Some(n)) => PerRow::Same(n.max(0) as u64),
                _ => PerRow::Same(0),
            }
        }
        Some(ColumnarValue::Array(array)) => {
            let ints = arrow::compute::cast(array, &DataType::Int64)?;
            let ints = ints.as_primitive::<Int64Type>();
            PerRow::Each(
                (0..ints.len())
                    .map(|i| {
                        if ints.is_valid(i) {
                            ints.value(i).max(0) as u64
                        } else {
                            0
                        }
                    })
                    .collect(),
            )
        }
    })
}

fn sum_rows(rows: usize, per_row: impl Fn(usize) -> u64) -> u64 {
    (0..rows).fold(0u64, |total, row| total.saturating_add(per_row(row)))
}

/// `repeat(text, n)`: the text n times.
fn repeat_bytes(args: &[ColumnarValue], rows: usize) -> DfResult<u64> {
    let (text, n) = (lengths(args.first()), counts(args.get(1))?);
    Ok(sum_rows(rows, |r| text.at(r).saturating_mul(n.at(r))))
}

/// `lpad(text, n [, fill])`, `rpad`: n characters of up to four bytes (or the text, if longer).
fn pad_bytes(args: &[ColumnarValue], rows: usize) -> DfResult<u64> {
    let (text, n) = (lengths(args.first()), counts(args.get(1))?);
    Ok(sum_rows(rows, |r| {
        n.at(r).saturating_mul(4).max(text.at(r))
    }))
}

/// `replace(text, from, to)`: every occurrence of `from` (at most one per byte, and one more
/// when `from` is empty) becomes `to`.
fn replace_bytes(args: &[ColumnarValue], rows: usize) -> DfResult<u64> {
    let (text, from, to) = (
        lengths(args.first()),
        lengths(args.get(1)),
        lengths(args.get(2)),
    );
    Ok(sum_rows(rows, |r| {
        let matches = text.at(r) / from.at(r).max(1) + 1;
        text.at(r).saturating_add(matches.saturating_mul(to.at(r)))
    }))
}

/// `regexp_replace(text, pattern, to [, flags])`: a match at every position at most, each
/// becoming `to`, whose back-references copy at most the text once each.
fn regexp_replace_bytes(args: &[ColumnarValue], rows: usize) -> DfResult<u64> {
    let (text, to) = (lengths(args.first()), lengths(args.get(2)));
    let references = match args.get(2) {
        Some(ColumnarValue::Scalar(value)) => PerRow::Same(references_in(value)),
        // A replacement per row: as if every byte of it were a back-reference.
        _ => lengths(args.get(2)),
    };
    Ok(sum_rows(rows, |r| {
        let t = text.at(r);
        (t + 1)
            .saturating_mul(to.at(r))
            .saturating_add(t.saturating_mul(references.at(r) + 1))
    }))
}

fn references_in(value: &ScalarValue) -> u64 {
    match value {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => {
            s.bytes().filter(|b| matches!(b, b'\\' | b'$')).count() as u64
        }
        _ => 0,
    }
}

/// `array_repeat(element, n)`: the element n times.
fn array_repeat_bytes(args: &[ColumnarValue], rows: usize) -> DfResult<u64> {
    let (element, n) = (lengths(args.first()), counts(args.get(1))?);
    Ok(sum_rows(rows, |r| {
        element.at(r).max(8).saturating_mul(n.at(r))
    }))
}
