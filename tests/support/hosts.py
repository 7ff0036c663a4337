#!/usr/bin/env python3
"""Test hosts: machines of their own on this one, for multi-node tests.

Each host is a set of namespaces held by an anchor process: its own network stack (a veth on a bridge,
an address in 198.18.0.0/24 -- 198.18.0.0/15 is set aside for network tests --, loopback up), host name
(UTS), System V IPC, mount namespace (a private tmpfs on /dev/shm and its own /etc/hosts naming every
test host) and process table (PID namespace). backplane takes two of them for two machines: different
host names and process spaces, no shared memory between them, only the network.

The bridge lives in a namespace of its own, so nothing is added to the root namespace: removing the
namespaces removes every interface, and killing a host's anchor (the init of its PID namespace) ends
every process started in it. Both happen in close(), also when a test fails (use `with`).

    with TestHosts(2) as hosts:
        hosts.run(0, ["hostname"])                   # CompletedProcess, in host 0
        p = hosts.start(1, ["sleep", "1"])           # Popen, in host 1
        hosts.set_link(1, up=False)                  # a partition: no RST, no FIN
        hosts.address(0)                             # "198.18.0.1"

Command line: hosts.py N [--first] -- COMMAND... (USAGE below): COMMAND in each of N hosts at once,
or in host 0 reaching the others as across machines (a host file, a launch agent); HOST_INDEX set.
Exits 77 (skipped), saying why, where namespaces cannot be made (not root, no permission).
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SUBNET = "198.18.0"
INTERFACE = "eth0"
SKIPPED = 77  # ctest's SKIP_RETURN_CODE


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _die_with_parent():
    """In a child before exec: SIGKILL when this process ends, however it ends (a test killed at its
    timeout leaves no host running)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def remove_abandoned_hosts():
    """Removes the namespaces of test hosts whose creating process has ended (killed before close())."""
    listed = _ip("netns", "list", check=False).stdout.split()
    for name in listed:
        if not name.startswith("bpl") or "-" not in name:
            continue
        creator = name[3:name.index("-")]
        if creator.isdigit() and not os.path.exists(f"/proc/{creator}"):
            _ip("netns", "del", name, check=False)


def why_hosts_cannot_be_made():
    """None where this process can make test hosts; else the reason."""
    if os.geteuid() != 0:
        return "test hosts need root (network, UTS, IPC, mount and PID namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if not shutil.which(tool):
            return f"'{tool}' is not installed (iproute2, util-linux)"
    probe = f"bplprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return "cannot make a network namespace: " + made.stderr.strip()
    _ip("netns", "del", probe, check=False)
    return None


