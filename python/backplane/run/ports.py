"""The job's ports: MASTER_PORT (the program's own torch.distributed store), MASTER_PORT + 1 (the neuron
backend's bootstrap) and MASTER_PORT + 2, where bpl-store serves backplane's store beside the ranks."""

import random
import socket
import subprocess
import threading

from .. import _tree

STORE_OFFSET = 2  # bpl-store's port, after the program's and the neuron backend's


def ephemeral_port_floor():
    """The lowest port the kernel hands to outgoing connections (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def listen_host(host):
    return "127.0.0.1" if host == "localhost" else host


def free_port(host):
    """A port free on `host` whose two successors are free too, below the ephemeral range: a port that
    bind(0) offers comes from the range outgoing connections take theirs from, so with other jobs running
    it may be some connection's by the time the ranks listen on it."""
    floor = ephemeral_port_floor()
    chooser = random.SystemRandom()
    for _ in range(200 if floor > 10001 else 0):
        port = chooser.randrange(10000, floor - STORE_OFFSET)
        if busy_port(listen_host(host), port) is None:
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # no room below the range
        probe.bind((listen_host(host), 0))
        return probe.getsockname()[1]


def busy_port(host, port):
    """The first of port..port+2 that cannot be bound on `host`, else None."""
    probes = []
    try:
        for offset in range(STORE_OFFSET + 1):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probes.append(probe)
            try:
                probe.bind((host, port + offset))
            except OSError:
                return port + offset
        return None
    finally:
        for probe in probes:
            probe.close()


def start_store(port, master_flag, deadline_s=30.0):
    """Starts bpl-store on `port` and returns it once it listens; None where the build has none (no gloo
    backend: rank 0 then serves the store). It ends with bpl-run, however bpl-run ends (the kernel tells
    it). `master_flag` names where MASTER_PORT came from, for the message when the port is taken."""
    program = _tree.helper_program("bpl-store")
    if program is None:
        return None
    store = subprocess.Popen([program, "--port", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    ready = []
    reader = threading.Thread(target=lambda: ready.append(store.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=deadline_s)
    if not ready or not ready[0].startswith(b"bpl-store: listening"):
        store.kill()
        error = store.stderr.read().decode(errors="replace").strip() if store.wait() is not None else ""
        raise SystemExit(f"bpl-run: {master_flag}: the job's store takes port {port} (MASTER_PORT + {STORE_OFFSET}), "
                         f"and cannot serve there: {error or 'bpl-store did not start'}; choose a port whose next "
                         f"{STORE_OFFSET} are free too")
    return store
