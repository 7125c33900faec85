#!/bin/sh
# gpuledger Slurm prolog: tells the node's gpuledger exporter which job each GPU works for.
# slurm.conf: Prolog=/etc/gpuledger/slurm/prolog.sh (and Epilog=.../epilog.sh). It runs as
# root on each node of a job before it starts, with SLURM_JOB_ID, SLURM_JOB_ACCOUNT and the
# job's GPU indices on this node in SLURM_JOB_GPUS (CUDA_VISIBLE_DEVICES as a fallback).
#
# It writes the job-mapping directory the exporter reads (`--job-mapping-dir`), in
# dcgm-exporter's layout: a file per GPU index, here holding `JOBID ACCOUNT [PROJECT]`. (The
# exporter also reads dcgm-exporter's own files, a job id a line, and asks the aggregator for
# each job's account; this prolog saves that round trip and works before the job's events do.) The
# Slurm account is turned into gpuledger's account and project by the map that
# `gpuledger import slurm-assoc --account-map` writes (a Slurm sub-account is a project).
#
# GPULEDGER_JOB_MAPPING_DIR (default /run/gpuledger/jobs) and GPULEDGER_ACCOUNT_MAP (default
# /etc/gpuledger/slurm-accounts) change the paths. A failing prolog would drain the node, so
# problems are logged and the job starts anyway.
set -u
dir="${GPULEDGER_JOB_MAPPING_DIR:-/run/gpuledger/jobs}"
map="${GPULEDGER_ACCOUNT_MAP:-/etc/gpuledger/slurm-accounts}"
job="${SLURM_JOB_ID:-}"
account="${SLURM_JOB_ACCOUNT:-}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
log() { logger -t gpuledger-prolog "$*" 2>/dev/null || echo "gpuledger-prolog: $*" >&2; }

[ -n "$job" ] || { log "no SLURM_JOB_ID"; exit 0; }
[ -n "$gpus" ] || exit 0 # a job without GPUs on this node
project=""
if [ -n "$account" ] && [ -r "$map" ]; then
  mapped=$(awk -v a="$account" '$1 == a && $1 !~ /^#/ { print $2 " " $3; exit }' "$map")
  if [ -n "$mapped" ]; then
    account=${mapped%% *}
    project=${mapped#* }
  fi
fi
[ -n "$account" ] || { log "job $job has no account; its GPUs stay unlabelled"; exit 0; }
mkdir -p "$dir" || { log "cannot create $dir"; exit 0; }

# Indices may come as 0,1,2 or as ranges 0-3,6.
for part in $(echo "$gpus" | tr ',' ' '); do
  case "$part" in
    *-*) first=${part%-*}; last=${part#*-} ;;
    *) first=$part; last=$part ;;
  esac
  i=$first
  while [ "$i" -le "$last" ]; do
    tmp="$dir/.$i.$job"
    printf '%s %s %s\n' "$job" "$account" "$project" > "$tmp" && mv -f "$tmp" "$dir/$i" \
      || log "cannot write $dir/$i"
    i=$((i + 1))
  done
done
exit 0
