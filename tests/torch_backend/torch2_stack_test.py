"""The PyTorch 2 stack (torch2_stack.py) on backplane against torch's gloo in the same job: each under
torch 2's own torchrun, 4 ranks; every loss within float rounding of gloo's (the ranks' sums may be
added in another order), the checkpoint loaded exactly, the functional collectives exact.

    torch2_stack_test.py        (PYTHONPATH must reach backplane_torch)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(backend, temp):
    out = os.path.join(temp, backend.replace(":", "_") + ".json")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
               os.path.join(HERE, "torch2_stack.py"), backend, out, os.path.join(temp, "checkpoint-" + backend.replace(":", "_"))]
    finished = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400, check=False)
    if finished.returncode != 0:
        print(finished.stdout.decode(errors="replace"))
        sys.exit(f"torch2_stack.py on {backend} under torchrun exited with {finished.returncode}")
    with open(out) as f:
        return json.load(f)


def differences(reference, candidate, path=""):
    """The places where candidate is not reference (numbers: within a relative 1e-4, as bf16's
    rounding of sums added in another order allows)."""
    if isinstance(reference, dict):
        return [d for key in reference for d in differences(reference[key], candidate.get(key), f"{path}/{key}")]
    if isinstance(reference, list):
        if not isinstance(candidate, list) or len(candidate) != len(reference):
            return [f"{path}: {candidate} where gloo has {reference}"]
        return [d for i, (a, b) in enumerate(zip(reference, candidate)) for d in differences(a, b, f"{path}[{i}]")]
    if not isinstance(candidate, (int, float)) or not math.isclose(reference, candidate, rel_tol=1e-4, abs_tol=1e-7):
        return [f"{path}: {candidate} where gloo has {reference}"]
    return []


def main():
    temp = tempfile.mkdtemp(prefix="bpl-torch2-stack-")
    gloo = run("gloo", temp)
    backplane = run("cpu:backplane", temp)
    if backplane.pop("backend") != "cpu:backplane" or gloo.pop("backend") != "gloo":
        sys.exit("a run did not use the backend it was given")
    for part in ("checkpoint", "functional"):
        if part == "checkpoint" and backplane[part]["max_difference"] != 0.0:
            sys.exit(f"the checkpoint loaded at the other layout differs from what was saved: {backplane[part]}")
        if backplane[part] != gloo[part]:
            sys.exit(f"{part}: backplane gives {backplane[part]}, gloo {gloo[part]}")
    wrong = differences(gloo, backplane)
    for line in wrong:
        print("differs:", line)
    if wrong:
        sys.exit(f"{len(wrong)} value(s) differ from gloo's")
    print("losses (backplane):", json.dumps({k: backplane[k] for k in ("ddp", "fsdp2", "tp_dp")}))
    print("passed: DDP with comm hooks, FSDP2, 2-D mesh TP x DP, DCP across layouts and functional collectives "
          "(eager and compiled) on backplane as on gloo")


if __name__ == "__main__":
    main()
