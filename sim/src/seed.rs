//! The seed scenario, embedded so that `gpuledger demo` needs no file: the seed cluster, the
//! seed month's workload and telemetry profiles, and the seed price book. The same files are
//! in `examples/` (a test parses each).

use std::path::Path;

use gpuledger_billing::PriceBook;
use gpuledger_model::config::parse_toml;
use gpuledger_model::ClusterConfig;

use crate::demo::DemoSpec;
use crate::{Error, Result};

pub const SEED_CLUSTER_TOML: &str = include_str!("../../examples/seed-cluster.toml");
pub const SEED_DEMO_TOML: &str = include_str!("../../examples/seed-demo.toml");
pub const SEED_PRICES_TOML: &str = include_str!("../../examples/seed-prices.toml");

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))
}

/// A cluster config from a file, or the embedded seed cluster.
pub fn load_cluster(path: Option<&Path>) -> Result<ClusterConfig> {
    Ok(match path {
        None => ClusterConfig::from_toml_str(SEED_CLUSTER_TOML, "examples/seed-cluster.toml")?,
        Some(p) => ClusterConfig::from_toml_str(&read(p)?, &p.display().to_string())?,
    })
}

/// A demo spec from a file, or the embedded seed month.
pub fn load_demo(path: Option<&Path>) -> Result<DemoSpec> {
    Ok(match path {
        None => parse_toml(SEED_DEMO_TOML, "examples/seed-demo.toml")?,
        Some(p) => parse_toml(&read(p)?, &p.display().to_string())?,
    })
}

/// A price book from a file, or the embedded seed price book.
pub fn load_price_book(path: Option<&Path>) -> Result<PriceBook> {
    Ok(match path {
        None => PriceBook::from_toml_str(SEED_PRICES_TOML, "examples/seed-prices.toml")?,
        Some(p) => PriceBook::from_toml_str(&read(p)?, &p.display().to_string())?,
    })
}
