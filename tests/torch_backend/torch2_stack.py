"""The PyTorch 2 stack on a CPU backend, one rank of it: DDP with comm hooks, FSDP2 (fully_shard)
training a small transformer, a 2-D DeviceMesh (DP x TP) with DTensor's tensor parallel, a
torch.distributed.checkpoint saved at one layout and loaded at another, and functional collectives in
eager mode and under torch.compile. Run by torch2_stack_test.py under a real torchrun, 4 ranks, once
per backend; rank 0 writes what each part computed (losses, checksums) to OUT as JSON for the two runs
to be compared.

    torchrun --nproc_per_node 4 torch2_stack.py BACKEND OUT CHECKPOINT_DIR
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS = 4


class Mlp(nn.Module):
    def __init__(self, width=16, hidden=32):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def batch(step, rank, shape):
    """This rank's inputs for a step: the same on every backend."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(*shape, generator=generator)


def train(model, data_rank, shape, loss_of):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        loss = loss_of(model(batch(step, data_rank, shape)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        losses.append(reported.item() / dist.get_world_size())
    return losses


def ddp_with_hooks(rank):
    """The same training under each of DDP's built-in comm hooks (and none)."""
    results = {}
    for name, hook in [("none", None), ("allreduce", default_hooks.allreduce_hook),
                       ("fp16_compress", default_hooks.fp16_compress_hook),
                       ("bf16_compress", default_hooks.bf16_compress_hook)]:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(Mlp(), bucket_cap_mb=0.001)  # several buckets
        if hook is not None:
            model.register_comm_hook(None, hook)
        results[name] = train(model, rank, (8, 16), lambda y: y.square().mean())
    return results


def fsdp2_transformer(rank):
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True), 2)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return train(model, rank, (2, 8, 32), lambda y: y.square().mean())


def tensor_parallel_mlp(mesh):
    """Mlp with its layers split over mesh["tp"] (up by columns, down by rows), then sharded over
    mesh["dp"] by FSDP2; each DP group trains on its own data."""
    torch.manual_seed(0)
    model = parallelize_module(Mlp(), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    losses = train(model, mesh["dp"].get_local_rank(), (8, 16), lambda y: y.square().mean())
    return model, losses


def full_state(model):
    state = get_model_state_dict(model)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in state.items()}


def checkpoint_across_layouts(trained, directory):
    """Saves the 2-D (DP x TP) model, loads it into the same Mlp sharded over all 4 ranks by FSDP2
    alone: the full tensors must be the saved ones."""
    saved = full_state(trained)
    dcp.save(get_model_state_dict(trained), checkpoint_id=directory)
    torch.manual_seed(1)  # other initial values, overwritten by the load
    other = Mlp()
    fully_shard(other)
    state = get_model_state_dict(other)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(other, state)
    loaded = full_state(other)
    differences = {k: (loaded[k] - saved[k]).abs().max().item() for k in saved}
    return {"max_difference": max(differences.values()), "sum": sum(v.sum().item() for v in loaded.values())}


def functional_collectives(rank, world):
    group = dist.group.WORLD

    def collectives(x):
        reduced = funcol.all_reduce(x, "sum", group)
        gathered = funcol.all_gather_single(x, 0, group)
        scattered = funcol.reduce_scatter_single(gathered, "sum", 0, group)
        exchanged = funcol.all_to_all_single(gathered, None, None, group)
        return reduced, gathered, scattered, exchanged

    x = torch.arange(4, dtype=torch.float32) + 10 * rank
    expected = (torch.arange(4, dtype=torch.float32) * world + 10 * sum(range(world)),
                torch.cat([torch.arange(4, dtype=torch.float32) + 10 * r for r in range(world)]),
                (torch.arange(4, dtype=torch.float32) + 10 * rank) * world,
                torch.cat([torch.arange(4, dtype=torch.float32) + 10 * rank] * world))
    eager = [funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t for t in collectives(x)]
    compiled = torch.compile(collectives, fullgraph=True)(x)
    wrong = [name for name, got, want in zip(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"] * 2,
                                             list(eager) + list(compiled), list(expected) * 2)
             if not torch.equal(got, want)]
    if wrong:
        raise AssertionError(f"rank {rank}: functional collectives gave wrong results: {wrong}")
    return {"eager": [t.sum().item() for t in eager], "compiled": [t.sum().item() for t in compiled]}


def main():
    backend, out, directory = sys.argv[1:4]
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "the 2-D mesh is 2 x 2"
    results = {"backend": dist.get_backend()}
    results["ddp"] = ddp_with_hooks(rank)
    results["fsdp2"] = fsdp2_transformer(rank)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    trained, results["tp_dp"] = tensor_parallel_mlp(mesh)
    results["checkpoint"] = checkpoint_across_layouts(trained, directory)
    results["functional"] = functional_collectives(rank, world)
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "backplane" in sys.argv[1]:
        import backplane_torch  # noqa: F401  (registers the backend)
    main()
