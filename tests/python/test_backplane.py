"""The Python module (python/backplane/) on real ranks: run under bpl-run (or mpirun) with
PYTHONPATH pointing at python/ and BPL_LIBRARY at libbackplane.so. Each rank checks every result and
prints "python rank R: ok"; any failure exits non-zero."""
import array
import functools
import os
import sys
import tempfile
import time

import backplane

try:
    import numpy
except ImportError:  # the module does not need it; the test covers it where it is installed
    numpy = None


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def stderr_of(call):
    """What `call` writes to file descriptor 2 (the C library's warnings go there)."""
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        return captured.read().decode("utf-8", "replace")


def expect_error(call, status_name, text, what):
    try:
        call()
    except backplane.BackplaneError as e:
        expect(e.status_name == status_name and text in e.message, "%s: %s %s" % (what, e.status_name, e.message))
        return
    raise AssertionError("%s: no BackplaneError" % what)


def point_to_point_and_requests(world):
    rank, size = world.rank, world.size
    right, left = (rank + 1) % size, (rank - 1) % size
    # a ring: every rank sends right (asynchronously) and receives from the left
    outgoing = array.array("i", [rank] * 5)
    incoming = array.array("i", [0] * 5)
    sending = world.send(outgoing, peer=right, tag=3, async_op=True)
    world.recv(incoming, peer=left, tag=3)
    sending.wait()
    expect(list(incoming) == [left] * 5, "ring send/recv: %r" % list(incoming))

    # every rank but 0 sends rank 0 its rank; rank 0 takes them from whichever sends first
    if rank == 0:
        got = {}
        for _ in range(size - 1):
            value = array.array("i", [-1])
            source = world.recv_any(value, tag=4)
            got[source] = value[0]
        expect(got == {r: r for r in range(1, size)}, "recv_any: %r" % got)
    else:
        world.send(array.array("i", [rank]), peer=0, tag=4)

    # an asynchronous allreduce, polled with test() and then waited for
    total = array.array("d", [rank + 1.0] * 4)
    request = world.allreduce(total, async_op=True)
    deadline = time.monotonic() + 30
    while not request.test():
        expect(time.monotonic() < deadline, "async allreduce never ended")
    request.wait()  # ended: returns at once
    expect(list(total) == [size * (size + 1) / 2.0] * 4, "async allreduce: %r" % list(total))

    # a wait shorter than the operation raises and leaves it in flight; a later wait completes it
    late = array.array("f", [1.0] * 3)
    if rank == size - 1:
        time.sleep(0.5)
    request = world.allreduce(late, async_op=True)
    if rank == 0:
        expect_error(lambda: request.wait(timeout_ms=50), "BPL_ERR_TIMEOUT", "still in flight", "a 50 ms wait on a late rank")
    request.wait()
    expect(list(late) == [float(size)] * 3, "allreduce completed after a short wait")

    # several requests in flight at once, waited for in reverse order
    buffers = [array.array("i", [rank * 10 + i]) for i in range(4)]
    requests = [world.allreduce(b, op="max", async_op=True) for b in buffers]
    for request in reversed(requests):
        request.wait()
    expect([b[0] for b in buffers] == [(size - 1) * 10 + i for i in range(4)], "requests in flight together")


