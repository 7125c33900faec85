//! Alibaba's 2023 GPU-sharing trace (`cluster-trace-gpu-v2023`): its pod list, whose pods
//! ask for whole GPUs or a thousandth-share of one, and its node list, the GPUs and GPU type of
//! each node. A type gpuledger has a model for is that model's type (`V100M16` is
//! `v100-16gb`); the types Alibaba does not disclose (`G1`, `G2`, `G3`) are types of their own,
//! scheduled by name and never taken for a model.

use gpuledger_model::job::Outcome;
use gpuledger_model::{AccountId, GpuModel, GpuShare, GpuType, JobId};

use super::{
    data_rows, error_at, header_index, seconds_in_range, submit_in_range, LimitEstimate, TraceError,
};
use crate::core::JobSpec;
use crate::sim::SimJob;

/// What a pod's `gpu_spec` (the GPU types it may run on) becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSpec {
    /// Not read: the cluster replayed on is not Alibaba's (one model everywhere).
    Ignored,
    /// The job's GPU types: the cluster is Alibaba's node list.
    Types,
}

/// The GPU model of an Alibaba GPU type name (`V100M16`, `V100M32`, `P100`, `T4`, `A10`), or of
/// one of gpuledger's own model names.
fn alibaba_model(name: &str) -> Option<GpuModel> {
    match name.to_ascii_uppercase().as_str() {
        "V100M16" => Some(GpuModel::V100_16),
        "V100M32" => Some(GpuModel::V100_32),
        "P100" => Some(GpuModel::P100),
        "T4" => Some(GpuModel::T4),
        "A10" => Some(GpuModel::A10),
        _ => name.to_ascii_lowercase().parse().ok(),
    }
}

/// The GPU type of an Alibaba type name: its model's where gpuledger has one, else the name
/// itself (`G2`).
pub fn alibaba_type(
    name: &str,
    err: &impl Fn(&str, String) -> TraceError,
    field: &str,
) -> Result<GpuType, TraceError> {
    match alibaba_model(name) {
        Some(model) => Ok(model.into()),
        None => GpuType::new(name).map_err(|e| err(field, e.to_string())),
    }
}

/// An Alibaba pod list read: the GPU jobs, and what was left out.
#[derive(Clone, Debug, Default)]
pub struct AlibabaTrace {
    pub jobs: Vec<SimJob>,
    /// Pods that asked for no GPU (gpuledger schedules GPUs only).
    pub cpu_only: usize,
    /// Pods never scheduled or never deleted in the trace (no run time to replay).
    pub no_run: usize,
}

/// Whether a trace's header is Alibaba's pod list (it has `gpu_milli`).
pub fn is_alibaba_header(header: &str) -> bool {
    header.split(',').any(|c| c.trim() == "gpu_milli")
}

