#!/usr/bin/env bash
# Refreshes dashboards/screenshots/: runs the tests that drive a real Chromium (the status page,
# the dashboard previews over a real Prometheus) with their screenshots written there.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpuledger/target}"
export GPULEDGER_SCREENSHOTS="$PWD/dashboards/screenshots"
mkdir -p "$GPULEDGER_SCREENSHOTS"
cargo test --workspace --locked --test status_page --test dashboards_live
ls -l "$GPULEDGER_SCREENSHOTS"
