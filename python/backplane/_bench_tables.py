"""bpl-bench-compare's tables: each benchmark's medians and ranges read from Google Benchmark's JSON, the
ratios (flagged where the repetitions make them meaningless), the copy model of bench/README.md, the best
of the libraries measured at each point, and the markdown table of a run."""

import re
import statistics

from backplane import _figures


def medians(results):
    """{(op, dtype, bytes): {"backplane"|"raw": {"us", "us_min", "us_max", "busbw"}}} from Google
    Benchmark's JSON: the median of each benchmark's repetitions and their range (the repetitions' own
    rows; where the JSON holds aggregates alone, the median aggregate, without a range)."""
    runs = {}  # (op, dtype, bytes, impl) -> [(us, busbw)]
    has_repetitions = any(b.get("run_type") != "aggregate" for b in results["benchmarks"])
    for b in results["benchmarks"]:
        aggregate = b.get("run_type") == "aggregate"
        if (aggregate and has_repetitions) or (aggregate and b.get("aggregate_name") != "median"):
            continue
        parts = b["run_name"].split("/")
        key = ("barrier", "-", 0, parts[1]) if parts[0] == "barrier" else (parts[0], parts[1], int(parts[2]), parts[3])
        unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
        runs.setdefault(key, []).append((b["real_time"] * unit, b.get("busbw", 0.0) / 1e9))  # bytes/s, as GB/s
    table = {}
    for (op, dtype, size, impl), values in runs.items():
        times = [v[0] for v in values]
        table.setdefault((op, dtype, size), {})[impl] = {
            "us": statistics.median(times), "us_min": min(times), "us_max": max(times),
            "busbw": statistics.median(v[1] for v in values),
        }
    return table


# A ratio is flagged when its repetitions admit ratios more than this factor apart: the machine's slow
# spells, not the implementations, decided it.
NOISY_SPREAD = 2.0


def noisy(ours, theirs):
    """Whether the repetitions' ranges admit ratios more than NOISY_SPREAD apart."""
    return ours["us_max"] / theirs["us_min"] > NOISY_SPREAD * ours["us_min"] / theirs["us_max"]


def ratio_cell(ours, theirs):
    """"ratio" of the medians, with "(noisy)" where the repetitions' ranges make it meaningless."""
    return _figures.significant(ours["us"] / theirs["us"]) + (" (noisy)" if noisy(ours, theirs) else "")


def time_cell(entry):
    """The median, and the repetitions' range beside it where there is one."""
    if entry["us_max"] > entry["us_min"]:
        return f"{entry['us']:.2f} ({entry['us_min']:.2f}-{entry['us_max']:.2f})"
    return f"{entry['us']:.2f}"


