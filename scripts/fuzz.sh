#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 600), as many at once as there are cores, each
# growing its corpus in fuzz/corpus/TARGET. Needs the nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). A crash is written to fuzz/artifacts/TARGET/: copy it to
# fuzz/regressions/TARGET/ with the fix, where tests/tests/fuzz_corpus.rs replays it.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list | grep -vx seed-corpus)
fi
cargo +nightly fuzz build
mkdir -p logs
status=0
run() {
    local target=$1
    mkdir -p "corpus/$target"
    if cargo +nightly fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -max_len=65536 \
        -print_final_stats=1 >"logs/$target.log" 2>&1; then
        echo "$target: no finding in ${seconds}s ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "logs/$target.log" | grep -o '[0-9]*$') runs)"
    else
        echo "$target: FINDING, see fuzz/logs/$target.log and fuzz/artifacts/$target/"
        return 1
    fi
}
jobs_at_once=$(nproc)
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do
        wait -n || status=1
    done
    run "$target" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    wait -n || status=1
done
exit $status
