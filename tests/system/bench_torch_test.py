#!/usr/bin/python3
"""bpl-bench-torch on a tiny sweep, two runs taking turns: torch's Gloo and backplane's gloo (and mpi where
built) each measure every operation and size through torch.distributed and its floor (a group of the
rank alone), a copy of each size, the DDP step, and the ProcessGroup layer against the C ABI; the JSON,
the table (ratios over the floor with their range, the targets) and the plot hold them.

    bench_torch_test.py BIN_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

failures = []


def expect(condition, message):
    if not condition:
        failures.append(message)


def main():
    bin_dir = sys.argv[1]
    configs = ["torch-gloo", "gloo"]
    if os.path.exists(os.path.join(bin_dir, "..", "lib", "backplane", "plugins", "libbackplane-mpi.so")):
        configs.append("mpi")
    with tempfile.TemporaryDirectory() as out:
        refused = subprocess.run([os.path.join(bin_dir, "bpl-bench-torch"), "--out", out, "--configs", "gloo,foo"],
                                 capture_output=True, text=True, timeout=60)
        expect(refused.returncode == 2 and "'foo'" in refused.stderr, f"--configs foo is refused naming it: {refused}")
        command = [os.path.join(bin_dir, "bpl-bench-torch"), "--out", out, "--configs", ",".join(configs),
                   "--max-bytes", "1K", "--step", "16", "--repetitions", "2", "--min-seconds", "0.001",
                   "--max-iterations", "5", "--ddp-widths", "32,64", "--runs", "2"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            sys.exit(f"bpl-bench-torch failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        for config in configs:
            with open(os.path.join(out, f"torch-{config}-1.json")) as f:
                results = json.load(f)
            expect(results["world"] == 2, f"{config}: 2 ranks")
            ops = {(r["op"], r["bytes"]) for r in results["ops"] if r["us"] > 0 and r["floor_us"] > 0}
            for op in ("allreduce", "allgather", "broadcast", "reduce_scatter"):
                expect(any(k[0] == op for k in ops), f"{config}: {op} measured, with its floor")
            sizes = sum(1 for r in results["ops"] if r["op"] == "allreduce")
            expect(len(results["copy"]) == sizes == 3 and all(r["us"] > 0 for r in results["copy"]), f"{config}: a copy per size")
            expect([d["width"] for d in results["ddp"]] == [32, 64], f"{config}: a DDP step per width")
            expect(all(d["step_ms"] > 0 and d["no_sync_ms"] > 0 and d["bucket_work_ms"] > 0 for d in results["ddp"]),
                   f"{config}: DDP steps measured with, without communication, and with DDP's bucket work alone")
            expect(all(d["allreduces_alone_ms"] > 0 and sum(d["bucket_bytes"]) == d["gradient_bytes"] for d in results["ddp"]),
                   f"{config}: the DDP step's buckets (all its gradients) allreduced alone: {results['ddp']}")
            if config != "torch-gloo":
                expect(results["backend"].startswith(config + " "), f"{config}: the backend is named: {results['backend']}")
                expect(len(results["layer"]) >= 2 and all(r["group_us"] > 0 and r["abi_us"] > 0 for r in results["layer"]),
                       f"{config}: the ProcessGroup layer measured against the C ABI")
        with open(os.path.join(out, "torch.md")) as f:
            table = f.read()
        expect("Ranks: 2, placed by their launchers (bpl-run: unbound; mpirun: its default binding);" in table,
               "the table says how the ranks were placed (by default, as each launcher places a user's job)")
        rows = re.findall(r"^\| allreduce \| 4 B \|(.*)$", table, re.M)
        expect(len(rows) == len(configs) - 1 and all(re.search(r"\| [0-9.]+(-[0-9.]+)?x( \(noisy\))? \|", r) and "1/20" in r and
                                                      re.search(r"\| (yes|no \(\d of 2\)) \|$", r) for r in rows),
               "the table has an allreduce 4 B row per backplane config: the ratio over the floor, the target, the verdict")
        ratio = r"[0-9.]+(-[0-9.]+)?x( \(noisy\))?"
        expect(re.search(rf"^\| gloo \| [0-9.]+ KiB \|.* \| {ratio} \| [0-9.]+ \| {ratio} \|$", table, re.M) is not None,
               "the table compares DDP's communication, and the bound its transfer alone sets")
        with open(os.path.join(out, "torch.png"), "rb") as f:
            expect(f.read(8) == b"\x89PNG\r\n\x1a\n", "torch.png is a PNG")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print(f"bench_torch_test: {', '.join(configs)}: every operation measured; table and plot written")


if __name__ == "__main__":
    main()
