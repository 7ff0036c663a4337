"""--event-log-handler console: the job's events (start, restart, failure, end), one JSON object a line on
stderr, as torchrun's console handler writes its own; null (the default) records none."""

import json
import socket
import time

from .output import tell


def record(args, name, **fields):
    if args.event_log_handler != "console":
        return
    event = {"name": f"bpl-run.{name}", "source": "AGENT", "timestamp": int(time.time() * 1000),
             "metadata": {"run_id": args.rdzv_id, "role": args.role, "group_rank": args.node_rank,
                          "hostname": socket.gethostname(), **fields}}
    tell(json.dumps(event))
