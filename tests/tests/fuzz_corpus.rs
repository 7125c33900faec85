//! Replays every input the fuzzers kept (`fuzz/corpus/TARGET/`) and every past finding
//! (`fuzz/regressions/TARGET/`) through the same harness the fuzz targets run, on the stable
//! toolchain: a fixed crash stays fixed, and the parsers still handle all the shapes the
//! fuzzers found, without nightly or cargo-fuzz.

#[path = "../../fuzz/src/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 5] = [
    ("ingest_samples", harness::ingest_samples),
    ("ingest_events", harness::ingest_events),
    ("cluster_config", harness::cluster_config),
    ("price_book", harness::price_book),
    ("dcgm_text", harness::dcgm_text),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(kind: &str, min_inputs: usize) {
    for (target, run) in TARGETS {
        let dir = fuzz_dir().join(kind).join(target);
        let files = inputs(&dir);
        assert!(
            files.len() >= min_inputs,
            "{}: {} inputs, expected at least {min_inputs}",
            dir.display(),
            files.len()
        );
        for file in files {
            let data = std::fs::read(&file).expect("a readable input");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target} panicked on {}", file.display());
        }
    }
}

#[test]
fn every_kept_corpus_input_is_handled() {
    // Each target's corpus holds at least its seeds; an empty one means it was lost.
    replay("corpus", 5);
}

#[test]
fn every_past_finding_stays_fixed() {
    replay("regressions", 0);
    let findings = inputs(&fuzz_dir().join("regressions/ingest_samples"));
    assert!(
        findings.len() >= 4,
        "the four decoder findings are kept: {findings:?}"
    );
}
