#!/usr/bin/env python3
"""Item 2 of issue #25 for gloo's shared memory: per run directory holding gloo.json (backplane's gloo)
and mpi.json (a run of the mpi backend under the same load, whose raw side is raw Open MPI), the points
where gloo is within 2x of raw Open MPI, the median ratio and the worst points.

    gloo_vs_mpi.py RUN_DIR...
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-11-25-raw-speed"))
from summarize import medians  # noqa: E402

for run in sys.argv[1:]:
    gloo = medians(os.path.join(run, "gloo.json"))
    mpi = medians(os.path.join(run, "mpi.json"))
    ratios = sorted(((impls["backplane"][0] / mpi[key]["raw"][0], key) for key, impls in gloo.items()
                     if key[0] != "copy" and "backplane" in impls and "raw" in mpi.get(key, {})), reverse=True)
    within = sum(ratio <= 2 for ratio, _ in ratios)
    worst = ", ".join(f"{op} {size} {ratio:.1f}x" for ratio, (op, size) in ratios[:8])
    print(f"{os.path.basename(run)}: gloo shm vs raw Open MPI: {within}/{len(ratios)} within 2x, median "
          f"{statistics.median(r for r, _ in ratios):.2f}; worst: {worst}")
