#!/usr/bin/env python3
"""tools/gpu/ncu_summary.py — the per-kernel summary that tools/gpu/gpu_check.sh's profile stage
takes with Nsight Compute (`ncu --metrics gpu__time_duration.sum --print-summary
per-kernel --csv`), as a table of device time per kernel and grid, largest first.

    python3 tools/gpu/ncu_summary.py LOG [--top N]

LOG may hold the profiled program's own output too (its JSON lines): only ncu's CSV
rows (a numeric process id first) are read. One JSON line on stdout per row
({"kernel", "grid", "calls", "total_ms", "mean_us"}), then {"total_ms": ...}; the
table on stderr.
"""
import argparse
import csv
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    totals = {}  # (kernel, grid) -> [ns, calls]
    with open(args.log, newline="", errors="replace") as f:
        for row in csv.reader(f):
            # "Process ID","Process Name","Host Name","Kernel Name","Block Size","Grid Size",
            # "Device","CC","Invocations","Section Name","Metric Name","Metric Unit",
            # "Minimum","Maximum","Average"
            if len(row) < 15 or not row[0].isdigit() or row[10] != "gpu__time_duration.sum":
                continue
            unit = {"ns": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "nsecond": 1.0}.get(row[11])
            if unit is None:
                continue
            name = row[3].split("(")[0].replace("(anonymous namespace)::", "").replace("unnamed>::", "")
            name = name.replace("void ", "").strip()
            calls = int(row[8].replace(",", ""))
            mean_ns = float(row[14].replace(",", "")) * unit
            t = totals.setdefault((name, row[5]), [0.0, 0])
            t[0] += mean_ns * calls
            t[1] += calls
    if not totals:
        print(f"ncu_summary: no gpu__time_duration rows in {args.log}", file=sys.stderr)
        return 1
    total_ns = sum(t[0] for t in totals.values())
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])
    for (name, grid), (ns, calls) in rows[: args.top]:
        print(json.dumps({"kernel": name, "grid": grid, "calls": calls, "total_ms": round(ns / 1e6, 3),
                          "mean_us": round(ns / calls / 1e3, 2)}))
        print(f"{ns / 1e6:9.2f} ms {100 * ns / total_ns:5.1f}%  {calls:6d} x {ns / calls / 1e3:8.1f} us  "
              f"{name} grid{grid}", file=sys.stderr)
    print(json.dumps({"total_ms": round(total_ns / 1e6, 3), "kernels": len(rows)}))
    print(f"{total_ns / 1e6:9.2f} ms in all ({len(rows)} kernel x grid)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
