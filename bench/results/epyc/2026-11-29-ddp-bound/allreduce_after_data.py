"""A 4 MiB allreduce from Python, each from a barrier: back to back, and after each rank touched MB MiB
of other data (a step's data pushing the buckets and the segment out of the caches). Medians.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 build/bin/bpl-run --nproc-per-node 2 .venv/bin/python bench/results/epyc/2026-11-29-ddp-bound/allreduce_after_data.py backplane MB
"""
import sys, time, statistics, torch, torch.distributed as dist
import backplane_torch  # noqa
dist.init_process_group(sys.argv[1])
rank = dist.get_rank()
bucket = torch.ones(1 << 20)  # 4 MiB
other = torch.ones(int(sys.argv[2]) << 18)  # MiB of other data per rank
res = {}
for _ in range(10):
    for kind in ("back_to_back", "after_other_data"):
        for _ in range(20):
            if kind == "after_other_data":
                other.add_(1.0)
            dist.barrier()
            s = time.perf_counter(); dist.all_reduce(bucket); res.setdefault(kind, []).append(time.perf_counter() - s)
if rank == 0:
    print(sys.argv[1], sys.argv[2], "MiB other:", " ".join(f"{k}={statistics.median(v)*1e6:.0f}us" for k, v in res.items()))
dist.destroy_process_group()
