"""torch.distributed on backplane, checked against torch's own Gloo in the same job.

Run on every rank by a launcher (bpl-run, torchrun, or mpirun with BPL_BACKEND=mpi). The default group
is backplane's; a second group over every rank is torch's Gloo, which gathers each rank's inputs so that
every expected result is computed here from them (exact for integers, within rounding for floats).
Exits non-zero on the first failure, naming it.
"""
import atexit
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

# A future's callback left to the completion thread at exit (leave_a_callback_releasing_at_exit) must be
# released before the process ends. atexit runs the last registered first: this check, registered
# before backplane_torch's own hook (at its import), runs after it.
callback_left_at_exit = {"left": False, "released": False}


def check_callback_released_at_exit():
    if callback_left_at_exit["left"] and not callback_left_at_exit["released"]:
        print("FAILED: the process ended before a future's callback was released", file=sys.stderr, flush=True)
        os._exit(1)


atexit.register(check_callback_released_at_exit)

import backplane_torch  # noqa: E402,F401  (registers the backend)

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def check(condition, what):
    if not condition:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def same(actual, expected, what):
    if actual.dtype in (torch.bfloat16, torch.float16):
        ok = torch.allclose(actual.float(), expected.float(), rtol=1e-2, atol=1e-2)
    elif actual.is_floating_point():
        ok = torch.allclose(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        ok = torch.equal(actual, expected)
    if ok and actual.dtype == expected.dtype:
        return
    if actual.numel() <= 16 or actual.shape != expected.shape:
        check(False, f"{what}: got {actual.tolist()} expected {expected.tolist()}")
    wrong = (actual.double() - expected.double()).abs().flatten().nonzero()
    first = int(wrong[0]) if wrong.numel() else 0
    check(False, f"{what}: {wrong.numel()} of {actual.numel()} elements differ ({actual.dtype} vs {expected.dtype}), "
                 f"the first at [{first}]: got {actual.flatten()[first].item()} expected {expected.flatten()[first].item()}")


def inputs_of_every_rank(mine, gloo):
    """Each rank's tensor, gathered through torch's own Gloo (float16/bfloat16 travel as float32)."""
    wire = mine.float() if mine.dtype in (torch.float16, torch.bfloat16) else mine
    everyone = [torch.empty_like(wire) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, wire.contiguous(), group=gloo)
    return [t.to(mine.dtype) for t in everyone]


def value(rank, dtype, n=6):
    """Small distinct values per rank that every dtype holds exactly."""
    return (torch.arange(n) % 5 + rank + 1).to(dtype)


def reduce_local(tensors, op):
    stacked = torch.stack([t.double() if t.is_floating_point() else t.long() for t in tensors])
    if op == dist.ReduceOp.SUM:
        out = stacked.sum(0)
    elif op == dist.ReduceOp.PRODUCT:
        out = stacked.prod(0)
    elif op == dist.ReduceOp.MIN:
        out = stacked.min(0).values
    elif op == dist.ReduceOp.MAX:
        out = stacked.max(0).values
    else:  # AVG
        out = stacked.sum(0) / len(tensors)
    return out.to(tensors[0].dtype)


def test_collectives(gloo):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in FLOATS + INTS:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype in FLOATS:
            ops.append(dist.ReduceOp.AVG)
        mine = value(rank, dtype)
        everyone = inputs_of_every_rank(mine, gloo)
        for op in ops:
            t = mine.clone()
            dist.all_reduce(t, op=op)
            same(t, reduce_local(everyone, op), f"all_reduce {dtype} {op}")
        # non-contiguous: a transposed view, reduced in place through a copy
        base = torch.stack([mine, mine + 1]).t()
        check(not base.is_contiguous(), "the view is non-contiguous")
        dist.all_reduce(base)
        same(base.t().contiguous()[0], reduce_local(everyone, dist.ReduceOp.SUM), f"all_reduce non-contiguous {dtype}")

        t = mine.clone()
        dist.broadcast(t, src=world - 1)
        same(t, everyone[world - 1], f"broadcast {dtype}")

        t = mine.clone()
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
        same(t, reduce_local(everyone, dist.ReduceOp.MAX) if rank == 0 else mine, f"reduce {dtype}")

        out = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        for r in range(world):
            same(out[r], everyone[r], f"all_gather {dtype} from {r}")
        flat = torch.zeros(world * mine.numel(), dtype=dtype)
        dist.all_gather_into_tensor(flat, mine)
        same(flat, torch.cat(everyone), f"all_gather_into_tensor {dtype}")

        gathered = [torch.zeros_like(mine) for _ in range(world)] if rank == 1 % world else None
        dist.gather(mine, gathered, dst=1 % world)
        if gathered is not None:
            for r in range(world):
                same(gathered[r], everyone[r], f"gather {dtype} from {r}")

        part = torch.zeros_like(mine)
        parts = [value(r * 10, dtype) for r in range(world)] if rank == 0 else None
        dist.scatter(part, parts, src=0)
        same(part, value(rank * 10, dtype), f"scatter {dtype}")

        # reduce_scatter: rank r keeps the sum of every rank's r-th block
        blocks = [mine + r for r in range(world)]
        out = torch.zeros_like(mine)
        dist.reduce_scatter(out, blocks)
        same(out, reduce_local([e + rank for e in everyone], dist.ReduceOp.SUM), f"reduce_scatter {dtype}")
        out = torch.zeros_like(mine)
        dist.reduce_scatter_tensor(out, torch.cat(blocks))
        same(out, reduce_local([e + rank for e in everyone], dist.ReduceOp.SUM), f"reduce_scatter_tensor {dtype}")

        # all_to_all: rank r sends block s to rank s
        send = torch.cat([mine + 100 * s for s in range(world)]) if dtype not in (torch.int8, torch.uint8) else \
            torch.cat([mine + s for s in range(world)])
        recv = torch.zeros_like(send)
        dist.all_to_all_single(recv, send)
        step = 100 if dtype not in (torch.int8, torch.uint8) else 1
        same(recv, torch.cat([everyone[s] + step * rank for s in range(world)]), f"all_to_all_single {dtype}")
        outs = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_to_all(outs, list(send.chunk(world)))
        same(torch.cat(outs), recv, f"all_to_all {dtype}")

    # uneven splits: rank r sends rank s (r + s) % 3 + 1 rows of two columns, valued 1000 r + 10 s + row
    rows = lambda r, s: (r + s) % 3 + 1  # noqa: E731
    send = torch.cat([torch.tensor([[1000.0 * rank + 10 * s + k] * 2 for k in range(rows(rank, s))]) for s in range(world)])
    recv = torch.zeros(sum(rows(r, rank) for r in range(world)), 2)
    dist.all_to_all_single(recv, send, [rows(r, rank) for r in range(world)], [rows(rank, s) for s in range(world)])
    expected = torch.cat([torch.tensor([[1000.0 * r + 10 * rank + k] * 2 for k in range(rows(r, rank))])
                          for r in range(world)])
    same(recv, expected, "all_to_all_single with uneven splits")
    outs = [torch.zeros(rows(r, rank), 2) for r in range(world)]
    dist.all_to_all(outs, list(send.split([rows(rank, s) for s in range(world)])))
    same(torch.cat(outs), expected, "all_to_all of uneven tensors")

    # several tensors at once
    a, b = torch.ones(3) * (rank + 1), torch.arange(5, dtype=torch.float32) * (rank + 1)
    dist.all_reduce_coalesced([a, b])
    total = world * (world + 1) / 2
    same(a, torch.ones(3) * total, "all_reduce_coalesced a")
    same(b, torch.arange(5, dtype=torch.float32) * total, "all_reduce_coalesced b")

    # point to point around a ring
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if world > 1:
        out = torch.full((4,), float(rank))
        got = torch.zeros(4)
        reqs = [dist.isend(out, nxt, tag=5), dist.irecv(got, prv, tag=5)]
        for req in reqs:
            req.wait()
        same(got, torch.full((4,), float(prv)), "send/recv ring")
    dist.barrier()


def test_large_list_gather(gloo):
    """all_gather into a list from 256 KiB per rank: one broadcast per rank, each straight into its
    tensor of the list (a non-contiguous one through a contiguous tensor of its own), blocking and async."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype, n in ((torch.float32, 70000), (torch.int8, 300000), (torch.bfloat16, 140000)):
        mine = (torch.arange(n) % 97 + 3 * rank).to(dtype)
        everyone = inputs_of_every_rank(mine, gloo)
        out = [torch.full_like(mine, -1) for _ in range(world)]
        dist.all_gather(out, mine)
        for r in range(world):
            same(out[r], everyone[r], f"all_gather of {n} {dtype} from {r}")
        same(mine, everyone[rank], f"all_gather of {n} {dtype} left its input alone")
        # this rank's own tensor of the list is its input
        out = [mine if r == rank else torch.full_like(mine, -1) for r in range(world)]
        dist.all_gather(out, mine)
        for r in range(world):
            same(out[r], everyone[r], f"all_gather of {n} {dtype} into a list holding the input, from {r}")
        # one tensor of the list is not contiguous, on rank 0 only (a layout of its own: every rank still
        # takes the same path)
        out = [torch.full((n, 2), -1, dtype=dtype)[:, 1] if rank == 0 and r == world - 1 else torch.full_like(mine, -1)
               for r in range(world)]
        dist.all_gather(out, mine)
        for r in range(world):
            same(out[r], everyone[r], f"all_gather of {n} {dtype} into a list with a non-contiguous tensor on rank 0, from {r}")
    # several in flight, one completed through its future, as DDP-style hooks do
    n = 70000
    lists = [[torch.empty(n) for _ in range(world)] for _ in range(3)]
    works = [dist.all_gather(lists[i], torch.full((n,), float(10 * rank + i)), async_op=True) for i in range(3)]
    future = works[1].get_future()
    works[2].wait()
    works[0].wait()
    future.wait()
    for i in range(3):
        for r in range(world):
            same(lists[i][r], torch.full((n,), float(10 * r + i)), f"all_gather {i} of a large list in flight, from rank {r}")
    check(all(w.is_completed() for w in works), "every large all_gather completed")


def test_asynchronous_work_and_futures():
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((1000,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works[:2]]  # two complete in the background, two by wait()
    for w in works[2:]:
        w.wait()
    for f in futures:
        f.wait()
    for i, t in enumerate(tensors):
        same(t, torch.full((1000,), float(sum(r + i for r in range(world)))), f"async all_reduce {i}")
    check(all(w.is_completed() for w in works), "every work completed")
    # List forms in flight together (each gathers through a flat buffer of its own, reused between calls):
    # six at once, more than the buffers kept, of sizes that grow and shrink.
    lists, works = [], []
    for i, n in enumerate([5, 3000, 7, 3000, 40000, 2]):
        outs = [torch.empty(n) for _ in range(world)]
        works.append(dist.all_gather(outs, torch.full((n,), float(10 * rank + i)), async_op=True))
        lists.append((i, n, outs))
    for w in works:
        w.wait()
    for i, n, outs in lists:
        for r in range(world):
            same(outs[r], torch.full((n,), float(10 * r + i)), f"all_gather {i} in flight with others, from rank {r}")
    chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(chained.wait(), torch.full((2,), 2.0 * world), "a future's then()")

    # A wait shorter than the group's timeout raises and leaves the operation in flight; a later wait
    # completes it. The last rank joins late.
    late = torch.ones(3)
    if rank == world - 1:
        time.sleep(0.5)
    work = dist.all_reduce(late, async_op=True)
    if rank == 0 and world > 1:
        try:
            work.wait(datetime.timedelta(milliseconds=50))
            raise AssertionError("a 50 ms wait returned before the late rank joined")
        except RuntimeError as e:
            check("still in flight" in str(e), f"the short wait's message: {e}")
    work.wait()
    same(late, torch.full((3,), float(world)), "all_reduce completed after a short wait")


def leave_a_callback_releasing_at_exit():
    """The process ends while the completion thread still releases a future's Python callback (its
    closure holds an object whose release takes 0.5 s): backplane_torch's atexit hook waits for it, so
    that the thread never takes the GIL of a finalizing interpreter (which ends the thread in the middle
    of a destructor, and aborts the process)."""
    class SlowToRelease:
        def __del__(self):
            time.sleep(0.5)
            callback_left_at_exit["released"] = True

    def attach(future):
        guard = SlowToRelease()
        return future.then(lambda f, guard=guard: f.value()[0] + 1)

    t = torch.ones(4)
    callback_left_at_exit["left"] = True
    same(attach(dist.all_reduce(t, async_op=True).get_future()).wait(), torch.full((4,), dist.get_world_size() + 1.0),
         "then() of a callback released at exit")


def test_subgroups():
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        return
    # Every rank calls new_group; only members take part in the group's operations.
    members = list(range(1, world))
    group = dist.new_group(members)
    if rank in members:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        same(t, torch.tensor([float(sum(members))]), "all_reduce in ranks 1..")
        check(dist.get_rank(group) == rank - 1, "rank in the subgroup")
        t = torch.tensor([float(rank)])
        dist.broadcast(t, src=world - 1, group=group)  # src is a global rank
        same(t, torch.tensor([float(world - 1)]), "broadcast in the subgroup")
    pair = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        t = torch.tensor([rank + 1], dtype=torch.int64)
        dist.all_reduce(t, group=pair)
        same(t, torch.tensor([world + 1], dtype=torch.int64), "all_reduce in the pair")
    dist.barrier()


def test_ddp_matches_gloo(gloo):
    """DDP on backplane trains to the same parameters as DDP on torch's Gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = dist.get_rank()
    results = []
    for group in (None, gloo):  # None: the default group, backplane's
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        ddp = DDP(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)
        for _ in range(5):
            x, y = torch.randn(16, 8), torch.randn(16, 4)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        check(torch.allclose(a, b, rtol=1e-5, atol=1e-6), "DDP parameters differ from Gloo's")


