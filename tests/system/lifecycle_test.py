"""A runtime ended or forked while busy (lifecycle_races.c), on gloo over shared memory, gloo over TCP and
mpi under mpirun: bpl_finalize while another thread is in a collective (blocked, or in bpl_request_wait)
ends that call with an error naming bpl_finalize, or lets it complete, never a crash or a hang; a process
forked after bpl_init is refused every inherited handle, its exit leaves MPI to its parent, and the
parent's communicators go on. And bpl_init again after bpl_finalize, five times in each rank's process,
makes a new world each time under bpl-run (its bpl-store outlives the worlds), a torchrun agent's store
and rank 0's own store.

    lifecycle_test.py <bin dir> <lifecycle_races program> [<mpirun>]
"""
import os
import re
import socket
import subprocess
import sys

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def run(launch, backend_env, mode):
    env = dict(os.environ, BPL_TIMEOUT_MS="8000", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **backend_env)
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "BPL_STORE_PORT"):
        env.pop(name, None)
    job = subprocess.run(launch + [mode], env=env, capture_output=True, text=True, timeout=90)
    lines = [re.sub(r"^\[rank\d\]:", "", line) for line in job.stdout.splitlines()]
    return job, lines


def line_of(lines, start):
    found = [line for line in lines if line.startswith(start)]
    return found[0] if found else ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reinit_without_launcher(program, env):
    """Two ranks started by hand: rank 0 hosts the store of each world."""
    port = str(free_port())
    ranks = [subprocess.Popen([program, "reinit"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    outputs = [rank.communicate(timeout=90)[0] for rank in ranks]
    return max(rank.returncode for rank in ranks), "".join(outputs)


def check_reinit(bin_dir, program):
    env = dict(os.environ, BPL_TIMEOUT_MS="8000", NXD_CPU_MODE="1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "BPL_STORE_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    bpl_run = [os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "2", program, "reinit"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--no_python", program, "reinit"]
    launches = {"bpl-run, shared memory": (bpl_run, {}), "bpl-run, TCP": (bpl_run, {"BPL_GLOO_SHM": "0"}),
                "torchrun's agent store": (torchrun, {})}
    outcomes = {name: subprocess.run(launch, env=dict(env, **extra), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, timeout=120)
                for name, (launch, extra) in launches.items()}
    outcomes = {name: (job.returncode, job.stdout) for name, job in outcomes.items()}
    outcomes["no launcher (rank 0's store)"] = reinit_without_launcher(program, env)
    for name, (code, output) in outcomes.items():
        made = re.findall(r"rank (\d): 5 worlds made and ended", output)
        expect(code == 0 and sorted(made) == ["0", "1"],
               f"{name}: five worlds, one after another, in every rank: exit {code}: {output[-2000:]}")


def main():
    bin_dir, program = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    bpl_run = [os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", "2", program]
    backends = {"gloo over shared memory": (bpl_run, {"NXD_CPU_MODE": "1"}),
                "gloo over TCP": (bpl_run, {"NXD_CPU_MODE": "1", "BPL_GLOO_SHM": "0"})}
    if len(sys.argv) > 3:
        # Open MPI's own allocations at exit cannot be told apart under LeakSanitizer (tests/CMakeLists.txt):
        # its runs check no leaks (the option means nothing to a build without AddressSanitizer).
        backends["mpi"] = ([sys.argv[3], "--oversubscribe", "-np", "2", program],
                           {"BPL_BACKEND": "mpi", "ASAN_OPTIONS": "detect_leaks=0"})
    for name, (launch, backend_env) in backends.items():
        for mode in ("finalize-while-blocked", "finalize-while-waiting"):
            job, lines = run(launch, backend_env, mode)
            busy = line_of(lines, "rank 0: allreduce on another thread:")
            ended = "BPL_ERR_ABORTED" in busy and "bpl_finalize ended it" in busy
            freed = mode == "finalize-while-blocked" or line_of(lines, "rank 0: request freed:")
            # On mpi rank 0 leaves a collective it began, which MPI cannot take back: rank 0 then skips
            # MPI_Finalize, and mpirun ends the job naming it (docs/faults.md); the job ends all the same.
            whole_job = job.returncode == 0 and line_of(lines, "rank 1: finalize:") if name != "mpi" else True
            expect(ended and freed and "rank 0: finalize: BPL_OK " in lines and whole_job,
                   f"{name}, {mode}: the busy thread's call ends naming bpl_finalize, and every rank ends: "
                   f"{job.returncode} {lines} {job.stderr[-1500:]!r}")
        for mode in ("fork-and-call", "fork-and-exit"):
            job, lines = run(launch, backend_env, mode)
            refused = [line for line in lines if line.startswith("rank 0: child's")]
            if mode == "fork-and-call":
                expect(len(refused) == 2 and all("BPL_ERR_INVALID_ARGUMENT" in line and "was forked from after bpl_init"
                                                 in line for line in refused),
                       f"{name}: the forked child's allreduce and finalize are refused, saying why: {refused}")
            expect(job.returncode == 0 and "rank 0: child ended with 0" in lines and
                   "rank 0: second allreduce BPL_OK, sum 3" in lines and "rank 1: second allreduce BPL_OK, sum 3" in lines,
                   f"{name}, {mode}: the parent's world goes on after its child: {job.returncode} {lines} "
                   f"{job.stderr[-1500:]!r}")
    check_reinit(bin_dir, program)
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: finalize and fork while busy; a new world at each bpl_init")


if __name__ == "__main__":
    main()
