"""A rank killed (or stopped) in the middle of training: every survivor gets a RuntimeError naming it,
within the timeout given to init_process_group, and never hangs.

    python3 test_killed_rank.py WORLD kill|stop [store-host] [shrink]   # the driver: starts WORLD ranks of itself

By default rank 1 is the victim and the ranks meet through torch's FileStore. With `store-host`, the
victim is rank 0 and it hosts the ranks' store, a TCPStore (as under env:// rendezvous): a stopped store
host answers no store call, and the survivors must still fail in time, naming it. With `shrink`, the
survivors then go on without the victim (torch.distributed.shrink_group) and all_reduce among themselves.
"""
import datetime
import os
import signal
import tempfile
import subprocess
import sys
import time

TIMEOUT_S = 5.0


def victim_of(store_host):
    return 0 if store_host else 1


def tcp_store_hosted_by_rank_0(rank, world, meeting_file):
    """A TCPStore in rank 0 on a port its own bind chose, made known to the others through a file."""
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
        with open(meeting_file + ".tmp", "w") as f:
            f.write(str(store.port))
        os.rename(meeting_file + ".tmp", meeting_file)
        return store
    deadline = time.monotonic() + 30
    while not os.path.exists(meeting_file):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 did not publish its store's port in {meeting_file} within 30 s")
        time.sleep(0.01)
    with open(meeting_file) as f:
        return dist.TCPStore("127.0.0.1", int(f.read()), world, False, timeout)


def go_on_without(victim, world, rank):
    """torch 2's shrink_group (bpl_comm_shrink underneath): the survivors make a default group of
    themselves, ranks in their old order, and all_reduce in it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import SHRINK_ABORT
    try:
        dist.shrink_group([victim], shrink_flags=SHRINK_ABORT)
    except RuntimeError as e:
        print(f"rank {rank}: shrink_group raised: {e}", flush=True)
        return False
    expected_rank = rank - (1 if rank > victim else 0)
    t = torch.full((8,), float(rank))
    dist.all_reduce(t)
    total = float(sum(r for r in range(world) if r != victim))
    ok = dist.get_world_size() == world - 1 and dist.get_rank() == expected_rank and bool((t == total).all())
    print(f"rank {rank}: after shrink_group, rank {dist.get_rank()} of {dist.get_world_size()}, all_reduce "
          f"{t[0].item()} (expected {total}): {'went on' if ok else 'FAILED'}", flush=True)
    return ok


def rank_main(fault, store_host, shrink):
    import torch
    import torch.distributed as dist
    import backplane_torch  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if store_host:
        store = tcp_store_hosted_by_rank_0(rank, world, os.environ["TEST_INIT_FILE"])
        dist.init_process_group("backplane", timeout=timeout, store=store, rank=rank, world_size=world)
    else:
        # torch's FileStore as the meeting place: no port to choose, none another job can take.
        dist.init_process_group("backplane", timeout=timeout, init_method=f"file://{os.environ['TEST_INIT_FILE']}",
                                rank=rank, world_size=world)
    victim = victim_of(store_host)
    t = torch.ones(1024)
    for _ in range(3):
        dist.all_reduce(t)
    start = time.monotonic()
    try:
        # The barrier is in the try: a survivor that has not left it yet when the victim (which has)
        # dies may learn of the death there, from a peer that failed in the next allreduce.
        dist.barrier()
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        for _ in range(100000):
            dist.all_reduce(t)
    except RuntimeError as e:
        waited = time.monotonic() - start
        print(f"rank {rank}: RuntimeError after {waited:.2f} s: {e}", flush=True)
        named = f"rank {victim}" in str(e)
        in_time = waited < TIMEOUT_S + 3.0
        # The backend keeps the group's first failure for torch (get_error): a killed rank is the
        # communicator's REMOTE error, a stopped one its TIMEOUT (or REMOTE, where a peer that timed
        # out first closed its connections).
        error = dist.group.WORLD._get_backend(torch.device("cpu")).get_error()
        kinds = torch._C._distributed_c10d.ErrorType
        expected = (kinds.REMOTE_ERROR,) if fault == "kill" else (kinds.TIMEOUT, kinds.REMOTE_ERROR)
        kept = error in expected
        print(f"rank {rank}: get_error() is {error}", flush=True)
        went_on = not shrink or go_on_without(victim, world, rank)
        ok = named and in_time and kept and went_on
        print(f"rank {rank}: survivor {'OK' if ok else 'FAILED'}", flush=True)
        os._exit(0 if ok else 1)
    print(f"rank {rank}: no error although rank {victim} was killed", flush=True)
    os._exit(1)


def driver(world, fault, store_host, shrink):
    victim = victim_of(store_host)
    folder = tempfile.TemporaryDirectory()
    init_file = os.path.join(folder.name, "init")
    ranks = []
    for r in range(world):
        # MASTER_ADDR without a port only tells backplane's gloo that the ranks share this host.
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", TEST_INIT_FILE=init_file)
        env.pop("MASTER_PORT", None)
        options = (["store-host"] if store_host else []) + (["shrink"] if shrink else [])
        ranks.append(subprocess.Popen([sys.executable, "-W", "ignore", __file__, "--rank", fault] + options, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = False
    for r, process in sorted(enumerate(ranks), key=lambda rp: rp[0] == victim):  # the victim last
        if r == victim and fault == "stop":
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
        if r == victim:
            failed |= process.returncode != -signal.SIGKILL
        else:
            failed |= process.returncode != 0 or "survivor OK" not in output
    # killed or stopped
    print("FAILED" if failed else "every survivor named the killed rank in time" + (" and went on" if shrink else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    store_host, shrink = "store-host" in sys.argv[3:], "shrink" in sys.argv[3:]
    if sys.argv[1] == "--rank":
        rank_main(sys.argv[2], store_host, shrink)
    else:
        sys.exit(driver(int(sys.argv[1]), sys.argv[2], store_host, shrink))
