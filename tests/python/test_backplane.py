"""The Python module (python/backplane.py) on real ranks: run under bpl-run (or mpirun) with
PYTHONPATH pointing at python/ and BPL_LIBRARY at libbackplane.so. Each rank checks every result and
prints "python rank R: ok"; any failure exits non-zero."""
import array
import os
import sys

import backplane

try:
    import numpy
except ImportError:  # the module does not need it; the test covers it where it is installed
    numpy = None


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    with backplane.Runtime() as rt:
        info = rt.describe()
        world = rt.world
        rank, size = world.rank, world.size
        launcher_rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
        launcher_size = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE"))
        expect((rank, size) == (int(launcher_rank), int(launcher_size)), "rank/size from the launcher")
        expect(info["backend"] == os.environ.get("BPL_BACKEND", info["backend"]), "describe: backend")
        expect(info["world_size"] == size and info["timeout_ms"] > 0, "describe: world size, timeout")
        expect(backplane.abi_version()[0] == 1, "ABI major 1")

        # bytearray (u8), in place
        data = bytearray([rank + 1] * 5)
        world.allreduce(data)
        expect(list(data) == [size * (size + 1) // 2] * 5, "allreduce of a bytearray: %r" % list(data))

        # array.array: f32 out of place, i64 max
        send = array.array("f", [float(rank)] * 8)
        recv = array.array("f", [0.0] * 8)
        world.allreduce(send, recv, op="sum")
        expect(list(recv) == [float(sum(range(size)))] * 8, "allreduce of array('f')")
        big = array.array("q", [rank * 10**12])
        world.allreduce(big, op="max")
        expect(big[0] == (size - 1) * 10**12, "allreduce max of array('q')")

        # broadcast from the last rank; allgather; reduce_scatter
        buf = array.array("d", [float(rank)] * 3)
        world.broadcast(buf, root=size - 1)
        expect(list(buf) == [float(size - 1)] * 3, "broadcast")
        gathered = array.array("i", [0] * (2 * size))
        world.allgather(array.array("i", [rank, -rank]), gathered)
        expect(list(gathered) == [v for r in range(size) for v in (r, -r)], "allgather: %r" % list(gathered))
        scattered = array.array("f", [0.0])
        world.reduce_scatter(array.array("f", [1.0] * size), scattered)
        expect(scattered[0] == float(size), "reduce_scatter")

        # bf16 held in 16-bit integers: 1.0 is 0x3f80, sum over ranks of 1.0 is size
        bf16 = array.array("H", [0x3F80] * 4)
        world.allreduce(bf16, dtype="bf16")
        expect(bf16[0] == {1: 0x3F80, 2: 0x4000, 3: 0x4040, 4: 0x4080}[size], "bf16 allreduce: %#x" % bf16[0])

        # numpy arrays, when numpy is installed
        if numpy is not None:
            x = numpy.full((4, 3), rank + 1, dtype=numpy.float32)
            world.allreduce(x, op="avg")
            expect(numpy.allclose(x, (size + 1) / 2.0), "numpy f32 avg")
            y = numpy.arange(6, dtype=numpy.float64) * (rank + 1)
            out = numpy.empty_like(y)
            world.allreduce(y, out)
            expect(numpy.array_equal(out, numpy.arange(6) * size * (size + 1) / 2), "numpy f64 out of place")
            try:
                world.allreduce(numpy.zeros((4, 4), dtype=numpy.float32)[:, 1])
                expect(False, "a strided view must be refused")
            except ValueError as e:
                expect("C-contiguous" in str(e), str(e))

        # split: even and odd ranks
        group = world.split(color=rank % 2, key=rank)
        members = [r for r in range(size) if r % 2 == rank % 2]
        expect(group.size == len(members) and group.rank == members.index(rank), "split rank/size")
        one = array.array("i", [rank])
        group.allreduce(one)
        expect(one[0] == sum(members), "allreduce in the split")
        group.destroy()
        expect(world.split(color=None) is None, "color None: no communicator")

        # errors carry the status and bpl_last_error()
        try:
            world.broadcast(bytearray(4), root=size + 5)
            expect(False, "a root out of range must raise")
        except backplane.BackplaneError as e:
            expect(e.status == 1 and e.status_name == "BPL_ERR_INVALID_ARGUMENT", e.status_name)
            expect("root = %d" % (size + 5) in e.message, e.message)
        try:
            world.allreduce(b"read-only", bytearray(9))
            world.allreduce(b"read-only")
            expect(False, "an in-place allreduce of bytes must be refused")
        except ValueError as e:
            expect("read-only" in str(e), str(e))
        world.barrier()
    print("python rank %d: ok (numpy %s)" % (rank, "tested" if numpy is not None else "not installed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