def human_bytes(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def bus_factor(op, ranks):
    """nccl-tests' bus bytes over the size S, as bpl-bench-collectives counts busbw (the ping-pong: 2S)."""
    ring = (ranks - 1) / ranks
    return {"allreduce": 2 * ring, "broadcast": 1.0, "reduce": 1.0, "pingpong": 2.0}.get(op, ring)


def traffic_factor(op, ranks):
    """The least bytes the busiest rank reads and writes, over the size S (bench/README.md)."""
    return {"scatter": 2 / ranks, "reduce_scatter": 1 + 1 / ranks, "allreduce": 3 - 1 / ranks,
            "pingpong": 4.0}.get(op, 2.0)


def copy_model_ratio(op, busbw_gbps, copy_gbps, ranks):
    """time / model(S) of bench/README.md: model(S) = traffic / (2 B(S)), time = bus bytes / busbw."""
    return 2 * copy_gbps * bus_factor(op, ranks) / (busbw_gbps * traffic_factor(op, ranks))


def copy_bandwidth(table):
    """{bytes: GB/s} of the run's memcpy reference (every rank copying at once)."""
    return {k[2]: v["memcpy"]["busbw"] for k, v in table.items() if k[0] == "copy" and "memcpy" in v}


def library_label(raw_library):
    """A library's name and version from the benchmark's context line ("Intel(R) MPI Library 2021.19.0 for
    Linux* OS, blocking calls" -> "Intel MPI 2021.19.0")."""
    name = raw_library.split(",")[0]
    for noise in ("(R)", " Library", " for Linux* OS", "Version:"):
        name = name.replace(noise, "")
    return " ".join(name.split())


def libraries_of(tables, contexts, peer_tables, peer_contexts):
    """{label: {point: entry}}: every library measured alone, the raw library of each backend's run and
    each peer's run."""
    libraries = {}
    for name, table in list(tables.items()) + list(peer_tables.items()):
        context = contexts.get(name) or peer_contexts.get(name, {})
        alone = {key: entry["raw"] for key, entry in table.items() if "raw" in entry}
        if alone:
            libraries[library_label(context.get("raw_library", name))] = alone
    return libraries


def best_library(libraries, key):
    """(label, entry) of the library fastest at the point (its median), or (None, None)."""
    timed = [(entry[key]["us"], label, entry[key]) for label, entry in libraries.items() if key in entry]
    if not timed:
        return None, None
    _, label, entry = min(timed, key=lambda t: t[0])
    return label, entry


def write_markdown(path, tables, contexts, libraries, load, ranks, hosts, ops):
    backends = list(tables)
    keys = sorted({k for t in tables.values() for k in t if k[0] != "copy"}, key=lambda k: (ops.index(k[0]), k[1], k[2]))
    copies = {backend: copy_bandwidth(table) for backend, table in tables.items()}
    lines = ["# Collectives: backplane, the raw library underneath and the other libraries", ""]
    if hosts:
        lines += [f"Across {len(hosts)} machines ({', '.join(hosts)}), {ranks // len(hosts)} rank(s) on each.", ""]
    if load:
        lines += [f"Under load: {load} busy process{'es' if load != 1 else ''} (each spinning on a core) beside the "
                  "ranks for the whole of each run, backplane and raw alike.", ""]
    for backend in backends:
        context = contexts[backend]
        lines.append(f"- **{backend}**: {context.get('backend', '?')}; ranks {context.get('ranks', '?')}; "
                     f"backplane's calls: {context.get('backplane_calls', 'blocking')}; "
                     f"raw: {context.get('raw_library', 'none')}; repetitions: {context.get('repetitions', '?')}; "
                     f"{context.get('host', '')}")
    lines += ["", "Median time per operation (µs; each repetition's is its slowest rank's, every rank timed) with "
              "the range of the repetitions, bus bandwidth (GB/s, "
              "nccl-tests' definition) and the abstraction's cost (backplane time / raw time, from the same run; "
              f"\"(noisy)\" where the repetitions admit ratios more than {NOISY_SPREAD:g}x apart, so that the "
              "machine, not the implementations, decided it). Where the run measured the "
              "copy reference, \"/copy\" is backplane's time against the copy model of bench/README.md (the "
              "bytes the busiest rank must read and write, at the rate memcpy moves them in the same run and "
              "size, every rank copying at once; 1.0 is as fast as memory goes). \"best\" is the fastest of every "
              "library measured alone at the point (the table below: each backend's raw library and each peer, "
              "one run after the other, under the same load), and \"/best\" each backend's time against it.", ""]
    header = "| op | dtype | size |"
    rule = "|---|---|---:|"
    for backend in backends:
        header += f" {backend} µs | {backend} busbw | raw {backend} µs | {backend}/raw |"
        rule += "---:|---:|---:|---:|"
        if copies[backend]:
            header += f" {backend}/copy |"
            rule += "---:|"
    if libraries:
        header += " best | best µs |" + "".join(f" {backend}/best |" for backend in backends)
        rule += "---|---:|" + "---:|" * len(backends)
    lines += [header, rule]
    for key in keys:
        op, dtype, size = key
        row = f"| {op} | {dtype} | {human_bytes(size) if op != 'barrier' else '-'} |"
        for backend in backends:
            entry = tables[backend].get(key, {})
            ours, raw = entry.get("backplane"), entry.get("raw")
            row += f" {time_cell(ours)} |" if ours else " |"
            row += f" {_figures.significant(ours['busbw'])} |" if ours and op != "barrier" else " |"
            row += f" {time_cell(raw)} |" if raw else " |"
            row += f" {ratio_cell(ours, raw)} |" if ours and raw else " |"
            if copies[backend]:
                copy = copies[backend].get(size)
                row += (f" {_figures.significant(copy_model_ratio(op, ours['busbw'], copy, ranks))} |"
                        if copy and ours and ours["busbw"] > 0 else " |")
        if libraries:
            label, best = best_library(libraries, key)
            row += f" {label} | {time_cell(best)} |" if best else " | |"
            for backend in backends:
                ours = tables[backend].get(key, {}).get("backplane")
                row += f" {ratio_cell(ours, best)} |" if ours and best else " |"
        lines.append(row)
    for backend in backends:
        if copies[backend]:
            lines += ["", f"memcpy bandwidth ({backend} run, every rank at once): " +
                      ", ".join(f"{human_bytes(size)} {bw:.2f} GB/s" for size, bw in sorted(copies[backend].items()))]
    if libraries:
        lines += ["", "## Every library alone", "",
                  "Median time per operation (µs, the slowest rank's; the range of the repetitions), each library "
                  "started as its users start it; the fastest at each point in bold.", "",
                  "| op | dtype | size |" + "".join(f" {label} |" for label in libraries),
                  "|---|---|---:|" + "---:|" * len(libraries)]
        for key in keys:
            op, dtype, size = key
            best, _ = best_library(libraries, key)
            cells = [("**" + time_cell(times[key]) + "**" if label == best else time_cell(times[key])) if key in times
                     else "" for label, times in libraries.items()]
            lines.append(f"| {op} | {dtype} | {human_bytes(size) if op != 'barrier' else '-'} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
