#!/usr/bin/env python3
"""Summarises several bpl-bench-compare runs (their gloo.json and mpi.json): per operation and size,
the median and the range over the runs of each ratio, every ratio taken within one run.

    summarize.py RUN_DIR... > summary.md
"""
import json
import os
import statistics
import sys

RANKS = 2


def medians(path):
    """Each benchmark's median aggregate or, where it has none (--interleave: one run per repetition),
    the median of its runs."""
    with open(path) as f:
        results = json.load(f)
    runs = {}
    for b in results["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        parts = b["run_name"].split("/")
        key = ("barrier", 0) if parts[0] == "barrier" else (parts[0], int(parts[2]))
        impl = parts[1] if parts[0] == "barrier" else parts[3]
        unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
        runs.setdefault((key, impl), []).append((b["real_time"] * unit, b.get("busbw_GBps", 0.0)))
    table = {}
    for (key, impl), values in runs.items():
        table.setdefault(key, {})[impl] = (statistics.median(v[0] for v in values),
                                           statistics.median(v[1] for v in values))
    return table


def bus_factor(op):
    ring = (RANKS - 1) / RANKS
    return {"allreduce": 2 * ring, "broadcast": 1.0, "pingpong": 2.0}.get(op, ring)


def traffic_factor(op):
    return {"scatter": 2 / RANKS, "reduce_scatter": 1 + 1 / RANKS, "allreduce": 3 - 1 / RANKS, "pingpong": 4.0}.get(op, 2.0)


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B" if n else "-"


def spread(values, digits=2):
    if not values:
        return ""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    runs = sys.argv[1:]
    mpi = [medians(os.path.join(r, "mpi.json")) for r in runs if os.path.exists(os.path.join(r, "mpi.json"))]
    gloo = [medians(os.path.join(r, "gloo.json")) for r in runs if os.path.exists(os.path.join(r, "gloo.json"))]
    pairs = [(g, m) for g, m in zip(gloo, mpi)]
    keys = sorted({k for t in mpi + gloo for k in t if k[0] != "copy"},
                  key=lambda k: (["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "pingpong",
                                  "barrier", "gather", "scatter", "allgatherv", "alltoallv"].index(k[0]), k[1]))
    print(f"Medians over {len(runs)} runs, (min-max) over the runs; every ratio is taken within one run.\n")
    print("| op | size | mpi µs | raw Open MPI µs | mpi/raw | mpi - raw µs | gloo µs | gloo/raw mpi | gloo/copy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        op, size = key
        m_us = [t[key]["backplane"][0] for t in mpi if key in t and "backplane" in t[key]]
        r_us = [t[key]["raw"][0] for t in mpi if key in t and "raw" in t[key]]
        ratio = [t[key]["backplane"][0] / t[key]["raw"][0] for t in mpi if key in t and "raw" in t[key]]
        diff = [t[key]["backplane"][0] - t[key]["raw"][0] for t in mpi if key in t and "raw" in t[key]]
        g_us = [t[key]["backplane"][0] for t in gloo if key in t]
        g_vs = [g[key]["backplane"][0] / m[key]["raw"][0] for g, m in pairs if key in g and key in m and "raw" in m[key]]
        copy = []
        for t in gloo:
            ref = t.get(("copy", size), {}).get("memcpy")
            if key in t and ref and t[key]["backplane"][1] > 0:
                copy.append(2 * ref[1] * bus_factor(op) / (t[key]["backplane"][1] * traffic_factor(op)))
        digits = 3 if max(m_us + [0]) < 10 else 1
        print(f"| {op} | {human(size)} | {spread(m_us, digits)} | {spread(r_us, digits)} | {spread(ratio)} | "
              f"{spread(diff, 2)} | {spread(g_us, digits)} | {spread(g_vs)} | {spread(copy) if size >= 16 << 20 else ''} |")


if __name__ == "__main__":
    main()
