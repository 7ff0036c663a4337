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
  bench_two_hosts          bpl-bench-compare --hostfile across 2 hosts (1 and 2 ranks each), gloo and mpi
  fault_host_killed        every process of one of 3 hosts SIGKILLed mid-allreduce: both survivors fail at
                           once naming its rank, nothing left running
  fault_link_down          one of 3 hosts' link taken down mid-allreduce (a partition): every rank fails within the
                           timeout naming the rank and address it cannot reach, nothing left running
  fault_link_down_master   the same with the link of host 0 (rank 0's, the store's) taken down
  fault_link_down_two_ranks  the same with 2 hosts of 2 ranks (the hierarchical path)
  fault_host_stopped       one of 3 hosts' processes stopped, its network up: TIMEOUT that calls no one unreachable
  elastic_link_down        examples/elastic_sgd over 3 hosts under bpl-run --keep-going, host 2's link taken down
                           mid-training (a partition): hosts 0 and 1 shrink and end with the parameters of an
                           uninterrupted run; host 2's rank, cut off from the job's store, stops and trains no further
  fault_link_returns       a link down for 2 s, then up again, within the timeout: the allreduce completes
  fault_mpi_host_killed    mpirun over 2 hosts, one's processes SIGKILLed: the job ends at once naming the host
  fault_mpi_link_down      mpirun over 2 hosts, one's link down: rank 0's TIMEOUT, the job ends naming the host
  fault_host_never_joins   a host that never starts its rank: TIMEOUT naming the missing rank
  fault_master_unreachable MASTER_ADDR no host has: an error naming the address, within the timeout
