#!/usr/bin/python3
"""BPL_TRACE on real ranks (3, through the Python module, under bpl-run) and tools/bpl-trace.

    trace_test.py BIN_DIR    # the driver: runs the jobs below and checks what they left

1. A job whose rank 1 is late to every allreduce: every rank writes its file at finalize; bpl-trace
   merges them into one valid timeline and names rank 1 as the rank the others waited for.
2. A job whose rank 2 exits in the middle: the survivors, whose next allreduce fails, end without
   finalizing; their files exist anyway (written when the operation failed) and record the failure.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

failures = []


def expect(condition, message):
    if not condition:
        failures.append(message)


def rank_main(scenario):
    import array
    import backplane
    rt = backplane.Runtime()
    world = rt.world
    buf = array.array("f", [1.0] * 1024)
    if scenario == "late":
        for _ in range(8):
            if world.rank == 1:
                time.sleep(0.03)
            world.allreduce(buf)
        world.allreduce(buf, async_op=True).wait()
        rt.close()
        return 0
    # "exit": rank 2 leaves after the first allreduce; bpl-run then stops the others, which wait out
    # its SIGTERM to see their failure through.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    world.allreduce(buf)
    if world.rank == 2:
        os._exit(3)
    try:
        world.allreduce(buf)
    except backplane.BackplaneError as e:
        print(f"rank {world.rank}: {e.status_name} as expected", flush=True)
        os._exit(0)  # no close: only the file written at the failure is left
    print(f"rank {world.rank}: the allreduce without rank 2 succeeded", flush=True)
    os._exit(1)


def run_job(bin_dir, scenario, folder):
    env = dict(os.environ, BPL_TRACE=folder, BPL_BACKEND="gloo", BPL_TIMEOUT_MS="20000")
    return subprocess.run([os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "3", sys.executable, __file__,
                           "--rank", scenario], env=env, capture_output=True, text=True, timeout=120)


def load(folder, rank):
    with open(os.path.join(folder, f"rank-{rank}.json")) as f:
        return json.load(f)


def driver(bin_dir):
    with tempfile.TemporaryDirectory() as root:
        late = os.path.join(root, "late")
        job = run_job(bin_dir, "late", late)
        if job.returncode != 0:
            print(f"FAILED: the late-rank job failed ({job.returncode}):\n{job.stdout}\n{job.stderr}")
            return 1
        for rank in range(3):
            data = load(late, rank)
            ops = [e for e in data["traceEvents"] if e.get("ph") == "X"]
            expect(len(ops) == 9 and all(e["name"] == "allreduce" for e in ops), f"rank {rank}: 9 allreduces recorded")
            expect(all(e["args"]["status"] == "BPL_OK" and e["args"]["path"] == "shared memory" and
                       e["args"]["bytes"] == 4096 and e["args"]["dtype"] == "f32" for e in ops),
                   f"rank {rank}: each with its status, path, bytes and dtype: {ops[:1]}")
            expect([e["args"]["seq"] for e in ops] == sorted(e["args"]["seq"] for e in ops), f"rank {rank}: in order")
        png = os.path.join(root, "timeline.png")
        summary = subprocess.run([sys.executable, os.path.join(bin_dir, "bpl-trace"), late, "--png", png],
                                 capture_output=True, text=True, timeout=60)
        expect(summary.returncode == 0, f"bpl-trace failed:\n{summary.stdout}\n{summary.stderr}")
        print(summary.stdout)
        expect("slowest rank: rank 1 " in summary.stdout, "the summary names rank 1, the late one")
        with open(os.path.join(late, "timeline.json")) as f:
            merged = json.load(f)
        expect({e["pid"] for e in merged["traceEvents"] if e.get("ph") == "X"} == {0, 1, 2},
               "the merged timeline holds every rank's operations")
        if os.path.exists(png):
            with open(png, "rb") as f:
                expect(f.read(8) == b"\x89PNG\r\n\x1a\n", "the drawn timeline is a PNG")

        failed = os.path.join(root, "exit")
        job = run_job(bin_dir, "exit", failed)
        print(job.stdout)
        for rank in (0, 1):
            path = os.path.join(failed, f"rank-{rank}.json")
            expect(os.path.exists(path), f"rank {rank} left its trace although it never finalized:\n{job.stdout}{job.stderr}")
            if os.path.exists(path):
                statuses = [e["args"]["status"] for e in load(failed, rank)["traceEvents"] if e.get("ph") == "X"]
                expect(statuses[:1] == ["BPL_OK"] and statuses[-1] == "BPL_ERR_REMOTE",
                       f"rank {rank}: the first allreduce succeeded, the second failed: {statuses}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("trace_test: every rank traced; the late rank named; the failure recorded without finalize")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        sys.exit(rank_main(sys.argv[2]))
    sys.exit(driver(sys.argv[1]))
