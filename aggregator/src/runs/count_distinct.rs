//! `COUNT(DISTINCT)`'s grouped accumulator for `Utf8View` (the tables' string columns):
//! each group's distinct values in a set, and a row whose group and value are the previous
//! counted row's is skipped without hashing. DataFusion has no grouped accumulator for
//! distinct strings: it gathers each group's rows of every batch into arrays of their own and
//! hashes every row into a per-group set.
//!
//! Two rows of one array with equal views hold equal strings (a view is the length and the
//! first bytes, plus where the rest lies), so comparing views is enough to skip; rows whose
//! views differ are hashed, whatever they hold.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListBuilder, StringViewBuilder,
};
use arrow::datatypes::{DataType, Field};
use datafusion::common::Result;
use datafusion::functions_aggregate::count::Count;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};

use super::{counted_rows, RunGroups};

impl RunGroups for Count {
    fn has_run_groups(&self, args: &AccumulatorArgs) -> bool {
        args.is_distinct
            && args.exprs.len() == 1
            && args.expr_fields[0].data_type() == &DataType::Utf8View
    }

    fn run_groups(&self, args: &AccumulatorArgs) -> Option<Box<dyn GroupsAccumulator>> {
        self.has_run_groups(args)
            .then(|| Box::new(DistinctViewCount::default()) as Box<dyn GroupsAccumulator>)
    }
}

/// Each group's distinct strings, and the bytes they hold (for `size`).
#[derive(Debug, Default)]
struct DistinctViewCount {
    groups: Vec<HashSet<Box<str>>>,
    heap_bytes: usize,
}

/// What one stored string costs beside its bytes: the box and a hash-table slot.
const PER_VALUE_BYTES: usize = 2 * size_of::<Box<str>>();

impl DistinctViewCount {
    fn insert(&mut self, group: usize, value: &str) {
        let set = &mut self.groups[group];
        if !set.contains(value) {
            self.heap_bytes += value.len() + PER_VALUE_BYTES;
            set.insert(value.into());
        }
    }

    fn take(&mut self, emit_to: EmitTo) -> Vec<HashSet<Box<str>>> {
        let taken = emit_to.take_needed(&mut self.groups);
        let bytes: usize = taken
            .iter()
            .flatten()
            .map(|v| v.len() + PER_VALUE_BYTES)
            .sum();
        self.heap_bytes = self.heap_bytes.saturating_sub(bytes);
        taken
    }

    fn list_builder(capacity: usize) -> ListBuilder<StringViewBuilder> {
        // The state's field, as DataFusion's `Count::state_fields` declares it.
        ListBuilder::with_capacity(StringViewBuilder::new(), capacity)
            .with_field(Arc::new(Field::new_list_field(DataType::Utf8View, true)))
    }
}

