//! `gpuledger bench fill`: how full placement gets a cluster before jobs stop fitting (the
//! fill test of the FGD paper, "Beware of Fragmentation", ATC '23). Jobs drawn from a mix
//! arrive one after another and never end; each goes where `Cluster::find` puts it, or is
//! turned away; the fill stops after `--misses` turned away in a row. The allocation rate then
//! (GPUs held over all GPUs) measures what placement strands in pieces no arriving job can use.
//! Then `--churn` rounds of a random job ending and jobs arriving until one is turned away: the
//! share held at those misses is the steady state, where the holes ending jobs leave count.
//! A fourth mix asks for parts of GPUs as often as Alibaba's GPU-sharing trace does: there
//! the rate counts what is held of each GPU (a GPU with a 250m share is a quarter held).
//! Pure placement: no clock, no queue, no policy.

use std::fmt::Write as _;

use gpuledger_model::config::NodeSpec;
use gpuledger_model::rng::SplitMix64;
use gpuledger_model::{AccountId, GpuModel, GpuShare, NodeId, SHARE_UNITS_PER_GPU};
use gpuledger_scheduler::cluster::{lowest_bits, Cluster, NodeFilter, Placement, Shape, Slot};

#[derive(clap::Args, Clone, Debug)]
pub struct FillArgs {
    /// Nodes of each cluster.
    #[arg(long, default_value_t = 64)]
    pub nodes: u32,
    /// Runs (seeds) per cluster and mix.
    #[arg(long, default_value_t = 20)]
    pub seeds: u64,
    /// The fill ends after this many jobs in a row find no room.
    #[arg(long, default_value_t = 100)]
    pub misses: usize,
    /// Then this many rounds of churn: a random job ends, jobs arrive until one finds no room.
    #[arg(long, default_value_t = 1000)]
    pub churn: usize,
}

/// Job sizes and how often each is drawn: most jobs small, a tail of multi-node ones.
const SIZES: [u32; 7] = [1, 2, 3, 4, 8, 16, 32];
const WEIGHTS: [f64; 7] = [0.35, 0.15, 0.05, 0.15, 0.18, 0.08, 0.04];

/// The clusters: one size of node, or half 8-GPU H100 and half 4-GPU A100 nodes.
fn cluster(nodes: u32, mixed: bool) -> Cluster {
    Cluster::new(
        (0..nodes)
            .map(|i| {
                let small = mixed && i % 2 == 1;
                let gpu_model = if small {
                    GpuModel::A100
                } else {
                    GpuModel::H100Sxm
                };
                NodeSpec {
                    id: NodeId::new(format!("n{:04}", i + 1)).expect("a node name"),
                    gpus: if small { 4 } else { 8 },
                    gpu_model,
                    gpu_type: gpu_model.into(),
                    pool: "p".into(),
                    dedicated_to: None,
                }
            })
            .collect(),
    )
}

/// Which jobs arrive.
#[derive(Clone, Copy, Debug)]
struct Mix {
    name: &'static str,
    /// Sizes below this are not drawn: without 1-GPU jobs, the holes placement leaves stay.
    smallest: u32,
    shaped: bool,
    /// Whether some jobs ask for a part of one GPU.
    shares: bool,
}

const MIXES: [Mix; 4] = [
    Mix {
        name: "free-form, every size",
        smallest: 1,
        shaped: false,
        shares: false,
    },
    Mix {
        name: "free-form, 2 GPUs or more",
        smallest: 2,
        shaped: false,
        shares: false,
    },
    Mix {
        name: "shaped (GPUs per node, H100 only), 2 GPUs or more",
        smallest: 2,
        shaped: true,
        shares: false,
    },
    Mix {
        name: "GPU sharing (two fifths ask a part of one GPU), 2 GPUs or more otherwise",
        smallest: 2,
        shaped: false,
        shares: true,
    },
];

/// Thousandths of a GPU a sharing job asks for, and how often each is drawn.
const SHARE_MILLI: [u16; 6] = [100, 200, 250, 300, 500, 700];
const SHARE_WEIGHTS: [f64; 6] = [0.15, 0.15, 0.2, 0.15, 0.25, 0.1];
/// The part of jobs that ask for a share of one GPU (Alibaba's 2023 trace: about two fifths
/// of its GPU pods).
const SHARING: f64 = 0.4;

