"""all_gather into a list against all_gather_into_tensor, 16 KiB-16 MiB per rank, medians in us (run under
bpl-run --nproc-per-node 2, PYTHONPATH=build/python). The A/B in the README built the ProcessGroup with
the list threshold at 16 KiB and at infinity in turn."""
import os, sys, time, statistics, torch, torch.distributed as dist
import backplane_torch
dist.init_process_group("backplane")
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
for _ in range(200): dist.all_reduce(torch.ones(1))
res = []
for nbytes in [16384, 65536, 131072, 262144, 1 << 20, 4 << 20, 16 << 20]:
    n = nbytes // 4
    x = torch.ones(n); outs = [torch.empty(n) for _ in range(world)]; flat = torch.empty(world * n)
    def t(fn):
        for _ in range(3): fn()
        k = max(3, min(2000, int(0.05 / max(1e-6, (lambda a: (fn(), time.perf_counter() - a)[1])(time.perf_counter())))))
        kk = torch.tensor([k]); dist.broadcast(kk, 0); k = int(kk)
        s = []
        for _ in range(5):
            dist.barrier(); a = time.perf_counter()
            for _ in range(k): fn()
            s.append((time.perf_counter() - a) / k * 1e6)
        return statistics.median(s)
    res.append((nbytes, t(lambda: dist.all_gather(outs, x)), t(lambda: dist.all_gather_into_tensor(flat, x))))
if rank == 0:
    print(" ".join(f"{b>>10}K list {l:.1f} flat {f:.1f} |" for b, l, f in res), flush=True)
dist.destroy_process_group()
