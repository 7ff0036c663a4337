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

Device memory, kernels and programs are the Runtime's (on CPU backends the device is the host):

        mem = rt.malloc(4096, dtype="f32")        # a DeviceMemory, usable wherever a buffer goes
        rt.memcpy(mem, grads)                     # the direction follows from the arguments
        rt.gemm(a, b, c, m=2, n=2, k=3)           # c = a @ b; add, scale, axpby, cast likewise
        with rt.compile("def forward(self, x):\n    return x * 2.0\n") as program:
            program.run([(x, [3])], [(y, [3])])   # (buffer, shape[, dtype]) or numpy arrays

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

__all__ = ["BackplaneError", "Runtime", "Comm", "Request", "DeviceMemory", "Program", "abi_version"]

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
_DTYPE_NAMES = {code: name for name, code in _DTYPES.items()}
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


class _DeviceProperties(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char * 64), ("kind", ctypes.c_int32),
                ("index", ctypes.c_int32), ("total_memory", ctypes.c_uint64), ("free_memory", ctypes.c_uint64)]


class _GemmArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("trans_a", ctypes.c_int32), ("trans_b", ctypes.c_int32), ("m", ctypes.c_int64),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("a", ctypes.c_void_p), ("lda", ctypes.c_int64), ("b", ctypes.c_void_p), ("ldb", ctypes.c_int64),
                ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64)]


class _ElementwiseArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("count", ctypes.c_int64), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("out", ctypes.c_void_p)]


class _CastArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int32), ("from_dtype", ctypes.c_int32),
                ("to_dtype", ctypes.c_int32), ("reserved0", ctypes.c_int32), ("count", ctypes.c_int64),
                ("src", ctypes.c_void_p), ("dst", ctypes.c_void_p)]


class _ProgramOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("format", ctypes.c_char_p), ("flags", ctypes.c_char_p),
                ("entry", ctypes.c_char_p), ("device", ctypes.c_int32), ("reserved0", ctypes.c_int32)]


_MAX_DIMS = 8


class _Tensor(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * _MAX_DIMS)]


