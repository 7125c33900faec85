//! The operator's SQL over the stored tables (`POST /api/v1/query`), bounded so that no query
//! takes the service down: its own DataFusion session whose memory pool holds every operator
//! that buffers (sorts, joins, aggregations spill to disk past it), functions that could
//! build a value of any size refuse to ([`functions`]), a result larger than a quarter of the
//! pool is refused, one query runs at a time, and each has a time-out. The aggregator's own
//! queries (status, billing, the usage feed) run in [`crate::query::Query`]'s session, outside
//! these limits: their SQL is gpuledger's, not a caller's.

pub mod functions;

use std::num::NonZeroUsize;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::execution::disk_manager::DiskManagerBuilder;
use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionContext;
use futures_util::StreamExt;
use gpuledger_model::units::{ByteSize, DurationSpec};
use tokio::sync::Semaphore;

use crate::layout::Layout;
use crate::query::Query;
use crate::{Error, Result};

/// The longest SQL text accepted: an operator's query is a few lines, and planning work grows
/// with the text.
pub const MAX_SQL_BYTES: usize = 16 * 1024;

/// The deepest nesting of expressions accepted (`1+1+...+1` nests one level a term). DataFusion
/// plans and evaluates expressions recursively, on threads with 2 MiB stacks: a debug build
/// overflowed past 800 levels, which aborts the whole service.
pub const MAX_EXPRESSION_DEPTH: usize = 256;

/// The SQL API's limits, as options of `gpuledger aggregator`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct SqlLimits {
    /// Memory one SQL API query may hold (sorts, joins and aggregations spill to disk past
    /// it); its result may hold a quarter of it.
    #[arg(long, default_value = "512MiB")]
    pub sql_memory_limit: ByteSize,
    /// A SQL API query, with its wait for the one before it, must finish within this.
    #[arg(long, default_value = "30s")]
    pub sql_timeout: DurationSpec,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits {
            sql_memory_limit: ByteSize(512 << 20),
            sql_timeout: DurationSpec::from_secs(30),
        }
    }
}

impl SqlLimits {
    fn memory_bytes(&self) -> usize {
        usize::try_from(self.sql_memory_limit.0).unwrap_or(usize::MAX)
    }

    /// The most a result (as Arrow arrays) may hold.
    fn result_bytes(&self) -> usize {
        self.memory_bytes() / 4
    }
}

/// The SQL API's session: one query at a time, each within [`SqlLimits`].
pub struct SqlApi {
    ctx: SessionContext,
    limits: SqlLimits,
    one_at_a_time: Semaphore,
}

impl std::fmt::Debug for SqlApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlApi")
            .field("limits", &self.limits)
            .finish()
    }
}

impl SqlApi {
    pub async fn open(layout: &Layout, limits: SqlLimits) -> Result<Self> {
        let memory = limits.memory_bytes();
        let pool = TrackConsumersPool::new(FairSpillPool::new(memory), NonZeroUsize::MIN);
        let spill = DiskManagerBuilder::default()
            .with_max_temp_directory_size(limits.sql_memory_limit.0.saturating_mul(8));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(pool))
            .with_disk_manager_builder(spill);
        let ctx = crate::query::session(layout, runtime).await?;
        functions::bound_value_sizes(&ctx, limits.result_bytes())?;
        Ok(SqlApi {
            ctx,
            limits,
            one_at_a_time: Semaphore::new(1),
        })
    }

    /// Runs a caller's SQL: queries only (no DDL, which could read any file; no DML; no
    /// `SET`), within the limits. A query that fails reading a corrupt file runs again once
    /// `query` has set that file aside.
    pub async fn run(&self, query: &Query, sql: &str) -> Result<Vec<RecordBatch>> {
        if sql.len() > MAX_SQL_BYTES {
            return Err(refused(format!(
                "{} bytes of SQL; at most {MAX_SQL_BYTES} are accepted",
                sql.len()
            )));
        }
        expression_depth_within_bounds(sql)?;
        let timeout = self.limits.sql_timeout;
        let attempt = async {
            // One query at a time, in the order they came; the wait counts against the time-out.
            let _running = self.one_at_a_time.acquire().await;
            match self.collect(sql).await {
                Err(Error::Query(e))
                    if crate::query::reads_a_file(&e) && query.quarantine_after_failure()? =>
                {
                    tracing::warn!(error = %e, "query failed on a corrupt file; retried without it");
                    self.collect(sql).await
                }
                outcome => outcome,
            }
        };
        match tokio::time::timeout(timeout.0, attempt).await {
            Ok(outcome) => outcome.map_err(|e| self.explain(e)),
            Err(_) => Err(refused(format!(
                "did not finish within {timeout} (--sql-timeout, counting its wait for the query before it): filter on `date` or `hour`, or aggregate"
            ))),
        }
    }

    async fn collect(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        let options = datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let frame = self.ctx.sql_with_options(sql, options).await?;
        let mut stream = frame.execute_stream().await?;
        let (mut batches, mut bytes) = (Vec::new(), 0usize);
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            bytes = bytes.saturating_add(batch.get_array_memory_size());
            if bytes > self.limits.result_bytes() {
                return Err(refused(format!(
                    "the result passed {} (a quarter of --sql-memory-limit): add LIMIT, filter or aggregate",
                    ByteSize(self.limits.result_bytes() as u64)
                )));
            }
            batches.push(batch);
        }
        Ok(batches)
    }

    /// A query error in the caller's terms: over the memory pool it says which limit.
    fn explain(&self, e: Error) -> Error {
        let Error::Query(q) = e else { return e };
        let message = q.to_string();
        if matches!(
            q.find_root(),
            datafusion::error::DataFusionError::ResourcesExhausted(_)
        ) {
            return refused(format!(
                "the query needs more memory than the {} the SQL API may use (--sql-memory-limit): filter, aggregate or add LIMIT ({message})",
                self.limits.sql_memory_limit
            ));
        }
        refused(message)
    }
}

