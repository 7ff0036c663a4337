"""What a collective costs from Python on a one-rank group (argument: backplane or gloo): dist.broadcast,
the ProcessGroup's own broadcast().wait(), a wait on a finished Work; medians in us."""
import os, sys, time, statistics, torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "backplane": import backplane_torch
import tempfile
dist.init_process_group(backend, init_method="file://" + os.path.join(tempfile.mkdtemp(), "store"), rank=0, world_size=1)
x = torch.ones(1)
pg = dist.group.WORLD
def t(fn, n=20000):
    for _ in range(1000): fn()
    s = []
    for _ in range(7):
        a = time.perf_counter()
        for _ in range(n): fn()
        s.append((time.perf_counter() - a) / n * 1e6)
    return statistics.median(s)
opts = dist.BroadcastOptions(); opts.rootRank = 0; opts.rootTensor = 0
w = pg.broadcast([x], opts)
print(backend, "dist.broadcast %.2f" % t(lambda: dist.broadcast(x, 0)),
      "pg.broadcast().wait() %.2f" % t(lambda: pg.broadcast([x], opts).wait()),
      "pg.broadcast() %.2f" % t(lambda: pg.broadcast([x], opts)),
      "work.wait() on done %.2f" % t(lambda: w.wait()),
      "get_rank %.2f" % t(lambda: dist.get_rank()))
