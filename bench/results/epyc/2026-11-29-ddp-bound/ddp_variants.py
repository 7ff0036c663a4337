"""A DDP step's communication (step less the bucket-work step, medians) with DDP's own path (default)
and with comm hooks that run the allreduce blocking in the hook, asynchronously with a Python
callback, or deferred until the last bucket (no overlap with the backward pass). Blocks of 10 steps
per variant, taking turns, as bpl-bench-torch does.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 build/bin/bpl-run --nproc-per-node 2 .venv/bin/python bench/results/epyc/2026-11-29-ddp-bound/ddp_variants.py backplane|gloo [BLOCKS]
"""
import sys, time, statistics, torch, torch.distributed as dist
import backplane_torch  # noqa
from torch.nn.parallel import DistributedDataParallel as DDP
backend = sys.argv[1]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
width = 512
def make(hook=None):
    torch.manual_seed(0)
    d = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]))
    if hook: d.register_comm_hook(None, hook)
    return d
def bucket_work_only(state, bucket):
    f = torch.futures.Future(); f.set_result(bucket.buffer().div_(world)); return f
def blocking(state, bucket):
    b = bucket.buffer().div_(world); dist.all_reduce(b)
    f = torch.futures.Future(); f.set_result(b); return f
def async_then(state, bucket):
    return dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future().then(lambda f: f.value()[0])
pending = []
def deferred(state, bucket):
    f = torch.futures.Future()
    pending.append((bucket.buffer().div_(world), f))
    if bucket.is_last():
        for b, fut in pending:
            dist.all_reduce(b)
            fut.set_result(b)
        pending.clear()
    return f
models = {"deferred": make(deferred), "default": make(), "blocking": make(blocking), "async_hook": make(async_then), "bucket_work": make(bucket_work_only)}
x, y = torch.randn(8, width), torch.randn(8, width)
def step(ddp):
    ddp.zero_grad(set_to_none=False)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    with torch.no_grad():
        for p in ddp.parameters(): p.add_(p.grad, alpha=-0.01)
samples = {k: [] for k in models}
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
    for k, m in models.items():
        step(m)
        for _ in range(10):
            dist.barrier(); s = time.perf_counter(); step(m); samples[k].append(time.perf_counter() - s)
ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
if rank == 0:
    print(backend, " ".join(f"{k}={v - ms['bucket_work']:.3f}" for k, v in ms.items() if k != "bucket_work"), f"bucket_work_step={ms['bucket_work']:.2f}")
dist.destroy_process_group()
