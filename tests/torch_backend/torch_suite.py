"""PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py, the one
PyTorch runs for its backends) pointed at a backend, and compared with torch's Gloo.

    .venv/bin/python tests/torch_backend/torch_suite.py [--world N] [--backends backplane,gloo] [-k PATTERN ...]
    .venv/bin/python tests/torch_backend/torch_suite.py --ci [--world N]

Each backend's run spawns WORLD ranks per test, as PyTorch's own spawn runner does, meeting through a
file:// store. With both backends, it lists every test that passes on gloo but not on backplane, and
exits non-zero if there is one that is not an exception (EXCEPTIONS, with its reason). With --ci, CI's
selection runs on backplane alone. PYTHONPATH must reach backplane_torch (build/python).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# A test's header: its name and class, then " ... " (after the first line of its docstring, if it has one).
HEADER = re.compile(r"^(test_\w+) \(__main__\.\w+\.\w+\)(?:\n.*?)? \.\.\. ", re.M)
OUTCOME = re.compile(r"(?:^| )(ok|FAIL|ERROR|skipped|expected failure)\b[^\n]*$", re.M)


def outcomes_of(text):
    """{test: outcome} from unittest's verbose output, whose outcome words come after what the ranks
    logged meanwhile: the last outcome between a test's header and the next one's."""
    headers = list(HEADER.finditer(text))
    outcomes = {}
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        found = OUTCOME.findall(text, header.end() - 1, end)  # from the space before a same-line outcome
        outcomes[header.group(1)] = found[-1] if found else "unknown"
    return outcomes


class PointedAsGloo(str):
    """A backend's name that the suite's questions "is this gloo?" answer yes to (as a CPU backend it
    gets gloo's tests and gloo's expectations), while init_process_group and new_group, which take it
    as a string, make groups of this backend."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


if os.environ.get("BPL_TORCH_SUITE"):
    # The suite's process and the ranks it spawns (which import this file again): its test class,
    # defined here at the top, where the ranks find it.
    backend = os.environ["BACKEND"]
    if backend != "gloo":
        # The suite chooses many tests that any CPU backend can pass for "gloo" alone, by name, as it
        # decorates them and again as they run (CPU paths written for "gloo or mpi"). It is pointed at
        # another backend the way it is at gloo: gloo's tests are chosen, then run on this backend.
        import backplane_torch  # noqa: F401  (registers the backend)
        os.environ["BACKEND"] = "gloo"
    from torch.testing._internal.common_utils import run_tests
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend
    os.environ["BACKEND"] = backend
    distributed_test.BACKEND = PointedAsGloo(backend) if backend != "gloo" else backend
    # The suite checks the profiler's events only for the backends it lists, by dist.get_backend()'s name.
    for listed in (distributed_test.PROFILING_SUPPORTED_BACKENDS, distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
        if backend not in listed:
            listed.append(backend)

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


# Tests that pass on gloo and cannot on another backend, and why.
EXCEPTIONS = {
    "test_ddp_logging_data_cpu": "torch's ProcessGroup names every backend it does not know 'custom' "
                                 "(ProcessGroup::getBackendName), and DDP's logging records that name",
}

# What CI runs (--ci), on backplane alone, each test by name: every operation, groups, DDP and error
# handling; each passes on gloo (a full run with both backends shows it), and must pass here.
CI_SELECTION = [
    # operations
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_coalesced_sum", "test_all_reduce_product",
    "test_all_reduce_complex_unsupported_ops", "test_sparse_all_reduce_sum", "test_reduce_sum", "test_broadcast",
    "test_all_gather", "test_all_gather_coalesced_simple", "test_gather", "test_scatter", "test_scatter_checks",
    "test_barrier", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_all_gather_object_subgroup", "test_scatter_object_list",
    # groups
    "test_all_reduce_full_group_sum", "test_get_rank_size_group", "test_destroy_group", "test_barrier_full_group",
    # DDP
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_hook", "test_get_future",
    "test_ddp_create_graph",
    # error handling
    "test_barrier_timeout_global", "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_rank_0_timeout",
]


def run(backend, world, patterns, names=()):
    """{test: outcome} of one backend's run: the tests whose names contain a pattern, or those named."""
    temp = tempfile.mkdtemp(prefix=f"bpl-suite-{backend}-")
    env = dict(os.environ, BPL_TORCH_SUITE="1", BACKEND=backend, WORLD_SIZE=str(world), TEMP_DIR=temp,
               INIT_METHOD="file://" + os.path.join(temp, "init_file"))
    # CI set (any value) makes the suite run as PyTorch's own CI: XML reports through a package the
    # project does not install, and other tests skipped. The same suite runs here, on a CI machine or not.
    env.pop("CI", None)
    command = [sys.executable, os.path.abspath(__file__), "-v"] + [arg for p in patterns for arg in ("-k", p)]
    command += [f"TestDistBackendWithSpawn.{name}" for name in names]
    output = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False).stdout
    text = output.decode(errors="replace")
    with open(os.path.join(temp, "output.log"), "w") as log:
        log.write(text)
    outcomes = outcomes_of(text)
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("ok", "FAIL", "ERROR", "skipped")}
    print(f"{backend} at {world} ranks: {counts} (log: {temp}/output.log)", flush=True)
    if not outcomes:
        print(f"no test of the suite ran on {backend}; its output ends:\n" + "\n".join(text.splitlines()[-25:]), flush=True)
    return outcomes


def main():
    if os.environ.get("BPL_TORCH_SUITE"):
        return run_tests()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backends", default="backplane,gloo")
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run the tests whose names contain PATTERN (unittest's -k; may be repeated)")
    parser.add_argument("--ci", action="store_true", help="run CI's selection on backplane; each must pass")
    args = parser.parse_args()
    if args.ci:
        outcomes = run("backplane", args.world, [], CI_SELECTION)
        failed = [t for t in CI_SELECTION if outcomes.get(t) != "ok"]
        for test in failed:
            print(f"did not pass on backplane ({outcomes.get(test, 'not run')}): {test}")
        print(f"{len(CI_SELECTION) - len(failed)} of CI's {len(CI_SELECTION)} tests passed on backplane at {args.world} ranks")
        return 1 if failed else 0
    results = {b: run(b, args.world, args.patterns) for b in args.backends.split(",")}
    if "gloo" not in results or "backplane" not in results:
        return 0
    behind = sorted(t for t, o in results["gloo"].items() if o == "ok" and results["backplane"].get(t) != "ok")
    for test in behind:
        reason = f" (an exception: {EXCEPTIONS[test]})" if test in EXCEPTIONS else ""
        print(f"passes on gloo, not on backplane ({results['backplane'].get(test, 'not run')}): {test}{reason}")
    unexplained = [t for t in behind if t not in EXCEPTIONS]
    print(f"{len(behind)} test(s) pass on gloo and not on backplane, {len(unexplained)} of them not an exception")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
