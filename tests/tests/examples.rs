//! The example files parse, and every kind of config mistake names its field and line.

use anyhow::Result;
use gpuledger_model::config::parse_toml;
use gpuledger_model::{ClusterConfig, ConfigError};
use gpuledger_sim::demo::DemoSpec;
use gpuledger_sim::seed::{SEED_CLUSTER_TOML, SEED_DEMO_TOML};

#[test]
fn seed_cluster_is_the_seeds() -> Result<()> {
    let c = ClusterConfig::from_toml_str(SEED_CLUSTER_TOML, "seed-cluster.toml")?;
    assert_eq!(c.nodes().len(), 64);
    assert_eq!(c.total_gpus(), 512);
    let tiers: Vec<(&str, u32)> = c
        .partitions
        .iter()
        .map(|p| (p.name.as_str(), p.priority_tier))
        .collect();
    assert_eq!(tiers, vec![("urgent", 50), ("train", 20), ("debug", 10)]);
    assert_eq!(c.accounts.len(), 10);
    assert_eq!(
        c.prices.gpu_hour[&gpuledger_model::GpuModel::H100Sxm].to_string(),
        "10.00"
    );
    Ok(())
}

#[test]
fn seed_price_book_prices_every_model_of_the_seed_cluster() -> Result<()> {
    use gpuledger_billing::{BillingModel, PriceBook};
    let book = PriceBook::from_toml_str(gpuledger_sim::seed::SEED_PRICES_TOML, "seed-prices.toml")?;
    let cluster = ClusterConfig::from_toml_str(SEED_CLUSTER_TOML, "seed-cluster.toml")?;
    let version = book.versions().next().expect("a version");
    for pool in &cluster.node_pools {
        assert!(
            version.gpu_hour.contains_key(&pool.gpu_model),
            "{}",
            pool.gpu_model
        );
    }
    let models: Vec<BillingModel> = ["team-a", "team-c", "team-d"]
        .iter()
        .map(|a| version.model_of(&gpuledger_model::AccountId::new(*a).unwrap()))
        .collect();
    assert_eq!(
        models,
        BillingModel::ALL.to_vec(),
        "the example shows all three models"
    );
    Ok(())
}

#[test]
fn seed_demo_parses_and_generates_about_fifty_jobs_a_day() -> Result<()> {
    let spec: DemoSpec = parse_toml(SEED_DEMO_TOML, "seed-demo.toml")?;
    let jobs = spec.workload.generate();
    let per_day = jobs.len() as f64 / f64::from(spec.workload.days);
    assert!((40.0..=80.0).contains(&per_day), "{per_day} jobs a day");
    assert_eq!(
        jobs,
        spec.workload.generate(),
        "seeded: the same jobs every time"
    );
    Ok(())
}

fn field_error(src: &str) -> (String, Option<usize>, String) {
    match ClusterConfig::from_toml_str(src, "seed.toml") {
        Err(ConfigError::Invalid { errors, .. }) => {
            assert_eq!(errors.len(), 1, "{errors:?}");
            (
                errors[0].field.clone(),
                errors[0].line,
                errors[0].message.clone(),
            )
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn line_of(src: &str, needle: &str) -> usize {
    src.lines()
        .position(|l| l.contains(needle))
        .expect("needle in file")
        + 1
}

#[test]
fn every_invalid_value_names_its_field_and_line() {
    let cases = [
        (
            "count = 64",
            "count = 0",
            "node_pools[0].count",
            "0 is out of range; use 1 to 100000",
        ),
        (
            "priority_tier = 10",
            "priority_tier = 0",
            "partitions[2].priority_tier",
            "out of range",
        ),
        (
            "usage_factor_gpu_hours = 5000",
            "usage_factor_gpu_hours = 0",
            "fair_share.usage_factor_gpu_hours",
            "at least 1",
        ),
        (
            "id = \"team-c\"\nname = \"Algorithms (experiments)\"\nweight = 12",
            "id = \"team-c\"\nname = \"Algorithms (experiments)\"\nweight = 0",
            "accounts[2].weight",
            "at least 1",
        ),
        (
            "storage = \"50TB\", priority = 50",
            "storage = \"50TB\", priority = 150",
            "accounts[2].quota.priority",
            "150 is out of range; use 1 to 100",
        ),
        (
            "{ id = \"eval\", name = \"Evaluation\", quota = { max_gpus_per_job = 16 } }",
            "{ id = \"eval\", name = \"Evaluation\", quota = { max_gpus_per_job = 300 } }",
            "accounts[0].projects[1].quota.max_gpus_per_job",
            "never exceeds its account",
        ),
    ];
    for (from, to, field, message) in cases {
        let src = SEED_CLUSTER_TOML.replacen(from, to, 1);
        assert_ne!(src, SEED_CLUSTER_TOML, "case {field} changed nothing");
        let (f, line, m) = field_error(&src);
        assert_eq!(f, field);
        assert!(m.contains(message), "{field}: {m}");
        let last_line_of_change = to.lines().last().unwrap_or(to);
        assert_eq!(
            line,
            Some(line_of(&src, last_line_of_change)),
            "{field}: line"
        );
    }
}

#[test]
fn unknown_keys_and_wrong_types_name_line_and_field() {
    let src = SEED_CLUSTER_TOML.replacen(
        "gpus_per_node = 8",
        "gpus_per_node = 8\ngpu_per_node = 8",
        1,
    );
    let err = ClusterConfig::from_toml_str(&src, "seed.toml")
        .unwrap_err()
        .to_string();
    let line = line_of(&src, "gpu_per_node = 8");
    assert!(err.starts_with(&format!("seed.toml:{line}:")), "{err}");
    assert!(
        err.contains("unknown field `gpu_per_node`") && err.contains("`gpus_per_node`"),
        "{err}"
    );

    let src = SEED_CLUSTER_TOML.replacen("h100-sxm = \"10.00\"", "h100-sxm = 10.0", 1);
    let err = ClusterConfig::from_toml_str(&src, "seed.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("seed.toml:{}:", line_of(&src, "h100-sxm = 10.0"))),
        "{err}"
    );
    assert!(err.contains("write prices as strings"), "{err}");

    let src = SEED_CLUSTER_TOML.replacen("gpu_model = \"h100-sxm\"", "gpu_model = \"h800\"", 1);
    let err = ClusterConfig::from_toml_str(&src, "seed.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown GPU model `h800`; known: a100"),
        "{err}"
    );
}
