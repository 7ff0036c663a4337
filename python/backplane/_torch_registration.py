"""Registers torch.distributed's backend "backplane", without loading it: a pip-installed backplane names
register() as a "torch.backends" entry point, which torch calls while it is imported, so that
init_process_group("backplane") works without `import backplane_torch`. The backend itself (the
package backplane_torch, and its C++ module) loads at the first group's creation, where a backend built
for another torch raises its ImportError.
"""

import os


def register():
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.Backend, "BACKPLANE"):
        return
    set_launch_variables()
    dist.Backend.register_backend("backplane", _create_backend, devices=["cpu"])


def _create_backend(store, rank, size, timeout):
    import backplane_torch

    return backplane_torch.create_backend(store, rank, size, timeout)


def set_launch_variables():
    """Under mpirun, torch's env:// rendezvous finds none of the variables it reads: they are taken from
    Open MPI's, as torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), with the
    store at 127.0.0.1 when every rank runs on this machine (else MASTER_ADDR must be given: mpirun -x)
    and on a port of the job's own (20000-32767, below Linux's ephemeral ports, from Open MPI's job id).
    What the launch environment already has is kept."""
    env = os.environ
    if "OMPI_COMM_WORLD_RANK" not in env or "RANK" in env:
        return
    env.setdefault("RANK", env["OMPI_COMM_WORLD_RANK"])
    env.setdefault("WORLD_SIZE", env["OMPI_COMM_WORLD_SIZE"])
    if "OMPI_COMM_WORLD_LOCAL_RANK" in env:
        env.setdefault("LOCAL_RANK", env["OMPI_COMM_WORLD_LOCAL_RANK"])
    if "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
        env.setdefault("LOCAL_WORLD_SIZE", env["OMPI_COMM_WORLD_LOCAL_SIZE"])
        if env["OMPI_COMM_WORLD_LOCAL_SIZE"] == env["OMPI_COMM_WORLD_SIZE"]:
            env.setdefault("MASTER_ADDR", "127.0.0.1")
    if "OMPI_MCA_ess_base_jobid" in env:
        env.setdefault("MASTER_PORT", str(20000 + int(env["OMPI_MCA_ess_base_jobid"]) % 12768))
