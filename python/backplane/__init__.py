"""backplane from Python: ctypes over libbackplane.so's C ABI, with no dependency but the library.

    import backplane
    with backplane.Runtime() as rt:              # backend and ranks from the environment, as bpl_init
        world = rt.world
        grads = array.array("f", [1.0] * 1024)   # any C-contiguous buffer: bytearray, array, numpy
        world.allreduce(grads)                    # in place; or world.allreduce(send, recv)
        req = world.allreduce(grads, async_op=True)
        req.wait(timeout_ms=500)                  # or req.test(); a wait that runs out leaves it in flight
        with world.split(color=world.rank // 2) as pair:   # ranks 0 and 1, 2 and 3, ...
            req = pair.send(grads, peer=(pair.rank + 1) % pair.size, async_op=True)
            pair.recv(grads, peer=(pair.rank - 1) % pair.size)   # send/recv, gather, scatter, ...
            req.wait()

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

backplane.set_log_callback(fn) sends backplane's log lines to fn(level, source, message) instead of
stderr (None: back to stderr).

The library is found through BPL_LIBRARY (a path to libbackplane.so), then where this package lies
(inside it where pip installed it, an installed tree's <prefix>/lib, a build tree's lib/), then the
loader's search path. `python -m backplane --help` tells where a pip install keeps the C headers, the
CMake package and the pkg-config file, for programs built against it.
"""

from ._abi import BackplaneError, abi_version
from ._buffers import BufferLike, TensorLike
from .comm import Comm, Request
from .device_memory import DeviceMemory
from .log import set_log_callback
from .runtime import Program, Runtime
from ._version import __version__

__all__ = ["BackplaneError", "Runtime", "Comm", "Request", "DeviceMemory", "Program", "abi_version",
           "set_log_callback", "__version__"]
