//! The embedded defaults: the seed cluster and the seed demo month, so `gpuledger demo` needs
//! no file. The same files are in `examples/`.

use anyhow::Context;
use gpuledger_model::config::parse_toml;
use gpuledger_model::ClusterConfig;

use crate::pipeline::DemoSpec;

pub const SEED_CLUSTER_TOML: &str = include_str!("../../examples/seed-cluster.toml");
pub const SEED_DEMO_TOML: &str = include_str!("../../examples/seed-demo.toml");

/// The default data directory of every subcommand.
pub const DEFAULT_DATA_DIR: &str = "./gpuledger-data";

/// Loads a cluster config from a file, or the embedded seed cluster.
pub fn load_cluster(path: Option<&std::path::Path>) -> anyhow::Result<ClusterConfig> {
    match path {
        None => Ok(ClusterConfig::from_toml_str(
            SEED_CLUSTER_TOML,
            "examples/seed-cluster.toml",
        )?),
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(ClusterConfig::from_toml_str(
                &text,
                &p.display().to_string(),
            )?)
        }
    }
}

/// Loads a demo spec from a file, or the embedded seed month.
pub fn load_demo(path: Option<&std::path::Path>) -> anyhow::Result<DemoSpec> {
    match path {
        None => Ok(parse_toml(SEED_DEMO_TOML, "examples/seed-demo.toml")?),
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(parse_toml(&text, &p.display().to_string())?)
        }
    }
}

pub const SEED_PRICES_TOML: &str = include_str!("../../examples/seed-prices.toml");

/// Loads a price book from a file, or the embedded seed price book.
pub fn load_price_book(
    path: Option<&std::path::Path>,
) -> anyhow::Result<gpuledger_billing::PriceBook> {
    use gpuledger_billing::PriceBook;
    match path {
        None => Ok(PriceBook::from_toml_str(
            SEED_PRICES_TOML,
            "examples/seed-prices.toml",
        )?),
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(PriceBook::from_toml_str(&text, &p.display().to_string())?)
        }
    }
}
