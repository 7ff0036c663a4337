"""Where a job's files go, as torchrun lays them out: <log-dir>/<rdzv-id>_<unique>/attempt_<restart>/
<local rank>/{stdout.log, stderr.log, error.json}, and filtered_stdout.log, filtered_stderr.log beside
the ranks' folders; and what a failed rank's error.json (torch's @record writes it) says."""

import json
import os
import shutil
import tempfile


class LogLayout:
    def __init__(self, log_dir, run_id):
        # Without --log-dir the error files still need a home; it goes with bpl-run unless logs were asked for.
        self.owned = log_dir is None
        root = log_dir or tempfile.mkdtemp(prefix="bpl-run-")
        os.makedirs(root, exist_ok=True)
        self.root = root
        self.run_folder = tempfile.mkdtemp(prefix=f"{run_id}_", dir=root)
        self.keep = not self.owned

    def attempt_folder(self, restart):
        folder = os.path.join(self.run_folder, f"attempt_{restart}")
        os.makedirs(folder, exist_ok=True)
        return folder

    def rank_folder(self, restart, local_rank):
        folder = os.path.join(self.attempt_folder(restart), str(local_rank))
        os.makedirs(folder, exist_ok=True)
        return folder

    def error_file(self, restart, local_rank):
        path = os.path.join(self.rank_folder(restart, local_rank), "error.json")
        if os.path.exists(path):  # a newcomer's attempt folder is reused: no stale error of another process
            os.unlink(path)
        return path

    def close(self):
        if self.owned and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def error_message(path):
    """The first line of the error a rank's @record wrote to `path`, or None where it wrote none."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    return message.strip().splitlines()[-1] if message.startswith("Traceback") else message.strip().splitlines()[0]
