"""A bpl-run job takes one port, as a torchrun job does: bpl-store serves backplane's store and the
program's torch.distributed store (TORCHELASTIC_USE_AGENT_STORE=True) at MASTER_PORT. With the two ports
after it held by another program, a torch program (the backplane and gloo process groups, a restart that
meets again) and a C program run, and their ranks are told MASTER_PORT for both stores.

    one_port_test.py <bin dir> <late_rank program>
"""
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
from backplane.run.ports import free_port  # noqa: E402

SCRIPT = """import os, sys, torch, torch.distributed as dist
import backplane_torch
dist.init_process_group("backplane")
rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
mine = torch.full((4,), float(rank + 1))
dist.all_reduce(mine)
theirs = torch.ones(2)
dist.all_reduce(theirs, group=dist.new_group(backend="gloo"))
print("ranks", rank, attempt, mine.tolist(), theirs.tolist(), os.environ["MASTER_PORT"], os.environ["BPL_STORE_PORT"],
      os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
dist.destroy_process_group()
sys.exit(3 if attempt == 0 and rank == 1 else 0)
"""

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def held(port):
    """A socket listening on `port`, as another program's would."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def main():
    bin_dir, late_rank = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    port = free_port("127.0.0.1", 3)
    holders = [held(port + 1), held(port + 2)]
    env = dict(os.environ, NXD_CPU_MODE="1")
    for name in ("MASTER_PORT", "BPL_STORE_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    bpl_run = [os.path.join(bin_dir, "bpl-run"), "--master-port", str(port), "--nproc-per-node", "2"]
    torch_job = subprocess.run(bpl_run + ["--max-restarts", "1", sys.executable, "-c", SCRIPT], env=env,
                               capture_output=True, text=True, timeout=240)
    lines = sorted(line.split(":", 1)[1] for line in torch_job.stdout.splitlines() if ":ranks " in line)
    wanted = sorted(f"ranks {rank} {attempt} [3.0, 3.0, 3.0, 3.0] [2.0, 2.0] {port} {port} True"
                    for rank in (0, 1) for attempt in (0, 1))
    expect(torch_job.returncode == 0 and lines == wanted,
           f"a torch job and its restart meet at MASTER_PORT alone: {torch_job.returncode} {lines} "
           f"{torch_job.stderr[-2500:]!r}")
    c_job = subprocess.run(bpl_run + [late_rank], env=env, capture_output=True, text=True, timeout=60)
    expect(c_job.returncode == 0 and "done 0 3" in c_job.stdout and "done 1 3" in c_job.stdout,
           f"a C program meets at MASTER_PORT alone: {c_job.returncode} {c_job.stdout!r} {c_job.stderr[-1500:]!r}")
    for holder in holders:
        holder.close()
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: a job takes one port")


if __name__ == "__main__":
    main()
