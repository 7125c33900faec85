#!/usr/bin/env python3
"""A synthetic node list and pod list in the format of Alibaba's 2023 GPU-sharing trace
(`openb_node_list_gpu_node.csv`, `openb_pod_list_*.csv`), for replay benchmarks of
`gpuledger simulate --trace PODS --node-list NODES` (docs/benchmarks.md).

Not the trace: the node counts per GPU type and GPUs per node follow the published summary of
the real node list (1,213 GPU nodes, most of them of the undisclosed type G2); the pods are
random (two fifths ask for a part of one GPU, a third name GPU types in `gpu_spec`, run times
log-normal). Deterministic for a seed.

    scripts/alibaba-like-trace.py --pods 10000 --seed 3 --nodes-out nodes.csv > pods.csv
"""

import argparse
import random
import sys

# (type, GPUs a node, nodes)
POOLS = [
    ("G2", 8, 549),
    ("T4", 2, 387),
    ("T4", 4, 17),
    ("P100", 1, 3),
    ("P100", 2, 131),
    ("G3", 8, 39),
    ("V100M32", 4, 9),
    ("V100M32", 8, 21),
    ("V100M16", 4, 30),
    ("V100M16", 8, 10),
    ("V100M16", 1, 15),
    ("A10", 1, 2),
]
QOS = [("LS", 0.45), ("BE", 0.25), ("Burstable", 0.2), ("Guaranteed", 0.1)]
SPECS = ["G2", "G2|G3", "T4", "V100M16|V100M32", "P100", "G3", "A10|T4"]
SHARES = [100, 200, 250, 300, 500, 500, 500, 700]


def write_nodes(path):
    with open(path, "w") as out:
        out.write("sn,cpu_milli,memory_mib,gpu,model\n")
        n = 0
        for gpu_type, gpus, count in POOLS:
            for _ in range(count):
                out.write(f"openb-node-{n:04d},96000,393216,{gpus},{gpu_type}\n")
                n += 1


def pod_gpus(rng):
    r = rng.random()
    if r < 0.4:
        return 1, rng.choice(SHARES)
    if r < 0.85:
        return 1, 1000
    if r < 0.93:
        return 2, 1000
    if r < 0.98:
        return 4, 1000
    return 8, 1000


def write_pods(rng, pods, mean_gap_s, out):
    out.write(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
    )
    t = 0
    for i in range(pods):
        t += int(rng.expovariate(1.0 / mean_gap_s))
        gpus, milli = pod_gpus(rng)
        spec = rng.choice(SPECS) if rng.random() < 0.33 else ""
        run_s = int(min(rng.lognormvariate(8.0, 1.8), 30 * 86400)) + 60
        qos = rng.choices([q for q, _ in QOS], [w for _, w in QOS])[0]
        phase = "Failed" if rng.random() < 0.05 else "Succeeded"
        out.write(
            f"p{i:06d},8000,16384,{gpus},{milli},{spec},{qos},{phase},"
            f"{t},{t + 5 + run_s},{t + 5}\n"
        )


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--pods", type=int, default=10000)
    args.add_argument("--seed", type=int, default=3)
    args.add_argument("--mean-gap-s", type=float, default=4.0, help="mean time between pods")
    args.add_argument("--nodes-out", required=True, help="where to write the node list")
    a = args.parse_args()
    write_nodes(a.nodes_out)
    write_pods(random.Random(a.seed), a.pods, a.mean_gap_s, sys.stdout)


if __name__ == "__main__":
    main()
