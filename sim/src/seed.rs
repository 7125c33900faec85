//! The seed scenario, embedded so that `gpuledger demo` needs no file: the seed cluster, the
//! seed month's workload and telemetry profiles, and the seed price book. The same files are
//! in `examples/` (a test parses each).

use std::path::Path;

use gpuledger_billing::PriceBook;
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
        None => DemoSpec::from_toml_str(SEED_DEMO_TOML, "examples/seed-demo.toml")?,
        Some(p) => DemoSpec::from_toml_str(&read(p)?, &p.display().to_string())?,
    })
}

/// A price book from a file, or the embedded seed price book.
pub fn load_price_book(path: Option<&Path>) -> Result<PriceBook> {
    Ok(match path {
        None => PriceBook::from_toml_str(SEED_PRICES_TOML, "examples/seed-prices.toml")?,
        Some(p) => PriceBook::from_toml_str(&read(p)?, &p.display().to_string())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demo_spec_that_would_stop_or_mislead_the_demo_is_refused_by_field_and_line() {
        let one = |from: &str, to: &str| {
            assert!(SEED_DEMO_TOML.contains(from), "{from}");
            let src = SEED_DEMO_TOML.replacen(from, to, 1);
            let err = DemoSpec::from_toml_str(&src, "d.toml").unwrap_err();
            let errors = err.field_errors().to_vec();
            assert_eq!(errors.len(), 1, "{err}");
            (
                errors[0].field.clone(),
                errors[0].line.is_some(),
                err.to_string(),
            )
        };
        for (from, to, field, says) in [
            (
                "sample_interval_s = 10",
                "sample_interval_s = 0",
                "sample_interval_s",
                "use 1 to 3600",
            ),
            (
                "days = 30",
                "days = 100000000",
                "workload.days",
                "use 1 to 366",
            ),
            (
                "jobs_per_day = 4",
                "jobs_per_day = 1e12",
                "workload.teams[0].jobs_per_day",
                "use 0 to 100000",
            ),
            (
                "gpus = [[8, 1.0]]",
                "gpus = [[8, -1.0]]",
                "workload.teams[0].gpus[0]",
                "weight -1",
            ),
            (
                "run_time_min = \"30m\"",
                "run_time_min = \"5h\"",
                "workload.teams[0].run_time_max",
                "shorter than run_time_min 5h",
            ),
            (
                "failure_rate = 0.03",
                "failure_rate = 3",
                "workload.teams[0].failure_rate",
                "use 0 to 1",
            ),
            (
                "submit_after = \"15d\"",
                "submit_after = \"45d\"",
                "workload.fixed_jobs[1].submit_after",
                "past the workload's 30 days",
            ),
        ] {
            let (got, located, text) = one(from, to);
            assert_eq!(got, field, "{text}");
            assert!(located && text.contains(says), "{text}");
        }
        assert!(load_demo(None).is_ok(), "the seed month is valid");
    }
}
