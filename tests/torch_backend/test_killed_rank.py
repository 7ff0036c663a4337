"""A rank killed (or stopped) in the middle of training: every survivor gets a RuntimeError naming it,
within the timeout given to init_process_group, and never hangs.

    python3 test_killed_rank.py WORLD kill|stop    # the driver: starts WORLD ranks of itself, checks them
"""
import datetime
import os
import signal
import tempfile
import subprocess
import sys
import time

TIMEOUT_S = 5.0
VICTIM = 1


def rank_main(fault):
    import torch
    import torch.distributed as dist
    import backplane_torch  # noqa: F401

    # torch's FileStore as the meeting place: no port to choose, none another job can take.
    dist.init_process_group("backplane", timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            init_method=f"file://{os.environ['TEST_INIT_FILE']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    t = torch.ones(1024)
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()
    if rank == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    start = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(t)
    except RuntimeError as e:
        waited = time.monotonic() - start
        print(f"rank {rank}: RuntimeError after {waited:.2f} s: {e}", flush=True)
        named = f"rank {VICTIM}" in str(e)
        in_time = waited < TIMEOUT_S + 3.0
        print(f"rank {rank}: survivor {'OK' if named and in_time else 'FAILED'}", flush=True)
        os._exit(0 if named and in_time else 1)
    print(f"rank {rank}: no error although rank {VICTIM} was killed", flush=True)
    os._exit(1)


def driver(world, fault):
    folder = tempfile.TemporaryDirectory()
    init_file = os.path.join(folder.name, "init")
    ranks = []
    for r in range(world):
        # MASTER_ADDR without a port only tells backplane's gloo that the ranks share this host.
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", TEST_INIT_FILE=init_file)
        env.pop("MASTER_PORT", None)
        ranks.append(subprocess.Popen([sys.executable, "-W", "ignore", __file__, "--rank", fault], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = False
    for r, process in sorted(enumerate(ranks), key=lambda rp: rp[0] == VICTIM):  # the victim last
        if r == VICTIM and fault == "stop":
            process.kill()  # the survivors have ended: nothing waits for it any more
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            print(f"rank {r} hung:\n{output}")
            failed = True
            continue
        print(output, end="")
        if r == VICTIM:
            failed |= process.returncode != -signal.SIGKILL
        else:
            failed |= process.returncode != 0 or "survivor OK" not in output
    print("FAILED" if failed else "every survivor named the killed rank in time")  # killed or stopped
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        sys.exit(driver(int(sys.argv[1]), sys.argv[2]))