def test_coalesced():
    """The coalesced forms torch 2 calls: all_gather_coalesced, and all_gather_into_tensor and
    reduce_scatter_tensor inside a coalescing manager (one work for several tensors)."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs = [torch.full((2,), float(rank + 1)), torch.full((3,), float(10 * (rank + 1)))]  # one dtype: torch checks
    lists = [[torch.zeros_like(t) for t in inputs] for _ in range(world)]  # lists[r][i]: rank r's input i
    dist.all_gather_coalesced(lists, inputs)
    for r in range(world):
        for i, t in enumerate(inputs):
            same(lists[r][i], torch.full_like(t, float((r + 1) * (1 if i == 0 else 10))), f"all_gather_coalesced: rank {r}'s input {i}")
    gathered = [torch.zeros(world * t.numel(), dtype=t.dtype) for t in inputs]
    with _coalescing_manager(async_ops=True) as manager:
        for out, t in zip(gathered, inputs):
            dist.all_gather_into_tensor(out, t)
    manager.wait()
    for out, t in zip(gathered, inputs):
        expected = torch.cat([torch.full_like(t, float((r + 1) * (1 if t.numel() == 2 else 10))) for r in range(world)])
        same(out, expected, "all_gather_into_tensor, coalesced")
    outputs = [torch.zeros(2), torch.zeros(3, dtype=torch.float64)]
    sources = [torch.arange(2.0 * world) + rank, torch.arange(3.0 * world, dtype=torch.float64) * (rank + 1)]
    with _coalescing_manager(async_ops=True) as manager:
        for out, source in zip(outputs, sources):
            dist.reduce_scatter_tensor(out, source)
    manager.wait()
    total = [sum(torch.arange(2.0 * world) + r for r in range(world)),
             sum(torch.arange(3.0 * world, dtype=torch.float64) * (r + 1) for r in range(world))]
    for out, whole in zip(outputs, total):
        same(out, whole[rank * out.numel():(rank + 1) * out.numel()], "reduce_scatter_tensor, coalesced")


def test_backend_lifecycle():
    """What torch 2 asks of a backend besides operations: its operations counted, its first failure (none
    here), its options, and subgroups split from it by their members alone (torch's split_group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = backend._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    check(backend._get_sequence_number_for_group() == before + 1,
          f"rank {rank}: one operation moves the sequence number from {before} by one")
    if hasattr(backend, "get_error"):  # torch 2.12 binds it for NCCL's backend only
        check(backend.get_error() == torch._C._distributed_c10d.ErrorType.SUCCESS,
              f"rank {rank}: no failure yet, but get_error() says {backend.get_error()}")
    if dist.group.WORLD.bound_device_id is None and torch.__version__ < "2.13":
        # torch 2.12's split_group needs a default group bound to a device, and binds none to the CPU.
        return
    alone = dist.split_group(split_ranks=[[r] for r in range(world)])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=alone)
    same(t, torch.tensor([float(rank + 1)]), "all_reduce on a group of one split from the world")
    evens = [r for r in range(world) if r % 2 == 0]
    odds = [r for r in range(world) if r % 2 == 1]
    halves = dist.split_group(split_ranks=[g for g in (evens, odds) if g])
    mine = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=halves)
    same(t, torch.tensor([float(sum(r + 1 for r in mine))]), "all_reduce on the evens and the odds split from the world")