/// Refuses SQL whose expressions nest deeper than [`MAX_EXPRESSION_DEPTH`]. Parsing builds the
/// tree without recursion, but dropping it recurses, so the text is parsed (and the tree
/// dropped) on a thread with a stack that the deepest tree 16 KiB can write fits in; SQL that
/// does not parse is left for DataFusion to explain.
fn expression_depth_within_bounds(sql: &str) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    struct Depth(usize);
    impl Visitor for Depth {
        type Break = ();
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.0 += 1;
            if self.0 > MAX_EXPRESSION_DEPTH {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
        fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.0 -= 1;
            ControlFlow::Continue(())
        }
    }

    let text = sql.to_owned();
    let too_deep = std::thread::Builder::new()
        .name("sql-depth".into())
        .stack_size(64 << 20)
        .spawn(move || {
            let Ok(statements) = Parser::parse_sql(&GenericDialect {}, &text) else {
                return false;
            };
            statements.visit(&mut Depth(0)).is_break()
        })
        .map_err(|e| Error::Unavailable(format!("a thread to check the SQL: {e}")))?
        .join()
        .unwrap_or(true);
    if too_deep {
        return Err(refused(format!(
            "expressions nest deeper than {MAX_EXPRESSION_DEPTH} levels"
        )));
    }
    Ok(())
}

