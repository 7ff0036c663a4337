"""The README's commands that launch a PyTorch program on backplane (bpl-run, torch 2's torchrun, mpirun),
run as written from the project's root, with the build's folder for build/: each must exit 0 with
every rank's line saying ok, over the plugin its line selects.

    readme_torch_launchers.py <source dir> <build dir>
"""
import os
import re
import subprocess
import sys

LEAD = "Launch it as any torch.distributed program"


def readme_commands(source):
    with open(os.path.join(source, "README.md")) as f:
        text = f.read()
    block = re.search(re.escape(LEAD) + r".*?```sh\n(.*?)```", text, re.S)
    if not block:
        sys.exit(f"README.md has no ```sh block after '{LEAD}'")
    return [line for line in block.group(1).splitlines() if line.strip()]


def main():
    source, build = sys.argv[1], os.path.abspath(sys.argv[2])
    commands = readme_commands(source)
    if len(commands) != 3:
        sys.exit(f"expected the three launchers' lines, found {len(commands)}: {commands}")
    for command in commands:
        runnable = re.sub(r"(?<![\w/.])build/", build + "/", command)
        plugin = "mpi" if "BPL_BACKEND=mpi" in command else "gloo"
        finished = subprocess.run(["bash", "-c", runnable], cwd=source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=180, check=False)
        output = finished.stdout.decode(errors="replace")
        ranks_ok = re.findall(rf"rank (\d) of 2: all_reduce gives 3, expected 3, over {plugin}: ok", output)
        if finished.returncode != 0 or sorted(ranks_ok) != ["0", "1"]:
            print(output)
            sys.exit(f"the README's line exited {finished.returncode} with ranks {sorted(ranks_ok)} ok over {plugin}: {command}")
        print(f"ok ({plugin}, ranks 0 and 1): {command}")
    print("passed: the README's three launch lines")


if __name__ == "__main__":
    main()