/// One arriving job: its GPUs and, in the shaped mix, a third of the multi-GPU jobs ask for
/// 4 GPUs a node (or all on one node below 4) and a fifth of all jobs for H100s.
fn draw(rng: &mut SplitMix64, mix: Mix) -> (u32, Shape) {
    let shaped = mix.shaped;
    if mix.shares && rng.next_f64() < SHARING {
        let milli = SHARE_MILLI[rng.weighted_index(&SHARE_WEIGHTS)];
        let shape = Shape {
            gpu_share: Some(GpuShare::Milli(milli)),
            ..Shape::default()
        };
        return (1, shape);
    }
    let gpus = loop {
        let g = SIZES[rng.weighted_index(&WEIGHTS)];
        if g >= mix.smallest {
            break g;
        }
    };
    let mut shape = Shape::default();
    if shaped {
        if gpus > 1 && rng.next_f64() < 1.0 / 3.0 {
            let per_node = gpus.min(4);
            if gpus.is_multiple_of(per_node) {
                shape.gpus_per_node = Some(per_node);
            }
        }
        if rng.next_f64() < 0.2 {
            shape.gpu_types = vec![GpuModel::H100Sxm.into()];
        }
    }
    (gpus, shape)
}

/// How a run places a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placer {
    /// The scheduler's own (`Cluster::find`).
    Scheduler,
    /// The reference: the first node in order that fits, the lowest free GPUs on it; whole free
    /// nodes in order above one node; the same shape rules; a share on the first GPU in order
    /// with room for it, else the first free GPU.
    FirstFit,
}

fn first_fit(c: &Cluster, gpus: u32, shape: &Shape) -> Option<Placement> {
    let nodes: Vec<usize> = (0..c.node_count())
        .filter(|n| shape.allows_type(&c.node_spec(*n).gpu_type))
        .collect();
    let slot = |node: usize, n: u32| Slot::whole(node, lowest_bits(c.free_mask(node), n));
    if let Some(share) = shape.gpu_share {
        let shared = c
            .shared_gpus()
            .filter(|(_, _, mode, room)| *mode == share.mode() && *room >= share.units())
            .map(|(node, gpu, _, _)| (node, gpu))
            .min();
        let (node, mask) = match shared {
            Some((node, gpu)) => (node, 1u64 << gpu),
            None => {
                let node = *nodes.iter().find(|n| c.free_on(**n) > 0)?;
                (node, lowest_bits(c.free_mask(node), 1))
            }
        };
        return Some(Placement::from(vec![Slot {
            node,
            mask,
            share: Some(share),
        }]));
    }
    if let Some(per_node) = shape.gpus_per_node {
        let want = (gpus / per_node) as usize;
        let fits: Vec<Slot> = nodes
            .iter()
            .filter(|n| c.free_on(**n) >= per_node)
            .take(want)
            .map(|n| slot(*n, per_node))
            .collect();
        return (fits.len() == want && gpus.is_multiple_of(per_node))
            .then_some(Placement::from(fits));
    }
    if let Some(n) = nodes.iter().find(|n| c.free_on(**n) >= gpus) {
        return Some(Placement::from(vec![slot(*n, gpus)]));
    }
    let mut slots = Vec::new();
    let mut left = gpus;
    for n in nodes
        .iter()
        .filter(|n| c.free_on(**n) == c.node_spec(**n).gpus)
    {
        if left == 0 {
            break;
        }
        let take = left.min(c.node_spec(*n).gpus);
        slots.push(slot(*n, take));
        left -= take;
    }
    let too_many = shape.max_nodes.is_some_and(|m| slots.len() > m as usize);
    (left == 0 && !too_many).then_some(Placement::from(slots))
}

/// What one run ended with.
struct Filled {
    /// GPUs held over all GPUs when the first job found no room.
    first_miss: f64,
    /// The same when the fill ended.
    rate: f64,
    jobs: u32,
    /// Under churn (a random job ends, jobs arrive until one finds no room, again): the mean
    /// share held at those misses, where holes left by ending jobs count.
    churn: f64,
}

fn fill(
    nodes: u32,
    mixed: bool,
    mix: Mix,
    placer: Placer,
    seed: u64,
    misses: usize,
    churn: usize,
) -> Filled {
    let mut c = cluster(nodes, mixed);
    let account = AccountId::new("a").expect("an account id");
    let any = NodeFilter::none();
    let mut rng = SplitMix64::new(seed);
    let mut placed: Vec<Placement> = Vec::new();
    let mut missed = 0;
    let mut first_miss = None;
    let held = |c: &Cluster| {
        c.held_share_units() as f64 / (f64::from(c.total_gpus()) * f64::from(SHARE_UNITS_PER_GPU))
    };
    let arrive = |c: &mut Cluster, rng: &mut SplitMix64, placed: &mut Vec<Placement>| {
        let (gpus, shape) = draw(rng, mix);
        let p = match placer {
            Placer::Scheduler => c.find(gpus, &account, &any, &shape),
            Placer::FirstFit => first_fit(c, gpus, &shape),
        };
        if let Some(p) = &p {
            c.take(p);
            placed.push(p.clone());
        }
        p.is_some()
    };
    while missed < misses {
        if arrive(&mut c, &mut rng, &mut placed) {
            missed = 0;
        } else {
            first_miss.get_or_insert_with(|| held(&c));
            missed += 1;
        }
    }
    let (rate, jobs) = (held(&c), placed.len() as u32);
    let mut at_misses = 0.0;
    for _ in 0..churn {
        if !placed.is_empty() {
            let gone = placed.swap_remove(rng.range_u64(0, placed.len() as u64 - 1) as usize);
            c.release(&gone);
        }
        while arrive(&mut c, &mut rng, &mut placed) {}
        at_misses += held(&c);
    }
    Filled {
        first_miss: first_miss.unwrap_or(1.0),
        rate,
        jobs,
        churn: if churn == 0 {
            rate
        } else {
            at_misses / churn as f64
        },
    }
}

