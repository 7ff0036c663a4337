#!/usr/bin/env python3
"""backplane across test hosts (tests/support/hosts.py): real multi-node launches, each host a machine
of its own to backplane, talking over its own interface.

    hosts_test.py BIN_DIR SCENARIO      (exit 0 passed, 1 failed, 77 skipped with the reason printed)

Scenarios:
  gloo_two_hosts           bpl-run --nnodes 2, one rank per host: Gloo over TCP between the hosts (each rank
                           a machine of its own), the host names resolved as a cluster's DNS would; the
                           conformance suite passes
  gloo_two_hosts_two_ranks two ranks per host: shared memory within each host, TCP between (hierarchical)
  gloo_three_hosts         three hosts, one rank each
  gloo_socket_ifname       GLOO_SOCKET_IFNAME=eth0 is the transport; one no host has is an error naming it
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from hosts import SKIPPED, TestHosts, why_hosts_cannot_be_made  # noqa: E402

MASTER_PORT = "29500"  # every test host has a network stack of its own: no other job shares its ports
TIMEOUT_S = 240


def launch(hosts, bin_dir, ranks_per_host, program, env_extra=None):
    """`program` as one job over every host (bpl-run --nnodes on each, host 0 the master); returns
    [(exit status, output)] per host."""
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TIMEOUT_MS="60000", **(env_extra or {}))
    procs = []
    for i in range(hosts.count):
        argv = [os.path.join(bin_dir, "bpl-run"), "--nnodes", str(hosts.count), "--node-rank", str(i),
                "--master-addr", hosts.address(0), "--master-port", MASTER_PORT,
                "--nproc-per-node", str(ranks_per_host), *program]
        procs.append(hosts.start(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n(TIMED OUT after {TIMEOUT_S} s)"
        results.append((p.returncode, out))
    return results


class Failure(Exception):
    pass


def expect(condition, what, results):
    if not condition:
        shown = "\n".join(f"--- host {i}: exit {code}\n{out[-4000:]}" for i, (code, out) in enumerate(results))
        raise Failure(f"{what}\n{shown}")


def expect_all_passed(results, what):
    expect(all(code == 0 for code, _ in results), f"{what}: every host's job exits 0", results)


def info_and_conformance(bin_dir, count, ranks_per_host, path, env_extra=None, transport=None):
    with TestHosts(count) as hosts:
        info = launch(hosts, bin_dir, ranks_per_host, [os.path.join(bin_dir, "bpl-info"), "--init"], env_extra)
        expect_all_passed(info, "bpl-info --init")
        details = info[0][1]
        expect(f"store={hosts.address(0)}:{MASTER_PORT} (server)" in details, "the store on host 0's address", info)
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


SCENARIOS = {f.__name__: f for f in (gloo_two_hosts, gloo_two_hosts_two_ranks, gloo_three_hosts, gloo_socket_ifname)}


def main(argv):
    if len(argv) != 2 or argv[1] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    reason = why_hosts_cannot_be_made()
    if reason:
        print(f"skipped: {reason}")
        return SKIPPED
    try:
        SCENARIOS[argv[1]](os.path.abspath(argv[0]))
    except Failure as failure:
        print(f"FAILED: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
