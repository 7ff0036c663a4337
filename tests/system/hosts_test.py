#!/usr/bin/env python3
"""backplane across test hosts (tests/support/hosts.py): real multi-node launches, each host a machine
of its own to backplane, talking over its own interface; the jobs that pass (a host that fails:
hosts_faults_test.py).

    hosts_test.py BIN_DIR SCENARIO      (exit 0 passed, 1 failed, 77 skipped with the reason printed)

Scenarios:
  gloo_two_hosts           bpl-run --nnodes 2, one rank per host: Gloo over TCP between the hosts (each rank
                           a machine of its own), the host names resolved as a cluster's DNS would; the
                           conformance suite passes
  gloo_two_hosts_two_ranks two ranks per host: shared memory within each host, TCP between (hierarchical)
  gloo_three_hosts         three hosts, one rank each
  gloo_socket_ifname       GLOO_SOCKET_IFNAME=eth0 is the transport; one no host has is an error naming it
  torchrun_variables_two_hosts  ranks started with RANK, WORLD_SIZE, MASTER_ADDR (host 0) by hand
  examples_two_hosts       tp_mlp --check, and dp_train saved on one run and resumed on the next
  mpi_two_hosts            mpirun with a host file and a launch agent into the other host; the conformance
                           suite passes on the mpi backend
  bench_two_hosts          bpl-bench-compare --hostfile across 2 hosts (1 and 2 ranks each), gloo and mpi
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from hosts import TestHosts  # noqa: E402
from hosts_jobs import (AGENT, MASTER_PORT, MPI_ENV, TIMEOUT_S, expect, expect_all_passed, host_file,  # noqa: E402
                        launch, mpirun_command, outputs, run_scenario)


def info_and_conformance(bin_dir, count, ranks_per_host, path, env_extra=None, transport=None):
    with TestHosts(count) as hosts:
        info = launch(hosts, bin_dir, ranks_per_host, [os.path.join(bin_dir, "bpl-info"), "--init"], env_extra)
        expect_all_passed(info, "bpl-info --init")
        details = info[0][1]
        expect(f"store={hosts.address(0)}:{MASTER_PORT} (the launcher's bpl-store)" in details,
               "the store on host 0's address, served by its bpl-run", info)
        expected_transport = transport or f"transport=tcp host {hosts.host(0)}"
        expect(expected_transport in details, f"'{expected_transport}'", info)
        expect(f"collectives of world: {path}" in details, f"the path '{path}'", info)
        suite = launch(hosts, bin_dir, ranks_per_host, [os.path.join(bin_dir, "bpl-conformance"), "--backend=gloo"],
                       env_extra)
        expect_all_passed(suite, "the conformance suite")
        expect(all("[  PASSED  ]" in out for _, out in suite[:1]), "rank 0's suite reports its tests passed", suite)
        print(f"passed: {count} hosts x {ranks_per_host} rank(s): {path}; conformance suite passed")


def gloo_two_hosts(bin_dir):
    info_and_conformance(bin_dir, 2, 1, "gloo over tcp (each rank on a machine of its own)")


def gloo_two_hosts_two_ranks(bin_dir):
    info_and_conformance(bin_dir, 2, 2, "shared memory within each of 2 machines, gloo over tcp between them")


def gloo_three_hosts(bin_dir):
    info_and_conformance(bin_dir, 3, 1, "gloo over tcp (each rank on a machine of its own)")


def gloo_socket_ifname(bin_dir):
    info_and_conformance(bin_dir, 2, 1, "gloo over tcp (each rank on a machine of its own)",
                         {"GLOO_SOCKET_IFNAME": "eth0"}, transport="transport=tcp iface eth0")
    with TestHosts(2) as hosts:
        bad = launch(hosts, bin_dir, 1, [os.path.join(bin_dir, "bpl-info"), "--init"], {"GLOO_SOCKET_IFNAME": "nope0"})
        expect(all(code != 0 for code, _ in bad), "an interface no host has fails every host's job", bad)
        expect(all("GLOO_SOCKET_IFNAME='nope0' names no interface of this host" in out for _, out in bad),
               "every host names the interface", bad)
    print("passed: GLOO_SOCKET_IFNAME=nope0 is an error naming it on every host")


def torchrun_variables_two_hosts(bin_dir):
    """Each rank started by hand with torchrun's variables, MASTER_ADDR being the other host for rank 1."""
    with TestHosts(2) as hosts:
        procs = []
        for i in range(2):
            env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS="60000", RANK=str(i), WORLD_SIZE="2",
                       LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=hosts.address(0), MASTER_PORT=MASTER_PORT)
            procs.append(hosts.start(i, [os.path.join(bin_dir, "bpl-info"), "--init"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = outputs(hosts, procs)
        expect_all_passed(results, "bpl-info --init with RANK/WORLD_SIZE/MASTER_ADDR")
        expect("Runtime (rank 0 of 2, local 0 of 1, from torchrun)" in results[0][1], "rank 0 of 2 from torchrun's variables",
               results)
        expect("gloo over tcp (each rank on a machine of its own)" in results[0][1], "one rank per machine", results)
    print("passed: torchrun's variables across 2 hosts, MASTER_ADDR on the other host")


def examples_two_hosts(bin_dir):
    """tp_mlp --check and dp_train (saved, then resumed: the checkpoint folder is on a filesystem both hosts
    see, as a cluster's shared storage) across 2 hosts of 1 rank."""
    import shutil
    import tempfile
    with TestHosts(2) as hosts:
        mlp = launch(hosts, bin_dir, 1, [os.path.join(bin_dir, "tp_mlp"), "--check"])
        expect_all_passed(mlp, "tp_mlp --check")
        expect("match" in mlp[0][1] and "MISMATCH" not in mlp[0][1], "the sharded MLP matches the unsharded one", mlp)
        folder = tempfile.mkdtemp(prefix="bpl-hosts-dp-")
        try:
            train = [os.path.join(bin_dir, "dp_train"), "--checkpoint-dir", folder]
            straight = launch(hosts, bin_dir, 1, train[:1] + ["--steps", "12"])
            first = launch(hosts, bin_dir, 1, train + ["--steps", "8", "--save-every", "4"])
            resumed = launch(hosts, bin_dir, 1, train + ["--steps", "12", "--resume"])
            for results, what in ((straight, "dp_train"), (first, "dp_train, saving"), (resumed, "dp_train --resume")):
                expect_all_passed(results, what)
            # rank 0's step lines (bpl-run prefixes each line with its rank)
            steps = lambda out: re.findall(r"^(?:\[rank0\]:)?(step \d+ loss .*)$", out, re.M)  # noqa: E731
            expect(len(steps(straight[0][1])) == 12, "12 step lines from the straight run", straight)
            expect("resumed from step 8" in resumed[0][1], "the run resumed from step 8", resumed)
            expect(steps(straight[0][1])[8:] == steps(resumed[0][1]), "the resumed run repeats steps 9-12",
                   straight + resumed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print("passed: tp_mlp --check and a resumed dp_train across 2 hosts")


def mpi_two_hosts(bin_dir):
    """mpirun in host 0 with a host file naming both hosts (mpirun_command): bpl-info sees 2 ranks, one
    per host, and the conformance suite passes on the mpi backend."""
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        mpirun = mpirun_command(hosts, hostfile)
        env = dict(os.environ, BPL_TIMEOUT_MS="60000", **MPI_ENV)
        info = hosts.run(0, mpirun + [os.path.join(bin_dir, "bpl-info"), "--init"], env=env, timeout=TIMEOUT_S)
        results = [(info.returncode, info.stdout + info.stderr)]
        expect_all_passed(results, "mpirun bpl-info --init")
        expect("Runtime (rank 0 of 2, local 0 of 1, from openmpi)" in info.stdout, "2 ranks, one per host", results)
        suite = hosts.run(0, mpirun + [os.path.join(bin_dir, "bpl-conformance"), "--backend=mpi"], env=env,
                          timeout=TIMEOUT_S)
        results = [(suite.returncode, suite.stdout + suite.stderr)]
        expect_all_passed(results, "mpirun bpl-conformance --backend=mpi")
        expect("PASSED" in suite.stdout, "rank 0's suite reports its tests passed", results)
    print("passed: mpirun across 2 hosts (host file, launch agent, TCP BTL on eth0): conformance suite passed")


def bench_two_hosts(bin_dir):
    """bpl-bench-compare --hostfile across 2 hosts, 1 and 2 ranks on each: gloo (bpl-run on each host
    through the launch agent) and mpi (mpirun with the host file) each beside its raw library; the
    table says where it ran and has backplane/raw for every row, and gloo took the path asked for."""
    import tempfile
    with TestHosts(2) as hosts, host_file(hosts, slots=2) as hostfile:
        hosts.serve_launches()
        for per_host, path in ((1, "gloo over tcp (each rank on a machine of its own)"),
                               (2, "shared memory within each of 2 machines, gloo over tcp between them")):
            with tempfile.TemporaryDirectory(prefix="bpl-hosts-bench-") as out:
                argv = [os.path.join(bin_dir, "bpl-bench-compare"), "--hostfile", hostfile.name, "--agent", AGENT,
                        "--nproc", str(per_host), "--out", out, "--mpirun-args",
                        "--mca btl tcp,vader,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
                        "--mca mpi_yield_when_idle 1",
                        "--", "--ops=allreduce,pingpong", "--dtypes=f32", "--max-bytes=1K", "--step-factor=256", "--repetitions=2",
                        "--max-iterations=10"]
                run = hosts.run(0, argv, timeout=TIMEOUT_S)
                results = [(run.returncode, run.stdout + run.stderr)]
                expect_all_passed(results, f"bpl-bench-compare across 2 hosts, {per_host} rank(s) each")
                with open(os.path.join(out, "collectives.md")) as f:
                    table = f.read()
                results = [(run.returncode, table)]
                expect(f"Across 2 machines ({hosts.host(0)}, {hosts.host(1)}), {per_host} rank(s) on each" in table,
                       "the table says where it ran", results)
                expect(f"collectives of world: {path}" in table, f"gloo's path: {path}", results)
                expect(f"ranks {2 * per_host} ({per_host} on this host)" in table, "the ranks of both runs", results)
                expect("peer " not in run.stdout or "skipped: peers are measured on one machine" in run.stdout,
                       "the peers are left out across machines, saying so", [(run.returncode, run.stdout)])
                # the comparison's table, not the one of every library alone below it
                comparison = table.split("## Every library alone")[0]
                cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in comparison.splitlines()
                         if line.startswith("| ")]
                header, rows = cells[0], [row for row in cells[1:] if row[0] in ("allreduce", "pingpong")]
                wanted = [header.index(f"{b}{column}") for b in ("gloo", "mpi") for column in (" µs", "/raw")]
                # a time with the repetitions' range, "12.30 (11.90-14.10)"; a ratio, "(noisy)" where they disagree
                number = r"[0-9.]+( \([0-9.]+-[0-9.]+\)| \(noisy\))?"
                expect(len(rows) == 4 and all(re.fullmatch(number, row[i]) for row in rows for i in wanted),
                       "4 rows, each with backplane's time and backplane/raw for gloo and for mpi", results)
    print("passed: bpl-bench-compare --hostfile across 2 hosts, 1 and 2 ranks each: gloo and mpi beside raw")


SCENARIOS = {f.__name__: f for f in (
    gloo_two_hosts,
    gloo_two_hosts_two_ranks,
    gloo_three_hosts,
    gloo_socket_ifname,
    torchrun_variables_two_hosts,
    examples_two_hosts,
    mpi_two_hosts,
    bench_two_hosts,
)}

if __name__ == "__main__":
    sys.exit(run_scenario(__doc__, SCENARIOS, sys.argv))
