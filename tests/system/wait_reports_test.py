"""A waiting job says what it waits for, at info level (BPL_LOG_LEVEL=info), and nothing at the default
level: a rendezvous missing a rank names it every few seconds, a rank whose store never comes says so,
and a collective stalled past a quarter of its timeout names the ranks it waits for (over shared memory and
over Gloo's TCP pairs), then completes.

    wait_reports_test.py <bin dir> <late_rank program>
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
from backplane.run.ports import free_port  # noqa: E402

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def alone(bin_dir, rank, timeout_ms, level):
    """bpl-info --init as `rank` of 2 with no other rank: it waits, then fails."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port("127.0.0.1")), BPL_TIMEOUT_MS=str(timeout_ms), BPL_LOG_LEVEL=level,
               NXD_CPU_MODE="1")
    for name in ("BPL_STORE_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    return subprocess.run([os.path.join(bin_dir, "bpl-info"), "--init"], env=env, capture_output=True, text=True,
                          timeout=60)


def main():
    bin_dir, late_rank = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    waiting = alone(bin_dir, 0, 11000, "info")
    reports = re.findall(r"INFO: rendezvous: 1/2 joined, missing ranks \[1\] after (\d+) s of 11000 ms", waiting.stderr)
    expect(waiting.returncode != 0 and reports == ["5", "10"],
           f"a rendezvous missing rank 1 names it at 5 s and 10 s: {reports} {waiting.stderr[-1500:]!r}")
    quiet = alone(bin_dir, 0, 6000, "warn")
    expect(quiet.returncode != 0 and "INFO" not in quiet.stderr and "missing ranks [1]" in quiet.stderr,
           f"at the default level only the failure speaks: {quiet.stderr[-1500:]!r}")
    no_store = alone(bin_dir, 1, 6000, "info")
    expect(no_store.returncode != 0 and re.search(r"INFO: waiting for the store at 127\.0\.0\.1:\d+ \(rank 0's\): "
                                                  r"nothing took a connection in 5 s of 6000 ms", no_store.stderr),
           f"a rank whose store never comes says what it waits for: {no_store.stderr[-1500:]!r}")

    stalled = subprocess.run([os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "2", late_rank],
                             env=dict(os.environ, BPL_TIMEOUT_MS="8000", BPL_LOG_LEVEL="info", NXD_CPU_MODE="1",
                                      BPL_TEST_LATE_S="3"), capture_output=True, text=True, timeout=60)
    expect(stalled.returncode == 0 and re.search(r"\[rank0\]:\[backplane:gloo\] INFO: shared memory: still waiting "
                                                 r"after 2 s of the 8000 ms timeout: rank 1 ", stalled.stderr)
           and "done 0 3" in stalled.stdout and "done 1 3" in stalled.stdout,
           f"a collective stalled past a quarter of its timeout names the rank it waits for: {stalled.returncode} "
           f"{stalled.stdout!r} {stalled.stderr[-1500:]!r}")

    # Over Gloo's TCP pairs, three ranks: the two that wait name the late one and each other.
    over_tcp = subprocess.run([os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "3", late_rank],
                              env=dict(os.environ, BPL_TIMEOUT_MS="8000", BPL_LOG_LEVEL="info", NXD_CPU_MODE="1",
                                       BPL_GLOO_SHM="0", BPL_TEST_LATE_S="5", BPL_TEST_LATE_RANK="2"),
                              capture_output=True, text=True, timeout=60)
    for rank, other in ((0, 1), (1, 0)):
        said = re.findall(rf"\[rank{rank}\]:\[backplane:gloo\] INFO: TCP: still waiting after (\d+) s of the 8000 ms "
                          rf"timeout in allreduce #\d+ \(i32, count 1, sum\): ranks \[2\] have not arrived; "
                          rf"ranks \[{other}\] wait in it too$", over_tcp.stderr, re.M)
        expect(over_tcp.returncode == 0 and said == ["2", "4"] and f"done {rank} 6" in over_tcp.stdout,
               f"rank {rank}, stalled over TCP, names rank 2 as not arrived at 2 s and 4 s: {said} "
               f"{over_tcp.returncode} {over_tcp.stdout!r} {over_tcp.stderr[-2000:]!r}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: waits say what they wait for")


if __name__ == "__main__":
    main()