/// Reads Alibaba's 2023 GPU-sharing trace (`openb_pod_list_*.csv`: `name,cpu_milli,
/// memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
/// scheduled_time`). A pod asks for `num_gpu` whole GPUs, or with `num_gpu` 1 and `gpu_milli`
/// under 1000 for that share of one GPU. It is submitted at `creation_time` and runs for
/// `deletion_time - scheduled_time`; a `Failed` pod fails. The trace names no tenant: each QoS
/// class (`qos`) is an account (`qos-ls`, `qos-be`, ...). `gpu_spec` (GPU types joined by
/// `|`) becomes the job's GPU types where `gpu_spec` says so; CPU and memory requests are not
/// scheduled.
pub fn parse_alibaba(
    text: &str,
    origin: &str,
    estimate: LimitEstimate,
    gpu_spec: GpuSpec,
) -> Result<AlibabaTrace, TraceError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let idx = header_index(
        origin,
        header,
        &[
            "num_gpu",
            "gpu_milli",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        ],
    )?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let optional = |name: &str| cols.iter().position(|c| *c == name);
    let (name_col, qos_col, phase_col) = (optional("name"), optional("qos"), optional("pod_phase"));
    let spec_col = optional("gpu_spec");
    let mut out = AlibabaTrace::default();
    for (line_no, cells) in data_rows(lines) {
        let err = error_at(origin, line_no);
        let cell = |col: Option<usize>| {
            col.and_then(|i| cells.get(i).copied())
                .filter(|v| !v.is_empty() && *v != "nan")
        };
        let number = |i: usize, field: &str| -> Result<Option<u64>, TraceError> {
            cell(Some(idx[i]))
                .map(|v| {
                    // pandas writes whole numbers of float columns as `9437497.0`.
                    v.strip_suffix(".0")
                        .unwrap_or(v)
                        .parse::<u64>()
                        .map_err(|_| err(field, format!("`{v}` is not a whole number")))
                })
                .transpose()
        };
        let gpus = number(0, "num_gpu")?.ok_or_else(|| err("num_gpu", "missing".into()))?;
        if gpus == 0 {
            out.cpu_only += 1;
            continue;
        }
        let gpus =
            u32::try_from(gpus).map_err(|_| err("num_gpu", format!("{gpus} is too large")))?;
        let milli = number(1, "gpu_milli")?.unwrap_or(1000);
        let milli = u32::try_from(milli).unwrap_or(u32::MAX);
        let share = if gpus == 1 {
            GpuShare::from_milli(milli).map_err(|e| err("gpu_milli", e.to_string()))?
        } else if milli == 1000 {
            None
        } else {
            return Err(err(
                "gpu_milli",
                format!("{milli} with num_gpu {gpus}: a share is of one GPU"),
            ));
        };
        let created =
            number(2, "creation_time")?.ok_or_else(|| err("creation_time", "missing".into()))?;
        let (Some(deleted), Some(scheduled)) =
            (number(3, "deletion_time")?, number(4, "scheduled_time")?)
        else {
            out.no_run += 1;
            continue;
        };
        if deleted < scheduled {
            return Err(err(
                "deletion_time",
                format!("{deleted} is before scheduled_time {scheduled}"),
            ));
        }
        let run_time_s = seconds_in_range(&err, "deletion_time", (deleted - scheduled).max(1))?;
        let account = match cell(qos_col) {
            Some(qos) => AccountId::new(format!("qos-{}", qos.to_ascii_lowercase()))
                .map_err(|e| err("qos", e.to_string()))?,
            None => AccountId::new("alibaba").map_err(|e| err("qos", e.to_string()))?,
        };
        let id = cell(name_col)
            .and_then(|v| JobId::new(v).ok())
            .map_or_else(|| JobId::new(format!("a{:06}", out.jobs.len() + 1)), Ok)
            .map_err(|e| err("name", e.to_string()))?;
        let submit = i64::try_from(created)
            .map_err(|_| err("creation_time", format!("{created} is too large")))?;
        let submit = submit_in_range(&err, "creation_time", submit)?;
        let mut spec = JobSpec::new(id, account, gpus, estimate.limit_s(run_time_s), submit);
        spec.shape.gpu_share = share;
        if gpu_spec == GpuSpec::Types {
            if let Some(types) = cell(spec_col) {
                spec.shape.gpu_types = types
                    .split('|')
                    .map(|t| alibaba_type(t.trim(), &err, "gpu_spec"))
                    .collect::<Result<_, _>>()?;
            }
        }
        let outcome = match cell(phase_col) {
            Some("Failed") => Outcome::Failed,
            _ => Outcome::Completed,
        };
        out.jobs.push(SimJob {
            spec,
            run_time_s,
            outcome,
            checkpoint_save_s: None,
        });
    }
    Ok(out)
}

/// Alibaba's node list read: the GPU nodes as pools of identical nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlibabaNodes {
    /// (GPU type, GPUs a node, how many such nodes), by type and GPUs.
    pub pools: Vec<(GpuType, u32, u32)>,
    /// Nodes without GPUs (not scheduled).
    pub cpu_only: usize,
}

