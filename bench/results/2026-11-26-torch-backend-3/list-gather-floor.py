"""Where a small list all_gather's time goes: from Python, through the ProcessGroup alone, and the flat
form beside it (argument: backplane or gloo; run under bpl-run with 1 or 2 ranks)."""
import os, sys, time, statistics, torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "backplane": import backplane_torch
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(4)
outs = [torch.empty(4) for _ in range(world)]
flat = torch.empty(4 * world)
pg = dist.group.WORLD
def t(fn, n=5000):
    for _ in range(500): fn()
    s = []
    for _ in range(7):
        dist.barrier(); a = time.perf_counter()
        for _ in range(n): fn()
        s.append((time.perf_counter() - a) / n * 1e6)
    return statistics.median(s)
o = torch._C._distributed_c10d.AllgatherOptions()
r = {"dist.all_gather(list)": t(lambda: dist.all_gather(outs, x)),
     "pg.allgather(list).wait()": t(lambda: pg.allgather([outs], [x], o).wait()),
     "all_gather_into_tensor": t(lambda: dist.all_gather_into_tensor(flat, x)),
     "all_reduce": t(lambda: dist.all_reduce(x)),
     "broadcast": t(lambda: dist.broadcast(x, 0))}
if rank == 0: print(backend, world, " ".join(f"{k} {v:.2f} |" for k, v in r.items()), flush=True)
dist.destroy_process_group()
