"""bpl-run's agents meeting across nodes (--rdzv-backend c10d), here two agents of one machine at a
loopback endpoint, each a "node": places taken in the order they join, one job of both; --nnodes MIN:MAX
going on with the minimum after the last call, and forming the job anew when a node comes later; a
failure stopping and restarting every node's ranks (--max-restarts), its status on every node once the
restarts are spent; a node lost whole (its agent and ranks killed) ending the others, named; and two
test hosts, machines of their own, forming one job.

    c10d_rendezvous_test.py <bin dir> <late_rank program>    (and across two test hosts, where they can be made)
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, os.pardir, os.pardir, "python"), os.path.join(HERE, os.pardir, "support")]
from backplane.run.ports import free_port  # noqa: E402
from hosts import TestHosts, why_hosts_cannot_be_made  # noqa: E402

# Each rank: an allreduce of rank + 1 over the job, then what it saw; FAIL=<rank>:<restart> fails there,
# LINGER keeps a job of one node running (to be formed anew), HOLD keeps every rank running.
RANK = """import array, os, sys, time
import backplane
env = os.environ
with backplane.Runtime() as rt:
    total = array.array("i", [int(env["RANK"]) + 1])
    rt.world.allreduce(total)
    print(f"rank {env['RANK']} of {env['WORLD_SIZE']} node {env['GROUP_RANK']} of {env['GROUP_WORLD_SIZE']} "
          f"sum {total[0]} restart {env['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if env.get("FAIL") == f"{env['RANK']}:{env['TORCHELASTIC_RESTART_COUNT']}":
    sys.exit(3)
if env.get("LINGER") and env["WORLD_SIZE"] == "1" or env.get("HOLD"):
    time.sleep(60)
"""

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def agents(bin_dir, script, flags, count=2, env=None, between=0.0, session=False):
    """`count` bpl-run agents at one endpoint, started `between` seconds apart."""
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    command = [os.path.join(bin_dir, "bpl-run"), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--nproc-per-node", "1"] + flags + [sys.executable, script]
    started = []
    for index in range(count):
        if index and between:
            time.sleep(between)
        started.append(subprocess.Popen(command, env=dict(os.environ, NXD_CPU_MODE="1", **(env or {})),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=session))
    return started


def finish(processes, timeout=90):
    """Each agent's (exit code, output). One still running after `timeout` is stopped (SIGTERM: it
    stops its ranks; SIGKILL 10 s later) and its code says so, so that the failure shows what it said."""
    ended = []
    for p in processes:
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            code = f"still running after {timeout} s"
        ended.append((code, p.stdout.read()))
    return ended


def lines_of(output, pattern):
    return sorted(re.findall(pattern, output))


def across_test_hosts(bin_dir, late_rank):
    """Two machines of their own (tests/support/hosts.py), the endpoint on the first: each agent finds
    whether it serves the endpoint, and the address the other reaches it by, from its own interfaces."""
    reason = why_hosts_cannot_be_made()
    if reason:
        print(f"skipped across test hosts: {reason}")
        return
    with TestHosts(2) as hosts:
        command = [os.path.join(bin_dir, "bpl-run"), "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"{hosts.address(0)}:29400", "--nproc-per-node", "1", late_rank]
        started = [hosts.start(i, command, env=dict(os.environ, NXD_CPU_MODE="1"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for i in range(2)]
        ended = [(p.wait(timeout=120), p.stdout.read()) for p in started]
    output = "".join(out for _, out in ended)
    expect([code for code, _ in ended] == [0, 0] and lines_of(output, r"done (\d) 3") == ["0", "1"]
           and re.search(rf"MASTER_ADDR={re.escape(hosts.address(0))}|MASTER_ADDR={re.escape(hosts.address(1))}",
                         output),
           f"two test hosts form one job through the endpoint on the first: {ended}")


def main():
    bin_dir = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "rank.py")
        with open(script, "w") as f:
            f.write(RANK)

        both = finish(agents(bin_dir, script, ["--nnodes", "2"], between=0.5))
        seen = lines_of("".join(out for _, out in both), r"rank (\d) of 2 node (\d) of 2 sum 3 restart 0")
        expect([code for code, _ in both] == [0, 0] and seen == [("0", "0"), ("1", "1")],
               f"two nodes form one job of 2 ranks, placed in the order they joined: {both}")

        alone = finish(agents(bin_dir, script, ["--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=1"], count=1))
        expect(alone[0][0] == 0 and "rank 0 of 1 node 0 of 1 sum 1" in alone[0][1],
               f"--nnodes 1:2 goes on with one node after the last call: {alone}")

        restarted = finish(agents(bin_dir, script, ["--nnodes", "2", "--max-restarts", "1"], env={"FAIL": "1:0"}))
        output = "".join(out for _, out in restarted)
        expect([code for code, _ in restarted] == [0, 0]
               and lines_of(output, r"rank (\d) of 2 node \d of 2 sum 3 restart 1") == ["0", "1"]
               and output.count("restarting the ranks (restart 1 of 1)") == 2,
               f"a rank failing on one node restarts every node's ranks: {restarted}")

        spent = finish(agents(bin_dir, script, ["--nnodes", "2"], env={"FAIL": "1:0"}))
        expect([code for code, _ in spent] == [3, 3]
               and any(re.search(r"node \d: rank 1 \(pid \d+\) exited with code 3", out) for _, out in spent),
               f"with the restarts spent, every node ends with the failed rank's status, naming it: {spent}")

        grown = agents(bin_dir, script, ["--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=1"], env={"LINGER": "1"},
                       between=4)
        grown = finish(grown)
        output = "".join(out for _, out in grown)
        expect([code for code, _ in grown] == [0, 0] and "rank 0 of 1 node 0 of 1 sum 1" in output
               and lines_of(output, r"rank (\d) of 2 node \d of 2 sum 3") == ["0", "1"]
               and "a node waits to join the job" in output,
               f"a node coming later forms the job anew with both (--nnodes 1:2): {grown}")

        # A node lost whole, its agent and ranks killed: the second agent's, then the first's, which serves
        # the rendezvous's store (it started first, and took the endpoint).
        for lost, said in ((1, r"the bpl-run agent of node \d \(.*\) ended"),
                           (0, r"the rendezvous store at 127\.0\.0\.1:\d+: .* its host, the rendezvous host, has "
                               r"ended or closed it")):
            held = agents(bin_dir, script, ["--nnodes", "2"], env={"HOLD": "1"}, between=1, session=True)
            time.sleep(8)
            os.killpg(held[lost].pid, signal.SIGKILL)
            survivor = finish(held[1 - lost:2 - lost])
            held[lost].wait()
            expect(survivor[0][0] != 0 and re.search(said, survivor[0][1]) and "Traceback" not in survivor[0][1],
                   f"a node lost whole (agent {lost}) ends the other's ranks, saying why: {survivor}")
    across_test_hosts(bin_dir, os.path.abspath(sys.argv[2]))
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: bpl-run agents meet across nodes (c10d)")


if __name__ == "__main__":
    main()
