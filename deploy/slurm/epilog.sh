#!/bin/sh
# gpuledger Slurm epilog: removes what the prolog wrote for this job, so its GPUs read as idle.
# slurm.conf: Epilog=/etc/gpuledger/slurm/epilog.sh. Only files that still name this job are
# removed: a GPU already handed to the next job keeps that job's file.
set -u
dir="${GPULEDGER_JOB_MAPPING_DIR:-/run/gpuledger/jobs}"
job="${SLURM_JOB_ID:-}"
[ -n "$job" ] && [ -d "$dir" ] || exit 0
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  read -r owner _ < "$f" 2>/dev/null || continue
  [ "$owner" = "$job" ] && rm -f "$f"
done
exit 0
