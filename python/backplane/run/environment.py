"""What each rank runs, and the variables it gets: torchrun's, every one, and backplane's own."""

import os
import shutil
import sys

# --run-path: the script runs from runpy in a fresh interpreter, as torchrun's run_script_path runs it.
RUN_PATH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def command_of(args):
    """What each rank executes, as torchrun would for the same arguments."""
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # torchrun's override of the interpreter
    if args.run_path:
        return [python, "-u", "-c", RUN_PATH, args.program] + args.args
    if args.module:
        return [python, "-u", "-m", args.program] + args.args
    if not args.no_python and args.program.endswith(".py"):
        return [python, "-u", args.program] + args.args
    program = args.program
    if os.sep not in program and shutil.which(program) is None and os.path.isfile(program):
        program = os.path.join(os.curdir, program)  # mpirun's rule: the current folder too
    return [program] + args.args


def rank_environment(args, launch, local_rank, restart, error_file, newcomer=False):
    """The environment of local rank `local_rank` in attempt `restart`: torchrun's variables, or, for a
    newcomer in a failed rank's place (--replace), BPL_JOIN=1 and the job's addresses but no rank."""
    nproc = args.nproc_per_node
    rank = launch.node_rank * nproc + local_rank
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": launch.addr,
        "MASTER_PORT": str(launch.port),
        "GROUP_RANK": str(launch.node_rank),
        "GROUP_WORLD_SIZE": str(launch.nnodes),
        "ROLE_NAME": args.role,
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
        "TORCHELASTIC_RUN_ID": args.rdzv_id,
        # bpl-store serves the program's torch.distributed store at MASTER_PORT, as torchrun's agent does.
        "TORCHELASTIC_USE_AGENT_STORE": str(launch.hosts_torch_store),
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": args.signals_to_handle,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    })
    placement = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
    if newcomer:
        for name in placement:
            env.pop(name, None)
        env["BPL_JOIN"] = "1"
    else:
        env.update(zip(placement, map(str, (rank, launch.world, local_rank, nproc, rank, launch.world))))
    if args.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(d) for d in range(nproc)]
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank % len(devices)]
    if launch.store_port is not None:
        env["BPL_STORE_PORT"] = str(launch.store_port)
    # As torchrun: several ranks on one node must not each start one OpenMP thread per core.
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
