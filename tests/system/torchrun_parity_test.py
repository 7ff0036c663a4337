"""bpl-run and a real torchrun, flag by flag, on the same script: every rank gets the same variables with
the same values (less those that must differ: ports, run ids, file paths, the agent's store, bpl-run's
BPL_STORE_PORT and BPL_STORE_SECRET), the same ranks run and print, and the jobs end alike (status,
restarts, @record's error file).

    torchrun_parity_test.py <bin dir>
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
from backplane.run.ports import free_port  # noqa: E402

# Values that differ by design: chosen anew each run, or where each launcher keeps its own things.
DIFFERING = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
# bpl-run's own: where its bpl-store serves backplane's store (MASTER_PORT, with the torch store), and the
# secret that store admits the job's processes by.
OWN = {"BPL_STORE_PORT", "BPL_STORE_SECRET"}
# One host, where torchrun names it "localhost": bpl-run gives the address, IPv4 for certain.
LOOPBACK = {"localhost", "127.0.0.1"}

PROBE = """import json, os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    with open(os.path.join(sys.argv[1], f"{rank}.{attempt}.json"), "w") as f:
        json.dump(dict(os.environ), f)
    print(f"probe {rank} attempt {attempt}", flush=True)
    if rank == "1":  # rank 0 has come this far before rank 1 fails: the same ranks run under either launcher
        while not os.path.exists(os.path.join(sys.argv[1], f"0.{attempt}.json")):
            time.sleep(0.05)
    if sys.argv[2] == "fail" and rank == "1":
        sys.exit(3)
    if sys.argv[2] == "fail_once" and rank == "1" and attempt == "0":
        sys.exit(3)
    if sys.argv[2] == "raise" and rank == "1":
        raise ValueError("boom from rank 1")
main()
"""

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def launch(launcher, flags, probe, folder, behaviour):
    out = os.path.join(folder, launcher + str(len(os.listdir(folder))))
    os.makedirs(out)
    command = launcher_command(launcher) + flags + [probe, out, behaviour]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=folder)
    envs = {}
    for name in os.listdir(out):
        with open(os.path.join(out, name)) as f:
            envs[name[:-len(".json")]] = json.load(f)
    return done, envs


def launcher_command(launcher):
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [os.path.join(BIN, "bpl-run")]


def launched_variables(env):
    """What the launcher gave a rank: the variables that are not the test's own, or differ from it."""
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


def compare(case, flags, probe, folder, behaviour="ok"):
    ours, our_envs = launch("bpl-run", flags(), probe, folder, behaviour)
    theirs, their_envs = launch("torchrun", flags(), probe, folder, behaviour)
    expect(sorted(our_envs) == sorted(their_envs),
           f"{case}: the same ranks and attempts run: bpl-run {sorted(our_envs)}, torchrun {sorted(their_envs)}")
    for attempt in sorted(set(our_envs) & set(their_envs)):
        mine, other = launched_variables(our_envs[attempt]), launched_variables(their_envs[attempt])
        missing = sorted(set(other) - set(mine) - OWN)
        extra = sorted(set(mine) - set(other) - OWN)
        differ = sorted(k for k in set(mine) & set(other) - DIFFERING - OWN if mine[k] != other[k]
                        and not (k == "MASTER_ADDR" and {mine[k], other[k]} == LOOPBACK))
        expect(not missing and not extra and not differ,
               f"{case}, rank.attempt {attempt}: missing {missing}, extra {extra}, "
               f"differing {[(k, mine[k], other[k]) for k in differ]}")
        error_file = mine.get("TORCHELASTIC_ERROR_FILE", "")
        rank, restart = attempt.split(".")  # one node: the local rank is the rank
        expect(error_file.endswith(f"attempt_{restart}/{rank}/error.json"),
               f"{case}: the error file in torchrun's layout: {error_file}")
    our_lines = sorted(re.findall(r"probe \d attempt \d", ours.stdout))
    their_lines = sorted(re.findall(r"probe \d attempt \d", theirs.stdout))
    expect(our_lines == their_lines, f"{case}: the same lines on the console: {our_lines} vs {their_lines}")
    # torchrun exits 1 for any failed worker; bpl-run with the failed rank's status, as mpirun does.
    expect((ours.returncode == 0) == (theirs.returncode == 0),
           f"{case}: both succeed or both fail: bpl-run {ours.returncode} {ours.stderr[-1500:]!r}, "
           f"torchrun {theirs.returncode} {theirs.stderr[-1500:]!r}")
    return ours, theirs


def main():
    global BIN
    BIN = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as folder:
        probe = os.path.join(folder, "probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)

        def static():
            return ["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                    str(free_port("127.0.0.1")), "--nproc-per-node", "2"]

        compare("static rendezvous", static, probe, folder)
        compare("the default", lambda: ["--nproc-per-node", "2"], probe, folder)
        compare("--standalone", lambda: ["--standalone", "--nproc_per_node", "2"], probe, folder)
        compare("c10d at an endpoint", lambda: ["--rdzv-backend", "c10d", "--rdzv-endpoint",
                                                f"127.0.0.1:{free_port('127.0.0.1')}", "--nproc-per-node", "2"],
                probe, folder)
        compare("--role, --rdzv-id, --monitor-interval, --start-method",
                lambda: static() + ["--role", "trainer", "--rdzv-id", "job7", "--monitor-interval", "0.2",
                                    "--start-method", "fork"], probe, folder)
        compare("--nproc-per-node cpu", lambda: ["--nproc-per-node", "cpu"], probe, folder)
        compare("--run-path", lambda: ["--nproc-per-node", "2", "--run-path"], probe, folder)
        compare("--virtual-local-rank", lambda: ["--nproc-per-node", "2", "--virtual-local-rank"], probe, folder)
        compare("--local-ranks-filter 1", lambda: ["--nproc-per-node", "2", "--local-ranks-filter", "1"], probe,
                folder)
        compare("--max-restarts 1, a rank failing once", lambda: static() + ["--max-restarts", "1"], probe, folder,
                "fail_once")
        ours, _ = compare("--max-restarts 1, a rank failing always", lambda: static() + ["--max-restarts", "1"],
                          probe, folder, "fail")
        expect(ours.returncode == 3 and "restarting the ranks (restart 1 of 1)" in ours.stderr,
               f"bpl-run restarts once, then ends with the rank's status: {ours.returncode} {ours.stderr!r}")
        ours, theirs = compare("@record", static, probe, folder, "raise")
        expect("ValueError: boom from rank 1 (its error file: " in ours.stderr,
               f"bpl-run names the error @record wrote: {ours.stderr[-1500:]!r}")
        expect("boom from rank 1" in theirs.stderr, f"torchrun reports it too: {theirs.stderr[-1500:]!r}")
        summary = ours.stderr.rfind("bpl-run: rank 1")
        expect(summary > ours.stderr.rfind("[rank1]:"),
               f"bpl-run's summary comes after every line of the failed rank: {ours.stderr[-1500:]!r}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: bpl-run and torchrun agree, flag by flag")


if __name__ == "__main__":
    main()
