"""What a Runtime makes and destroys (_Handle), and device memory (DeviceMemory)."""

import ctypes
from typing import Optional

from ._abi import _api, _check



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

