//! The scheduler's `/metrics`: jobs by state, GPUs in use, fair share and cycle counters,
//! rendered in the Prometheus text format from the service's state under its lock.

use std::collections::BTreeMap;

use crate::Service;

impl Service {
    /// The Prometheus text exposition: jobs by state, pending jobs by account and reason,
    /// GPUs allocated, idle, planned, reserved and drained, and counters of starts,
    /// preemptions, resizes and cycles.
    pub fn metrics(&self) -> String {
        use std::fmt::Write as _;
        let now = self.now_s();
        let inner = self.lock();
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "gpuledger_scheduler_jobs",
            "gauge",
            "Jobs the scheduler holds now, by state.",
        );
        let running = inner
            .sched
            .running()
            .filter(|r| r.preempting.is_none())
            .count();
        let preempting = inner.sched.running().count() - running;
        let mut lines = vec![
            ("pending", inner.sched.pending().len()),
            ("preempting", preempting),
            ("running", running),
        ];
        lines.sort();
        let mut body = String::new();
        for (state, n) in lines {
            let _ = writeln!(body, "gpuledger_scheduler_jobs{{state=\"{state}\"}} {n}");
        }
        out.push_str(&body);
        let mut pending: BTreeMap<(String, String), u64> = BTreeMap::new();
        for p in inner.sched.pending() {
            *pending
                .entry((p.spec.account.to_string(), p.reason.to_string()))
                .or_default() += 1;
        }
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_pending_jobs Pending jobs, by account and reason.\n# TYPE gpuledger_scheduler_pending_jobs gauge"
        );
        for ((account, reason), n) in &pending {
            let _ = writeln!(
                out,
                "gpuledger_scheduler_pending_jobs{{account=\"{account}\",reason=\"{reason}\"}} {n}"
            );
        }
        let cluster = inner.sched.cluster();
        let mut allocated_on = vec![0u32; cluster.node_count()];
        for r in inner.sched.running() {
            for slot in &r.placement.0 {
                allocated_on[slot.node] += slot.mask.count_ones();
            }
        }
        let allocated: u32 = allocated_on.iter().sum();
        let mut reserved_nodes: Vec<usize> = inner
            .sched
            .reservations()
            .iter()
            .filter(|r| r.start_s <= now && now < r.end_s)
            .flat_map(|r| r.nodes.iter().copied())
            .collect();
        reserved_nodes.sort_unstable();
        reserved_nodes.dedup();
        let reserved: u32 = reserved_nodes
            .iter()
            .map(|n| cluster.node_spec(*n).gpus - allocated_on[*n])
            .sum();
        let drained_nodes: Vec<usize> = (0..cluster.node_count())
            .filter(|n| inner.sched.is_drained(*n) && reserved_nodes.binary_search(n).is_err())
            .collect();
        let drained: u32 = drained_nodes
            .iter()
            .map(|n| cluster.node_spec(*n).gpus - allocated_on[*n])
            .sum();
        let planned: u32 = inner
            .sched
            .planned_idle_gpus()
            .filter(|(node, _)| {
                reserved_nodes.binary_search(node).is_err() && !inner.sched.is_drained(*node)
            })
            .map(|(_, n)| n)
            .sum();
        let idle = cluster.total_gpus() - allocated - reserved - drained - planned;
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_gpus GPUs by state: allocated to running jobs, reserved (free, in an advance reservation in force), drained (free, on a node out of service), planned (free, held by backfill for a waiting job's planned start: only a job that ends before it may use them), idle.\n# TYPE gpuledger_scheduler_gpus gauge"
        );
        for (state, n) in [
            ("allocated", allocated),
            ("drained", drained),
            ("idle", idle),
            ("planned", planned),
            ("reserved", reserved),
        ] {
            let _ = writeln!(out, "gpuledger_scheduler_gpus{{state=\"{state}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_node_drained 1 for each node out of service (drained by an operator, or by the scheduler when a job's processes outlived SIGKILL).\n# TYPE gpuledger_scheduler_node_drained gauge"
        );
        for (node, d) in &inner.state.drained {
            let by_service = d.by == crate::nodes::DRAINED_BY_SERVICE;
            let _ = writeln!(
                out,
                "gpuledger_scheduler_node_drained{{node=\"{node}\",by_scheduler=\"{by_service}\"}} 1"
            );
        }
        let unkillable = inner
            .state
            .jobs
            .values()
            .filter(|j| j.unkillable_s.is_some() && !j.state.is_done())
            .count();
        let _ = writeln!(
            out,
            "# HELP gpuledger_scheduler_unkillable_jobs Jobs with processes that outlived SIGKILL past the timeout, still holding their GPUs.\n# TYPE gpuledger_scheduler_unkillable_jobs gauge\ngpuledger_scheduler_unkillable_jobs {unkillable}"
        );
        let c = &inner.counters;
        for (name, help, value) in [
            (
                "gpuledger_scheduler_jobs_started_total",
                "Job starts (a requeued job starting again counts again).",
                c.started as f64,
            ),
            (
                "gpuledger_scheduler_preemptions_total",
                "Jobs signalled to make room for a higher tier.",
                c.preempted as f64,
            ),
            (
                "gpuledger_scheduler_resizes_total",
                "Elastic jobs grown or shrunk.",
                c.resized as f64,
            ),
            (
                "gpuledger_scheduler_cycles_total",
                "Scheduling cycles run.",
                c.cycles as f64,
            ),
            (
                "gpuledger_scheduler_cycle_seconds_total",
                "Time spent in scheduling cycles.",
                c.cycle_seconds,
            ),
            (
                "gpuledger_scheduler_event_batches_refused_total",
                "Batches of job events the aggregator refused for good, set aside in refused-events/.",
                c.event_batches_refused as f64,
            ),
            (
                "gpuledger_scheduler_jobs_out_of_memory_total",
                "Jobs the kernel's OOM killer hit at their memory limit (--job-memory-per-gpu); they end failed.",
                c.out_of_memory as f64,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        out
    }
}
