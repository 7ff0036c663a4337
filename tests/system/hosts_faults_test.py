#!/usr/bin/env python3
"""backplane across test hosts (tests/support/hosts.py) when a host fails: killed, stopped, cut off or
never there, every survivor fails in time naming the right rank, or the job goes on where it was asked to.

    hosts_faults_test.py BIN_DIR SCENARIO      (exit 0 passed, 1 failed, 77 skipped with the reason printed)

Scenarios:
  fault_host_killed        every process of one of 3 hosts SIGKILLed mid-allreduce: both survivors fail at
                           once naming its rank, nothing left running
  fault_link_down          one of 3 hosts' link taken down mid-allreduce (a partition): every rank fails within the
                           timeout naming the rank and address it cannot reach, nothing left running
  fault_link_down_master   the same with the link of host 0 (rank 0's, the store's) taken down
  fault_link_down_two_ranks  the same with 2 hosts of 2 ranks (the hierarchical path)
  fault_host_stopped       one of 3 hosts' processes stopped, its network up: TIMEOUT that calls no one unreachable
  elastic_link_down        examples/elastic_sgd over 3 hosts under bpl-run --keep-going, host 2's link taken down
                           mid-training (a partition): hosts 0 and 1 shrink and end with the parameters of an
                           uninterrupted run; host 2's rank, cut off from the job's store, stops and trains no further
  fault_link_returns       a link down for 2 s, then up again, within the timeout: the allreduce completes
  fault_mpi_host_killed    mpirun over 2 hosts, one's processes SIGKILLed: the job ends at once naming the host
  fault_mpi_link_down      mpirun over 2 hosts, one's link down: rank 0's TIMEOUT, the job ends naming the host
  fault_host_never_joins   a host that never starts its rank: TIMEOUT naming the missing rank
  fault_master_unreachable MASTER_ADDR no host has: an error naming the address, within the timeout
"""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from hosts import TestHosts  # noqa: E402
from hosts_jobs import (MASTER_PORT, TIMEOUT_S, AllreduceLoop, expect, expect_all_passed, host_file,  # noqa: E402
                        mpirun_command, named_culprits, outputs, run_scenario)


def fault_host_killed(bin_dir):
    """Three hosts in a loop of allreduces; every process of host 2 SIGKILLed (the kernel closes its
    sockets): both survivors fail at once, naming rank 2 as on another machine, and leave nothing behind."""
    with TestHosts(3) as hosts:
        job = AllreduceLoop(hosts, bin_dir, 30000)
        time.sleep(1)
        killed_at = time.monotonic()
        hosts.kill_host(2)
        results = job.results([0, 1])
        elapsed = time.monotonic() - killed_at
        expect(all(code != 0 for code, _ in results), "every survivor fails", results)
        expect(all("BPL_ERR_REMOTE" in out and "rank 2, on another machine" in out for _, out in results),
               "every survivor names rank 2, on another machine", results)
        expect(all(named_culprits(out) == {2} for _, out in results),
               "what every survivor says failed names rank 2 alone, not the other survivor", results)
        expect(elapsed < 10, f"the survivors fail at once, well within the 30 s timeout (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0, 1], results)
    print(f"passed: host 2 killed: both survivors failed in {elapsed:.1f} s naming rank 2; nothing left behind")


def link_down(bin_dir, count, ranks_per_host, cut):
    """`count` hosts in a loop of allreduces; host `cut`'s link taken down (a partition: no RST, no
    FIN, its processes running): every rank, on both sides, fails with TIMEOUT within the 5 s timeout and
    its slack, naming the ranks and address of every host it cannot reach, and every host's processes
    end."""
    timeout_s = 5
    with TestHosts(count) as hosts:
        job = AllreduceLoop(hosts, bin_dir, timeout_s * 1000, ranks_per_host=ranks_per_host)
        time.sleep(1)
        cut_at = time.monotonic()
        hosts.set_link(cut, up=False)
        results = job.results()
        elapsed = time.monotonic() - cut_at
        expect(all(code != 0 for code, _ in results), "every host's job fails, the cut-off one's too", results)
        failures = [[line for line in out.splitlines() if "failed after" in line] for _, out in results]
        expect(all(len(lines) == ranks_per_host for lines in failures), "every rank reports its failure", results)
        expect(all("BPL_ERR_TIMEOUT" in line for lines in failures for line in lines), "every rank's is a TIMEOUT",
               results)
        def unreachable(i):  # what a rank says of host i when it cannot reach it
            ranks = list(range(i * ranks_per_host, (i + 1) * ranks_per_host))
            return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} at {hosts.address(i)} " \
                   f"{'are' if len(ranks) > 1 else 'is'} unreachable"
        connected = [i for i in range(count) if i != cut]
        expect(all(unreachable(cut) in line for i in connected for line in failures[i]),
               f"every connected rank names the cut-off host's ranks and address: '{unreachable(cut)}'", results)
        expect(all(all(unreachable(i) in line for i in connected) for line in failures[cut]),
               "every cut-off rank names every host it cannot reach, with its ranks and address", results)
        expect(elapsed < timeout_s * 3, f"within the {timeout_s} s timeout and its slack (took {elapsed:.1f} s)",
               results)
        job.expect_nothing_left(range(count), results)
    for lines in failures:
        print("\n".join(lines))
    print(f"passed: {count} hosts x {ranks_per_host} rank(s), host {cut}'s link down: every rank failed in "
          f"{elapsed:.1f} s (timeout {timeout_s} s), naming the unreachable rank and address; nothing left behind")


