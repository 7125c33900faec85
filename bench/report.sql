-- The monthly per-account report from raw samples: the same text runs in DataFusion
-- (`gpuledger bench report`) and in DuckDB (`bench/duckdb_report.py`).
SELECT account,
       COUNT(*) AS samples,
       SUM(interval_s) AS gpu_seconds,
       SUM(gpu_util_pct * interval_s) / SUM(CASE WHEN gpu_util_pct IS NOT NULL THEN interval_s END) AS mean_gpu_util_pct,
       SUM(tensor_active * interval_s) / SUM(CASE WHEN tensor_active IS NOT NULL THEN interval_s END) AS mean_tensor_active,
       SUM(CAST(mem_used_bytes AS DOUBLE) * interval_s) / SUM(CAST(mem_total_bytes AS DOUBLE) * interval_s) AS mean_mem_util,
       COUNT(DISTINCT job_id) AS jobs
FROM samples
WHERE account IS NOT NULL
GROUP BY account
ORDER BY account
