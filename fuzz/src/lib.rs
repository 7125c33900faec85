//! gpuledger's fuzz targets (`fuzz_targets/`) and their shared harness.

pub mod harness;
