"""The job's ports: MASTER_PORT, where bpl-store serves the job's stores (store.py), and, where the Neuron
backend may run, MASTER_PORT + 1, where it bootstraps its collectives."""

import glob
import os
import random
import socket

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
