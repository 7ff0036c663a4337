"""--rdzv-backend c10d across nodes: bpl-run's agents meet at --rdzv-endpoint in rounds, as torchrun's do.

The agent on the endpoint's host serves the rendezvous store there (bpl-store --port); every agent
reaches it through bpl-store --client, the same client the ranks use. A round closes once --nnodes'
maximum has joined, or its minimum has and --rdzv-conf last_call_timeout (30 s) has passed since; nodes
take their places in the order they joined, and the first node's agent chooses the job's MASTER_ADDR and
MASTER_PORT. While the ranks run, each agent watches the round: a rank failing on any node, or an agent
ending, stops every node's ranks, and a node waiting to join a round below the maximum re-forms the job
(the next round) to take it in, as torchrun's agents do."""

import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from .. import _tree
from .options import DEFAULT_C10D_PORT
from .output import tell
from .ports import free_port

REPORT_EVERY_S = 5.0
# How long the agent that serves the store waits, after a round that failed, for the others to leave: they
# read the failure within a monitor interval or two.
LEAVE_AFTER_FAILURE_S = 10.0


class RendezvousError(RuntimeError):
    """The rendezvous failed: its store is gone, or the nodes did not come or do not agree."""


@dataclass
class Place:
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int


class StoreBridge:
    """The job's rendezvous store, through a bpl-store --client of bpl-run's own (one request a line)."""

    def __init__(self, host, port, timeout_s):
        program = _tree.helper_program("bpl-store")
        if program is None:
            raise RendezvousError("--rdzv-backend c10d needs bpl-store, which this build lacks (no gloo backend)")
        self.where = f"{host}:{port}"
        self.process = subprocess.Popen([program, "--client", self.where, "--timeout-ms", str(int(timeout_s * 1000))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.lock = threading.Lock()
        if self.process.stdout.readline().strip() != "connected":
            raise RendezvousError(f"the rendezvous store at {self.where} (--rdzv-endpoint): "
                                  f"{self.process.stderr.read().strip() or 'no answer'}")

    def request(self, *words):
        with self.lock:
            try:
                self.process.stdin.write(" ".join(str(w) for w in words) + "\n")
                self.process.stdin.flush()
                reply = self.process.stdout.readline().strip()
            except OSError:
                reply = ""
        if not reply or reply.startswith("error"):
            ended = "" if reply else (self.process.poll() is not None and self.process.stderr.read().strip())
            raise RendezvousError(f"the rendezvous store at {self.where}: {reply[6:] or ended or 'the connection ended'}")
        return reply

    def set(self, key, text):
        self.request("set", key, text.encode().hex())

    def add(self, key, delta):
        return int(self.request("add", key, delta))

    def check(self, key):
        return self.request("check", key) == "1"

    def wait(self, key, seconds):
        return self.request("wait", key, max(1, int(seconds * 1000))) == "1"

    def get(self, key):
        return bytes.fromhex(self.request("get", key)).decode()

    def on_close(self, key, text):
        self.request("on-close", key, text.encode().hex())

    def close(self):
        try:
            self.process.stdin.close()
        except OSError:  # it ended already
            pass
        self.process.wait()


def is_local(host):
    """Whether `host` names an address of this machine (one a socket can be bound to)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except socket.gaierror:
        return False
    for address in addresses:
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
                return True
            except OSError:
                continue
    return False


def reachable_address(host, port, local_addr):
    """This node's address as the others reach it: --local-addr, else the one it reaches the endpoint from."""
    if local_addr:
        return local_addr
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
        route.connect((host, port))  # no packet: it only picks the route
        return route.getsockname()[0]


class C10dRendezvous:
    def __init__(self, args):
        self.args = args
        host, port = args.endpoint
        port = port or DEFAULT_C10D_PORT
        conf = args.rdzv_conf
        self.join_timeout = float(conf.get("join_timeout", conf.get("timeout", 600)))
        self.last_call = float(conf.get("last_call_timeout", 30))
        self.server = None
        hosting = conf.get("is_host", "").lower()
        if hosting in ("1", "true") or (hosting not in ("0", "false") and is_local(host)):
            self.server = self.serve(port)
        self.where = f"{host}:{port}"
        self.store = StoreBridge(host, port, self.join_timeout)
        self.address = reachable_address(host, port, args.local_addr)
        self.prefix = f"rdzv/{args.rdzv_id}/"
        self.round = 0
        self.place = None
        self.has_left = False

    @staticmethod
    def serve(port):
        """bpl-store at the endpoint's port, or None where another agent of this host serves it already."""
        server = subprocess.Popen([_tree.helper_program("bpl-store"), "--port", str(port)], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if server.stdout.readline().startswith("bpl-store: listening"):
            return server
        server.wait()
        return None

    def key(self, name, round_=None):
        return f"{self.prefix}{self.round if round_ is None else round_}/{name}"

    def join(self):
        """This node's place in the next round that takes it."""
        nproc = self.args.nproc_per_node
        while True:
            index = self.store.add(self.key("joined"), 1) - 1
            self.store.set(self.key(f"node/{index}"), f"{self.address} {nproc}")
            size = self.wait_for_close()
            if index < size:
                break
            tell(f"bpl-run: the rendezvous's round {self.round} closed with {size} node(s) before this one joined; "
                 "waiting for the next")
            self.round += 1
        # However this agent ends, the others learn of it; once every node's ranks have ended well (finish),
        # it no longer matters.
        self.store.on_close(self.key("lost"), f"1|the bpl-run agent of node {index} ({socket.gethostname()}) ended")
        others = [self.wait_get(self.key(f"node/{i}")).split() for i in range(size)]
        mismatched = [i for i, (_, n) in enumerate(others) if int(n) != nproc]
        if mismatched:
            raise RendezvousError(f"node {mismatched[0]} starts {others[mismatched[0]][1]} ranks and this one "
                                  f"{nproc}: every node of a job gives the same --nproc-per-node")
        if index == 0:
            self.store.set(self.key("master"), f"{self.address} {free_port(self.address)}")
        master_addr, master_port = self.wait_get(self.key("master")).split()
        self.place = Place(index, size, master_addr, int(master_port))
        self.has_left = False
        tell(f"bpl-run: node {index} of {size} (rendezvous round {self.round} at {self.where}); "
             f"MASTER_ADDR={master_addr} MASTER_PORT={master_port}")
        return self.place

    def next_round(self):
        self.round += 1
        return self.join()

    def wait_get(self, key):
        if not self.store.wait(key, self.join_timeout):
            raise RendezvousError(f"the rendezvous at {self.where}: {key} was not set within {self.join_timeout:g} s "
                                  "(--rdzv-conf join_timeout)")
        return self.store.get(key)

    def wait_for_close(self):
        """The round's number of nodes, once it closes: at --nnodes' maximum, or at its minimum once the
        last call has passed. Says every few seconds how many have joined."""
        started = next_report = time.monotonic()
        minimum_met = None
        while not self.store.wait(self.key("closed"), 0.2):
            now = time.monotonic()
            joined = self.store.add(self.key("joined"), 0)
            if joined >= self.args.min_nodes and minimum_met is None:
                minimum_met = now
            if joined >= self.args.max_nodes or (minimum_met is not None and now - minimum_met >= self.last_call):
                if self.store.add(self.key("closed/claimed"), 1) == 1:  # the first to close it decides its size
                    self.store.set(self.key("closed"), str(min(joined, self.args.max_nodes)))
                continue
            if now - started > self.join_timeout:
                raise RendezvousError(f"the rendezvous at {self.where} (--rdzv-endpoint): {joined} node(s) joined in "
                                      f"{self.join_timeout:g} s, and --nnodes {self.args.nnodes} needs at least "
                                      f"{self.args.min_nodes} (--rdzv-conf join_timeout)")
            if now - next_report >= REPORT_EVERY_S:
                tell(f"bpl-run: waiting for nodes at {self.where}: {joined} joined, --nnodes {self.args.nnodes}")
                next_report = now
        return int(self.store.get(self.key("closed")))

    def poll(self):
        """What ends this round from elsewhere: (code, message) of a failure on another node, (None, message)
        for a node waiting to join, or None."""
        for ended in ("failed", "lost"):  # a rank's failure first: its status is the job's
            if self.store.check(self.key(ended)):
                code, _, message = self.store.get(self.key(ended)).partition("|")
                return int(code), message
        if self.place.nnodes < self.args.max_nodes and self.store.add(self.key("joined", self.round + 1), 0) > 0:
            return None, f"a node waits to join the job; forming it anew with every node (--nnodes {self.args.nnodes})"
        return None

    def fail(self, code, message):
        """Tells every node that this round failed here."""
        self.store.set(self.key("failed"), f"{code}|node {self.place.node_rank}: {message}")

    def finish(self):
        """Once this node's ranks have all ended well: waits (the join timeout at most) until every node's
        have, and returns None; or, where one failed first, that failure's (code, message). The agent that
        serves the store leaves last, once every other has left."""
        count = self.store.add(self.key("done"), 1)
        give_up = time.monotonic() + self.join_timeout
        while count < self.place.nnodes and time.monotonic() < give_up:
            failed = self.poll()
            count = self.store.add(self.key("done"), 0)
            # An agent that left once every node was done is "lost" as it goes: not a failure.
            if failed is not None and failed[0] is not None and count < self.place.nnodes:
                return failed
            time.sleep(self.args.monitor_interval)
        self.leave(give_up)
        return None

    def leave(self, give_up=None):
        """Counts this node out of the round, once. The agent that serves the store leaves last: it waits
        until every other has left (until `give_up`, a monotonic time; after a failure,
        LEAVE_AFTER_FAILURE_S), so that no node loses the store before it has read how the round ended."""
        if self.has_left or self.place is None:
            return
        self.has_left = True
        give_up = time.monotonic() + LEAVE_AFTER_FAILURE_S if give_up is None else give_up
        left = self.store.add(self.key("left"), 1)
        while self.server is not None and left < self.place.nnodes and time.monotonic() < give_up:
            time.sleep(self.args.monitor_interval)
            left = self.store.add(self.key("left"), 0)

    def close(self):
        try:
            self.leave()
        except RendezvousError:
            pass  # the store is gone already: no node reads it any more
        self.store.close()
        if self.server is not None:
            self.server.terminate()
            self.server.wait()
