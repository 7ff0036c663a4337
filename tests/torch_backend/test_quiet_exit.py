"""A torch program on backplane ends quietly under bpl-run, whichever rank ends first.

    python3 test_quiet_exit.py BPL_RUN WORLD exit|destroy   # the driver: WORLD ranks of itself under bpl-run

Under bpl-run (as under env:// rendezvous with any launcher that does not host the store itself), rank
0 serves the ranks' TCPStore. Here rank 0 ends right after its last collective while the others go on
for a second; then they end too. With `exit` no rank destroys its process group (a program that never
calls destroy_process_group); with `destroy` every rank does, rank 0 first. Nothing may be printed: a
peer's normal end is no failure, and the store, gone with rank 0, must not be asked about it (torch's
TCPStore client prints a warning with a C++ backtrace for every call it cannot make).
"""
import os
import subprocess
import sys
import time


def rank_main():
    import torch
    import torch.distributed as dist
    import backplane_torch  # noqa: F401  (registers the backend)
    dist.init_process_group("backplane")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1024)
    dist.all_reduce(t)
    if float(t[0]) != world:
        raise SystemExit(f"rank {rank}: all_reduce gave {float(t[0])}, expected {world}")
    if rank != 0:
        time.sleep(1.0)  # rank 0, host of the store, has ended by now
    if os.environ["TEST_END"] == "destroy":
        dist.destroy_process_group()


def main():
    if os.environ.get("RANK") is not None:
        rank_main()
        return 0
    bpl_run, world, end = sys.argv[1], sys.argv[2], sys.argv[3]
    env = dict(os.environ, BPL_BACKEND="gloo", PYTHONWARNINGS="ignore", TEST_END=end)
    job = subprocess.run([bpl_run, "--nproc-per-node", world, sys.executable, os.path.abspath(__file__)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(job.stdout, end="")
    if job.returncode != 0:
        print(f"FAILED: the job exited with {job.returncode}")
        return 1
    if job.stdout.strip():
        print(f"FAILED: the job printed {len(job.stdout.splitlines())} line(s) where a quiet end prints none")
        return 1
    print(f"passed: {world} ranks ended quietly ({end}), rank 0 (the store's host) first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
