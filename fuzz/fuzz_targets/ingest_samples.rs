#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuledger_fuzz::harness::ingest_samples(data));
