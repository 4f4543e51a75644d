#!/usr/bin/env python3
"""Sums Nsight Compute kernel durations per kernel and grid: where a step's device time goes.

Input: the CSV of
  ncu --graph-profiling node --cache-control none --clock-control none \
      --metrics gpu__time_duration.sum --print-kernel-base function --csv <command>
(every kernel of the run, graph nodes included, each timed alone). Kernels are grouped by name
and grid size (which tells the GEMVs of different weight shapes apart); --steps divides the totals
by the number of steps the run held, so the table reads per step. --last-step keeps only the
run's last step instead: the kernels from the last one matching --step-start (the embedding
lookup that opens every forward pass) to the end, so the random-weight fill of a dummy model and
the prefill drop out.

  scripts/kernel-times.py ncu.csv [--steps N] [--skip-first K] [--last-step [--step-start RE]]
"""
import argparse
import collections
import csv
import io
import re
import sys

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def read_rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    # ncu prints its own progress lines before the CSV; the table starts at the header.
    start = text.find('"ID","Process ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV table found")
    return list(csv.DictReader(io.StringIO(text[start:])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0, help="divide totals by this many steps")
    ap.add_argument("--skip-first", type=int, default=0, help="ignore the first K kernels (prefill)")
    ap.add_argument("--last-step", action="store_true", help="only the run's last step")
    ap.add_argument("--step-start", default=r"^embedding",
                    help="regex of the kernel that opens a step (default: ^embedding)")
    args = ap.parse_args()

    total_us = 0.0
    groups = collections.OrderedDict()
    rows = [r for r in read_rows(args.csv) if r.get("Metric Name") == "gpu__time_duration.sum"]
    rows = rows[args.skip_first:]
    if args.last_step:
        starts = [i for i, r in enumerate(rows) if re.search(args.step_start, r["Kernel Name"])]
        if not starts:
            sys.exit(f"no kernel matches --step-start {args.step_start!r}")
        rows = rows[starts[-1]:]
        args.steps = 1.0
    for r in rows:
        unit = r.get("Metric Unit", "nsecond")
        if unit not in UNIT_TO_US:
            sys.exit(f"unknown duration unit {unit!r}")
        us = float(r["Metric Value"].replace(",", "")) * UNIT_TO_US[unit]
        key = (r["Kernel Name"], r.get("Grid Size", ""))
        calls, t = groups.get(key, (0, 0.0))
        groups[key] = (calls + 1, t + us)
        total_us += us
    if not groups:
        sys.exit("no kernel durations in the input")

    print(f"{'kernel':<44} {'grid':<16} {'calls':>7} {'us/step':>10} {'share':>7} {'us/call':>9}")
    for (name, grid), (calls, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:44]:<44} {grid[:16]:<16} {calls / args.steps:>7.1f} {t / args.steps:>10.1f} "
              f"{100 * t / total_us:>6.1f}% {t / calls:>9.2f}")
    print(f"{'total':<44} {'':<16} {len(rows):>7} {total_us / args.steps:>10.1f}")


if __name__ == "__main__":
    main()