# A test host's init: reaps every process orphaned in the host (as a machine's init does; a launcher
# that dies leaves its ranks to it) until it is killed, which ends the host.
INIT = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    signal.sigwaitinfo({signal.SIGCHLD})
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
"""


class TestHosts:
    def __init__(self, count, name=None):
        self.count = count
        self.name = name or f"bpl{os.getpid()}"
        self._anchors = []
        self._namespaces = []
        self._hosts_file = None
        self._started = []  # (host, Popen of the nsenter that started a command there)

    def host(self, i):
        return f"{self.name}-h{i}"

    def address(self, i):
        return f"{SUBNET}.{i + 1}"

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _make(self):
        remove_abandoned_hosts()
        bridge = f"{self.name}-br"
        _ip("netns", "add", bridge)
        self._namespaces.append(bridge)
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        with tempfile.NamedTemporaryFile("w", prefix="bpl-hosts-", delete=False) as hosts_file:
            hosts_file.write("127.0.0.1 localhost\n")
            for i in range(self.count):
                hosts_file.write(f"{self.address(i)} {self.host(i)}\n")
        self._hosts_file = hosts_file.name
        os.chmod(self._hosts_file, 0o644)
        for i in range(self.count):
            ns = self.host(i)
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
            _ip("-n", bridge, "link", "add", f"v{i}", "type", "veth", "peer", "name", INTERFACE, "netns", ns)
            _ip("-n", bridge, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", bridge, "link", "set", f"v{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", INTERFACE)
            _ip("-n", ns, "link", "set", INTERFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # The anchor: PID 1 of the host's PID namespace, in its own UTS, IPC and mount namespaces,
            # reaping what is orphaned there as a machine's init does.
            setup = (f"hostname {self.host(i)} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
                     f"mount --bind {self._hosts_file} /etc/hosts && echo ready && "
                     f"exec {shlex.quote(sys.executable)} -c {shlex.quote(INIT)}")
            anchor = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--uts", "--ipc", "--mount", "--pid", "--fork",
                 "--mount-proc", "--kill-child", "sh", "-c", setup],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
            self._anchors.append(anchor)
            if anchor.stdout.readline().strip() != "ready":
                raise RuntimeError(f"test host {ns} did not start: {anchor.stderr.read()}")
        # Each host's interface reaches every other (the bridge forwards once its ports are up).
        for i in range(self.count):
            for j in range(self.count):
                if i != j:
                    self._wait_for_reach(i, j)

    def _wait_for_reach(self, i, j, seconds=10):
        # A connection to a closed port of host j refused (its kernel answered) means j is reachable.
        probe = ("import socket, sys\n"
                 "s = socket.socket(); s.settimeout(1)\n"
                 "try: s.connect((sys.argv[1], 9))\n"
                 "except ConnectionRefusedError: sys.exit(0)\n"
                 "except OSError: sys.exit(1)\n")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            reached = subprocess.run(["ip", "netns", "exec", self.host(i), sys.executable, "-c", probe, self.address(j)],
                                     capture_output=True)
            if reached.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"test host {i} cannot reach {self.address(j)}")

    def _anchor_pid(self, i):
        """The pid (in this namespace) of host i's init: the child of its unshare."""
        unshare = self._anchors[i].pid  # `ip netns exec` execs unshare in place
        with open(f"/proc/{unshare}/task/{unshare}/children") as children:
            return int(children.read().split()[0])

    def command(self, i, argv):
        """argv run in host i: every one of its namespaces entered (nsenter forks into its PID namespace)."""
        return ["nsenter", "--target", str(self._anchor_pid(i)), "--net", "--uts", "--ipc", "--mount", "--pid",
                f"--wd={os.getcwd()}", "--", *argv]

    def start(self, i, argv, env=None, **popen):
        environment = dict(os.environ if env is None else env)
        environment["HOST_INDEX"] = str(i)
        process = subprocess.Popen(self.command(i, argv), env=environment, **popen)
        self._started.append((i, process))
        return process

    def run(self, i, argv, env=None, timeout=120):
        return subprocess.run(self.command(i, argv), env=dict(os.environ if env is None else env, HOST_INDEX=str(i)),
                              capture_output=True, text=True, timeout=timeout)

    def serve_launches(self):
        """Lets programs in the hosts start commands in other hosts, as ssh would between machines:
        hosts_agent.py HOST COMMAND... (mpirun's launch agent, plm_rsh_agent) asks this process, over a
        Unix socket named by $BPL_HOSTS_RELAY (set here for what starts after), to run COMMAND in HOST with
        the agent's own stdin, stdout and stderr, and exits with its status."""
        path = os.path.join(tempfile.gettempdir(), f"{self.name}-relay.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(16)
        self._relay_path = path
        os.environ["BPL_HOSTS_RELAY"] = path
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            request = json.loads(message)
            index = int(request["host"].rsplit("-h", 1)[1])
            process = subprocess.Popen(self.command(index, ["sh", "-c", request["command"]]), stdin=fds[0], stdout=fds[1],
                                       stderr=fds[2], env=request["env"])
            for fd in fds:
                os.close(fd)

            def report(process=process, connection=connection):
                process.wait()
                try:
                    connection.sendall(str(process.returncode).encode())
                except OSError:
                    pass  # the agent is gone (its launcher ended first)
                finally:
                    connection.close()
            threading.Thread(target=report, daemon=True).start()

    def set_link(self, i, up):
        """Host i's link at the bridge up or down: down is a partition (packets dropped, nobody told)."""
        _ip("-n", f"{self.name}-br", "link", "set", f"v{i}", "up" if up else "down")

    def processes(self, i):
        """'PID STAT COMMAND' of every process in host i but its init (and the ps that looks)."""
        listed = self.run(i, ["ps", "-e", "-o", "pid=,stat=,comm="]).stdout.splitlines()
        return [line.strip() for line in listed if line.split()[0] != "1" and line.split()[-1] != "ps"]

    def signal_host(self, i, signal_name):
        """Sends SIGname to every process of host i but its init (the anchor): STOP leaves its kernel
        answering, as a machine whose processes hang does. CONT also continues the nsenter of each
        command start() ran there, outside the host: it stops itself when its child stops."""
        self.run(i, ["kill", f"-{signal_name}", "-1"])
        if signal_name == "CONT":
            for host, process in self._started:
                if host == i and process.poll() is None:
                    process.send_signal(signal.SIGCONT)

    def kill_host(self, i):
        """SIGKILLs every process of host i (its anchor, the init of its PID namespace, takes them along):
        their sockets are closed by the kernel. The host's network stays."""
        if i < len(self._anchors) and self._anchors[i].poll() is None:
            try:
                os.kill(self._anchor_pid(i), signal.SIGKILL)
            except (OSError, IndexError, ValueError):
                pass
            self._anchors[i].wait(timeout=10)

    def close(self):
        if getattr(self, "_listener", None):
            self._listener.close()
            os.unlink(self._relay_path)
            self._listener = None
        for i in range(len(self._anchors)):
            self.kill_host(i)
            if self._anchors[i].poll() is None:
                self._anchors[i].kill()
                self._anchors[i].wait()
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)
        self._namespaces = []
        self._anchors = []
        if self._hosts_file:
            os.unlink(self._hosts_file)
            self._hosts_file = None


