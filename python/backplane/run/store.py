"""The job's store: bpl-store on the first node, at MASTER_PORT, serving backplane's store and the program's
torch.distributed store (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun's agent). Its torch side
runs torch's own TCPStore through the torch of the ranks' Python, found here, and started only when a
torch client connects; a torch client it cannot serve ends the job, saying why."""

import os
import re
import shutil
import subprocess
import sys
import threading

from .. import _tree

FIND_TORCH = ("import importlib.util as u; s = u.find_spec('torch'); "
              "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')")
PYTHON_NAME = re.compile(r"python[0-9.]*")
UNSERVED = "bpl-store: a torch.distributed client connected, but "


def programs_python(command):
    """The Python the ranks run: the command's interpreter, or the one its script's #! line names; None
    for a program of another kind."""
    executable = shutil.which(command[0]) or command[0]
    if PYTHON_NAME.fullmatch(os.path.basename(executable)):
        return executable
    try:
        with open(executable, "rb") as program:
            first = program.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
    interpreter = shutil.which(words[0]) if words else None
    return interpreter if interpreter and PYTHON_NAME.fullmatch(os.path.basename(interpreter)) else None


def ranks_torch(command):
    """The folder of the torch the ranks import (BPL_TORCH_DIR for the torch side): the set one, their
    Python's (asked once), else this interpreter's; None where none has torch."""
    if os.environ.get("BPL_TORCH_DIR"):
        return os.environ["BPL_TORCH_DIR"]
    python = programs_python(command)
    if python is not None and os.path.abspath(python) != os.path.abspath(sys.executable):
        try:
            asked = subprocess.run([python, "-c", FIND_TORCH], capture_output=True, text=True, timeout=60)
            if asked.returncode == 0 and asked.stdout.strip():
                return asked.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return _tree.environments_torch()


class JobStore:
    """bpl-store serving at `port` once constructed; `unserved` is set (the reason) if a torch client came
    that it could not serve. None of it where the build has no bpl-store (no gloo backend: rank 0 then
    serves backplane's store; see start)."""

    def __init__(self, program, addr, port, command, master_flag, deadline_s=30.0):
        arguments = [program, "--host", addr, "--port", str(port)]
        torch_module = _tree.side_module("libbpl-torch-store.so")
        if torch_module is not None:
            arguments += ["--torch-store-module", torch_module]
        env = dict(os.environ)
        torch = ranks_torch(command)
        if torch is not None:
            env["BPL_TORCH_DIR"] = torch
        self.unserved = None
        self.process = subprocess.Popen(arguments, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env)
        ready = []
        reader = threading.Thread(target=lambda: ready.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=deadline_s)
        if not ready or not ready[0].startswith(b"bpl-store: listening"):
            self.process.kill()
            error = self.process.stderr.read().decode(errors="replace").strip() if self.process.wait() is not None else ""
            raise SystemExit(f"bpl-run: {master_flag}: the job's store serves at MASTER_PORT, and cannot serve there: "
                             f"{error or 'bpl-store did not start'}")
        threading.Thread(target=self.relay_words, daemon=True).start()

    def relay_words(self):
        """bpl-store's word after it started, on bpl-run's stderr; a torch client unserved is the job's end."""
        for line in self.process.stderr:
            text = line.decode(errors="replace").rstrip()
            if text.startswith(UNSERVED) and self.unserved is None:
                self.unserved = text[len(UNSERVED):]
            else:
                os.write(2, line)

    def close(self, timeout_s):
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(addr, port, command, master_flag):
    """The job's store at addr:`port`, or None where this build has no bpl-store."""
    program = _tree.helper_program("bpl-store")
    return JobStore(program, addr, port, command, master_flag) if program is not None else None
