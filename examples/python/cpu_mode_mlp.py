"""The CPU-mode tensor-parallel MLP of neuronx-distributed's documentation, on plain torch.distributed
with backend "backplane" (neuronx-distributed itself does not install here, so the two parallel layers
are written out: a column-parallel linear keeps its output split, a row-parallel linear takes that split
input and sums the partial products with an all_reduce).

    NXD_CPU_MODE=1 PYTHONPATH=build/python .venv/bin/torchrun --nproc_per_node 2 examples/python/cpu_mode_mlp.py --check
    NXD_CPU_MODE=1 PYTHONPATH=build/python build/bin/bpl-run --nproc-per-node 2 .venv/bin/python examples/python/cpu_mode_mlp.py --check

With --check, every rank also runs the unsharded MLP on the full weights, forward and backward, and
compares the output and the weight gradients of its shard; the exit status says whether they match.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import backplane_torch  # noqa: F401  (registers the backend "backplane")


def cpu_mode():
    return os.environ.get("NXD_CPU_MODE", "0") == "1"


class _CopyToParallelRegion(torch.autograd.Function):
    """Identity forward; the gradient of a replicated input is the sum over the shards that used it."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromParallelRegion(torch.autograd.Function):
    """Sums the partial outputs of every shard; the gradient goes to each shard unchanged."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(torch.nn.Module):
    """y_shard = x W_shard^T, where W_shard is this rank's block of output rows."""

    def __init__(self, master_weight):
        super().__init__()
        rows = master_weight.shape[0] // dist.get_world_size()
        start = dist.get_rank() * rows
        self.weight = torch.nn.Parameter(master_weight[start:start + rows].clone())

    def forward(self, x):
        return torch.nn.functional.linear(_CopyToParallelRegion.apply(x), self.weight)


class RowParallelLinear(torch.nn.Module):
    """y = sum over ranks of x_shard W_shard^T, where W_shard is this rank's block of input columns."""

    def __init__(self, master_weight):
        super().__init__()
        cols = master_weight.shape[1] // dist.get_world_size()
        start = dist.get_rank() * cols
        self.weight = torch.nn.Parameter(master_weight[:, start:start + cols].clone())

    def forward(self, x_shard):
        return _ReduceFromParallelRegion.apply(torch.nn.functional.linear(x_shard, self.weight))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the unsharded MLP")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()

    dist.init_process_group(backend="backplane" if cpu_mode() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.hidden % world != 0:
        sys.exit(f"cpu_mode_mlp: --hidden {args.hidden} does not split over {world} ranks")

    # Every rank draws the same master weights (initialised as torch.nn.Linear's) and input.
    torch.manual_seed(args.seed)
    w1, w2 = (torch.nn.Linear(args.hidden, args.hidden, bias=False).weight.detach() for _ in range(2))
    inputs = torch.rand(4, args.hidden)
    column, row = ColumnParallelLinear(w1), RowParallelLinear(w2)
    outputs = row(column(inputs))
    outputs.sum().backward()
    if rank == 0:
        print(f"Output sum is {outputs.sum().item()}")
        print(f"backend: {backplane_torch.describe(dist.group.WORLD)}")

    status = 0
    if args.check:
        full1, full2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        expected = torch.nn.functional.linear(torch.nn.functional.linear(inputs, full1), full2)
        expected.sum().backward()
        rows = args.hidden // world
        span = slice(rank * rows, (rank + 1) * rows)
        checks = {
            "output": torch.allclose(outputs, expected, rtol=1e-4, atol=1e-5),
            "column weight gradient": torch.allclose(column.weight.grad, full1.grad[span], rtol=1e-4, atol=1e-5),
            "row weight gradient": torch.allclose(row.weight.grad, full2.grad[:, span], rtol=1e-4, atol=1e-5),
        }
        difference = (outputs - expected).abs().max().item()
        verdict = "match" if all(checks.values()) else "MISMATCH in " + ", ".join(k for k, ok in checks.items() if not ok)
        print(f"rank {rank}: unsharded output sum is {expected.sum().item()} (tp {world}, max |difference| "
              f"{difference:.3g}): {verdict}", flush=True)
        status = 0 if all(checks.values()) else 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