USAGE = """usage: hosts.py N [--first] -- COMMAND...
  runs COMMAND in each of N test hosts at once ({host}, {index}, {address} replaced in each) and prints
  each host's output; with --first, in host 0 only, its output straight through, with the launch relay
  served so that {agent} HOST CMD (hosts_agent.py) runs CMD in any host, and {hostfile} an Open MPI host
  file naming the hosts (8 slots each). Exits with the largest exit status."""


def main(argv):
    first = argv[1:2] == ["--first"]
    if first:
        argv = argv[:1] + argv[2:]
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    count = int(argv[0])
    reason = why_hosts_cannot_be_made()
    if reason:
        print(f"hosts.py: skipped: {reason}")
        return SKIPPED
    template = argv[2:]
    agent = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts_agent.py")
    with TestHosts(count) as hosts, tempfile.NamedTemporaryFile("w", prefix="bpl-hostfile-", suffix=".txt") as hostfile:
        hostfile.write("".join(f"{hosts.host(i)} slots=8\n" for i in range(count)))
        hostfile.flush()

        def words(i):
            return [w.format(host=hosts.host(i), index=i, address=hosts.address(i), hostfile=hostfile.name, agent=agent)
                    for w in template]
        if first:
            hosts.serve_launches()
            status = hosts.start(0, words(0)).wait()
            return status if status >= 0 else 128 - status
        procs = [hosts.start(i, words(i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(count)]
        status = 0
        for i, p in enumerate(procs):
            out, _ = p.communicate()
            print(f"--- host {i} ({hosts.address(i)}), exit {p.returncode}\n{out}", end="")
            status = max(status, p.returncode if p.returncode >= 0 else 128 - p.returncode)
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
