"""Runs bench/report.sql (or SQL_FILE) with DuckDB over a gpuledger data directory; prints
the median time.

    python3 bench/duckdb_report.py DATA_DIR [RUNS [SQL_FILE]]
"""
import os
import resource
import statistics
import sys
import time

import duckdb

data = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
sql_file = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "report.sql")
sql = open(sql_file).read()
con = duckdb.connect()
con.execute(
    f"CREATE VIEW samples AS SELECT * FROM read_parquet('{data}/samples/*/*.parquet', hive_partitioning = true)"
)
times = []
for _ in range(runs):
    t = time.perf_counter()
    rows = con.execute(sql).fetchall()
    times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"duckdb {duckdb.__version__}: {len(rows)} accounts, median {statistics.median(times):.2f} s over {runs} runs "
      f"(min {min(times):.2f}, max {max(times):.2f}); peak RSS {peak:.0f} MiB")
for r in rows[:3]:
    print("  ", r)
