//! What a trace replay runs: the jobs of a trace and the cluster they run on, decided from the
//! trace's format (Philly or Alibaba's pod list, told apart by the header) and the files given
//! with it. The binary reads the files; this decides what they make.

use gpuledger_model::ClusterConfig;
use gpuledger_scheduler::trace::{
    is_alibaba_header, parse_alibaba, parse_alibaba_nodes, parse_philly, parse_vc_nodes, GpuSpec,
    LimitEstimate,
};
use gpuledger_scheduler::SimJob;

use crate::report::{equal_weights, philly_weights, trace_cluster, trace_cluster_of};
use crate::{Error, Result};

/// A file's text and the name its errors give.
#[derive(Clone, Copy, Debug)]
pub struct Text<'a> {
    pub text: &'a str,
    pub origin: &'a str,
}

/// A trace and what comes with it.
#[derive(Clone, Copy, Debug)]
pub struct TraceFiles<'a> {
    pub trace: Text<'a>,
    /// A Philly trace's VC sizes (its fair-share weights).
    pub vc_nodes: Option<Text<'a>>,
    /// Alibaba's node list: the cluster, instead of `nodes`.
    pub node_list: Option<Text<'a>>,
    /// Nodes of 8 GPUs.
    pub nodes: Option<u32>,
    pub estimate: LimitEstimate,
}

/// The jobs to replay and their cluster.
#[derive(Clone, Debug)]
pub struct Replay {
    pub config: ClusterConfig,
    pub jobs: Vec<SimJob>,
    /// What of the trace was left out, for the operator (Alibaba's CPU-only and unrun pods).
    pub left_out: Option<String>,
}

/// The replay of `files`: Alibaba's pods, each QoS class an account of weight 1, on its node
/// list (each pod held to its `gpu_spec`) or on `nodes` (where `gpu_spec` is not replayed); or
/// Philly's jobs, weighted by their VC sizes, on `nodes`.
pub fn trace_replay(files: TraceFiles<'_>) -> Result<Replay> {
    let TraceFiles {
        trace,
        vc_nodes,
        node_list,
        nodes,
        estimate,
    } = files;
    let alibaba = is_alibaba_header(trace.text.lines().next().unwrap_or_default());
    if node_list.is_some() && !alibaba {
        return Err(Error::Invalid(
            "--node-list is Alibaba's; a Philly --trace takes --nodes".into(),
        ));
    }
    let node_list = node_list
        .map(|list| parse_alibaba_nodes(list.text, list.origin))
        .transpose()?;
    let (jobs, weights, left_out) = if alibaba {
        let gpu_spec = match node_list {
            Some(_) => GpuSpec::Types,
            None => GpuSpec::Ignored,
        };
        let pods = parse_alibaba(trace.text, trace.origin, estimate, gpu_spec)?;
        let left_out = format!(
            "{}: {} GPU pods; left out {} CPU-only and {} never run",
            trace.origin,
            pods.jobs.len(),
            pods.cpu_only,
            pods.no_run
        );
        let weights = equal_weights(&pods.jobs);
        (pods.jobs, weights, Some(left_out))
    } else {
        let jobs = parse_philly(trace.text, trace.origin, estimate)?;
        let vc =
            vc_nodes.ok_or_else(|| Error::Invalid("a Philly --trace needs --vc-nodes".into()))?;
        let weights = philly_weights(&jobs, &parse_vc_nodes(vc.text, vc.origin)?);
        (jobs, weights, None)
    };
    let config = match (node_list, nodes) {
        (Some(list), _) => trace_cluster_of(&list.pools, &weights)?,
        (None, Some(nodes)) => trace_cluster(nodes, &weights)?,
        (None, None) => {
            return Err(Error::Invalid(
                "--trace needs --nodes (or --node-list)".into(),
            ))
        }
    };
    Ok(Replay {
        config,
        jobs,
        left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHILLY: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                          2017-09-04 10:30:41,3600.0,8,28800.0,aaa\n";
    const PODS: &str =
        "name,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time,scheduled_time\n\
                        p1,1,1000,T4,1,9,2\n";
    const NODES: &str =
        "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,2,T4\nn2,1,1,4,A10\nn3,1,1,8,G2\n";

    fn files<'a>(trace: &'a str) -> TraceFiles<'a> {
        TraceFiles {
            trace: Text {
                text: trace,
                origin: "trace.csv",
            },
            vc_nodes: None,
            node_list: None,
            nodes: None,
            estimate: LimitEstimate::NextHour,
        }
    }

    #[test]
    fn a_replay_takes_the_cluster_its_trace_and_files_give() {
        let list = Text {
            text: NODES,
            origin: "nodes.csv",
        };
        let on_list = trace_replay(TraceFiles {
            node_list: Some(list),
            ..files(PODS)
        })
        .unwrap();
        assert_eq!(on_list.config.total_gpus(), 14);
        // Alibaba's undisclosed type is a type of its own, not taken for a model.
        let types: Vec<String> = on_list
            .config
            .nodes()
            .iter()
            .map(|n| format!("{} {}", n.id, n.gpu_type))
            .collect();
        assert_eq!(types, ["G2-x8-001 G2", "a10-x4-001 a10", "t4-x2-001 t4"]);
        assert_eq!(on_list.jobs[0].spec.shape.gpu_types.len(), 1);
        let on_nodes = trace_replay(TraceFiles {
            nodes: Some(2),
            ..files(PODS)
        })
        .unwrap();
        assert_eq!(on_nodes.config.total_gpus(), 16);
        assert!(on_nodes.jobs[0].spec.shape.gpu_types.is_empty());
        assert!(on_nodes.left_out.unwrap().contains("1 GPU pods"));
    }

    #[test]
    fn a_replay_missing_what_its_trace_needs_is_refused() {
        let list = Text {
            text: NODES,
            origin: "nodes.csv",
        };
        let refusals = [
            (
                TraceFiles {
                    node_list: Some(list),
                    nodes: Some(1),
                    ..files(PHILLY)
                },
                "--node-list is Alibaba's",
            ),
            (
                TraceFiles {
                    nodes: Some(1),
                    ..files(PHILLY)
                },
                "needs --vc-nodes",
            ),
            (files(PODS), "needs --nodes"),
        ];
        for (given, message) in refusals {
            let e = trace_replay(given).unwrap_err().to_string();
            assert!(e.contains(message), "{e}");
        }
    }
}