"""

import os
import re
import subprocess
import sys
import time

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
    return outputs(hosts, procs)


def outputs(hosts, procs, timeout=TIMEOUT_S):
    """[(exit status, output)] of processes started in the hosts (stdout piped, stderr with it), each
    waited for at most `timeout` s. On a timeout every host's processes are killed first: they hold the
    output's pipe (mpirun's too, from the other hosts), which killing the nsenter alone would leave open."""
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for host in range(hosts.count):
                hosts.signal_host(host, "KILL")
            p.kill()
            out, _ = p.communicate()
            out += f"\n(TIMED OUT after {timeout} s)"
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
        expect(f"store={hosts.address(0)}:{MASTER_PORT} (the launcher's bpl-store)" in details,
               "the store on host 0's address, served by its bpl-run", info)
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
        results = outputs(hosts, procs)
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
            # rank 0's step lines (bpl-run prefixes each line with its rank)
            steps = lambda out: re.findall(r"^(?:\[rank0\]:)?(step \d+ loss .*)$", out, re.M)  # noqa: E731
            expect(len(steps(straight[0][1])) == 12, "12 step lines from the straight run", straight)
            expect("resumed from step 8" in resumed[0][1], "the run resumed from step 8", resumed)
            expect(steps(straight[0][1])[8:] == steps(resumed[0][1]), "the resumed run repeats steps 9-12",
                   straight + resumed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print("passed: tp_mlp --check and a resumed dp_train across 2 hosts")


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "BPL_BACKEND": "mpi"}


AGENT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "hosts_agent.py"))


def mpirun_command(hosts, hostfile, *options):
    """mpirun over the hosts of `hostfile` (host_file), to be run in host 0: the launch agent
    (plm_rsh_agent) hosts_agent.py starts the other hosts' daemons as ssh would, the TCP BTL and ORTE's
    out-of-band channel only on the hosts' interface. Calls hosts.serve_launches()."""
    hosts.serve_launches()
    return ["mpirun", "--hostfile", hostfile.name, "--mca", "plm_rsh_agent", AGENT,
            "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            *options, "-np", str(hosts.count)]


def host_file(hosts, slots=1):
    """An Open MPI host file naming every host with `slots` slots (a NamedTemporaryFile: use `with`)."""
    import tempfile
    hostfile = tempfile.NamedTemporaryFile("w", prefix="bpl-hostfile-", suffix=".txt")
    hostfile.write("".join(f"{hosts.host(i)} slots={slots}\n" for i in range(hosts.count)))
    hostfile.flush()
    return hostfile


def mpi_two_hosts(bin_dir):
    """mpirun in host 0 with a host file naming both hosts (mpirun_command): bpl-info sees 2 ranks, one
    per host, and the conformance suite passes on the mpi backend."""
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        mpirun = mpirun_command(hosts, hostfile)
        env = dict(os.environ, BPL_TIMEOUT_MS="60000", **MPI_ENV)
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


def bench_two_hosts(bin_dir):
    """bpl-bench-compare --hostfile across 2 hosts, 1 and 2 ranks on each: gloo (bpl-run on each host
    through the launch agent) and mpi (mpirun with the host file) each beside its raw library; the
    table says where it ran and has backplane/raw for every row, and gloo took the path asked for."""
    import re
    import tempfile
    with TestHosts(2) as hosts, host_file(hosts, slots=2) as hostfile:
        hosts.serve_launches()
        for per_host, path in ((1, "gloo over tcp (each rank on a machine of its own)"),
                               (2, "shared memory within each of 2 machines, gloo over tcp between them")):
            with tempfile.TemporaryDirectory(prefix="bpl-hosts-bench-") as out:
                argv = [os.path.join(bin_dir, "bpl-bench-compare"), "--hostfile", hostfile.name, "--agent", AGENT,
                        "--nproc", str(per_host), "--out", out, "--mpirun-args",
                        "--mca btl tcp,vader,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
                        "--mca mpi_yield_when_idle 1",
                        "--", "--ops=allreduce,pingpong", "--dtypes=f32", "--max-bytes=1K", "--step-factor=256", "--repetitions=2",
                        "--max-iterations=10"]
                run = hosts.run(0, argv, timeout=TIMEOUT_S)
                results = [(run.returncode, run.stdout + run.stderr)]
                expect_all_passed(results, f"bpl-bench-compare across 2 hosts, {per_host} rank(s) each")
                with open(os.path.join(out, "collectives.md")) as f:
                    table = f.read()
                results = [(run.returncode, table)]
                expect(f"Across 2 machines ({hosts.host(0)}, {hosts.host(1)}), {per_host} rank(s) on each" in table,
                       "the table says where it ran", results)
                expect(f"collectives of world: {path}" in table, f"gloo's path: {path}", results)
                expect(f"ranks {2 * per_host} ({per_host} on this host)" in table, "the ranks of both runs", results)
                cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
                         if line.startswith("| ")]
                header, rows = cells[0], [row for row in cells[1:] if row[0] in ("allreduce", "pingpong")]
                wanted = [header.index(f"{b}{column}") for b in ("gloo", "mpi") for column in (" µs", "/raw")]
                # a time with the repetitions' range, "12.30 (11.90-14.10)"; a ratio, "(noisy)" where they disagree
                number = r"[0-9.]+( \([0-9.]+-[0-9.]+\)| \(noisy\))?"
                expect(len(rows) == 4 and all(re.fullmatch(number, row[i]) for row in rows for i in wanted),
                       "4 rows, each with backplane's time and backplane/raw for gloo and for mpi", results)
    print("passed: bpl-bench-compare --hostfile across 2 hosts, 1 and 2 ranks each: gloo and mpi beside raw")


ALLREDUCE_LOOP = """
import array, os, sys, time
sys.path.insert(0, os.environ["BPL_PYTHON_DIR"])
import backplane
seconds, count = float(sys.argv[1]), int(sys.argv[2])
start = time.monotonic()
def say(line):  # one write per line: a host's ranks share the pipe, and print() writes a line's end apart
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()
with backplane.Runtime() as rt:
    world, longest, done = rt.world, 0.0, 0
    expected = world.size * (world.size + 1) / 2
    say(f"rank {world.rank}: running")
    try:
        while True:
            # The last element counts the ranks whose time is not up: all stop after the same allreduce.
            data = array.array("f", [float(world.rank + 1)] * (count - 1) + [float(time.monotonic() - start < seconds)])
            began = time.monotonic()
            world.allreduce(data)
            longest = max(longest, time.monotonic() - began)
            if any(x != expected for x in data[:-1]):
                say(f"rank {world.rank}: WRONG RESULT {data[0]} (expected {expected})")
                sys.exit(4)
            done += 1
            if data[-1] < world.size:
                break
    except backplane.BackplaneError as e:
        say(f"rank {world.rank}: failed after {time.monotonic() - start:.1f} s (at {time.time():.2f}): {e}")
        sys.exit(3)
    say(f"rank {world.rank}: {done} allreduces correct, the longest {longest:.2f} s")
"""


