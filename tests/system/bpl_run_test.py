"""bpl-run accepts what torchrun accepts, and behaves as torchrun and mpirun do: a .py script runs with
the Python that runs bpl-run, -m runs a module, --no-python runs the program as it is, one rank by
default, a program in the current folder is found, --tee/--redirects write torchrun's log layout under
--log-dir, every console line is whole and carries its rank's prefix, a failure's message counts the
ranks it stops, and --help, --version and an unknown flag answer as other tools do.

    bpl_run_test.py <bin dir>
"""
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def run(bpl_run, args, cwd, timeout=60):
    return subprocess.run([bpl_run] + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def write(folder, name, text, executable=False):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def main():
    bpl_run = os.path.join(os.path.abspath(sys.argv[1]), "bpl-run")
    with open(bpl_run) as f:
        launcher_python = f.readline()[2:].strip()  # the build tree's bpl-run runs on the project's Python
    with tempfile.TemporaryDirectory() as folder:
        write(folder, "who.py", "import os, sys\nprint('who', os.environ['RANK'], os.environ['WORLD_SIZE'], sys.executable)\n")
        write(folder, "whomod.py", "import os\nprint('module', os.environ['RANK'])\n")
        write(folder, "direct.py", "#!/bin/sh\necho direct $RANK\n", executable=True)
        write(folder, "program", "#!/bin/sh\necho program $RANK\n", executable=True)
        # Two ranks that each write 400 lines in pieces, flushing between the pieces: the console must get
        # each line whole, under one prefix.
        write(folder, "chatty.py", "import os, sys\nr = os.environ['RANK']\nfor i in range(400):\n"
                                   "    sys.stdout.write('line %s-' % r); sys.stdout.flush()\n"
                                   "    sys.stdout.write('%d end\\n' % i); sys.stdout.flush()\n"
                                   "sys.stdout.write('last without newline %s' % r)\n")
        write(folder, "fails.py", "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n"
                                  "time.sleep(30)\n")

        one = run(bpl_run, ["who.py"], folder)
        expect(one.returncode == 0, f"a script on one rank by default: {one}")
        expect(re.fullmatch(r"who 0 1 (\S+)\n", one.stdout) is not None,
               f"one rank, no prefix, the line as written: {one.stdout!r}")
        used = one.stdout.split()[-1] if one.stdout else ""
        expect(os.path.realpath(used) == os.path.realpath(launcher_python) or used == launcher_python,
               f"the script ran with bpl-run's Python {launcher_python}, not {used}")

        two = run(bpl_run, ["--nproc-per-node", "2", "who.py"], folder)
        expect(sorted(two.stdout.splitlines()) == [f"[rank0]:who 0 2 {used}", f"[rank1]:who 1 2 {used}"],
               f"two ranks, each line with its rank's prefix: {two.stdout!r}")

        module = run(bpl_run, ["--nproc-per-node", "2", "-m", "whomod"], folder)
        expect(sorted(module.stdout.splitlines()) == ["[rank0]:module 0", "[rank1]:module 1"],
               f"-m runs a module: {module.stdout!r} {module.stderr!r}")

        direct = run(bpl_run, ["--no-python", "./direct.py"], folder)
        expect(direct.stdout == "direct 0\n", f"--no-python runs a .py as it is: {direct.stdout!r} {direct.stderr!r}")

        here = run(bpl_run, ["--nproc-per-node", "2", "program"], folder)
        expect(here.returncode == 0 and sorted(here.stdout.splitlines()) == ["[rank0]:program 0", "[rank1]:program 1"],
               f"a program in the current folder is found, as mpirun finds it: {here}")

        chatty = run(bpl_run, ["--nproc-per-node", "2", "chatty.py"], folder)
        lines = chatty.stdout.splitlines()
        whole = [line for line in lines if re.fullmatch(r"\[rank(\d)\]:line \1-\d+ end", line)]
        last = sorted(line for line in lines if "last without newline" in line)
        expect(len(whole) == 800 and len(lines) == 802, f"800 whole lines and 2 last ones: {len(whole)} of {len(lines)}")
        expect(last == ["[rank0]:last without newline 0", "[rank1]:last without newline 1"],
               f"a last line without its newline is still whole: {last}")

        logs = os.path.join(folder, "logs")
        teed = run(bpl_run, ["--nproc-per-node", "2", "--tee", "3", "--log-dir", logs, "who.py"], folder)
        runs = os.listdir(logs) if os.path.isdir(logs) else []
        expect(len(runs) == 1, f"--log-dir holds one folder of the run, <run id>_<unique> as torchrun's: {runs}")
        for rank in (0, 1):
            path = os.path.join(logs, runs[0] if runs else "", "attempt_0", str(rank), "stdout.log")
            try:
                with open(path) as f:
                    expect(f.read() == f"who {rank} 2 {used}\n", f"{path} holds rank {rank}'s stdout, unprefixed")
            except OSError as error:
                expect(False, f"--tee 3 --log-dir: {error}")
            expect(os.path.exists(os.path.join(logs, runs[0] if runs else "", "attempt_0", str(rank), "stderr.log")),
                   f"rank {rank}'s stderr.log")
        expect(len(teed.stdout.splitlines()) == 2, f"--tee also writes to the console: {teed.stdout!r}")
        quiet = run(bpl_run, ["--nproc-per-node", "2", "--redirects", "1", "--log-dir",
                              os.path.join(folder, "quiet"), "who.py"], folder)
        expect(quiet.returncode == 0 and quiet.stdout == "", f"--redirects 1 keeps stdout off the console: {quiet.stdout!r}")

        failed = run(bpl_run, ["--nproc-per-node", "3", "--term-timeout", "2", "fails.py"], folder)
        expect(failed.returncode == 3, f"the failed rank's exit status: {failed.returncode}")
        expect("rank 1 (pid" in failed.stderr and "exited with code 3; stopped the 2 other ranks" in failed.stderr,
               f"the failure names the rank and counts the others: {failed.stderr!r}")
        # --keep-going: the other ranks go on; the job's status is the first non-zero exit code.
        write(folder, "goes_on.py", "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n"
                                    "time.sleep(1)\nprint('went on', os.environ['RANK'])\n")
        kept = run(bpl_run, ["--nproc-per-node", "3", "--keep-going", "goes_on.py"], folder)
        expect(kept.returncode == 3 and "went on 0" in kept.stdout and "went on 2" in kept.stdout,
               f"--keep-going: the others go on, the status is the failed rank's: {kept.returncode} {kept.stdout!r}")
        expect("rank 1 (pid" in kept.stderr and "the others go on (--keep-going)" in kept.stderr,
               f"--keep-going names the failed rank: {kept.stderr!r}")
        # --replace: a replaced rank's status is its newcomer's.
        write(folder, "replaced.py", "import os, sys, time\nif os.environ.get('BPL_JOIN') == '1':\n"
                                     "    print('newcomer'); sys.exit(int(os.environ['NEWCOMER_STATUS']))\n"
                                     "if os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(1)\n")
        for newcomer_status in (0, 5):
            replaced = subprocess.run([bpl_run, "--nproc-per-node", "3", "--replace", "replaced.py"], cwd=folder,
                                      capture_output=True, text=True, timeout=60,
                                      env=dict(os.environ, NEWCOMER_STATUS=str(newcomer_status)))
            expect(replaced.returncode == newcomer_status and "newcomer" in replaced.stdout,
                   f"--replace: the job's status is the newcomer's ({newcomer_status}), not the replaced rank's: "
                   f"{replaced.returncode} {replaced.stdout!r} {replaced.stderr!r}")
        # A rank that fails once every other has ended gets no newcomer: nobody is left to admit one.
        write(folder, "fails_last.py", "import os, sys, time\nif os.environ.get('BPL_JOIN') == '1':\n"
                                       "    print('newcomer')\n    sys.exit(0)\nif os.environ['RANK'] == '1':\n"
                                       "    time.sleep(0.5)\n    sys.exit(3)\n")
        last = run(bpl_run, ["--nproc-per-node", "2", "--replace", "fails_last.py"], folder)
        expect(last.returncode == 3 and "newcomer" not in last.stdout
               and "no other rank is running, none to admit a newcomer" in last.stderr,
               f"--replace starts no newcomer once no rank is left: {last.returncode} {last.stdout!r} {last.stderr!r}")
        # bpl-run's own lines reach a console that merges stdout and stderr whole, never inside a rank's
        # line: rank 0 floods stdout while 7 others fail, each failure told on stderr.
        write(folder, "floods.py", "import os, sys, time\nif os.environ['RANK'] != '0':\n    time.sleep(0.3)\n"
                                   "    sys.exit(1)\nend = time.time() + 1.5\nwhile time.time() < end:\n"
                                   "    sys.stdout.write('x' * 60 + '\\n'); sys.stdout.flush()\n")
        for attempt in range(5):
            merged = subprocess.run([bpl_run, "--nproc-per-node", "8", "--keep-going", "floods.py"], cwd=folder,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
            mixed = [line for line in merged.stdout.splitlines()
                     if not re.fullmatch(r"\[rank0\]:x{60}|bpl-run: rank \d \(pid \d+\) exited with code 1; "
                                         r"the others go on \(--keep-going\)", line)]
            expect(merged.stdout.count("the others go on") == 7 and not mixed,
                   f"bpl-run's lines whole amid a rank's (attempt {attempt + 1}): {mixed[:4]!r}")
        # A rank left stopped after the others ended would hold bpl-run forever: it is killed, named.
        write(folder, "stops.py", "import os, signal\nif os.environ['RANK'] == '1':\n"
                                  "    os.kill(os.getpid(), signal.SIGSTOP)\nprint('ended', os.environ['RANK'])\n")
        stopped = run(bpl_run, ["--nproc-per-node", "2", "--keep-going", "--term-timeout", "1", "stops.py"], folder,
                      timeout=30)
        expect(stopped.returncode == 0 and "ended 0" in stopped.stdout,
               f"--keep-going with a rank left stopped ends: {stopped.returncode} {stopped.stdout!r}")
        expect("rank 1 (pid" in stopped.stderr and "is stopped and every other rank has ended; killing it" in stopped.stderr,
               f"the stopped rank is named as it is killed: {stopped.stderr!r}")
        write(folder, "fails_alone.py", "import sys\nsys.exit(4)\n")
        alone = run(bpl_run, ["fails_alone.py"], folder)
        expect(alone.returncode == 4 and "stopping" not in alone.stderr,
               f"a job of one rank stops no other: {alone.stderr!r}")

        # A rank that leaves a process of its own holding its output: bpl-run carries what came, then
        # ends within --term-timeout, saying so, instead of waiting for that process.
        marker = "sleep 60.%d" % os.getpid()  # a command line of its own, to find the process afterwards
        write(folder, "holder", f"#!/bin/sh\necho started\n{marker} &\n", executable=True)
        try:
            held = run(bpl_run, ["--term-timeout", "2", "holder"], folder, timeout=30)
            expect(held.returncode == 0 and held.stdout == "started\n", f"a held output's lines are carried: {held}")
            expect("rank(s) 0 is still open" in held.stderr, f"bpl-run says it stops waiting: {held.stderr!r}")
        except subprocess.TimeoutExpired:
            expect(False, "bpl-run waited without a deadline for an output a rank's process held open")
        finally:
            subprocess.run(["pkill", "-f", marker], check=False)

        for flag in ("--help", "--version"):
            answered = run(bpl_run, [flag], folder)
            expect(answered.returncode == 0 and answered.stdout and not answered.stderr,
                   f"{flag}: exit 0 on stdout: {answered}")
        version = run(bpl_run, ["--version"], folder)
        expect(re.fullmatch(r"bpl-run \(backplane\) \d+\.\d+\.\d+\n", version.stdout) is not None,
               f"--version: {version.stdout!r}")
        unknown = run(bpl_run, ["--frobnicate", "who.py"], folder)
        expect(unknown.returncode == 2 and "--frobnicate" in unknown.stderr, f"an unknown flag: {unknown}")
        alone = run(bpl_run, ["--bogus"], folder)
        expect(alone.returncode == 2 and "unrecognized flag --bogus" in alone.stderr,
               f"an unknown flag without a program is named, not the program: {alone.stderr!r}")
        # Two ranks failing together, each after a traceback's worth of lines: every line of theirs comes
        # before bpl-run's summary.
        # (each writes its lines, then they meet, then each exits at once).
        write(folder, "both_fail.py", "import os, sys, time\nr, met = os.environ['RANK'], sys.argv[1]\n"
                                      "sys.stderr.write(''.join('trace %d\\n' % i for i in range(300)))\n"
                                      "sys.stderr.write('error of rank %s\\n' % r); sys.stderr.flush()\n"
                                      "open(met + r, 'w').close()\n"
                                      "while not os.path.exists(met + str(1 - int(r))):\n    time.sleep(0.001)\n"
                                      "os._exit(1)\n")
        for attempt in range(5):
            met = os.path.join(folder, f"met{attempt}.")
            both = run(bpl_run, ["--nproc-per-node", "2", "both_fail.py", met], folder)
            lines = both.stderr.splitlines()
            summary = [i for i, line in enumerate(lines) if line.startswith("bpl-run: rank")]
            errors = [i for i, line in enumerate(lines) if re.fullmatch(r"\[rank\d\]:error of rank \d", line)]
            expect(both.returncode == 1 and len(errors) == 2 and summary and max(errors) < min(summary),
                   f"two failing ranks' lines, then the summary (attempt {attempt + 1}): {lines}")
        # With several nodes, the port is torchrun's default; one taken names the flag that chose it.
        write(folder, "port.py", "import os\nprint(os.environ['MASTER_PORT'], os.environ['GROUP_WORLD_SIZE'])\n")
        default_port = subprocess.run([bpl_run, "--nnodes", "2", "--node-rank", "1", "port.py"], cwd=folder,
                                      capture_output=True, text=True, timeout=60,
                                      env={k: v for k, v in os.environ.items() if k != "MASTER_PORT"})
        expect(default_port.stdout == "[rank1]:29500 2\n", f"--nnodes 2: MASTER_PORT 29500: {default_port}")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            busy = run(bpl_run, ["--nproc-per-node", "2", "--master-port", str(port), "who.py"], folder)
        expect(busy.returncode != 0 and f"--master-port {port}: the job's store serves at MASTER_PORT, and cannot serve "
               f"there: bpl-store: cannot serve the store on port {port}: Address already in use" in busy.stderr,
               f"a taken MASTER_PORT names the flag: {busy.stderr!r}")
        for flags, named in ((["--rdzv-conf", "last_call_timeout=soon"], "last_call_timeout='soon'"),
                             (["--nnodes", "2:1"], "--nnodes 2:1"), (["--nproc-per-node", "many"], "--nproc-per-node many"),
                             (["--max-restarts", "1", "--nnodes", "2"], "--max-restarts 1 with --nnodes 2")):
            refused = run(bpl_run, flags + ["who.py"], folder)
            expect(refused.returncode == 2 and named in refused.stderr, f"{flags} refused, named: {refused.stderr!r}")
        bad = run(bpl_run, ["--tee", "5", "who.py"], folder)
        expect(bad.returncode == 2 and "'5'" in bad.stderr, f"a bad --tee value is named: {bad.stderr!r}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print("passed: bpl-run as torchrun")


if __name__ == "__main__":
    main()
