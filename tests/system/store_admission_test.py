"""Only the job's processes use its store. Under bpl-run, a process with the job's secret is served, one
without it or with another is refused saying why, and bpl-store says where each refused one came from;
the store listens only at MASTER_ADDR (127.0.0.1: not at 127.0.0.2, this machine too). Without a
launcher, ranks given different secrets fail at bpl_init, the refused one saying why.

    store_admission_test.py <bin dir> <late_rank program>
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
from backplane.run.ports import free_port  # noqa: E402

# Rank 0 asks the job's store as an outsider would, then every rank runs late_rank (one allreduce).
PROBE = """import os, socket, subprocess, sys
bpl_store, late_rank = sys.argv[1], sys.argv[2]
if os.environ["RANK"] == "0":
    port = int(os.environ["BPL_STORE_PORT"])
    others = {k: v for k, v in os.environ.items() if k != "BPL_STORE_SECRET"}
    for name, env in (("own", dict(os.environ)), ("none", others), ("wrong", dict(others, BPL_STORE_SECRET="x"))):
        asked = subprocess.run([bpl_store, "--client", f"127.0.0.1:{port}", "--timeout-ms", "5000"],
                               input="check backplane\\n", env=env, capture_output=True, text=True, timeout=60)
        print("probe", name, asked.returncode, repr((asked.stdout + asked.stderr).strip()), flush=True)
    for address in ("127.0.0.1", "127.0.0.2"):
        try:
            socket.create_connection((address, port), timeout=5).close()
            print("reached", address, flush=True)
        except OSError:
            print("not reached", address, flush=True)
os.execv(late_rank, [late_rank])
"""

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def line_of(output, start):
    return next((line.split(":", 1)[1] for line in output.splitlines() if line.split(":", 1)[-1].startswith(start)), "")


def under_bpl_run(bin_dir, late_rank, env):
    job = subprocess.run([os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "2", sys.executable, "-c", PROBE,
                          os.path.join(bin_dir, "bpl-store"), late_rank],
                         env=env, capture_output=True, text=True, timeout=120)
    said = f"{job.returncode} {job.stdout[-2500:]!r} {job.stderr[-2500:]!r}"
    expect(job.returncode == 0 and "done 0 3" in job.stdout and "done 1 3" in job.stdout,
           f"the job runs beside the outsiders: {said}")
    expect(line_of(job.stdout, "probe own 0") != "" and "connected" in line_of(job.stdout, "probe own"),
           f"a process with the job's secret is served: {said}")
    expect("refused this process: it serves only the job's processes, and BPL_STORE_SECRET is not set here"
           in line_of(job.stdout, "probe none 1"), f"a process without the secret is refused saying why: {said}")
    expect("refused this process: BPL_STORE_SECRET here is not the job's" in line_of(job.stdout, "probe wrong 1"),
           f"a process with another secret is refused saying why: {said}")
    expect("bpl-store: store: closed the connection from 127.0.0.1:" in job.stderr and "it gave no secret" in job.stderr
           and "its secret is not the job's" in job.stderr, f"bpl-store says where each refused one came from: {said}")
    expect("reached 127.0.0.1" in job.stdout and "not reached 127.0.0.2" in job.stdout,
           f"the store listens only at MASTER_ADDR: {said}")


def without_launcher(late_rank, env):
    port = free_port("127.0.0.1")
    ranks = []
    for rank, secret in ((0, "the job's"), (1, "another")):
        ranks.append(subprocess.Popen([late_rank], env=dict(env, RANK=str(rank), WORLD_SIZE="2", MASTER_PORT=str(port),
                                                            MASTER_ADDR="127.0.0.1", BPL_TIMEOUT_MS="3000",
                                                            BPL_STORE_SECRET=secret),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [rank.communicate(timeout=60) for rank in ranks]
    said = f"{[r.returncode for r in ranks]} {outputs!r}"
    expect(ranks[1].returncode != 0 and "late_rank: bpl_init: BPL_ERR_INVALID_ARGUMENT" in outputs[1][1]
           and "BPL_STORE_SECRET here is not the job's" in outputs[1][1],
           f"a rank with another secret fails at bpl_init saying why: {said}")
    expect(ranks[0].returncode != 0 and "late_rank: bpl_init" in outputs[0][1],
           f"rank 0, whose peer never came, fails at bpl_init: {said}")


def main():
    bin_dir, late_rank = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    env = dict(os.environ, NXD_CPU_MODE="1")
    for name in ("MASTER_ADDR", "MASTER_PORT", "BPL_STORE_PORT", "BPL_STORE_SECRET", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    under_bpl_run(bin_dir, late_rank, env)
    without_launcher(late_rank, env)
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: only the job's processes use its store")


if __name__ == "__main__":
    main()
