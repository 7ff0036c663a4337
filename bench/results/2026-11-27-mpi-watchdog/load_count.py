#!/usr/bin/env python3
"""Item 2 of issue #25, per run of `bpl-bench-compare --backends mpi --load 1`: points within 2x of
raw Open MPI under the same load, and the median ratio, each ratio from its own run.

    load_count.py RUN_DIR...
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-11-25-raw-speed"))
from summarize import medians  # noqa: E402

for run in sys.argv[1:]:
    table = medians(os.path.join(run, "mpi.json"))
    ratios = {key: impls["backplane"][0] / impls["raw"][0] for key, impls in table.items()
              if "backplane" in impls and "raw" in impls}
    within = sum(r <= 2 for r in ratios.values())
    worst = sorted(ratios.items(), key=lambda kv: -kv[1])[:5]
    print(f"{run}: {within}/{len(ratios)} within 2x, median ratio {statistics.median(ratios.values()):.2f}; worst: "
          + ", ".join(f"{op} {size} {r:.1f}x" for (op, size), r in worst))
