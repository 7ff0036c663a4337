"""An allreduce of 1 MiB, then one of 3 MiB (a DDP step's two buckets at 4 MiB of gradients), right
after the ranks did something else for 2 ms: nothing, a Python busy loop, a sleep, small matmuls, or a
pass over 16 MiB. Each pair is timed on every rank; the 1 MiB allreduce from the later rank's arrival
(rank clocks are one machine's CLOCK_MONOTONIC), so that the ranks' skew is left out.

    BPL_BACKEND=gloo PYTHONPATH=build/python build/bin/bpl-run --nproc-per-node 2 \\
        .venv/bin/python bench/results/epyc/2026-11-29-large-waits/after_compute.py OUT_DIR

BPL_PLUGIN_PATH=DIR takes the gloo plugin from DIR, to compare two builds in turns.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import backplane_torch  # noqa: F401  (registers the backend)

out_dir = sys.argv[1]
dist.init_process_group("backplane")
torch.set_num_threads(1)
rank = dist.get_rank()
small, large = torch.ones(262656), torch.ones(787968)  # the buckets of 4 x Linear(512, 512)
w, x = torch.randn(512, 512), torch.randn(8, 512)
stream = torch.randn(4 << 20)


def before_the_allreduces(kind):
    if kind == "busy loop":
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass
    elif kind == "sleep":
        time.sleep(0.002)
    elif kind == "matmuls":
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            x @ w
    elif kind == "16 MiB pass":
        stream.mul_(1.0001)
        stream.mul_(0.9999)


kinds = ["nothing", "busy loop", "sleep", "matmuls", "16 MiB pass"]
marks = {kind: [] for kind in kinds}
for kind in kinds * 2:
    for i in range(60):
        dist.barrier()
        before_the_allreduces(kind)
        t0 = time.perf_counter()
        dist.all_reduce(small)
        t1 = time.perf_counter()
        dist.all_reduce(large)
        t2 = time.perf_counter()
        if i >= 10:
            marks[kind].append((t0, t1, t2))
with open(os.path.join(out_dir, f"after-compute-{rank}.json"), "w") as f:
    json.dump(marks, f)
dist.barrier()
if rank == 0:
    with open(os.path.join(out_dir, "after-compute-1.json")) as f:
        other = json.load(f)
    for kind in kinds:
        first = [(m[1] - max(m[0], o[0])) * 1e6 for m, o in zip(marks[kind], other[kind])]
        second = [(m[2] - m[1]) * 1e6 for m in marks[kind]]
        print(f"{kind:12s} 1 MiB from the later arrival {statistics.median(first):6.0f} us, "
              f"then 3 MiB {statistics.median(second):6.0f} us")
dist.destroy_process_group()