def fault_link_down(bin_dir):
    link_down(bin_dir, 3, 1, cut=2)


def fault_link_down_master(bin_dir):
    link_down(bin_dir, 3, 1, cut=0)  # the host of rank 0 and of the store


def fault_link_down_two_ranks(bin_dir):
    link_down(bin_dir, 2, 2, cut=1)


def fault_host_stopped(bin_dir):
    """Every process of host 2 stopped (SIGSTOP) mid-allreduce of 64 MiB, its network up: its kernel
    still answers, also once its receive buffers are full (it acknowledges the senders' zero-window
    probes), so the survivors' TIMEOUT must not call it unreachable; once it is continued, it fails too
    (the survivors closed their connections) and nothing is left running."""
    timeout_s = 5
    with TestHosts(3) as hosts:
        job = AllreduceLoop(hosts, bin_dir, timeout_s * 1000, count=1 << 24)
        time.sleep(1)
        stopped_at = time.monotonic()
        hosts.signal_host(2, "STOP")
        results = job.results([0, 1])
        elapsed = time.monotonic() - stopped_at
        hosts.signal_host(2, "CONT")
        results += job.results([2])
        expect(all(code != 0 for code, _ in results), "every rank fails, the stopped one once continued", results)
        expect(all("BPL_ERR_TIMEOUT" in out for _, out in results[:2]), "both survivors report a TIMEOUT", results)
        expect(not any("unreachable" in out for _, out in results), "no rank calls a stopped machine unreachable",
               results)
        expect(elapsed < timeout_s * 3, f"within the {timeout_s} s timeout and its slack (took {elapsed:.1f} s)",
               results)
        job.expect_nothing_left(range(3), results)
    print(f"passed: host 2 stopped: both survivors failed with TIMEOUT in {elapsed:.1f} s, calling no machine "
          "unreachable; rank 2 failed once continued; nothing left behind")


