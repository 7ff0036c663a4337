"""Buffers: anything with the buffer protocol, C-contiguous (or DeviceMemory); its address, element
count and dtype, and the checks that name what a call's buffer lacks."""

import ctypes
from typing import Any, List, Sequence, Tuple

from ._abi import _DTYPES, _MAX_DIMS, _OPS, _SIZES, _Tensor
from ._integers import fitted
from .device_memory import DeviceMemory

# Anything with the buffer protocol, C-contiguous (bytearray, array.array, numpy.ndarray, memoryview).
BufferLike = Any

_FORMATS = {"f": "f32", "d": "f64", "e": "f16", "b": "i8", "B": "u8", "c": "u8"}
# Unsigned integers wider than a byte, which the ABI's dtypes lack: reduced as signed, they would give
# wrong answers (the max of 3e9 and 1 is 1), so they are refused unless the caller names a dtype.
_UNSIGNED = ("I", "L", "Q", "N")


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
            elif fmt in _UNSIGNED:
                raise ValueError("%s holds unsigned %d-bit integers (element format %r), which backplane has no "
                                 "dtype for: reduced as signed they would come out wrong. Convert them, or pass "
                                 "dtype='i%d' to move their bits unchanged (broadcast, gathers, sends)"
                                 % (name, 8 * view.itemsize, view.format, 8 * view.itemsize))
            elif fmt in ("i", "l", "q", "h", "n"):
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
    return (ctypes.c_int64 * size)(*[fitted(v, ctypes.c_int64, "%s[%d]" % (name, i)) for i, v in enumerate(values)])


def _end_to_end(counts: Sequence[int]) -> List[int]:
    """Displacements of blocks of `counts` elements laid end to end."""
    displs, next_block = [], 0
    for count in counts:
        displs.append(next_block)
        next_block += count
    return displs


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
        t.shape[i] = fitted(extent, ctypes.c_int64, "%s's shape[%d]" % (name, i))
    return t, b