def variable_collectives(world):
    rank, size = world.rank, world.size
    # gather to the last rank, scatter from it
    root = size - 1
    gathered = array.array("i", [0] * (3 * size)) if rank == root else None
    world.gather(array.array("i", [rank, rank * 2, rank * 3]), gathered, root=root)
    if rank == root:
        expect(list(gathered) == [v for r in range(size) for v in (r, 2 * r, 3 * r)], "gather: %r" % list(gathered))
    part = array.array("f", [0.0, 0.0])
    world.scatter(array.array("f", [float(v) for v in range(2 * size)]) if rank == root else None, part, root=root)
    expect(list(part) == [2.0 * rank, 2.0 * rank + 1], "scatter: %r" % list(part))
    # allgatherv: rank r gives r + 1 elements, laid end to end
    counts = [r + 1 for r in range(size)]
    everything = array.array("q", [0] * sum(counts))
    world.allgatherv(array.array("q", [100 * rank + i for i in range(rank + 1)]), everything, counts)
    expect(list(everything) == [100 * r + i for r in range(size) for i in range(r + 1)], "allgatherv: %r" % list(everything))
    # alltoallv: rank q sends rank r (q + r) % 3 + 1 elements valued 1000 q + r, asynchronously
    between = lambda q, r: (q + r) % 3 + 1  # noqa: E731
    send = array.array("i", [1000 * rank + r for r in range(size) for _ in range(between(rank, r))])
    recv = array.array("i", [0] * sum(between(q, rank) for q in range(size)))
    world.alltoallv(send, [between(rank, r) for r in range(size)], recv, [between(q, rank) for q in range(size)],
                    async_op=True).wait()
    expect(list(recv) == [1000 * q + rank for q in range(size) for _ in range(between(q, rank))], "alltoallv: %r" % list(recv))
    try:
        world.allgatherv(array.array("q", [1]), everything, counts[:-1] if size > 1 else [])
        expect(False, "counts of the wrong length must be refused")
    except ValueError as e:
        expect("one per rank" in str(e), str(e))
    receive_buffers_are_checked_before_anything_is_written(world)
    integers_that_do_not_fit_are_refused(world)
    # byte strings of any length, the empty one included
    text = lambda r: (b"rank %d:" % r) + bytes([r]) * (700 * r) + b"\0end"  # noqa: E731
    for root in range(size):
        got = world.broadcast_bytes(text(root) if rank == root else None, root=root)
        expect(got == text(root), "broadcast_bytes from %d: %d bytes" % (root, len(got)))
    expect(world.broadcast_bytes(b"" if rank == 0 else b"x") == b"", "broadcast_bytes of nothing")
    gathered = world.allgather_bytes(b"" if rank == 1 else text(rank))
    expect(gathered == [b"" if r == 1 else text(r) for r in range(size)], "allgather_bytes: %r" % [len(g) for g in gathered])


def expect_value_error(call, text, what):
    try:
        call()
    except ValueError as e:
        expect(text in str(e), "%s: %s" % (what, e))
        return
    raise AssertionError("%s: no ValueError" % what)


def integers_that_do_not_fit_are_refused(world):
    """An integer outside its C parameter's range is a ValueError naming it and its value (ctypes alone
    would cut it: root 2**40 broadcast from rank 0); unsigned arrays wider than a byte, which the ABI has
    no dtype for, are refused unless given one, on every rank alike."""
    data = array.array("i", [world.rank])
    fits = "which does not fit its C type"
    expect_value_error(lambda: world.broadcast(data, root=2**40), "bpl_broadcast: argument 5 is 1099511627776, " + fits,
                       "broadcast from root 2**40")
    expect_value_error(lambda: world.split(0, key=2**40), "bpl_comm_split: argument 3 is 1099511627776, " + fits,
                       "split with key 2**40")
    expect_value_error(lambda: world.set_timeout(2**70), "argument 2 is %d, %s int64_t" % (2**70, fits),
                       "a timeout of 2**70 ms")
    expect_value_error(lambda: backplane.Runtime(rank=-2**40), "rank is -1099511627776, " + fits, "Runtime(rank=-2**40)")
    expect_value_error(lambda: world.allgatherv(data, array.array("i", [0] * world.size), [2**63] * world.size),
                       "counts[0] is %d, %s int64_t" % (2**63, fits), "allgatherv counts of 2**63")
    for code, bits in (("I", 32), ("Q", 64)):
        unsigned = array.array(code, [3000000000 if world.rank == 0 else 1])
        expect_value_error(lambda: world.allreduce(unsigned, op="max"), "holds unsigned %d-bit integers" % bits,
                           "allreduce of array(%r)" % code)
    world.broadcast(data, root=0)  # the communicator goes on
    expect(data[0] == 0, "a broadcast after the refusals: %r" % list(data))


def receive_buffers_are_checked_before_anything_is_written(world):
    """A receive buffer too small for the result, or of another dtype than the send, is a ValueError
    naming it, on every rank alike, and nothing is written past it (the memory behind a view stays)."""
    rank, size = world.rank, world.size
    send = array.array("f", [1.0] * 6)
    behind = array.array("f", [-1.0] * 6)
    short = memoryview(behind)[:2]
    expect_value_error(lambda: world.allreduce(send, short), "recv holds 2 elements: expected 6", "allreduce, short recv")
    expect_value_error(lambda: world.reduce(send, short, root=rank), "recv holds 2 elements: expected 6",
                       "reduce, short recv on its root")
    expect_value_error(lambda: world.allreduce(send, array.array("d", [0.0] * 6)), "recv holds f64 elements and send f32",
                       "allreduce, f64 recv of an f32 send")
    expect_value_error(lambda: world.alltoall(array.array("f", [0.0] * size), array.array("i", [0] * size)),
                       "both must hold one dtype", "alltoall of two dtypes")
    counts = [2] * size
    expect_value_error(lambda: world.allgatherv(array.array("f", [0.0] * 2), short, counts),
                       "recv holds 2 elements: its blocks reach element %d" % (2 * size), "allgatherv, short recv")
    expect_value_error(lambda: world.alltoallv(array.array("f", [0.0] * 2), counts, array.array("f", [0.0] * 2 * size), counts),
                       "send holds 2 elements: its blocks reach element %d" % (2 * size), "alltoallv, short send")
    expect(list(behind) == [-1.0] * 6, "nothing written: %r" % list(behind))
    world.allreduce(send, memoryview(behind))  # the right size goes through
    expect(list(behind) == [float(size)] * 6, "allreduce into the whole buffer: %r" % list(behind))


