#!/usr/bin/env bash
# Runs the exporter's NVML source on a machine with NVIDIA GPUs and keeps what it read, for
# docs/ (issue 3). Prepared for the device tool: build here, carry the binary, run there.
#
#   cargo build --release --bin gpuledger-exporter
#   cp target/release/gpuledger-exporter dist/   # dist/ is carried (a few tens of MB)
#   # on the device (OUT is the folder that comes back):
#   scripts/nvml-on-device.sh dist/gpuledger-exporter "$OUT"
set -euo pipefail
bin=${1:?usage: nvml-on-device.sh EXPORTER_BINARY OUT_DIR}
out=${2:?usage: nvml-on-device.sh EXPORTER_BINARY OUT_DIR}
mkdir -p "$out"
spool=$(mktemp -d)
{ nvidia-smi -L; nvidia-smi --query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm,temperature.gpu,mig.mode.current --format=csv; } \
  > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$out/nvidia-smi.txt"
"$bin" --source nvml --node device --sample-interval 1s --push-interval 5s \
  --listen 127.0.0.1:0 --spool-dir "$spool" > "$out/exporter.stdout" 2> "$out/exporter.stderr" &
pid=$!
for _ in $(seq 50); do
  url=$(grep -o 'http://[0-9.:]*' "$out/exporter.stdout" || true)
  [ -n "$url" ] && break
  sleep 0.1
done
if [ -z "${url:-}" ]; then
  echo "exporter did not start" >> "$out/exporter.stderr"
  kill "$pid" 2>/dev/null || true
  exit 1
fi
sleep 3
curl -s "$url/metrics" > "$out/metrics-1.txt"
# Some load, if a CUDA-capable Python is around; otherwise idle GPUs.
sleep 5
curl -s "$url/metrics" > "$out/metrics-2.txt"
curl -s -H 'Accept: application/openmetrics-text' "$url/metrics" > "$out/metrics-openmetrics.txt"
kill -TERM "$pid"
wait "$pid" || true
ls -la "$spool" > "$out/spool.txt"
echo "done: $(wc -l < "$out/metrics-2.txt") lines of /metrics"
