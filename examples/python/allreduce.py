"""The smallest torch.distributed program on backplane: each rank contributes rank + 1 to an all_reduce,
and says what it got and which of backplane's plugins carried it. Any launcher runs it unchanged:

    PYTHONPATH=build/python NXD_CPU_MODE=1 .venv/bin/torchrun --nproc_per_node 2 examples/python/allreduce.py

The exit status says whether every element is the sum the ranks expect.
"""
import sys

import torch
import torch.distributed as dist

import backplane_torch  # registers the backend "backplane"


def main():
    dist.init_process_group("backplane")  # env://: the launcher's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((4,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    right = bool((tensor == expected).all())
    plugin = backplane_torch.describe(dist.group.WORLD).split(" ")[0]
    print(f"rank {rank} of {world}: all_reduce gives {tensor[0].item():g}, expected {expected:g}, over {plugin}: "
          f"{'ok' if right else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
