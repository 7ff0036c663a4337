"""torch.profiler sees every operation of the backplane group as torch's own backends show theirs: one
asynchronous event each, "backplane:<operation>", with its input tensors' shapes, under torch.profiler and
under the autograd profiler that PyTorch's own suite uses. BPL_TRACE's timeline of each rank lists the
same operations in the same order, and is written though the profiled group's runtime outlives the
program's end (the profiler keeps what it recorded).

    test_profiler_events.py <bin dir> [ranks]
"""
import json
import os
import subprocess
import sys
import tempfile

# Each rank: the operations, profiled; prints one line "events <json>" per profiler.
RANK = r"""
import json, torch, torch.distributed as dist
import backplane_torch
dist.init_process_group("backplane")
rank, world = dist.get_rank(), dist.get_world_size()

def operations():
    dist.all_reduce(torch.ones(4, 3))
    dist.broadcast(torch.ones(5), 0)
    dist.all_gather([torch.zeros(2, 2) for _ in range(world)], torch.ones(2, 2))
    dist.all_gather_into_tensor(torch.zeros(world * 3), torch.ones(3))
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world))
    dist.all_to_all_single(torch.zeros(world * 2), torch.ones(world * 2))
    dist.all_reduce(torch.ones(7), async_op=True).wait()
    if rank == 0:
        dist.send(torch.ones(3), 1)
    elif rank == 1:
        dist.recv(torch.zeros(3), 0)
    dist.barrier()

for name, profiler in (("torch.profiler", torch.profiler.profile(record_shapes=True)),
                       ("autograd", torch.autograd.profiler.profile(record_shapes=True))):
    with profiler:
        operations()
    events = profiler.events() if name == "torch.profiler" else profiler.function_events
    ours = sorted((e for e in events if e.name.startswith("backplane:")), key=lambda e: e.time_range.start)
    print("events", json.dumps([name, [[e.name, e.is_async, e.count, e.input_shapes] for e in ours]]), flush=True)
dist.destroy_process_group()
"""

# What each rank calls, in order, as the profiler names it, with its inputs' shapes.
def expected(rank, world):
    calls = [["backplane:all_reduce", [[4, 3]]], ["backplane:broadcast", [[5]]], ["backplane:all_gather", [[2, 2]]],
             ["backplane:all_gather_into_tensor", [[3]]], ["backplane:reduce_scatter_tensor", [[2 * world]]],
             ["backplane:all_to_all", [[world * 2]]], ["backplane:all_reduce", [[7]]]]
    if rank < 2:
        calls.append(["backplane:send" if rank == 0 else "backplane:recv", [[3]]])
    return calls + [["backplane:barrier", []]]


# The core's name of each (the trace's).
CORE = {"all_reduce": "allreduce", "broadcast": "broadcast", "all_gather": "allgather",
        "all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reduce_scatter", "all_to_all": "alltoall",
        "send": "send", "recv": "recv", "barrier": "barrier"}

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def main():
    bin_dir = os.path.abspath(sys.argv[1])
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    trace_dir = tempfile.mkdtemp(prefix="bpl-profiler-trace-")
    env = dict(os.environ, NXD_CPU_MODE="1", BPL_TRACE=trace_dir)
    job = subprocess.run([os.path.join(bin_dir, "bpl-run"), "--nproc-per-node", str(world), sys.executable, "-c", RANK],
                         env=env, capture_output=True, text=True, timeout=300)
    said = f"{job.returncode} {job.stdout[-3000:]!r} {job.stderr[-3000:]!r}"
    expect(job.returncode == 0, f"the job ends well: {said}")
    for rank in range(world):
        lines = [line.split(":events ", 1)[1] for line in job.stdout.splitlines() if line.startswith(f"[rank{rank}]:events ")]
        expect(len(lines) == 2, f"rank {rank}: both profilers report: {said}")
        calls = expected(rank, world)
        for profiler, events in map(json.loads, lines):
            seen = [[name, shapes] for name, _, _, shapes in events]
            expect(seen == calls, f"rank {rank}, {profiler}: events {seen}, expected {calls}")
            expect(all(is_async and count == 1 for _, is_async, count, _ in events),
                   f"rank {rank}, {profiler}: every event asynchronous, counted once: {events}")
        path = os.path.join(trace_dir, f"rank-{rank}.json")
        expect(os.path.exists(path), f"rank {rank}: BPL_TRACE wrote {path} though its runtime outlived the program")
        if os.path.exists(path):
            with open(path) as file:
                traced = [e["name"] for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]
            profiled = [CORE[name.split(":", 1)[1]] for name, _ in calls]
            expect(traced == profiled * 2, f"rank {rank}: the trace {traced}, the profilers {profiled} twice")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))
    print(f"passed: torch.profiler and BPL_TRACE agree on {world} ranks")


if __name__ == "__main__":
    main()
