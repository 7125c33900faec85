//! The Kubernetes and Kueue objects of the seed cluster, as a golden file.

use gpuledger_model::ClusterConfig;

#[test]
fn the_seed_cluster_as_kubernetes_objects() {
    let config = ClusterConfig::from_toml_str(
        include_str!("../../examples/seed-cluster.toml"),
        "seed-cluster.toml",
    )
    .unwrap();
    insta::assert_snapshot!(gpuledger_adapters::kubernetes::export(&config));
}
