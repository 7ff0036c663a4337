"""A 4 MiB allreduce from Python, each from a barrier: blocking, as a Work waited for, and through the
Work's future (DDP's way: the completion thread waits and completes the future). Medians.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 build/bin/bpl-run --nproc-per-node 2 .venv/bin/python bench/results/epyc/2026-11-29-ddp-bound/allreduce_waits.py backplane
"""
import sys, time, statistics, torch, torch.distributed as dist
import backplane_torch  # noqa
dist.init_process_group(sys.argv[1])
rank = dist.get_rank()
bucket = torch.ones(1 << 20)  # 4 MiB
res = {}
calls = {
    "blocking": lambda: dist.all_reduce(bucket),
    "work_wait": lambda: dist.all_reduce(bucket, async_op=True).wait(),
    "future_wait": lambda: dist.all_reduce(bucket, async_op=True).get_future().wait(),
}
for _ in range(10):
    for kind, call in calls.items():
        for _ in range(20):
            dist.barrier()
            s = time.perf_counter(); call(); res.setdefault(kind, []).append(time.perf_counter() - s)
if rank == 0:
    print(sys.argv[1], " ".join(f"{k}={statistics.median(v)*1e6:.0f}us" for k, v in res.items()))
dist.destroy_process_group()
