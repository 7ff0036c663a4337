#!/usr/bin/env python3
"""backplane across test hosts (tests/support/hosts.py): real multi-node launches, each host a machine
of its own to backplane, talking over its own interface.

    hosts_test.py BIN_DIR SCENARIO      (exit 0 passed, 1 failed, 77 skipped with the reason printed)

Scenarios:
  gloo_two_hosts           bpl-run --nnodes 2, one rank per host: Gloo over TCP between the hosts (each rank
                           a machine of its own), the host names resolved as a cluster's DNS would; the
                           conformance suite passes
  gloo_two_hosts_two_ranks two ranks per host: shared memory within each host, TCP between (hierarchical)
  gloo_three_hosts         three hosts, one rank each
  gloo_socket_ifname       GLOO_SOCKET_IFNAME=eth0 is the transport; one no host has is an error naming it
  torchrun_variables_two_hosts  ranks started with RANK, WORLD_SIZE, MASTER_ADDR (host 0) by hand
  examples_two_hosts       tp_mlp --check, and dp_train saved on one run and resumed on the next
  mpi_two_hosts            mpirun with a host file and a launch agent into the other host; the conformance
                           suite passes on the mpi backend
  fault_host_killed        every process of one of 3 hosts SIGKILLed mid-allreduce: both survivors fail at
                           once naming its rank, nothing left running
  fault_host_never_joins   a host that never starts its rank: TIMEOUT naming the missing rank
  fault_master_unreachable MASTER_ADDR no host has: an error naming the address, within the timeout
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from hosts import SKIPPED, TestHosts, why_hosts_cannot_be_made  # noqa: E402

MASTER_PORT = "29500"  # every test host has a network stack of its own: no other job shares its ports
TIMEOUT_S = 240


def launch(hosts, bin_dir, ranks_per_host, program, env_extra=None):
    """`program` as one job over every host (bpl-run --nnodes on each, host 0 the master); returns
    [(exit status, output)] per host."""
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS="60000", **(env_extra or {}))
    procs = []
    for i in range(hosts.count):
        argv = [os.path.join(bin_dir, "bpl-run"), "--nnodes", str(hosts.count), "--node-rank", str(i),
                "--master-addr", hosts.address(0), "--master-port", MASTER_PORT,
                "--nproc-per-node", str(ranks_per_host), *program]
        procs.append(hosts.start(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n(TIMED OUT after {TIMEOUT_S} s)"
        results.append((p.returncode, out))
    return results


class Failure(Exception):
    pass


def expect(condition, what, results):
    if not condition:
        shown = "\n".join(f"--- host {i}: exit {code}\n{out[-4000:]}" for i, (code, out) in enumerate(results))
        raise Failure(f"{what}\n{shown}")


def expect_all_passed(results, what):
    expect(all(code == 0 for code, _ in results), f"{what}: every host's job exits 0", results)


def info_and_conformance(bin_dir, count, ranks_per_host, path, env_extra=None, transport=None):
    with TestHosts(count) as hosts:
        info = launch(hosts, bin_dir, ranks_per_host, [os.path.join(bin_dir, "bpl-info"), "--init"], env_extra)
        expect_all_passed(info, "bpl-info --init")
        details = info[0][1]
        expect(f"store={hosts.address(0)}:{MASTER_PORT} (server)" in details, "the store on host 0's address", info)
        expected_transport = transport or f"transport=tcp host {hosts.host(0)}"
        expect(expected_transport in details, f"'{expected_transport}'", info)
        expect(f"collectives of world: {path}" in details, f"the path '{path}'", info)
        suite = launch(hosts, bin_dir, ranks_per_host, [os.path.join(bin_dir, "bpl-conformance"), "--backend=gloo"],
                       env_extra)
        expect_all_passed(suite, "the conformance suite")
        expect(all("[  PASSED  ]" in out for _, out in suite[:1]), "rank 0's suite reports its tests passed", suite)
        print(f"passed: {count} hosts x {ranks_per_host} rank(s): {path}; conformance suite passed")


def gloo_two_hosts(bin_dir):
    info_and_conformance(bin_dir, 2, 1, "gloo over tcp (each rank on a machine of its own)")


def gloo_two_hosts_two_ranks(bin_dir):
    info_and_conformance(bin_dir, 2, 2, "shared memory within each of 2 machines, gloo over tcp between them")


def gloo_three_hosts(bin_dir):
    info_and_conformance(bin_dir, 3, 1, "gloo over tcp (each rank on a machine of its own)")


def gloo_socket_ifname(bin_dir):
    info_and_conformance(bin_dir, 2, 1, "gloo over tcp (each rank on a machine of its own)",
                         {"GLOO_SOCKET_IFNAME": "eth0"}, transport="transport=tcp iface eth0")
    with TestHosts(2) as hosts:
        bad = launch(hosts, bin_dir, 1, [os.path.join(bin_dir, "bpl-info"), "--init"], {"GLOO_SOCKET_IFNAME": "nope0"})
        expect(all(code != 0 for code, _ in bad), "an interface no host has fails every host's job", bad)
        expect(all("GLOO_SOCKET_IFNAME='nope0' names no interface of this host" in out for _, out in bad),
               "every host names the interface", bad)
    print("passed: GLOO_SOCKET_IFNAME=nope0 is an error naming it on every host")


def torchrun_variables_two_hosts(bin_dir):
    """Each rank started by hand with torchrun's variables, MASTER_ADDR being the other host for rank 1."""
    with TestHosts(2) as hosts:
        procs = []
        for i in range(2):
            env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS="60000", RANK=str(i), WORLD_SIZE="2",
                       LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=hosts.address(0), MASTER_PORT=MASTER_PORT)
            procs.append(hosts.start(i, [os.path.join(bin_dir, "bpl-info"), "--init"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            results.append((p.returncode, out))
        expect_all_passed(results, "bpl-info --init with RANK/WORLD_SIZE/MASTER_ADDR")
        expect("Runtime (rank 0 of 2, local 0 of 1, from torchrun)" in results[0][1], "rank 0 of 2 from torchrun's variables",
               results)
        expect("gloo over tcp (each rank on a machine of its own)" in results[0][1], "one rank per machine", results)
    print("passed: torchrun's variables across 2 hosts, MASTER_ADDR on the other host")


def examples_two_hosts(bin_dir):
    """tp_mlp --check and dp_train (saved, then resumed: the checkpoint folder is on a filesystem both hosts
    see, as a cluster's shared storage) across 2 hosts of 1 rank."""
    import re
    import shutil
    import tempfile
    with TestHosts(2) as hosts:
        mlp = launch(hosts, bin_dir, 1, [os.path.join(bin_dir, "tp_mlp"), "--check"])
        expect_all_passed(mlp, "tp_mlp --check")
        expect("match" in mlp[0][1] and "MISMATCH" not in mlp[0][1], "the sharded MLP matches the unsharded one", mlp)
        folder = tempfile.mkdtemp(prefix="bpl-hosts-dp-")
        try:
            train = [os.path.join(bin_dir, "dp_train"), "--checkpoint-dir", folder]
            straight = launch(hosts, bin_dir, 1, train[:1] + ["--steps", "12"])
            first = launch(hosts, bin_dir, 1, train + ["--steps", "8", "--save-every", "4"])
            resumed = launch(hosts, bin_dir, 1, train + ["--steps", "12", "--resume"])
            for results, what in ((straight, "dp_train"), (first, "dp_train, saving"), (resumed, "dp_train --resume")):
                expect_all_passed(results, what)
            steps = lambda out: re.findall(r"^step \d+ loss .*$", out, re.M)  # noqa: E731
            expect(len(steps(straight[0][1])) == 12, "12 step lines from the straight run", straight)
            expect("resumed from step 8" in resumed[0][1], "the run resumed from step 8", resumed)
            expect(steps(straight[0][1])[8:] == steps(resumed[0][1]), "the resumed run repeats steps 9-12",
                   straight + resumed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print("passed: tp_mlp --check and a resumed dp_train across 2 hosts")


def mpi_two_hosts(bin_dir):
    """mpirun in host 0 with a host file naming both hosts; its launch agent (plm_rsh_agent) starts the
    other host's daemon through hosts_agent.py, as ssh would; the TCP BTL and ORTE's out-of-band channel
    only on the hosts' interface."""
    import tempfile
    agent = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "hosts_agent.py")
    with TestHosts(2) as hosts, tempfile.NamedTemporaryFile("w", prefix="bpl-hostfile-", suffix=".txt") as hostfile:
        hosts.serve_launches()
        hostfile.write("".join(f"{hosts.host(i)} slots=1\n" for i in range(2)))
        hostfile.flush()
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", BPL_BACKEND="mpi",
                   BPL_TIMEOUT_MS="60000")
        mpirun = ["mpirun", "--hostfile", hostfile.name, "--mca", "plm_rsh_agent", os.path.abspath(agent),
                  "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                  "-np", "2"]
        info = hosts.run(0, mpirun + [os.path.join(bin_dir, "bpl-info"), "--init"], env=env, timeout=TIMEOUT_S)
        results = [(info.returncode, info.stdout + info.stderr)]
        expect_all_passed(results, "mpirun bpl-info --init")
        expect("Runtime (rank 0 of 2, local 0 of 1, from openmpi)" in info.stdout, "2 ranks, one per host", results)
        suite = hosts.run(0, mpirun + [os.path.join(bin_dir, "bpl-conformance"), "--backend=mpi"], env=env,
                          timeout=TIMEOUT_S)
        results = [(suite.returncode, suite.stdout + suite.stderr)]
        expect_all_passed(results, "mpirun bpl-conformance --backend=mpi")
        expect("PASSED" in suite.stdout, "rank 0's suite reports its tests passed", results)
    print("passed: mpirun across 2 hosts (host file, launch agent, TCP BTL on eth0): conformance suite passed")


ALLREDUCE_LOOP = """
import array, os, sys, time
sys.path.insert(0, os.environ["BPL_PYTHON_DIR"])
import backplane
start = time.monotonic()
with backplane.Runtime() as rt:
    world, data = rt.world, array.array("f", [1.0] * 1024)
    print(f"rank {world.rank}: running", flush=True)
    try:
        while time.monotonic() - start < 120:
            world.allreduce(data)
    except backplane.BackplaneError as e:
        print(f"rank {world.rank}: failed after {time.monotonic() - start:.1f} s: {e}", flush=True)
        sys.exit(3)
"""


def fault_host_killed(bin_dir):
    """Three hosts in a loop of allreduces; every process of host 2 SIGKILLed (the kernel closes its
    sockets): both survivors fail at once, naming rank 2 as on another machine, and leave nothing behind."""
    import time
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS="30000", BPL_PYTHON_DIR=os.path.abspath(source),
               BPL_LIBRARY=os.path.join(os.path.dirname(bin_dir), "lib", "libbackplane.so"))
    with TestHosts(3) as hosts:
        procs = []
        for i in range(3):
            argv = [os.path.join(bin_dir, "bpl-run"), "--nnodes", "3", "--node-rank", str(i), "--master-addr",
                    hosts.address(0), "--master-port", MASTER_PORT, "--nproc-per-node", "1", sys.executable, "-c",
                    ALLREDUCE_LOOP]
            procs.append(hosts.start(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        started = ""
        while "running" not in started:  # rank 0 is in its loop: the job has met
            line = procs[0].stdout.readline()
            if not line:
                raise Failure(f"the job did not start: {started}")
            started += line
        time.sleep(1)
        killed_at = time.monotonic()
        hosts.kill_host(2)
        results = []
        for p in procs[:2]:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                out += "(TIMED OUT)"
            results.append((p.returncode, started + out if p is procs[0] else out))
        elapsed = time.monotonic() - killed_at
        expect(all(code != 0 for code, _ in results), "every survivor fails", results)
        expect(all("BPL_ERR_REMOTE" in out and "rank 2, on another machine" in out for _, out in results),
               "every survivor names rank 2, on another machine", results)
        expect(elapsed < 10, f"the survivors fail at once, well within the 30 s timeout (took {elapsed:.1f} s)", results)
        for i in range(2):
            left = hosts.run(i, ["ps", "-e", "-o", "comm="]).stdout.split()
            expect(set(left) <= {"sleep", "ps"}, f"nothing left running in host {i}: {left}", results)
    print(f"passed: host 2 killed: both survivors failed in {elapsed:.1f} s naming rank 2; nothing left behind")


def alone(hosts, i, bin_dir, master, node_rank, timeout_ms):
    """bpl-info --init as node `node_rank` of 2 in host i, meeting at `master`; (status, output, seconds)."""
    import time
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS=str(timeout_ms))
    argv = [os.path.join(bin_dir, "bpl-run"), "--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", master,
            "--master-port", MASTER_PORT, "--nproc-per-node", "1", os.path.join(bin_dir, "bpl-info"), "--init"]
    start = time.monotonic()
    result = hosts.run(i, argv, env=env, timeout=TIMEOUT_S)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - start


def fault_host_never_joins(bin_dir):
    """Host 1 never starts its rank: host 0's fails within the timeout, naming the missing rank."""
    with TestHosts(2) as hosts:
        code, out, seconds = alone(hosts, 0, bin_dir, hosts.address(0), 0, 5000)
        results = [(code, out)]
        expect(code != 0 and "BPL_ERR_TIMEOUT" in out and "1/2 joined, missing ranks [1]" in out,
               "a TIMEOUT naming the missing rank", results)
        expect(seconds < 15, f"within the 5 s timeout and its slack (took {seconds:.1f} s)", results)
    print(f"passed: a host that never joins: TIMEOUT naming rank 1 after {seconds:.1f} s")


def fault_master_unreachable(bin_dir):
    """MASTER_ADDR an address of the test subnet that no host has: an error naming it, within the timeout."""
    with TestHosts(2) as hosts:
        nobody = f"{hosts.address(0).rsplit('.', 1)[0]}.99"
        code, out, seconds = alone(hosts, 1, bin_dir, nobody, 1, 5000)
        results = [(code, out)]
        expect(code != 0 and f"rendezvous at {nobody}:{MASTER_PORT} as rank 1" in out, "an error naming the address",
               results)
        expect(seconds < 15, f"within the 5 s timeout and its slack (took {seconds:.1f} s)", results)
    print(f"passed: MASTER_ADDR unreachable: an error naming {nobody} after {seconds:.1f} s")


SCENARIOS = {f.__name__: f for f in (gloo_two_hosts, gloo_two_hosts_two_ranks, gloo_three_hosts, gloo_socket_ifname,
                                     torchrun_variables_two_hosts, examples_two_hosts, mpi_two_hosts,
                                     fault_host_killed, fault_host_never_joins, fault_master_unreachable)}


def main(argv):
    if len(argv) != 2 or argv[1] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    reason = why_hosts_cannot_be_made()
    if reason:
        print(f"skipped: {reason}")
        return SKIPPED
    try:
        SCENARIOS[argv[1]](os.path.abspath(argv[0]))
    except Failure as failure:
        print(f"FAILED: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
