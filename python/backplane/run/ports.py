"""The job's port: MASTER_PORT, where bpl-store serves the job's stores, backplane's and the program's
torch.distributed one (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun), and, where the Neuron
backend may run, MASTER_PORT + 1, where it bootstraps its collectives."""

import glob
import os
import random
import socket
import subprocess
import threading

from .. import _tree

NEURON_BOOTSTRAP_OFFSET = 1


def ports_taken():
    """How many ports from MASTER_PORT on the job takes: 2 where the Neuron backend may run (asked for, or a
    Neuron device is here), else 1."""
    backend = os.environ.get("BPL_BACKEND", "")
    cpu_mode = os.environ.get("NXD_CPU_MODE", "")
    neuron = backend == "neuron" or (not backend and (cpu_mode == "0" or (cpu_mode != "1" and glob.glob("/dev/neuron*"))))
    return NEURON_BOOTSTRAP_OFFSET + 1 if neuron else 1


def ephemeral_port_floor():
    """The lowest port the kernel hands to outgoing connections (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def listen_host(host):
    return "127.0.0.1" if host == "localhost" else host


def free_port(host, count=1):
    """A port free on `host`, with its `count - 1` successors, below the ephemeral range: a port that
    bind(0) offers comes from the range outgoing connections take theirs from, so with other jobs running
    it may be some connection's by the time the ranks listen on it."""
    floor = ephemeral_port_floor()
    chooser = random.SystemRandom()
    for _ in range(200 if floor > 10000 + count else 0):
        port = chooser.randrange(10000, floor - count + 1)
        if busy_port(listen_host(host), port, count) is None:
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # no room below the range
        probe.bind((listen_host(host), 0))
        return probe.getsockname()[1]


def busy_port(host, port, count=1):
    """The first of port..port+count-1 that cannot be bound on `host`, else None."""
    probes = []
    try:
        for offset in range(count):
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
    backend: rank 0 then serves backplane's store, and the program its own). It serves torch.distributed's
    clients too, through the torch store module and the torch of this interpreter's environment, loaded
    only when one connects. It ends with bpl-run, however bpl-run ends (the kernel tells it).
    `master_flag` names where MASTER_PORT came from, for the message when the port is taken."""
    program = _tree.helper_program("bpl-store")
    if program is None:
        return None
    command = [program, "--port", str(port)]
    torch_module = _tree.side_module("libbpl-torch-store.so")
    if torch_module is not None:
        command += ["--torch-store-module", torch_module]
    env = dict(os.environ)
    torch = _tree.environments_torch() if not env.get("BPL_TORCH_DIR") else None
    if torch is not None:
        env["BPL_TORCH_DIR"] = torch
    store = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    ready = []
    reader = threading.Thread(target=lambda: ready.append(store.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=deadline_s)
    if not ready or not ready[0].startswith(b"bpl-store: listening"):
        store.kill()
        error = store.stderr.read().decode(errors="replace").strip() if store.wait() is not None else ""
        raise SystemExit(f"bpl-run: {master_flag}: the job's store serves at MASTER_PORT, and cannot serve there: "
                         f"{error or 'bpl-store did not start'}")
    threading.Thread(target=lambda: relay_lines(store.stderr), daemon=True).start()
    return store


def relay_lines(stream):
    """bpl-store's word after it started (a torch client it cannot serve), on bpl-run's stderr."""
    for line in stream:
        os.write(2, line)