def test_bad_input_is_an_exception():
    rank, world = dist.get_rank(), dist.get_world_size()

    def raises(call, fragment, what):
        try:
            call()
        except (RuntimeError, ValueError) as e:
            check(fragment in str(e), f"{what}: message '{e}' lacks '{fragment}'")
            return
        raise AssertionError(f"rank {rank}: {what}: no exception")

    # backplane-parallel refuses such a tensor in the same words (parallel_unit_test.cpp): one bridge.
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)),
           "allreduce: the tensor has dtype Bool, which backplane does not move (it moves float32,", "a bool tensor")
    raises(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "op band takes an integer dtype",
           "a bitwise reduce of floats")
    raises(lambda: dist.broadcast(torch.ones(2), src=world + 3), f"invalid root rank: {world + 3}",
           "a root outside the group")
    raises(lambda: dist.send(torch.ones(2), dst=world + 3), f"destination rank: {world + 3}", "a peer outside the group")
    raises(lambda: dist.all_gather([torch.ones(2)] * world, torch.ones(3)), "output tensor 0", "mismatched allgather sizes")
    raises(lambda: dist.all_to_all_single(torch.zeros(world + 1), torch.zeros(world + 1), [1] * world, [1] * world),
           "split sizes add up to", "split sizes that do not add up to the tensor's rows")
    # the group still works after refused calls
    t = torch.ones(1)
    dist.all_reduce(t)
    same(t, torch.ones(1) * world, "all_reduce after refused calls")


def main():
    # Under mpirun, backplane_torch gave torch's env:// rendezvous the launch variables (RANK, ...).
    timeout = datetime.timedelta(seconds=float(os.environ.get("TEST_TIMEOUT_S", "60")))
    init_file = os.environ.get("TEST_INIT_FILE")  # torch's FileStore as the meeting place instead of env://
    if init_file:
        dist.init_process_group("backplane", timeout=timeout, init_method=f"file://{init_file}",
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("backplane", timeout=timeout)
    gloo = dist.new_group(backend="gloo")
    print(f"rank {dist.get_rank()}: {backplane_torch.describe(dist.group.WORLD)}", flush=True)
    tests = (lambda: test_collectives(gloo), lambda: test_large_list_gather(gloo), test_asynchronous_work_and_futures,
             test_subgroups, test_coalesced, test_backend_lifecycle, lambda: test_ddp_matches_gloo(gloo), test_bad_input_is_an_exception)
    for test in tests:
        test()
    leave_a_callback_releasing_at_exit()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {os.environ.get('RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))}: OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001  (report, then fail the process)
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