class AllreduceLoop:
    """`ranks_per_host` ranks in each host in a loop of allreduces of `count` floats (each result
    checked) for `seconds`, with the group timeout `timeout_ms`, launched by bpl-run --nnodes in every host, or by `mpirun` (a
    command from mpirun_command) in host 0 on the mpi backend; returns once the job has met."""

    def __init__(self, hosts, bin_dir, timeout_ms, seconds=120, ranks_per_host=1, mpirun=None, count=1024):
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS=str(timeout_ms), BPL_PYTHON_DIR=os.path.abspath(source),
                   BPL_LIBRARY=os.path.join(os.path.dirname(bin_dir), "lib", "libbackplane.so"))
        program = [sys.executable, "-c", ALLREDUCE_LOOP, str(seconds), str(count)]
        launches = [(0, mpirun + program)] if mpirun else [
            (i, [os.path.join(bin_dir, "bpl-run"), "--nnodes", str(hosts.count), "--node-rank", str(i),
                 "--master-addr", hosts.address(0), "--master-port", MASTER_PORT, "--nproc-per-node",
                 str(ranks_per_host), *program]) for i in range(hosts.count)]
        if mpirun:
            env.update(MPI_ENV)
        self.hosts = hosts
        self.procs = [hosts.start(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                      for i, argv in launches]
        self.started = ""
        while "running" not in self.started:  # rank 0 is in its loop: the job has met
            line = self.procs[0].stdout.readline()
            if not line:
                raise Failure(f"the job did not start: {self.started}")
            self.started += line

    def results(self, which=None, timeout=60):
        """[(exit status, output)] of the launchers in the given hosts (every one by default), as
        outputs() gives them; rank 0's with what it printed before the job met."""
        which = range(len(self.procs)) if which is None else list(which)
        results = outputs(self.hosts, [self.procs[i] for i in which], timeout)
        return [(code, self.started + out if i == 0 else out) for i, (code, out) in zip(which, results)]

    def expect_nothing_left(self, which, results):
        for i in which:
            left = self.hosts.processes(i)
            expect(not left, f"nothing left in host {i}: {left}", results)


def named_culprits(output):
    """The ranks a failure's claim names ("the connection to rank N", "rank N of this communicator"):
    the communicator's first failure where the message reports one, else the rank's own."""
    failed = [line for line in output.splitlines() if ": failed after " in line]
    claim = failed[-1].split(" [the communicator's first failure")[0] if failed else ""
    return {int(a or b) for a, b in re.findall(r"the connection to rank (\d+)|rank (\d+) of this communicator", claim)}


def fault_host_killed(bin_dir):
    """Three hosts in a loop of allreduces; every process of host 2 SIGKILLed (the kernel closes its
    sockets): both survivors fail at once, naming rank 2 as on another machine, and leave nothing behind."""
    with TestHosts(3) as hosts:
        job = AllreduceLoop(hosts, bin_dir, 30000)
        time.sleep(1)
        killed_at = time.monotonic()
        hosts.kill_host(2)
        results = job.results([0, 1])
        elapsed = time.monotonic() - killed_at
        expect(all(code != 0 for code, _ in results), "every survivor fails", results)
        expect(all("BPL_ERR_REMOTE" in out and "rank 2, on another machine" in out for _, out in results),
               "every survivor names rank 2, on another machine", results)
        expect(all(named_culprits(out) == {2} for _, out in results),
               "what every survivor says failed names rank 2 alone, not the other survivor", results)
        expect(elapsed < 10, f"the survivors fail at once, well within the 30 s timeout (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0, 1], results)
    print(f"passed: host 2 killed: both survivors failed in {elapsed:.1f} s naming rank 2; nothing left behind")


def link_down(bin_dir, count, ranks_per_host, cut):
    """`count` hosts in a loop of allreduces; host `cut`'s link taken down (a partition: no RST, no
    FIN, its processes running): every rank, on both sides, fails with TIMEOUT within the 5 s timeout and
    its slack, naming the ranks and address of every host it cannot reach, and every host's processes
    end."""
    timeout_s = 5
    with TestHosts(count) as hosts:
        job = AllreduceLoop(hosts, bin_dir, timeout_s * 1000, ranks_per_host=ranks_per_host)
        time.sleep(1)
        cut_at = time.monotonic()
        hosts.set_link(cut, up=False)
        results = job.results()
        elapsed = time.monotonic() - cut_at
        expect(all(code != 0 for code, _ in results), "every host's job fails, the cut-off one's too", results)
        failures = [[line for line in out.splitlines() if "failed after" in line] for _, out in results]
        expect(all(len(lines) == ranks_per_host for lines in failures), "every rank reports its failure", results)
        expect(all("BPL_ERR_TIMEOUT" in line for lines in failures for line in lines), "every rank's is a TIMEOUT",
               results)
        def unreachable(i):  # what a rank says of host i when it cannot reach it
            ranks = list(range(i * ranks_per_host, (i + 1) * ranks_per_host))
            return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} at {hosts.address(i)} " \
                   f"{'are' if len(ranks) > 1 else 'is'} unreachable"
        connected = [i for i in range(count) if i != cut]
        expect(all(unreachable(cut) in line for i in connected for line in failures[i]),
               f"every connected rank names the cut-off host's ranks and address: '{unreachable(cut)}'", results)
        expect(all(all(unreachable(i) in line for i in connected) for line in failures[cut]),
               "every cut-off rank names every host it cannot reach, with its ranks and address", results)
        expect(elapsed < timeout_s * 3, f"within the {timeout_s} s timeout and its slack (took {elapsed:.1f} s)",
               results)
        job.expect_nothing_left(range(count), results)
    for lines in failures:
        print("\n".join(lines))
    print(f"passed: {count} hosts x {ranks_per_host} rank(s), host {cut}'s link down: every rank failed in "
          f"{elapsed:.1f} s (timeout {timeout_s} s), naming the unreachable rank and address; nothing left behind")


def fault_link_down(bin_dir):
    link_down(bin_dir, 3, 1, cut=2)


def fault_link_down_master(bin_dir):
    link_down(bin_dir, 3, 1, cut=0)  # the host of rank 0 and of the store


def fault_link_down_two_ranks(bin_dir):
    link_down(bin_dir, 2, 2, cut=1)


def fault_host_stopped(bin_dir):
    """Every process of host 2 stopped (SIGSTOP) mid-allreduce of 64 MiB, its network up: its kernel
    still answers, also once its receive buffers are full (it acknowledges the senders' zero-window
    probes), so the survivors' TIMEOUT must not call it unreachable; once it is continued, it fails too
    (the survivors closed their connections) and nothing is left running."""
    timeout_s = 5
    with TestHosts(3) as hosts:
        job = AllreduceLoop(hosts, bin_dir, timeout_s * 1000, count=1 << 24)
        time.sleep(1)
        stopped_at = time.monotonic()
        hosts.signal_host(2, "STOP")
        results = job.results([0, 1])
        elapsed = time.monotonic() - stopped_at
        hosts.signal_host(2, "CONT")
        results += job.results([2])
        expect(all(code != 0 for code, _ in results), "every rank fails, the stopped one once continued", results)
        expect(all("BPL_ERR_TIMEOUT" in out for _, out in results[:2]), "both survivors report a TIMEOUT", results)
        expect(not any("unreachable" in out for _, out in results), "no rank calls a stopped machine unreachable",
               results)
        expect(elapsed < timeout_s * 3, f"within the {timeout_s} s timeout and its slack (took {elapsed:.1f} s)",
               results)
        job.expect_nothing_left(range(3), results)
    print(f"passed: host 2 stopped: both survivors failed with TIMEOUT in {elapsed:.1f} s, calling no machine "
          "unreachable; rank 2 failed once continued; nothing left behind")


def elastic_link_down(bin_dir):
    """No split brain: of a partitioned job, only the side that reaches the job's store (bpl-store, served
    by host 0's bpl-run) goes on."""
    timeout_s, steps = 3, 150
    reference = subprocess.run([os.path.join(bin_dir, "elastic_sgd"), "--steps", str(steps)], capture_output=True,
                               text=True, env=dict(os.environ, BPL_BACKEND="gloo", RANK="0", WORLD_SIZE="1"))
    expect(reference.returncode == 0, "the uninterrupted run on one rank", [(reference.returncode, reference.stdout)])
    final = re.search(r"w = (.*)", reference.stdout).group(1).split()
    with TestHosts(3) as hosts:
        env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS=str(timeout_s * 1000))
        procs = [hosts.start(i, [os.path.join(bin_dir, "bpl-run"), "--nnodes", "3", "--node-rank", str(i),
                                 "--master-addr", hosts.address(0), "--master-port", MASTER_PORT, "--keep-going",
                                 os.path.join(bin_dir, "elastic_sgd"), "--steps", str(steps), "--pause-ms", "20"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
        time.sleep(1.5)  # the ranks have met and train
        hosts.set_link(2, up=False)
        results = outputs(hosts, procs)
        for i in range(3):
            job_left = hosts.processes(i)
            expect(not job_left, f"nothing left in host {i}: {job_left}", results)
    survivors = [out for _, out in results[:2]]
    expect(all(code == 0 for code, _ in results[:2]), "hosts 0 and 1 go on and end well", results)
    expect(all("ranks [2] of the communicator failed" in out for out in survivors), "both agree that rank 2 failed",
           results)
    for out in survivors:
        got = re.search(r"done: .* w = (.*)", out)
        expect(got is not None, "each survivor finishes", results)
        expect(all(abs(float(a) - float(b)) <= 1e-12 * (1 + abs(float(b))) for a, b in zip(got.group(1).split(), final)),
               "the survivors end with the parameters of the uninterrupted run", results)
    code, cut_off = results[2]
    expect(code != 0 and "done:" not in cut_off, "the cut-off rank does not train on", results)
    expect("left the job" in cut_off and ("cut off from the job" in cut_off or "counted rank 2 as failed" in cut_off),
           "the cut-off rank says why it stops", results)
    print(next(line for line in cut_off.splitlines() if "left the job" in line))
    print("passed: host 2 cut off mid-training: hosts 0 and 1 shrank and ended with the uninterrupted run's "
          "parameters; host 2's rank stopped, trained no further; nothing left behind")


def fault_mpi_host_killed(bin_dir):
    """mpirun over 2 hosts in a loop of allreduces on the mpi backend; every process of host 1 SIGKILLed:
    Open MPI's promise, the job ends at once naming the lost host, and nothing is left in host 0."""
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        job = AllreduceLoop(hosts, bin_dir, 30000, mpirun=mpirun_command(hosts, hostfile))
        time.sleep(1)
        killed_at = time.monotonic()
        hosts.kill_host(1)
        results = job.results()
        elapsed = time.monotonic() - killed_at
        expect(results[0][0] != 0, "mpirun fails", results)
        expect(f"on node {hosts.host(1)}" in results[0][1], f"mpirun names the lost host {hosts.host(1)}", results)
        expect(elapsed < 10, f"at once, well within the 30 s timeout (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0], results)
    print(f"passed: mpirun, host 1 killed: the job ended in {elapsed:.1f} s naming {hosts.host(1)}; nothing left")


# ORTE's out-of-band channel probes an idle connection after 6 s, then every second, and gives up after
# 3 unanswered probes: a daemon cut off is lost in about 9 s (Open MPI's defaults: 300 s, 20 s, 9 probes).
# Well after rank 0's TIMEOUT (at most T + 1 s = 4 s after the cut), so that mpirun reports that first:
# with 2 s (lost in about 5 s) a loaded machine let the lost daemon come first (once in a full suite).
MPI_OOB_KEEPALIVE = ["--mca", "oob_tcp_keepalive_time", "6", "--mca", "oob_tcp_keepalive_intvl", "1",
                     "--mca", "oob_tcp_keepalive_probes", "3"]


# A connection whose data goes unacknowledged gets no keepalive: TCP retransmits it tcp_retries2 times
# (Linux's 15: about 15 minutes) before it gives up. Host 1's daemon forwards its rank's output to
# mpirun over such a connection, so it learns of the cut only then; 5 (about 12 s) is what a cluster
# tuned for quick failure detection sets.
TCP_RETRIES = 5


def fault_mpi_link_down(bin_dir):
    """mpirun over 2 hosts in a loop of allreduces on the mpi backend; host 1's link down: rank 0 fails
    with TIMEOUT after backplane's 3 s and mpirun ends the job naming it; host 1's daemon learns of the cut
    when TCP gives up (TCP_RETRIES, MPI_OOB_KEEPALIVE) and ends its rank and itself."""
    import re
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        for i in range(2):
            hosts.run(i, ["sysctl", "-q", f"net.ipv4.tcp_retries2={TCP_RETRIES}"])
        job = AllreduceLoop(hosts, bin_dir, 3000, mpirun=mpirun_command(hosts, hostfile, *MPI_OOB_KEEPALIVE))
        time.sleep(1)
        cut_at = time.monotonic()
        cut_time = time.time()
        hosts.set_link(1, up=False)
        results = job.results()
        elapsed = time.monotonic() - cut_at
        expect(results[0][0] != 0, "mpirun fails", results)
        expect("rank 0: failed" in results[0][1] and "BPL_ERR_TIMEOUT" in results[0][1], "rank 0 reports a TIMEOUT",
               results)
        expect(re.search(r"Process name: *\[\[\d+,1\],0\]", results[0][1]) is not None,
               "mpirun ends the job naming rank 0, the rank that failed", results)
        failed_at = re.search(r"rank 0: failed after [0-9.]+ s \(at ([0-9.]+)\)", results[0][1])
        failed_after = float(failed_at.group(1)) - cut_time if failed_at else float("inf")
        expect(failed_after < 3 * 3, f"rank 0 fails within the 3 s timeout and its slack (took {failed_after:.1f} s)",
               results)
        expect(elapsed < 60, f"mpirun ends the job once TCP gives up (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0], results)
        deadline = time.monotonic() + 60
        while hosts.processes(1) and time.monotonic() < deadline:
            time.sleep(0.5)
        job.expect_nothing_left([1], results)
        cut_off_ended = time.monotonic() - cut_at
    print(f"passed: mpirun, host 1's link down: rank 0 TIMEOUT {failed_after:.1f} s after the cut, "
          f"the job ended in {elapsed:.1f} s naming rank 0; "
          f"host 1's daemon and rank ended {cut_off_ended:.1f} s after the cut")


def fault_link_returns(bin_dir):
    """Host 1's link down for 2 s mid-loop, then up again, well within the 10 s timeout: the allreduce in
    flight completes (TCP retransmits what the cut dropped; nothing was lost, nothing timed out) and
    every result, before and after, is right."""
    import re
    with TestHosts(2) as hosts:
        job = AllreduceLoop(hosts, bin_dir, 10000, seconds=8)
        time.sleep(1)
        hosts.set_link(1, up=False)
        time.sleep(2)
        hosts.set_link(1, up=True)
        results = job.results()
        expect_all_passed(results, "both ranks finish their loop")
        longest = [float(m.group(1)) for m in (re.search(r"the longest ([0-9.]+) s", out) for _, out in results) if m]
        expect(len(longest) == 2 and min(longest) >= 1.5,
               f"the cut stalled an allreduce on both ranks, which then completed (longest {longest} s)", results)
    print(f"passed: host 1's link down for 2 s: the stalled allreduce completed (longest {max(longest):.1f} s), "
          "every result right")


def alone(hosts, i, bin_dir, master, node_rank, timeout_ms):
    """bpl-info --init as node `node_rank` of 2 in host i, meeting at `master`; (status, output, seconds)."""
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
                                     fault_host_killed, fault_link_down, fault_link_down_master, fault_link_down_two_ranks,
                                     fault_host_stopped, fault_link_returns, fault_mpi_host_killed, bench_two_hosts,
                                     fault_mpi_link_down, fault_host_never_joins,
                                     fault_master_unreachable, elastic_link_down)}


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
