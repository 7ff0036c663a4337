"""Registers torch.distributed's backend "backplane", without loading it: a pip-installed backplane names
register() as a "torch.backends" entry point, which torch calls while it is imported, so that
init_process_group("backplane") works without `import backplane_torch`. The backend itself (the
package backplane_torch, and its C++ module) loads at the first group's creation, where a backend built
for another torch raises its ImportError.
"""

import os
import re


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
    """Under mpirun or srun, torch's env:// rendezvous finds none of the variables it reads: they are taken
    from the launcher's own, as torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
    with the store at 127.0.0.1 when every rank runs on this machine (else on the first node of a Slurm
    step; under mpirun MASTER_ADDR must be given: mpirun -x) and on a port of the job's own (20000-32767,
    below Linux's ephemeral ports, from the job's id). What the launch environment already has is kept."""
    env = os.environ
    if "RANK" in env:
        return
    if "OMPI_COMM_WORLD_RANK" in env:
        launch = _open_mpi_launch(env)
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:  # a task of srun's step, not the batch script
        launch = _slurm_launch(env)
    else:
        return
    for name, value in launch.items():
        if value is not None:
            env.setdefault(name, value)


def _job_port(job_id):
    return str(20000 + job_id % 12768)


def _open_mpi_launch(env):
    local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    job_id = env.get("OMPI_MCA_ess_base_jobid")
    return {"RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK"), "LOCAL_WORLD_SIZE": local_size,
            "MASTER_ADDR": "127.0.0.1" if local_size == env["OMPI_COMM_WORLD_SIZE"] else None,
            "MASTER_PORT": _job_port(int(job_id)) if job_id else None}


def _slurm_launch(env):
    # SLURM_STEP_TASKS_PER_NODE reads "2" or "2(x3),1": the first count is this node's when every node holds as
    # many tasks; a step of uneven nodes leaves LOCAL_WORLD_SIZE unset, as the C core does.
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
    nodes = env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1"))
    job_id = int(env.get("SLURM_JOB_ID", "0")) * 31 + int(env.get("SLURM_STEP_ID", "0"))
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS")),
            "LOCAL_RANK": env.get("SLURM_LOCALID"),
            "LOCAL_WORLD_SIZE": per_node.split("(")[0] if per_node and "," not in per_node else None,
            "MASTER_ADDR": "127.0.0.1" if nodes == "1" else _first_host(env.get("SLURM_STEP_NODELIST", "")),
            "MASTER_PORT": _job_port(job_id)}


def _first_host(node_list):
    """The first host of a Slurm host list: "n[03-05,9],m" -> "n03", "a,b" -> "a"; None for none."""
    stem, ranges = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", node_list).groups()
    if ranges:
        return stem + re.split(r"[,-]", ranges)[0]
    return stem or None
