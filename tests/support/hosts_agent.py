#!/usr/bin/env python3
"""A launch agent between test hosts, as ssh is between machines (mpirun's plm_rsh_agent):

    hosts_agent.py HOST COMMAND...

runs COMMAND (through sh, as ssh does) in test host HOST, with this process's stdin, stdout and stderr,
by asking the process that made the hosts (TestHosts.serve_launches, at $BPL_HOSTS_RELAY); exits with
COMMAND's status.
"""
import json
import os
import socket
import sys

if len(sys.argv) < 3 or "BPL_HOSTS_RELAY" not in os.environ:
    print(__doc__, file=sys.stderr)
    sys.exit(2)
relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
relay.connect(os.environ["BPL_HOSTS_RELAY"])
request = {"host": sys.argv[1], "command": " ".join(sys.argv[2:]), "env": dict(os.environ)}
socket.send_fds(relay, [json.dumps(request).encode()], [0, 1, 2])
status = relay.recv(16)
sys.exit(int(status) if status else 255)
