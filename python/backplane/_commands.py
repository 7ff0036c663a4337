"""The commands a pip install puts on PATH (pyproject.toml's [project.scripts]): each runs the tool of the
same name in the package's bin/, the Python ones with the Python of this environment."""

import os
import sys

from . import _tree


def _run(name):
    root = _tree.prefix()
    tool = os.path.join(root, "bin", name) if root else None
    if tool is None or not os.path.exists(tool):
        sys.exit(f"{name}: not installed with this backplane ({_tree._HERE})")
    with open(tool, "rb") as f:
        first_line = f.readline()
    is_python = first_line.startswith(b"#!") and b"python" in first_line
    argv = [sys.executable, tool] if is_python else [tool]
    os.execv(argv[0], argv + sys.argv[1:])


def bpl_run():
    _run("bpl-run")


def bpl_info():
    _run("bpl-info")


def bpl_trace():
    _run("bpl-trace")


def bpl_cache():
    _run("bpl-cache")


def bpl_bench_compare():
    _run("bpl-bench-compare")


def bpl_bench_torch():
    _run("bpl-bench-torch")