/// The table of allocation rates, one row per cluster and mix.
pub fn run(args: &FillArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        args.nodes > 0 && args.seeds > 0,
        "--nodes and --seeds must be at least 1"
    );
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fill: {} nodes, {} runs each, the fill ends after {} misses in a row, then {} rounds of churn; sizes {:?} drawn {:?}",
        args.nodes, args.seeds, args.misses, args.churn, SIZES, WEIGHTS
    );
    let _ = writeln!(
        out,
        "| cluster | jobs | placement | held at the first miss | held at the end (min-max) | held under churn, at misses (min-max) | free under churn, against first fit | jobs placed |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for (mixed, cluster_name) in [
        (false, "8-GPU nodes"),
        (true, "half 8-GPU H100, half 4-GPU A100"),
    ] {
        for mix in MIXES {
            let runs_of = |placer| -> Vec<Filled> {
                (0..args.seeds)
                    .map(|s| {
                        fill(
                            args.nodes,
                            mixed,
                            mix,
                            placer,
                            0x5eed + s,
                            args.misses,
                            args.churn,
                        )
                    })
                    .collect()
            };
            let first_fit_free = {
                let runs = runs_of(Placer::FirstFit);
                1.0 - runs.iter().map(|r| r.churn).sum::<f64>() / runs.len() as f64
            };
            for (placer, name) in [
                (Placer::Scheduler, "scheduler (best fit)"),
                (Placer::FirstFit, "first fit"),
            ] {
                let runs = runs_of(placer);
                let n = runs.len() as f64;
                let mean = |f: &dyn Fn(&Filled) -> f64| runs.iter().map(f).sum::<f64>() / n;
                let range = |f: &dyn Fn(&Filled) -> f64| {
                    let lo = runs.iter().map(f).fold(f64::INFINITY, f64::min);
                    let hi = runs.iter().map(f).fold(0.0, f64::max);
                    format!("{:.1}-{:.1}%", 100.0 * lo, 100.0 * hi)
                };
                let free = 1.0 - mean(&|r| r.churn);
                let against = if first_fit_free > 0.0 {
                    format!("{:.2}x", free / first_fit_free)
                } else {
                    "-".into()
                };
                let _ = writeln!(
                    out,
                    "| {cluster_name} | {} | {name} | {:.1}% | {:.1}% ({}) | {:.1}% ({}) | {against} | {:.0} |",
                    mix.name,
                    100.0 * mean(&|r| r.first_miss),
                    100.0 * mean(&|r| r.rate),
                    range(&|r| r.rate),
                    100.0 * mean(&|r| r.churn),
                    range(&|r| r.churn),
                    mean(&|r| f64::from(r.jobs)),
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_run_ends_full_or_fragmented_and_is_repeatable() {
        let a = fill(16, true, MIXES[2], Placer::Scheduler, 7, 50, 100);
        let b = fill(16, true, MIXES[2], Placer::Scheduler, 7, 50, 100);
        assert_eq!(
            (a.jobs, a.rate.to_bits(), a.churn.to_bits()),
            (b.jobs, b.rate.to_bits(), b.churn.to_bits())
        );
        assert!(a.churn > 0.3 && a.churn <= 1.0, "{}", a.churn);
        assert!(a.rate > 0.5 && a.rate <= 1.0, "{}", a.rate);
        assert!(a.first_miss <= a.rate, "{} then {}", a.first_miss, a.rate);
        // With free-form jobs a third of them 1-GPU, a GPU left free is taken before 200
        // misses in a row: the end is a full cluster.
        let free_form = fill(16, false, MIXES[0], Placer::Scheduler, 7, 200, 0);
        assert_eq!(free_form.rate, 1.0);
        // Shares of GPUs: the rate counts parts, and parts fill GPUs up.
        let sharing = fill(16, false, MIXES[3], Placer::Scheduler, 7, 50, 100);
        assert!(
            sharing.rate > 0.5 && sharing.rate <= 1.0,
            "{}",
            sharing.rate
        );
        assert!(sharing.churn > 0.5, "{}", sharing.churn);
        // The reference places validly too: a fill never holds a GPU twice (take panics in
        // debug builds) and ends at least as full as it began.
        let reference = fill(16, true, MIXES[2], Placer::FirstFit, 7, 50, 100);
        assert!(
            reference.rate > 0.5 && reference.churn > 0.3,
            "{}",
            reference.rate
        );
    }
}
