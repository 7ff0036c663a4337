"""Run by a launcher in a fresh interpreter of an environment where backplane was pip-installed: the
backend "backplane" is there without `import backplane_torch` (torch's backend entry points), and works."""
import sys

import torch
import torch.distributed as dist

loaded_before = "backplane_torch" in sys.modules
dist.init_process_group("backplane")
rank, size = dist.get_rank(), dist.get_world_size()
values = torch.full((4,), float(rank + 1))
dist.all_reduce(values)
expected = size * (size + 1) / 2
if loaded_before or values.tolist() != [expected] * 4:
    sys.exit(f"rank {rank}: FAILED: backplane_torch loaded before init_process_group: {loaded_before}; "
             f"allreduce {values.tolist()}, expected {expected}")
dist.destroy_process_group()
print(f"rank {rank}: backend backplane without an import: allreduce {expected:g} ok", flush=True)