def elastic_link_down(bin_dir):
    """No split brain: of a partitioned job, only the side that reaches the job's store (bpl-store, served
    by host 0's bpl-run) goes on."""
    timeout_s, steps = 3, 150
    reference = subprocess.run([os.path.join(bin_dir, "elastic_sgd"), "--steps", str(steps)], capture_output=True,
                               text=True, env=dict(os.environ, BPL_BACKEND="gloo", RANK="0", WORLD_SIZE="1"))
    expect(reference.returncode == 0, "the uninterrupted run on one rank", [(reference.returncode, reference.stdout)])
    final = re.search(r"w = (.*)", reference.stdout).group(1).split()
    with TestHosts(3) as hosts:
        env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS=str(timeout_s * 1000))
        procs = [hosts.start(i, [os.path.join(bin_dir, "bpl-run"), "--nnodes", "3", "--node-rank", str(i),
                                 "--master-addr", hosts.address(0), "--master-port", MASTER_PORT, "--keep-going",
                                 os.path.join(bin_dir, "elastic_sgd"), "--steps", str(steps), "--pause-ms", "20"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
        time.sleep(1.5)  # the ranks have met and train
        hosts.set_link(2, up=False)
        results = outputs(hosts, procs)
        for i in range(3):
            job_left = hosts.processes(i)
            expect(not job_left, f"nothing left in host {i}: {job_left}", results)
    survivors = [out for _, out in results[:2]]
    expect(all(code == 0 for code, _ in results[:2]), "hosts 0 and 1 go on and end well", results)
    expect(all("ranks [2] of the communicator failed" in out for out in survivors), "both agree that rank 2 failed",
           results)
    for out in survivors:
        got = re.search(r"done: .* w = (.*)", out)
        expect(got is not None, "each survivor finishes", results)
        expect(all(abs(float(a) - float(b)) <= 1e-12 * (1 + abs(float(b))) for a, b in zip(got.group(1).split(), final)),
               "the survivors end with the parameters of the uninterrupted run", results)
    code, cut_off = results[2]
    expect(code != 0 and "done:" not in cut_off, "the cut-off rank does not train on", results)
    expect("left the job" in cut_off and ("cut off from the job" in cut_off or "counted rank 2 as failed" in cut_off),
           "the cut-off rank says why it stops", results)
    print(next(line for line in cut_off.splitlines() if "left the job" in line))
    print("passed: host 2 cut off mid-training: hosts 0 and 1 shrank and ended with the uninterrupted run's "
          "parameters; host 2's rank stopped, trained no further; nothing left behind")


def fault_mpi_host_killed(bin_dir):
    """mpirun over 2 hosts in a loop of allreduces on the mpi backend; every process of host 1 SIGKILLed:
    Open MPI's promise, the job ends at once naming the lost host, and nothing is left in host 0."""
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        job = AllreduceLoop(hosts, bin_dir, 30000, mpirun=mpirun_command(hosts, hostfile))
        time.sleep(1)
        killed_at = time.monotonic()
        hosts.kill_host(1)
        results = job.results()
        elapsed = time.monotonic() - killed_at
        expect(results[0][0] != 0, "mpirun fails", results)
        expect(f"on node {hosts.host(1)}" in results[0][1], f"mpirun names the lost host {hosts.host(1)}", results)
        expect(elapsed < 10, f"at once, well within the 30 s timeout (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0], results)
    print(f"passed: mpirun, host 1 killed: the job ended in {elapsed:.1f} s naming {hosts.host(1)}; nothing left")


# ORTE's out-of-band channel probes an idle connection after 6 s, then every second, and gives up after
# 3 unanswered probes: a daemon cut off is lost in about 9 s (Open MPI's defaults: 300 s, 20 s, 9 probes).
# Well after rank 0's TIMEOUT (at most T + 1 s = 4 s after the cut), so that mpirun reports that first:
# with 2 s (lost in about 5 s) a loaded machine let the lost daemon come first (once in a full suite).
MPI_OOB_KEEPALIVE = ["--mca", "oob_tcp_keepalive_time", "6", "--mca", "oob_tcp_keepalive_intvl", "1",
                     "--mca", "oob_tcp_keepalive_probes", "3"]


# A connection whose data goes unacknowledged gets no keepalive: TCP retransmits it tcp_retries2 times
# (Linux's 15: about 15 minutes) before it gives up. Host 1's daemon forwards its rank's output to
# mpirun over such a connection, so it learns of the cut only then; 5 (about 12 s) is what a cluster
# tuned for quick failure detection sets.
TCP_RETRIES = 5


def fault_mpi_link_down(bin_dir):
    """mpirun over 2 hosts in a loop of allreduces on the mpi backend; host 1's link down: rank 0 fails
    with TIMEOUT after backplane's 3 s and mpirun ends the job naming it; host 1's daemon learns of the cut
    when TCP gives up (TCP_RETRIES, MPI_OOB_KEEPALIVE) and ends its rank and itself."""
    import re
    with TestHosts(2) as hosts, host_file(hosts) as hostfile:
        for i in range(2):
            hosts.run(i, ["sysctl", "-q", f"net.ipv4.tcp_retries2={TCP_RETRIES}"])
        job = AllreduceLoop(hosts, bin_dir, 3000, mpirun=mpirun_command(hosts, hostfile, *MPI_OOB_KEEPALIVE))
        time.sleep(1)
        cut_at = time.monotonic()
        cut_time = time.time()
        hosts.set_link(1, up=False)
        results = job.results()
        elapsed = time.monotonic() - cut_at
        expect(results[0][0] != 0, "mpirun fails", results)
        expect("rank 0: failed" in results[0][1] and "BPL_ERR_TIMEOUT" in results[0][1], "rank 0 reports a TIMEOUT",
               results)
        expect(re.search(r"Process name: *\[\[\d+,1\],0\]", results[0][1]) is not None,
               "mpirun ends the job naming rank 0, the rank that failed", results)
        failed_at = re.search(r"rank 0: failed after [0-9.]+ s \(at ([0-9.]+)\)", results[0][1])
        failed_after = float(failed_at.group(1)) - cut_time if failed_at else float("inf")
        expect(failed_after < 3 * 3, f"rank 0 fails within the 3 s timeout and its slack (took {failed_after:.1f} s)",
               results)
        expect(elapsed < 60, f"mpirun ends the job once TCP gives up (took {elapsed:.1f} s)", results)
        job.expect_nothing_left([0], results)
        deadline = time.monotonic() + 60
        while hosts.processes(1) and time.monotonic() < deadline:
            time.sleep(0.5)
        job.expect_nothing_left([1], results)
        cut_off_ended = time.monotonic() - cut_at
    print(f"passed: mpirun, host 1's link down: rank 0 TIMEOUT {failed_after:.1f} s after the cut, "
          f"the job ended in {elapsed:.1f} s naming rank 0; "
          f"host 1's daemon and rank ended {cut_off_ended:.1f} s after the cut")


def fault_link_returns(bin_dir):
    """Host 1's link down for 2 s mid-loop, then up again, well within the 10 s timeout: the allreduce in
    flight completes (TCP retransmits what the cut dropped; nothing was lost, nothing timed out) and
    every result, before and after, is right."""
    import re
    with TestHosts(2) as hosts:
        job = AllreduceLoop(hosts, bin_dir, 10000, seconds=8)
        time.sleep(1)
        hosts.set_link(1, up=False)
        time.sleep(2)
        hosts.set_link(1, up=True)
        results = job.results()
        expect_all_passed(results, "both ranks finish their loop")
        longest = [float(m.group(1)) for m in (re.search(r"the longest ([0-9.]+) s", out) for _, out in results) if m]
        expect(len(longest) == 2 and min(longest) >= 1.5,
               f"the cut stalled an allreduce on both ranks, which then completed (longest {longest} s)", results)
    print(f"passed: host 1's link down for 2 s: the stalled allreduce completed (longest {max(longest):.1f} s), "
          "every result right")


def alone(hosts, i, bin_dir, master, node_rank, timeout_ms):
    """bpl-info --init as node `node_rank` of 2 in host i, meeting at `master`; (status, output, seconds)."""
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS=str(timeout_ms))
    argv = [os.path.join(bin_dir, "bpl-run"), "--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", master,
            "--master-port", MASTER_PORT, "--nproc-per-node", "1", os.path.join(bin_dir, "bpl-info"), "--init"]
    start = time.monotonic()
    result = hosts.run(i, argv, env=env, timeout=TIMEOUT_S)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - start


def fault_host_never_joins(bin_dir):
    """Host 1 never starts its rank: host 0's fails within the timeout, naming the missing rank."""
    with TestHosts(2) as hosts:
        code, out, seconds = alone(hosts, 0, bin_dir, hosts.address(0), 0, 5000)
        results = [(code, out)]
        expect(code != 0 and "BPL_ERR_TIMEOUT" in out and "1/2 joined, missing ranks [1]" in out,
               "a TIMEOUT naming the missing rank", results)
        expect(seconds < 15, f"within the 5 s timeout and its slack (took {seconds:.1f} s)", results)
    print(f"passed: a host that never joins: TIMEOUT naming rank 1 after {seconds:.1f} s")


def fault_master_unreachable(bin_dir):
    """MASTER_ADDR an address of the test subnet that no host has: an error naming it, within the timeout."""
    with TestHosts(2) as hosts:
        nobody = f"{hosts.address(0).rsplit('.', 1)[0]}.99"
        code, out, seconds = alone(hosts, 1, bin_dir, nobody, 1, 5000)
        results = [(code, out)]
        expect(code != 0 and f"rendezvous at {nobody}:{MASTER_PORT} as rank 1" in out, "an error naming the address",
               results)
        expect(seconds < 15, f"within the 5 s timeout and its slack (took {seconds:.1f} s)", results)
    print(f"passed: MASTER_ADDR unreachable: an error naming {nobody} after {seconds:.1f} s")


SCENARIOS = {f.__name__: f for f in (
    fault_host_killed,
    fault_link_down,
    fault_link_down_master,
    fault_link_down_two_ranks,
    fault_host_stopped,
    elastic_link_down,
    fault_link_returns,
    fault_mpi_host_killed,
    fault_mpi_link_down,
    fault_host_never_joins,
    fault_master_unreachable,
)}

if __name__ == "__main__":
    sys.exit(run_scenario(__doc__, SCENARIOS, sys.argv))
