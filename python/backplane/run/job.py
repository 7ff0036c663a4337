"""A job's local ranks: started with torchrun's variables, watched, stopped, restarted (--max-restarts) or
replaced (--replace), and its end told after every line its ranks wrote."""

import os
import secrets
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass

from . import events
from .environment import command_of, rank_environment
from .logs import LogLayout, error_message
from .options import streams_for
from .output import FilteredLog, RankOutput, tell
from . import store
from .ports import NEURON_BOOTSTRAP_OFFSET, busy_port, free_port, listen_host, ports_taken
from .rendezvous import C10dRendezvous, RendezvousError, StoreBridge


@dataclass
class Launch:
    """Where this node's ranks sit in the job, in the current attempt."""
    addr: str
    port: int
    node_rank: int
    nnodes: int
    world: int
    store_port: int  # None: rank 0 serves backplane's store
    hosts_torch_store: bool  # bpl-store serves the program's torch.distributed store at MASTER_PORT
    command: list
    shares: list  # each local rank's CPUs (--bind-to core), or None


@dataclass
class Rank:
    rank: int
    local_rank: int
    process: subprocess.Popen
    name: str  # "rank 3", or "the newcomer for rank 3"
    error_file: str


def cpu_shares(cpus, ranks):
    """Each of `ranks` local ranks' CPUs: contiguous blocks of the sorted `cpus`, the remainder spread."""
    cpus = sorted(cpus)
    return [cpus[i * len(cpus) // ranks:(i + 1) * len(cpus) // ranks] for i in range(ranks)]


def describe_exit(status):
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name}", 128 - status
    return f"exited with code {status}", status


def counted_out_key(pid):
    """Where the ranks say in the job's store that they counted this machine's process `pid` out of the
    job: arrival.h's counted_out_key of the gloo plugin's process key (local_process.h, rendezvous.cpp)."""
    with open("/proc/sys/kernel/random/boot_id") as boot_id:
        space = f"{socket.gethostname()} {boot_id.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    host_id = os.environ.get("BPL_GLOO_HOST_ID")
    process = f"{space}{' host id ' + host_id if host_id is not None else ''}/{pid}"
    return "backplane/counted_out/" + process.replace(" ", "_")


def kill_stopped(entry, why):
    """Kills a stopped rank (it would never end by itself), saying why."""
    tell(f"bpl-run: {entry.name} (pid {entry.process.pid}) is stopped and {why}; killing it")
    entry.process.kill()
    entry.process.wait()


def process_stopped(pid):
    """Whether process `pid` is stopped (state T in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class Job:
    def __init__(self, args):
        self.args = args
        self.ranks = {}  # pid -> Rank, of every attempt's and newcomer's
        self.outputs = []  # the current attempt's
        self.stopping = False  # the signal bpl-run passed on, once one came
        self.stop_to_tell = None  # what bpl-run says of that signal, once the main loop can
        self.store = None
        self.restart = 0
        self.reported = set()  # pids of failed ranks named already (--keep-going)
        self.replaced = set()  # local ranks a newcomer was started for (--replace)
        self.superseded = set()  # pids of the ranks those newcomers replaced: their newcomers' status counts
        self.all_stopped_since = None  # --keep-going: since when every rank left is stopped
        self.store_client = None  # --replace: the job's store, asked whether a stopped rank was counted out
        self.layout = None
        self.filtered = []
        self.launch = None
        self.rendezvous = None  # --rdzv-backend c10d across nodes
        self.attempt = 0  # every start of the ranks: a restart, or the rendezvous forming the job anew

    def start(self):
        args = self.args
        # Only the job's processes may use its store: each gets this secret, and bpl-store admits only them.
        # Across nodes every node's bpl-run needs the same one: the user's, where set.
        if args.max_nodes == 1:
            os.environ.setdefault("BPL_STORE_SECRET", secrets.token_hex(16))
        self.shares = cpu_shares(os.sched_getaffinity(0), args.nproc_per_node) if args.bind_to == "core" else None
        self.layout = LogLayout(args.log_dir, args.rdzv_id)
        logged = any(streams_for(choice, r) != (False, False)
                     for choice in (args.tee, args.redirects) for r in range(args.nproc_per_node))
        if logged or args.stdout_filters or args.stderr_filters:
            self.layout.keep = True
            if self.layout.owned:
                tell(f"bpl-run: logs of the ranks in {self.layout.run_folder}")
        if args.rdzv_backend == "c10d" and args.max_nodes > 1:
            self.rendezvous = C10dRendezvous(args)
        self.place_and_start()

    def place_and_start(self):
        """This node's place in the job (the rendezvous's next round, or the flags'), the job's store where
        this is the first node, and the ranks of this attempt."""
        args = self.args
        if self.rendezvous is not None:
            place = self.rendezvous.join() if self.launch is None else self.rendezvous.next_round()
            node_rank, nnodes, addr, port = place.node_rank, place.nnodes, place.master_addr, place.master_port
            flag = f"MASTER_PORT {port}, which the rendezvous chose"
        else:
            node_rank, nnodes, (addr, port) = args.node_rank, args.max_nodes, args.endpoint
            port = port if port is not None else (self.launch.port if self.launch else free_port(addr, ports_taken()))
            flag = f"--master-port {port}" if args.master_port is not None else (
                f"--rdzv-endpoint {args.rdzv_endpoint}" if args.rdzv_endpoint else f"MASTER_PORT={port}"
                if os.environ.get("MASTER_PORT") else f"port {port}")
        world = args.nproc_per_node * nnodes
        # The first node serves the job's stores at MASTER_PORT (a program's torch.distributed one too, as
        # torchrun's agent does); every node's ranks are told. Each attempt gets a store of its own, as
        # under torchrun (torch's rendezvous keeps no attempt apart in the agent's store).
        if self.store is not None:
            self.close_store()
        if node_rank == 0 and self.store is None:
            if ports_taken() > 1 and busy_port(listen_host(addr), port + NEURON_BOOTSTRAP_OFFSET) is not None:
                raise SystemExit(f"bpl-run: {flag}: the Neuron backend bootstraps its collectives at MASTER_PORT + "
                                 f"{NEURON_BOOTSTRAP_OFFSET}, {port + NEURON_BOOTSTRAP_OFFSET}, which is taken; "
                                 f"choose a port whose next one is free too")
            self.store = store.start(addr, port, command_of(args), flag)
        served = self.store is not None or node_rank > 0
        self.launch = Launch(addr, port, node_rank, nnodes, world, port if served and world > 1 else None, served,
                             command_of(args), self.shares)
        events.record(args, "start", world_size=world, master=f"{addr}:{port}", restart=self.restart)
        self.start_group()

    def start_group(self):
        attempt = self.layout.attempt_folder(self.attempt)
        for filtered in self.filtered:
            filtered.close()
        self.filtered = [FilteredLog(os.path.join(attempt, "filtered_stdout.log"), self.args.stdout_filters),
                         FilteredLog(os.path.join(attempt, "filtered_stderr.log"), self.args.stderr_filters)]
        self.outputs = []
        for local_rank in range(self.args.nproc_per_node):
            self.start_rank(local_rank)

    def start_rank(self, local_rank, newcomer=False):
        args, launch = self.args, self.launch
        rank = launch.node_rank * args.nproc_per_node + local_rank
        attempt = self.attempt + (1 if newcomer else 0)
        error_file = self.layout.error_file(attempt, local_rank)
        env = rank_environment(args, launch, local_rank, self.restart, error_file, newcomer)
        # Bound in the child before it runs, so that every thread it starts inherits the share.
        bind = (lambda share=launch.shares[local_rank]: os.sched_setaffinity(0, share)) if launch.shares else None
        name = f"the newcomer for rank {rank}" if newcomer else f"rank {rank}"
        try:
            process = subprocess.Popen(launch.command, env=env, preexec_fn=bind, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as error:
            self.stop_ranks()
            raise SystemExit(f"bpl-run: cannot start {name}: {launch.command[0]}: {error.strerror}") from None
        self.ranks[process.pid] = Rank(rank, local_rank, process, name, error_file)
        prefix = string.Template(args.log_line_prefix_template).safe_substitute(
            rank=f"{rank}-newcomer" if newcomer else rank, local_rank=local_rank, role_name=args.role,
            hostname=socket.gethostname())
        redirected, teed = streams_for(args.redirects, local_rank), streams_for(args.tee, local_rank)
        shown = args.local_ranks_filter is None or local_rank in args.local_ranks_filter
        streams = ((process.stdout, sys.stdout.buffer, "stdout"), (process.stderr, sys.stderr.buffer, "stderr"))
        for index, (pipe, console, stream) in enumerate(streams):
            to_file = redirected[index] or teed[index]
            path = os.path.join(self.layout.rank_folder(attempt, local_rank), stream + ".log") if to_file else None
            self.outputs.append(RankOutput(rank, pipe, console, prefix, path, shown and not redirected[index],
                                           self.filtered[index]))

    def forward(self, signum, _frame):
        """Passes a signal on to every rank; ranks still running after the grace period are killed. The
        main loop says so (a handler must not take the console's lock, which the loop may hold)."""
        passed_on = 0
        for entry in self.ranks.values():
            if entry.process.poll() is None:
                entry.process.send_signal(signum)
                passed_on += 1
        if self.stopping is False:
            self.stopping = signum
            self.kill_deadline = time.monotonic() + self.args.shutdown_timeout
            self.stop_to_tell = (f"bpl-run: received {signal.Signals(signum).name}; passed it on to the {passed_on} "
                                 f"running rank(s), stopping the job (those still running after --shutdown-timeout "
                                 f"{self.args.shutdown_timeout:g} s are killed)")

    def stop_ranks(self):
        """Stops every rank still running: SIGTERM, then SIGKILL after the grace period."""
        running = [entry.process for entry in self.ranks.values() if entry.process.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self.args.shutdown_timeout
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def drain(self):
        """Waits for the ranks' output to reach the console. A process a rank started may hold it open after
        the rank ended: its lines are carried for the grace period more, then bpl-run goes on, saying so."""
        deadline = time.monotonic() + self.args.shutdown_timeout
        still_open = sorted({output.rank for output in self.outputs if not output.finish(deadline)})
        if still_open:
            tell(f"bpl-run: the output of rank(s) {', '.join(map(str, still_open))} is still open "
                 f"{self.args.shutdown_timeout:g} s after they ended (a process they started holds it); not waiting "
                 "for it")

    def wait(self):
        """Returns the job's exit code once every rank has ended; every line the ranks wrote comes first."""
        code, summary = self.wait_for_ranks()
        self.drain()
        for line in summary:
            tell(line)
        events.record(self.args, "end", exit_code=code)
        return code

    def failure_lines(self, failed):
        """bpl-run's lines on failed ranks: each named with how it ended, and its error file's message."""
        lines = []
        for entry in failed:
            what = describe_exit(entry.process.returncode)[0]
            message = error_message(entry.error_file)
            self.layout.keep = self.layout.keep or message is not None  # the file it names stays
            lines.append(f"bpl-run: {entry.name} (pid {entry.process.pid}) {what}"
                         + (f": {message} (its error file: {entry.error_file})" if message else ""))
        return lines

    def wait_for_ranks(self):
        """(exit code, the lines that tell how the job ended) once every rank has ended."""
        while True:
            if self.stop_to_tell is not None:
                tell(self.stop_to_tell)
                self.stop_to_tell = None
            for entry in self.ranks.values():
                entry.process.poll()
            running = [e for e in self.ranks.values() if e.process.returncode is None]
            failed = [e for e in self.ranks.values()
                      if e.process.returncode not in (None, 0) and e.process.pid not in self.reported]
            if self.store is not None and self.store.unserved is not None and self.stopping is False:
                self.reported.update(self.ranks)  # they end as asked
                self.stop_ranks()
                return 1, [f"bpl-run: a rank's torch.distributed store cannot be served: {self.store.unserved}; "
                           f"stopped the ranks"]
            if failed and self.args.keep_going:
                self.go_on_without(failed, running)
            elif failed and self.stopping is False:  # else: ranks ending because we passed them a signal
                ended = self.ranks_failed(failed, running)
                if ended is not None:
                    return ended
                continue
            elif running and self.rendezvous is not None and self.stopping is False:
                event = self.rendezvous.poll()
                if event is not None:
                    ended = self.round_ended_elsewhere(*event)
                    if ended is not None:
                        return ended
                    continue
            if not any(e.process.returncode is None for e in self.ranks.values()):  # newcomers included
                if self.rendezvous is None or self.stopping is not False:
                    break
                # Every node's ranks end together: a failure elsewhere restarts this node's too.
                elsewhere = self.rendezvous.finish()
                if elsewhere is None:
                    break
                lines = [f"bpl-run: this node's ranks ended well, but {elsewhere[1]}"]
                if self.restart >= self.args.max_restarts:
                    return elsewhere[0], lines
                self.start_again(lines, failed=["elsewhere"])
                continue
            if self.args.replace and self.stopping is False:
                self.kill_counted_out(running)
            if self.args.keep_going and self.stopping is False:
                self.kill_ranks_left_stopped(running)
            if self.stopping is not False and time.monotonic() > self.kill_deadline:
                for entry in running:
                    if entry.process.poll() is None:
                        entry.process.kill()
            time.sleep(self.args.monitor_interval)
        if self.stopping is not False:
            return 128 + int(self.stopping), []
        if self.args.keep_going:
            codes = [e.process.returncode for pid, e in self.ranks.items() if pid not in self.superseded]
            exited = [code for code in codes if code >= 0]
            if any(code != 0 for code in exited):
                return next(code for code in exited if code != 0), []
            return (0 if exited else describe_exit(codes[0])[1]), []
        return 0, []

    def ranks_failed(self, failed, running):
        """Stops the other ranks (every node's, through the rendezvous) and restarts them all while
        --max-restarts allows; else (exit code, lines) of the job's end."""
        # A rank killed by a signal is the cause; ranks that then exited with an error saw it.
        failed.sort(key=lambda e: (e.process.returncode >= 0, e.rank))
        others = len(running)
        self.reported.update(e.process.pid for e in failed)
        code = describe_exit(failed[0].process.returncode)[1]
        lines = self.failure_lines(failed)
        if self.rendezvous is not None:
            self.rendezvous.fail(code, lines[0][len("bpl-run: "):])
        self.stop_ranks()
        if self.restart < self.args.max_restarts:
            self.start_again(lines, failed=[e.rank for e in failed])
            return None
        lines[0] += {0: "", 1: "; stopped the other rank"}.get(others, f"; stopped the {others} other ranks")
        events.record(self.args, "failure", ranks=[e.rank for e in failed])
        return code, lines

    def round_ended_elsewhere(self, code, message):
        """Another node's failure (`code`) or a node waiting to join (None) ends this round: this node's
        ranks stop, and start again in the next round unless the restarts are spent."""
        self.reported.update(self.ranks)  # they end as asked
        self.stop_ranks()
        lines = [f"bpl-run: {message}; stopped this node's {self.args.nproc_per_node} rank(s)"]
        if code is not None and self.restart >= self.args.max_restarts:
            return code, lines
        self.start_again(lines, failed=[] if code is None else ["elsewhere"])
        return None

    def start_again(self, lines, failed):
        """Starts every rank of this node again once every line of theirs is out: a restart after a failure
        (--max-restarts counts it), or the job formed anew to take a node in."""
        self.reported.update(self.ranks)
        self.drain()
        for line in lines:
            tell(line)
        self.attempt += 1
        if failed:
            self.restart += 1
            tell(f"bpl-run: restarting the ranks (restart {self.restart} of {self.args.max_restarts})")
        events.record(self.args, "restart", restart=self.restart, failed=failed)
        self.place_and_start()

    def go_on_without(self, failed, running):
        """--keep-going: names each failed rank, and with --replace starts a newcomer in its place."""
        for entry in failed:
            self.reported.add(entry.process.pid)
            # A newcomer needs members to admit it: on one node, none once every rank has ended.
            members_left = bool(running) or self.launch.nnodes > 1
            replace = (self.args.replace and entry.local_rank not in self.replaced and self.stopping is False
                       and members_left)
            if replace:
                went_on = "; the others go on; starting a newcomer in its place (--replace)"
            elif not members_left:
                went_on = "; no other rank is running" + (", none to admit a newcomer" if self.args.replace else "")
            else:
                went_on = "; the others go on (--keep-going)"
            tell(self.failure_lines([entry])[0] + went_on)
            if replace:
                self.replaced.add(entry.local_rank)
                self.superseded.add(entry.process.pid)
                self.start_rank(entry.local_rank, newcomer=True)

    def kill_counted_out(self, running):
        """--replace: a stopped rank (SIGSTOP) never ends by itself; once the others have counted it out of
        the job (a shrink says so in the job's store), it is killed, and replaced as a rank that failed."""
        stopped = [e for e in running if e.local_rank not in self.replaced and e.process.poll() is None
                   and process_stopped(e.process.pid)]
        if not stopped or self.launch.store_port is None:
            return
        try:
            if self.store_client is None:
                self.store_client = StoreBridge(self.launch.addr, self.launch.store_port, timeout_s=10)
            counted_out = [e for e in stopped if self.store_client.check(counted_out_key(e.process.pid))]
        except RendezvousError as error:  # the store ended: the ranks find that out themselves
            tell(f"bpl-run: cannot ask the job's store whether the stopped ranks were counted out: {error}")
            self.store_client, self.args.replace = None, False
            return
        for entry in counted_out:
            kill_stopped(entry, "the other ranks counted it out of the job")

    def kill_ranks_left_stopped(self, running):
        """--keep-going: once every rank still running is stopped (SIGSTOP: it would never end) and some
        rank has ended, nothing can bring the job on; after the grace period of that, the stopped ones are
        killed, each named, so that bpl-run ends."""
        ended = any(e.process.returncode is not None for e in self.ranks.values())
        left = [e for e in running if e.process.poll() is None]
        if not ended or not left or not all(process_stopped(e.process.pid) for e in left):
            self.all_stopped_since = None
            return
        now = time.monotonic()
        if self.all_stopped_since is None:
            self.all_stopped_since = now
        if now - self.all_stopped_since < self.args.shutdown_timeout:
            return
        for entry in left:
            kill_stopped(entry, "every other rank has ended")

    def close_store(self):
        if self.store_client is not None:
            self.store_client.close()
            self.store_client = None
        if self.store is not None:
            self.store.close(self.args.shutdown_timeout)
            self.store = None

    def close(self):
        self.stop_ranks()  # any left running: bpl-run ends on an error of its own
        for filtered in self.filtered:
            filtered.close()
        self.close_store()
        if self.rendezvous is not None:
            self.rendezvous.close()
        if self.layout is not None:
            self.layout.close()
