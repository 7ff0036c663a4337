"""The calls torch's ProcessGroupGloo takes on CPU beyond one tensor per call, and its bitwise reductions,
made on backplane's group and on torch's Gloo in the same job with the same inputs: the results agree, and a mistake is refused on both
with torch's phrase for it.

Run on every rank by a launcher (bpl-run). Exits non-zero on the first failure, naming it.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, BroadcastOptions, ReduceScatterOptions

import backplane_torch  # noqa: F401  (registers the backend)


def check(condition, what):
    if not condition:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def agree(ours, gloos, what):
    for i, (a, b) in enumerate(zip(ours, gloos)):
        a, b = (a.to_dense(), b.to_dense()) if a.is_sparse else (a, b)
        check(torch.equal(a, b), f"{what}, tensor {i}: backplane {a.tolist()}, gloo {b.tolist()}")


def on_both(groups, call, what):
    """call(group) on backplane's group and gloo's; each returns the tensors it wrote."""
    results = [call(group) for group in groups]
    agree(results[0], results[1], what)


def refused_on_both(groups, call, phrase, what):
    for group in groups:
        try:
            call(group)
        except (RuntimeError, ValueError) as e:
            check(phrase in str(e), f"{what} on {group.name()}: message '{e}' lacks '{phrase}'")
            continue
        check(False, f"{what} on {group.name()}: no exception")


def test_several_tensors(groups, rank, world):
    def broadcast(group):
        tensors = [torch.full((3,), float(rank * 10 + i)) for i in range(2)]
        opts = BroadcastOptions()
        opts.rootRank, opts.rootTensor = world - 1, 1
        group.broadcast(tensors, opts).wait()
        return tensors
    on_both(groups, broadcast, "broadcast of two tensors from the root's second")

    def allgather(group):
        inputs = [torch.full((2,), float(rank * 10 + i)) for i in range(2)]
        outputs = [[torch.zeros(2) for _ in range(2 * world)] for _ in range(2)]
        group.allgather(outputs, inputs, AllgatherOptions()).wait()
        return [t for output in outputs for t in output]
    on_both(groups, allgather, "allgather of two inputs")

    def sparse_allreduce(group):
        tensors = [torch.sparse_coo_tensor([[rank, i]], [float(rank + 1), 2.0], (world + 2,)) for i in range(2)]
        group.allreduce(tensors).wait()
        return tensors
    on_both(groups, sparse_allreduce, "allreduce of two sparse tensors")


def test_bitwise_reductions(groups, rank, world):
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        for dtype in (torch.uint8, torch.int8, torch.int32, torch.int64):
            def allreduce(group):
                tensor = (torch.arange(6, dtype=torch.int64) * 37 + rank * 11 + 5).to(dtype)
                dist.all_reduce(tensor, op=op, group=group)
                return [tensor]
            on_both(groups, allreduce, f"all_reduce {op} of {dtype}")

            def reduce(group):
                tensor = (torch.arange(5, dtype=torch.int64) * 29 + rank * 13 + 3).to(dtype)
                dist.reduce(tensor, dst=world - 1, op=op, group=group)
                return [tensor] if rank == world - 1 else []
            on_both(groups, reduce, f"reduce {op} of {dtype}")


def test_uneven_reduce_scatter(groups, rank, world):
    def reduce_scatter(group):
        inputs = [torch.full((r + 1,), float(rank + 1 + 10 * r)) for r in range(world)]
        output = torch.zeros(rank + 1)
        group.reduce_scatter([output], [inputs], ReduceScatterOptions()).wait()
        return [output]
    results = [reduce_scatter(group) for group in groups]
    expected = torch.full((rank + 1,), float(sum(q + 1 for q in range(world)) + world * 10 * rank))
    agree(results[0], [expected], "reduce_scatter of blocks of different sizes")
    agree(results[1], [expected], "reduce_scatter of blocks of different sizes, on gloo")


def test_mistakes(groups, world):
    def bad_root_tensor(group):
        opts = BroadcastOptions()
        opts.rootTensor = 2
        group.broadcast([torch.ones(1), torch.ones(1)], opts).wait()
    refused_on_both(groups, bad_root_tensor, "invalid root tensor", "broadcast from a third tensor of two")

    def bad_root_rank(group):
        opts = BroadcastOptions()
        opts.rootRank = world + 3
        group.broadcast([torch.ones(1)], opts).wait()
    refused_on_both(groups, bad_root_rank, f"invalid root rank: {world + 3}", "broadcast from a rank outside the group")
    refused_on_both(groups, lambda group: group.allgather([[torch.ones(1)] * world], [torch.ones(1)] * 2).wait(),
                    "requires input/output tensor lists to have the same length", "allgather of two inputs into one list")
    refused_on_both(groups, lambda group: group.allgather([[torch.ones(2)] * world], [torch.ones(3)]).wait(),
                    "invalid tensor size at index 0", "allgather into tensors of another size")


def test_default_timeout(rank):
    """The backend's timeout setter, as ProcessGroupGloo's: a collective a peer joins late times out at it."""
    group = dist.new_group(backend="backplane")
    group._get_backend(torch.device("cpu"))._set_default_timeout(datetime.timedelta(milliseconds=500))
    start = time.monotonic()
    if rank == 1:
        time.sleep(3)
    try:
        dist.all_reduce(torch.ones(1), group=group)
        ended = "completed"
    except RuntimeError as e:
        ended = str(e)
    if rank == 0:
        waited = time.monotonic() - start
        check("timeout" in ended and waited < 2.5, f"a peer 3 s late, 0.5 s timeout: after {waited:.1f} s: {ended}")


def main():
    dist.init_process_group("backplane", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.group.WORLD, dist.new_group(backend="gloo")]
    test_several_tensors(groups, rank, world)
    test_bitwise_reductions(groups, rank, world)
    test_uneven_reduce_scatter(groups, rank, world)
    test_mistakes(groups, world)
    dist.barrier()
    test_default_timeout(rank)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001  (report, then fail the process)
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
