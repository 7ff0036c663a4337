"""bpl-run (python -m backplane.run): starts the local ranks of a job, with torchrun's flags and
variables, so that a program written for one runs under the other.

Each rank gets every variable torchrun gives it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), its error file
included, where torch's @record writes a failure that bpl-run then reports. A .py script runs with the
Python that runs bpl-run (python -u), -m runs a module, --run-path runs a script through runpy,
--no-python runs the program as it is; a program of another kind runs as it is too, found on PATH or, as
mpirun finds it, in the current folder. Every line a rank writes reaches the console whole, prefixed
with its rank; --tee and --redirects also (or only) write it under --log-dir in torchrun's layout.

The job's stores are served by a process of bpl-run's own beside the ranks (bpl-store, on the first node,
at MASTER_PORT, which the ranks also get as BPL_STORE_PORT): backplane's, where the ranks of a gloo job
meet, and the program's torch.distributed store (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun).
It outlives any rank: the survivors of a failure, rank 0's too, still meet there to go on.

Signals sent to bpl-run (--signals-to-handle) are passed on to every rank. When a rank fails (non-zero
exit or killed by a signal), bpl-run stops the others (SIGTERM, then SIGKILL after --shutdown-timeout
seconds), restarts them all while --max-restarts allows, and otherwise exits with the failed rank's exit
code, or 128 + its signal number, naming every failed rank after all the lines the ranks wrote. With
--keep-going the others go on (a program that shrinks its communicators and trains on, docs/faults.md);
--replace also starts a newcomer (BPL_JOIN=1) in a failed rank's place, once per local rank (a stopped
rank is killed for it once the others have counted it out).
docs/running.md says where bpl-run differs from torchrun and why.
"""

import signal
import sys

from .job import Job
from .options import parse_args
from .output import tell
from .rendezvous import RendezvousError


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    job = Job(args)
    for signum in args.signals:
        signal.signal(signum, job.forward)
    try:
        job.start()
        return job.wait()
    except RendezvousError as error:
        tell(f"bpl-run: {error}")
        return 1
    finally:
        job.close()
