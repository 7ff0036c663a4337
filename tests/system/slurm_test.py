"""Jobs launched as Slurm users launch them, on a real single-node Slurm of the test's own (munged,
slurmctld and slurmd in a temporary folder, on ports of their own): `srun python train.py` with
init_process_group("backplane") on gloo and, through PMIx, mpi; the C ABI (bpl-info --init) under srun on
both; and the sbatch script of docs/running.md, run by sbatch as written.

    slurm_test.py <bin dir> <docs/running.md>    (exit 77, skipped, without root or Slurm's daemons)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def free_ports(count):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
    from backplane.run.ports import free_port
    return [free_port("127.0.0.1") for _ in range(count)]


SLURM_CONF = """ClusterName=bpltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
"""


class Slurm:
    """munged, slurmctld and slurmd of this test's own, stopped (every process of theirs) on exit."""

    def __init__(self, folder):
        self.folder = folder
        ctld_port, slurmd_port = free_ports(2)
        os.makedirs(os.path.join(folder, "state"))
        os.makedirs(os.path.join(folder, "spool"))
        key = os.path.join(folder, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        os.chmod(folder, 0o700)
        self.conf = os.path.join(folder, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(host=subprocess.check_output(["hostname", "-s"], text=True).strip(),
                                      folder=folder, ctld_port=ctld_port, slurmd_port=slurmd_port,
                                      cpus=os.cpu_count()))
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def __enter__(self):
        f = self.folder
        subprocess.run(["munged", "--force", f"--socket={f}/munge.socket", f"--key-file={f}/munge.key",
                        f"--pid-file={f}/munged.pid", f"--log-file={f}/munged.log", f"--seed-file={f}/munge.seed"],
                       check=True, timeout=30)
        subprocess.run(["slurmctld"], env=self.env, check=True, timeout=30)
        subprocess.run(["slurmd"], env=self.env, check=True, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if state.stdout.strip() == "idle":
                return self
            time.sleep(0.5)
        raise SystemExit(f"Slurm's node is not idle after 60 s: {state.stdout!r} {state.stderr!r}\n"
                         + open(os.path.join(f, "slurmctld.log")).read()[-2000:])

    def __exit__(self, *_):
        for name in ("slurmd", "slurmctld", "munged"):
            try:
                with open(os.path.join(self.folder, name + ".pid")) as f:
                    pid = int(f.read())
                os.kill(pid, 15)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.1)
            except (OSError, ValueError):
                pass

    def run(self, command, extra_env=None, cwd=None):
        return subprocess.run(command, env=dict(self.env, **(extra_env or {})), cwd=cwd, capture_output=True,
                              text=True, timeout=180)


TRAIN = """import torch
import torch.distributed as dist
import backplane_torch  # noqa: F401  (a pip install registers the backend without it)

dist.init_process_group("backplane")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {total.item():g}", flush=True)
dist.destroy_process_group()
"""


def sbatch_script(running_md):
    """docs/running.md's sbatch script: the bash block that starts with #!/bin/bash and #SBATCH."""
    with open(running_md) as f:
        blocks = re.findall(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", f.read(), re.S)
    if len(blocks) != 1:
        raise SystemExit(f"{running_md}: expected one sbatch script (#!/bin/bash, #SBATCH ...), found {len(blocks)}")
    return blocks[0]


def main():
    bin_dir, running_md = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "srun", "sbatch") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        print(f"skipped: a Slurm of the test's own needs root and {', '.join(missing) or 'Slurm'} "
              f"({'missing' if missing else 'not root'}; tools/install-deps installs it)")
        sys.exit(77)
    bpl_info = os.path.join(bin_dir, "bpl-info")
    with tempfile.TemporaryDirectory(prefix="bpl-slurm-") as folder, Slurm(folder) as slurm:
        with open(os.path.join(folder, "train.py"), "w") as f:
            f.write(TRAIN)
        want = ["rank 0 of 2: 3", "rank 1 of 2: 3"]
        for backend, mpi in (("gloo", []), ("mpi", ["--mpi=pmix"])):
            step = slurm.run(["srun", "-n", "2"] + mpi + [sys.executable, "train.py"], {"BPL_BACKEND": backend},
                             cwd=folder)
            expect(step.returncode == 0 and sorted(step.stdout.splitlines()) == want,
                   f"srun python train.py on {backend}: {step.returncode} {step.stdout!r} {step.stderr[-2000:]!r}")
            # The C ABI: gloo meets at MASTER_ADDR:MASTER_PORT, as an sbatch script exports them; mpi
            # through PMIx.
            port = free_ports(1)[0]
            info = slurm.run(["srun", "-n", "2"] + mpi + [bpl_info, "--init"],
                             {"BPL_BACKEND": backend, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            # Rank 0 reports the runtime; srun's status says every rank started it.
            ranks = re.findall(r"Runtime \(rank (\d) of (\d), local \d of \d, from (\S+)\)", info.stdout)
            expect(info.returncode == 0 and ranks == [("0", "2", "slurm")],
                   f"srun bpl-info --init on {backend}: {info.returncode} {ranks} {info.stderr[-2000:]!r}")
            expect(f"backend      {backend} " in info.stdout, f"srun bpl-info --init runs {backend}: {info.stdout!r}")
        # docs/running.md's sbatch script, as written, with `python` the project's.
        python_dir = os.path.join(folder, "python-bin")
        os.makedirs(python_dir)
        with open(os.path.join(python_dir, "python"), "w") as f:  # a link would leave the environment behind
            f.write(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        os.chmod(os.path.join(python_dir, "python"), 0o755)
        with open(os.path.join(folder, "train.sbatch"), "w") as f:
            f.write(sbatch_script(running_md))
        batch = slurm.run(["sbatch", "--wait", "--chdir", folder, "train.sbatch"],
                          {"PATH": python_dir + os.pathsep + os.environ["PATH"]}, cwd=folder)
        outputs = [name for name in os.listdir(folder) if name.startswith("train-") and name.endswith(".out")]
        text = open(os.path.join(folder, outputs[0])).read() if outputs else ""
        expect(batch.returncode == 0 and sorted(line for line in text.splitlines() if line.startswith("rank")) == want,
               f"docs/running.md's sbatch script: {batch.returncode} {batch.stderr!r} {outputs} {text[-2000:]!r}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: srun and sbatch on a real Slurm, gloo and mpi, torch and the C ABI")


if __name__ == "__main__":
    main()
