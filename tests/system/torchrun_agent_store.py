"""A program on the C ABI under a real torchrun whose agent hosts the job's store (static rendezvous,
TORCHELASTIC_USE_AGENT_STORE=True): the gloo plugin meets through the agent's torch TCPStore, reached
through the torch store module, and says so in bpl-info --init; the embedder's collectives are right.

    torchrun_agent_store.py <bin dir>
"""
import os
import re
import socket
import subprocess
import sys



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(program, *args):
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "--no_python", program, *args]
    env = dict(os.environ, NXD_CPU_MODE="1")
    run = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False)
    output = run.stdout.decode(errors="replace")
    print(output)
    if run.returncode != 0:
        sys.exit(f"{os.path.basename(program)} under torchrun exited with {run.returncode}")
    return output


def main():
    bin_dir = sys.argv[1]
    info = torchrun(os.path.join(bin_dir, "bpl-info"), "--init")
    if not re.search(r"store=127\.0\.0\.1:\d+ \(torchrun agent's, through \S+/libbpl-torch-store\.so\)", info):
        sys.exit("bpl-info --init does not say the ranks met through the torchrun agent's store")
    embed = torchrun(os.path.join(bin_dir, "embed"))
    if len(re.findall(r"  ok$", embed, re.M)) != 2:
        sys.exit("the embedder did not print two correct ranks")
    print("passed: through the torchrun agent's store")


if __name__ == "__main__":
    main()
