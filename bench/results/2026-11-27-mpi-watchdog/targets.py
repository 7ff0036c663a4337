#!/usr/bin/env python3
"""Item 1 of issue #25, counted per run of `bpl-bench-compare --backends mpi`: points below 64 KiB
within +0.3 µs of raw Open MPI, points from 64 KiB within 1.05x (and 1.10x), each from its own run.

    targets.py RUN_DIR... (prints one line per run, the points over target in its last column; then,
    given several runs, the points over target in at least half of them: what is not noise)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-11-25-raw-speed"))
from summarize import medians  # noqa: E402

misses = {}  # (op, size) -> runs in which it was over target
for run in sys.argv[1:]:
    table = medians(os.path.join(run, "mpi.json"))
    small = large = small_ok = large_ok = large_10 = 0
    over = []
    for (op, size), impls in sorted(table.items()):
        if "backplane" not in impls or "raw" not in impls:
            continue
        ours, raw = impls["backplane"][0], impls["raw"][0]
        if size < 65536:
            small += 1
            if ours - raw <= 0.3:
                small_ok += 1
            else:
                over.append(f"{op} {size}: +{ours - raw:.2f} µs")
                misses[op, size] = misses.get((op, size), 0) + 1
        else:
            large += 1
            large_ok += ours / raw <= 1.05
            large_10 += ours / raw <= 1.10
            if ours / raw > 1.05:
                over.append(f"{op} {size}: {ours / raw:.2f}x")
                misses[op, size] = misses.get((op, size), 0) + 1
    print(f"{run}: below 64 KiB {small_ok}/{small} within +0.3 µs; from 64 KiB {large_ok}/{large} within 1.05x, "
          f"{large_10}/{large} within 1.10x; over: {'; '.join(over)}")
runs = len(sys.argv) - 1
if runs > 1:
    steady = [f"{op} {size} ({n} of {runs})" for (op, size), n in sorted(misses.items()) if 2 * n >= runs]
    print(f"over target in at least half of the {runs} runs: {', '.join(steady) or 'none'}")
