"""A DDP step taken apart (argument: backplane or gloo; run under bpl-run --nproc-per-node 2): the
default step, a blocking allreduce in a comm hook, a hook that only divides (DDP's bucket work),
no_sync(), and the bare allreduce of the gradients' size; medians in ms."""
import os, sys, time, statistics
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
backend = sys.argv[1]
if backend == "backplane":
    import backplane_torch
dist.init_process_group(backend)
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
for _ in range(200): dist.all_reduce(torch.ones(1))

def run(width, reps=10):
    def make(hook=None):
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
        d = DDP(m)
        if hook: d.register_comm_hook(None, hook)
        return d
    def sync_hook(state, bucket):
        b = bucket.buffer(); b.div_(world); dist.all_reduce(b)
        f = torch.futures.Future(); f.set_result(b); return f
    def async_hook(state, bucket):
        b = bucket.buffer(); b.div_(world)
        return dist.all_reduce(b, async_op=True).get_future().then(lambda f: f.value()[0])
    def div_hook(state, bucket):
        f = torch.futures.Future(); f.set_result(bucket.buffer().div_(world)); return f
    models = {"default": make(), "sync_hook": make(sync_hook), "div_only": make(div_hook)}
    x, y = torch.randn(8, width), torch.randn(8, width)
    def step(d):
        d.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(d(x), y).backward()
    kinds = {k: (lambda d=d: step(d)) for k, d in models.items()}
    def ns():
        with models["default"].no_sync(): step(models["default"])
    kinds["no_sync"] = ns
    samples = {k: [] for k in kinds}
    for _ in range(reps):
        for k, call in kinds.items():
            call()
            for _ in range(10):
                dist.barrier(); t = time.perf_counter(); call(); samples[k].append(time.perf_counter() - t)
    # plain allreduce of the same bytes
    n = sum(p.numel() for p in models["default"].parameters())
    buf = torch.ones(n); ar = []
    for _ in range(50):
        dist.barrier(); t = time.perf_counter(); dist.all_reduce(buf); ar.append(time.perf_counter() - t)
    if rank == 0:
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        print(f"{backend} width {width} ({n*4/1024:.0f} KiB): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()) +
              f", comm {med['default']-med['no_sync']:.3f}, allreduce {statistics.median(ar)*1e3:.3f} ms", flush=True)
for w in (128, 512):
    run(w)
dist.destroy_process_group()