def devices_kernels_and_programs(rt, world):
    expect(rt.device_count() >= 1, "a device")
    props = rt.device_properties(0)
    expect(props["kind"] == "host" and props["index"] == 0 and props["name"], "device 0: %r" % props)
    expect_error(lambda: rt.device_properties(rt.device_count()), "BPL_ERR_INVALID_ARGUMENT", "device", "a device out of range")
    # device memory: filled from the host, allreduced in place, read back
    values = array.array("f", [float(world.rank + 1)] * 16)
    with rt.malloc(values.itemsize * len(values), dtype="f32") as memory:
        rt.memcpy(memory, values)
        world.allreduce(memory)
        back = array.array("f", [0.0] * 16)
        rt.memcpy(back, memory)
        expect(list(back) == [float(world.size * (world.size + 1) // 2)] * 16, "allreduce of device memory: %r" % list(back))
        # kernels on device memory and host buffers alike
        rt.scale(memory, 0.5)
        rt.add(memory, values, out=back)
        expect(back[0] == world.size * (world.size + 1) / 4.0 + world.rank + 1, "scale, then add: %r" % back[0])
    try:
        world.allreduce(memory)
        expect(False, "freed device memory must be refused")
    except ValueError as e:
        expect("freed" in str(e), str(e))
    y = array.array("d", [1.0, 2.0, 3.0])
    rt.axpby(array.array("d", [10.0, 20.0, 30.0]), y, alpha=0.5, beta=2.0)
    expect(list(y) == [7.0, 14.0, 21.0], "axpby into y: %r" % list(y))
    # gemm: [[1 2 3] [4 5 6]] @ [[1 0] [0 1] [1 1]] = [[4 5] [10 11]]; and a transposed a
    a = array.array("f", [1, 2, 3, 4, 5, 6])
    b = array.array("f", [1, 0, 0, 1, 1, 1])
    c = array.array("f", [0.0] * 4)
    rt.gemm(a, b, c, m=2, n=2, k=3)
    expect(list(c) == [4.0, 5.0, 10.0, 11.0], "gemm: %r" % list(c))
    rt.gemm(array.array("f", [1, 4, 2, 5, 3, 6]), b, c, m=2, n=2, k=3, trans_a=True, alpha=2.0, beta=-1.0)
    expect(list(c) == [4.0, 5.0, 10.0, 11.0], "gemm with trans_a, alpha and beta: %r" % list(c))
    try:
        rt.gemm(a, b, c, m=2, n=2, k=4)
        expect(False, "a matrix larger than its buffer must be refused")
    except ValueError as e:
        expect("a holds 6 elements: a 2 x 4 matrix with leading dimension 4 needs 8" in str(e), str(e))
    expect_error(lambda: rt.gemm(a, b, c, m=-1, n=2, k=3), "BPL_ERR_INVALID_ARGUMENT", "m = -1", "a negative m")
    # cast f32 -> bf16 (held in 16-bit integers), rounding to nearest even
    halves = array.array("H", [0] * 2)
    rt.cast(array.array("f", [1.0, 1.00390625]), halves, dst_dtype="bf16")
    expect(list(halves) == [0x3F80, 0x3F80], "cast to bf16: %r" % [hex(h) for h in halves])
    # a TorchScript program: a tuple from a named entry, and a bad output shape named
    source = "def forward(self, x):\n    return x\ndef twice(self, x):\n    return x * 2.0, x.sum().reshape([1])\n"
    with rt.compile(source, entry="twice") as program:
        x = array.array("d", [1.0, 2.0, 3.0])
        doubled, total = array.array("d", [0.0] * 3), array.array("d", [0.0])
        program.run([(x, [3])], [(doubled, [3]), (total, [1])])
        expect(list(doubled) == [2.0, 4.0, 6.0] and total[0] == 6.0, "program: %r %r" % (list(doubled), total[0]))
        expect_error(lambda: program.run([(x, [3])], [(doubled, [3])]), "BPL_ERR_INVALID_ARGUMENT", "num_outputs",
                     "too few outputs")
        if numpy is not None:
            matrix = numpy.arange(6, dtype=numpy.float64).reshape(2, 3)
            out, sums = numpy.zeros((2, 3)), numpy.zeros(1)
            program.run([matrix], [out, sums])
            expect(numpy.array_equal(out, matrix * 2) and sums[0] == 15.0, "program on numpy arrays")
    try:
        rt.compile("def forward(self, x):\n    return x +\n")
        expect(False, "a program that does not compile must raise")
    except backplane.BackplaneError as e:
        expect(e.status != 0 and "return x +" in e.message, "a syntax error: %s %s" % (e.status_name, e.message))
    # left to the Runtime: closing frees and destroys them without a word
    rt.malloc(64)
    rt.compile(source)


def timeouts_and_abort(world):
    # a recv from any rank that no rank sends to ends at its communicator's timeout, saying so (not on
    # mpi, where a failed operation ends the job at exit: MPI cannot finalize past it)
    waiting = world.split(color=0, key=world.rank)
    waiting.set_timeout(300)
    if os.environ.get("BPL_BACKEND") == "mpi":
        if world.rank == 0:
            print("python rank 0: a recv from any rank's timeout not checked on mpi (it ends the job)")
    elif world.rank == 0:
        start = time.monotonic()
        expect_error(lambda: waiting.recv_any(array.array("i", [0]), tag=9), "BPL_ERR_TIMEOUT", "",
                     "a recv from any rank that nobody sends to")
        waited = time.monotonic() - start
        expect(0.25 <= waited < 5.0, "the recv from any rank waited %.2f s for a 0.3 s timeout" % waited)
    world.barrier()
    with waiting:
        pass

    group = world.split(color=0, key=world.rank)
    group.set_timeout(12345)
    expect(group.get_timeout() == 12345, "get_timeout after set_timeout")
    expect_error(lambda: group.set_timeout(0), "BPL_ERR_INVALID_ARGUMENT", "timeout_ms = 0", "a timeout of 0")
    group.abort()
    expect_error(lambda: group.allreduce(bytearray(4)), "BPL_ERR_ABORTED", "", "an operation after abort")
    with group:  # destroyed on leaving
        pass
    try:
        group.barrier()
        expect(False, "a destroyed communicator must refuse operations")
    except ValueError as e:
        expect("destroyed" in str(e), str(e))


def revoke_agree_and_shrink(world):
    """ABI 1.8: rank 0 revokes a group, whose other members' next operation says so; then every member
    agrees on the AND of their flags (none failed), and shrinks to a communicator that works. (A rank
    killed or stopped: tests/system/survive_test.cpp.) On mpi (no ULFM) each is UNSUPPORTED."""
    group = world.split(color=0, key=world.rank)
    if os.environ.get("BPL_BACKEND") == "mpi":
        expect_error(group.revoke, "BPL_ERR_UNSUPPORTED", "cannot revoke", "revoke on mpi")
        group.destroy()
        return
    if world.rank == 0:
        group.revoke()
    expect_error(lambda: group.allreduce(bytearray(4)), "BPL_ERR_REVOKED", "by rank 0", "an operation after a revoke")
    flags, failed = group.agree(1 | (2 << world.rank))
    expect((flags, failed) == (1, []) if world.size > 1 else (flags, failed) == (3, []),
           "agree: %r, %r" % (flags, failed))
    survivors, failed = group.shrink()
    expect(failed == [] and (survivors.rank, survivors.size) == (world.rank, world.size), "shrink: %r" % failed)
    one = array.array("i", [1])
    survivors.allreduce(one)
    expect(one[0] == world.size, "allreduce after shrink: %d" % one[0])
    survivors.destroy()
    group.destroy()
    # grow with no newcomer coming: TIMEOUT naming how many came (a newcomer: tests/system/survive_test.cpp)
    lonely = world.split(color=0, key=world.rank)
    lonely.set_timeout(300)
    expect_error(lambda: lonely.grow(1), "BPL_ERR_TIMEOUT", "0 of the 1 newcomers came", "grow with no newcomer")
    lonely.destroy()
    expect_error(world._runtime.join, "BPL_ERR_INVALID_ARGUMENT", "BPL_JOIN=1",
                 "join in a process not started to join")


def every_kind_of_the_abi_is_a_method():
    """Each kind of the ABI's list (bpl_collective_name over its codes, from 1 until "unknown") is a Comm
    method of its name ("comm_" dropped: split) with a C signature: a kind added without them fails here."""
    from backplane import _abi
    names, code = [], 1
    while True:
        name = _abi._api().bpl_collective_name(code).decode()
        if name == "unknown":
            break
        names.append(name)
        code += 1
    expect(len(names) >= 15 and "alltoallv" in names, "the ABI's kinds: %r" % names)
    for name in names:
        method = name[len("comm_"):] if name.startswith("comm_") else name
        expect(callable(getattr(backplane.Comm, method, None)), "Comm has no method %s (the kind %s)" % (method, name))
        expect("bpl_" + name in _abi.SIGNATURES or "bpl_" + name in _abi._OPERATIONS,
               "no C signature for bpl_%s" % name)
    # An operation newer than the loaded library is refused naming the version it needs.
    _abi.binds("bpl_from_a_later_abi", [], since_minor=99)
    expect_error(lambda: _abi.operation("bpl_from_a_later_abi"), "BPL_ERR_UNSUPPORTED", "needs libbackplane ABI 1.99",
                 "an operation the library lacks")


def a_library_that_does_not_load_says_what_to_set():
    from backplane import _abi
    saved = os.environ.get("BPL_LIBRARY")
    os.environ["BPL_LIBRARY"] = "/nonexistent/libbackplane.so"
    try:
        _abi._load()
        raise AssertionError("a library that does not exist loaded")
    except OSError as e:
        expect("BPL_LIBRARY" in str(e) and "/nonexistent/libbackplane.so" in str(e), "the load error: %s" % e)
    finally:
        if saved is None:
            del os.environ["BPL_LIBRARY"]
        else:
            os.environ["BPL_LIBRARY"] = saved


def main():
    a_library_that_does_not_load_says_what_to_set()
    every_kind_of_the_abi_is_a_method()
    # The log to a callable (ABI 1.7): the start-up line, at info, names this process. BPL_LOG_LEVEL is
    # read at the first line, which is the start-up line of this Runtime.
    os.environ["BPL_LOG_LEVEL"] = "info"
    lines = []
    backplane.set_log_callback(lambda level, source, message: lines.append((level, source, message)))
    rt = backplane.Runtime()
    backplane.set_log_callback(None)
    start_up = [m for level, source, m in lines if level == "info" and source == "core" and m.startswith("backplane ")]
    expect(len(start_up) == 1 and "pid %d:" % os.getpid() in start_up[0], "the start-up line reached Python: %r" % lines)
    try:
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
        # the bitwise reductions (ABI 1.9), of integers; of floats refused naming the dtype
        for op, fold in (("band", lambda a, b: a & b), ("bor", lambda a, b: a | b), ("bxor", lambda a, b: a ^ b)):
            bits = array.array("i", [(rank * 37 + 5) ^ -i for i in range(4)])
            world.allreduce(bits, op=op)
            expected = [functools.reduce(fold, ((r * 37 + 5) ^ -i for r in range(size))) for i in range(4)]
            expect(list(bits) == expected, "allreduce %s of array('i'): %r, expected %r" % (op, list(bits), expected))
        expect_error(lambda: world.allreduce(array.array("f", [1.0]), op="bxor"), "BPL_ERR_INVALID_ARGUMENT",
                     "op bxor takes an integer dtype", "a bitwise allreduce of f32")

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
        point_to_point_and_requests(world)
        variable_collectives(world)
        devices_kernels_and_programs(rt, world)
        timeouts_and_abort(world)
        revoke_agree_and_shrink(world)
        world.barrier()
        # A split the program never destroys is the Runtime's to destroy: closing says nothing about it.
        left_alive = world.split(color=0)
        left_alive.barrier()
    except BaseException:
        rt.close()
        raise
    warnings = stderr_of(rt.close)
    expect("WARN" not in warnings, "closing with a split left alive printed: %r" % warnings)
    try:
        left_alive.barrier()
        expect(False, "a split of a closed Runtime must refuse operations")
    except ValueError as e:
        expect("destroyed" in str(e), str(e))
    print("python rank %d: ok (numpy %s)" % (rank, "tested" if numpy is not None else "not installed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