impl GroupsAccumulator for DistinctViewCount {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups.resize_with(total_num_groups, HashSet::new);
        let strings = values[0].as_string_view();
        let views = strings.views();
        let counted = counted_rows(strings.nulls(), opt_filter);
        let mut previous: Option<(usize, u128)> = None;
        for (row, &group) in group_indices.iter().enumerate() {
            if counted.as_ref().is_some_and(|c| c.is_null(row)) {
                continue;
            }
            let key = (group, views[row]);
            if previous != Some(key) {
                previous = Some(key);
                self.insert(group, strings.value(row));
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let groups = self.take(emit_to);
        let counts = groups.iter().map(|set| set.len() as i64);
        Ok(Arc::new(Int64Array::from_iter_values(counts)))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let groups = self.take(emit_to);
        let mut lists = Self::list_builder(groups.len());
        for set in groups {
            for value in set {
                lists.values().append_value(value);
            }
            lists.append(true);
        }
        Ok(vec![Arc::new(lists.finish())])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups.resize_with(total_num_groups, HashSet::new);
        let lists = values[0].as_list::<i32>();
        for (row, &group) in group_indices.iter().enumerate() {
            if lists.is_null(row) {
                continue;
            }
            let list = lists.value(row);
            let strings = list.as_string_view();
            for value in strings.iter().flatten() {
                self.insert(group, value);
            }
        }
        Ok(())
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        // Each row's state is the list of its one value, empty where the row does not count.
        let strings = values[0].as_string_view();
        let counted = counted_rows(strings.nulls(), opt_filter);
        let mut lists = Self::list_builder(strings.len());
        for row in 0..strings.len() {
            if counted.as_ref().is_none_or(|c| c.is_valid(row)) {
                lists.values().append_value(strings.value(row));
            }
            lists.append(true);
        }
        Ok(vec![Arc::new(lists.finish())])
    }

    fn size(&self) -> usize {
        self.groups.capacity() * size_of::<HashSet<Box<str>>>() + self.heap_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use proptest::prelude::*;

    /// One input row: its group, its value (None: null) and whether a filter passes it.
    type Row = (usize, Option<u8>, bool);

    fn name(value: u8) -> String {
        // Some values past the 12 bytes a view holds inline.
        if value.is_multiple_of(2) {
            format!("job-{value}")
        } else {
            format!("a-longer-job-name-{value}")
        }
    }

    /// Rows in runs of one group and value, long and short.
    fn batch(groups: usize) -> impl Strategy<Value = Vec<Row>> {
        let run = (
            0..groups,
            prop::option::weighted(0.9, 0u8..6),
            prop_oneof![1usize..3, 1usize..30],
            prop::bool::weighted(0.8),
        );
        prop::collection::vec(run, 0..60).prop_map(|runs| {
            runs.into_iter()
                .flat_map(|(group, value, len, pass)| {
                    std::iter::repeat_n((group, value, pass), len)
                })
                .collect()
        })
    }

    fn update(acc: &mut DistinctViewCount, rows: &[Row], filtered: bool, groups: usize) {
        let indices: Vec<usize> = rows.iter().map(|r| r.0).collect();
        let values: StringViewArray = rows.iter().map(|r| r.1.map(name)).collect();
        let filter: Option<BooleanArray> =
            filtered.then(|| rows.iter().map(|r| Some(r.2)).collect());
        acc.update_batch(&[Arc::new(values)], &indices, filter.as_ref(), groups)
            .unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Against a set per group: batches updated directly, through a merged partial state,
        /// and converted row by row to states (as when DataFusion skips partial aggregation);
        /// emitted in two parts.
        #[test]
        fn counts_equal_a_set_per_group(
            batches in prop::collection::vec((batch(5), any::<bool>(), 0u8..3), 1..6),
            emit_first in 0usize..6,
        ) {
            let groups = 5;
            let mut expected = vec![HashSet::new(); groups];
            for (rows, filtered, _) in &batches {
                for &(group, value, pass) in rows {
                    if let (Some(v), true) = (value, !filtered || pass) {
                        expected[group].insert(name(v));
                    }
                }
            }
            let mut acc = DistinctViewCount::default();
            let mut partial = DistinctViewCount::default();
            for (rows, filtered, path) in &batches {
                match path {
                    0 => update(&mut acc, rows, *filtered, groups),
                    1 => update(&mut partial, rows, *filtered, groups),
                    _ => {
                        let values: StringViewArray = rows.iter().map(|r| r.1.map(name)).collect();
                        let filter: Option<BooleanArray> = filtered.then(|| rows.iter().map(|r| Some(r.2)).collect());
                        let state = acc.convert_to_state(&[Arc::new(values)], filter.as_ref()).unwrap();
                        let indices: Vec<usize> = rows.iter().map(|r| r.0).collect();
                        acc.merge_batch(&state, &indices, groups).unwrap();
                    }
                }
            }
            partial.groups.resize_with(groups, HashSet::new);
            let state = partial.state(EmitTo::All).unwrap();
            let indices: Vec<usize> = (0..groups).collect();
            acc.merge_batch(&state, &indices, groups).unwrap();
            let mut counts = Vec::new();
            for emit in [EmitTo::First(emit_first.min(groups)), EmitTo::All] {
                let array = acc.evaluate(emit).unwrap();
                counts.extend(array.as_primitive::<arrow::datatypes::Int64Type>().values().iter().copied());
            }
            let expected: Vec<i64> = expected.iter().map(|s| s.len() as i64).collect();
            prop_assert_eq!(counts, expected);
            prop_assert_eq!(acc.heap_bytes, 0, "emitting everything releases every value");
        }
    }
}
