#!/usr/bin/env python3
"""bpl-bench-compare on a tiny sweep: every backend built here runs, and the JSON, the table and the plot
hold a median for every operation and size, through backplane and through the raw library.

    bench_compare_test.py BIN_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SIZES = [4, 64, 1024]
OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "pingpong"]
failures = []
PEER_BINARIES = {"mpich": "bpl-bench-peer-mpich", "impi": "bpl-bench-peer-mpich", "openmpi5": "bpl-bench-peer-openmpi5",
                 "oneccl": "bpl-bench-peer-oneccl"}
PEER_LIBRARIES = {"mpich": "MPICH", "impi": "Intel(R) MPI", "openmpi5": "Open MPI v5", "oneccl": "oneCCL"}


def expect(condition, message):
    if not condition:
        failures.append(message)


def expected_sizes(op):
    # f32 on 2 ranks: ops that split the buffer over ranks need at least one element per rank
    return [s for s in SIZES if op not in ("allgather", "reduce_scatter", "alltoall") or s >= 8]


def load_processes():
    """Pids of busy processes of bpl-bench-compare --load that are running (their marker in argv)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"bpl-bench-load" in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def under_load():
    """--load 2: the busy processes run during the run (seen from a rank's side: the machine's load
    shows them) and none is left after it; the table says the run was under load."""
    bin_dir = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        # (no peer: none is where --peers-dir says, and each is said to be left out, with why)
        command = [os.path.join(bin_dir, "bpl-bench-compare"), "--out", out, "--backends", "gloo", "--load", "2",
                   "--peers-dir", os.path.join(out, "none"), "--",
                   "--dtypes=f32", "--max-bytes=64", "--step-factor=16", "--repetitions=1", "--max-iterations=5",
                   "--ops=allreduce"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = 0
        while process.poll() is None:
            seen = max(seen, len(load_processes()))
            time.sleep(0.05)
        output = process.stdout.read()
        expect(process.returncode == 0, f"--load 2 run failed ({process.returncode}): {output}")
        expect(seen == 2, f"--load 2 ran {seen} busy processes")
        expect(load_processes() == [], "busy processes were left running after --load")
        with open(os.path.join(out, "collectives.md")) as f:
            table = f.read()
        expect("Under load: 2 busy processes" in table, "the table says the run was under load")
        expect("alternating" in table, "the repetitions alternate (--interleave)")
        for peer in PEER_LIBRARIES:
            expect(f"peer {peer} " in output and f"skipped: not installed: no {os.path.join(out, 'none', peer)} " in output,
                   f"--peers-dir without peers: {peer} is said to be left out, and why: {output}")
    expect(subprocess.run([os.path.join(bin_dir, "bpl-bench-compare"), "--load", "-1"], capture_output=True).returncode
           != 0, "--load -1 is refused")
    with tempfile.TemporaryDirectory() as out:
        unknown = subprocess.run([os.path.join(bin_dir, "bpl-bench-compare"), "--backends", "foo", "--out", out],
                                 capture_output=True, text=True)
    expect(unknown.returncode == 2 and "'foo'" in unknown.stderr, f"--backends foo is refused naming it: {unknown}")
    unknown = subprocess.run([os.path.join(bin_dir, "bpl-bench-compare"), "--peers", "mpich,foo"], capture_output=True, text=True)
    expect(unknown.returncode == 2 and "'foo'" in unknown.stderr, f"--peers foo is refused naming it: {unknown}")
    for argv, named in ((["--nproc", "0"], "--nproc 0"), (["--load", "-1"], "--load -1")):
        refused = subprocess.run([os.path.join(bin_dir, "bpl-bench-compare")] + argv, capture_output=True, text=True)
        expect(refused.returncode == 2 and named in refused.stderr, f"bpl-bench-compare refuses {named}: {refused}")
    for flag, named in (("--dtypes=f16", "'f16'"), ("--max-bytes=abc", "--max-bytes=abc"), ("--ops=frob", "'frob'")):
        refused = subprocess.run([os.path.join(bin_dir, "bpl-bench-collectives"), flag, "--no-raw"], capture_output=True,
                                 text=True, env=dict(os.environ, NXD_CPU_MODE="1"))
        expect(refused.returncode == 2 and named in refused.stderr, f"bpl-bench-collectives refuses {flag}: {refused}")
    for tool in ("bpl-bench-dispatch", "bpl-bench-kernels"):
        refused = subprocess.run([os.path.join(bin_dir, tool), "--frobnicate"], capture_output=True, text=True)
        expect(refused.returncode == 2 and "--frobnicate" in refused.stderr, f"{tool} refuses an unknown flag: {refused}")


def copy_model():
    """The "/copy" column: time / model(S) of bench/README.md, the bytes the busiest rank reads and
    writes at the rate memcpy moves them (a copy of X reads X and writes X in X / B). An out-of-place
    allgather of S on n ranks: each rank writes S, reading as much; a scatter: each rank copies S/n; an
    allreduce: each rank reads S and writes S/n reducing its share, then copies the others' (n-1)/n S."""
    sys.path.insert(0, os.path.join(sys.argv[1], "..", "python"))
    from backplane import _bench_tables
    size, copy_gbps, time_s = 64 << 20, 10.0, 0.01
    for n in (2, 4):
        ring = (n - 1) / n
        # (op, its busbw when it takes time_s, the model's time)
        cases = [("allgather", ring * size / time_s / 1e9, size / (copy_gbps * 1e9)),
                 ("scatter", ring * size / time_s / 1e9, size / n / (copy_gbps * 1e9)),
                 ("allreduce", 2 * ring * size / time_s / 1e9, (3 - 1 / n) * size / (2 * copy_gbps * 1e9)),
                 ("pingpong", 2 * size / time_s / 1e9, 2 * size / (copy_gbps * 1e9))]
        for op, busbw, model in cases:
            got = _bench_tables.copy_model_ratio(op, busbw, copy_gbps, n)
            expect(abs(got - time_s / model) < 1e-9, f"{op} on {n} ranks: /copy {got}, expected {time_s / model}")


def asynchronous(backends):
    """--async: backplane's calls post a request and wait for it; raw MPI runs its non-blocking calls
    and MPI_Wait, raw Gloo (which has none) its blocking ones, and the table says which."""
    bin_dir = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        command = [os.path.join(bin_dir, "bpl-bench-compare"), "--out", out, "--backends", ",".join(backends), "--",
                   "--dtypes=f32", "--max-bytes=64", "--step-factor=16", "--repetitions=2", "--max-iterations=5",
                   "--async"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        expect(result.returncode == 0, f"--async run failed ({result.returncode}): {result.stdout}\n{result.stderr}")
        if result.returncode != 0:
            return
        for backend in backends:
            with open(os.path.join(out, f"{backend}.json")) as f:
                results = json.load(f)
            context = results["context"]
            expect(context.get("backplane_calls", "").startswith("asynchronous"), f"{backend}: the calls are asynchronous")
            raw_mode = "non-blocking calls, each waited for at once" if backend == "mpi" else "it has no non-blocking form"
            expect(raw_mode in context.get("raw_library", ""), f"{backend}: raw library's mode: {context.get('raw_library')}")
            measured = {b["run_name"].split("/iterations")[0] for b in results["benchmarks"]}
            for name in ("allreduce/f32/64/backplane", "allreduce/f32/64/raw", "pingpong/f32/64/backplane",
                         "alltoall/f32/64/raw", "reduce/f32/64/backplane", "reduce/f32/64/raw", "barrier/backplane",
                         "barrier/raw"):
                expect(name in measured, f"{backend} --async: {name} not measured")
        with open(os.path.join(out, "collectives.md")) as f:
            expect("backplane's calls: asynchronous" in f.read(), "the table says the calls were asynchronous")


def interleaved(backend):
    """Each point's repetitions alternate, backplane then raw, one run each (no aggregates; the tool
    passes --interleave without being asked); the console and the table give the medians of those runs."""
    bin_dir = sys.argv[1]
    with tempfile.TemporaryDirectory() as out:
        command = [os.path.join(bin_dir, "bpl-bench-compare"), "--out", out, "--backends", backend, "--",
                   "--dtypes=f32", "--ops=allreduce,barrier", "--max-bytes=64", "--step-factor=16", "--repetitions=3",
                   "--max-iterations=5"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        expect(result.returncode == 0, f"--interleave run failed ({result.returncode}): {result.stdout}\n{result.stderr}")
        if result.returncode != 0:
            return
        with open(os.path.join(out, f"{backend}.log")) as f:
            printed = f.read()
        expect("allreduce/f32/64: backplane/raw = " in printed and "(medians of 3 interleaved runs)" in printed,
               f"--interleave: the benchmark gives the ratio of the medians: {printed}")
        with open(os.path.join(out, f"{backend}.json")) as f:
            results = json.load(f)
        expect("alternating" in results["context"].get("repetitions", ""), "--interleave: the context says so")
        names = [b["run_name"].split("/iterations")[0] for b in results["benchmarks"]]
        expect(all(b.get("run_type") == "iteration" for b in results["benchmarks"]), "--interleave: no aggregates")
        for point in ("allreduce/f32/4", "allreduce/f32/64", "barrier"):
            runs = [n for n in names if n.rsplit("/", 1)[0] == point]
            expect(runs == [f"{point}/backplane", f"{point}/raw"] * 3, f"--interleave: {point} runs in turn: {runs}")
        with open(os.path.join(out, "collectives.md")) as f:
            row = re.search(r"^\| allreduce \| f32 \| 64 B \|(.*)$", f.read(), re.M)
        expect(row is not None and len(re.findall(r"\| [0-9]+\.[0-9]+ ", row.group(0))) >= 4,
               f"--interleave: the table has the medians: {row.group(0) if row else None}")


def every_point_measured(name, results, implementations):
    """Each operation and size of the sweep measured twice by each implementation, every run with its
    time, the slowest rank's, and its busbw; the runs by name."""
    runs = {}  # name -> its runs (one per repetition: they alternate)
    for b in results["benchmarks"]:
        runs.setdefault(b["run_name"].split("/iterations")[0], []).append(b)
    for op in OPS:
        for size in expected_sizes(op):
            for impl in implementations:
                point = f"{op}/f32/{size}/{impl}"
                expect(len(runs.get(point, [])) == 2, f"{name}: {point}: {len(runs.get(point, []))} runs, expected 2")
                for run in runs.get(point, []):
                    expect(run["real_time"] > 0, f"{name}: {point} has a time")
                    expect(run.get("busbw", 0) > 0, f"{name}: {point} has a busbw counter")
                    # every rank timed: the time is the slowest rank's, the fastest's times the spread
                    fastest, spread = run.get("fastest_rank_us", 0), run.get("rank_spread", 0)
                    expect(fastest > 0 and spread >= 1 and abs(run["real_time"] - fastest * spread) <= 1e-6 * run["real_time"],
                           f"{name}: {point}: {run['real_time']} µs is the slowest rank's (fastest {fastest} µs, spread {spread})")
    return runs


def main():
    bin_dir = sys.argv[1]
    # The peers that tools/install-deps installed and the build built a benchmark for run beside backplane.
    peers_dir = sys.argv[2]
    peers = [p for p, binary in PEER_BINARIES.items()
             if os.path.isdir(os.path.join(peers_dir, p)) and os.path.exists(os.path.join(bin_dir, binary))]
    copy_model()
    backends = ["gloo"]
    if os.path.exists(os.path.join(bin_dir, "..", "lib", "backplane", "plugins", "libbackplane-mpi.so")):
        backends.append("mpi")
    with tempfile.TemporaryDirectory() as out:
        command = [os.path.join(bin_dir, "bpl-bench-compare"), "--out", out, "--backends", ",".join(backends), "--",
                   "--dtypes=f32", "--max-bytes=1K", "--step-factor=16", "--repetitions=2", "--max-iterations=5",
                   "--buffer-offset=16"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            sys.exit(f"bpl-bench-compare failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        # The console: progress and the table, not the benchmark's own lines (those are in <backend>.log).
        expect("backplane/raw = " not in result.stdout and "points measured" in result.stdout
               and "| op | dtype | size |" in result.stdout, f"the console shows progress and the table:\n{result.stdout}")
        expect(len(result.stdout.splitlines()) < 120, f"the console is short: {len(result.stdout.splitlines())} lines")
        for backend in backends:
            with open(os.path.join(out, f"{backend}.log")) as f:
                printed = f.read()
            expect("backplane/raw = " in printed, f"{backend}.log holds the benchmark's backplane/raw lines")
            expect("\x1b[" not in printed, f"{backend}.log, written off a terminal, carries no colour codes")
        for backend in backends:
            with open(os.path.join(out, f"{backend}.json")) as f:
                results = json.load(f)
            context = results["context"]
            expect(context.get("backend", "").startswith(backend + " "), f"{backend}: context names the backend")
            expect(context.get("raw_library", "none") != "none", f"{backend}: context names the raw library")
            expect(context.get("buffer_offset", "").startswith("16 bytes"), f"{backend}: context gives the buffer offset")
            cpus = len(os.sched_getaffinity(0))
            if cpus >= 2:  # 2 ranks, bound: mpirun gives each one core, bpl-run --bind-to core half of the CPUs
                share = 1 if backend == "mpi" else cpus // 2
                expect(context.get("host", "").endswith(f"rank 0 may run on {share}"),
                       f"{backend}: ranks bound ({share} CPU(s) each): {context.get('host')}")
            runs = every_point_measured(backend, results, ("backplane", "raw"))
            expect("barrier/backplane" in runs and "barrier/raw" in runs, f"{backend}: barrier measured")
        for peer in peers:
            with open(os.path.join(out, f"{peer}.json")) as f:
                results = json.load(f)
            library = results["context"].get("raw_library", "")
            expect(library.startswith(PEER_LIBRARIES[peer]), f"{peer}: its context names the library: {library}")
            expect("barrier/raw" in every_point_measured(peer, results, ("raw",)), f"{peer}: barrier measured")
        for peer in set(PEER_LIBRARIES) - set(peers):
            expect(f"peer {peer} " in result.stdout and "skipped: " in result.stdout,
                   f"the console says why {peer} was left out:\n{result.stdout}")
        with open(os.path.join(out, "collectives.md")) as f:
            table = f.read()
        for op in OPS:
            for size in expected_sizes(op):
                label = f"{size} B" if size < 1024 else "1 KiB"
                row = re.search(rf"^\| {op} \| f32 \| {label} \|(.*)$", table, re.M)
                expect(row is not None, f"the table has a row for {op} {label}")
                if row:
                    cells = [c.strip() for c in row.group(1).split("|")[:-1]]
                    # a time is its median and the repetitions' range, "12.30 (11.90-14.10)", around it
                    for cell in cells:
                        spread = re.fullmatch(r"([0-9.]+) \(([0-9.]+)-([0-9.]+)\)", cell)
                        if spread:
                            low, median, high = float(spread.group(2)), float(spread.group(1)), float(spread.group(3))
                            expect(low <= median <= high, f"row {op} {label}: {cell}: the median lies in its range")
                    numbers = [float(m.group(0)) for m in (re.match(r"[0-9]+\.[0-9]+", c) for c in cells) if m]
                    # per backend: time, busbw, raw time, ratio, and the time against the copy model; then the
                    # best library's time and each backend's time over it
                    expect(len(numbers) == 6 * len(backends) + 1, f"row {op} {label} is complete: {row.group(0)}")
                    alone = re.search(rf"^\| {op} \| f32 \| {label} \|(.*)$", table.split("## Every library alone")[-1], re.M)
                    expect(alone is not None, f"every library's row for {op} {label}")
                    if len(numbers) == 6 * len(backends) + 1 and alone:
                        times = [float(re.match(r"\**([0-9]+\.[0-9]+)", c.strip()).group(1))
                                 for c in alone.group(1).split("|")[:-1] if c.strip()]
                        best = numbers[5 * len(backends)]
                        expect(len(times) == len(backends) + len(peers) and best == min(times),
                               f"row {op} {label}: best {best} is the least of every library's {times}")
                        for i, backend in enumerate(backends):
                            ours, against_best = numbers[5 * i], numbers[5 * len(backends) + 1 + i]
                            expect(abs(against_best - ours / best) <= 0.15 * against_best + 0.01,
                                   f"row {op} {label}: {backend}/best {against_best} is {ours} over {best}")
        for family in ("reductions", "gathers", "alltoall", "pingpong"):
            try:
                with open(os.path.join(out, f"collectives-{family}.png"), "rb") as f:
                    expect(f.read(8) == b"\x89PNG\r\n\x1a\n", f"collectives-{family}.png is a PNG")
            except OSError as error:
                expect(False, f"a figure per family of operations: {error}")
        expect(not re.search(r"\| 0\.000 \|", table), "ratios and bandwidths keep their significant digits")
        expect("Under load" not in table, "an idle run says nothing of load")
        for backend in backends:
            expect(re.search(rf"memcpy bandwidth \({backend} run, every rank at once\): 4 B [0-9.]+ GB/s", table),
                   f"{backend}: the copy reference is reported")
    under_load()
    asynchronous(backends)
    interleaved(backends[-1])
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print(f"bench_compare_test: {', '.join(backends)}: every operation and size measured both ways; peers measured: "
          f"{', '.join(peers) or 'none installed'}; table and plot written")


if __name__ == "__main__":
    main()