fn refused(message: String) -> Error {
    Error::BadRequest {
        field: "sql".into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn api(memory: u64, timeout_ms: u64) -> (SqlApi, Query, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        let limits = SqlLimits {
            sql_memory_limit: ByteSize(memory),
            sql_timeout: DurationSpec(std::time::Duration::from_millis(timeout_ms)),
        };
        let api = SqlApi::open(&layout, limits).await.unwrap();
        let query = Query::open(&layout).await.unwrap();
        (api, query, dir)
    }

    /// The message of a refused query; fails when it was not refused for its SQL.
    async fn refusal(api: &SqlApi, query: &Query, sql: &str) -> String {
        match api.run(query, sql).await {
            Err(Error::BadRequest { field, message }) if field == "sql" => message,
            other => panic!("{sql}: {other:?}"),
        }
    }

    async fn one_number(api: &SqlApi, query: &Query, sql: &str) -> i64 {
        let batches = api.run(query, sql).await.unwrap();
        let column =
            arrow::compute::cast(batches[0].column(0), &arrow::datatypes::DataType::Int64).unwrap();
        arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&column).value(0)
    }

    #[tokio::test]
    async fn functions_that_would_build_huge_values_refuse_before_building_them() {
        let (api, query, _dir) = api(64 << 20, 30_000).await;
        for (sql, says) in [
            (
                "SELECT length(repeat('x', 500000000))",
                "repeat() would build 500000000 bytes",
            ),
            ("SELECT length(lpad('x', 1000000000))", "lpad() would build"),
            (
                "SELECT length(rpad('x', 1000000000, 'ab'))",
                "rpad() would build",
            ),
            (
                "SELECT length(replace(repeat('x', 1000000), 'x', repeat('y', 100)))",
                "replace() would build",
            ),
            // Each step within the bound, the chain past it: refused where it passes.
            (
                "SELECT length(concat(repeat('x', 9000000), repeat('x', 9000000)))",
                "concat() folded its constants into 18000064 bytes",
            ),
        ] {
            let message = refusal(&api, &query, sql).await;
            assert!(message.contains(says), "{sql}: {message}");
            assert!(message.contains("--sql-memory-limit"), "{message}");
        }
        // Within the bound they answer as before, constant or per row.
        assert_eq!(
            one_number(&api, &query, "SELECT length(repeat('ab', 1000))").await,
            2000
        );
        assert_eq!(
            one_number(
                &api,
                &query,
                "SELECT sum(length(lpad('x', CAST(v AS INT)))) FROM generate_series(1, 100) t(v)"
            )
            .await,
            5050
        );
    }

    #[tokio::test]
    async fn a_query_over_the_memory_pool_or_the_result_bound_fails_with_its_reason() {
        let (api, query, _dir) = api(16 << 20, 60_000).await;
        let join = "SELECT count(*) FROM generate_series(1, 3000000) a(v) \
                    JOIN generate_series(1, 3000000) b(w) ON v = w";
        let message = refusal(&api, &query, join).await;
        assert!(
            message.contains("needs more memory than the 16MiB the SQL API may use"),
            "{message}"
        );
        let message = refusal(
            &api,
            &query,
            "SELECT v FROM generate_series(1, 3000000) t(v)",
        )
        .await;
        assert!(message.contains("the result passed 4MiB"), "{message}");
        // The session is still there for the next query.
        assert_eq!(one_number(&api, &query, "SELECT 40 + 2").await, 42);
    }

    #[tokio::test]
    async fn a_slow_query_times_out_and_the_next_runs_only_after_it() {
        let (api, query, _dir) = api(64 << 20, 1_000).await;
        let api = Arc::new(api);
        let query = Arc::new(query);
        let slow = "SELECT sum(v % 7) FROM generate_series(1, 100000000000) t(v)";
        let started = std::time::Instant::now();
        let first = {
            let (api, query) = (Arc::clone(&api), Arc::clone(&query));
            tokio::spawn(async move { refusal(&api, &query, slow).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(one_number(&api, &query, "SELECT 1").await, 1);
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(950),
            "answered after {:?}, while the first still ran",
            started.elapsed()
        );
        let message = first.await.unwrap();
        assert!(message.contains("did not finish within 1s"), "{message}");
    }

    #[tokio::test]
    async fn statements_other_than_queries_and_overlong_text_are_refused() {
        let (api, query, _dir) = api(64 << 20, 30_000).await;
        for sql in [
            "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
            "SET datafusion.execution.batch_size = 1",
            "DROP TABLE samples",
        ] {
            refusal(&api, &query, sql).await;
        }
        let long = format!("SELECT {}1", "1 + ".repeat(MAX_SQL_BYTES / 4));
        let message = refusal(&api, &query, &long).await;
        assert!(message.contains("at most 16384 are accepted"), "{message}");
    }

    #[tokio::test]
    async fn expressions_nested_past_the_bound_are_refused_and_those_within_it_run() {
        let (api, query, _dir) = api(64 << 20, 30_000).await;
        let sum = |terms: usize, term: &str| {
            format!("SELECT {term}{}", format!("+{term}").repeat(terms - 1))
        };
        // As deep as allowed: constant (folded while planning) and per row (evaluated).
        let constant = sum(MAX_EXPRESSION_DEPTH - 1, "1");
        assert_eq!(
            one_number(&api, &query, &constant).await,
            MAX_EXPRESSION_DEPTH as i64 - 1
        );
        let per_row = format!(
            "{} FROM generate_series(1, 3) t(v) ORDER BY 1 LIMIT 1",
            sum(MAX_EXPRESSION_DEPTH - 1, "v")
        );
        assert_eq!(
            one_number(&api, &query, &per_row).await,
            MAX_EXPRESSION_DEPTH as i64 - 1
        );
        // The deepest the text allows, a term per two bytes: refused, the service still up.
        let deepest = sum((MAX_SQL_BYTES - 8) / 2, "1");
        assert!(deepest.len() <= MAX_SQL_BYTES);
        let message = refusal(&api, &query, &deepest).await;
        assert!(message.contains("nest deeper than 256 levels"), "{message}");
        assert_eq!(one_number(&api, &query, "SELECT 7").await, 7);
    }
}
