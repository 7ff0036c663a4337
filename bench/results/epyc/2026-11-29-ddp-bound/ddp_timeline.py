"""Where a DDP step's communication goes: per step, on each rank, when each bucket was ready, how long the
rank waited for its peer, and how long the allreduce took from the moment both ranks were in. A comm
hook runs each bucket's allreduce blocking, in the hook (so the times are the allreduce's own).

    PYTHONPATH=build/python OMP_NUM_THREADS=1 build/bin/bpl-run --nproc-per-node 2 .venv/bin/python bench/results/epyc/2026-11-29-ddp-bound/ddp_timeline.py backplane|gloo
"""
import sys, time, statistics, torch, torch.distributed as dist
import backplane_torch  # noqa
from torch.nn.parallel import DistributedDataParallel as DDP
backend = sys.argv[1]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
width = 512
torch.manual_seed(0)
ddp = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]))
ev = {}
def blocking(state, bucket):
    i = bucket.index()
    ev[f"r{i}"] = time.perf_counter()
    b = bucket.buffer().div_(world)
    ev[f"d{i}"] = time.perf_counter()
    dist.all_reduce(b)
    ev[f"e{i}"] = time.perf_counter()
    f = torch.futures.Future(); f.set_result(b); return f
ddp.register_comm_hook(None, blocking)
x, y = torch.randn(8, width), torch.randn(8, width)
def step():
    ddp.zero_grad(set_to_none=False)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    ev["bw"] = time.perf_counter()
    with torch.no_grad():
        for p in ddp.parameters(): p.add_(p.grad, alpha=-0.01)
for _ in range(20): step()
rows = []
for _ in range(300):
    dist.barrier(); ev.clear(); ev["s"] = time.perf_counter(); step(); ev["end"] = time.perf_counter(); rows.append(dict(ev))
allrows = [None] * world
dist.all_gather_object(allrows, rows)
if rank == 0:
    def q(v): v = sorted(v); return f"med {statistics.median(v)*1e3:.3f} p10 {v[len(v)//10]*1e3:.3f} p90 {v[len(v)*9//10]*1e3:.3f}"
    A, B = allrows
    for i in (0, 1):
        print(f"bucket {i}: my wait for peer", q([max(0, b[f'd{i}'] - a[f'd{i}']) for a, b in zip(A, B)]),
              "| transfer from both in", q([a[f'e{i}'] - max(a[f'd{i}'], b[f'd{i}']) for a, b in zip(A, B)]),
              "| div", q([a[f'd{i}'] - a[f'r{i}'] for a in A]))
    print("start skew (barrier exit)", q([abs(b['s'] - a['s']) for a, b in zip(A, B)]))
    print("step", q([a['end'] - a['s'] for a in A]))
dist.destroy_process_group()