/// Reads Alibaba's node list (`openb_node_list_gpu_node.csv`: `sn,cpu_milli,memory_mib,gpu,
/// model`): each node's GPU count and type (see [`alibaba_type`]). A GPU node without a type,
/// or with a name that cannot be a type, is refused, naming the line.
pub fn parse_alibaba_nodes(text: &str, origin: &str) -> Result<AlibabaNodes, TraceError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let idx = header_index(origin, header, &["gpu", "model"])?;
    let mut counts: std::collections::BTreeMap<(GpuType, u32), u32> = Default::default();
    let mut out = AlibabaNodes::default();
    for (line_no, cells) in data_rows(lines) {
        let err = error_at(origin, line_no);
        let cell = |i: usize| cells.get(idx[i]).copied().unwrap_or_default();
        let raw = cell(0);
        let gpus: u32 = raw
            .strip_suffix(".0")
            .unwrap_or(raw)
            .parse()
            .map_err(|_| err("gpu", format!("`{raw}` is not a whole number of GPUs")))?;
        if gpus == 0 {
            out.cpu_only += 1;
            continue;
        }
        if gpus > 64 {
            return Err(err("gpu", format!("{gpus} GPUs on one node; at most 64")));
        }
        let name = cell(1);
        if name.is_empty() || name == "nan" {
            return Err(err("model", format!("missing on a node with {gpus} GPUs")));
        }
        *counts
            .entry((alibaba_type(name, &err, "model")?, gpus))
            .or_default() += 1;
    }
    out.pools = counts.into_iter().map(|((m, g), n)| (m, g, n)).collect();
    if out.pools.is_empty() {
        return Err(error_at(origin, 1)("gpu", "no node with GPUs".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_alibaba_pods_with_shares() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n\
openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175\n\
openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Failed,9967058,9968575,9967063\n\
openb-pod-0040,8000,1024,0,0,,BE,Succeeded,9967058,9968575,9967063\n\
openb-pod-0041,8000,1024,1,500,,BE,Pending,9967058,,\n";
        let trace =
            parse_alibaba(text, "pods.csv", LimitEstimate::Exact, GpuSpec::Ignored).unwrap();
        assert_eq!((trace.jobs.len(), trace.cpu_only, trace.no_run), (3, 1, 1));
        let [whole, shared, failed] = &trace.jobs[..] else {
            panic!("three jobs")
        };
        assert_eq!(whole.spec.gpus, 8);
        assert_eq!(whole.spec.shape.gpu_share, None);
        assert_eq!(whole.run_time_s, 10769854 - 9437497);
        assert_eq!(shared.spec.account.as_str(), "qos-be");
        assert_eq!(shared.spec.shape.gpu_share, Some(GpuShare::Milli(220)));
        assert_eq!(shared.spec.submit_s, 9679175);
        assert_eq!(failed.outcome, Outcome::Failed);
        assert_eq!(failed.run_time_s, 9968575 - 9967063);
        assert_eq!(failed.spec.id.as_str(), "openb-pod-0035");
    }

    #[test]
    fn alibaba_lines_that_cannot_be_replayed_name_line_and_field() {
        let head = "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n";
        let cases = [
            ("p,2,500,1,9,2\n", "gpu_milli"),
            ("p,1,0,1,9,2\n", "gpu_milli"),
            ("p,1,1200,1,9,2\n", "gpu_milli"),
            ("p,x,1000,1,9,2\n", "num_gpu"),
            ("p,1,1000,1,2,9\n", "deletion_time"),
            // Past what the simulator's clock holds: a creation time past the year 9999, a run
            // of more than 100 years.
            ("p,1,1000,9223372036854775807,9,2\n", "creation_time"),
            ("p,1,1000,1,18446744073709551615,2\n", "deletion_time"),
        ];
        for (line, field) in cases {
            let e = parse_alibaba(
                &format!("{head}{line}"),
                "pods.csv",
                LimitEstimate::Exact,
                GpuSpec::Ignored,
            )
            .unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (2, field), "{line}");
        }
        let e = parse_alibaba(
            "name,num_gpu\n",
            "pods.csv",
            LimitEstimate::Exact,
            GpuSpec::Ignored,
        )
        .unwrap_err();
        assert_eq!(e.field, "gpu_milli");
    }

    #[test]
    fn gpu_spec_becomes_the_types_a_pod_may_use_when_asked() {
        let text = "name,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time,scheduled_time\n\
p1,1,1000,V100M16|V100M32,1,9,2\n\
p2,1,500,,1,9,2\n\
p3,2,1000,T4|G2,1,9,2\n";
        let typed = parse_alibaba(text, "pods.csv", LimitEstimate::Exact, GpuSpec::Types).unwrap();
        let types: Vec<Vec<String>> = typed
            .jobs
            .iter()
            .map(|j| {
                j.spec
                    .shape
                    .gpu_types
                    .iter()
                    .map(|t| t.to_string())
                    .collect()
            })
            .collect();
        assert_eq!(
            types,
            [vec!["v100-16gb", "v100-32gb"], vec![], vec!["t4", "G2"]]
        );
        let plain =
            parse_alibaba(text, "pods.csv", LimitEstimate::Exact, GpuSpec::Ignored).unwrap();
        assert!(plain.jobs.iter().all(|j| j.spec.shape.gpu_types.is_empty()));
        // A name that cannot be a type is refused, naming line and field, only where types
        // are read.
        let odd = format!("{text}p4,1,1000,T4|X 9,1,9,2\n");
        let e = parse_alibaba(&odd, "pods.csv", LimitEstimate::Exact, GpuSpec::Types).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (5, "gpu_spec"), "{e}");
        assert!(e.message.contains("`X 9`"), "{e}");
        assert!(parse_alibaba(&odd, "pods.csv", LimitEstimate::Exact, GpuSpec::Ignored).is_ok());
    }

    #[test]
    fn reads_the_node_list_as_pools() {
        let text = "sn,cpu_milli,memory_mib,gpu,model\n\
openb-node-0001,64000,262144,2,P100\n\
openb-node-0002,96000,786432,8,V100M32\n\
openb-node-0003,96000,786432,0,\n\
openb-node-0004,64000,262144,2,P100\n\
openb-node-0005,128000,786432,4,T4\n\
openb-node-0006,128000,786432,8,G3\n\
openb-node-0007,96000,393216,8,G2\n";
        let nodes = parse_alibaba_nodes(text, "nodes.csv").unwrap();
        let pools: Vec<(String, u32, u32)> = nodes
            .pools
            .iter()
            .map(|(t, g, n)| (t.to_string(), *g, *n))
            .collect();
        let pool = |t: &str, g, n| (t.to_owned(), g, n);
        // Ordered by type name: the undisclosed types (upper case) first.
        assert_eq!(
            pools,
            [
                pool("G2", 8, 1),
                pool("G3", 8, 1),
                pool("p100", 2, 2),
                pool("t4", 4, 1),
                pool("v100-32gb", 8, 1),
            ]
        );
        assert_eq!(nodes.pools[3].0.model(), Some(GpuModel::T4));
        assert_eq!(nodes.pools[0].0.model(), None);
        assert_eq!(nodes.cpu_only, 1);
        let head = "sn,cpu_milli,memory_mib,gpu,model\n";
        for (line, field) in [
            ("n,1,1,2,G 9\n", "model"),
            ("n,1,1,2,\n", "model"),
            ("n,1,1,2,nan\n", "model"),
            ("n,1,1,two,T4\n", "gpu"),
            ("n,1,1,65,T4\n", "gpu"),
        ] {
            let e = parse_alibaba_nodes(&format!("{head}{line}"), "nodes.csv").unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (2, field), "{line}");
        }
        let e = parse_alibaba_nodes("sn,gpu\n", "nodes.csv").unwrap_err();
        assert_eq!(e.field, "model");
        assert!(parse_alibaba_nodes(head, "nodes.csv").is_err());
    }
}
