"""backplane from Python: ctypes over libbackplane.so's C ABI, with no dependency but the library.

    import backplane
    with backplane.Runtime() as rt:              # backend and ranks from the environment, as bpl_init
        world = rt.world
        grads = array.array("f", [1.0] * 1024)   # any C-contiguous buffer: bytearray, array, numpy
        world.allreduce(grads)                    # in place; or world.allreduce(send, recv)
        group = world.split(color=world.rank % 2)

Element types come from the buffer's format ('f' f32, 'd' f64, 'e' f16, 'b' i8, 'B' u8, 32- and 64-bit
integers); pass dtype="bf16" for bfloat16 held in 16-bit integers. Every call is blocking; a failure
raises BackplaneError carrying the status and bpl_last_error()'s message.

The library is found through BPL_LIBRARY (a path to libbackplane.so), then beside this module as
installed (<prefix>/lib/python3/dist-packages/backplane.py -> <prefix>/lib/libbackplane.so), then the
loader's search path.
"""

import ctypes
import ctypes.util
import os

__all__ = ["BackplaneError", "Runtime", "Comm", "abi_version"]

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
    }
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


def _op(op):
    if op not in _OPS:
        raise ValueError("op=%r: expected one of %s" % (op, sorted(_OPS)))
    return _OPS[op]


class Comm:
    """A communicator. The world belongs to its Runtime; a split is destroyed by destroy() (or with
    the runtime at finalize)."""

    def __init__(self, handle, owned):
        self._handle = ctypes.c_void_p(handle)
        self._owned = owned
        rank, size = ctypes.c_int32(), ctypes.c_int32()
        _check(_api().bpl_comm_rank(self._handle, ctypes.byref(rank)))
        _check(_api().bpl_comm_size(self._handle, ctypes.byref(size)))
        self.rank, self.size = rank.value, size.value

    def split(self, color, key=0):
        """MPI_Comm_split: a Comm of the ranks passing the same color, ordered by key; None for color None."""
        out = ctypes.c_void_p()
        _check(_api().bpl_comm_split(self._handle, _COLOR_UNDEFINED if color is None else color, key, ctypes.byref(out)))
        return Comm(out.value, owned=True) if out.value else None

    def destroy(self):
        if self._owned and self._handle:
            _check(_api().bpl_comm_destroy(self._handle))
            self._handle = None

    def set_timeout(self, timeout_ms):
        _check(_api().bpl_comm_set_timeout(self._handle, timeout_ms))

    def abort(self):
        _check(_api().bpl_comm_abort(self._handle))

    def allreduce(self, send, recv=None, op="sum", dtype=None):
        """recv = op over ranks of send (in place when recv is None)."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _Buffer(recv, dtype, True, "recv")
        _check(_api().bpl_allreduce(self._handle, s.address, r.address, s.count, s.dtype, _op(op), None))

    def broadcast(self, buf, root=0, dtype=None):
        b = _Buffer(buf, dtype, True, "buf")
        _check(_api().bpl_broadcast(self._handle, b.address, b.count, b.dtype, root, None))

    def reduce(self, send, recv=None, root=0, op="sum", dtype=None):
        """recv on root = op over ranks of send (in place when recv is None); other ranks' recv unused."""
        s = _Buffer(send, dtype, recv is None, "send")
        r = s if recv is None else _Buffer(recv, dtype, True, "recv")
        _check(_api().bpl_reduce(self._handle, s.address, r.address, s.count, s.dtype, _op(op), root, None))

    def allgather(self, send, recv, dtype=None):
        """recv (size times send's elements) = every rank's send, in rank order."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if r.count != s.count * self.size:
            raise ValueError("recv holds %d elements: expected %d (size %d x %d)" % (r.count, s.count * self.size, self.size, s.count))
        _check(_api().bpl_allgather(self._handle, s.address, r.address, s.count, s.dtype, None))

    def reduce_scatter(self, send, recv, op="sum", dtype=None):
        """recv = block `rank` of the reduction of send (size blocks of recv's elements)."""
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if s.count != r.count * self.size:
            raise ValueError("send holds %d elements: expected %d (size %d x %d)" % (s.count, r.count * self.size, self.size, r.count))
        _check(_api().bpl_reduce_scatter(self._handle, s.address, r.address, r.count, r.dtype, _op(op), None))

    def alltoall(self, send, recv, dtype=None):
        s = _Buffer(send, dtype, False, "send")
        r = _Buffer(recv, dtype, True, "recv")
        if s.count != r.count or s.count % self.size:
            raise ValueError("send and recv must hold the same number of elements, a multiple of size %d" % self.size)
        _check(_api().bpl_alltoall(self._handle, s.address, r.address, s.count // self.size, s.dtype, None))

    def barrier(self):
        _check(_api().bpl_barrier(self._handle, None))


class Runtime:
    """A loaded backend (bpl_init); usable as a context manager that finalizes on exit. Arguments left
    None come from the environment, as bpl_init's options."""

    def __init__(self, backend=None, rank=None, world_size=None, local_rank=None, local_world_size=None,
                 master_addr=None, master_port=None, timeout_ms=None):
        options = _InitOptions(ctypes.sizeof(_InitOptions), backend.encode() if backend else None,
                               -1 if rank is None else rank, -1 if world_size is None else world_size,
                               -1 if local_rank is None else local_rank,
                               -1 if local_world_size is None else local_world_size,
                               master_addr.encode() if master_addr else None,
                               -1 if master_port is None else master_port, -1 if timeout_ms is None else timeout_ms)
        handle = ctypes.c_void_p()
        _check(_api().bpl_init(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle
        world = ctypes.c_void_p()
        _check(_api().bpl_comm_world(self._handle, ctypes.byref(world)))
        self.world = Comm(world.value, owned=False)

    def describe(self):
        """bpl_runtime_describe as a dict (strings decoded)."""
        info = _RuntimeInfo()
        info.struct_size = ctypes.sizeof(_RuntimeInfo)
        _check(_api().bpl_runtime_describe(self._handle, ctypes.byref(info)))
        result = {}
        for name, kind in _RuntimeInfo._fields_:
            if name == "struct_size":
                continue
            value = getattr(info, name)
            result[name] = value.decode("utf-8", "replace") if kind is ctypes.c_char_p and value is not None else value
        return result

    def finalize(self):
        if self._handle:
            _check(_api().bpl_finalize(self._handle))
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False
