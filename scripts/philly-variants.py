#!/usr/bin/env python3
"""Variants of a Philly trace (`timestamp,duration,num_gpus,gpu_time,cluster`, as
`../shared/data/philly-2017-09-10.csv`) for checking a scheduling change on more than the one
trace it was looked at on (docs/benchmarks.md, session 34):

- `shift`: every VC's submissions moved by one offset drawn for that VC, uniform in +-3 days:
  the same tenants and jobs, their busy weeks meeting differently;
- `drop`: each job kept with probability 0.9: about 10% less load, other arrivals.

Rows come out in submission order. Deterministic for a seed.

    scripts/philly-variants.py shift 1 < philly.csv > shift1.csv
"""

import csv
import datetime
import random
import sys

FORMAT = "%Y-%m-%d %H:%M:%S"
FIELDS = ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("shift", "drop"):
        sys.exit("usage: philly-variants.py shift|drop SEED < trace.csv > variant.csv")
    mode, rng = sys.argv[1], random.Random(int(sys.argv[2]))
    offsets: dict[str, float] = {}
    rows = []
    for line, row in enumerate(csv.DictReader(sys.stdin), start=2):
        missing = [f for f in FIELDS if not row.get(f)]
        if missing:
            sys.exit(f"stdin:{line}: no {missing[0]}")
        if mode == "drop":
            if rng.random() < 0.1:
                continue
        else:
            vc = row["cluster"]
            if vc not in offsets:
                offsets[vc] = rng.uniform(-3 * 86_400, 3 * 86_400)
            offset = offsets[vc]
            try:
                at = datetime.datetime.strptime(row["timestamp"], FORMAT)
            except ValueError as e:
                sys.exit(f"stdin:{line}: timestamp: {e}")
            row["timestamp"] = (at + datetime.timedelta(seconds=offset)).strftime(FORMAT)
        rows.append({f: row[f] for f in FIELDS})
    rows.sort(key=lambda r: r["timestamp"])
    out = csv.DictWriter(sys.stdout, fieldnames=FIELDS, lineterminator="\n")
    out.writeheader()
    out.writerows(rows)


if __name__ == "__main__":
    main()
