#!/usr/bin/env bash
# The dependencies ARCHITECTURE.md says must never appear, checked from the lock file
# (`cargo tree`, no build): a crate listed on the left must not reach any crate on its right
# through its normal dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
never() {
  local crate=$1
  shift
  local tree
  # A tree that cannot be read fails the check (set -e), never passes it.
  tree=$(cargo tree --locked -p "$crate" -e normal --prefix none --format '{p}')
  tree=$(awk '{print $1}' <<<"$tree" | sort -u)
  if ! grep -qx -- "$crate" <<<"$tree"; then
    echo "cargo tree of $crate does not list $crate itself: cannot check it" >&2
    exit 1
  fi
  for forbidden in "$@"; do
    if grep -qx -- "$forbidden" <<<"$tree"; then
      echo "dependency rule broken: $crate depends on $forbidden (ARCHITECTURE.md)" >&2
      failed=1
    fi
  done
}

services=(gpuledger-aggregator gpuledger-schedd gpuledger-exporter gpuledger-service)
never gpuledger-model gpuledger-auth gpuledger-billing gpuledger-scheduler "${services[@]}" gpuledger
never gpuledger-charts gpuledger-model "${services[@]}" gpuledger
never gpuledger-billing tokio axum datafusion "${services[@]}" gpuledger-sim gpuledger
never gpuledger-scheduler tokio axum datafusion "${services[@]}" gpuledger-sim gpuledger
never gpuledger-exporter datafusion gpuledger-aggregator gpuledger-billing gpuledger-scheduler gpuledger
never gpuledger-service gpuledger-aggregator gpuledger-schedd gpuledger-exporter gpuledger
never gpuledger-aggregator gpuledger-scheduler gpuledger-schedd gpuledger
never gpuledger-schedd gpuledger-aggregator datafusion gpuledger
never gpuledger-testkit gpuledger-model "${services[@]}" gpuledger
for lib in gpuledger-auth gpuledger-adapters gpuledger-sim gpuledger-dashboards gpuledger-bench gpuledger-slurm gpuledger-stack gpuledger-tests; do
  never "$lib" gpuledger
done

if [ "$failed" -ne 0 ]; then
  exit 1
fi
echo "== dependency rules hold"
