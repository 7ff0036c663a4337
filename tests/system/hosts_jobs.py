"""What the test-host scenarios share (hosts_test.py, hosts_faults_test.py): a job launched over the
hosts by bpl-run or mpirun, its outputs, the checks that show them on failure, a loop of checked
allreduces to break, and the scenario runner."""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from hosts import SKIPPED, why_hosts_cannot_be_made  # noqa: E402

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


def run_scenario(usage, scenarios, argv):
    """The scenario named by argv[2] of a test script run as SCRIPT BIN_DIR SCENARIO: exit 0 passed, 1
    failed, 77 skipped with the reason printed (no test hosts here), 2 for a bad command line."""
    if len(argv) != 3 or argv[2] not in scenarios:
        print(usage, file=sys.stderr)
        return 2
    reason = why_hosts_cannot_be_made()
    if reason:
        print(f"skipped: {reason}")
        return SKIPPED
    try:
        scenarios[argv[2]](os.path.abspath(argv[1]))
    except Failure as failure:
        print(f"FAILED: {failure}")
        return 1
    return 0
