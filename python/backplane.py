"""backplane from Python: ctypes over libbackplane.so's C ABI, with no dependency but the library.

    import backplane
    with backplane.Runtime() as rt:              # backend and ranks from the environment, as bpl_init
        world = rt.world
        grads = array.array("f", [1.0] * 1024)   # any C-contiguous buffer: bytearray, array, numpy
        world.allreduce(grads)                    # in place; or world.allreduce(send, recv)
        req = world.allreduce(grads, async_op=True)
        req.wait(timeout_ms=500)                  # or req.test(); a wait that runs out leaves it in flight
        with world.split(color=world.rank % 2) as group:
            group.send(grads, peer=...)           # send/recv, gather, scatter, allgatherv, alltoallv, ...

Element types come from the buffer's format ('f' f32, 'd' f64, 'e' f16, 'b' i8, 'B' u8, 32- and 64-bit
integers); pass dtype="bf16" for bfloat16 held in 16-bit integers. Every operation blocks unless given
async_op=True, when it returns a Request; a failure raises BackplaneError carrying the status and
bpl_last_error()'s message. Communicators made by split are destroyed with destroy(), on leaving their
`with` block, or, those still alive, when their Runtime closes (close(), or leaving its `with` block).

The library is found through BPL_LIBRARY (a path to libbackplane.so), then beside this module as
installed (<prefix>/lib/python3/dist-packages/backplane.py -> <prefix>/lib/libbackplane.so), then the
loader's search path.
"""

import array
import ctypes
import ctypes.util
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["BackplaneError", "Runtime", "Comm", "Request", "abi_version"]

# Anything with the buffer protocol, C-contiguous (bytearray, array.array, numpy.ndarray, memoryview).
BufferLike = Any

# ---------------------------------------------------------------------------------------------------
# The C ABI (backplane.h, ABI 1.x): the values and layouts are fixed.

_STATUS_NAMES = {
    0: "BPL_OK", 1: "BPL_ERR_INVALID_ARGUMENT", 2: "BPL_ERR_NOT_FOUND", 3: "BPL_ERR_UNSUPPORTED",
    4: "BPL_ERR_UNAVAILABLE", 5: "BPL_ERR_ABI_MISMATCH", 6: "BPL_ERR_TIMEOUT", 7: "BPL_ERR_REMOTE",
    8: "BPL_ERR_MISMATCH", 9: "BPL_ERR_OUT_OF_MEMORY", 10: "BPL_ERR_IO", 11: "BPL_ERR_INTERNAL",
    12: "BPL_ERR_ABORTED",
}
_DTYPES = {"f32": 1, "f64": 2, "f16": 3, "bf16": 4, "i8": 5, "u8": 6, "i32": 7, "i64": 8}
_SIZES = {1: 4, 2: 8, 3: 2, 4: 2, 5: 1, 6: 1, 7: 4, 8: 8}
_OPS = {"sum": 1, "prod": 2, "min": 3, "max": 4, "avg": 5}
_COLOR_UNDEFINED = -1
_TIMEOUT_DEFAULT = -1
_ERR_TIMEOUT = 6


class _InitOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("local_rank", ctypes.c_int32),
                ("local_world_size", ctypes.c_int32), ("master_addr", ctypes.c_char_p),
                ("master_port", ctypes.c_int32), ("timeout_ms", ctypes.c_int64)]


class _RuntimeInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p), ("plugin_path", ctypes.c_char_p),
                ("plugin_version", ctypes.c_char_p), ("selection_reason", ctypes.c_char_p),
                ("launcher", ctypes.c_char_p), ("details", ctypes.c_char_p), ("plugin_abi_major", ctypes.c_int32),
                ("plugin_abi_minor", ctypes.c_int32), ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("local_rank", ctypes.c_int32), ("local_world_size", ctypes.c_int32),
                ("device_count", ctypes.c_int32), ("dtypes", ctypes.c_uint32), ("collectives", ctypes.c_uint64),
                ("reduce_ops", ctypes.c_uint32), ("kernels", ctypes.c_uint32), ("timeout_ms", ctypes.c_int64),
                ("program_formats", ctypes.c_char_p)]