_DEVICE_KINDS = {1: "host", 2: "accelerator"}
_MEMCPY_KIND = {(False, False): 1, (True, False): 2, (False, True): 3, (True, True): 4}  # (to device, from device)


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
        "bpl_device_count": ([p, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int32),
        "bpl_device_get_properties": ([p, ctypes.c_int32, ctypes.POINTER(_DeviceProperties)], ctypes.c_int32),
        "bpl_malloc": ([p, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(p)], ctypes.c_int32),
        "bpl_free": ([p, p], ctypes.c_int32),
        "bpl_memcpy": ([p, p, p, ctypes.c_size_t, ctypes.c_int32], ctypes.c_int32),
        "bpl_synchronize": ([p, ctypes.c_int32], ctypes.c_int32),
        "bpl_gemm": ([p, ctypes.POINTER(_GemmArgs)], ctypes.c_int32),
        "bpl_add": ([p, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
        "bpl_scale": ([p, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
        "bpl_axpby": ([p, ctypes.POINTER(_ElementwiseArgs)], ctypes.c_int32),
        "bpl_cast": ([p, ctypes.POINTER(_CastArgs)], ctypes.c_int32),
        "bpl_program_compile": ([p, p, ctypes.c_size_t, ctypes.POINTER(_ProgramOptions), ctypes.POINTER(p)],
                                ctypes.c_int32),
        "bpl_program_run": ([p, ctypes.POINTER(_Tensor), ctypes.c_int32, ctypes.POINTER(_Tensor), ctypes.c_int32],
                            ctypes.c_int32),
        "bpl_program_destroy": ([p], ctypes.c_int32),
    }
    # ABI 1.3: absent from an older library, whose Comm then raises saying so.
    optional = {
        "bpl_gather": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_scatter": ([p, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, p], ctypes.c_int32),
        "bpl_allgatherv": ([p, p, ctypes.c_int64, p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, p], ctypes.c_int32),
        "bpl_alltoallv": ([p, p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, p], ctypes.c_int32),
        "bpl_recv_any": ([p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), p], ctypes.c_int32),
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
        if isinstance(obj, DeviceMemory):
            self._init_device(obj, dtype, name)
            return
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
        self._set_size(dtype, view.nbytes, name)
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

    def _init_device(self, memory, dtype, name):
        dtype = dtype or memory.dtype
        if dtype is None:
            raise ValueError("%s is device memory without a dtype: pass dtype= one of %s" % (name, sorted(_DTYPES)))
        if dtype not in _DTYPES:
            raise ValueError("dtype=%r: expected one of %s" % (dtype, sorted(_DTYPES)))
        self.address = memory._live().value
        self._keep = memory
        self._set_size(dtype, memory.nbytes, name)

    def _set_size(self, dtype, nbytes, name):
        self.dtype = _DTYPES[dtype]
        self.dtype_name = dtype
        self.nbytes = nbytes
        if nbytes % _SIZES[self.dtype]:
            raise ValueError("%s holds %d bytes, not a whole number of %s elements" % (name, nbytes, dtype))
        self.count = nbytes // _SIZES[self.dtype]


def _of_send(send, recv, dtype, count, what, name="recv"):
    """`recv` as a buffer of send's dtype holding `count` elements (`what` says why that many; None: any
    number): a ValueError naming what is wrong otherwise, before anything is written into it."""
    r = _Buffer(recv, dtype, True, name)
    if r.dtype != send.dtype:
        raise ValueError("%s holds %s elements and send %s: both must hold one dtype" % (name, r.dtype_name, send.dtype_name))
    if count is not None and r.count != count:
        raise ValueError("%s holds %d elements: expected %d (%s)" % (name, r.count, count, what))
    return r


def _extent(name, buf, counts, displs):
    """A ValueError unless `buf` holds every block counts[r] at displs[r]."""
    needed = max([d + c for c, d in zip(counts, displs) if c > 0] or [0])
    if buf.count < needed:
        raise ValueError("%s holds %d elements: its blocks reach element %d" % (name, buf.count, needed))


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


class _Handle:
    """What a Runtime makes and, if still alive, destroys when it closes (a Comm from split, DeviceMemory,
    a Program): destroy() ends it, and so does leaving its `with` block; used after, it raises ValueError."""

    _what = "handle"
    _ended = "destroyed (destroy(), or its Runtime closed)"

    def destroy(self) -> None:
        raise NotImplementedError

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this %s was %s" % (self._what, self._ended))
        return self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.destroy()
        return False


class Comm(_Handle):
    """A communicator. The world belongs to its Runtime; one from split() is destroyed by destroy(), on
    leaving its `with` block, or with its Runtime when that closes first."""

    _what = "communicator"

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
        return self._runtime._adopt(Comm(out.value, owned=True, runtime=self._runtime))

    def destroy(self) -> None:
        """Destroys a communicator from split (after its operations end); a no-op for the world and the
        second time."""
        if self._owned and self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_comm_destroy(handle))

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
        r = s if recv is None else _of_send(s, recv, dtype, s.count, "as many as send")
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
        r = s if recv is None else _of_send(s, recv, dtype, s.count if self.rank == root else None, "as many as send")
        return self._start("reduce", (s, r), lambda req: _api().bpl_reduce(
            self._live(), s.address, r.address, s.count, s.dtype, _op(op), root, req), async_op)

    def allgather(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                  async_op: bool = False) -> Optional[Request]:
        """recv (size times send's elements) = every rank's send, in rank order."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, s.count * self.size, "size %d x %d" % (self.size, s.count))
        return self._start("allgather", (s, r), lambda req: _api().bpl_allgather(
            self._live(), s.address, r.address, s.count, s.dtype, req), async_op)

    def reduce_scatter(self, send: BufferLike, recv: BufferLike, op: str = "sum", dtype: Optional[str] = None,
                       async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of the reduction of send (size blocks of recv's elements)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        if s.count != r.count * self.size:
            raise ValueError("send holds %d elements: expected %d (size %d x %d)" % (s.count, r.count * self.size, self.size, r.count))
        return self._start("reduce_scatter", (s, r), lambda req: _api().bpl_reduce_scatter(
            self._live(), s.address, r.address, r.count, r.dtype, _op(op), req), async_op)

    def alltoall(self, send: BufferLike, recv: BufferLike, dtype: Optional[str] = None,
                 async_op: bool = False) -> Optional[Request]:
        """recv block r = send block `rank` of rank r (size equal blocks each)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        if s.count != r.count or s.count % self.size:
            raise ValueError("send and recv must hold the same number of elements, a multiple of size %d" % self.size)
        return self._start("alltoall", (s, r), lambda req: _api().bpl_alltoall(
            self._live(), s.address, r.address, s.count // self.size, s.dtype, req), async_op)

    def gather(self, send: BufferLike, recv: Optional[BufferLike] = None, root: int = 0, dtype: Optional[str] = None,
               async_op: bool = False) -> Optional[Request]:
        """recv on root (size times send's elements) = every rank's send, in rank order; recv is not
        given on the other ranks."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "") if recv is not None else None
        if self.rank == root and (r is None or r.count != s.count * self.size):
            raise ValueError("the root's recv must hold %d elements (size %d x %d)" % (s.count * self.size, self.size, s.count))
        return self._start("gather", (s, r), lambda req: self._v13("bpl_gather")(
            self._live(), s.address, r.address if r else None, s.count, s.dtype, root, req), async_op)

    def scatter(self, send: Optional[BufferLike], recv: BufferLike, root: int = 0, dtype: Optional[str] = None,
                async_op: bool = False) -> Optional[Request]:
        """recv = block `rank` of send on root (size blocks of recv's elements); send is None elsewhere."""
        r = _Buffer(recv, dtype, True, "recv")
        s = _Buffer(send, dtype, False, "send") if send is not None else None
        if s is not None and s.dtype != r.dtype:
            raise ValueError("send holds %s elements and recv %s: both must hold one dtype" % (s.dtype_name, r.dtype_name))
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
        r = _of_send(s, recv, dtype, None, "")
        c = _int64_array(counts, self.size, "counts")
        d = _int64_array(_end_to_end(counts) if displs is None else displs, self.size, "displs")
        _extent("recv", r, c, d)
        return self._start("allgatherv", (s, r), lambda req: self._v13("bpl_allgatherv")(
            self._live(), s.address, s.count, r.address, c, d, s.dtype, req), async_op)

    def alltoallv(self, send: BufferLike, sendcounts: Sequence[int], recv: BufferLike, recvcounts: Sequence[int],
                  sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None,
                  dtype: Optional[str] = None, async_op: bool = False) -> Optional[Request]:
        """This rank sends sendcounts[r] elements from send + sdispls[r] to rank r, and receives
        recvcounts[r] from rank r at recv + rdispls[r] (displacements None: blocks end to end)."""
        s = _Buffer(send, dtype, False, "send")
        r = _of_send(s, recv, dtype, None, "")
        arrays = [_int64_array(values, self.size, name) for values, name in (
            (sendcounts, "sendcounts"), (_end_to_end(sendcounts) if sdispls is None else sdispls, "sdispls"),
            (recvcounts, "recvcounts"), (_end_to_end(recvcounts) if rdispls is None else rdispls, "rdispls"))]
        _extent("send", s, arrays[0], arrays[1])
        _extent("recv", r, arrays[2], arrays[3])
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

    def recv_any(self, buf: BufferLike, tag: int = 0, dtype: Optional[str] = None) -> int:
        """Receives into buf the send of this tag from whichever rank sends first; returns that rank."""
        b = _Buffer(buf, dtype, True, "buf")
        source = ctypes.c_int32(-1)
        self._start("recv_any", (b,), lambda req: self._v13("bpl_recv_any", "1.6")(
            self._live(), b.address, b.count, b.dtype, tag, ctypes.byref(source), req), False)
        return source.value

    # -- internals --

    @staticmethod
    def _v13(name: str, version: str = "1.3"):
        if not hasattr(_api(), name):
            raise BackplaneError(3, "%s needs libbackplane ABI %s; the loaded library is %d.%d" % ((name, version) + abi_version()))
        return getattr(_api(), name)

    @staticmethod
    def _start(what: str, keep: Tuple[Any, ...], call, async_op: bool) -> Optional[Request]:
        if not async_op:
            _check(call(None))
            return None
        handle = ctypes.c_void_p()
        _check(call(ctypes.byref(handle)))
        return Request(handle, keep, what)


class DeviceMemory(_Handle):
    """`nbytes` of a device's memory from Runtime.malloc (bpl_malloc). It goes wherever a buffer goes
    (collectives, kernels, programs, memcpy), as elements of `dtype` (malloc's, or the call's dtype=).
    Freed by free(), on leaving its `with` block, or, if still held, when its Runtime closes."""

    _what = "device memory"
    _ended = "freed (free(), or its Runtime closed)"

    def __init__(self, runtime: "Runtime", address: int, nbytes: int, device: int, dtype: Optional[str]):
        self._runtime = runtime
        self._handle = ctypes.c_void_p(address)
        self.nbytes, self.device, self.dtype = nbytes, device, dtype

    def free(self) -> None:
        """bpl_free; a no-op the second time."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_free(self._runtime._live(), handle))

    destroy = free


# A program's tensor: a numpy array, or (buffer, shape) / (buffer, shape, dtype) with any buffer or
# DeviceMemory; its elements must number the shape's product.
TensorLike = Any


def _tensor(spec: TensorLike, writable: bool, name: str) -> Tuple[_Tensor, _Buffer]:
    if isinstance(spec, tuple):
        if len(spec) not in (2, 3):
            raise ValueError("%s: expected (buffer, shape) or (buffer, shape, dtype), got %d items" % (name, len(spec)))
        buf, shape, dtype = spec[0], list(spec[1]), spec[2] if len(spec) == 3 else None
    else:
        buf, shape, dtype = spec, list(getattr(spec, "shape", [])), None
        if not hasattr(spec, "shape"):
            raise ValueError("%s has no shape: pass (buffer, shape) or a numpy array" % name)
    b = _Buffer(buf, dtype, writable, name)
    if len(shape) > _MAX_DIMS:
        raise ValueError("%s has %d dims: at most %d" % (name, len(shape), _MAX_DIMS))
    elements = 1
    for extent in shape:
        elements *= extent
    if elements != b.count:
        raise ValueError("%s holds %d elements but its shape %s has %d" % (name, b.count, shape, elements))
    t = _Tensor(ctypes.sizeof(_Tensor), b.address, b.dtype, len(shape))
    for i, extent in enumerate(shape):
        t.shape[i] = extent
    return t, b


class Program(_Handle):
    """A compiled program (Runtime.compile, bpl_program_compile). Destroyed by destroy(), on leaving its
    `with` block, or, if still held, when its Runtime closes."""

    _what = "program"

    def __init__(self, runtime: "Runtime", handle: int):
        self._runtime = runtime
        self._handle = ctypes.c_void_p(handle)

    def run(self, inputs: Sequence[TensorLike], outputs: Sequence[TensorLike]) -> None:
        """Runs it on `inputs`, writing its results into `outputs`, whose dtypes and shapes must be what
        it returns (a tuple returns several)."""
        ins = [_tensor(spec, False, "inputs[%d]" % i) for i, spec in enumerate(inputs)]
        outs = [_tensor(spec, True, "outputs[%d]" % i) for i, spec in enumerate(outputs)]
        in_array = (_Tensor * max(len(ins), 1))(*[t for t, _ in ins])
        out_array = (_Tensor * max(len(outs), 1))(*[t for t, _ in outs])
        _check(_api().bpl_program_run(self._live(), in_array, len(ins), out_array, len(outs)))

    def destroy(self) -> None:
        """bpl_program_destroy; a no-op the second time."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _check(_api().bpl_program_destroy(handle))


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
        self._made: List[Any] = []  # splits, device memory and programs: close() destroys those left
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

    # -- devices (on CPU backends, one: the host) --

    def device_count(self) -> int:
        count = ctypes.c_int32()
        _check(_api().bpl_device_count(self._live(), ctypes.byref(count)))
        return count.value

    def device_properties(self, device: int = 0) -> Dict[str, Any]:
        """bpl_device_get_properties as a dict: name, kind ("host" or "accelerator"), index, total_memory
        and free_memory (bytes; 0 if unknown)."""
        props = _DeviceProperties()
        props.struct_size = ctypes.sizeof(_DeviceProperties)
        _check(_api().bpl_device_get_properties(self._live(), device, ctypes.byref(props)))
        return {"name": props.name.decode("utf-8", "replace"), "kind": _DEVICE_KINDS.get(props.kind, props.kind),
                "index": props.index, "total_memory": props.total_memory, "free_memory": props.free_memory}

    def malloc(self, nbytes: int, device: int = 0, dtype: Optional[str] = None) -> DeviceMemory:
        """`nbytes` of `device`'s memory (64-byte aligned), seen as elements of `dtype` where used."""
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError("dtype=%r: expected one of %s" % (dtype, sorted(_DTYPES)))
        if nbytes < 0:
            raise ValueError("nbytes = %d: expected >= 0" % nbytes)
        address = ctypes.c_void_p()
        _check(_api().bpl_malloc(self._live(), device, nbytes, ctypes.byref(address)))
        return self._adopt(DeviceMemory(self, address.value or 0, nbytes, device, dtype))

    def memcpy(self, dst: BufferLike, src: BufferLike, nbytes: Optional[int] = None) -> None:
        """Copies `nbytes` (None: all of src) between a host buffer or DeviceMemory and another; the
        direction follows from which are device memory. Complete when it returns."""
        d = _Buffer(dst, "u8", True, "dst")
        s = _Buffer(src, "u8", False, "src")
        nbytes = s.nbytes if nbytes is None else nbytes
        if nbytes < 0 or nbytes > s.nbytes or nbytes > d.nbytes:
            raise ValueError("nbytes = %d: expected 0 to %d (src holds %d bytes, dst %d)" % (
                nbytes, min(s.nbytes, d.nbytes), s.nbytes, d.nbytes))
        kind = _MEMCPY_KIND[(isinstance(dst, DeviceMemory), isinstance(src, DeviceMemory))]
        _check(_api().bpl_memcpy(self._live(), d.address, s.address, nbytes, kind))

    def synchronize(self, device: int = 0) -> None:
        """Waits until the work queued on `device` has finished (kernels on accelerators)."""
        _check(_api().bpl_synchronize(self._live(), device))

    # -- kernels (buffers: host buffers on CPU backends, DeviceMemory anywhere) --

    def gemm(self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, alpha: float = 1.0,
             beta: float = 0.0, trans_a: bool = False, trans_b: bool = False, lda: Optional[int] = None,
             ldb: Optional[int] = None, ldc: Optional[int] = None, dtype: Optional[str] = None,
             device: int = 0) -> None:
        """c = alpha * op(a) @ op(b) + beta * c, row-major: op(a) is m x k (a is k x m with trans_a), op(b)
        k x n, c m x n; leading dimensions default to the rows' lengths. f32, f64, f16, bf16."""
        A = _Buffer(a, dtype, False, "a")
        B = _Buffer(b, A.dtype_name, False, "b")
        C = _Buffer(c, A.dtype_name, True, "c")
        lda = (m if trans_a else k) if lda is None else lda
        ldb = (k if trans_b else n) if ldb is None else ldb
        ldc = n if ldc is None else ldc
        for name, buf, rows, cols, ld in (("a", A, k if trans_a else m, m if trans_a else k, lda),
                                          ("b", B, n if trans_b else k, k if trans_b else n, ldb),
                                          ("c", C, m, n, ldc)):
            needed = (rows - 1) * ld + cols if rows > 0 and cols > 0 else 0
            if buf.count < needed:
                raise ValueError("%s holds %d elements: a %d x %d matrix with leading dimension %d needs %d" % (
                    name, buf.count, rows, cols, ld, needed))
        args = _GemmArgs(ctypes.sizeof(_GemmArgs), device, A.dtype, int(trans_a), int(trans_b), m, n, k, alpha, beta,
                         A.address, lda, B.address, ldb, C.address, ldc)
        _check(_api().bpl_gemm(self._live(), ctypes.byref(args)))

    def add(self, x: BufferLike, y: BufferLike, out: Optional[BufferLike] = None, dtype: Optional[str] = None,
            device: int = 0) -> None:
        """out = x + y (out None: into x). Any dtype."""
        self._elementwise("bpl_add", x, y, out, 1.0, 1.0, dtype, device)

    def scale(self, x: BufferLike, alpha: float, out: Optional[BufferLike] = None, dtype: Optional[str] = None,
              device: int = 0) -> None:
        """out = alpha * x (out None: into x). Floating dtypes."""
        self._elementwise("bpl_scale", x, None, out, alpha, 1.0, dtype, device)

    def axpby(self, x: BufferLike, y: BufferLike, alpha: float, beta: float, out: Optional[BufferLike] = None,
              dtype: Optional[str] = None, device: int = 0) -> None:
        """out = alpha * x + beta * y (out None: into y). Floating dtypes."""
        self._elementwise("bpl_axpby", x, y, y if out is None else out, alpha, beta, dtype, device)

    def cast(self, src: BufferLike, dst: BufferLike, src_dtype: Optional[str] = None, dst_dtype: Optional[str] = None,
             device: int = 0) -> None:
        """dst = src converted to dst's dtype, rounding to nearest even (bf16 in 16-bit integers:
        dst_dtype="bf16")."""
        S = _Buffer(src, src_dtype, False, "src")
        D = _Buffer(dst, dst_dtype, True, "dst")
        if D.count != S.count:
            raise ValueError("dst holds %d elements: expected %d, as src" % (D.count, S.count))
        args = _CastArgs(ctypes.sizeof(_CastArgs), device, S.dtype, D.dtype, 0, S.count, S.address, D.address)
        _check(_api().bpl_cast(self._live(), ctypes.byref(args)))

    # -- programs --

    def compile(self, source: Any, format: str = "torchscript", flags: Optional[str] = None,
                entry: Optional[str] = None, device: int = 0) -> Program:
        """Compiles `source` (str or bytes; a format of describe()["program_formats"]) through the compile
        cache, for `entry` (None: "forward")."""
        data = source.encode() if isinstance(source, str) else bytes(source)
        options = _ProgramOptions(ctypes.sizeof(_ProgramOptions), format.encode(), flags.encode() if flags else None,
                                  entry.encode() if entry else None, device, 0)
        handle = ctypes.c_void_p()
        _check(_api().bpl_program_compile(self._live(), data, len(data), ctypes.byref(options), ctypes.byref(handle)))
        return self._adopt(Program(self, handle.value))

    def close(self) -> None:
        """Destroys the communicators split from it, the device memory and the programs it made that
        are still alive, then leaves the job (bpl_finalize). The second call is a no-op."""
        if self._handle is None:
            return
        made, self._made = self._made, []
        for thing in made:
            thing.destroy()
        handle, self._handle = self._handle, None
        self.world._handle = None
        _check(_api().bpl_finalize(handle))

    finalize = close

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("this Runtime was closed")
        return self._handle

    def _adopt(self, thing):
        """Keeps `thing` (a Comm, DeviceMemory or Program) for close(), forgetting those gone already."""
        self._made[:] = [t for t in self._made if t._handle is not None] + [thing]
        return thing

    def _elementwise(self, function: str, x, y, out, alpha: float, beta: float, dtype: Optional[str], device: int):
        X = _Buffer(x, dtype, out is None, "x")
        Y = _Buffer(y, X.dtype_name, False, "y") if y is not None else None
        O = X if out is None else _Buffer(out, X.dtype_name, True, "out")
        for name, buf in (("y", Y), ("out", O)):
            if buf is not None and buf.count != X.count:
                raise ValueError("%s holds %d elements: expected %d, as x" % (name, buf.count, X.count))
        args = _ElementwiseArgs(ctypes.sizeof(_ElementwiseArgs), device, X.dtype, X.count, alpha, beta, X.address,
                                Y.address if Y else None, O.address)
        _check(getattr(_api(), function)(self._live(), ctypes.byref(args)))

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