def _find_library():
    explicit = os.environ.get("BPL_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.normpath(os.path.join(here, "..", "..", "libbackplane.so"))
    if os.path.exists(beside):
        return beside
    return ctypes.util.find_library("backplane") or "libbackplane.so.1"


def _load():
    lib = ctypes.CDLL(_find_library())
    p = ctypes.c_void_p
    signatures = {
        "bpl_last_error": ([], ctypes.c_char_p),
        "bpl_abi_version": ([ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)], None),
        "bpl_init": ([ctypes.POINTER(_InitOptions), ctypes.POINTER(p)], ctypes.c_int32),
        "bpl_finalize": ([p], ctypes.c_int32),
        "bpl_runtime_describe": ([p, ctypes.POINTER(_RuntimeInfo)], ctypes.c_int32),
        "bpl_comm_world": ([p, ctypes.POINTER(p)], ctypes.c_int32),
        "bpl_comm_split": ([p, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(p)], ctypes.c_int32),
        "bpl_comm_destroy": ([p], ctypes.c_int32),
        "bpl_comm_rank": ([p, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
        "bpl_comm_size": ([p, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
        "bpl_comm_set_timeout": ([p, ctypes.c_int64], ctypes.c_int32),
        "bpl_comm_abort": ([p], ctypes.c_int32),
        "bpl_allreduce": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_broadcast": ([p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_reduce": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_allgather": ([p, p, p, ctypes.c_int64, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_reduce_scatter": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_alltoall": ([p, p, p, ctypes.c_int64, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_barrier": ([p, p], ctypes.c_int32),
        "bpl_comm_get_timeout": ([p, ctypes.POINTER(ctypes.c_int64)], ctypes.c_int32),
        "bpl_send": ([p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_recv": ([p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_request_test": ([p, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
        "bpl_request_wait": ([p, ctypes.c_int64], ctypes.c_int32),
        "bpl_request_free": ([p], ctypes.c_int32),
    }
    # ABI 1.3: absent from an older library, whose Comm then raises saying so.
    optional = {
        "bpl_gather": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_scatter": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_allgatherv": ([p, p, ctypes.c_int64, p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, p], ctypes.c_int32),
        "bpl_alltoallv": ([p, p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, p], ctypes.c_int32),
    }
    for name, signature in optional.items():
        if hasattr(lib, name):
            signatures[name] = signature
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib


_lib = None


def _api():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


class BackplaneError(Exception):
    """A bpl_status other than BPL_OK: .status (int), .status_name, .message (bpl_last_error())."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "BPL_ERR_UNKNOWN")
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def _check(status):
    if status != 0:
        raise BackplaneError(status, (_api().bpl_last_error() or b"").decode("utf-8", "replace"))


def abi_version():
    """(major, minor) of the loaded libbackplane."""
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    _api().bpl_abi_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


# ---------------------------------------------------------------------------------------------------
# Buffers: anything with the buffer protocol, C-contiguous; its address, element count and dtype.

_FORMATS = {"f": "f32", "d": "f64", "e": "f16", "b": "i8", "B": "u8", "c": "u8"}


class _Buffer:
    def __init__(self, obj, dtype, writable, name):
        view = memoryview(obj)
        if not view.c_contiguous:
            raise ValueError("%s must be C-contiguous" % name)
        if writable and view.readonly:
            raise ValueError("%s is read-only, but the operation writes into it" % name)
        if dtype is None:
            fmt = view.format.lstrip("@=<>!")
            if fmt in _FORMATS:
                dtype = _FORMATS[fmt]
            elif fmt in ("i", "l", "q", "h", "n") or fmt in ("I", "L", "Q", "N"):
                dtype = {4: "i32", 8: "i64"}.get(view.itemsize)
            if dtype is None:
                raise ValueError("%s has element format %r: pass dtype= one of %s" % (name, view.format, sorted(_DTYPES)))
        if dtype not in _DTYPES:
            raise ValueError("dtype=%r: expected one of %s" % (dtype, sorted(_DTYPES)))
        self.dtype = _DTYPES[dtype]
        self.nbytes = view.nbytes
        if self.nbytes % _SIZES[self.dtype]:
            raise ValueError("%s holds %d bytes, not a whole number of %s elements" % (name, self.nbytes, dtype))
        self.count = self.nbytes // _SIZES[self.dtype]
        self._view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        if self.nbytes == 0:
            self.address = None
        elif view.readonly:
            # ctypes reaches read-only memory only through a copy; inputs are read once, so that is safe.
            self._keep = (ctypes.c_char * self.nbytes).from_buffer_copy(self._view)
            self.address = ctypes.addressof(self._keep)
        else:
            self._keep = (ctypes.c_char * self.nbytes).from_buffer(self._view)
            self.address = ctypes.addressof(self._keep)


def _op(op: str) -> int:
    if op not in _OPS:
        raise ValueError("op=%r: expected one of %s" % (op, sorted(_OPS)))
    return _OPS[op]


def _int64_array(values: Sequence[int], size: int, name: str):
    if len(values) != size:
        raise ValueError("%s has %d entries: expected %d, one per rank" % (name, len(values), size))
    return (ctypes.c_int64 * size)(*values)


def _end_to_end(counts: Sequence[int]) -> List[int]:
    """Displacements of blocks of `counts` elements laid end to end."""
    displs, next_block = [], 0
    for count in counts:
        displs.append(next_block)
        next_block += count
    return displs


class Request:
    """An operation started with async_op=True. wait() or test() tell its end; the buffers it uses are
    referenced here until then. A request that is never waited for is released (bpl_request_free,
    which first lets the operation end, bounded by its communicator's timeout) when it is collected."""

    def __init__(self, handle: ctypes.c_void_p, keep: Tuple[Any, ...], what: str):
        self._handle = handle
        self._keep = keep
        self.what = what

    def test(self) -> bool:
        """True once the operation has ended (raising BackplaneError if it failed); never blocks."""
        if self._handle is None:
            return True
        done = ctypes.c_int32()
        status = _api().bpl_request_test(self._handle, ctypes.byref(done))
        if status != 0 or done.value:
            self._release(status)
        return done.value != 0

    def wait(self, timeout_ms: Optional[int] = None) -> None:
        """Waits for the end, at most timeout_ms (None: the communicator's timeout). A wait that runs out
        first raises BackplaneError BPL_ERR_TIMEOUT and leaves the operation in flight, to be waited for
        again; the operation's own failure (its timeout included) raises and ends the request."""
        if self._handle is None:
            return
        status = _api().bpl_request_wait(self._handle, _TIMEOUT_DEFAULT if timeout_ms is None else timeout_ms)
        if status == _ERR_TIMEOUT and timeout_ms is not None:
            message = (_api().bpl_last_error() or b"").decode("utf-8", "replace")
            done = ctypes.c_int32()
            tested = _api().bpl_request_test(self._handle, ctypes.byref(done))
            if tested == 0 and not done.value:
                raise BackplaneError(status, "%s has not ended within %d ms; it is still in flight and may be waited "
                                             "for again (%s)" % (self.what, timeout_ms, message))
            status = tested  # it ended meanwhile: its own result
        self._release(status)

    def _release(self, status: int) -> None:
        message = (_api().bpl_last_error() or b"").decode("utf-8", "replace") if status != 0 else ""
        handle, self._handle, self._keep = self._handle, None, ()
        _api().bpl_request_free(handle)
        if status != 0:
            raise BackplaneError(status, message)

    def __del__(self):
        if getattr(self, "_handle", None) is not None and _lib is not None:
            _lib.bpl_request_free(self._handle)


class Comm:
    """A communicator. The world belongs to its Runtime; one from split() is destroyed by destroy(), on
    leaving its `with` block, or with its Runtime when that closes first."""

    def __init__(self, handle: int, owned: bool, runtime: "Runtime"):
        self._handle = ctypes.c_void_p(handle)
        self._owned = owned
        self._runtime = runtime
        rank, size = ctypes.c_int32(), ctypes.c_int32()
        _check(_api().bpl_comm_rank(self._handle, ctypes.byref(rank)))
        _check(_api().bpl_comm_size(self._handle, ctypes.byref(size)))
        self.rank, self.size = rank.value, size.value

    # -- lifetime, timeouts, abort --

    def split(self, color: Optional[int], key: int = 0) -> Optional["Comm"]:
        """MPI_Comm_split: a Comm of the ranks passing the same color, ordered by key; None for color None."""
        out = ctypes.c_void_p()
        _check(_api().bpl_comm_split(self._live(), _COLOR_UNDEFINED if color is None else color, key, ctypes.byref(out)))
        if not out.value:
            return None
        child = Comm(out.value, owned=True, runtime=self._runtime)
        made = self._runtime._made
        made[:] = [c for c in made if c._handle is not None] + [child]
        return child

    def destroy(self) -> None:
        """Destroys a communicator from split (after its operations end); a no-op for the world and the
        second time."""
        if self._owned and self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_comm_destroy(handle))

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> bool:
        self.destroy()
        return False

    def set_timeout(self, timeout_ms: int) -> None:
        """Bounds the operations started from now on (and is the default of Request.wait)."""
        _check(_api().bpl_comm_set_timeout(self._live(), timeout_ms))

    def get_timeout(self) -> int:
        timeout = ctypes.c_int64()
        _check(_api().bpl_comm_get_timeout(self._live(), ctypes.byref(timeout)))
        return timeout.value

    def abort(self) -> None:
        """Ends the communicator's use on this rank: later operations raise BPL_ERR_ABORTED at once, and
        a wait in another thread returns with it."""
        _check(_api().bpl_comm_abort(self._live()))

    # -- collectives: blocking, or a Request with async_op=True --

    def allreduce(self, send: BufferLike, recv: Optional[BufferLike] = None, op: str = "sum",
                  dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """recv = op over ranks of send (in place when recv is None)."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _Buffer(recv, dtype, True, "recv")
        return self._start("allreduce", (s, r), lambda req: _api().bpl_allreduce(
            self._live(), s.address, r.address, s.count, s.dtype, _op(op), req), async_op)

    def broadcast(self, buf: BufferLike, root: int = 0, dtype: Optional[str] = None,
                  async_op: bool = False) -> Optional[Request]:
        b = _Buffer(buf, dtype, True, "buf")
        return self._start("broadcast", (b,), lambda req: _api().bpl_broadcast(
            self._live(), b.address, b.count, b.dtype, root, req), async_op)

    def reduce(self, send: BufferLike, recv: Optional[BufferLike] = None, root: int = 0, op: str = "sum",
               dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """recv on root = op over ranks of send (in place when recv is None); other ranks' recv unused."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _Buffer(recv, dtype, True, "recv")
        return self._start("reduce", (s, r), lambda req: _api().bpl_reduce(
            self._live(), s.address, r.address, s.count, s.dtype, _op(op), root, req), async_op)

    def allgather(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                  async_op: bool = False) -> Optional[Request]:
        """recv (size times send's elements) = every rank's send, in rank order."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if r.count != s.count * self.size:
            raise ValueError("recv holds %d elements: expected %d (size %d x %d)" % (r.count, s.count * self.size, self.size, s.count))
        return self._start("allgather", (s, r), lambda req: _api().bpl_allgather(
            self._live(), s.address, r.address, s.count, s.dtype, req), async_op)

    def reduce_scatter(self, send: BufferLike, recv: BufferLike, op: str = "sum", dtype: Optional[str] = None,
                       async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of the reduction of send (size blocks of recv's elements)."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if s.count != r.count * self.size:
            raise ValueError("send holds %d elements: expected %d (size %d x %d)" % (s.count, r.count * self.size, self.size, r.count))
        return self._start("reduce_scatter", (s, r), lambda req: _api().bpl_reduce_scatter(
            self._live(), s.address, r.address, r.count, r.dtype, _op(op), req), async_op)

    def alltoall(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                 async_op: bool = False) -> Optional[Request]:
        """recv block r = send block `rank` of rank r (size equal blocks each)."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if s.count != r.count or s.count % self.size:
            raise ValueError("send and recv must hold the same number of elements, a multiple of size %d" % self.size)
        return self._start("alltoall", (s, r), lambda req: _api().bpl_alltoall(
            self._live(), s.address, r.address, s.count // self.size, s.dtype, req), async_op)

    def gather(self, send: BufferLike, recv: Optional[BufferLike] = None, root: int = 0, dtype: Optional[str] = None,
               async_op: bool = False) -> Optional[Request]:
        """recv on root (size times send's elements) = every rank's send, in rank order; recv is not
        given on the other ranks."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv") if recv is not None else None
        if self.rank == root and (r is None or r.count != s.count * self.size):
            raise ValueError("the root's recv must hold %d elements (size %d x %d)" % (s.count * self.size, self.size, s.count))
        return self._start("gather", (s, r), lambda req: self._v13("bpl_gather")(
            self._live(), s.address, r.address if r else None, s.count, s.dtype, root, req), async_op)

    def scatter(self, send: Optional[BufferLike], recv: BufferLike, root: int = 0, dtype: Optional[str] = None,
                async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of send on root (size blocks of recv's elements); send is None elsewhere."""
        r = _Buffer(recv, dtype, True, "recv")
        s = _Buffer(send, dtype, False, "send") if send is not None else None
        if self.rank == root and (s is None or s.count != r.count * self.size):
            raise ValueError("the root's send must hold %d elements (size %d x %d)" % (r.count * self.size, self.size, r.count))
        return self._start("scatter", (s, r), lambda req: self._v13("bpl_scatter")(
            self._live(), s.address if s else None, r.address, r.count, r.dtype, root, req), async_op)

    def allgatherv(self, send: BufferLike, recv: BufferLike, counts: Sequence[int],
                   displs: Optional[Sequence[int]] = None, dtype: Optional[str] = None,
                   async_op: bool = False) -> Optional[Request]:
        """Rank r's send (counts[r] elements) lands at recv + displs[r] on every rank (displs None: the
        blocks end to end in rank order)."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        c = _int64_array(counts, self.size, "counts")
        d = _int64_array(_end_to_end(counts) if displs is None else displs, self.size, "displs")
        return self._start("allgatherv", (s, r), lambda req: self._v13("bpl_allgatherv")(
            self._live(), s.address, s.count, r.address, c, d, s.dtype, req), async_op)

    def alltoallv(self, send: BufferLike, sendcounts: Sequence[int], recv: BufferLike, recvcounts: Sequence[int],
                  sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None,
                  dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """This rank sends sendcounts[r] elements from send + sdispls[r] to rank r, and receives
        recvcounts[r] from rank r at recv + rdispls[r] (displacements None: blocks end to end)."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        arrays = [_int64_array(values, self.size, name) for values, name in (
            (sendcounts, "sendcounts"), (_end_to_end(sendcounts) if sdispls is None else sdispls, "sdispls"),
            (recvcounts, "recvcounts"), (_end_to_end(recvcounts) if rdispls is None else rdispls, "rdispls"))]
        return self._start("alltoallv", (s, r), lambda req: self._v13("bpl_alltoallv")(
            self._live(), s.address, arrays[0], arrays[1], r.address, arrays[2], arrays[3], s.dtype, req), async_op)

    def barrier(self, async_op: bool = False) -> Optional[Request]:
        return self._start("barrier", (), lambda req: _api().bpl_barrier(self._live(), req), async_op)

    # -- byte strings of any length (two collectives each: the lengths, then the bytes) --

    def broadcast_bytes(self, data: Optional[bytes], root: int = 0) -> bytes:
        """The root's bytes on every rank (`data` is ignored elsewhere and may be None)."""
        length = array.array("q", [len(data) if self.rank == root and data is not None else 0])
        self.broadcast(length, root)
        buf = bytearray(data if self.rank == root and data is not None else length[0])
        self.broadcast(buf, root, dtype="u8")
        return bytes(buf)

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        """Every rank's bytes, in rank order."""
        lengths = array.array("q", [0] * self.size)
        self.allgather(array.array("q", [len(data)]), lengths)
        buf = bytearray(sum(lengths))
        self.allgatherv(bytearray(data), buf, list(lengths), dtype="u8")
        displs = _end_to_end(lengths)
        return [bytes(buf[d:d + n]) for d, n in zip(displs, lengths)]

    # -- point to point --

    def send(self, buf: BufferLike, peer: int, tag: int = 0, dtype: Optional[str] = None,
             async_op: bool = False) -> Optional[Request]:
        """Sends buf to rank `peer`, matched by a recv of the same tag (>= 0), in order. A blocking send
        may wait for the receiver: to exchange, start one side with async_op=True."""
        b = _Buffer(buf, dtype, False, "buf")
        return self._start("send", (b,), lambda req: _api().bpl_send(
            self._live(), b.address, b.count, b.dtype, peer, tag, req), async_op)

    def recv(self, buf: BufferLike, peer: int, tag: int = 0, dtype: Optional[str] = None,
             async_op: bool = False) -> Optional[Request]:
        """Receives into buf from rank `peer` the send of the same tag; the sizes must agree."""
        b = _Buffer(buf, dtype, True, "buf")
        return self._start("recv", (b,), lambda req: _api().bpl_recv(
            self._live(), b.address, b.count, b.dtype, peer, tag, req), async_op)

    # -- internals --

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this communicator was destroyed (destroy(), or its Runtime closed)")
        return self._handle

    @staticmethod
    def _v13(name: str):
        if not hasattr(_api(), name):
            raise BackplaneError(3, "%s needs libbackplane ABI 1.3; the loaded library is %d.%d" % ((name,) + abi_version()))
        return getattr(_api(), name)

    @staticmethod
    def _start(what: str, keep: Tuple[Any, ...], call, async_op: bool) -> Optional[Request]:
        if not async_op:
            _check(call(None))
            return None
        handle = ctypes.c_void_p()
        _check(call(ctypes.byref(handle)))
        return Request(handle, keep, what)


class Runtime:
    """A loaded backend (bpl_init); a context manager that closes on exit. Arguments left None come
    from the environment, as bpl_init's options."""

    def __init__(self, backend: Optional[str] = None, rank: Optional[int] = None, world_size: Optional[int] = None,
                 local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
                 master_addr: Optional[str] = None, master_port: Optional[int] = None,
                 timeout_ms: Optional[int] = None):
        options = _InitOptions(ctypes.sizeof(_InitOptions), backend.encode() if backend else None,
                               -1 if rank is None else rank, -1 if world_size is None else world_size,
                               -1 if local_rank is None else local_rank,
                               -1 if local_world_size is None else local_world_size,
                               master_addr.encode() if master_addr else None,
                               -1 if master_port is None else master_port, -1 if timeout_ms is None else timeout_ms)
        handle = ctypes.c_void_p()
        _check(_api().bpl_init(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle
        self._made: List[Comm] = []  # every split of its communicators: close() destroys those left
        world = ctypes.c_void_p()
        _check(_api().bpl_comm_world(self._handle, ctypes.byref(world)))
        self.world = Comm(world.value, owned=False, runtime=self)

    def describe(self) -> Dict[str, Any]:
        """bpl_runtime_describe as a dict (strings decoded)."""
        info = _RuntimeInfo()
        info.struct_size = ctypes.sizeof(_RuntimeInfo)
        _check(_api().bpl_runtime_describe(self._live(), ctypes.byref(info)))
        result = {}
        for name, kind in _RuntimeInfo._fields_:
            if name == "struct_size":
                continue
            value = getattr(info, name)
            result[name] = value.decode("utf-8", "replace") if kind is ctypes.c_char_p and value is not None else value
        return result

    def close(self) -> None:
        """Destroys the communicators split from it that are still alive, then leaves the job
        (bpl_finalize). The second call is a no-op."""
        if self._handle is None:
            return
        made, self._made = self._made, []
        for comm in made:
            comm.destroy()
        handle, self._handle = self._handle, None
        self.world._handle = None
        _check(_api().bpl_finalize(handle))

    finalize = close

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this Runtime was closed")
        return self._handle

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
